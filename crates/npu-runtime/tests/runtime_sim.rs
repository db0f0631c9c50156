//! The runtime over simulated devices, without loom: device-table checks and OOM observers.
#![cfg(not(loom))]

mod sim;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use alloc_sim::SimStream;
use npu_runtime::{Config, RuntimeError};

const MIB: u64 = 1 << 20;
const S0: SimStream = SimStream(0);

#[test]
fn the_device_table_decides_which_indices_are_valid() {
    let rt = sim::runtime(2, 64 * MIB, Config::default());
    assert_eq!(rt.device_count(), 2);
    for device in [2, 3, u32::MAX] {
        assert_eq!(
            rt.malloc(1000, device, S0).unwrap_err(),
            RuntimeError::InvalidDevice { device, count: 2 }
        );
        assert!(matches!(
            rt.with_device(device, |_| ()),
            Err(RuntimeError::InvalidDevice { .. })
        ));
    }
    let p = rt.malloc(1000, 1, S0).unwrap();
    rt.free(p).unwrap();
}

#[test]
fn an_observer_that_runs_out_of_memory_again_is_not_called_again() {
    // Each device holds 3 MiB: a 20 MiB segment never fits. The observer tries one on the other
    // device, which runs out of memory too; that OOM is returned to the observer without calling
    // the observers again (before, this recursed until the stack overflowed).
    let rt = Arc::new(sim::runtime(2, 3 * MIB, Config::default()));
    let calls = Arc::new(AtomicU64::new(0));
    {
        let weak: Weak<_> = Arc::downgrade(&rt);
        let calls = calls.clone();
        rt.attach_out_of_memory_observer(move |oom| {
            calls.fetch_add(1, Ordering::Relaxed);
            let rt = weak.upgrade().unwrap();
            let other = (oom.device + 1) % 2;
            assert!(
                rt.malloc(5 * MIB, other, S0)
                    .unwrap_err()
                    .is_out_of_memory()
            );
        });
    }
    assert!(rt.malloc(5 * MIB, 0, S0).unwrap_err().is_out_of_memory());
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    // The next OOM outside an observer calls it again.
    assert!(rt.malloc(5 * MIB, 1, S0).unwrap_err().is_out_of_memory());
    assert_eq!(calls.load(Ordering::Relaxed), 2);
}

/// torch_npu builds the out-of-memory message after the observers ran, from the stats then: an
/// observer that frees memory shows in "already allocated" and "reserved".
#[test]
fn the_oom_message_is_read_after_the_observers_ran() {
    let rt = Arc::new(sim::runtime(1, 64 * MIB, Config::default()));
    let keep = rt.malloc(30 * MIB, 0, S0).unwrap();
    {
        let weak: Weak<_> = Arc::downgrade(&rt);
        rt.attach_out_of_memory_observer(move |_| {
            let rt = weak.upgrade().unwrap();
            rt.free(keep).unwrap();
            rt.empty_cache().unwrap();
        });
    }
    let e = rt.malloc(60 * MIB, 0, S0).unwrap_err();
    let RuntimeError::Alloc(npu_runtime::AllocError::OutOfMemory(oom)) = &e else {
        panic!("{e:?}");
    };
    assert_eq!((oom.allocated, oom.active, oom.reserved), (0, 0, 0));
    assert!(e.to_string().contains("0 bytes already allocated"), "{e}");
}

/// `throw_on_npumalloc_oom:True`: the refused malloc is out of memory to the caller at once,
/// the OOM observers are not called, and the rejection observers run on a thread of their own
/// with torch_npu's four numbers.
#[test]
fn a_rejected_malloc_calls_the_rejection_observers_on_their_own_thread() {
    let config = Config {
        alloc: alloc_conf::parse("throw_on_npumalloc_oom:True").conf,
        ..Config::default()
    };
    let rt = sim::runtime(1, 64 * MIB, config);
    let ooms = Arc::new(AtomicU64::new(0));
    {
        let ooms = ooms.clone();
        rt.attach_out_of_memory_observer(move |_| {
            ooms.fetch_add(1, Ordering::Relaxed);
        });
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let caller = std::thread::current().id();
    rt.attach_oom_rejection_observer(move |r| {
        let numbers = (r.device, r.alloc_size, r.total_allocated, r.device_total);
        tx.send((numbers, std::thread::current().id() != caller))
            .unwrap();
    });
    let a = rt.malloc(40 * MIB, 0, S0).unwrap();
    let err = rt.malloc(30 * MIB, 0, S0).unwrap_err();
    assert!(err.is_out_of_memory());
    assert!(matches!(
        err,
        RuntimeError::Alloc(npu_runtime::AllocError::Rejected(_))
    ));
    let (numbers, elsewhere) = rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap();
    assert_eq!(numbers, (0, 32 * MIB, 42 * MIB, 64 * MIB));
    assert!(elsewhere, "the observers run on a thread of their own");
    assert_eq!(ooms.load(Ordering::Relaxed), 0);
    let stats = rt.device_stats(0).unwrap();
    assert_eq!((stats.num_oom_rejections, stats.num_ooms), (1, 0));
    rt.free(a).unwrap();
}

fn expandable_config() -> Config {
    Config {
        alloc: alloc_conf::parse("expandable_segments:True").conf,
        ..Config::default()
    }
}

#[test]
fn set_allocator_settings_switches_expandable_segments_on_every_device() {
    let rt = sim::runtime(2, 256 * MIB, expandable_config());
    let a = rt.malloc(8 * MIB, 0, S0).unwrap();
    let snapshot = rt.memory_snapshot(0).unwrap();
    assert!(snapshot[0].is_expandable);
    assert_eq!(rt.device_stats(0).unwrap().segment.all.current, 0);

    assert!(
        rt.set_allocator_settings("expandable_segments:False")
            .is_empty()
    );
    assert!(!rt.allocator_settings(0).unwrap().expandable_segments);
    assert!(!rt.allocator_settings(1).unwrap().expandable_segments);
    // The free 12 MiB of the expandable page is passed over: a 20 MiB device segment.
    let b = rt.malloc(8 * MIB, 0, S0).unwrap();
    let s = rt.device_stats(0).unwrap();
    assert_eq!(s.segment.all.current, 1);
    assert_eq!(s.reserved_bytes.all.current, (40 * MIB) as i64);
    // A device opened afterwards starts with the settings in force.
    let c = rt.malloc(8 * MIB, 1, S0).unwrap();
    assert_eq!(rt.device_stats(1).unwrap().segment.all.current, 1);

    // A key fixed at start refuses the whole string, as torch_npu raises before applying any.
    let warnings = rt.set_allocator_settings("expandable_segments:True,page_size:1g");
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].kind, alloc_conf::WarningKind::NotAtRunTime);
    assert!(!rt.allocator_settings(0).unwrap().expandable_segments);
    assert!(!rt.allocator_settings(1).unwrap().expandable_segments);
    assert_eq!(rt.allocator_settings(1).unwrap().page_size, None);
    assert!(
        rt.set_allocator_settings("expandable_segments:True")
            .is_empty()
    );
    assert!(rt.allocator_settings(1).unwrap().expandable_segments);

    for p in [a, b, c] {
        rt.free(p).unwrap();
    }
    rt.empty_cache().unwrap();
    assert_eq!(sim::device_bytes(&rt), 0);
    for d in 0..2 {
        let (pages, ranges) = rt
            .with_device(d, |dev| (dev.live_pages(), dev.reserved_ranges().count()))
            .unwrap();
        assert_eq!((pages, ranges), (0, 0));
    }
}

#[test]
fn a_device_without_virtual_memory_runs_without_expandable_segments() {
    let rt = sim::runtime_with(1, expandable_config(), |_| {
        alloc_sim::SimDevice::new(256 * MIB).without_vmm()
    });
    let p = rt.malloc(8 * MIB, 0, S0).unwrap();
    assert!(!rt.allocator_settings(0).unwrap().expandable_segments);
    assert_eq!(rt.device_stats(0).unwrap().segment.all.current, 1);
    // Asking again probes again, and it stays off.
    rt.set_allocator_settings("expandable_segments:True");
    assert!(!rt.allocator_settings(0).unwrap().expandable_segments);
    rt.free(p).unwrap();
}

#[test]
fn memory_summary_says_what_expandable_segments_hold() {
    let rt = sim::runtime(1, 256 * MIB, expandable_config());
    let p = rt.malloc(30 * MIB, 0, S0).unwrap();
    let text = rt.memory_summary(0, true).unwrap();
    // torch's table counts no segment for expandable memory; two lines say what it holds:
    // 40 MiB mapped (two 20 MiB pages) in one range of ceil(1.125 × 256 MiB / 20 MiB) pages.
    assert!(
        text.contains("| NPU reserved segments |       0    |"),
        "{text}"
    );
    assert!(
        text.contains("| Expandable segments: 1 mapped ranges, 40.00 MiB mapped "),
        "{text}"
    );
    assert!(
        text.contains("|   in 1 reserved address ranges of 300.00 MiB "),
        "{text}"
    );
    rt.free(p).unwrap();
}

/// `MemPool(use_on_oom=True)`: a default malloc that runs out takes the pool's cached block;
/// once the pool is dropped it no longer does (torch's `~MemPool` clears `use_on_oom` first).
#[test]
fn a_use_on_oom_pool_serves_default_mallocs_until_it_is_dropped() {
    let rt = sim::runtime(1, 64 * MIB, Config::default());
    let options = npu_runtime::MemPoolOptions {
        use_on_oom: true,
        no_split: true,
    };
    let pool = rt.mem_pool_with(0, options).unwrap();
    let y = {
        let _scope = rt.use_mem_pool(&pool).unwrap();
        rt.malloc(20 * MIB, 0, S0).unwrap()
    };
    rt.free(y).unwrap();
    let x = rt.malloc(30 * MIB, 0, S0).unwrap();
    // 32 + 22 + 22 MiB is past 64: the pool's whole 22 MiB block serves the request.
    assert_eq!(rt.malloc(20 * MIB, 0, S0).unwrap(), y);
    let stats = rt.device_stats(0).unwrap();
    assert_eq!(stats.num_alloc_retries, 0);
    assert_eq!(
        stats.allocated_bytes.all.current,
        (30 * MIB + 512 + 22 * MIB) as i64
    );
    rt.free(y).unwrap();
    // A pool scope holds it past the drop; use_on_oom went with the MemPool.
    rt.begin_use_pool(0, pool.id()).unwrap();
    let id = pool.id();
    drop(pool);
    // (From another thread: this one's mallocs go to the pool while its scope is open.)
    let elsewhere = std::thread::scope(|s| s.spawn(|| rt.malloc(20 * MIB, 0, S0)).join()).unwrap();
    assert!(elsewhere.unwrap_err().is_out_of_memory());
    rt.end_use_pool(0, id).unwrap();
    rt.free(x).unwrap();
}

#[test]
fn mem_pools_route_this_threads_allocations_and_release_on_drop() {
    let rt = sim::runtime(2, 256 * MIB, Config::default());
    let pool = rt.mem_pool(0).unwrap();
    assert_eq!(pool.use_count().unwrap(), 1);
    let (x, y) = {
        let _scope = rt.use_mem_pool(&pool).unwrap();
        assert_eq!(pool.use_count().unwrap(), 2);
        // Routed on the pool's device only.
        let x = rt.malloc(30 * MIB, 0, S0).unwrap();
        let y = rt.malloc(30 * MIB, 1, S0).unwrap();
        // Another thread is not routed.
        let rt2 = &rt;
        let z =
            std::thread::scope(|s| s.spawn(move || rt2.malloc(30 * MIB, 0, S0).unwrap()).join())
                .unwrap();
        let snapshot = rt.memory_snapshot(0).unwrap();
        let pools: Vec<_> = snapshot.iter().map(|s| (s.address, s.pool_id)).collect();
        assert!(pools.contains(&(x, pool.id())));
        assert!(pools.contains(&(z, npu_runtime::PoolId::DEFAULT)));
        rt.free(z).unwrap();
        (x, y)
    };
    assert_eq!(pool.use_count().unwrap(), 1);
    assert_eq!(rt.device_stats(1).unwrap().segment.all.current, 1);
    // The guard's scope ended: the pool can be used again, but not twice at once (torch's
    // "already recording to mempool_id"), and the refusal takes no hold.
    {
        let _again = rt.use_mem_pool(&pool).unwrap();
        assert_eq!(
            rt.use_mem_pool(&pool).map(|_| ()),
            Err(RuntimeError::Pool(npu_runtime::PoolError::AlreadyEntered(
                pool.id()
            )))
        );
        assert_eq!(pool.use_count().unwrap(), 2);
    }
    assert_eq!(pool.use_count().unwrap(), 1);
    // Pools are numbered per process: device 1's first pool comes after device 0's.
    let other = rt.mem_pool(1).unwrap();
    assert_eq!(other.id(), npu_runtime::PoolId(0, pool.id().1 + 1));
    drop(other);
    rt.free(x).unwrap();
    rt.free(y).unwrap();
    rt.empty_cache().unwrap();
    // Held: its free segment (30 MiB + the 32-byte pad, in 2 MiB) stays; dropped: it goes.
    assert_eq!(rt.memory_reserved(0).unwrap(), 32 * MIB);
    let id = pool.id();
    drop(pool);
    assert_eq!(rt.memory_reserved(0).unwrap(), 0);
    assert_eq!(
        rt.pool_use_count(0, id),
        Err(RuntimeError::Pool(npu_runtime::PoolError::Unknown(id)))
    );
    assert_eq!(rt.end_use_pool(0, id), Err(RuntimeError::ScopeNotOpen));
}

#[test]
fn the_memory_saver_pauses_and_resumes_every_device_at_the_same_addresses() {
    let rt = sim::runtime(2, 256 * MIB, Config::default());
    let mut weights = Vec::new();
    for device in 0..2 {
        let _region = rt.region(device, "weights", true).unwrap();
        let w = rt.malloc(40 * MIB, device, S0).unwrap();
        rt.with_device(device, |d| d.write_bytes(w, b"weights").unwrap())
            .unwrap();
        weights.push(w);
    }
    let kv = {
        let _region = rt.region(0, "kv", false).unwrap();
        rt.malloc(60 * MIB, 0, S0).unwrap()
    };
    let free = |d| rt.mem_get_info(d).unwrap().0;
    let before = (free(0), free(1));
    // 40 MiB and the 32-byte pad make 42 MiB segments.
    assert_eq!(rt.pause(Some("weights")).unwrap(), 2 * 42 * MIB);
    assert_eq!(
        (free(0), free(1)),
        (before.0 + 42 * MIB, before.1 + 42 * MIB)
    );
    // A region of a paused tag refuses allocations.
    {
        let _region = rt.region(1, "weights", true).unwrap();
        assert!(matches!(
            rt.malloc(MIB, 1, S0),
            Err(RuntimeError::Alloc(npu_runtime::AllocError::Paused { .. }))
        ));
    }
    assert!(matches!(
        rt.pause(Some("weights")),
        Err(RuntimeError::Saver(npu_runtime::SaverError::AlreadyPaused(
            _
        )))
    ));
    assert!(matches!(
        rt.resume(Some("kv")),
        Err(RuntimeError::Saver(npu_runtime::SaverError::NotPaused(_)))
    ));
    assert!(matches!(
        rt.pause(Some("nope")),
        Err(RuntimeError::Saver(npu_runtime::SaverError::UnknownTag(_)))
    ));
    let stats = rt.memory_saver_stats(0).unwrap();
    assert_eq!(stats.paused_bytes.current, (42 * MIB) as i64);
    assert_eq!(rt.resume(None).unwrap(), 2 * 42 * MIB);
    for (device, &w) in weights.iter().enumerate() {
        let bytes = rt
            .with_device(device as u32, |d| d.read_bytes(w, 7).unwrap())
            .unwrap();
        assert_eq!(bytes, b"weights");
        rt.free(w).unwrap();
    }
    rt.free(kv).unwrap();
    assert_eq!(rt.end_region(0), Err(RuntimeError::ScopeNotOpen));
}

#[test]
fn cpu_backups_are_read_on_the_device_that_holds_them_and_kept_when_retained() {
    let rt = sim::runtime(2, 256 * MIB, Config::default());
    let w = {
        let _region = rt.region(1, "weights", true).unwrap();
        rt.malloc(40 * MIB, 1, S0).unwrap()
    };
    let plain = rt.malloc(MIB, 0, S0).unwrap();
    rt.with_device(1, |d| d.write_bytes(w + 5, b"weights").unwrap())
        .unwrap();
    let read = |addr, len| rt.cpu_backup(addr, len, |b| b.map(|b| b.buffer.read(b.offset, len)));
    assert_eq!(read(w + 5, 7), Ok(None));
    rt.set_retain_cpu_backup(true);
    assert!(rt.retain_cpu_backup());
    rt.pause(None).unwrap();
    assert_eq!(read(w + 5, 7), Ok(Some(b"weights".to_vec())));
    rt.resume(None).unwrap();
    // Kept by the resume (device 1's allocator was told at the resume).
    assert_eq!(read(w + 5, 7), Ok(Some(b"weights".to_vec())));
    rt.set_retain_cpu_backup(false);
    rt.pause(None).unwrap();
    rt.resume(None).unwrap();
    assert_eq!(read(w + 5, 7), Ok(None));
    // Memory outside every region, on either device, has no backup.
    assert_eq!(
        read(plain, 8),
        Err(RuntimeError::Saver(
            npu_runtime::SaverError::NotSaverMemory {
                addr: plain,
                len: 8
            }
        ))
    );
    rt.free(w).unwrap();
    rt.free(plain).unwrap();
}

#[test]
fn the_memory_margin_reaches_every_device_also_one_opened_later() {
    let rt = sim::runtime(2, 256 * MIB, Config::default());
    // Device 0 is open; device 1 opens after the call.
    rt.malloc(MIB, 0, S0).map(|p| rt.free(p)).unwrap().unwrap();
    rt.set_memory_margin_bytes(200 * MIB);
    for device in 0..2 {
        let _region = rt.region(device, "kv", false).unwrap();
        // 60 MiB (a 62 MiB segment with the pad) and the 200 MiB margin do not fit in 256.
        assert!(
            rt.malloc(60 * MIB, device, S0)
                .unwrap_err()
                .is_out_of_memory()
        );
        let p = rt.malloc(40 * MIB, device, S0).unwrap();
        rt.free(p).unwrap();
    }
    rt.set_memory_margin_bytes(0);
    let _region = rt.region(1, "kv", false).unwrap();
    let p = rt.malloc(60 * MIB, 1, S0).unwrap();
    rt.free(p).unwrap();
}

#[test]
fn with_a_host_queue_the_hook_runs_without_the_lock_before_cached_memory_goes_back() {
    use npu_runtime::{HostQueue, SyncHook};
    // One 256 MiB device: a cached 150 MiB segment, then a 150 MiB request that only fits once
    // the cache is given back.
    let rt = Arc::new(sim::runtime(1, 256 * MIB, Config::default()));
    let x = rt.malloc(150 * MIB, 0, S0).unwrap();
    rt.free(x).unwrap();
    let x2 = rt.malloc(150 * MIB, 0, S0).unwrap();
    rt.free(x2).unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let hook: SyncHook = {
        let (weak, calls) = (Arc::downgrade(&rt), calls.clone());
        Arc::new(move |device| {
            // The allocator's lock is free: this would deadlock under it.
            let rt = weak.upgrade().unwrap();
            assert_eq!(rt.memory_reserved(device).unwrap(), 150 * MIB + 2 * MIB);
            calls.fetch_add(1, Ordering::Relaxed);
            true
        })
    };
    // No release without a hook: out of memory, the cache kept.
    rt.set_host_queue(HostQueue::NoRelease, None);
    assert!(rt.malloc(200 * MIB, 0, S0).unwrap_err().is_out_of_memory());
    assert_eq!(rt.memory_reserved(0).unwrap(), 150 * MIB + 2 * MIB);
    // With the hook: it runs once, then the cache goes back and the retry succeeds.
    rt.set_host_queue(HostQueue::SyncFirst, Some(hook));
    let y = rt.malloc(200 * MIB, 0, S0).unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    assert_eq!(rt.memory_reserved(0).unwrap(), 200 * MIB + 2 * MIB);
    rt.free(y).unwrap();
}

#[test]
fn a_resume_that_fails_on_a_later_device_names_it_and_what_the_earlier_ones_did() {
    let rt = sim::runtime(2, 256 * MIB, Config::default());
    for device in 0..2 {
        let _region = rt.region(device, "weights", false).unwrap();
        rt.malloc(40 * MIB, device, S0).unwrap();
    }
    assert_eq!(rt.pause(Some("weights")).unwrap(), 2 * 42 * MIB);
    // Device 1's freed memory is taken by another allocation meanwhile.
    let free1 = rt.mem_get_info(1).unwrap().0;
    let filler = rt.malloc(free1 - 2 * MIB, 1, S0).unwrap();
    let e = rt.resume(None).unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::SaverStopped {
                device: 1,
                bytes_done,
                error: npu_runtime::SaverError::OutOfMemory { .. },
            } if bytes_done == 42 * MIB
        ),
        "{e:?}"
    );
    let message = e.to_string();
    assert!(
        message.starts_with("device 1: ")
            && message.ends_with(
                "; what the devices before it did stays done (44040192 bytes), the devices \
                 after it are untouched"
            ),
        "{message}"
    );
    // Device 0 stays resumed; once the memory is back, the call is made again for device 1.
    assert_eq!(rt.memory_saver_stats(0).unwrap().paused_bytes.current, 0);
    rt.free(filler).unwrap();
    rt.empty_cache().unwrap();
    assert_eq!(rt.resume(None).unwrap(), 42 * MIB);
    assert_eq!(rt.memory_saver_stats(1).unwrap().paused_bytes.current, 0);
}

/// As in torch_npu, whose device allocators are built at start-up and read the memory fraction
/// and the `max_split_size` stat only then: a run-time call changes neither, on a device opened
/// before it or after it, while the policy follows the new `max_split_size_mb`.
#[test]
fn run_time_settings_change_neither_the_fraction_limit_nor_the_max_split_size_stat() {
    let config = Config {
        alloc: alloc_conf::parse("max_split_size_mb:64").conf,
        ..Config::default()
    };
    let rt = sim::runtime(2, 1024 * MIB, config);
    let a = rt.malloc(MIB, 0, S0).unwrap();
    assert!(
        rt.set_allocator_settings("per_process_memory_fraction:0.25,max_split_size_mb:128")
            .is_empty()
    );
    assert_eq!(rt.device_stats(1).unwrap().max_split_size, Some(64 * MIB));
    assert_eq!(rt.get_per_process_memory_fraction(1).unwrap(), 1.0);
    for device in 0..2 {
        // 600 MiB is above a quarter of the device: no limit refuses it.
        let big = rt.malloc(600 * MIB, device, S0).unwrap();
        let s = rt.device_stats(device).unwrap();
        assert_eq!(s.max_split_size, Some(64 * MIB));
        assert_eq!(s.num_ooms, 0);
        assert_eq!(rt.get_per_process_memory_fraction(device).unwrap(), 1.0);
        let conf = rt.allocator_settings(device).unwrap();
        assert_eq!(conf.max_split_size, Some(128 * MIB));
        assert_eq!(conf.per_process_memory_fraction, 0.25);
        // The policy follows the new limit: a 600 MiB block is oversize at 128 MiB.
        assert_eq!(s.oversize_allocations.current, 1);
        rt.free(big).unwrap();
    }
    // `set_per_process_memory_fraction` does change the limit.
    rt.empty_cache().unwrap();
    rt.set_per_process_memory_fraction(0.25, 0).unwrap();
    assert!(rt.malloc(600 * MIB, 0, S0).is_err());
    rt.free(a).unwrap();
}
