//! Cost of one malloc + free pair, with baselines measured in the same run so every figure can be
//! read as a ratio (`cargo xtask bench` prints them).
//!
//! - `core_hit/N`: a cache hit on `alloc-core` with N cached blocks of mixed sizes, both pools.
//! - `bestfit_hit/N`: the same on a bare best-fit map (ordered set + hash map, no split, no
//!   stats): the least a best-fit cache can do.
//! - `offset_allocator/N`: the `offset-allocator` crate (TLSF-style, O(1)) with N blocks live.
//! - `core_split_merge`: a request carved from a larger cached block and merged back on free.
//! - `core_miss`: a miss that goes to the device, then `empty_cache` returns the segment.
//! - `replay/200000`: replay of a 200,000-operation synthetic trace (throughput per op).

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use alloc_core::{AllocConf, Allocator, DeviceFacts, StreamId};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use testkit::SimDevice;
use testkit::workload::{BestFit, cached_allocator, hit_size, synthetic_trace};

/// Cached-block counts of the hit benchmarks.
const BLOCKS: [usize; 4] = [16, 256, 4096, 65536];

fn hits(c: &mut Criterion) {
    for n in BLOCKS {
        let (mut alloc, _live) = cached_allocator(n);
        let mut i = 0;
        c.bench_function(&format!("core_hit/{n}"), |b| {
            b.iter(|| {
                i += 1;
                let p = alloc.malloc(black_box(hit_size(i)), StreamId(0)).unwrap();
                alloc.free(black_box(p)).unwrap();
            })
        });
        let mut map = BestFit::with_cached(n);
        let mut i = 0;
        c.bench_function(&format!("bestfit_hit/{n}"), |b| {
            b.iter(|| {
                i += 1;
                let p = map.malloc(black_box(hit_size(i))).unwrap();
                map.free(black_box(p));
            })
        });
        // offset-allocator counts in u32 units: 4 KiB units keep 2N blocks of up to 64 MiB in range.
        let unit = |size: u64| (size.div_ceil(4096)) as u32;
        let mut oa =
            offset_allocator::Allocator::<u32>::with_max_allocs(u32::MAX, 2 * n as u32 + 16);
        let mut keep = Vec::with_capacity(n);
        for j in 0..n {
            keep.push(oa.allocate(unit(hit_size(j))).unwrap());
            let hole = oa.allocate(unit(hit_size(j))).unwrap();
            oa.free(hole);
        }
        let mut i = 0;
        c.bench_function(&format!("offset_allocator/{n}"), |b| {
            b.iter(|| {
                i += 1;
                let a = oa.allocate(black_box(unit(hit_size(i)))).unwrap();
                oa.free(black_box(a));
            })
        });
    }
}

fn split_merge(c: &mut Criterion) {
    let mut alloc = Allocator::new(
        SimDevice::new(1 << 40),
        &AllocConf::default(),
        DeviceFacts::cuda_parity(0),
    );
    // One cached 2 MiB small segment: each 4 KiB request splits it and the free merges it back.
    let warm = alloc.malloc(4096, StreamId(0)).unwrap();
    alloc.free(warm).unwrap();
    c.bench_function("core_split_merge", |b| {
        b.iter(|| {
            let p = alloc.malloc(black_box(4096), StreamId(0)).unwrap();
            alloc.free(black_box(p)).unwrap();
        })
    });
}

fn miss(c: &mut Criterion) {
    let mut alloc = Allocator::new(
        SimDevice::new(1 << 40),
        &AllocConf::default(),
        DeviceFacts::cuda_parity(0),
    );
    c.bench_function("core_miss", |b| {
        b.iter(|| {
            let p = alloc.malloc(black_box(12 << 20), StreamId(0)).unwrap();
            alloc.free(p).unwrap();
            alloc.empty_cache().unwrap();
        })
    });
}

fn replay(c: &mut Criterion) {
    const OPS: usize = 200_000;
    let text = synthetic_trace(OPS, 256, 42);
    let trace = testkit::trace::parse_str("synthetic", &text).unwrap();
    let setup = testkit::Setup::from_trace(&trace, AllocConf::default(), None, None);
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(OPS as u64));
    group.sample_size(10);
    group.bench_function(format!("{OPS}"), |b| {
        b.iter_batched(
            || (),
            |()| testkit::replay(&trace, &setup).unwrap(),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = hits, split_merge, miss, replay
}
criterion_main!(benches);
