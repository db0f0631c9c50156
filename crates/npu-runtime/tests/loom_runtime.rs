//! Loom models of the runtime's locking: the real [`Runtime`] (its `sync` module switched to
//! loom's types) over a mock [`Backend`] whose device state and events are loom objects.
//!
//! Run with `cargo xtask loom` (`RUSTFLAGS="--cfg loom"`, release, `LOOM_MAX_PREEMPTIONS=2`).
#![cfg(loom)]

use std::collections::BTreeMap;

use alloc_core::{Device, DeviceError, MemInfo, StreamId};
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use npu_runtime::{Backend, Config, Runtime};

const MIB: u64 = 1 << 20;

/// The simulated device: capacity, live segments, every event ever recorded.
struct Memory {
    capacity: u64,
    used: u64,
    next: u64,
    segments: BTreeMap<u64, u64>,
    events: Vec<Arc<AtomicBool>>,
}

/// A backend over shared loom state: its devices (the second field) share one memory and one
/// address counter, so their addresses interleave.
#[derive(Clone)]
struct Mock(Arc<Mutex<Memory>>, u32);

impl Mock {
    fn new(capacity: u64) -> Mock {
        Mock::with_devices(capacity, 1)
    }

    fn with_devices(capacity: u64, devices: u32) -> Mock {
        let memory = Memory {
            capacity,
            used: 0,
            next: 0x1000_0000,
            segments: BTreeMap::new(),
            events: Vec::new(),
        };
        Mock(Arc::new(Mutex::new(memory)), devices)
    }

    fn used(&self) -> u64 {
        self.0.lock().unwrap().used
    }

    /// The work before every event recorded so far has finished.
    fn complete_all(&self) {
        let events = self.0.lock().unwrap().events.clone();
        for e in events {
            e.store(true, Ordering::Release);
        }
    }
}

/// A mock failure (never produced: the models only run out of memory).
#[derive(Debug)]
struct MockError;

impl std::fmt::Display for MockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("mock device error")
    }
}

impl Device for Mock {
    type Event = Arc<AtomicBool>;
    type Error = MockError;

    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError<MockError>> {
        let mut m = self.0.lock().unwrap();
        if m.used + bytes > m.capacity {
            return Err(DeviceError::OutOfMemory);
        }
        let addr = m.next;
        m.next += bytes;
        m.used += bytes;
        m.segments.insert(addr, bytes);
        Ok(addr)
    }

    fn free(&mut self, addr: u64, bytes: u64) -> Result<(), MockError> {
        let mut m = self.0.lock().unwrap();
        assert_eq!(
            m.segments.remove(&addr),
            Some(bytes),
            "free of a live segment"
        );
        m.used -= bytes;
        Ok(())
    }

    fn mem_info(&mut self) -> Option<MemInfo> {
        let m = self.0.lock().unwrap();
        Some(MemInfo {
            free: m.capacity - m.used,
            total: m.capacity,
        })
    }

    fn record_event(&mut self, _stream: StreamId) -> Result<Self::Event, MockError> {
        let event = Arc::new(AtomicBool::new(false));
        self.0.lock().unwrap().events.push(event.clone());
        Ok(event)
    }

    fn event_done(&mut self, event: &Self::Event) -> Result<bool, MockError> {
        Ok(event.load(Ordering::Acquire))
    }

    fn release_event(&mut self, _event: Self::Event) {}

    fn synchronize(&mut self) -> Result<(), MockError> {
        self.complete_all();
        Ok(())
    }
}

impl Backend for Mock {
    type Device = Mock;
    type Error = MockError;
    type Stream = u64;

    fn device_count(&self) -> u32 {
        self.1
    }

    fn open(&self, _index: u32) -> Result<Mock, MockError> {
        Ok(self.clone())
    }

    fn stream_id(stream: u64) -> StreamId {
        StreamId(stream)
    }

    fn raw_malloc(&self, _index: u32, bytes: u64) -> Result<u64, DeviceError<MockError>> {
        self.clone().malloc(bytes)
    }

    fn raw_free(&self, _index: u32, addr: u64, bytes: u64) -> Result<(), MockError> {
        self.clone().free(addr, bytes)
    }

    fn synchronize(&self, _index: u32) -> Result<(), MockError> {
        Device::synchronize(&mut self.clone())
    }

    fn mem_get_info(&self, _index: u32) -> Result<MemInfo, MockError> {
        Ok(self.clone().mem_info().expect("mock reports memory"))
    }
}

fn runtime(mock: &Mock, release_lock: bool) -> Arc<Runtime<Mock>> {
    let mut config = Config::default();
    config.alloc.release_lock_on_npumalloc = release_lock;
    Arc::new(Runtime::new(mock.clone(), config))
}

/// After the threads: nothing allocated, the allocators' reserves add up to the device's, and
/// `empty_cache` gives everything back.
fn check_settled(rt: &Runtime<Mock>, mock: &Mock) {
    let devices = 0..rt.device_count();
    let total = |f: &dyn Fn(u32) -> u64| devices.clone().map(f).sum::<u64>();
    assert_eq!(total(&|d| rt.memory_allocated(d).unwrap()), 0);
    assert_eq!(total(&|d| rt.memory_reserved(d).unwrap()), mock.used());
    rt.empty_cache().unwrap();
    assert_eq!(total(&|d| rt.memory_reserved(d).unwrap()), 0);
    assert_eq!(mock.used(), 0);
}

fn malloc_free_threads(threads: usize, release_lock: bool) {
    loom::model(move || {
        let mock = Mock::new(64 * MIB);
        let rt = runtime(&mock, release_lock);
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let rt = rt.clone();
                thread::spawn(move || {
                    let p = rt.malloc(1000 + i as u64, 0, 0).unwrap();
                    rt.free(p).unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        check_settled(&rt, &mock);
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
        let mock = Mock::with_devices(64 * MIB, 2);
        let rt = runtime(&mock, false);
        let handoff = Arc::new(Mutex::new(None));
        // Opens device 1 and widens its span while the consumer opens device 0 and routes
        // frees past device 1's span.
        let producer = {
            let (rt, handoff) = (rt.clone(), handoff.clone());
            thread::spawn(move || {
                let p = rt.malloc(1000, 1, 0).unwrap();
                *handoff.lock().unwrap() = Some(p);
            })
        };
        let consumer = {
            let (rt, handoff) = (rt.clone(), handoff.clone());
            thread::spawn(move || {
                let q = rt.malloc(3000, 0, 0).unwrap();
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
        check_settled(&rt, &mock);
    });
}

#[test]
fn a_pointer_handed_over_with_relaxed_atomics_is_freed_on_its_device() {
    loom::model(|| {
        let mock = Mock::with_devices(64 * MIB, 2);
        let rt = runtime(&mock, false);
        // Both devices open, each with a span.
        let keep: Vec<u64> = (0..2).map(|d| rt.malloc(1000, d, 0).unwrap()).collect();
        let shared = Arc::new(AtomicU64::new(0));
        // A new segment above device 1's span; the consumer may see the pointer before the
        // span grew (nothing orders a relaxed handoff), and must still find the owner.
        let producer = {
            let (rt, shared) = (rt.clone(), shared.clone());
            thread::spawn(move || {
                let p = rt.malloc(3 * MIB, 1, 0).unwrap();
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
        check_settled(&rt, &mock);
    });
}

#[test]
fn free_of_recorded_block_races_event_completion() {
    loom::model(|| {
        let mock = Mock::new(64 * MIB);
        let rt = runtime(&mock, false);
        let p = rt.malloc(1000, 0, 0).unwrap();
        rt.record_stream(p, 7).unwrap();
        let freer = {
            let rt = rt.clone();
            thread::spawn(move || rt.free(p).unwrap())
        };
        let completer = {
            let mock = mock.clone();
            thread::spawn(move || mock.complete_all())
        };
        freer.join().unwrap();
        completer.join().unwrap();
        // The event may have been recorded after the completer ran: finish it too.
        mock.complete_all();
        rt.process_events(0).unwrap();
        let stats = rt.device_stats(0).unwrap();
        assert_eq!(stats.active_bytes.all.current, 0);
        assert_eq!(rt.malloc(1000, 0, 0).unwrap(), p, "the block is reusable");
        rt.free(p).unwrap();
        check_settled(&rt, &mock);
    });
}

#[test]
fn empty_cache_races_malloc() {
    loom::model(|| {
        let mock = Mock::new(64 * MIB);
        let rt = runtime(&mock, false);
        let user = {
            let rt = rt.clone();
            thread::spawn(move || {
                let p = rt.malloc(12 * MIB, 0, 0).unwrap();
                rt.free(p).unwrap();
            })
        };
        let emptier = {
            let rt = rt.clone();
            thread::spawn(move || rt.empty_cache().unwrap())
        };
        user.join().unwrap();
        emptier.join().unwrap();
        check_settled(&rt, &mock);
    });
}

#[test]
fn oom_observer_allocates_again_without_deadlock() {
    loom::model(|| {
        // 3 MiB: a 2 MiB small segment fits, a 20 MiB large one never does.
        let mock = Mock::new(3 * MIB);
        let rt = runtime(&mock, false);
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
                let p = rt.malloc(512, 0, 0).unwrap();
                rt.free(p).unwrap();
                observed.store(true, Ordering::Release);
            });
        }
        let big = {
            let rt = rt.clone();
            thread::spawn(move || assert!(rt.malloc(5 * MIB, 0, 0).unwrap_err().is_out_of_memory()))
        };
        let small = {
            let rt = rt.clone();
            thread::spawn(move || {
                let p = rt.malloc(1000, 0, 0).unwrap();
                rt.free(p).unwrap();
            })
        };
        big.join().unwrap();
        small.join().unwrap();
        assert!(observed.load(Ordering::Acquire));
        check_settled(&rt, &mock);
        slot.lock().unwrap().take();
    });
}
