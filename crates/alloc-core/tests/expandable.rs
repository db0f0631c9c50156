//! Worked examples of expandable segments (torch_npu's policy), with exact numbers: addresses,
//! pages, stats and the simulated device's own accounting of ranges, pages and mappings.

mod common;

use alloc_core::{AllocError, BlockState, Notice, PoolKind};
use alloc_sim::{BASE_ADDRESS, DeviceCall, Fault, SimDevice, TestDevice};
use common::*;

/// The first reserved range of a fresh device: the 512-byte probe takes the first 2 MiB slot.
const B: u64 = BASE_ADDRESS + 2 * MIB;

fn expandable(capacity: u64, extra: &str) -> alloc_core::Allocator<TestDevice> {
    cuda(capacity, &conf(&format!("expandable_segments:True{extra}")))
}

/// (pages, mapped bytes, reserved ranges) on the device.
fn device(a: &alloc_core::Allocator<TestDevice>) -> (usize, u64, Vec<(u64, u64)>) {
    let d = a.device();
    (
        d.live_pages(),
        d.mapped_bytes(),
        d.reserved_ranges().collect(),
    )
}

/// A snapshot segment's offset from `B` and its blocks as (offset, size, state).
type Layout = Vec<(u64, Vec<(u64, u64, BlockState)>)>;

/// Every snapshot segment and its blocks, as offsets from `B`.
fn layout(a: &alloc_core::Allocator<TestDevice>) -> Layout {
    a.snapshot()
        .into_iter()
        .map(|s| {
            let blocks = s
                .blocks
                .iter()
                .map(|b| (b.address - B, b.size, b.state))
                .collect();
            (s.address - B, blocks)
        })
        .collect()
}

use BlockState::{ActiveAllocated as Used, Inactive as Free};

#[test]
fn the_first_request_reserves_nine_eighths_of_the_device_and_maps_one_page() {
    let mut a = expandable(GIB, "");
    assert!(a.notices().is_empty());
    let x = a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(x, B);
    // ceil(1.125 GiB / 20 MiB) = 58 pages of address space; one page mapped.
    assert_eq!(device(&a), (1, 20 * MIB, vec![(B, 58 * 20 * MIB)]));
    assert_eq!(
        stat(&a, "reserved_bytes.large_pool.current"),
        (20 * MIB) as i64
    );
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    assert_eq!(stat(&a, "segment.all.current"), 0);
    assert_eq!(stat(&a, "inactive_split.all.current"), 0);
    assert_eq!(stat(&a, "inactive_split_bytes.all.current"), 0);
    assert_eq!(
        layout(&a),
        [(0, vec![(0, 8 * MIB, Used), (8 * MIB, 12 * MIB, Free)])]
    );
    let info = &a.expandable_segments()[0];
    assert_eq!(
        (info.page_size, info.mapped_pages, info.pool),
        (20 * MIB, 1, PoolKind::Large)
    );
    assert!(a.snapshot()[0].is_expandable);

    // 16 MiB grows the free 12 MiB at the end by one page: one map call, one 32 MiB block.
    let y = a.malloc(16 * MIB, S0).unwrap();
    assert_eq!(y, B + 8 * MIB);
    assert_eq!(device(&a).0, 2);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (40 * MIB) as i64);
    assert_eq!(stat(&a, "num_device_alloc"), 2);
    assert_eq!(
        layout(&a),
        [(
            0,
            vec![
                (0, 8 * MIB, Used),
                (8 * MIB, 16 * MIB, Used),
                (24 * MIB, 16 * MIB, Free)
            ]
        )]
    );
    check_consistency(&a);

    // Freeing everything and emptying the cache unmaps both pages in one range and releases
    // the address space.
    a.free(x).unwrap();
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(device(&a), (0, 0, vec![]));
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(stat(&a, "num_device_free"), 1);
    assert!(a.snapshot().is_empty());
    assert!(a.expandable_segments().is_empty());
    check_consistency(&a);
}

#[test]
fn the_small_pool_maps_two_mib_pages() {
    let mut a = expandable(GIB, "");
    let x = a.malloc(1000, S0).unwrap();
    assert_eq!(x, B);
    // ceil(1.125 GiB / 2 MiB) = 576 pages.
    assert_eq!(device(&a), (1, 2 * MIB, vec![(B, 576 * 2 * MIB)]));
    assert_eq!(
        stat(&a, "reserved_bytes.small_pool.current"),
        (2 * MIB) as i64
    );
    assert_eq!(stat(&a, "segment.small_pool.current"), 0);
}

/// x = 8 MiB, y = 40 MiB, z = 4 MiB; then y is freed and the cache emptied.
fn with_a_gap() -> (alloc_core::Allocator<TestDevice>, u64, u64) {
    let mut a = expandable(GIB, "");
    let x = a.malloc(8 * MIB, S0).unwrap();
    let y = a.malloc(40 * MIB, S0).unwrap();
    let z = a.malloc(4 * MIB, S0).unwrap();
    assert_eq!((y, z), (B + 8 * MIB, B + 48 * MIB));
    assert_eq!(stat(&a, "num_device_alloc"), 2);
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    (a, x, z)
}

#[test]
fn empty_cache_unmaps_only_whole_pages_inside_free_blocks() {
    let (a, _, _) = with_a_gap();
    // y's block [8, 48) MiB holds one whole page, [20, 40); 12 MiB before and 8 MiB after stay
    // mapped. The free [52, 60) MiB holds no whole page.
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (40 * MIB) as i64);
    assert_eq!(stat(&a, "num_device_free"), 1);
    assert_eq!(device(&a).0, 2);
    assert_eq!(
        layout(&a),
        [
            (0, vec![(0, 8 * MIB, Used), (8 * MIB, 12 * MIB, Free)]),
            (
                40 * MIB,
                vec![
                    (40 * MIB, 8 * MIB, Free),
                    (48 * MIB, 4 * MIB, Used),
                    (52 * MIB, 8 * MIB, Free)
                ]
            ),
        ]
    );
    check_consistency(&a);
}

#[test]
fn the_lowest_address_that_fits_is_refilled_first() {
    let (mut a, _, _) = with_a_gap();
    // No free block holds 20 MiB. The gap [20, 40) MiB with the free 12 MiB before it is the
    // lowest fit: one page is mapped there, and it merges with both free neighbours.
    let w = a.malloc(20 * MIB, S0).unwrap();
    assert_eq!(w, B + 8 * MIB);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (60 * MIB) as i64);
    assert_eq!(stat(&a, "num_device_alloc"), 3);
    assert_eq!(
        layout(&a),
        [(
            0,
            vec![
                (0, 8 * MIB, Used),
                (8 * MIB, 20 * MIB, Used),
                (28 * MIB, 20 * MIB, Free),
                (48 * MIB, 4 * MIB, Used),
                (52 * MIB, 8 * MIB, Free)
            ]
        )]
    );
    check_consistency(&a);
}

#[test]
fn a_segment_with_nothing_mapped_is_released() {
    let (mut a, x, z) = with_a_gap();
    a.free(x).unwrap();
    a.empty_cache().unwrap();
    // [0, 20) MiB was one free page: unmapped, and it merges with the gap after it.
    assert_eq!(stat(&a, "num_device_free"), 2);
    assert_eq!(layout(&a)[0].0, 40 * MIB);
    assert_eq!(device(&a).2.len(), 1);
    a.free(z).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(stat(&a, "num_device_free"), 3);
    assert_eq!(device(&a), (0, 0, vec![]));
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    check_consistency(&a);
}

#[test]
fn running_out_while_mapping_leaves_no_page_of_the_failed_call() {
    let mut a = expandable(100 * MIB, "");
    let x = a.malloc(50 * MIB, S0).unwrap();
    assert_eq!(x, B);
    assert_eq!(device(&a).0, 3);
    // The next 50 MiB needs pages 3 and 4: page 3 is created, page 4 fails, page 3 goes back;
    // the last retry fails on its first page.
    a.device_mut()
        .fail_from(DeviceCall::CreatePage, 2, Fault::OutOfMemory);
    let err = a.malloc(50 * MIB, S0).unwrap_err();
    match err {
        AllocError::OutOfMemory(oom) => {
            assert_eq!((oom.requested, oom.alloc_size), (50 * MIB, 50 * MIB));
            assert_eq!(oom.reserved, 60 * MIB);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.device().calls(DeviceCall::CreatePage), 3 + 3);
    assert_eq!(a.device().calls(DeviceCall::ReleasePage), 1);
    assert_eq!(device(&a).0, 3);
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    assert_eq!(stat(&a, "num_ooms"), 1);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    check_consistency(&a);
    a.device_mut().clear_all_faults();
    assert_eq!(a.malloc(50 * MIB, S0).unwrap(), B + 50 * MIB);
    check_consistency(&a);
}

/// Pages 0, 1 and 2 were mapped by three 20 MiB requests; page 0 is unmapped again and pages
/// 1 and 2 are free: [0, 20) MiB unmapped, [20, 60) free, the rest unmapped.
fn with_a_hole_at_the_start() -> alloc_core::Allocator<TestDevice> {
    let mut a = expandable(GIB, "");
    let x = a.malloc(20 * MIB, S0).unwrap();
    let y = a.malloc(20 * MIB, S0).unwrap();
    let z = a.malloc(20 * MIB, S0).unwrap();
    a.free(x).unwrap();
    a.empty_cache().unwrap();
    a.free(y).unwrap();
    a.free(z).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (40 * MIB) as i64);
    assert_eq!(
        (stat(&a, "num_device_alloc"), stat(&a, "num_device_free")),
        (3, 1)
    );
    a
}

#[test]
fn a_request_can_map_twice_and_keeps_the_first_map_if_the_second_fails() {
    // 80 MiB starts at the hole: the first map call maps page 0 (merging into [0, 60) MiB),
    // the second maps page 3.
    let mut a = with_a_hole_at_the_start();
    assert_eq!(a.malloc(80 * MIB, S0).unwrap(), B);
    assert_eq!(stat(&a, "num_device_alloc"), 5);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (80 * MIB) as i64);
    check_consistency(&a);

    // The second map call fails with a device error: page 0 stays mapped, free.
    let mut a = with_a_hole_at_the_start();
    a.device_mut()
        .fail_nth(DeviceCall::Map, 2, Fault::Error(507_899));
    assert!(matches!(a.malloc(80 * MIB, S0), Err(AllocError::Device(_))));
    assert_eq!(stat(&a, "num_device_alloc"), 4);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (60 * MIB) as i64);
    assert_eq!(layout(&a), [(0, vec![(0, 60 * MIB, Free)])]);
    check_consistency(&a);

    // It runs out of memory instead: the chain goes on, and its last retry unmaps the free
    // [0, 60) MiB (page 0 included), releases the emptied range and maps 80 MiB in a new one.
    let mut a = with_a_hole_at_the_start();
    a.device_mut()
        .fail_nth(DeviceCall::CreatePage, 2, Fault::OutOfMemory);
    let w = a.malloc(80 * MIB, S0).unwrap();
    assert_eq!(w, B + 58 * 20 * MIB);
    assert_eq!(device(&a).2, vec![(w, 58 * 20 * MIB)]);
    assert_eq!(
        (stat(&a, "num_device_alloc"), stat(&a, "num_device_free")),
        (5, 2)
    );
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    check_consistency(&a);
}

#[test]
fn the_fraction_is_checked_against_the_segment_torch_would_have_asked_for() {
    // allowed = 0.044 × 1 GiB = 47,244,640 bytes.
    let mut a = expandable(GIB, ",per_process_memory_fraction:0.044");
    assert_eq!(a.allowed_memory(), Some(47_244_640));
    a.malloc(8 * MIB, S0).unwrap();
    // 30 MiB needs one more page (40 MiB mapped would fit), but 20 MiB mapped + its 30 MiB
    // alloc_size = 52,428,800 is over the limit: refused without a device call.
    let pages_before = a.device().calls(DeviceCall::CreatePage);
    match a.malloc(30 * MIB, S0) {
        Err(AllocError::OutOfMemory(oom)) => {
            assert_eq!(oom.alloc_size, 30 * MIB);
            assert_eq!(oom.allowed, Some(47_244_640));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.device().calls(DeviceCall::CreatePage), pages_before);
    // 24 MiB: 20 MiB + 24 MiB = 46,137,344 fits; one page is mapped.
    assert_eq!(a.malloc(24 * MIB, S0).unwrap(), B + 8 * MIB);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (40 * MIB) as i64);
    check_consistency(&a);
}

#[test]
fn large_blocks_start_on_a_16_kib_boundary() {
    // torch_npu's 32-byte pad makes every 24 MiB tensor 24 MiB + 512 bytes.
    let big = 24 * MIB;
    let padded = big + 512;
    let mut a = npu(GIB, &conf("expandable_segments:True"));
    let x = a.malloc(big, S0).unwrap();
    let y = a.malloc(big, S0).unwrap();
    assert_eq!(x, B);
    // y would start at B + 24 MiB + 512; it moves to the next 16 KiB boundary and leaves the
    // 15,872 bytes before it free.
    assert_eq!(y, B + 24 * MIB + 16 * KIB);
    let blocks = &a.snapshot()[0].blocks;
    let sizes: Vec<(u64, BlockState)> = blocks.iter().map(|b| (b.size, b.state)).collect();
    assert_eq!(
        sizes,
        [
            (padded, Used),
            (15_872, Free),
            (padded, Used),
            (60 * MIB - 2 * padded - 15_872, Free)
        ]
    );
    assert_eq!(stat(&a, "inactive_split.all.current"), 0);
    check_consistency(&a);

    // base_addr_aligned_kb:0 turns it off.
    let mut a = npu(
        GIB,
        &conf("expandable_segments:True,base_addr_aligned_kb:0"),
    );
    a.malloc(big, S0).unwrap();
    assert_eq!(a.malloc(big, S0).unwrap(), B + padded);
    // Requests below 2 MiB are never moved.
    let mut a = npu(GIB, &conf("expandable_segments:True"));
    a.malloc(big, S0).unwrap();
    let small_large = a.malloc(MIB + MIB / 2, S0).unwrap();
    assert_eq!(small_large, B + padded);
}

#[test]
fn segment_size_mb_sets_the_large_page() {
    let mut a = expandable(GIB, ",segment_size_mb:128");
    a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 134_217_728);
    // ceil(1.125 GiB / 128 MiB) = 9 pages of address space.
    assert_eq!(device(&a).2, vec![(B, 9 * 128 * MIB)]);
}

#[test]
fn page_size_1g_maps_whole_gib_in_the_large_pool_only() {
    let mut a = expandable(4 * GIB, ",page_size:1g");
    a.malloc(8 * MIB, S0).unwrap();
    a.malloc(1000, S0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.large_pool.current"), GIB as i64);
    assert_eq!(
        stat(&a, "reserved_bytes.small_pool.current"),
        (2 * MIB) as i64
    );
    // Large: ceil(4.5 GiB / 1 GiB) = 5 pages; small: 4.5 GiB of 2 MiB pages.
    let ranges: Vec<u64> = device(&a).2.iter().map(|r| r.1).collect();
    assert_eq!(ranges, [5 * GIB, 4 * GIB + GIB / 2]);
    check_consistency(&a);
}

/// torch_npu's version gate (`IsMallocPage1GMem`): without 1 GiB pages on the device (CANN or
/// driver too old), `page_size:1g` is ignored with a notice, for expandable pages and plain
/// segments alike.
#[test]
fn page_size_1g_is_ignored_with_a_notice_where_the_device_has_no_1g_pages() {
    let facts = alloc_core::DeviceFacts {
        huge_pages_1g: false,
        ..alloc_core::DeviceFacts::cuda_parity(0)
    };
    let gated = |extra: &str| {
        alloc_core::Allocator::new(
            TestDevice::new(SimDevice::new(4 * GIB)),
            &conf(&format!("page_size:1g{extra}")),
            facts,
        )
    };
    let mut a = gated(",expandable_segments:True");
    assert_eq!(a.notices(), [Notice::PageSize1gUnsupported]);
    assert_eq!(a.conf().page_size, None);
    a.malloc(8 * MIB, S0).unwrap();
    // 20 MiB pages, as without the setting.
    assert_eq!(
        stat(&a, "reserved_bytes.large_pool.current"),
        (20 * MIB) as i64
    );
    check_consistency(&a);
    let mut b = gated("");
    // A configuration applied later cannot bring it back.
    b.set_conf(&conf("page_size:1g"));
    assert_eq!(b.conf().page_size, None);
    assert_eq!(b.notices(), [Notice::PageSize1gUnsupported]);
    b.malloc(30 * MIB, S0).unwrap();
    assert_eq!(
        stat(&b, "reserved_bytes.large_pool.current"),
        (30 * MIB) as i64
    );
    // With 1 GiB pages the same request takes a whole GiB.
    let mut c = cuda(4 * GIB, &conf("page_size:1g"));
    assert!(c.notices().is_empty());
    c.malloc(30 * MIB, S0).unwrap();
    assert_eq!(stat(&c, "reserved_bytes.large_pool.current"), GIB as i64);
}

#[test]
fn each_stream_gets_its_own_segment_and_waits_for_its_events() {
    let mut a = expandable(GIB, "");
    let x = a.malloc(8 * MIB, S0).unwrap();
    let y = a.malloc(8 * MIB, S1).unwrap();
    let ranges = device(&a).2;
    assert_eq!(ranges.len(), 2);
    assert_eq!(y, ranges[1].0);
    a.record_stream(x, S1).unwrap();
    a.free(x).unwrap();
    // x waits on stream 1: nothing of stream 0 may be unmapped until the event completes.
    assert_eq!(layout(&a)[0].1[0].2, BlockState::ActivePendingFree);
    a.device_mut().complete_stream(S1);
    a.process_events().unwrap();
    assert_eq!(layout(&a)[0].1.len(), 1);
    // The pending block is released by empty_cache's synchronization even without completion.
    let z = a.malloc(8 * MIB, S0).unwrap();
    a.record_stream(z, S1).unwrap();
    a.free(z).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(device(&a).2, vec![ranges[1]]);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (20 * MIB) as i64);
    check_consistency(&a);
}

#[test]
fn switching_off_and_on_at_run_time() {
    let mut a = expandable(GIB, "");
    let x = a.malloc(8 * MIB, S0).unwrap();
    a.free(x).unwrap();
    let off = alloc_conf::parse_settings(a.conf(), "expandable_segments:False");
    assert!(!a.set_conf(&off.conf));
    // The free expandable page is passed over: a 20 MiB device segment serves the request.
    let y = a.malloc(8 * MIB, S0).unwrap();
    let segment = y;
    assert_eq!(a.device().segment_size(segment), Some(20 * MIB));
    assert_eq!(stat(&a, "segment.all.current"), 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (40 * MIB) as i64);
    assert_eq!(stat(&a, "inactive_split.all.current"), 1);
    a.free(y).unwrap();
    let on = alloc_conf::parse_settings(a.conf(), "expandable_segments:True");
    assert!(a.set_conf(&on.conf));
    // Both free blocks are 20 MiB; the expandable one comes first by address, but it can grow
    // into the unmapped space after it, so best fit moves on to the device segment.
    let z = a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(z, segment);
    // Split at 512 bytes remaining now: 8 MiB used, 12 MiB free in the device segment.
    assert_eq!(
        stat(&a, "inactive_split_bytes.all.current"),
        (12 * MIB) as i64
    );
    check_consistency(&a);
    // Freed and emptied: the segment goes back whole, the page is unmapped and the range
    // released.
    a.free(z).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(device(&a), (0, 0, vec![]));
    assert_eq!(a.device().outstanding_segments(), 0);
    check_consistency(&a);
}

#[test]
fn a_device_without_virtual_memory_runs_without_expandable_segments() {
    let mut a = alloc_core::Allocator::new(
        TestDevice::new(SimDevice::new(GIB).without_vmm()),
        &conf("expandable_segments:True"),
        alloc_core::DeviceFacts::cuda_parity(0),
    );
    assert_eq!(a.notices(), [Notice::ExpandableSegmentsUnsupported]);
    assert!(!a.conf().expandable_segments);
    a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(stat(&a, "segment.all.current"), 1);
    assert_eq!(a.device().calls(DeviceCall::ReserveAddress), 1);
    // A failed probe reservation is reported as such.
    let mut d = TestDevice::new(SimDevice::new(GIB));
    d.fail_nth(DeviceCall::ReserveAddress, 1, Fault::Error(507_899));
    let a = alloc_core::Allocator::new(
        d,
        &conf("expandable_segments:True"),
        alloc_core::DeviceFacts::cuda_parity(0),
    );
    assert_eq!(a.notices(), [Notice::ExpandableSegmentsProbeFailed]);
}

#[test]
fn failures_of_virtual_memory_calls_leave_the_books_exact() {
    // A failed map after one page was mapped keeps that page as a free block.
    let mut a = expandable(GIB, "");
    a.device_mut()
        .fail_nth(DeviceCall::Map, 2, Fault::Error(507_899));
    let err = a.malloc(30 * MIB, S0).unwrap_err();
    assert!(matches!(err, AllocError::Device(_)), "{err:?}");
    assert_eq!(device(&a).0, 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (20 * MIB) as i64);
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    check_consistency(&a);
    // A page the device refuses to take back is held and given back by the next empty_cache.
    a.device_mut()
        .fail_nth(DeviceCall::ReleasePage, 1, Fault::Error(507_899));
    a.empty_cache().unwrap();
    assert_eq!(a.held().pages, 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    check_consistency(&a);
    a.empty_cache().unwrap();
    assert_eq!(a.held().pages, 0);
    assert_eq!(device(&a), (0, 0, vec![]));
    check_consistency(&a);
}

#[test]
fn freeing_oversize_blocks_on_a_miss_passes_over_expandable_blocks() {
    // torch_npu's release_available_cached_blocks would release this free expandable block
    // (and reach TORCH_INTERNAL_ASSERT in release_block); it is passed over, as in PyTorch.
    let mut a = expandable(GIB, "");
    let x = a.malloc(60 * MIB, S0).unwrap();
    a.free(x).unwrap();
    let off =
        alloc_conf::parse_settings(a.conf(), "expandable_segments:False,max_split_size_mb:40");
    assert!(!a.set_conf(&off.conf));
    a.device_mut()
        .fail_nth(DeviceCall::Malloc, 1, Fault::OutOfMemory);
    let y = a.malloc(50 * MIB, S0).unwrap();
    // The last retry unmapped the free pages and released the range; the request got a device
    // segment of its own.
    assert_eq!(a.device().segment_size(y), Some(50 * MIB));
    assert_eq!(device(&a), (0, 0, vec![]));
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_device_free"), 1);
    check_consistency(&a);
}

#[test]
fn a_range_is_sized_from_the_known_total_when_mem_info_fails() {
    let mut a = expandable(GIB, "");
    a.device_mut()
        .fail_nth(DeviceCall::MemInfo, 1, Fault::Error(507_899));
    a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(device(&a).2, vec![(B, 58 * 20 * MIB)]);
    assert_eq!(a.device().calls(DeviceCall::MemInfo), 2);
}

/// A range whose first map ran out of memory holds no page; torch_npu keeps such a range in its
/// pool's `unmapped` set for good and reserves another at the next miss, which only
/// `pool.blocks` are released from (docs/deviations.md). Here the next miss reuses it, and
/// `empty_cache` gives it back.
#[test]
fn a_range_that_never_mapped_is_reused_and_released() {
    let mut a = expandable(GIB, "");
    for _ in 0..2 {
        assert!(matches!(
            a.malloc(2 * GIB, S0),
            Err(AllocError::OutOfMemory(_))
        ));
        assert_eq!(device(&a).0, 0);
        assert_eq!(device(&a).2.len(), 1);
    }
    a.empty_cache().unwrap();
    assert_eq!(device(&a), (0, 0, vec![]));
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    check_consistency(&a);
}

/// torch's `emptyCache(pool)` releases that pool's blocks only: a range of the default pool
/// that never mapped stays reserved until a plain `empty_cache`.
#[test]
fn emptying_a_private_pool_leaves_the_default_pools_idle_range() {
    let mut a = expandable(GIB, "");
    assert!(matches!(
        a.malloc(2 * GIB, S0),
        Err(AllocError::OutOfMemory(_))
    ));
    assert_eq!(device(&a).2.len(), 1);
    let pool = a.create_pool().unwrap();
    let x = a.malloc_in(8 * MIB, S0, pool).unwrap();
    a.free(x).unwrap();
    a.release_pool(pool).unwrap();
    let releases = a.device().calls(DeviceCall::ReleaseAddress);
    a.empty_pool_cache(pool).unwrap();
    // The pool's own range went back; the default pool's is still reserved.
    assert_eq!(a.device().calls(DeviceCall::ReleaseAddress), releases + 1);
    assert_eq!(device(&a).2.len(), 1);
    assert!(a.private_pools().is_empty());
    a.empty_cache().unwrap();
    assert_eq!(device(&a), (0, 0, vec![]));
    check_consistency(&a);
}

/// (pages created, pages released, map calls) on the device.
fn page_calls(a: &alloc_core::Allocator<TestDevice>) -> (u64, u64, u64) {
    let d = a.device();
    (
        d.calls(DeviceCall::CreatePage),
        d.calls(DeviceCall::ReleasePage),
        d.calls(DeviceCall::Map),
    )
}

/// torch_npu's `test_empty_virt_addr_cache`: `empty_virt_addr_cache` unmaps as `empty_cache`
/// does (reserved back to 0, the peak kept) but keeps the physical pages; the next allocation
/// maps them again without creating any, and `empty_cache` frees them.
#[test]
fn empty_virt_addr_cache_keeps_the_pages_for_the_next_map() {
    let mut a = expandable(GIB, "");
    let x = a.malloc(50 * MIB, S0).unwrap();
    a.free(x).unwrap();
    assert_eq!(page_calls(&a), (3, 0, 3));
    a.empty_virt_addr_cache().unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(stat(&a, "reserved_bytes.all.peak"), (60 * MIB) as i64);
    assert_eq!(stat(&a, "num_device_free"), 1);
    // Nothing mapped, the range given back, three pages still alive on the device.
    assert_eq!(device(&a), (3, 0, vec![]));
    let held = a.held();
    assert_eq!((held.cached_pages, held.cached_bytes), (3, 60 * MIB));
    check_consistency(&a);

    // A new range, mapped with the three cached pages: none created.
    let y = a.malloc(50 * MIB, S0).unwrap();
    assert_eq!(page_calls(&a), (3, 0, 6));
    assert_eq!(a.held().cached_pages, 0);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (60 * MIB) as i64);
    assert_eq!(stat(&a, "num_device_alloc"), 2);
    check_consistency(&a);

    a.free(y).unwrap();
    a.empty_virt_addr_cache().unwrap();
    assert_eq!(a.held().cached_pages, 3);
    a.empty_cache().unwrap();
    assert_eq!(page_calls(&a), (3, 3, 6));
    assert_eq!(a.held().cached_pages, 0);
    assert_eq!(device(&a), (0, 0, vec![]));
    check_consistency(&a);
}

/// Cached pages belong to their pool: another pool creates its own, and when the device runs
/// out, the OOM retry chain's `release_cached_blocks` frees the cache (torch_npu calls it with
/// `free_physical`) and the retry succeeds.
#[test]
fn the_retry_chain_frees_cached_pages() {
    let mut a = expandable(GIB, "");
    let x = a.malloc(600 * MIB, S0).unwrap();
    a.free(x).unwrap();
    a.empty_virt_addr_cache().unwrap();
    assert_eq!(a.held().cached_pages, 30);
    let pool = a.create_pool().unwrap();
    let y = a.malloc_in(600 * MIB, S0, pool).unwrap();
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_ooms"), 0);
    assert_eq!(a.held().cached_pages, 0);
    // 30 pages for x. For y, 21 created in the 424 MiB left and a 22nd refused; the 21
    // released (as torch_npu frees a failed map's handles), then the 30 cached by the retry,
    // and 30 created for the pool.
    assert_eq!(page_calls(&a).0, 30 + 22 + 30);
    assert_eq!(page_calls(&a).1, 21 + 30);
    a.free(y).unwrap();
    check_consistency(&a);
}

/// A private pool forgotten after `empty_virt_addr_cache` frees the pages cached for it: its
/// slot may serve another pool.
#[test]
fn a_forgotten_pool_frees_its_cached_pages() {
    let mut a = expandable(GIB, "");
    let pool = a.create_pool().unwrap();
    let x = a.malloc_in(40 * MIB, S0, pool).unwrap();
    a.free(x).unwrap();
    a.release_pool(pool).unwrap();
    a.empty_virt_addr_cache().unwrap();
    assert!(a.private_pools().is_empty());
    assert_eq!(a.held().cached_pages, 0);
    assert_eq!(page_calls(&a), (2, 2, 2));
    assert_eq!(device(&a), (0, 0, vec![]));
    check_consistency(&a);
}

/// A map that fails part-way with kept pages: a failed creation frees every page the call
/// took, kept ones included (torch_npu frees its call's handles), and the retry chain's next
/// attempt creates them anew; a failed map frees the pages not mapped, and the mapped ones stay
/// as a free block. The books stay exact either way.
#[test]
fn a_map_that_fails_with_kept_pages_frees_what_it_took() {
    let mut a = expandable(GIB, "");
    let x = a.malloc(60 * MIB, S0).unwrap();
    a.free(x).unwrap();
    a.empty_virt_addr_cache().unwrap();
    assert_eq!(a.held().cached_pages, 3);
    assert_eq!(page_calls(&a), (3, 0, 3));
    // 100 MiB: the 3 kept pages, a new one, and the fifth refused.
    a.device_mut()
        .fail_nth(DeviceCall::CreatePage, 2, Fault::OutOfMemory);
    let y = a.malloc(100 * MIB, S0).unwrap();
    // The 3 kept and the 1 created were freed; the retry created all 5.
    assert_eq!(page_calls(&a), (3 + 2 + 5, 4, 3 + 5));
    assert_eq!(a.held().cached_pages, 0);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    check_consistency(&a);
    a.free(y).unwrap();
    a.empty_virt_addr_cache().unwrap();
    assert_eq!(a.held().cached_pages, 5);
    // The third map call of the next malloc fails: two pages mapped and kept as a free block,
    // the other three freed.
    a.device_mut()
        .fail_nth(DeviceCall::Map, 3, Fault::Error(507_899));
    assert!(a.malloc(100 * MIB, S0).is_err());
    assert_eq!(a.held().cached_pages, 0);
    assert_eq!(device(&a).1, 40 * MIB);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (40 * MIB) as i64);
    check_consistency(&a);
    a.empty_cache().unwrap();
    assert_eq!(device(&a), (0, 0, vec![]));
    check_consistency(&a);
}

#[test]
fn an_expandable_block_ends_the_oversize_releases_search_as_in_pytorch() {
    // PyTorch's release_available_cached_blocks (#134338): when the first free block at or above
    // the request is expandable, it walks down instead of looking further up for a plain
    // segment (torch_npu would reach an internal assert). 150 MiB, no pad: `e` leaves three
    // mapped 20 MiB pages, the switch turns expandable segments off, `p` leaves a 70 MiB
    // segment, and 46 MiB (45, rounded) fits nowhere: the cached 70 MiB is too large under
    // max_non_split_rounding, the device has 20 MiB. The oversize release finds `e`'s 60 MiB
    // block first and walks down (nothing below 46 MiB), so the last attempt releases both and
    // the retry gets its own 46 MiB segment.
    let mut a = expandable(150 * MIB, "");
    let e = a.malloc(50 * MIB, S0).unwrap();
    a.free(e).unwrap();
    a.set_conf(&conf("expandable_segments:False,max_split_size_mb:40"));
    let p = a.malloc(70 * MIB, S0).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(45 * MIB, S0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (46 * MIB) as i64);
    assert_eq!(stat(&a, "num_device_free"), 2);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_sync_all_streams"), 1);
    assert_eq!(device(&a).1, 0, "no page stays mapped");
    a.free(q).unwrap();
    check_consistency(&a);
}
