//! Loom models of the runtime's locking: the real [`Runtime`] (its `sync` module switched to
//! loom's types) over `alloc-sim`'s simulated devices, each behind the runtime's device lock.
//!
//! Run with `cargo xtask loom` (`RUSTFLAGS="--cfg loom"`, release, `LOOM_MAX_PREEMPTIONS=2`; CI
//! runs `--preemptions 3`).
#![cfg(loom)]

mod sim;

use alloc_sim::{DeviceCall, Fault, SimStream, TestDevice};
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use npu_runtime::{AllocError, Config, Runtime};

const MIB: u64 = 1 << 20;

const S0: SimStream = SimStream(0);

fn runtime(devices: u32, capacity: u64, release_lock: bool) -> Arc<Runtime<TestDevice>> {
    let mut config = Config::default();
    config.alloc.release_lock_on_npumalloc = release_lock;
    Arc::new(sim::runtime(devices, capacity, config))
}

/// After the threads: nothing allocated, the allocators' reserves add up to the device's, and
/// `empty_cache` gives everything back.
fn check_settled(rt: &Runtime<TestDevice>) {
    let devices = 0..rt.device_count();
    let total = |f: &dyn Fn(u32) -> u64| devices.clone().map(f).sum::<u64>();
    assert_eq!(total(&|d| rt.memory_allocated(d).unwrap()), 0);
    assert_eq!(
        total(&|d| rt.memory_reserved(d).unwrap()),
        sim::device_bytes(rt)
    );
    rt.empty_cache().unwrap();
    assert_eq!(total(&|d| rt.memory_reserved(d).unwrap()), 0);
    assert_eq!(sim::device_bytes(rt), 0);
}

fn malloc_free_threads(threads: usize, release_lock: bool) {
    loom::model(move || {
        let rt = runtime(1, 64 * MIB, release_lock);
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let rt = rt.clone();
                thread::spawn(move || {
                    let p = rt.malloc(1000 + i as u64, 0, S0).unwrap();
                    rt.free(p).unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        check_settled(&rt);
    });
}

#[test]
fn concurrent_malloc_free_two_threads() {
    malloc_free_threads(2, false);
}

#[test]
fn concurrent_malloc_free_three_threads() {
    malloc_free_threads(3, false);
}

#[test]
fn concurrent_malloc_free_with_release_lock_on_npumalloc() {
    malloc_free_threads(2, true);
}

#[test]
fn frees_find_their_device_while_another_opens() {
    loom::model(|| {
        let rt = runtime(2, 64 * MIB, false);
        let handoff = Arc::new(Mutex::new(None));
        // Opens device 1 and widens its span while the consumer opens device 0 and routes
        // frees past device 1's span.
        let producer = {
            let (rt, handoff) = (rt.clone(), handoff.clone());
            thread::spawn(move || {
                let p = rt.malloc(1000, 1, S0).unwrap();
                *handoff.lock().unwrap() = Some(p);
            })
        };
        let consumer = {
            let (rt, handoff) = (rt.clone(), handoff.clone());
            thread::spawn(move || {
                let q = rt.malloc(3000, 0, S0).unwrap();
                if let Some(p) = handoff.lock().unwrap().take() {
                    rt.free(p).unwrap();
                }
                rt.free(q).unwrap();
            })
        };
        producer.join().unwrap();
        consumer.join().unwrap();
        if let Some(p) = handoff.lock().unwrap().take() {
            rt.free(p).unwrap();
        }
        check_settled(&rt);
    });
}

#[test]
fn a_pointer_handed_over_with_relaxed_atomics_is_freed_on_its_device() {
    loom::model(|| {
        let rt = runtime(2, 64 * MIB, false);
        // Both devices open, each with a span.
        let keep: Vec<u64> = (0..2).map(|d| rt.malloc(1000, d, S0).unwrap()).collect();
        let shared = Arc::new(AtomicU64::new(0));
        // A new segment above device 1's span; the consumer may see the pointer before the
        // span grew (nothing orders a relaxed handoff), and must still find the owner.
        let producer = {
            let (rt, shared) = (rt.clone(), shared.clone());
            thread::spawn(move || {
                let p = rt.malloc(3 * MIB, 1, S0).unwrap();
                shared.store(p, Ordering::Relaxed);
            })
        };
        let consumer = {
            let (rt, shared) = (rt.clone(), shared.clone());
            thread::spawn(move || match shared.load(Ordering::Relaxed) {
                0 => false,
                p => {
                    rt.free(p).unwrap();
                    true
                }
            })
        };
        producer.join().unwrap();
        if !consumer.join().unwrap() {
            rt.free(shared.load(Ordering::Relaxed)).unwrap();
        }
        for p in keep {
            rt.free(p).unwrap();
        }
        check_settled(&rt);
    });
}

#[test]
fn free_of_recorded_block_races_event_completion() {
    loom::model(|| {
        let rt = runtime(1, 64 * MIB, false);
        let p = rt.malloc(1000, 0, S0).unwrap();
        rt.record_stream(p, SimStream(7)).unwrap();
        let freer = {
            let rt = rt.clone();
            thread::spawn(move || rt.free(p).unwrap())
        };
        let completer = {
            let rt = rt.clone();
            thread::spawn(move || sim::complete_all(&rt))
        };
        freer.join().unwrap();
        completer.join().unwrap();
        // The event may have been recorded after the completer ran: finish it too.
        sim::complete_all(&rt);
        rt.process_events(0).unwrap();
        let stats = rt.device_stats(0).unwrap();
        assert_eq!(stats.active_bytes.all.current, 0);
        assert_eq!(rt.malloc(1000, 0, S0).unwrap(), p, "the block is reusable");
        rt.free(p).unwrap();
        check_settled(&rt);
    });
}

#[test]
fn empty_cache_races_malloc() {
    loom::model(|| {
        let rt = runtime(1, 64 * MIB, false);
        let user = {
            let rt = rt.clone();
            thread::spawn(move || {
                let p = rt.malloc(12 * MIB, 0, S0).unwrap();
                rt.free(p).unwrap();
            })
        };
        let emptier = {
            let rt = rt.clone();
            thread::spawn(move || rt.empty_cache().unwrap())
        };
        user.join().unwrap();
        emptier.join().unwrap();
        check_settled(&rt);
    });
}

#[test]
fn oom_observer_allocates_again_without_deadlock() {
    loom::model(|| {
        // 3 MiB: a 2 MiB small segment fits, a 20 MiB large one never does.
        let rt = runtime(1, 3 * MIB, false);
        let observed = Arc::new(AtomicBool::new(false));
        // loom has no `Weak`: the observer reaches the runtime through a slot emptied at the
        // end, which breaks the cycle.
        let slot = Arc::new(Mutex::new(Some(rt.clone())));
        {
            let slot = slot.clone();
            let observed = observed.clone();
            rt.attach_out_of_memory_observer(move |oom| {
                assert_eq!(oom.alloc_size, 20 * MIB);
                let rt = slot.lock().unwrap().clone().expect("runtime alive");
                let p = rt.malloc(512, 0, S0).unwrap();
                rt.free(p).unwrap();
                observed.store(true, Ordering::Release);
            });
        }
        let big = {
            let rt = rt.clone();
            thread::spawn(move || {
                assert!(rt.malloc(5 * MIB, 0, S0).unwrap_err().is_out_of_memory())
            })
        };
        let small = {
            let rt = rt.clone();
            thread::spawn(move || {
                let p = rt.malloc(1000, 0, S0).unwrap();
                rt.free(p).unwrap();
            })
        };
        big.join().unwrap();
        small.join().unwrap();
        assert!(observed.load(Ordering::Acquire));
        check_settled(&rt);
        slot.lock().unwrap().take();
    });
}

#[test]
fn a_device_error_in_one_malloc_races_another_thread() {
    loom::model(|| {
        // The first device malloc fails with an injected error: torch_npu's chain synchronizes,
        // releases the cache and retries, while another thread allocates and frees.
        let rt = runtime(1, 64 * MIB, false);
        rt.with_device(0, |d| {
            d.fail_nth(DeviceCall::Malloc, 1, Fault::Error(507_899));
        })
        .unwrap();
        let handles: Vec<_> = [12 * MIB, 1000]
            .into_iter()
            .map(|size| {
                let rt = rt.clone();
                thread::spawn(move || {
                    let p = rt.malloc(size, 0, S0).unwrap();
                    rt.free(p).unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let stats = rt.device_stats(0).unwrap();
        assert_eq!(
            stats.num_alloc_retries, 1,
            "the failed malloc was retried once"
        );
        check_settled(&rt);
    });
}

#[test]
fn frees_and_empty_cache_on_different_devices_race() {
    loom::model(|| {
        let rt = runtime(2, 64 * MIB, false);
        let p0 = rt.malloc(1000, 0, S0).unwrap();
        let p1 = rt.malloc(3 * MIB, 1, S0).unwrap();
        let freer = {
            let rt = rt.clone();
            thread::spawn(move || rt.free(p0).unwrap())
        };
        let other = {
            let rt = rt.clone();
            thread::spawn(move || {
                rt.free(p1).unwrap();
                rt.empty_cache().unwrap();
            })
        };
        freer.join().unwrap();
        other.join().unwrap();
        check_settled(&rt);
    });
}

#[test]
fn two_threads_run_out_of_memory_at_once_and_an_observer_frees() {
    loom::model(|| {
        // 24 MiB: one 20 MiB segment fits, two do not. A held 12 MiB block fills it; both
        // threads' 12 MiB requests run out of memory, and the observer frees the held block (at
        // most once). Neither thread may deadlock; everything settles.
        let rt = runtime(1, 24 * MIB, false);
        let held = Arc::new(Mutex::new(Some(rt.malloc(12 * MIB, 0, S0).unwrap())));
        let slot = Arc::new(Mutex::new(Some(rt.clone())));
        {
            let (slot, held) = (slot.clone(), held.clone());
            rt.attach_out_of_memory_observer(move |_| {
                let rt = slot.lock().unwrap().clone().expect("runtime alive");
                if let Some(p) = held.lock().unwrap().take() {
                    rt.free(p).unwrap();
                }
            });
        }
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let rt = rt.clone();
                thread::spawn(move || {
                    if let Ok(p) = rt.malloc(12 * MIB, 0, S0) {
                        rt.free(p).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        if let Some(p) = held.lock().unwrap().take() {
            rt.free(p).unwrap();
        }
        check_settled(&rt);
        slot.lock().unwrap().take();
    });
}

#[test]
fn a_fraction_change_races_a_malloc_with_the_lock_released() {
    loom::model(|| {
        // The malloc drops the allocator's lock around its device malloc; the fraction changes
        // meanwhile. Whatever the order, the malloc succeeds or runs out of memory, and the
        // reserve never passes what the device handed out. The 64 MiB device always fits the
        // 32 MiB segment (30 MiB and the 32-byte pad, in 2 MiB steps): running out can only be
        // the fraction's 16 MiB limit, read whole.
        let rt = runtime(1, 64 * MIB, true);
        let user = {
            let rt = rt.clone();
            thread::spawn(move || match rt.malloc(30 * MIB, 0, S0) {
                Ok(p) => rt.free(p).unwrap(),
                Err(npu_runtime::RuntimeError::Alloc(AllocError::OutOfMemory(oom))) => {
                    assert_eq!(
                        (oom.alloc_size, oom.allowed, oom.reserved),
                        (32 * MIB, Some(16 * MIB), 0)
                    );
                }
                Err(e) => panic!("{e}"),
            })
        };
        let limiter = {
            let rt = rt.clone();
            thread::spawn(move || {
                rt.set_per_process_memory_fraction(0.25, 0).unwrap();
                rt.set_per_process_memory_fraction(1.0, 0).unwrap();
            })
        };
        user.join().unwrap();
        limiter.join().unwrap();
        check_settled(&rt);
    });
}

#[test]
fn record_stream_races_free_and_event_processing() {
    loom::model(|| {
        let rt = runtime(1, 64 * MIB, false);
        let p = rt.malloc(1000, 0, S0).unwrap();
        let recorder = {
            let rt = rt.clone();
            // Before the free: an event is recorded at the free; after it: NotAllocated.
            thread::spawn(move || {
                if let Err(e) = rt.record_stream(p, SimStream(7)) {
                    assert!(
                        matches!(
                            e,
                            npu_runtime::RuntimeError::Free(
                                npu_runtime::FreeError::NotAllocated { .. }
                            )
                        ),
                        "{e}"
                    );
                }
            })
        };
        let freer = {
            let rt = rt.clone();
            thread::spawn(move || {
                rt.free(p).unwrap();
                sim::complete_all(&rt);
                rt.process_events(0).unwrap();
            })
        };
        recorder.join().unwrap();
        freer.join().unwrap();
        sim::complete_all(&rt);
        rt.process_events(0).unwrap();
        assert_eq!(rt.device_stats(0).unwrap().active_bytes.all.current, 0);
        check_settled(&rt);
    });
}

#[test]
fn set_allocator_settings_races_the_first_use_of_a_device() {
    // Whichever runs first, the device ends with the settings: opened before, the call applies
    // them; opened meanwhile, the device catches up after it reads the configuration.
    loom::model(|| {
        let mut config = Config::default();
        config.alloc.expandable_segments = true;
        let rt = Arc::new(sim::runtime(1, 64 * MIB, config));
        let switcher = {
            let rt = rt.clone();
            thread::spawn(move || {
                assert!(
                    rt.set_allocator_settings("expandable_segments:False")
                        .is_empty()
                );
            })
        };
        let p = rt.malloc(1000, 0, S0).unwrap();
        rt.free(p).unwrap();
        switcher.join().unwrap();
        assert!(!rt.allocator_settings(0).unwrap().expandable_segments);
        rt.empty_cache().unwrap();
        assert_eq!(rt.memory_reserved(0).unwrap(), 0);
    });
}

#[test]
fn pause_races_a_free_of_its_tag_and_a_malloc_in_another_pool() {
    // Whatever the interleaving: the freed block returns to its (paused) pool without touching
    // the device, the other pool's malloc is served, and resume brings everything back.
    loom::model(|| {
        let rt = Arc::new(sim::runtime(1, 64 * MIB, Config::default()));
        let w = {
            let _region = rt.region(0, "weights", true).unwrap();
            rt.malloc(1000, 0, S0).unwrap()
        };
        let pool = rt.create_pool(0).unwrap();
        let freer = {
            let rt = rt.clone();
            thread::spawn(move || rt.free(w).unwrap())
        };
        let other = {
            let rt = rt.clone();
            thread::spawn(move || {
                rt.begin_use_pool(0, pool).unwrap();
                let p = rt.malloc(1000, 0, S0).unwrap();
                rt.free(p).unwrap();
                rt.end_use_pool(0, pool).unwrap();
            })
        };
        assert_eq!(rt.pause(Some("weights")).unwrap(), 2 * MIB);
        freer.join().unwrap();
        other.join().unwrap();
        assert_eq!(rt.memory_allocated(0).unwrap(), 0);
        assert_eq!(rt.resume(Some("weights")).unwrap(), 2 * MIB);
        rt.release_pool(0, pool).unwrap();
        let stats = rt.memory_saver_stats(0).unwrap();
        assert_eq!(stats.paused_bytes.current, 0);
    });
}

#[test]
fn a_malloc_that_drains_the_host_queue_races_a_malloc_of_the_cached_block() {
    // torch_npu's task queue (`HostQueue::SyncFirst`): a malloc that must release cached memory
    // drops the lock, calls the synchronize hook, and takes the lock again. Meanwhile another
    // thread takes the cached block. 24 MiB: the cached 20 MiB segment and a new 22 MiB one do
    // not fit together, so whichever runs first, one malloc may run out of memory, never both,
    // and nothing deadlocks or leaks.
    loom::model(|| {
        let rt = runtime(1, 24 * MIB, false);
        let syncs = Arc::new(AtomicU64::new(0));
        let hook: npu_runtime::SyncHook = {
            let syncs = syncs.clone();
            std::sync::Arc::new(move |device| {
                assert_eq!(device, 0);
                syncs.fetch_add(1, Ordering::Relaxed);
                true
            })
        };
        rt.set_host_queue(npu_runtime::HostQueue::SyncFirst, Some(hook));
        let p = rt.malloc(12 * MIB, 0, S0).unwrap();
        rt.free(p).unwrap();
        let spawn = |bytes: u64| {
            let rt = rt.clone();
            thread::spawn(move || match rt.malloc(bytes, 0, S0) {
                Ok(p) => Some(p),
                Err(e) => {
                    assert!(e.is_out_of_memory(), "{e}");
                    None
                }
            })
        };
        let (large, cached) = (spawn(22 * MIB), spawn(12 * MIB));
        let (large, cached) = (large.join().unwrap(), cached.join().unwrap());
        assert!(large.is_some() || cached.is_some());
        // The large malloc released the cached segment only after a synchronize.
        if large.is_some() {
            assert!(syncs.load(Ordering::Relaxed) >= 1);
        }
        for p in [large, cached].into_iter().flatten() {
            rt.free(p).unwrap();
        }
        check_settled(&rt);
    });
}

#[test]
fn a_scope_routes_only_the_thread_that_opened_it() {
    // One thread allocates inside a private pool's scope while another allocates outside any:
    // the open-scope count is shared, the scopes are not, so the second thread's block comes
    // from the default pool (another segment), whatever the interleaving.
    loom::model(|| {
        let rt = runtime(1, 64 * MIB, false);
        let pool = rt.create_pool(0).unwrap();
        let scoped = {
            let rt = rt.clone();
            thread::spawn(move || {
                rt.begin_use_pool(0, pool).unwrap();
                let p = rt.malloc(1000, 0, S0).unwrap();
                rt.end_use_pool(0, pool).unwrap();
                p
            })
        };
        let plain = rt.malloc(1000, 0, S0).unwrap();
        let scoped = scoped.join().unwrap();
        // Each is the first block of its own 2 MiB small segment.
        assert!(scoped.abs_diff(plain) >= 2 * MIB, "{scoped:#x} {plain:#x}");
        rt.free(plain).unwrap();
        rt.free(scoped).unwrap();
        rt.release_pool(0, pool).unwrap();
        check_settled(&rt);
    });
}
