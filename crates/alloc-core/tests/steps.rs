//! `begin_malloc` / `resume_malloc`: the miss path stopped at each device malloc, as a runtime
//! drives it with `release_lock_on_npumalloc:True` (torch's `malloc` and `alloc_block`; torch_npu's
//! 2.4). Numbers are those of the plain `malloc` tests in `policy.rs`.

mod common;

use alloc_core::{
    AllocConf, AllocError, Allocator, Device, DeviceError, FreeError, HostQueue, MallocStep,
};
use alloc_sim::{FaultError, SimError, SimStream, TestDevice};
use common::*;

type Error = FaultError<SimError>;

/// The segment request of `step`, panicking if the malloc finished instead.
fn segment_request(
    step: MallocStep<Error, SimStream>,
) -> (u64, alloc_core::PendingMalloc<SimStream>) {
    match step {
        MallocStep::NeedSegment { bytes, pending } => (bytes, pending),
        MallocStep::Done(r) => panic!("expected a segment request, got {r:?}"),
        MallocStep::NeedSync { .. } => panic!("expected a segment request, got a sync"),
    }
}

/// The sync request of `step`, panicking otherwise.
fn sync_request(step: MallocStep<Error, SimStream>) -> alloc_core::PendingMalloc<SimStream> {
    match step {
        MallocStep::NeedSync { pending } => pending,
        MallocStep::NeedSegment { bytes, .. } => panic!("expected a sync, got {bytes} bytes"),
        MallocStep::Done(r) => panic!("expected a sync, got {r:?}"),
    }
}

fn done(step: MallocStep<Error, SimStream>) -> Result<u64, AllocError<Error>> {
    match step {
        MallocStep::Done(r) => r,
        MallocStep::NeedSegment { bytes, .. } => panic!("unexpected request of {bytes} bytes"),
        MallocStep::NeedSync { .. } => panic!("unexpected sync"),
    }
}

#[test]
fn a_hit_finishes_at_once_and_a_miss_asks_for_its_segment() {
    let mut a = cuda(GIB, &AllocConf::default());
    assert_eq!(done(a.begin_malloc(0, S0)), Ok(0));
    assert!(matches!(
        done(a.begin_malloc(1 << 62, S0)),
        Err(AllocError::TooLarge { .. })
    ));
    // 12 MiB: large pool, its own 12 MiB segment; nothing is counted before the device answers.
    let (bytes, pending) = segment_request(a.begin_malloc(12 * MIB, S0));
    assert_eq!(bytes, 12 * MIB);
    assert_eq!(stat(&a, "num_device_alloc"), 0);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    let segment = a.device_mut().malloc(bytes);
    let x = done(a.resume_malloc(pending, segment)).unwrap();
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    assert_eq!(stat(&a, "segment.large_pool.current"), 1);
    assert_eq!(stat(&a, "allocated_bytes.all.current"), (12 * MIB) as i64);
    a.free(x).unwrap();
    // Now a hit: no device call.
    assert_eq!(done(a.begin_malloc(12 * MIB, S0)), Ok(x));
    assert_eq!(a.device().malloc_calls(), 1);
    check_consistency(&a);
}

#[test]
fn the_cache_may_change_between_the_steps() {
    // What another thread can do while the lock is released around the device malloc.
    let mut a = cuda(GIB, &AllocConf::default());
    let (bytes, pending) = segment_request(a.begin_malloc(12 * MIB, S0));
    let small = a.malloc(1000, S0).unwrap();
    let big = a.malloc(30 * MIB, S0).unwrap();
    a.free(big).unwrap();
    a.empty_cache().unwrap();
    let segment = a.device_mut().malloc(bytes);
    let x = done(a.resume_malloc(pending, segment)).unwrap();
    assert_eq!(
        stat(&a, "segment.all.current"),
        2,
        "the small one and the new 12 MiB"
    );
    assert_eq!(stat(&a, "num_device_alloc"), 3);
    assert_eq!(
        stat(&a, "allocated_bytes.all.current"),
        (12 * MIB + 1024) as i64
    );
    a.free(x).unwrap();
    a.free(small).unwrap();
    check_consistency(&a);
}

#[test]
fn out_of_memory_answers_walk_the_retry_chain() {
    // A cached 20 MiB segment, then a 30 MiB request the device refuses twice.
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(5 * MIB, S0).unwrap();
    a.free(x).unwrap();
    let (bytes, pending) = segment_request(a.begin_malloc(30 * MIB, S0));
    assert_eq!(bytes, 30 * MIB);
    // First refusal: no max_split_size, so nothing is "available"; every cached segment goes
    // back to the device after one synchronization, and the retry asks again.
    let (again, pending) = segment_request(a.resume_malloc(pending, Err(DeviceError::OutOfMemory)));
    assert_eq!(again, 30 * MIB);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_sync_all_streams"), 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(a.device().frees(), 1);
    // Second refusal: out of memory with torch_npu's numbers.
    match done(a.resume_malloc(pending, Err(DeviceError::OutOfMemory))) {
        Err(AllocError::OutOfMemory(oom)) => {
            assert_eq!((oom.requested, oom.alloc_size), (30 * MIB, 30 * MIB));
            assert_eq!(oom.reserved, 0);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(stat(&a, "num_ooms"), 1);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    check_consistency(&a);
}

#[test]
fn a_device_error_ends_the_malloc_and_the_fraction_refuses_without_asking() {
    let mut a = cuda(GIB, &AllocConf::default());
    let (_, pending) = segment_request(a.begin_malloc(4096, S0));
    let error = FaultError::Device(SimError::ZeroSize);
    assert_eq!(
        done(a.resume_malloc(pending, Err(DeviceError::Other(error.clone())))),
        Err(AllocError::Device(error))
    );
    assert_eq!(stat(&a, "num_ooms"), 0);
    assert_eq!(stat(&a, "num_alloc_retries"), 0);
    // A 1 GiB device limited to a quarter: a 300 MiB segment is refused at both requests of the
    // chain without a device call, then out of memory.
    let mut a: Allocator<TestDevice> = cuda(GIB, &AllocConf::default());
    a.set_memory_fraction(0.25).unwrap();
    assert!(matches!(
        done(a.begin_malloc(300 * MIB, S0)),
        Err(AllocError::OutOfMemory(_))
    ));
    assert_eq!(a.device().malloc_calls(), 0);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_ooms"), 1);
    check_consistency(&a);
}

#[test]
fn a_segment_that_would_take_the_reserve_past_i64_max_goes_back() {
    // Two mallocs wait for the device at once (the lock released); together they pass the
    // largest reserve an i64 statistic can count. The second segment goes back to the device
    // and its malloc runs out of memory; every stat stays exact.
    let size = (1 << 60) - (1 << 50);
    let mut a = cuda(u64::MAX, &AllocConf::default());
    for _ in 0..7 {
        a.malloc(size, S0).unwrap();
    }
    let (bytes, first) = segment_request(a.begin_malloc(size, S0));
    let (_, second) = segment_request(a.begin_malloc(size, S0));
    let (s1, s2) = (a.device_mut().malloc(bytes), a.device_mut().malloc(bytes));
    done(a.resume_malloc(first, s1)).unwrap();
    assert!(matches!(
        done(a.resume_malloc(second, s2)),
        Err(AllocError::OutOfMemory(_))
    ));
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 8 * size as i64);
    assert_eq!(stat(&a, "reserved_bytes.all.peak"), 8 * size as i64);
    assert_eq!(a.device().outstanding_bytes(), 8 * size);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_ooms"), 1);
    check_consistency(&a);
}

#[test]
fn with_a_host_queue_the_chain_stops_for_a_sync_before_each_release() {
    // The chain of `out_of_memory_answers_walk_the_retry_chain`, with torch_npu's task queue:
    // the same numbers, and a stop before the release where the caller drains its queue.
    let mut a = cuda(GIB, &AllocConf::default());
    a.set_host_queue(HostQueue::SyncFirst);
    let x = a.malloc(5 * MIB, S0).unwrap();
    a.free(x).unwrap();
    let (_, pending) = segment_request(a.begin_malloc(30 * MIB, S0));
    let pending = sync_request(a.resume_malloc(pending, Err(DeviceError::OutOfMemory)));
    // Nothing released yet.
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (20 * MIB) as i64);
    assert_eq!(a.device().frees(), 0);
    let (again, pending) = segment_request(a.resume_after_sync(pending, true));
    assert_eq!(again, 30 * MIB);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_sync_all_streams"), 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(a.device().frees(), 1);
    assert!(matches!(
        done(a.resume_malloc(pending, Err(DeviceError::OutOfMemory))),
        Err(AllocError::OutOfMemory(_))
    ));
    assert_eq!(stat(&a, "num_ooms"), 1);
    check_consistency(&a);
}

#[test]
fn a_sync_that_failed_or_no_release_allowed_keeps_the_cache_and_runs_out_of_memory() {
    for mode in [HostQueue::SyncFirst, HostQueue::NoRelease] {
        let mut a = cuda(GIB, &AllocConf::default());
        a.set_host_queue(mode);
        let x = a.malloc(5 * MIB, S0).unwrap();
        a.free(x).unwrap();
        let (_, pending) = segment_request(a.begin_malloc(30 * MIB, S0));
        let step = a.resume_malloc(pending, Err(DeviceError::OutOfMemory));
        let step = match mode {
            HostQueue::SyncFirst => a.resume_after_sync(sync_request(step), false),
            _ => step,
        };
        assert!(
            matches!(done(step), Err(AllocError::OutOfMemory(_))),
            "{mode:?}"
        );
        assert_eq!(stat(&a, "reserved_bytes.all.current"), (20 * MIB) as i64);
        assert_eq!(stat(&a, "num_alloc_retries"), 0);
        assert_eq!(stat(&a, "num_ooms"), 1);
        assert_eq!(a.device().frees(), 0);
        // The plain malloc cannot stop for a sync: it releases nothing either.
        let plain = a.malloc(2 * GIB, S0);
        assert!(matches!(plain, Err(AllocError::OutOfMemory(_))), "{mode:?}");
        assert_eq!(a.device().frees(), 0);
        check_consistency(&a);
    }
}

#[test]
fn with_a_host_queue_gc_waits_for_a_sync_and_without_one_does_not_run() {
    // GC against a 100 MiB device at threshold 0.5: the 60 MiB cached segment is above the
    // limit, and a 64 MiB request does not fit beside it.
    let mut a = cuda(100 * MIB, &conf("garbage_collection_threshold:0.5"));
    a.set_host_queue(HostQueue::SyncFirst);
    let x = a.malloc(60 * MIB, S0).unwrap();
    a.free(x).unwrap();
    let pending = sync_request(a.begin_malloc(64 * MIB, S0));
    assert_eq!(a.device().frees(), 0, "nothing released before the sync");
    let (bytes, pending) = segment_request(a.resume_after_sync(pending, true));
    assert_eq!(a.device().frees(), 1, "GC gave the cached segment back");
    assert_eq!(bytes, 64 * MIB);
    let segment = a.device_mut().malloc(bytes);
    done(a.resume_malloc(pending, segment)).unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (64 * MIB) as i64);
    check_consistency(&a);

    // Without a way to sync, GC does not run and the request runs out of memory.
    let mut a = cuda(100 * MIB, &conf("garbage_collection_threshold:0.5"));
    a.set_host_queue(HostQueue::NoRelease);
    let x = a.malloc(60 * MIB, S0).unwrap();
    a.free(x).unwrap();
    assert!(matches!(
        a.malloc(64 * MIB, S0),
        Err(AllocError::OutOfMemory(_))
    ));
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (60 * MIB) as i64);
    assert_eq!(a.device().frees(), 0);
    check_consistency(&a);
}

#[test]
fn with_a_host_queue_gc_asks_for_no_sync_when_it_has_nothing_to_free() {
    // torch_npu's sizes: 20 MiB + the 32-byte pad rounds to 20 MiB + 512 in a 22 MiB segment,
    // whose remainder is split off and cached. Reserved (66 MiB) is above GC's limit (50 MiB),
    // but no segment is whole and free, so torch_npu's garbage_collect_cached_blocks returns
    // before it synchronizes, and the miss goes straight to the device.
    let mut a = npu(200 * MIB, &conf("garbage_collection_threshold:0.25"));
    a.set_host_queue(HostQueue::SyncFirst);
    let live: Vec<u64> = (0..3).map(|_| a.malloc(20 * MIB, S0).unwrap()).collect();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (66 * MIB) as i64);
    let (bytes, pending) = segment_request(a.begin_malloc(12 * MIB, S0));
    assert_eq!(bytes, 14 * MIB);
    let segment = a.device_mut().malloc(bytes);
    let y = done(a.resume_malloc(pending, segment)).unwrap();
    assert_eq!(a.device().synchronize_calls(), 0);
    // Freed, y's segment is whole: the next miss asks for the sync first, and GC frees it.
    a.free(y).unwrap();
    let pending = sync_request(a.begin_malloc(30 * MIB, S0));
    let (bytes, pending) = segment_request(a.resume_after_sync(pending, true));
    assert_eq!((bytes, a.device().frees()), (32 * MIB, 1));
    let segment = a.device_mut().malloc(bytes);
    let z = done(a.resume_malloc(pending, segment)).unwrap();
    for p in live.into_iter().chain([z]) {
        a.free(p).unwrap();
    }
    check_consistency(&a);
}

/// With a host queue, the free of a block used on another stream stops before it records
/// events (work still queued on the host would reach that stream after them): nothing changes
/// until the caller has drained the queue and called `free_after_drain`. Other frees go on.
#[test]
fn with_a_host_queue_a_free_with_stream_uses_waits_for_a_drain() {
    let mut a = cuda(GIB, &AllocConf::default());
    a.set_host_queue(HostQueue::SyncFirst);
    let x = a.malloc(4096, S0).unwrap();
    let y = a.malloc(4096, S0).unwrap();
    a.record_stream(x, S1).unwrap();
    assert_eq!(a.free(x), Err(FreeError::DrainFirst { addr: x }));
    assert_eq!(a.device().events_recorded(), 0);
    assert_eq!(stat(&a, "allocated_bytes.all.current"), 2 * 4096);
    a.free(y).unwrap();
    a.free_after_drain(x).unwrap();
    assert_eq!(a.device().events_recorded(), 1);
    assert_eq!(stat(&a, "allocated_bytes.all.current"), 0);
    assert_eq!(stat(&a, "active_bytes.all.current"), 4096);
    // The drain counts for that free only.
    let z = a.malloc(4096, S0).unwrap();
    a.record_stream(z, S1).unwrap();
    assert_eq!(a.free(z), Err(FreeError::DrainFirst { addr: z }));
    // Without a host queue, events are recorded at once.
    a.set_host_queue(HostQueue::None);
    a.free(z).unwrap();
    assert_eq!(a.device().events_recorded(), 2);
    check_consistency(&a);
}

/// With a host queue the lock is dropped while the caller drains it; another thread may pause
/// the region's tag meanwhile. The malloc then refuses as it would have at its start, and no
/// segment appears in the paused tag.
#[test]
fn a_tag_paused_while_the_malloc_waited_for_a_sync_refuses_it() {
    let mut a = cuda(GIB, &AllocConf::default());
    a.set_host_queue(HostQueue::SyncFirst);
    let pool = a.saver_pool("w", false).unwrap();
    a.retain_pool(pool).unwrap();
    let x = a.malloc_in(20 * MIB, S0, pool).unwrap();
    // 2 GiB cannot be had on the 1 GiB device: the chain stops for a sync before it releases.
    let pending = sync_request(a.begin_malloc_in(2 * GIB, S0, pool));
    assert_eq!(a.pause(Some("w")), Ok(20 * MIB));
    let err = done(a.resume_after_sync(pending, true)).unwrap_err();
    assert!(
        matches!(err, AllocError::Paused { ref tag } if tag == "w"),
        "{err:?}"
    );
    assert_eq!(a.saver_segments().len(), 1);
    assert_eq!(stat(&a, "num_alloc_retries"), 0);
    check_consistency(&a);
    a.resume(Some("w")).unwrap();
    a.free(x).unwrap();
    check_consistency(&a);
}
