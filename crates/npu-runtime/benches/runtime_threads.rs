//! Throughput of the runtime's cache-hit pair from several threads: 1, 2 and 4 threads on one
//! device (they share its lock) and on one device each (nothing shared but the device table).
//! Each sample times `iters` pairs on every thread; `cargo xtask bench` prints the throughput
//! of t threads as a ratio to one thread's (t × time(1) / time(t)), and when the first thread
//! finished against the last (`.../first_finish`): throughput alone flatters a lock that lets
//! one thread keep it while the others wait.

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use alloc_core::DeviceFacts;
use alloc_sim::{SimDevice, SimStream};
use alloc_trace::workload::hit_size;
use criterion::{Criterion, criterion_group, criterion_main};
use npu_runtime::{Config, Runtime};
use testkit::paired::Paired;

const S0: SimStream = SimStream(0);

/// A runtime over `devices` simulated devices, each warmed with the `core_hit/16` population.
fn runtime(devices: u32) -> Runtime<SimDevice> {
    let rt = Runtime::new(
        devices,
        // Disjoint address ranges, as on real devices: a free is routed by its address.
        |i| {
            let device = SimDevice::new(1 << 40).with_base_address((u64::from(i) + 1) << 44);
            Ok((device, DeviceFacts::cuda_parity(i)))
        },
        Config::default(),
    );
    for d in 0..devices {
        for j in 0..16 {
            // Kept live for the bench's life.
            rt.malloc(hit_size(j), d, S0).unwrap();
            let hole = rt.malloc(hit_size(j), d, S0).unwrap();
            rt.free(hole).unwrap();
        }
    }
    rt
}

/// `iters` pairs on each of `threads` threads; thread `t` uses device `device(t)`. Returns the
/// time until the first thread had done its pairs and until the last had.
fn run(
    rt: &Runtime<SimDevice>,
    threads: u32,
    iters: u64,
    device: fn(u32) -> u32,
) -> (Duration, Duration) {
    std::thread::scope(|s| {
        let start = Instant::now();
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    for i in 0..iters {
                        let p = rt
                            .malloc(black_box(hit_size(i as usize)), device(t), S0)
                            .unwrap();
                        rt.free(black_box(p)).unwrap();
                    }
                    start.elapsed()
                })
            })
            .collect();
        let finished: Vec<Duration> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let first = finished.iter().min().copied().unwrap_or_default();
        (first, start.elapsed())
    })
}

/// A case: its name, its runtime and the device each thread uses.
type Setup<'a> = (&'static str, &'a Runtime<SimDevice>, fn(u32) -> u32);

fn threads(c: &mut Criterion) {
    let shared = runtime(1);
    let own = runtime(4);
    for t in [1u32, 2, 4] {
        let cases: [Setup<'_>; 2] = [("same_device", &shared, |_| 0), ("own_device", &own, |t| t)];
        for (kind, rt, device) in cases {
            let id = format!("runtime_threads_{kind}/{t}");
            // When the first thread finished against when the last did, in the same runs: 1.0
            // when the threads shared the device evenly, 1/t when they ran one after another
            // (a lock that lets one thread keep it scores well on throughput alone).
            let mut finish = Paired::new(&format!("{id}/first_finish"), "the last thread");
            c.bench_function(&id, |b| {
                b.iter_custom(|iters| {
                    let (first, last) = run(rt, t, iters, device);
                    finish.record(iters, first, last);
                    last
                })
            });
            if t > 1 {
                finish.save().expect("writing the finish times");
            }
        }
    }
}

criterion_group!(benches, threads);
criterion_main!(benches);
