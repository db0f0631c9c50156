//! Throughput of the runtime's cache-hit pair from several threads: 1, 2 and 4 threads on one
//! device (they share its lock) and on one device each (nothing shared but the device table).
//! Each sample times `iters` pairs on every thread; `cargo xtask bench` prints the throughput
//! of t threads as a ratio to one thread's (t × time(1) / time(t)).

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use alloc_core::DeviceFacts;
use alloc_sim::{SimDevice, SimStream};
use alloc_trace::workload::hit_size;
use criterion::{Criterion, criterion_group, criterion_main};
use npu_runtime::{Config, Runtime};

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

/// `iters` pairs on each of `threads` threads; thread `t` uses device `device(t)`.
fn run(rt: &Runtime<SimDevice>, threads: u32, iters: u64, device: fn(u32) -> u32) -> Duration {
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
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        start.elapsed()
    })
}

fn threads(c: &mut Criterion) {
    let shared = runtime(1);
    let own = runtime(4);
    for t in [1u32, 2, 4] {
        c.bench_function(&format!("runtime_threads_same_device/{t}"), |b| {
            b.iter_custom(|iters| run(&shared, t, iters, |_| 0))
        });
        c.bench_function(&format!("runtime_threads_own_device/{t}"), |b| {
            b.iter_custom(|iters| run(&own, t, iters, |t| t))
        });
    }
}

criterion_group!(benches, threads);
criterion_main!(benches);
