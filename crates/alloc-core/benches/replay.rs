//! Replay throughput: `alloc_trace::replay` of a 200,000-operation synthetic trace with the GPT-2
//! step's size mix (`alloc_trace::workload::synthetic_trace`), a fresh allocator each time,
//! reported per operation; `replay_streams`: the same on three streams with `record_stream`,
//! events and pending frees (`synthetic_stream_trace`).
//!
//! A process of its own: after the hit benches (65,536-block populations) the heap the
//! replay's own structures come from is fragmented, which costs it ~20% in the same process.

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use alloc_core::AllocConf;
use alloc_trace::workload::{synthetic_stream_trace, synthetic_trace};
use criterion::{BatchSize, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};

/// Operations in the trace (`cargo xtask bench` divides by the same number).
const OPS: usize = 200_000;

fn replay(c: &mut Criterion) {
    bench(c, "replay", &synthetic_trace(OPS, 256, 42));
    // The same size mix on three streams, with record_stream, pending frees and events.
    bench(c, "replay_streams", &synthetic_stream_trace(OPS, 256, 42));
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
