//! `cargo xtask instructions` runs this under callgrind: `N` cache-hit malloc + free pairs on an
//! allocator holding 256 cached blocks (the `core_hit/256` population). Two runs with different
//! `N` give the instructions of one pair, free of the set-up's, as the difference over the
//! difference of `N`: a hot-path cost figure that wall time on a shared machine cannot give.

use std::hint::black_box;

use alloc_sim::SimStream;
use alloc_trace::workload::{cached_allocator, hit_size};

fn main() {
    let pairs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let (mut alloc, _live) = cached_allocator(256);
    for i in 0..pairs {
        let p = alloc
            .malloc(black_box(hit_size(i as usize)), SimStream(0))
            .expect("a cache hit");
        alloc.free(black_box(p)).expect("just allocated");
    }
    black_box(alloc.stats().allocation.all.current);
}
