//! Cost of one malloc + free cache hit through the runtime: device lookup, the per-device lock,
//! the event poll, the address routing of `free` and the policy core. It is timed interleaved
//! with the same pair on the bare `alloc-core` allocator (alloc-core's `core_hit/16` population;
//! see `testkit::paired`), so `cargo xtask bench` divides one by the other without run-to-run
//! noise.
//!
//! `runtime_lock_floor` is what a runtime with this lock per device cannot go below: the same
//! core pair plus two uncontended lock/unlock pairs of the runtime's lock (`RuntimeLock`,
//! `npu-runtime/src/sync.rs`; malloc and free each take it once), interleaved with the bare
//! pair. Its ratio is the floor of `runtime_hit`'s on this machine.

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use alloc_core::DeviceFacts;
use alloc_sim::{SimDevice, SimStream};
use alloc_trace::workload::{cached_allocator, hit_pair, hit_size};
use criterion::{Criterion, criterion_group, criterion_main};
use npu_runtime::{Config, Runtime};
use testkit::paired::bench as paired;

const S0: SimStream = SimStream(0);

fn runtime_hit(c: &mut Criterion) {
    let (mut core, _live) = cached_allocator(16);
    // One simulated device with unlimited memory and no pad, like `core_hit`'s allocator.
    let rt = Runtime::new(
        1,
        |i| Ok((SimDevice::new(u64::MAX / 2), DeviceFacts::cuda_parity(i))),
        Config::default(),
    );
    // The population of `core_hit/16` (`cached_allocator(16)`), built through the runtime.
    let mut live = Vec::new();
    for j in 0..16 {
        live.push(rt.malloc(hit_size(j), 0, S0).unwrap());
        let hole = rt.malloc(hit_size(j), 0, S0).unwrap();
        rt.free(hole).unwrap();
    }
    paired(
        c,
        "runtime_hit",
        "core_hit/16",
        |i| {
            let p = rt.malloc(black_box(hit_size(i as usize)), 0, S0).unwrap();
            rt.free(black_box(p)).unwrap();
        },
        |i| hit_pair(&mut core, i),
    );

    let (mut floor_core, _live) = cached_allocator(16);
    let (mut bare_core, _live) = cached_allocator(16);
    let lock = npu_runtime::RuntimeLock::new(0u64);
    paired(
        c,
        "runtime_lock_floor",
        "core_hit/16",
        |i| {
            // Each side of the pair takes the lock once, as the runtime's malloc and free do.
            *black_box(&lock).lock() += 1;
            let p = floor_core
                .malloc(black_box(hit_size(i as usize)), S0)
                .unwrap();
            *black_box(&lock).lock() += 1;
            floor_core.free(black_box(p)).unwrap();
        },
        |i| hit_pair(&mut bare_core, i),
    );
}

criterion_group!(benches, runtime_hit);
criterion_main!(benches);
