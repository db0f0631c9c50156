//! torch_npu's newer options on expandable segments: `throw_on_npumalloc_oom`, `MemPool`'s
//! `use_on_oom` and `no_split`. The numbers are torch_npu's, worked from its source by a review
//! with an independent model of its expandable path (`alloc_block`, `try_mempool_fallback`,
//! `should_split`, `map_block`), which gave the same stats on 860 random traces.

mod common;

use alloc_core::{AllocError, Allocator};
use alloc_sim::TestDevice;
use common::*;

fn expandable(capacity: u64, extra: &str) -> Allocator<TestDevice> {
    npu(capacity, &conf(&format!("expandable_segments:True{extra}")))
}

/// The rejection compares torch's `alloc_size` (20 MiB for a large request under 10 MiB, 2 MiB
/// for a small one), not the pages the request would map, before any page is mapped.
#[test]
fn a_rejection_compares_the_segment_size_before_pages_are_mapped() {
    let mut a = expandable(
        GIB,
        ",throw_on_npumalloc_oom:True,per_process_memory_fraction:0.1",
    );
    // The limit of the fraction at start is lifted; the rejection's bound (0.1 GiB) stays.
    a.set_memory_fraction(1.0).unwrap();
    a.malloc(99 * MIB, S0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (100 * MIB) as i64);
    // 100 MiB + 20 MiB > 107,374,182: refused, nothing mapped, no retry.
    assert!(matches!(
        a.malloc(MIB, S0),
        Err(AllocError::Rejected(r)) if r.alloc_size == 20 * MIB && r.limit == 107_374_182
    ));
    assert_eq!(stat(&a, "num_oom_rejections"), 1);
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    assert_eq!(stat(&a, "num_alloc_retries"), 0);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (100 * MIB) as i64);
    // 100 + 2 MiB fits under the bound: one small page is mapped.
    a.malloc(1000, S0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (102 * MIB) as i64);
    assert_eq!(stat(&a, "num_device_alloc"), 2);
    assert_eq!(stat(&a, "num_oom_rejections"), 1);
    check_consistency(&a);
}

/// The converse: a request whose `alloc_size` passes may map whole pages past the bound, as in
/// torch_npu (45 MiB: `alloc_size` 46 MiB ≤ 50 MiB, three 20 MiB pages mapped).
#[test]
fn pages_mapped_after_the_check_may_pass_the_bound() {
    let mut a = expandable(
        100 * MIB,
        ",throw_on_npumalloc_oom:True,per_process_memory_fraction:0.5",
    );
    a.set_memory_fraction(1.0).unwrap();
    a.malloc(45 * MIB, S0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (60 * MIB) as i64);
    assert_eq!(stat(&a, "num_oom_rejections"), 0);
    check_consistency(&a);
}

/// A 50 MiB device; a pool (`use_on_oom`, and `no_split` when asked) whose 30 MiB allocation
/// mapped two 20 MiB pages, freed and cached in the pool: the default pool can then map no page.
fn pool_holding_forty_mib(no_split: bool) -> Allocator<TestDevice> {
    let mut a = expandable(50 * MIB, "");
    let pool = a.create_pool().unwrap();
    a.set_use_on_oom(pool, true).unwrap();
    if no_split {
        a.set_no_split(pool).unwrap();
    }
    let x = a.malloc_in(30 * MIB, S0, pool).unwrap();
    a.free(x).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (40 * MIB) as i64);
    a
}

/// The fallback takes the pool's mapped block and splits it by the expandable rule (512 bytes
/// left is enough, in the large pool too); it never maps pages in the pool's range.
#[test]
fn use_on_oom_splits_a_mapped_pool_block_by_the_expandable_rule() {
    let mut a = pool_holding_forty_mib(false);
    let y = a.malloc(10 * MIB, S0).unwrap();
    let z = a.malloc(5 * MIB, S0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (40 * MIB) as i64);
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    assert_eq!(
        stat(&a, "allocated_bytes.all.current"),
        (15 * MIB + 1024) as i64
    );
    assert_eq!(stat(&a, "num_ooms"), 0);
    assert_eq!(stat(&a, "num_alloc_retries"), 0);
    a.free(y).unwrap();
    a.free(z).unwrap();
    check_consistency(&a);
}

/// With `no_split` the first fallback takes the whole 40 MiB block; the next request has no
/// block left and runs the chain to out of memory.
#[test]
fn use_on_oom_with_no_split_hands_the_mapped_block_out_whole() {
    let mut a = pool_holding_forty_mib(true);
    a.malloc(10 * MIB, S0).unwrap();
    assert_eq!(stat(&a, "allocated_bytes.all.current"), (40 * MIB) as i64);
    assert!(matches!(
        a.malloc(5 * MIB, S0),
        Err(AllocError::OutOfMemory(_))
    ));
    assert_eq!(stat(&a, "num_ooms"), 1);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_sync_all_streams"), 1);
    check_consistency(&a);
}

/// `no_split` comes before the expandable split rule: a block just mapped, merged with its free
/// mapped neighbour, is handed out whole (30 MiB takes the free 20 MiB and one new page).
#[test]
fn no_split_hands_out_a_freshly_mapped_merged_block_whole() {
    let mut a = expandable(GIB, "");
    let pool = a.create_pool().unwrap();
    a.set_no_split(pool).unwrap();
    let x = a.malloc_in(5 * MIB, S0, pool).unwrap();
    assert_eq!(stat(&a, "allocated_bytes.all.current"), (20 * MIB) as i64);
    a.free(x).unwrap();
    a.malloc_in(30 * MIB, S0, pool).unwrap();
    assert_eq!(stat(&a, "allocated_bytes.all.current"), (40 * MIB) as i64);
    assert_eq!(stat(&a, "requested_bytes.all.current"), (30 * MIB) as i64);
    assert_eq!(stat(&a, "num_device_alloc"), 2);
    check_consistency(&a);
}
