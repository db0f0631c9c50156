//! Cost of one malloc + free pair, with baselines measured in the same run so every figure can be
//! read as a ratio (`cargo xtask bench` prints them).
//!
//! - `core_hit/N`: a cache hit on `alloc-core` with N cached blocks of mixed sizes, both pools,
//!   timed interleaved with the same pair on a bare best-fit map (ordered set + hash map, no
//!   split, no stats: the least a best-fit cache can do; see `testkit::paired`).
//! - `core_hit_scaling/N`: the pair with N cached blocks interleaved with the pair with 16.
//! - `offset_allocator/N`: the `offset-allocator` crate (TLSF-style, O(1)) with N blocks live.
//! - `core_hit_fenced/N`: the pair on an allocator that really holds N cached blocks (each freed
//!   block between live ones, counted from a snapshot at set-up), timed interleaved with the
//!   same pair on `offset-allocator` holding the same population (`offset_allocator_fenced/N`).
//!   `core_hit/N` above holds far fewer free blocks than N (they merge, or the next allocation
//!   of their size takes them): read it as split/merge churn.
//! - `core_hit_fenced_scaling/65536`: the fenced pair at 65,536 blocks against 256.
//! - `core_split_merge`: a request carved from a larger cached block and merged back on free.
//! - `core_miss`: a miss that goes to the device, then `empty_cache` returns the segment.
//!
//! Replay throughput is the `replay` bench, a process of its own.

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use alloc_core::{AllocConf, Allocator, DeviceFacts};
use alloc_sim::{SimDevice, SimStream};
use alloc_trace::workload::{
    BestFit, cached_allocator, fenced_allocator, fenced_free_blocks, fenced_offset_allocator,
    hit_pair, hit_size, offset_units,
};
use criterion::{Criterion, criterion_group, criterion_main};
use testkit::paired::bench as paired;

/// Cached-block counts of the hit benchmarks.
const BLOCKS: [usize; 4] = [16, 256, 4096, 65536];

fn hits(c: &mut Criterion) {
    let (mut core16, _live16) = cached_allocator(16);
    for n in BLOCKS {
        let (mut alloc, _live) = cached_allocator(n);
        let mut map = BestFit::with_cached(n);
        paired(
            c,
            &format!("core_hit/{n}"),
            &format!("bestfit_hit/{n}"),
            |i| hit_pair(&mut alloc, i),
            |i| {
                let p = map.malloc(black_box(hit_size(i as usize))).unwrap();
                map.free(black_box(p));
            },
        );
        if n != 16 {
            paired(
                c,
                &format!("core_hit_scaling/{n}"),
                "core_hit/16",
                |i| hit_pair(&mut alloc, i),
                |i| hit_pair(&mut core16, i),
            );
        }
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

fn fenced(c: &mut Criterion) {
    let (mut core256, _live256) = fenced_allocator(256);
    for n in BLOCKS {
        let (mut alloc, _live) = fenced_allocator(n);
        assert_eq!(
            fenced_free_blocks(&alloc),
            n,
            "the set-up holds {n} cached blocks"
        );
        let mut oa = fenced_offset_allocator(n);
        paired(
            c,
            &format!("core_hit_fenced/{n}"),
            &format!("offset_allocator_fenced/{n}"),
            |i| hit_pair(&mut alloc, i),
            |i| {
                let a = oa
                    .allocate(black_box(offset_units(hit_size(i as usize))))
                    .unwrap();
                oa.free(black_box(a));
            },
        );
        if n == 65536 {
            paired(
                c,
                &format!("core_hit_fenced_scaling/{n}"),
                "core_hit_fenced/256",
                |i| hit_pair(&mut alloc, i),
                |i| hit_pair(&mut core256, i),
            );
        }
    }
}

fn split_merge(c: &mut Criterion) {
    let mut alloc = Allocator::new(
        SimDevice::new(1 << 40),
        &AllocConf::default(),
        DeviceFacts::cuda_parity(0),
    );
    // One cached 2 MiB small segment: each 4 KiB request splits it and the free merges it back.
    let warm = alloc.malloc(4096, SimStream(0)).unwrap();
    alloc.free(warm).unwrap();
    c.bench_function("core_split_merge", |b| {
        b.iter(|| {
            let p = alloc.malloc(black_box(4096), SimStream(0)).unwrap();
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
            let p = alloc.malloc(black_box(12 << 20), SimStream(0)).unwrap();
            alloc.free(p).unwrap();
            alloc.empty_cache().unwrap();
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = hits, fenced, split_merge, miss
}
criterion_main!(benches);
