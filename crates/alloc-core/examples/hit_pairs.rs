//! `cargo xtask bench --instructions` runs this under callgrind: `N` cache-hit malloc + free
//! pairs on an allocator holding cached blocks. Two runs with different `N` give the
//! instructions of one pair, free of the set-up's, as the difference over the difference of
//! `N`: a hot-path cost figure that wall time on a shared machine cannot give.
//!
//! `hit_pairs N` uses the split/merge churn population (`core_hit/256`); `hit_pairs N fenced B`
//! the fenced one with `B` cached blocks (`core_hit_fenced/B`); `hit_pairs N offset B` the same
//! population in `offset-allocator` (`offset_allocator_fenced/B`), the reference.

use std::hint::black_box;

use alloc_trace::workload::{
    cached_allocator, fenced_allocator, fenced_offset_allocator, hit_pair, hit_size, offset_units,
};

fn main() {
    let mut args = std::env::args().skip(1);
    let pairs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let mode = args.next();
    let blocks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    if mode.as_deref() == Some("offset") {
        let mut oa = fenced_offset_allocator(blocks);
        for i in 0..pairs {
            let a = oa
                .allocate(black_box(offset_units(hit_size(i as usize))))
                .expect("a cached block");
            oa.free(black_box(a));
        }
        return;
    }
    let fenced = mode.as_deref() == Some("fenced");
    let (mut alloc, _live) = if fenced {
        fenced_allocator(blocks)
    } else {
        cached_allocator(blocks)
    };
    for i in 0..pairs {
        hit_pair(&mut alloc, i);
    }
    black_box(alloc.stats().allocation.all.current);
}
