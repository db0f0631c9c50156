//! Device failures, one at a time, on the simulated device: each surfaces as a typed error or a
//! documented fallback, the allocator stays consistent, and nothing leaks. (`cargo xtask stress`
//! injects the same faults at random; these are the cases spelled out.)

mod common;

use alloc_core::{AllocConf, AllocError, BlockState, FreeError, GcStatus};
use alloc_sim::{DeviceCall, Fault, FaultError, SimError, TestDevice};
use common::*;

fn injected(call: DeviceCall, code: i32) -> FaultError<SimError> {
    FaultError::Injected { call, code }
}

/// Everything freed and `empty_cache`: nothing may be left on the device.
fn assert_drains(a: &mut alloc_core::Allocator<TestDevice>, live: &[u64]) {
    a.device_mut().clear_all_faults();
    for &x in live {
        a.free(x).unwrap();
    }
    a.empty_cache().unwrap();
    check_consistency(a);
    assert_eq!(a.device().outstanding_bytes(), 0);
    assert_eq!(a.device().outstanding_events(), 0);
    assert_eq!(a.pending_events(), 0);
}

#[test]
fn a_malloc_error_other_than_oom_is_returned_and_changes_no_stat() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(4096, S0).unwrap();
    a.device_mut()
        .fail_nth(DeviceCall::Malloc, 1, Fault::Error(7));
    let before = a.stats();
    assert_eq!(
        a.malloc(30 * MIB, S0),
        Err(AllocError::Device(injected(DeviceCall::Malloc, 7)))
    );
    assert_eq!(a.stats(), before, "no retry, no OOM, no stat");
    assert_eq!(
        a.device().calls(DeviceCall::Malloc),
        2,
        "no retry after a non-OOM error"
    );
    check_consistency(&a);
    let y = a.malloc(30 * MIB, S0).unwrap();
    assert_drains(&mut a, &[x, y]);
}

#[test]
fn an_injected_oom_runs_the_retry_chain() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(2 * MIB, S0).unwrap();
    a.free(x).unwrap(); // a whole free 20 MiB segment stays cached
    a.device_mut()
        .fail_nth(DeviceCall::Malloc, 1, Fault::OutOfMemory);
    let y = a.malloc(30 * MIB, S0).unwrap();
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_sync_all_streams"), 1);
    assert_eq!(
        stat(&a, "num_device_free"),
        1,
        "the cached segment went back"
    );
    assert_eq!(stat(&a, "num_ooms"), 0);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (30 * MIB) as i64);
    assert_drains(&mut a, &[y]);
}

#[test]
fn a_free_error_in_empty_cache_keeps_the_segment_until_the_next_one() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(12 * MIB, S0).unwrap();
    let y = a.malloc(30 * MIB, S0).unwrap();
    a.free(x).unwrap();
    a.free(y).unwrap();
    a.device_mut()
        .fail_nth(DeviceCall::Free, 2, Fault::Error(3));
    assert_eq!(a.empty_cache(), Err(injected(DeviceCall::Free, 3)));
    // The first segment went back; the one whose free failed is still cached, and counted.
    assert_eq!(stat(&a, "num_device_free"), 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (30 * MIB) as i64);
    assert_eq!(a.device().outstanding_segments(), 1);
    check_consistency(&a);
    a.empty_cache().unwrap();
    assert_eq!(stat(&a, "num_device_free"), 2);
    assert_drains(&mut a, &[]);
}

#[test]
fn a_failed_event_record_falls_back_to_synchronizing() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(4096, S0).unwrap();
    a.record_stream(x, S1).unwrap();
    a.device_mut()
        .fail_nth(DeviceCall::RecordEvent, 1, Fault::Error(5));
    a.free(x).unwrap();
    // The device was synchronized instead, so the block is free at once.
    assert_eq!(a.device().synchronize_calls(), 1);
    assert_eq!(a.pending_events(), 0);
    assert_eq!(stat(&a, "active.all.current"), 0);
    assert_eq!(a.device().outstanding_events(), 0);
    check_consistency(&a);
    assert_eq!(a.malloc(4096, S0), Ok(x), "reused without waiting");
    assert_drains(&mut a, &[x]);
}

#[test]
fn a_failed_record_and_synchronize_fail_the_free_and_keep_the_allocation() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(4096, S0).unwrap();
    a.record_stream(x, S1).unwrap();
    a.record_stream(x, S2).unwrap();
    // The second stream's record fails after the first one's succeeded; so does the fallback.
    a.device_mut()
        .fail_nth(DeviceCall::RecordEvent, 2, Fault::Error(5));
    a.device_mut()
        .fail_nth(DeviceCall::Synchronize, 1, Fault::Error(6));
    let before = a.stats();
    assert_eq!(
        a.free(x),
        Err(FreeError::Device(injected(DeviceCall::RecordEvent, 5)))
    );
    assert_eq!(a.stats(), before);
    assert_eq!(
        a.device().outstanding_events(),
        0,
        "the first event was given back"
    );
    assert_eq!(a.snapshot()[0].blocks[0].state, BlockState::ActiveAllocated);
    check_consistency(&a);
    // Still the caller's, with both stream uses: the next free waits for two events.
    a.free(x).unwrap();
    assert_eq!(a.pending_events(), 2);
    assert_drains(&mut a, &[]);
}

#[test]
fn an_event_query_error_fails_malloc_and_keeps_the_block_pending() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(4096, S0).unwrap();
    a.record_stream(x, S1).unwrap();
    a.free(x).unwrap();
    a.device_mut().complete_stream(S1);
    a.device_mut()
        .fail_nth(DeviceCall::EventDone, 1, Fault::Error(8));
    let before = a.stats();
    assert_eq!(
        a.malloc(4096, S0),
        Err(AllocError::Device(injected(DeviceCall::EventDone, 8)))
    );
    assert_eq!(a.stats(), before);
    assert_eq!(a.pending_events(), 1);
    check_consistency(&a);
    assert_eq!(
        a.malloc(4096, S0),
        Ok(x),
        "the next poll frees and reuses it"
    );
    assert_drains(&mut a, &[x]);
}

#[test]
fn a_synchronize_error_fails_empty_cache_and_releases_nothing() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(12 * MIB, S0).unwrap();
    a.record_stream(x, S1).unwrap();
    a.free(x).unwrap();
    a.device_mut()
        .fail_nth(DeviceCall::Synchronize, 1, Fault::Error(9));
    assert_eq!(a.empty_cache(), Err(injected(DeviceCall::Synchronize, 9)));
    // torch_npu's npuSynchronizeDevice throws before synchronize_and_free_events counts.
    assert_eq!(stat(&a, "num_sync_all_streams"), 0);
    assert_eq!(a.pending_events(), 1);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (12 * MIB) as i64);
    check_consistency(&a);
    assert_drains(&mut a, &[]);
}

#[test]
fn a_synchronize_error_in_the_oversize_release_fails_the_malloc() {
    // torch_npu's npuSynchronizeDevice(true) in release_available_cached_blocks throws: the
    // malloc ends with the device's error before anything is released or retried.
    let mut a = npu(100 * MIB, &conf("max_split_size_mb:40"));
    let x = a.malloc(50 * MIB, S0).unwrap();
    let y = a.malloc(30 * MIB, S0).unwrap();
    a.free(x).unwrap();
    a.device_mut()
        .fail_nth(DeviceCall::Synchronize, 1, Fault::Error(9));
    assert_eq!(
        a.malloc(60 * MIB, S0),
        Err(AllocError::Device(injected(DeviceCall::Synchronize, 9)))
    );
    assert_eq!(stat(&a, "num_device_free"), 0);
    assert_eq!(stat(&a, "num_alloc_retries"), 0);
    assert_eq!(stat(&a, "num_ooms"), 0);
    // 52 and 32 MiB segments (the 32-byte pad rounds each up to the next 2 MiB).
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (84 * MIB) as i64);
    check_consistency(&a);
    assert_drains(&mut a, &[y]);
}

#[test]
fn a_failed_mem_info_leaves_the_free_memory_unknown_in_the_oom() {
    let mut a = cuda(100 * MIB, &AllocConf::default());
    a.device_mut()
        .fail_nth(DeviceCall::MemInfo, 1, Fault::Error(1));
    let err = a.malloc(200 * MIB, S0).unwrap_err();
    let AllocError::OutOfMemory(oom) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(oom.free, None);
    assert_eq!(oom.total, Some(100 * MIB), "known since construction");
    assert!(err.to_string().contains("; unknown free; "), "{err}");
    assert_eq!(stat(&a, "num_ooms"), 1);
    assert_drains(&mut a, &[]);
}

#[test]
fn torch_npu_runs_the_rest_of_the_chain_after_a_device_error() {
    // torch_npu's alloc_block returns false for any error: the chain goes on through
    // release_cached_blocks (a synchronization, num_sync_all_streams + 1) and the retry
    // (num_alloc_retries + 1); the last attempt's error decides.
    let mut a = npu(GIB, &AllocConf::default());
    a.device_mut()
        .fail_nth(DeviceCall::Malloc, 1, Fault::Error(7));
    let x = a.malloc(30 * MIB, S0).unwrap();
    assert_eq!(a.device().calls(DeviceCall::Malloc), 2);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_sync_all_streams"), 1);
    assert_eq!(stat(&a, "num_ooms"), 0);
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    // Both attempts fail: the second one's error is returned, and nothing counts as OOM.
    a.device_mut()
        .fail_nth(DeviceCall::Malloc, 1, Fault::OutOfMemory);
    a.device_mut()
        .fail_nth(DeviceCall::Malloc, 2, Fault::Error(9));
    assert_eq!(
        a.malloc(30 * MIB, S0),
        Err(AllocError::Device(injected(DeviceCall::Malloc, 9)))
    );
    assert_eq!(stat(&a, "num_alloc_retries"), 2);
    assert_eq!(stat(&a, "num_sync_all_streams"), 2);
    assert_eq!(stat(&a, "num_ooms"), 0);
    // The other way round it is out of memory.
    a.device_mut()
        .fail_nth(DeviceCall::Malloc, 1, Fault::Error(9));
    a.device_mut()
        .fail_nth(DeviceCall::Malloc, 2, Fault::OutOfMemory);
    assert!(matches!(
        a.malloc(30 * MIB, S0),
        Err(AllocError::OutOfMemory(_))
    ));
    assert_eq!(stat(&a, "num_ooms"), 1);
    assert_eq!(stat(&a, "num_alloc_retries"), 3);
    check_consistency(&a);
    assert_drains(&mut a, &[x]);
}

#[test]
fn a_failed_mem_info_at_construction_is_asked_again() {
    // One transient aclrtGetMemInfo failure while the allocator is built must not disable the
    // fraction and GC for the life of the process: the total is asked again when needed.
    let device = TestDevice::new(alloc_sim::SimDevice::new(100 * MIB)).with_fault(
        DeviceCall::MemInfo,
        1,
        Fault::Error(507_899),
    );
    let conf = conf("garbage_collection_threshold:0.5,per_process_memory_fraction:0.8");
    let mut a = alloc_core::Allocator::new(device, &conf, alloc_core::DeviceFacts::cuda_parity(0));
    assert_eq!(a.gc_status(), GcStatus::Unavailable);
    assert_eq!(a.allowed_memory(), None);
    // The first cache miss asks again: the configured fraction and GC apply from then on.
    let x = a.malloc(4096, S0).unwrap();
    assert_eq!(a.allowed_memory(), Some(80 * MIB));
    assert_eq!(a.gc_status(), GcStatus::On { limit: 40 * MIB });
    // set_per_process_memory_fraction asks too, and works once the device answers.
    let mut b = alloc_core::Allocator::new(
        TestDevice::new(alloc_sim::SimDevice::new(100 * MIB)).with_fault(
            DeviceCall::MemInfo,
            1,
            Fault::Error(1),
        ),
        &AllocConf::default(),
        alloc_core::DeviceFacts::cuda_parity(0),
    );
    b.device_mut()
        .fail_nth(DeviceCall::MemInfo, 1, Fault::Error(1));
    assert_eq!(
        b.set_memory_fraction(0.5),
        Err(alloc_core::FractionError::TotalUnknown)
    );
    assert_eq!(b.set_memory_fraction(0.5), Ok(()));
    assert_eq!(b.allowed_memory(), Some(50 * MIB));
    assert_drains(&mut a, &[x]);
}
