//! The memory saver: pause and resume at the same addresses, CPU backup, misuse, out of memory
//! while resuming, failures of every device call; exact numbers and the device's own accounting.

mod common;

use alloc_core::{AllocConf, AllocError, SaverError};
use alloc_sim::{DeviceCall, Fault, SimDevice, TestDevice};
use common::*;

type A = alloc_core::Allocator<TestDevice>;

fn free_on_device(a: &mut A) -> u64 {
    a.device_mut().mem_info().unwrap().free
}

use alloc_core::Device;

/// Weights (20 MiB + 4 MiB, CPU backup) and a KV cache (30 MiB, none) in two tags, plus 8 MiB in
/// the default pool, on a 100 MiB device.
fn rollout() -> (A, [u64; 4]) {
    let mut a = cuda(100 * MIB, &AllocConf::default());
    let weights = a.saver_pool("weights", true).unwrap();
    let kv = a.saver_pool("kv", false).unwrap();
    let w1 = a.malloc_in(20 * MIB, S0, weights).unwrap();
    let w2 = a.malloc_in(4 * MIB, S0, weights).unwrap();
    let cache = a.malloc_in(30 * MIB, S0, kv).unwrap();
    let other = a.malloc(8 * MIB, S0).unwrap();
    (a, [w1, w2, cache, other])
}

#[test]
fn pause_returns_the_memory_and_resume_maps_it_at_the_same_addresses() {
    let (mut a, [w1, w2, cache, other]) = rollout();
    // Segments: weights 20 MiB (w1 and w2 share it: 20 MiB rounds to a 20 MiB segment, so w2
    // gets its own 20 MiB one), kv 30 MiB, default 20 MiB.
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (90 * MIB) as i64);
    assert_eq!(free_on_device(&mut a), 10 * MIB);
    let keys = a.stats().flat();
    let current = |a: &A| -> Vec<(String, i64)> {
        let mut flat = a.stats().flat();
        flat.retain(|(k, _)| k.ends_with(".current"));
        flat
    };
    let before = current(&a);
    assert_eq!(a.pause(Some("weights")), Ok(40 * MIB));
    // torch's figures do not move; the device has the memory back.
    assert_eq!(a.stats().flat(), keys);
    assert_eq!(free_on_device(&mut a), 50 * MIB);
    let s = a.saver_stats();
    assert_eq!(s.paused_bytes.current, (40 * MIB) as i64);
    assert_eq!(s.held_bytes.current, (50 * MIB) as i64);
    assert_eq!(s.held_bytes.peak, (90 * MIB) as i64);
    assert_eq!(
        s.tags
            .iter()
            .map(|t| (t.tag.as_str(), t.paused, t.bytes))
            .collect::<Vec<_>>(),
        [("kv", false, 30 * MIB), ("weights", true, 40 * MIB)]
    );
    check_consistency(&a);
    // The default pool and the other tag are untouched; a trainer step may use the memory.
    let step = a.malloc(40 * MIB, S0).unwrap();
    a.free(step).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.resume(Some("weights")), Ok(40 * MIB));
    assert_eq!(current(&a), before);
    assert_eq!(free_on_device(&mut a), 10 * MIB);
    assert_eq!(a.saver_stats().paused_bytes.current, 0);
    assert_eq!(a.saver_stats().paused_bytes.peak, (40 * MIB) as i64);
    for p in [w1, w2, cache, other] {
        a.free(p).unwrap();
    }
    check_consistency(&a);
}

#[test]
fn a_cpu_backup_restores_the_bytes_and_without_one_they_are_gone() {
    let (mut a, [w1, _, cache, _]) = rollout();
    a.device_mut().write_bytes(w1 + 123, b"weights").unwrap();
    a.device_mut().write_bytes(cache + 9, b"kv").unwrap();
    a.pause(None).unwrap();
    assert_eq!(a.device().live_host_buffers(), 2);
    a.resume(None).unwrap();
    assert_eq!(a.device().read_bytes(w1 + 123, 7).unwrap(), b"weights");
    assert_eq!(a.device().read_bytes(cache + 9, 2).unwrap(), [0, 0]);
    assert_eq!(a.device().live_host_buffers(), 0);
    check_consistency(&a);
}

#[test]
fn misuse_is_a_typed_error_and_changes_nothing() {
    let (mut a, [w1, _, _, _]) = rollout();
    let weights = a.saver_pool("weights", true).unwrap();
    assert_eq!(
        a.resume(Some("weights")),
        Err(SaverError::NotPaused("weights".into()))
    );
    assert_eq!(
        a.pause(Some("nope")),
        Err(SaverError::UnknownTag("nope".into()))
    );
    a.pause(Some("weights")).unwrap();
    assert_eq!(
        a.pause(Some("weights")),
        Err(SaverError::AlreadyPaused("weights".into()))
    );
    // pause() of every tag pauses the others only.
    assert_eq!(a.pause(None), Ok(30 * MIB));
    // Nothing is handed out of a paused tag, cached or new.
    assert_eq!(
        a.malloc_in(1000, S0, weights),
        Err(AllocError::Paused {
            tag: "weights".into()
        })
    );
    // A free into a paused tag is bookkeeping only.
    let calls = a.device().calls(DeviceCall::Free) + a.device().calls(DeviceCall::Unmap);
    a.free(w1).unwrap();
    assert_eq!(
        a.device().calls(DeviceCall::Free) + a.device().calls(DeviceCall::Unmap),
        calls
    );
    // empty_cache while paused: the tags' pools are held, their segments stay.
    a.empty_cache().unwrap();
    assert_eq!(a.saver_stats().paused_bytes.current, (70 * MIB) as i64);
    check_consistency(&a);
    assert_eq!(a.resume(None), Ok(70 * MIB));
    assert_eq!(a.resume(None), Ok(0));
    check_consistency(&a);
}

#[test]
fn out_of_memory_while_resuming_leaves_nothing_mapped_and_can_be_retried() {
    let (mut a, _) = rollout();
    a.pause(Some("weights")).unwrap();
    // A trainer step takes 40 MiB of the 50 MiB free: only one 20 MiB weight segment fits.
    let step = a.malloc(40 * MIB, S0).unwrap();
    let pages = a.device().live_pages();
    assert_eq!(
        a.resume(Some("weights")),
        Err(SaverError::OutOfMemory {
            tag: "weights".into(),
            bytes: 20 * MIB
        })
    );
    assert_eq!(a.device().live_pages(), pages);
    assert_eq!(a.saver_stats().paused_bytes.current, (40 * MIB) as i64);
    check_consistency(&a);
    a.free(step).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.resume(Some("weights")), Ok(40 * MIB));
    check_consistency(&a);
}

#[test]
fn out_of_host_memory_while_pausing_keeps_the_rest_mapped_and_can_be_retried() {
    let (mut a, [w1, w2, ..]) = rollout();
    a.device_mut().write_bytes(w1, b"w1").unwrap();
    a.device_mut().write_bytes(w2, b"w2").unwrap();
    // The weights' two 20 MiB segments: the first one's backup fits, the second one's does not.
    a.device_mut()
        .fail_nth(DeviceCall::AllocHost, 2, Fault::OutOfMemory);
    let e = a.pause(Some("weights")).unwrap_err();
    assert_eq!(
        e,
        SaverError::HostOutOfMemory {
            tag: "weights".into(),
            bytes: 20 * MIB
        }
    );
    assert_eq!(
        e.to_string(),
        "out of host memory backing up tag \"weights\" (a segment of 20971520 bytes) while \
         pausing; that segment and those after it stay mapped, and pausing the tag again retries \
         them"
    );
    assert_eq!(a.saver_stats().paused_bytes.current, (20 * MIB) as i64);
    assert_eq!(a.device().live_host_buffers(), 1);
    // Marked paused: nothing more is handed out of it; pause() of every tag pauses what is
    // still mapped, its second segment included, as torch_memory_saver pauses every active
    // allocation.
    let weights = a.saver_pool("weights", true).unwrap();
    assert!(matches!(
        a.malloc_in(1000, S0, weights),
        Err(AllocError::Paused { .. })
    ));
    assert_eq!(
        a.pause(None),
        Ok(50 * MIB),
        "the kv tag's segment and the weights' second"
    );
    check_consistency(&a);
    assert!(matches!(
        a.pause(Some("weights")),
        Err(SaverError::AlreadyPaused(_))
    ));
    assert_eq!(a.saver_stats().paused_bytes.current, (70 * MIB) as i64);
    assert_eq!(a.resume(None), Ok(70 * MIB));
    assert_eq!(a.device().read_bytes(w1, 2).unwrap(), b"w1");
    assert_eq!(a.device().read_bytes(w2, 2).unwrap(), b"w2");
    assert_eq!(a.device().live_host_buffers(), 0);
    check_consistency(&a);
}

/// A `pause()` of every tag that fails on the first tag leaves the tags it did not reach
/// unpaused (they keep allocating), and a retry pauses everything.
#[test]
fn a_failed_pause_of_every_tag_leaves_the_tags_it_did_not_reach_unpaused() {
    let (mut a, _) = rollout();
    // The weights' first backup fails: nothing is paused at all.
    a.device_mut()
        .fail_nth(DeviceCall::AllocHost, 1, Fault::OutOfMemory);
    assert!(matches!(
        a.pause(None),
        Err(SaverError::HostOutOfMemory { .. })
    ));
    assert_eq!(a.saver_stats().paused_bytes.current, 0);
    let kv = a.saver_pool("kv", false).unwrap();
    let weights = a.saver_pool("weights", true).unwrap();
    let more = a.malloc_in(1000, S0, kv).unwrap();
    a.free(more).unwrap();
    let more = a.malloc_in(1000, S0, weights).unwrap();
    a.free(more).unwrap();
    check_consistency(&a);
    // Each 1000-byte allocation took a 2 MiB small segment of its tag.
    assert_eq!(a.pause(None), Ok(74 * MIB));
    assert_eq!(a.pause(None), Ok(0));
    assert_eq!(a.resume(None), Ok(74 * MIB));
    check_consistency(&a);
}

#[test]
fn failed_device_calls_leave_the_books_exact() {
    for call in [
        DeviceCall::Synchronize,
        DeviceCall::AllocHost,
        DeviceCall::CopyToHost,
        DeviceCall::Unmap,
        DeviceCall::ReleasePage,
    ] {
        let (mut a, [w1, ..]) = rollout();
        a.device_mut().write_bytes(w1, b"w").unwrap();
        a.device_mut().fail_nth(call, 1, Fault::Error(507_899));
        let result = a.pause(Some("weights"));
        check_consistency(&a);
        // A refused page is held; anything else fails the pause, which can be retried.
        if call == DeviceCall::ReleasePage {
            assert_eq!(result, Ok(40 * MIB));
            assert_eq!(a.held().pages, 1);
            // The next empty_cache gives it back (its 20 MiB are needed to resume).
            a.empty_cache().unwrap();
            assert_eq!(a.held().pages, 0);
        } else {
            assert!(
                matches!(result, Err(SaverError::Device(_))),
                "{call}: {result:?}"
            );
            a.pause(Some("weights")).unwrap();
        }
        for call in [
            DeviceCall::CreatePage,
            DeviceCall::Map,
            DeviceCall::CopyToDevice,
        ] {
            a.device_mut().fail_nth(call, 2, Fault::Error(507_899));
            let before = (
                a.device().live_pages(),
                a.device().page_bytes(),
                a.saver_stats().paused_bytes.current,
                a.held(),
            );
            let result = a.resume(Some("weights"));
            eprintln!(
                "{call}: before {before:?} after {:?} {:?} {:?}",
                (a.device().live_pages(), a.device().page_bytes()),
                a.saver_stats().paused_bytes.current,
                a.saver_segments()
            );
            assert!(
                matches!(result, Err(SaverError::Device(_))),
                "{call}: {result:?}"
            );
            check_consistency(&a);
        }
        assert_eq!(a.resume(Some("weights")), Ok(40 * MIB));
        assert_eq!(a.device().read_bytes(w1, 1).unwrap(), b"w", "{call}");
        a.empty_cache().unwrap();
        check_consistency(&a);
    }
}

#[test]
fn a_device_without_virtual_memory_has_no_memory_saver() {
    let mut a = alloc_core::Allocator::new(
        TestDevice::new(SimDevice::new(GIB).without_vmm()),
        &AllocConf::default(),
        alloc_core::DeviceFacts::cuda_parity(0),
    );
    assert_eq!(
        a.saver_pool("kv", false),
        Err(alloc_core::PoolError::NoVirtualMemory)
    );
    // A probe that fails with an error says nothing, so the pool is made; its first segment
    // then finds no virtual memory: refused as such, not run through the out-of-memory chain.
    a.device_mut()
        .fail_nth(DeviceCall::ReserveAddress, 1, Fault::Error(507_899));
    let kv = a.saver_pool("kv", false).unwrap();
    assert_eq!(
        a.malloc_in(1000, S0, kv),
        Err(AllocError::Pool(alloc_core::PoolError::NoVirtualMemory))
    );
    assert_eq!(stat(&a, "num_ooms"), 0);
    assert_eq!(stat(&a, "num_alloc_retries"), 0);
    check_consistency(&a);
}

#[test]
fn releasing_a_saver_segment_gives_back_its_range_page_and_backup() {
    let mut a = cuda(100 * MIB, &AllocConf::default());
    let pool = a.saver_pool("kv", true).unwrap();
    let p = a.malloc_in(30 * MIB, S0, pool).unwrap();
    a.free(p).unwrap();
    // A saver pool is held for good: empty_cache keeps it, as torch keeps a live MemPool.
    a.empty_cache().unwrap();
    assert_eq!(a.device().reserved_ranges().count(), 1);
    // Released (the runtime never does this; the core allows it), it goes back whole.
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.device().reserved_ranges().count(), 0);
    assert_eq!(a.device().live_pages(), 0);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    check_consistency(&a);
}

/// A resume whose copy back fails and whose undo (the unmap) fails too leaves the segment
/// mapped without its bytes; the next resume copies the backup back instead of passing over it.
#[test]
fn a_segment_left_mapped_by_a_double_fault_gets_its_bytes_at_the_next_resume() {
    let (mut a, [w1, ..]) = rollout();
    a.device_mut().write_bytes(w1, b"w1").unwrap();
    assert_eq!(a.pause(Some("weights")), Ok(40 * MIB));
    a.device_mut()
        .fail_nth(DeviceCall::CopyToDevice, 1, Fault::Error(507_899));
    a.device_mut()
        .fail_nth(DeviceCall::Unmap, 1, Fault::Error(507_899));
    assert!(a.resume(Some("weights")).is_err());
    check_consistency(&a);
    assert_ne!(a.device().read_bytes(w1, 2).unwrap(), b"w1");
    assert!(a.resume(Some("weights")).is_ok());
    assert_eq!(a.device().read_bytes(w1, 2).unwrap(), b"w1");
    assert_eq!(a.device().live_host_buffers(), 0);
    check_consistency(&a);
}

/// A resume that fails on its second segment and whose undo of the first fails too leaves the
/// first mapped with its backup; without retention, the next resume frees that backup as well.
#[test]
fn a_backup_left_by_a_failed_undo_goes_at_the_next_resume_without_retention() {
    let (mut a, [w1, w2, ..]) = rollout();
    a.device_mut().write_bytes(w1, b"old").unwrap();
    assert_eq!(a.pause(Some("weights")), Ok(40 * MIB));
    a.device_mut()
        .fail_nth(DeviceCall::CreatePage, 2, Fault::OutOfMemory);
    a.device_mut()
        .fail_nth(DeviceCall::Unmap, 1, Fault::Error(507_899));
    assert!(matches!(
        a.resume(Some("weights")),
        Err(SaverError::OutOfMemory { .. })
    ));
    check_consistency(&a);
    assert_eq!(a.device().live_host_buffers(), 2);
    // The second segment is mapped now; the first was left mapped, its backup kept.
    assert_eq!(a.resume(Some("weights")), Ok(20 * MIB));
    assert_eq!(a.device().live_host_buffers(), 0);
    a.device_mut().write_bytes(w1, b"new").unwrap();
    assert!(a.cpu_backup(w1, 3).unwrap().is_none());
    assert!(a.cpu_backup(w2, 3).unwrap().is_none());
    check_consistency(&a);
}

/// torch_memory_saver's `get_cpu_backup` and `retain_cpu_backup`: a paused tag's backup holds
/// its bytes at the pause; retained, it outlives the resume (still the pause's bytes) and the
/// next pause copies into it instead of allocating host memory again.
#[test]
fn retained_cpu_backups_are_read_back_and_reused_by_the_next_pause() {
    let (mut a, [w1, w2, cache, other]) = rollout();
    let read = |a: &A, addr: u64, len: u64| -> Option<Vec<u8>> {
        let backup = a.cpu_backup(addr, len).unwrap()?;
        Some(backup.buffer.read(backup.offset, len))
    };
    a.device_mut().write_bytes(w1 + 123, b"weights").unwrap();
    // In use, without retention: no backup yet.
    assert_eq!(read(&a, w1 + 123, 7), None);
    a.set_retain_cpu_backup(true);
    a.pause(None).unwrap();
    assert_eq!(read(&a, w1 + 123, 7).as_deref(), Some(&b"weights"[..]));
    assert_eq!(
        a.cpu_backup(cache + 9, 2).map(|b| b.is_some()),
        Err(SaverError::NoCpuBackup("kv".into()))
    );
    a.resume(None).unwrap();
    // Both weight segments keep their buffers; the kv cache never had one.
    assert_eq!(a.device().live_host_buffers(), 2);
    assert_eq!(a.held_host_buffers(), 2);
    assert_eq!(a.device().read_bytes(w1 + 123, 7).unwrap(), b"weights");
    // The backup is the pause's copy: writes since do not reach it.
    a.device_mut().write_bytes(w1 + 123, b"WEIGHTS").unwrap();
    assert_eq!(read(&a, w1 + 123, 7).as_deref(), Some(&b"weights"[..]));
    assert_eq!(read(&a, cache + 9, 2), None);
    // The next pause copies into the kept buffers: no host allocation.
    assert_eq!(a.device().calls(DeviceCall::AllocHost), 2);
    a.pause(None).unwrap();
    assert_eq!(a.device().calls(DeviceCall::AllocHost), 2);
    assert_eq!(read(&a, w1 + 123, 7).as_deref(), Some(&b"WEIGHTS"[..]));
    // Turned off, the next resume frees what it resumes.
    a.set_retain_cpu_backup(false);
    a.resume(None).unwrap();
    assert_eq!(a.device().read_bytes(w1 + 123, 7).unwrap(), b"WEIGHTS");
    assert_eq!(a.device().live_host_buffers(), 0);
    assert_eq!(read(&a, w1 + 123, 7), None);
    // A range outside every saver segment, or past the end of one, has no backup to read.
    let outside = |addr, len| Err(SaverError::NotSaverMemory { addr, len });
    assert_eq!(
        a.cpu_backup(other, 8).map(|b| b.is_some()),
        outside(other, 8)
    );
    assert_eq!(
        a.cpu_backup(w2, 20 * MIB + 1).map(|b| b.is_some()),
        outside(w2, 20 * MIB + 1)
    );
    assert_eq!(
        a.cpu_backup(w2, u64::MAX).map(|b| b.is_some()),
        outside(w2, u64::MAX)
    );
    check_consistency(&a);
}

/// A retained backup goes back with its segment.
#[test]
fn a_retained_backup_is_freed_with_its_segment() {
    let mut a = cuda(100 * MIB, &AllocConf::default());
    a.set_retain_cpu_backup(true);
    let pool = a.saver_pool("weights", true).unwrap();
    let p = a.malloc_in(30 * MIB, S0, pool).unwrap();
    a.pause(None).unwrap();
    a.resume(None).unwrap();
    assert_eq!(a.device().live_host_buffers(), 1);
    a.free(p).unwrap();
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.device().live_host_buffers(), 0);
    assert_eq!(a.held_host_buffers(), 0);
    assert_eq!(a.device().reserved_ranges().count(), 0);
    check_consistency(&a);
}

/// torch_memory_saver's `memory_margin_bytes`: a tag's new segment runs out of memory unless
/// the device keeps the margin free beside it; cached blocks and other pools are not checked.
#[test]
fn a_memory_margin_refuses_a_tags_segment_that_would_leave_less_free() {
    let mut a = cuda(100 * MIB, &AllocConf::default());
    let weights = a.saver_pool("weights", false).unwrap();
    a.set_saver_memory_margin(70 * MIB);
    assert_eq!(a.saver_memory_margin(), 70 * MIB);
    // 20 MiB and the 70 MiB margin fit in the 100 MiB free.
    let p = a.malloc_in(20 * MIB, S0, weights).unwrap();
    // 80 MiB free: a second 20 MiB segment would leave 60. Out of memory, through torch's retry
    // chain (nothing cached to free), with nothing reserved or left on the device.
    let calls = a.device().calls(DeviceCall::MemInfo);
    assert!(matches!(
        a.malloc_in(20 * MIB, S0, weights),
        Err(AllocError::OutOfMemory(_))
    ));
    assert!(a.device().calls(DeviceCall::MemInfo) > calls);
    assert_eq!(stat(&a, "num_ooms"), 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (20 * MIB) as i64);
    assert_eq!(free_on_device(&mut a), 80 * MIB);
    // The default pool is not checked; a cached block of the tag is served without a check.
    let other = a.malloc(20 * MIB, S0).unwrap();
    a.free(p).unwrap();
    let calls = a.device().calls(DeviceCall::MemInfo);
    assert_eq!(a.malloc_in(20 * MIB, S0, weights), Ok(p));
    assert_eq!(a.device().calls(DeviceCall::MemInfo), calls);
    // 0 turns the check off.
    a.set_saver_memory_margin(0);
    let q = a.malloc_in(20 * MIB, S0, weights).unwrap();
    // A failed mem_info is the device's error, as upstream's CUDA_ERROR_CHECK stops there.
    a.set_saver_memory_margin(1);
    a.device_mut()
        .fail_nth(DeviceCall::MemInfo, 1, Fault::Error(507_899));
    assert!(matches!(
        a.malloc_in(20 * MIB, S0, weights),
        Err(AllocError::Device(_))
    ));
    for x in [p, q, other] {
        a.free(x).unwrap();
    }
    check_consistency(&a);
}
