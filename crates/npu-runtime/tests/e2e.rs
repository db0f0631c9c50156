//! End-to-end: the runtime over the fake `libascendcl` loaded through `acl-sys`'s real loading
//! path, with exact call counts and stats.
#![cfg(not(loom))]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::sync::{Arc, Mutex, Weak};

use npu_runtime::{
    AclError, AclPlatform, Config, FreeError, GcStatus, HostQueue, NpuAllocator, RuntimeError,
    Stream, SyncHook,
};
use testkit::fake_acl::{FakeAcl, Variant};

const MIB: u64 = 1 << 20;

fn runtime(fake: &FakeAcl, config: Config) -> NpuAllocator {
    platform_and_runtime(fake, config).1
}

/// The fake loaded through acl-sys, and a runtime over it.
fn platform_and_runtime(fake: &FakeAcl, config: Config) -> (AclPlatform, NpuAllocator) {
    // SAFETY: the fake libascendcl built from this workspace.
    let platform =
        unsafe { AclPlatform::load(fake.path()) }.expect("load the fake through acl-sys");
    (platform.clone(), platform.runtime(config))
}

/// A runtime over `fake` (device 0 bound), a second stream on it, and a 1,000-byte allocation
/// recorded on that stream: what a test of a free that waits on an event starts from.
fn allocation_used_on_a_side_stream(fake: &FakeAcl) -> (AclPlatform, NpuAllocator, Stream, u64) {
    let (platform, rt) = platform_and_runtime(fake, Config::default());
    let lib = platform.lib();
    lib.set_device(0).unwrap();
    let side = Stream::from(lib.create_stream().unwrap());
    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    rt.record_stream(a, side).unwrap();
    (platform, rt, side, a)
}

fn stat(rt: &NpuAllocator, key: &str) -> i64 {
    rt.memory_stats(0)
        .unwrap()
        .into_iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no stat {key}"))
        .1
}

#[test]
fn cache_hit_calls_no_device_malloc() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    let rt = runtime(&fake, Config::default());
    assert_eq!(fake.calls("aclInit"), 1);
    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(a, 0x1000_0000_0000);
    assert_eq!(fake.calls("aclrtMallocAlign32"), 1);
    assert_eq!(fake.calls("aclrtMalloc"), 0);
    // One 2 MiB small-pool segment, Align32 adds nothing; 1000 + 32 rounds to 1536.
    assert_eq!(fake.used(0), 2 * MIB);
    assert_eq!(rt.memory_allocated(0).unwrap(), 1536);
    assert_eq!(rt.memory_reserved(0).unwrap(), 2 * MIB);
    rt.free(a).unwrap();
    fake.clear_log();
    let b = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(b, a);
    assert!(
        fake.log().is_empty(),
        "a cache hit calls nothing: {:?}",
        fake.log()
    );
    assert_eq!(fake.calls("aclrtMallocAlign32"), 1);
    assert_eq!(fake.calls("aclrtSetDevice"), 1);
    assert_eq!(stat(&rt, "num_device_alloc"), 1);
    assert_eq!(stat(&rt, "allocation.all.allocated"), 2);
    assert_eq!(stat(&rt, "allocated_bytes.all.peak"), 1536);
    assert_eq!(rt.memory_stats(0).unwrap().len(), 123);
    assert_eq!(stat(&rt, "num_oom_rejections"), 0);
    rt.free(b).unwrap();
    assert_eq!(rt.memory_allocated(0).unwrap(), 0);
    assert_eq!(rt.max_memory_allocated(0).unwrap(), 1536);
    rt.reset_peak_memory_stats(0).unwrap();
    assert_eq!(rt.max_memory_allocated(0).unwrap(), 0);
    assert_eq!(rt.max_memory_reserved(0).unwrap(), 2 * MIB);
    rt.reset_accumulated_memory_stats(0).unwrap();
    assert_eq!(stat(&rt, "num_device_alloc"), 0);
    assert_eq!(stat(&rt, "allocation.all.allocated"), 0);
}

/// 30 MiB then 40 MiB then 60 MiB on a 50 MiB device: the second needs the cached 32 MiB
/// segment freed (one retry), the third fails after the whole chain.
fn oom_retry_chain(release_lock: bool) {
    let fake = FakeAcl::new(Variant::Full, 50 * MIB, 1);
    let mut config = Config::default();
    config.alloc.release_lock_on_npumalloc = release_lock;
    let rt = Arc::new(runtime(&fake, config));
    let seen = Arc::new(Mutex::new(Vec::new()));
    {
        let seen = seen.clone();
        let weak: Weak<NpuAllocator> = Arc::downgrade(&rt);
        rt.attach_out_of_memory_observer(move |oom| {
            // Runs without the allocator's lock: allocating again must not deadlock.
            let rt = weak.upgrade().expect("runtime alive");
            let p = rt.malloc(512, 0, Stream::DEFAULT);
            seen.lock().unwrap().push((oom.alloc_size, p.is_ok()));
            if let Ok(p) = p {
                rt.free(p).unwrap();
            }
        });
    }

    let a = rt.malloc(30 * MIB, 0, Stream::DEFAULT).unwrap();
    assert_eq!(rt.memory_reserved(0).unwrap(), 32 * MIB);
    rt.free(a).unwrap();

    let b = rt.malloc(40 * MIB, 0, Stream::DEFAULT).unwrap();
    assert_eq!(fake.calls("aclrtMallocAlign32"), 3);
    assert_eq!(fake.calls("aclrtSynchronizeDevice"), 1);
    assert_eq!(fake.calls("aclrtFree"), 1);
    assert_eq!(stat(&rt, "num_alloc_retries"), 1);
    assert_eq!(stat(&rt, "num_ooms"), 0);
    assert_eq!(stat(&rt, "num_sync_all_streams"), 1);
    assert_eq!(stat(&rt, "num_device_alloc"), 2);
    assert_eq!(stat(&rt, "num_device_free"), 1);
    assert_eq!(rt.memory_reserved(0).unwrap(), 42 * MIB);

    fake.clear_log();
    let err = rt.malloc(60 * MIB, 0, Stream::DEFAULT).unwrap_err();
    assert_eq!(
        fake.log(),
        [
            "aclrtMallocAlign32",
            "aclrtSynchronizeDevice",
            "aclrtMallocAlign32",
            "aclrtGetMemInfo",
            // The observer's 512-byte malloc: a new 2 MiB small segment (fits in 8 MiB).
            "aclrtMallocAlign32",
        ]
    );
    assert!(err.is_out_of_memory());
    // The free memory is read before the observers, the stats after them, as torch_npu builds
    // its message: the observer's 2 MiB small segment is in the 44 MiB reserved.
    assert_eq!(
        err.to_string(),
        "NPU out of memory. Tried to allocate 62.00 MiB (NPU 0; 50.00 MiB total capacity; \
         40.00 MiB already allocated; 40.00 MiB current active; 8.00 MiB free; 44.00 MiB \
         reserved in total by PyTorch).If reserved memory is >> allocated memory try setting \
         max_split_size_mb to avoid fragmentation."
    );
    assert_eq!(stat(&rt, "num_ooms"), 1);
    assert_eq!(stat(&rt, "num_alloc_retries"), 2);
    assert_eq!(stat(&rt, "num_sync_all_streams"), 2);
    assert_eq!(*seen.lock().unwrap(), [(62 * MIB, true)]);
    rt.free(b).unwrap();
}

#[test]
fn oom_takes_torchs_retry_chain() {
    oom_retry_chain(false);
}

#[test]
fn oom_retry_chain_is_the_same_with_release_lock_on_npumalloc() {
    oom_retry_chain(true);
}

#[test]
fn empty_cache_synchronizes_then_frees_each_segment() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    let rt = runtime(&fake, Config::default());
    let ptrs: Vec<u64> = [1000, 12 * MIB, 30 * MIB]
        .iter()
        .map(|&n| rt.malloc(n, 0, Stream::DEFAULT).unwrap())
        .collect();
    for p in ptrs {
        rt.free(p).unwrap();
    }
    assert_eq!(fake.live_allocations(0), 3);
    assert_eq!(rt.memory_reserved(0).unwrap(), (2 + 14 + 32) * MIB);
    fake.clear_log();
    rt.empty_cache().unwrap();
    assert_eq!(
        fake.log(),
        [
            "aclrtSynchronizeDevice",
            "aclrtFree",
            "aclrtFree",
            "aclrtFree"
        ]
    );
    assert_eq!(fake.live_allocations(0), 0);
    assert_eq!(fake.used(0), 0);
    assert_eq!(rt.memory_reserved(0).unwrap(), 0);
    assert_eq!(stat(&rt, "num_device_free"), 3);
    assert_eq!(stat(&rt, "num_sync_all_streams"), 1);
}

/// A block used on a second stream is reused only after its event completes; the event comes
/// back to the pool. `query` is the symbol the runtime must poll with.
fn record_stream_waits_for_the_event(variant: Variant, query: &str, malloc: &str, create: &str) {
    let fake = FakeAcl::new(variant, 1 << 30, 1);
    let (platform, rt, side, a) = allocation_used_on_a_side_stream(&fake);
    rt.free(a).unwrap();
    assert_eq!(fake.calls(create), 1);
    assert_eq!(fake.calls("aclrtRecordEvent"), 1);
    assert_eq!(fake.pending_events(), 1);
    assert_eq!(stat(&rt, "active_bytes.all.current"), 1536);

    // Pending: the next block comes from the rest of the segment.
    let b = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(b, a + 1536);
    assert_eq!(fake.calls(query), 1);

    fake.complete_all_events();
    rt.free(b).unwrap();
    let c = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(c, a);
    assert_eq!(fake.calls(query), 2);
    assert_eq!(fake.calls(malloc), 1);

    // The completed event is reused, not created again.
    rt.record_stream(c, side).unwrap();
    rt.free(c).unwrap();
    assert_eq!(fake.calls(create), 1);
    assert_eq!(fake.calls("aclrtRecordEvent"), 2);
    assert_eq!(fake.live_events(), 1);
    drop((platform, rt));
    // Dropping the runtime empties the cache and destroys the pooled event.
    assert_eq!(fake.live_events(), 0);
    assert_eq!(fake.live_allocations(0), 0);
}

/// With a host queue (torch_npu's task queue), the free of a block used on another stream stops
/// (`DrainFirst`), and `free_after_drain` drains the queue, without the lock, before it records
/// its event: work still queued for that stream must reach it before the event does. The drain
/// hook serves, else the synchronize hook; a block used on its own stream alone records nothing
/// and calls no hook.
#[test]
fn with_a_host_queue_a_free_drains_before_it_records_events() {
    let fake = Arc::new(FakeAcl::new(Variant::Full, 1 << 30, 1));
    let (platform, rt) = platform_and_runtime(&fake, Config::default());
    let rt = Arc::new(rt);
    let lib = platform.lib();
    lib.set_device(0).unwrap();
    let side = Stream::from(lib.create_stream().unwrap());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let hook = |name: &'static str| -> SyncHook {
        let (fake, calls, rt) = (fake.clone(), calls.clone(), Arc::downgrade(&rt));
        Arc::new(move |device| {
            // Called without the device's lock: the runtime answers from inside the hook.
            let rt = rt.upgrade().unwrap();
            assert!(rt.memory_stats(device).is_ok());
            calls
                .lock()
                .unwrap()
                .push((name, fake.calls("aclrtRecordEvent")));
            true
        })
    };
    rt.set_host_queue(HostQueue::SyncFirst, Some(hook("synchronize")));
    rt.set_drain_hook(Some(hook("drain")));
    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    rt.record_stream(a, side).unwrap();
    // The free stops before it records the event, changing nothing; the next step drains.
    assert!(matches!(
        rt.free(a),
        Err(RuntimeError::Free(FreeError::DrainFirst { .. }))
    ));
    assert!(calls.lock().unwrap().is_empty());
    assert_eq!(stat(&rt, "allocated_bytes.all.current"), 1536);
    rt.free_after_drain(a).unwrap();
    // Drained once, before the one event was recorded.
    assert_eq!(*calls.lock().unwrap(), [("drain", 0)]);
    assert_eq!(fake.calls("aclrtRecordEvent"), 1);
    assert_eq!(stat(&rt, "active_bytes.all.current"), 1536);
    // A block used on its own stream only: no hook, no event.
    let b = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    rt.free(b).unwrap();
    assert_eq!(calls.lock().unwrap().len(), 1);
    // Without a drain hook the synchronize hook drains (and waits for the device).
    rt.set_drain_hook(None);
    let c = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    rt.record_stream(c, side).unwrap();
    rt.free_after_drain(c).unwrap();
    assert_eq!(calls.lock().unwrap()[1], ("synchronize", 1));
    assert_eq!(fake.calls("aclrtRecordEvent"), 2);
    // A free that fails is refused the same way after the drain: nothing changes.
    assert!(matches!(
        rt.free_after_drain(c),
        Err(RuntimeError::Free(FreeError::NotAllocated { .. }))
    ));
    fake.complete_all_events();
    rt.process_events(0).unwrap();
    assert_eq!(stat(&rt, "active_bytes.all.current"), 0);
}

#[test]
fn record_stream_polls_query_event_status() {
    // torch_npu's choice: the Ex event where the library has it.
    record_stream_waits_for_the_event(
        Variant::Full,
        "aclrtQueryEventStatus",
        "aclrtMallocAlign32",
        "aclrtCreateEventExWithFlag",
    );
}

/// A failed `aclrtRecordEvent`: the free waits for the whole device instead and the block is
/// reusable at once; the event is destroyed rather than pooled (it may be what is broken), so
/// the next free creates a new one.
#[test]
fn a_failed_event_record_synchronizes_and_destroys_the_event() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    let (platform, rt, side, a) = allocation_used_on_a_side_stream(&fake);
    fake.fail_next("aclrtRecordEvent", 507_899, 1);
    let syncs = fake.calls("aclrtSynchronizeDevice");
    rt.free(a).unwrap();
    assert_eq!(fake.calls("aclrtSynchronizeDevice"), syncs + 1);
    assert_eq!(fake.live_events(), 0, "the failed event is destroyed");
    assert_eq!(stat(&rt, "active_bytes.all.current"), 0);
    assert_eq!(rt.malloc(1000, 0, Stream::DEFAULT).unwrap(), a);
    rt.record_stream(a, side).unwrap();
    rt.free(a).unwrap();
    assert_eq!(fake.calls("aclrtCreateEventExWithFlag"), 2);
    assert_eq!(fake.pending_events(), 1);
    fake.complete_all_events();
    drop((platform, rt));
    assert_eq!(fake.live_events(), 0);
}

/// A runtime dropped while a free still waits on its event, with the device's synchronize
/// failing: the drop's `empty_cache` cannot complete the event, and the event is destroyed all
/// the same rather than dropped as a handle (an `aclrtEvent` leaked for the process's life).
#[test]
fn a_runtime_dropped_after_a_failed_synchronize_destroys_its_pending_events() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    let (platform, rt, _side, a) = allocation_used_on_a_side_stream(&fake);
    rt.free(a).unwrap();
    assert_eq!(fake.pending_events(), 1);
    assert_eq!(fake.live_events(), 1);
    fake.fail_next("aclrtSynchronizeDevice", 507_899, 1);
    let destroyed = fake.calls("aclrtDestroyEvent");
    drop((platform, rt));
    assert_eq!(fake.calls("aclrtDestroyEvent"), destroyed + 1);
    assert_eq!(fake.live_events(), 0);
}

#[test]
fn missing_optional_symbols_fall_back() {
    let fake = FakeAcl::new(Variant::Legacy, 1 << 30, 1);
    let (platform, rt) = platform_and_runtime(&fake, Config::default());
    assert!(!platform.lib().has_malloc_align32());
    assert!(!platform.uses_align32());
    assert!(!platform.lib().has_symbol("aclrtQueryEventStatus"));
    rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    // aclrtMalloc pads by 32 bytes itself.
    assert_eq!(fake.used(0), 2 * MIB + 32);
    drop((platform, rt));
    record_stream_waits_for_the_event(
        Variant::Legacy,
        "aclrtQueryEvent",
        "aclrtMalloc",
        "aclrtCreateEventWithFlag",
    );
}

#[test]
fn missing_library_is_a_typed_error_listing_the_path() {
    let path = "/nonexistent-npu-runtime/libascendcl.so";
    // SAFETY: the path does not exist: nothing is loaded.
    match unsafe { NpuAllocator::with_library(path, Config::default()) } {
        Err(AclError::NotFound { searched }) => {
            assert_eq!(searched.len(), 1);
            assert_eq!(searched[0].path, std::path::Path::new(path));
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[test]
fn non_oom_errors_carry_the_acl_code_and_leave_state_consistent() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    let rt = runtime(&fake, Config::default());
    // torch_npu's chain: one failed device malloc is retried after synchronizing and freeing
    // the cache (nothing cached yet), and the retry succeeds.
    rt.mem_get_info(0).unwrap(); // opens the device
    fake.fail_next("aclrtMallocAlign32", 507_899, 1);
    fake.clear_log();
    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(
        fake.log(),
        [
            "aclrtMallocAlign32",
            "aclrtSynchronizeDevice",
            "aclrtMallocAlign32"
        ]
    );
    assert_eq!(stat(&rt, "num_alloc_retries"), 1);
    assert_eq!(stat(&rt, "num_sync_all_streams"), 1);
    assert_eq!(stat(&rt, "num_device_alloc"), 1);
    rt.free(a).unwrap();
    rt.empty_cache().unwrap();
    rt.reset_accumulated_memory_stats(0).unwrap();
    // Both attempts fail: the last attempt's error is raised, not out-of-memory.
    fake.fail_next("aclrtMallocAlign32", 507_899, 2);
    let err = rt.malloc(1000, 0, Stream::DEFAULT).unwrap_err();
    assert_eq!(err.acl_code(), Some(507_899));
    assert!(!err.is_out_of_memory());
    assert_eq!(
        err.to_string(),
        "NPU error: aclrtMallocAlign32 failed with ACL error 507899 \
         (ACL_ERROR_RT_DRV_INTERNAL_ERROR): fake_acl: injected error 507899 in aclrtMallocAlign32"
    );
    assert_eq!(stat(&rt, "num_device_alloc"), 0);
    assert_eq!(stat(&rt, "num_ooms"), 0);
    assert_eq!(stat(&rt, "num_alloc_retries"), 1);
    assert_eq!(stat(&rt, "num_sync_all_streams"), 1);
    assert_eq!(rt.memory_reserved(0).unwrap(), 0);

    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    rt.free(a).unwrap();
    fake.fail_next("aclrtFree", 107_000, 1);
    let err = rt.empty_cache().unwrap_err();
    assert_eq!(err.acl_code(), Some(107_000));
    assert_eq!(rt.memory_reserved(0).unwrap(), 2 * MIB);
    assert_eq!(fake.live_allocations(0), 1);

    fake.fail_next("aclrtSynchronizeDevice", 507_000, 1);
    assert_eq!(rt.empty_cache().unwrap_err().acl_code(), Some(507_000));
    assert_eq!(rt.memory_reserved(0).unwrap(), 2 * MIB);

    rt.empty_cache().unwrap();
    assert_eq!(rt.memory_reserved(0).unwrap(), 0);
    assert_eq!(fake.live_allocations(0), 0);
    assert_eq!(stat(&rt, "num_device_free"), 1);
}

#[test]
fn bad_pointers_and_devices_are_errors() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 2);
    let rt = runtime(&fake, Config::default());
    assert_eq!(
        rt.free(0x1234).unwrap_err(),
        RuntimeError::Free(FreeError::ForeignPointer { addr: 0x1234 })
    );
    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    // Inside a segment but not an allocation's start: the more precise error.
    assert_eq!(
        rt.free(a + 512).unwrap_err(),
        RuntimeError::Free(FreeError::NotAllocated { addr: a + 512 })
    );
    // Beyond every segment of every device.
    assert_eq!(
        rt.free(a + 4 * MIB).unwrap_err(),
        RuntimeError::Free(FreeError::ForeignPointer { addr: a + 4 * MIB })
    );
    rt.free(a).unwrap();
    assert_eq!(
        rt.free(a).unwrap_err().to_string(),
        format!("invalid device pointer: {a:#x} is not a live allocation (double free?)")
    );
    assert_eq!(
        rt.memory_allocated(0).unwrap(),
        0,
        "the failed frees changed nothing"
    );
    assert_eq!(rt.memory_reserved(0).unwrap(), 2 * MIB);
    rt.free(0).unwrap();
    assert_eq!(rt.malloc(0, 0, Stream::DEFAULT).unwrap(), 0);
    assert_eq!(
        rt.malloc(1000, 2, Stream::DEFAULT).unwrap_err(),
        RuntimeError::InvalidDevice {
            device: 2,
            count: 2
        }
    );
    let err = rt.malloc(1 << 60, 0, Stream::DEFAULT).unwrap_err();
    assert_eq!(
        err.to_string(),
        "NPU out of memory. Tried to allocate more than 1EB memory."
    );
    assert!(matches!(
        rt.set_per_process_memory_fraction(1.5, 0),
        Err(RuntimeError::Fraction(_))
    ));
}

#[test]
fn devices_are_separate_and_set_once_per_thread() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 2);
    let rt = Arc::new(runtime(&fake, Config::default()));
    let a = rt.malloc(1000, 1, Stream::DEFAULT).unwrap();
    assert_eq!(a, 0x1100_0000_0000);
    assert_eq!(rt.memory_allocated(0).unwrap(), 0);
    assert_eq!(rt.memory_allocated(1).unwrap(), 1536);
    assert_eq!(fake.used(1), 2 * MIB);
    assert_eq!(fake.calls("aclrtSetDevice"), 1);
    let b = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(b, 0x1000_0000_0000);
    assert_eq!(fake.calls("aclrtSetDevice"), 2);
    rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(fake.calls("aclrtSetDevice"), 2);
    // A free is a cache operation: no ACL call, so no binding. Another thread binds each
    // device before its first ACL call (empty_cache synchronizes devices 0 and 1).
    let rt2 = rt.clone();
    std::thread::spawn(move || {
        rt2.free(a).unwrap();
        rt2.empty_cache().unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(fake.calls("aclrtSetDevice"), 4);
    assert_eq!(rt.memory_allocated(1).unwrap(), 0);
    rt.free(b).unwrap();
}

/// torch_npu changes its thread's device behind the runtime's back and never asks ACL again.
/// `keeping_current_device` binds what it needs without trusting the runtime's cache of the
/// binding, and makes the host's device current again afterwards (torch_npu's `emptyCache`).
#[test]
fn keeping_current_device_binds_afresh_and_puts_the_host_device_back() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 2);
    let (platform, rt) = platform_and_runtime(&fake, Config::default());
    let a = rt.malloc(30 * MIB, 1, Stream::DEFAULT).unwrap();
    // The host makes device 0 current; the runtime's cache still says device 1.
    platform.lib().set_device(0).unwrap();
    let sets = fake.calls("aclrtSetDevice");
    let (free, total) = npu_runtime::keeping_current_device(|| rt.mem_get_info(1)).unwrap();
    // Device 1's memory, asked with device 1 bound (its 32 MiB segment; device 0 has none).
    assert_eq!((free, total), ((1 << 30) - 32 * MIB, 1 << 30));
    assert_eq!(platform.lib().get_device().unwrap(), 0);
    assert_eq!(fake.calls("aclrtSetDevice"), sets + 2);
    // Nothing bound inside: nothing to put back.
    npu_runtime::keeping_current_device(|| rt.memory_stats(1)).unwrap();
    assert_eq!(fake.calls("aclrtSetDevice"), sets + 2);
    // empty_cache binds both devices (each synchronizes), then device 0 again.
    rt.free(a).unwrap();
    platform.lib().set_device(1).unwrap();
    npu_runtime::keeping_current_device(|| rt.empty_cache()).unwrap();
    assert_eq!(fake.used(1), 0);
    assert_eq!(platform.lib().get_device().unwrap(), 1);
}

#[test]
fn frees_find_their_device_by_address() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 2);
    let rt = runtime(&fake, Config::default());
    let on0 = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    let on1 = rt.malloc(3 * MIB, 1, Stream::DEFAULT).unwrap();
    let on0_big = rt.malloc(30 * MIB, 0, Stream::DEFAULT).unwrap();
    assert_eq!((on0, on1), (0x1000_0000_0000, 0x1100_0000_0000));
    // Each error names the owner's view: device 1's interior pointer is NotAllocated there.
    assert_eq!(
        rt.free(on1 + 4096).unwrap_err(),
        RuntimeError::Free(FreeError::NotAllocated { addr: on1 + 4096 })
    );
    assert_eq!(
        rt.record_stream(on1 + 4096, Stream::DEFAULT).unwrap_err(),
        RuntimeError::Free(FreeError::NotAllocated { addr: on1 + 4096 })
    );
    rt.record_stream(on1, Stream::DEFAULT).unwrap();
    rt.free(on1).unwrap();
    assert_eq!(rt.memory_allocated(1).unwrap(), 0);
    assert_eq!(
        rt.memory_allocated(0).unwrap(),
        1536 + (30 * MIB + 512),
        "device 0 untouched by device 1's free (the 32-byte pad rounds up one 512-byte step)"
    );
    rt.free(on0_big).unwrap();
    rt.free(on0).unwrap();
    assert_eq!(rt.memory_allocated(0).unwrap(), 0);
    assert_eq!(
        rt.free(on1).unwrap_err(),
        RuntimeError::Free(FreeError::NotAllocated { addr: on1 })
    );
    rt.empty_cache().unwrap();
    // No segment left anywhere: the same addresses are now foreign to every device.
    assert_eq!(
        rt.free(on1).unwrap_err(),
        RuntimeError::Free(FreeError::ForeignPointer { addr: on1 })
    );
    assert_eq!(
        rt.free(on0).unwrap_err(),
        RuntimeError::Free(FreeError::ForeignPointer { addr: on0 })
    );
    assert_eq!((fake.used(0), fake.used(1)), (0, 0));
}

#[test]
fn fraction_and_mem_get_info() {
    let fake = FakeAcl::new(Variant::Full, 100 * MIB, 1);
    let rt = runtime(&fake, Config::default());
    assert_eq!(rt.mem_get_info(0).unwrap(), (100 * MIB, 100 * MIB));
    assert_eq!(rt.get_per_process_memory_fraction(0).unwrap(), 1.0);
    rt.set_per_process_memory_fraction(0.25, 0).unwrap();
    assert_eq!(rt.get_per_process_memory_fraction(0).unwrap(), 0.25);
    // 30 MiB needs a 32 MiB segment, over the 25 MiB allowed: OOM without a device call.
    let err = rt.malloc(30 * MIB, 0, Stream::DEFAULT).unwrap_err();
    assert!(err.to_string().contains("25.00 MiB allowed; "), "{err}");
    assert_eq!(fake.calls("aclrtMallocAlign32"), 0);
    let a = rt.malloc(20 * MIB, 0, Stream::DEFAULT).unwrap();
    assert_eq!(rt.mem_get_info(0).unwrap(), (78 * MIB, 100 * MIB));
    rt.free(a).unwrap();
}

#[test]
fn a_mem_get_info_failure_at_open_is_asked_again() {
    let fake = FakeAcl::new(Variant::Full, 100 * MIB, 1);
    let mut config = Config::default();
    config.alloc.garbage_collection_threshold = Some(0.5);
    let rt = runtime(&fake, config.clone());
    rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(rt.gc_status(0).unwrap(), GcStatus::On { limit: 50 * MIB });

    // The device's total is unknown when the allocator is built: GC waits for it, and the next
    // cache miss asks again (torch_npu asks aclrtGetMemInfo when it needs the total).
    let fake = FakeAcl::new(Variant::Full, 100 * MIB, 1);
    let rt = runtime(&fake, config);
    fake.fail_next("aclrtGetMemInfo", 507_899, 1);
    rt.set_per_process_memory_fraction(1.0, 0).unwrap(); // opens the device
    assert_eq!(rt.gc_status(0).unwrap(), GcStatus::Unavailable);
    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(rt.gc_status(0).unwrap(), GcStatus::On { limit: 50 * MIB });
    // The fraction is asked for the same way: it fails only while the device cannot tell.
    fake.fail_next("aclrtGetMemInfo", 507_899, 1);
    assert_eq!(rt.mem_get_info(0).unwrap_err().acl_code(), Some(507_899));
    rt.set_per_process_memory_fraction(0.5, 0).unwrap();
    assert_eq!(rt.get_per_process_memory_fraction(0).unwrap(), 0.5);
    rt.free(a).unwrap();
    assert_eq!(rt.mem_get_info(0).unwrap().1, 100 * MIB);
}

#[test]
fn no_caching_goes_to_the_device_every_time() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    let config = Config {
        caching: false,
        ..Config::default()
    };
    let rt = runtime(&fake, config);
    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    // Align32 of 1000 + 32.
    assert_eq!(fake.used(0), 1056);
    fake.clear_log();
    rt.free(a).unwrap();
    assert_eq!(fake.log(), ["aclrtSynchronizeDevice", "aclrtFree"]);
    let b = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(b, a);
    assert_eq!(fake.calls("aclrtMallocAlign32"), 2);
    assert_eq!(rt.memory_allocated(0).unwrap(), 0, "no stats, as torch");
    rt.free(b).unwrap();
    assert_eq!(fake.used(0), 0);
    assert_eq!(
        rt.free(b).unwrap_err(),
        RuntimeError::Free(FreeError::ForeignPointer { addr: b })
    );
    let err = rt.malloc(2 << 30, 0, Stream::DEFAULT).unwrap_err();
    assert!(err.is_out_of_memory());
    assert!(
        err.to_string().starts_with(
            "NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 1024.00 MiB total capacity;"
        ),
        "{err}"
    );
    // No pools without caching: every pool and memory-saver call says why.
    assert_eq!(rt.create_pool(0).unwrap_err(), RuntimeError::NoCaching);
    assert_eq!(
        rt.begin_region(0, "kv", false).unwrap_err(),
        RuntimeError::NoCaching
    );
    assert_eq!(
        RuntimeError::<AclError>::NoCaching.to_string(),
        "no private pools or memory saver regions: caching is off \
         (PYTORCH_NO_NPU_MEMORY_CACHING)"
    );
}

#[test]
fn no_caching_drains_the_host_queue_before_each_free() {
    // torch_npu's uncached_delete calls npuSynchronizeDevice, which drains its task queue
    // first: the host's synchronize hook runs before the device synchronizes.
    let fake = Arc::new(FakeAcl::new(Variant::Full, 1 << 30, 1));
    let config = Config {
        caching: false,
        ..Config::default()
    };
    let rt = runtime(&fake, config);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hook: SyncHook = {
        let (fake, seen) = (fake.clone(), seen.clone());
        Arc::new(move |device| {
            seen.lock().unwrap().push((device, fake.log()));
            true
        })
    };
    // Set before the device opens: it catches up when it does.
    rt.set_host_queue(HostQueue::SyncFirst, Some(hook.clone()));
    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    fake.clear_log();
    rt.free(a).unwrap();
    assert_eq!(fake.log(), ["aclrtSynchronizeDevice", "aclrtFree"]);
    assert_eq!(*seen.lock().unwrap(), [(0, Vec::<String>::new())]);
    // A hook that fails does not stop the free: the device synchronization still runs.
    rt.set_host_queue(HostQueue::SyncFirst, Some(Arc::new(|_| false)));
    let b = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    fake.clear_log();
    rt.free(b).unwrap();
    assert_eq!(fake.log(), ["aclrtSynchronizeDevice", "aclrtFree"]);
    // Without a hook, the device synchronization alone.
    rt.set_host_queue(HostQueue::None, None);
    let c = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    rt.free(c).unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert_eq!(fake.used(0), 0);
}

#[test]
fn memory_summary_is_torchs_table() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    let rt = runtime(&fake, Config::default());
    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    let text = rt.memory_summary(0, false).unwrap();
    assert!(
        text.contains(
            "| Allocated memory      |    1536 B  |    1536 B  |    1536 B  |       0 B  |"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "| NPU reserved segments |       1    |       1    |       1    |       0    |"
        ),
        "{text}"
    );
    rt.free(a).unwrap();
}

#[test]
fn an_implausible_device_count_is_an_error_not_an_allocation() {
    // A library that writes garbage into the count (1,094,795,585 devices) must not make the
    // runtime size its device table by it.
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    fake.report_devices(1_094_795_585);
    // SAFETY: the fake libascendcl built from this workspace.
    let err = unsafe { AclPlatform::load(fake.path()) }.unwrap_err();
    assert_eq!(
        err,
        AclError::ImplausibleResult {
            function: "aclrtGetDeviceCount",
            value: 1_094_795_585,
            limit: acl_sys::MAX_DEVICES.into(),
        }
    );
    assert!(
        err.to_string().contains("does not behave like libascendcl"),
        "{err}"
    );
    fake.report_devices(acl_sys::MAX_DEVICES);
    // SAFETY: as above.
    let platform = unsafe { AclPlatform::load(fake.path()) }.unwrap();
    assert_eq!(platform.device_count(), acl_sys::MAX_DEVICES);
}

#[test]
fn a_device_count_that_grows_later_does_not_widen_the_table() {
    // The table is sized when the runtime is built; a library that reports more devices later
    // gets InvalidDevice for them, not an index out of bounds.
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    let rt = runtime(&fake, Config::default());
    fake.report_devices(4);
    assert_eq!(rt.device_count(), 1);
    assert_eq!(
        rt.malloc(1000, 3, Stream::DEFAULT).unwrap_err(),
        RuntimeError::InvalidDevice {
            device: 3,
            count: 1
        }
    );
    assert_eq!(
        rt.memory_stats(3).unwrap_err(),
        RuntimeError::InvalidDevice {
            device: 3,
            count: 1
        }
    );
}

#[test]
fn a_size_past_every_limit_is_out_of_memory_in_the_fake_not_an_abort() {
    // The fake's own arithmetic must not overflow: a panic cannot cross `extern "C"` and would
    // abort the test process.
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    let (platform, _rt) = platform_and_runtime(&fake, Config::default());
    let lib = platform.lib();
    lib.set_device(0).unwrap();
    for size in [usize::MAX - 7, usize::MAX, usize::MAX - 40] {
        let err = lib
            .malloc_align32(size, acl_sys::MemMallocPolicy::HUGE_FIRST)
            .unwrap_err();
        assert_eq!(err.code(), Some(207_001), "{err}");
        let err = lib
            .malloc(size, acl_sys::MemMallocPolicy::HUGE_FIRST)
            .unwrap_err();
        assert_eq!(err.code(), Some(207_001), "{err}");
    }
    assert_eq!(fake.used(0), 0);
}

/// torch_npu's `AddPadSize`: no 32-byte pad on an Ascend 950 part (`aclrtGetSocName`) with
/// CANN 9.1.0 or later (`aclsysGetCANNVersion`); 32 everywhere else.
#[test]
fn the_pad_follows_torch_npus_chip_and_version_gate() {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    // (allocated bytes, reserved bytes) of one 1 MiB request, and the uncached device malloc
    // of 1000 bytes.
    let sizes = |fake: &FakeAcl| {
        let (_platform, rt) = platform_and_runtime(fake, Config::default());
        let p = rt.malloc(MIB, 0, Stream::DEFAULT).unwrap();
        let cached = (
            stat(&rt, "allocated_bytes.all.current"),
            stat(&rt, "reserved_bytes.all.current"),
        );
        rt.free(p).unwrap();
        rt.empty_cache().unwrap();
        let config = Config {
            caching: false,
            ..Config::default()
        };
        let (_platform, rt) = platform_and_runtime(fake, config);
        fake.clear_log();
        let p = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
        // `aclrtMallocAlign32(size=N, ...)`, or `aclrtMalloc` in a CANN older than 8.1.
        let call = fake.call_details().pop().unwrap();
        let uncached: u64 = call
            .split_once("size=")
            .and_then(|(_, rest)| rest.split_once(','))
            .and_then(|(size, _)| size.parse().ok())
            .unwrap_or_else(|| panic!("{call}"));
        rt.free(p).unwrap();
        (cached, uncached)
    };
    let padded = (((MIB + 512) as i64, (20 * MIB) as i64), 1032);
    // Today's parts (the fake reports an Ascend910B1 and CANN 8.5.0): 1 MiB + 32 bytes rounds
    // to 1 MiB + 512, a large-pool request in a 20 MiB segment; uncached, 1000 + 32 bytes.
    assert_eq!(sizes(&fake), padded);
    // An Ascend 950 part with CANN 9.1.0: exactly 1 MiB, a small-pool request in a 2 MiB
    // segment; uncached, 1000 bytes asked for, not 1032.
    fake.set_soc_name(Some("Ascend950PR_9599"));
    fake.set_versions(Some("9.1.0"), Some("25.5.0"));
    assert_eq!(sizes(&fake), ((MIB as i64, (2 * MIB) as i64), 1000));
    for (soc, cann) in [
        (Some("Ascend950PR_9599"), Some("9.0.0")),
        (Some("Ascend950PR_9599"), None),
        (Some("Ascend910B1"), Some("9.1.0")),
        (Some("Ascend910_9391"), Some("9.1.0")),
        (None, Some("9.1.0")),
    ] {
        fake.set_soc_name(soc);
        fake.set_versions(cann, Some("25.5.0"));
        assert_eq!(sizes(&fake), padded, "{soc:?} {cann:?}");
    }
    // A CANN without aclsysGetCANNVersion (older than 8.1) pads.
    let legacy = FakeAcl::new(Variant::Legacy, 1 << 30, 1);
    legacy.set_soc_name(Some("Ascend950PR_9599"));
    assert_eq!(sizes(&legacy), padded);
}

/// torch_npu's gate for `page_size:1g` (`IsMallocPage1GMem`): 1 GiB pages only with CANN
/// 8.1.RC1 and driver 25.0.RC1 or later, as `aclsysGetCANNVersion` reports them; otherwise the
/// setting is ignored (with a warning) and segments are sized as without it.
#[test]
fn page_size_1g_follows_torch_npus_version_gate() {
    let config = || Config {
        alloc: alloc_conf::parse("page_size:1g").conf,
        ..Config::default()
    };
    let fake = FakeAcl::new(Variant::Full, 4 << 30, 1);
    let segment = |fake: &FakeAcl| {
        let (platform, rt) = platform_and_runtime(fake, config());
        let p = rt.malloc(30 * MIB, 0, Stream::DEFAULT).unwrap();
        let reserved = stat(&rt, "reserved_bytes.large_pool.current");
        let page_size = rt.allocator_settings(0).unwrap().page_size;
        rt.free(p).unwrap();
        rt.empty_cache().unwrap();
        (platform.huge_pages_1g(), reserved, page_size)
    };
    // The fake reports CANN 8.5.0 and driver 25.5.0: a whole GiB, of 1 GiB pages
    // (`ACL_MEM_MALLOC_HUGE1G_ONLY`, 6).
    fake.clear_log();
    assert_eq!(segment(&fake), (true, 1 << 30, Some(1 << 30)));
    assert_eq!(fake.calls("aclsysGetCANNVersion"), 4);
    let mallocs = |fake: &FakeAcl| -> Vec<String> {
        let details = fake.call_details();
        details
            .into_iter()
            .filter(|d| d.starts_with("aclrtMallocAlign32"))
            .collect()
    };
    assert_eq!(
        mallocs(&fake),
        ["aclrtMallocAlign32(size=1073741824, policy=6)"]
    );
    // 1 GiB pages fail: one retry with the usual pages (HUGE_FIRST, 0), as torch_npu's
    // AclrtMallocAlign32 does.
    fake.clear_log();
    fake.fail_next("aclrtMallocAlign32", 207_001, 1);
    assert_eq!(segment(&fake), (true, 1 << 30, Some(1 << 30)));
    assert_eq!(
        mallocs(&fake),
        [
            "aclrtMallocAlign32(size=1073741824, policy=6)",
            "aclrtMallocAlign32(size=1073741824, policy=0)"
        ]
    );
    for (cann, driver) in [
        (Some("8.0.RC3"), Some("25.5.0")),
        (Some("8.5.0"), Some("24.1.0")),
        (None, Some("25.5.0")),
        (Some("8.5.0"), None),
    ] {
        fake.set_versions(cann, driver);
        // 30 MiB and the 32-byte pad, rounded to 2 MiB, of 2 MiB pages.
        fake.clear_log();
        assert_eq!(
            segment(&fake),
            (false, 32 << 20, None),
            "{cann:?} {driver:?}"
        );
        assert_eq!(
            mallocs(&fake),
            ["aclrtMallocAlign32(size=33554432, policy=0)"]
        );
    }
    fake.set_versions(Some("8.1.RC1"), Some("25.0.RC1"));
    assert_eq!(segment(&fake), (true, 1 << 30, Some(1 << 30)));
    // Without the setting no version is asked.
    let before = fake.calls("aclsysGetCANNVersion");
    let (_platform, rt) = platform_and_runtime(&fake, Config::default());
    rt.malloc(30 * MIB, 0, Stream::DEFAULT).unwrap();
    assert_eq!(fake.calls("aclsysGetCANNVersion"), before);
    // A CANN without aclsysGetCANNVersion counts as too old.
    let legacy = FakeAcl::new(Variant::Legacy, 4 << 30, 1);
    assert_eq!(segment(&legacy), (false, 32 << 20, None));
}
