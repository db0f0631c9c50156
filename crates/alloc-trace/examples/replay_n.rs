//! `cargo xtask bench --instructions` runs this under callgrind: `replay_n N` replays the
//! replay bench's 200,000-operation synthetic trace until `N` operations have run (`N` a
//! multiple of 200,000), each replay with a fresh allocator as in the bench. Two runs with
//! different `N` give the instructions of one replayed operation, free of parsing and set-up, as
//! the difference over the difference of `N`.
//!
//! `replay_n N streams` replays the three-stream trace of `replay_streams` instead; `replay_n N
//! offset` runs the first trace's allocs and frees on offset-allocator (`OffsetReplay`), the
//! reference of `replay_vs_offset_allocator`.

use std::hint::black_box;

use alloc_core::AllocConf;
use alloc_trace::workload::{OffsetReplay, synthetic_stream_trace, synthetic_trace};

/// Operations in the trace, as in the replay bench.
const OPS: usize = 200_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let total: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(OPS);
    let mode = args.next();
    let text = if mode.as_deref() == Some("streams") {
        synthetic_stream_trace(OPS, 256, 42)
    } else {
        synthetic_trace(OPS, 256, 42)
    };
    let trace = alloc_trace::parse_str("synthetic", &text).expect("the synthetic trace parses");
    if mode.as_deref() == Some("offset") {
        let reference = OffsetReplay::new(&trace);
        for _ in 0..total.div_ceil(OPS) {
            assert_eq!(
                black_box(reference.run()),
                0,
                "offset-allocator fits the trace"
            );
        }
        return;
    }
    let setup = alloc_trace::Setup::from_trace(&trace, AllocConf::default(), None, None);
    for _ in 0..total.div_ceil(OPS) {
        black_box(alloc_trace::replay(&trace, &setup).expect("the synthetic trace replays"));
    }
}
