//! Private pools (torch's `MemPool`): routing, lifetime, emptying and errors, with exact numbers.

mod common;

use alloc_core::{AllocConf, AllocError, PoolError, PoolId};
use alloc_sim::{DeviceCall, Fault};
use common::*;

#[test]
fn a_pool_serves_only_its_own_requests_and_frees_return_to_it() {
    let mut a = cuda(GIB, &AllocConf::default());
    let pool = a.create_pool().unwrap();
    assert_eq!(pool, PoolId(0, 1));
    assert_eq!(a.create_pool().unwrap(), PoolId(0, 2));
    let x = a.malloc_in(1000, S0, pool).unwrap();
    // The pool has its own 2 MiB small segment; the default pools have nothing cached to give.
    let y = a.malloc(1000, S0).unwrap();
    assert_eq!(y, x + 2 * MIB);
    assert_eq!(stat(&a, "segment.small_pool.current"), 2);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (4 * MIB) as i64);
    // Freed while nothing routes to the pool, x still goes back to it: the default pool's next
    // request is carved from its own segment, the pool's next request reuses x.
    a.free(x).unwrap();
    assert_eq!(a.malloc(1000, S0).unwrap(), y + 1024);
    assert_eq!(a.malloc_in(1000, S0, pool).unwrap(), x);
    let snapshot = a.snapshot();
    assert_eq!(
        snapshot.iter().map(|s| s.pool_id).collect::<Vec<_>>(),
        [pool, PoolId::DEFAULT]
    );
    check_consistency(&a);
}

#[test]
fn a_held_pool_keeps_its_cache_and_a_released_one_is_emptied_and_forgotten() {
    let mut a = cuda(GIB, &AllocConf::default());
    let pool = a.create_pool().unwrap();
    let x = a.malloc_in(30 * MIB, S0, pool).unwrap();
    a.free(x).unwrap();
    a.empty_cache().unwrap();
    // Held: torch keeps a live MemPool's segments (test_mempool_destructor).
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (30 * MIB) as i64);
    a.empty_pool_cache(pool).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (30 * MIB) as i64);
    // Released, then emptied: the segment goes back and the pool is forgotten.
    a.release_pool(pool).unwrap();
    assert_eq!(a.pool_use_count(pool), Ok(0));
    a.empty_pool_cache(pool).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(a.pool_use_count(pool), Err(PoolError::Unknown(pool)));
    assert!(a.private_pools().is_empty());
    check_consistency(&a);
}

/// torch_npu's `emptyCache(id)`: after the device's synchronization, only a freeable pool's
/// events are completed (`synchronize_and_free_events(pool)`, one `num_sync_all_streams`);
/// a held pool's call completes none, and other blocks' events stay pending either way.
#[test]
fn emptying_a_pool_completes_only_that_pools_events_and_only_once_it_is_released() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(1000, S0).unwrap();
    a.record_stream(x, S1).unwrap();
    a.free(x).unwrap();
    let pool = a.create_pool().unwrap();
    let y = a.malloc_in(30 * MIB, S0, pool).unwrap();
    a.record_stream(y, S1).unwrap();
    a.free(y).unwrap();
    let syncs = stat(&a, "num_sync_all_streams");
    assert_eq!(stat(&a, "active.all.current"), 2);
    a.empty_pool_cache(pool).unwrap();
    assert_eq!(stat(&a, "num_sync_all_streams"), syncs);
    assert_eq!(stat(&a, "active.all.current"), 2);
    assert_eq!(a.device().calls(DeviceCall::Synchronize), 1);
    // Released: y's event completes and its segment goes back; x's stays pending.
    a.release_pool(pool).unwrap();
    a.empty_pool_cache(pool).unwrap();
    assert_eq!(stat(&a, "num_sync_all_streams"), syncs + 1);
    assert_eq!(stat(&a, "active.all.current"), 1);
    assert_eq!(stat(&a, "active_bytes.all.current"), 1024);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (2 * MIB) as i64);
    assert!(a.private_pools().is_empty());
    check_consistency(&a);
    // The next malloc processes x's event, which the synchronization completed: x is reused.
    assert_eq!(a.malloc(1000, S0).unwrap(), x);
    assert_eq!(stat(&a, "active.all.current"), 1);
    check_consistency(&a);
}

#[test]
fn a_live_block_keeps_a_released_pool_until_it_is_freed() {
    let mut a = cuda(GIB, &AllocConf::default());
    let pool = a.create_pool().unwrap();
    let x = a.malloc_in(30 * MIB, S0, pool).unwrap();
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.private_pools(), [pool]);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (30 * MIB) as i64);
    // No new allocation can be routed to it.
    assert_eq!(
        a.malloc_in(1000, S0, pool),
        Err(AllocError::Pool(PoolError::Released(pool)))
    );
    a.free(x).unwrap();
    a.empty_cache().unwrap();
    assert!(a.private_pools().is_empty());
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    check_consistency(&a);
}

#[test]
fn use_counts_follow_torch_and_misuse_is_a_typed_error() {
    let mut a = cuda(GIB, &AllocConf::default());
    let pool = a.create_pool().unwrap();
    a.retain_pool(pool).unwrap();
    assert_eq!(a.pool_use_count(pool), Ok(2));
    a.release_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    assert_eq!(a.release_pool(pool), Err(PoolError::OverReleased(pool)));
    assert_eq!(a.retain_pool(pool), Err(PoolError::Released(pool)));
    let unknown = PoolId(0, 99);
    assert_eq!(a.retain_pool(unknown), Err(PoolError::Unknown(unknown)));
    assert_eq!(
        a.malloc_in(1000, S0, unknown),
        Err(AllocError::Pool(PoolError::Unknown(unknown)))
    );
    assert_eq!(a.release_pool(PoolId::DEFAULT), Err(PoolError::Default));
    // Nothing was allocated by the failed requests.
    assert_eq!(stat(&a, "allocation.all.current"), 0);
    assert_eq!(a.device().calls(DeviceCall::Malloc), 0);
}

/// torch_npu's `beginAllocateToPool`: `create_or_incref_pool`, then "already recording to
/// mempool_id" for a pool a scope allocates to.
#[test]
fn entering_a_pool_holds_it_once_and_makes_a_pool_for_an_unknown_id() {
    let mut a = cuda(GIB, &AllocConf::default());
    let pool = a.create_pool().unwrap();
    a.enter_pool(pool).unwrap();
    assert_eq!(a.pool_use_count(pool), Ok(2));
    // Refused, and unlike torch the refusal takes no hold.
    assert_eq!(a.enter_pool(pool), Err(PoolError::AlreadyEntered(pool)));
    assert_eq!(a.pool_use_count(pool), Ok(2));
    a.leave_pool(pool).unwrap();
    assert_eq!(a.leave_pool(pool), Err(PoolError::NotEntered(pool)));
    assert_eq!(a.pool_use_count(pool), Ok(1));
    // The hold of an open scope is the scope's: releasing the pool down to it is refused, and
    // changes nothing.
    a.enter_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    assert_eq!(a.release_pool(pool), Err(PoolError::OverReleased(pool)));
    assert_eq!(a.pool_use_count(pool), Ok(1));
    a.leave_pool(pool).unwrap();
    assert_eq!(a.pool_use_count(pool), Ok(0));
    let pool = a.create_pool().unwrap();
    // An id this device does not know (another device's pool, torch's graph_pool_handle):
    // a pool of its own, held by the scope alone.
    let other = PoolId(0, 7);
    a.enter_pool(other).unwrap();
    assert_eq!(a.pool_use_count(other), Ok(1));
    let x = a.malloc_in(30 * MIB, S0, other).unwrap();
    a.leave_pool(other).unwrap();
    a.free(x).unwrap();
    // Freeable once its scope ended: emptied and forgotten.
    a.empty_cache().unwrap();
    assert_eq!(a.pool_use_count(other), Err(PoolError::Unknown(other)));
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    // A released pool cannot be entered (torch asserts), nor the default pools.
    a.release_pool(pool).unwrap();
    let y = a.malloc_in(1000, S0, pool);
    assert_eq!(y, Err(AllocError::Pool(PoolError::Released(pool))));
    assert_eq!(a.enter_pool(pool), Err(PoolError::Released(pool)));
    assert_eq!(a.enter_pool(PoolId::DEFAULT), Err(PoolError::Default));
    // A new pool never takes the number of a pool a scope made.
    let mut b = cuda(GIB, &AllocConf::default());
    b.enter_pool(PoolId(0, 1)).unwrap();
    assert_eq!(b.create_pool(), Ok(PoolId(0, 2)));
    check_consistency(&a);
}

#[test]
fn allocators_sharing_pool_ids_number_their_pools_as_one_process() {
    let ids = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1));
    let (mut d0, mut d1) = (
        cuda(GIB, &AllocConf::default()),
        cuda(GIB, &AllocConf::default()),
    );
    d0.share_pool_ids(ids.clone());
    d1.share_pool_ids(ids);
    assert_eq!(d0.create_pool(), Ok(PoolId(0, 1)));
    assert_eq!(d1.create_pool(), Ok(PoolId(0, 2)));
    assert_eq!(d0.saver_pool("kv", false), Ok(PoolId(0, 3)));
    assert_eq!(d0.create_pool(), Ok(PoolId(0, 4)));
    // A scope on device 1 makes a pool of an id ahead of the count: no device hands it out.
    d1.enter_pool(PoolId(0, 9)).unwrap();
    assert_eq!(d0.create_pool(), Ok(PoolId(0, 10)));
}

#[test]
fn the_oom_retry_frees_freeable_pools_but_not_held_ones() {
    // 64 MiB: a held pool's free 30 MiB and a released pool's free 30 MiB; a 30 MiB default
    // request runs out, the retry frees the released pool's segment only.
    let mut a = cuda(64 * MIB, &AllocConf::default());
    let (held, released) = (a.create_pool().unwrap(), a.create_pool().unwrap());
    let x = a.malloc_in(30 * MIB, S0, held).unwrap();
    let y = a.malloc_in(30 * MIB, S0, released).unwrap();
    a.free(x).unwrap();
    a.free(y).unwrap();
    a.release_pool(released).unwrap();
    let z = a.malloc(30 * MIB, S0).unwrap();
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (60 * MIB) as i64);
    assert_eq!(a.private_pools(), [held]);
    a.free(z).unwrap();
    check_consistency(&a);
}

#[test]
fn pools_get_their_own_expandable_segments() {
    let mut a = cuda(GIB, &conf("expandable_segments:True"));
    let pool = a.create_pool().unwrap();
    a.malloc(8 * MIB, S0).unwrap();
    a.malloc_in(8 * MIB, S0, pool).unwrap();
    assert_eq!(a.expandable_segments().len(), 2);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (40 * MIB) as i64);
    let snapshot = a.snapshot();
    assert!(snapshot.iter().all(|s| s.is_expandable));
    assert_eq!(snapshot[1].pool_id, pool);
    check_consistency(&a);
    // A device malloc failure inside the pool goes through the same retry chain.
    a.device_mut()
        .fail_nth(DeviceCall::CreatePage, 1, Fault::OutOfMemory);
    a.malloc_in(30 * MIB, S0, pool).unwrap();
    check_consistency(&a);
}

/// A pool's expandable segments count per reserved range, not per map call as torch_npu's
/// `npuMalloc_count` does (docs/deviations.md): after two map calls into one range and an
/// unmap of each half, torch_npu's count would go below zero (an internal assert in
/// `empty_cache`); here the range is one segment of the pool, released once.
#[test]
fn a_pools_expandable_range_counts_once_however_often_it_maps() {
    let mut a = cuda(GIB, &conf("expandable_segments:True"));
    let pool = a.create_pool().unwrap();
    // One map call of 3 pages, then two 20 MiB blocks in it.
    let x = a.malloc_in(60 * MIB, S0, pool).unwrap();
    a.free(x).unwrap();
    let p = a.malloc_in(20 * MIB, S0, pool).unwrap();
    let q = a.malloc_in(20 * MIB, S0, pool).unwrap();
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    a.free(p).unwrap();
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    // The free page before q and the one after it are unmapped: two unmaps of one range.
    assert_eq!(stat(&a, "num_device_free"), 2);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (20 * MIB) as i64);
    // The pool still has q's range, so it is kept until q goes.
    assert_eq!(a.private_pools(), [pool]);
    check_consistency(&a);
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert!(a.expandable_segments().is_empty());
    assert_eq!(a.private_pools(), []);
    check_consistency(&a);
}

/// Two map calls into one range (torch_npu would count 2, take 1 off for the one unmap, and keep
/// the released pool for good): here the pool goes with its range.
#[test]
fn a_released_pool_goes_with_its_last_expandable_range() {
    let mut a = cuda(GIB, &conf("expandable_segments:True"));
    let pool = a.create_pool().unwrap();
    let x = a.malloc_in(8 * MIB, S0, pool).unwrap();
    let y = a.malloc_in(16 * MIB, S0, pool).unwrap();
    assert_eq!(stat(&a, "num_device_alloc"), 2);
    assert_eq!(a.expandable_segments().len(), 1);
    a.free(x).unwrap();
    a.free(y).unwrap();
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(stat(&a, "num_device_free"), 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(a.private_pools(), []);
    check_consistency(&a);
}

/// A default-pool malloc whose first segment request fails, with `pool`'s 22 MiB segment cached
/// and `x` (a 32 MiB segment) live on a 64 MiB device. Returns the allocator, the pool and the
/// address of its cached block.
fn oom_with_a_cached_pool_block(
    use_on_oom: bool,
) -> (alloc_core::Allocator<alloc_sim::TestDevice>, PoolId, u64) {
    let mut a = npu(64 * MIB, &AllocConf::default());
    let pool = a.create_pool().unwrap();
    if use_on_oom {
        a.set_use_on_oom(pool, true).unwrap();
    }
    let y = a.malloc_in(20 * MIB, S0, pool).unwrap();
    a.free(y).unwrap();
    a.malloc(30 * MIB, S0).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (54 * MIB) as i64);
    (a, pool, y)
}

/// torch's `use_on_oom` (`try_mempool_fallback`): after the first segment request of a
/// default-pool malloc failed, a cached block of a `use_on_oom` pool that fits is taken, before
/// anything is released; the block stays the pool's.
#[test]
fn a_use_on_oom_pool_serves_a_default_malloc_before_the_retry_chain() {
    let (mut a, pool, y) = oom_with_a_cached_pool_block(true);
    // 54 + 22 MiB does not fit 64: the device refuses; the pool's block (20 MiB + 512) fits.
    assert_eq!(a.malloc(20 * MIB, S0), Ok(y));
    assert_eq!(a.device().malloc_calls(), 3);
    assert_eq!(stat(&a, "num_alloc_retries"), 0);
    assert_eq!(stat(&a, "num_sync_all_streams"), 0);
    assert_eq!(stat(&a, "num_ooms"), 0);
    // The block is split as the pool's: its 2 MiB - 512 rest stays cached in the pool.
    assert_eq!(stat(&a, "inactive_split.large_pool.current"), 2);
    a.free(y).unwrap();
    // Freed, it goes back to the pool, whose next request takes it.
    assert_eq!(a.malloc_in(20 * MIB, S0, pool), Ok(y));
    check_consistency(&a);

    // Without use_on_oom the chain runs and runs out: the held pool's cache is not released.
    let (mut b, _, _) = oom_with_a_cached_pool_block(false);
    assert!(matches!(
        b.malloc(20 * MIB, S0),
        Err(AllocError::OutOfMemory(_))
    ));
    assert_eq!(stat(&b, "num_alloc_retries"), 1);
    check_consistency(&b);
}

#[test]
fn the_fallback_passes_over_entered_and_released_pools_and_serves_default_requests_only() {
    // A scope allocates to the pool (torch would raise "already recording" out of the malloc).
    let (mut a, pool, y) = oom_with_a_cached_pool_block(true);
    a.enter_pool(pool).unwrap();
    assert!(matches!(
        a.malloc(20 * MIB, S0),
        Err(AllocError::OutOfMemory(_))
    ));
    a.leave_pool(pool).unwrap();
    // Switched off again.
    a.set_use_on_oom(pool, false).unwrap();
    assert!(a.malloc(20 * MIB, S0).is_err());
    // A request of another private pool does not fall back.
    a.set_use_on_oom(pool, true).unwrap();
    let other = a.create_pool().unwrap();
    assert!(a.malloc_in(20 * MIB, S0, other).is_err());
    // Released to use count 0: passed over (torch clears use_on_oom before it releases); the
    // retry chain then gives the freeable pool's segment back and the last attempt fits.
    a.release_pool(pool).unwrap();
    let retries = stat(&a, "num_alloc_retries");
    let z = a.malloc(20 * MIB, S0).unwrap();
    assert_ne!(z, y);
    assert_eq!(stat(&a, "num_alloc_retries"), retries + 1);
    assert_eq!(a.private_pools(), [other]);
    assert_eq!(
        a.set_use_on_oom(PoolId(0, 99), true),
        Err(PoolError::Unknown(PoolId(0, 99)))
    );
    assert_eq!(
        a.set_use_on_oom(PoolId::DEFAULT, true),
        Err(PoolError::Default)
    );
    check_consistency(&a);
}

/// The fallback searches the `use_on_oom` pools in creation order, also after a forgotten
/// pool's slot went to a newer pool (it walked the slots: a parity review's smallest trace).
#[test]
fn the_fallback_searches_pools_in_creation_order_after_a_slot_is_reused() {
    let mut a = npu(4 * MIB, &AllocConf::default());
    let p0 = a.create_pool().unwrap();
    let p1 = a.create_pool().unwrap();
    a.set_use_on_oom(p1, true).unwrap();
    // p0 has no segment: released, it is forgotten and p2 takes its slot.
    a.release_pool(p0).unwrap();
    a.empty_pool_cache(p0).unwrap();
    assert_eq!(a.private_pools(), [p1]);
    let p2 = a.create_pool().unwrap();
    a.set_use_on_oom(p2, true).unwrap();
    a.set_no_split(p2).unwrap();
    let x = a.malloc_in(1007, S0, p1).unwrap();
    let y = a.malloc_in(100, S0, p2).unwrap();
    a.free(y).unwrap();
    // Both pools' 2 MiB segments fill the device: the default request falls back, to p1 first.
    let z = a.malloc(500_000, S0).unwrap();
    assert_eq!(z, x + 1536);
    // x's 1,536 bytes and z's 500,224 (p1 splits); p2 would have handed out its 2 MiB whole.
    assert_eq!(stat(&a, "allocated_bytes.all.current"), 501_760);
    assert_eq!(stat(&a, "inactive_split_bytes.all.current"), 1_595_392);
    check_consistency(&a);
}

/// torch_npu's `no_split`: the pool's blocks are handed out whole, a new segment included.
#[test]
fn a_no_split_pool_hands_out_whole_blocks() {
    let mut a = npu(GIB, &AllocConf::default());
    let pool = a.create_pool().unwrap();
    a.set_no_split(pool).unwrap();
    let x = a.malloc_in(1000, S0, pool).unwrap();
    // The whole 2 MiB small segment is the allocation.
    assert_eq!(stat(&a, "allocated_bytes.all.current"), (2 * MIB) as i64);
    assert_eq!(stat(&a, "requested_bytes.all.current"), 1000);
    let y = a.malloc_in(1000, S0, pool).unwrap();
    assert_eq!(y, x + 2 * MIB);
    assert_eq!(stat(&a, "num_device_alloc"), 2);
    a.free(x).unwrap();
    assert_eq!(a.malloc_in(5000, S0, pool), Ok(x));
    assert_eq!(stat(&a, "inactive_split.all.current"), 0);
    // The default pools split as ever.
    let d = a.malloc(1000, S0).unwrap();
    assert_eq!(a.malloc(1000, S0), Ok(d + 1536));
    assert_eq!(a.set_no_split(PoolId::DEFAULT), Err(PoolError::Default));
    check_consistency(&a);
}
