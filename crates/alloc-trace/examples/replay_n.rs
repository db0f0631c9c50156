//! `cargo xtask bench --instructions` runs this under callgrind: the replay bench's synthetic
//! trace (`OPS` operations, default 200,000) replayed `N` times (default 1). Two runs with
//! different `N` give the instructions of one replayed operation, free of parsing and set-up, as
//! the difference over the difference of `N × OPS`.
//!
//! `replay_n N OPS streams` replays the three-stream trace of `replay_streams` instead.

use std::hint::black_box;

use alloc_core::AllocConf;
use alloc_trace::workload::{synthetic_stream_trace, synthetic_trace};

fn main() {
    let mut args = std::env::args().skip(1);
    let repeats: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let ops: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let text = if args.next().as_deref() == Some("streams") {
        synthetic_stream_trace(ops, 256, 42)
    } else {
        synthetic_trace(ops, 256, 42)
    };
    let trace = alloc_trace::parse_str("synthetic", &text).expect("the synthetic trace parses");
    let setup = alloc_trace::Setup::from_trace(&trace, AllocConf::default(), None, None);
    for _ in 0..repeats {
        black_box(alloc_trace::replay(&trace, &setup).expect("the synthetic trace replays"));
    }
}
