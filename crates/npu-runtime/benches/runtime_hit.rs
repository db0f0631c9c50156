//! Cost of one malloc + free cache hit through the runtime: device lookup, the per-device lock,
//! the event poll, the address routing of `free` and the policy core. It is timed interleaved
//! with the same pair on the bare `alloc-core` allocator (alloc-core's `core_hit/16` population;
//! see `testkit::paired`), so `cargo xtask bench` divides one by the other without run-to-run
//! noise.

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use alloc_core::{Device, DeviceError, MemInfo, StreamId};
use criterion::{Criterion, criterion_group, criterion_main};
use npu_runtime::{Backend, Config, Runtime};
use testkit::workload::{cached_allocator, hit_size};
use testkit::{Paired, SimDevice, SimError};

/// One simulated device with unlimited memory and no pad, like `core_hit`'s allocator.
struct SimBackend;

impl Backend for SimBackend {
    type Device = SimDevice;
    type Error = SimError;
    type Stream = u64;

    fn device_count(&self) -> u32 {
        1
    }
    fn open(&self, _index: u32) -> Result<SimDevice, SimError> {
        Ok(SimDevice::new(u64::MAX / 2))
    }
    fn stream_id(stream: u64) -> StreamId {
        StreamId(stream)
    }
    fn raw_malloc(&self, _index: u32, bytes: u64) -> Result<u64, DeviceError<SimError>> {
        SimDevice::new(u64::MAX / 2).malloc(bytes)
    }
    fn raw_free(&self, _index: u32, _addr: u64, _bytes: u64) -> Result<(), SimError> {
        Ok(())
    }
    fn synchronize(&self, _index: u32) -> Result<(), SimError> {
        Ok(())
    }
    fn mem_get_info(&self, _index: u32) -> Result<MemInfo, SimError> {
        Ok(MemInfo {
            free: u64::MAX / 2,
            total: u64::MAX / 2,
        })
    }
    fn pad(&self) -> u64 {
        0
    }
}

fn runtime_hit(c: &mut Criterion) {
    let (mut core, _live) = cached_allocator(16);
    let rt = Runtime::new(SimBackend, Config::default());
    // The population of `core_hit/16`: 16 free blocks, each between two live ones.
    let mut live = Vec::new();
    for j in 0..16 {
        live.push(rt.malloc(hit_size(j), 0, 0).unwrap());
        let hole = rt.malloc(hit_size(j), 0, 0).unwrap();
        rt.free(hole).unwrap();
    }
    let mut pair = Paired::new("runtime_hit", "core_hit/16");
    c.bench_function("runtime_hit", |b| {
        b.iter_custom(|iters| {
            pair.run(
                iters,
                |i| {
                    let p = rt.malloc(black_box(hit_size(i as usize)), 0, 0).unwrap();
                    rt.free(black_box(p)).unwrap();
                },
                |i| {
                    let p = core
                        .malloc(black_box(hit_size(i as usize)), StreamId(0))
                        .unwrap();
                    core.free(black_box(p)).unwrap();
                },
            )
        })
    });
    pair.save().expect("writing the paired result");
}

criterion_group!(benches, runtime_hit);
criterion_main!(benches);
