//! Replay throughput: `alloc_trace::replay` of a 200,000-operation synthetic trace with the GPT-2
//! step's size mix (`alloc_trace::workload::synthetic_trace`), a fresh allocator each time,
//! reported per operation; `replay_streams`: the same on three streams with `record_stream`,
//! events and pending frees (`synthetic_stream_trace`); `replay_vs_offset_allocator`: the first
//! trace's replay timed interleaved with its allocs and frees on `offset-allocator`
//! (`OffsetReplay`), the reference the hit pairs are divided by, one whole replay each in turn.
//!
//! A process of its own: after the hit benches (65,536-block populations) the heap the
//! replay's own structures come from is fragmented, which costs it ~20% in the same process.

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use alloc_core::AllocConf;
use alloc_trace::workload::{OffsetReplay, synthetic_stream_trace, synthetic_trace};
use criterion::{BatchSize, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use testkit::paired::Paired;

/// Operations in the trace (`cargo xtask bench` divides by the same number).
const OPS: usize = 200_000;

fn replay(c: &mut Criterion) {
    let text = synthetic_trace(OPS, 256, 42);
    bench(c, "replay", &text);
    // The same size mix on three streams, with record_stream, pending frees and events.
    bench(c, "replay_streams", &synthetic_stream_trace(OPS, 256, 42));
    versus_offset(c, &text);
}

fn versus_offset(c: &mut Criterion, text: &str) {
    let trace = alloc_trace::parse_str("synthetic", text).unwrap();
    let setup = alloc_trace::Setup::from_trace(&trace, AllocConf::default(), None, None);
    let reference = OffsetReplay::new(&trace);
    assert_eq!(
        reference.len(),
        OPS,
        "every operation is an alloc or a free"
    );
    assert_eq!(reference.run(), 0, "offset-allocator fits the trace");
    let id = format!("replay_vs_offset_allocator/{OPS}");
    let mut pair = Paired::with_chunk(&id, &format!("offset_allocator_replay/{OPS}"), 1);
    let mut group = c.benchmark_group("replay_vs_offset_allocator");
    group.throughput(Throughput::Elements(OPS as u64));
    group.sample_size(20).sampling_mode(SamplingMode::Flat);
    group.bench_function(format!("{OPS}"), |b| {
        b.iter_custom(|iters| {
            pair.run(
                iters,
                |_| {
                    black_box(alloc_trace::replay(&trace, &setup).unwrap());
                },
                |_| {
                    black_box(reference.run());
                },
            )
        })
    });
    group.finish();
    pair.save().expect("writing the paired result");
}

fn bench(c: &mut Criterion, name: &str, text: &str) {
    let trace = alloc_trace::parse_str("synthetic", text).unwrap();
    let setup = alloc_trace::Setup::from_trace(&trace, AllocConf::default(), None, None);
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(OPS as u64));
    // Flat sampling: twenty samples of the same iteration count fit the quick run's one second,
    // where linear sampling's 1 + 2 + ... + 20 iterations would not.
    group.sample_size(20).sampling_mode(SamplingMode::Flat);
    group.bench_function(format!("{OPS}"), |b| {
        b.iter_batched(
            || (),
            |()| alloc_trace::replay(&trace, &setup).unwrap(),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, replay);
criterion_main!(benches);
