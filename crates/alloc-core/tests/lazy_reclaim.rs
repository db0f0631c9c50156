//! torch_npu's `multi_stream_lazy_reclaim:True`: a malloc polls the events of cross-stream
//! frees at its start only when more than 512 are pending (`kLazyQuerySize`); otherwise it polls
//! them after its pool had no block for it, and searches the pool again, unless it already
//! polled at its start (`reaped`).

mod common;

use alloc_core::AllocConf;
use common::*;

const MIB_32: u64 = MIB - 32;

/// Frees `n` allocations of 1,000 bytes, each used on `streams` too, in small segments (each
/// freed block pending on one event per stream), and keeps a live neighbour between them so
/// that none merges. Returns the addresses of the pending blocks.
fn pending_frees(
    a: &mut alloc_core::Allocator<alloc_sim::TestDevice>,
    n: usize,
    streams: &[alloc_sim::SimStream],
) -> Vec<u64> {
    let mut pending = Vec::new();
    for _ in 0..n {
        let x = a.malloc(1000, S0).unwrap();
        let _fence = a.malloc(1000, S0).unwrap();
        for &s in streams {
            a.record_stream(x, s).unwrap();
        }
        a.free(x).unwrap();
        pending.push(x);
    }
    pending
}

#[test]
fn a_hit_polls_no_event_while_512_or_fewer_are_pending() {
    let mut lazy = npu(GIB, &conf("multi_stream_lazy_reclaim:True"));
    let mut eager = npu(GIB, &AllocConf::default());
    for a in [&mut lazy, &mut eager] {
        let x = pending_frees(a, 1, &[S1])[0];
        a.device_mut().complete_all();
        let queries = a.device().event_done_calls();
        let y = a.malloc(1000, S0).unwrap();
        if a.conf().multi_stream_lazy_reclaim {
            // The completed event is not polled: the block stays pending, and the hit is the
            // rest of the segment, after the fence.
            assert_eq!(a.device().event_done_calls(), queries);
            assert_eq!(y, x + 2 * 1536);
            assert_eq!(stat(a, "active.all.current"), 3);
        } else {
            // torch's malloc polls first: the block is back and is the best fit.
            assert_eq!(a.device().event_done_calls(), queries + 1);
            assert_eq!(y, x);
            assert_eq!(stat(a, "active.all.current"), 2);
        }
        check_consistency(a);
    }
}

#[test]
fn a_miss_polls_the_events_and_searches_the_pool_again() {
    let mut a = npu(GIB, &conf("multi_stream_lazy_reclaim:True"));
    // A 2 MiB small segment filled by two 1 MiB blocks; the first is freed while used on S1.
    let x = a.malloc(MIB_32, S0).unwrap();
    let _w = a.malloc(MIB_32, S0).unwrap();
    a.record_stream(x, S1).unwrap();
    a.free(x).unwrap();
    a.device_mut().complete_all();
    // The pool has no block at the start: the miss polls (one query), and the second search
    // finds the returned block, so no segment is made.
    assert_eq!(a.malloc(MIB_32, S0).unwrap(), x);
    assert_eq!(a.device().event_done_calls(), 1);
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    assert_eq!(a.pending_events(), 0);
    check_consistency(&a);
}

#[test]
fn more_than_512_pending_are_polled_at_the_start() {
    let mut a = npu(GIB, &conf("multi_stream_lazy_reclaim:True"));
    let pending = pending_frees(&mut a, 513, &[S1]);
    a.device_mut().complete_all();
    // 513 pending: the malloc polls them all before its search, and takes the lowest block.
    assert_eq!(a.malloc(1000, S0).unwrap(), pending[0]);
    assert_eq!(a.device().event_done_calls(), 513);
    assert_eq!(a.pending_events(), 0);
    check_consistency(&a);

    // Exactly 512: a hit polls none of them.
    let mut b = npu(GIB, &conf("multi_stream_lazy_reclaim:True"));
    let pending = pending_frees(&mut b, 512, &[S1]);
    b.device_mut().complete_all();
    let y = b.malloc(1000, S0).unwrap();
    assert!(!pending.contains(&y));
    assert_eq!(b.device().event_done_calls(), 0);
    assert_eq!(b.pending_events(), 512);
    check_consistency(&b);
}

#[test]
fn a_malloc_that_polled_at_its_start_does_not_poll_again_at_its_miss() {
    // Events on two streams, none complete: each poll queries the front of each stream once.
    let mut reaped = npu(GIB, &conf("multi_stream_lazy_reclaim:True"));
    pending_frees(&mut reaped, 257, &[S1, S2]);
    assert_eq!(reaped.pending_events(), 514);
    // A large request misses: polled once at the start (514 > 512), not again at the miss.
    reaped.malloc(4 * MIB, S0).unwrap();
    assert_eq!(reaped.device().event_done_calls(), 2);

    let mut not_reaped = npu(GIB, &conf("multi_stream_lazy_reclaim:True"));
    pending_frees(&mut not_reaped, 256, &[S1, S2]);
    assert_eq!(not_reaped.pending_events(), 512);
    // Not polled at the start; polled once at the miss.
    not_reaped.malloc(4 * MIB, S0).unwrap();
    assert_eq!(not_reaped.device().event_done_calls(), 2);
    check_consistency(&reaped);
    check_consistency(&not_reaped);
}

/// The `reaped` mark is the malloc's own: one that polled at its start and then hit leaves
/// nothing for the next malloc, whose miss polls.
#[test]
fn a_malloc_that_polled_and_hit_leaves_the_next_misses_poll() {
    let mut a = npu(GIB, &conf("multi_stream_lazy_reclaim:True"));
    let done = pending_frees(&mut a, 213, &[S1]);
    a.device_mut().complete_all();
    pending_frees(&mut a, 300, &[S1]);
    assert_eq!(a.pending_events(), 513);
    // Polled at the start: 213 complete, the 214th query finds the first incomplete one.
    assert_eq!(a.malloc(1000, S0).unwrap(), done[0]);
    assert_eq!(a.device().event_done_calls(), 214);
    assert_eq!(a.pending_events(), 300);
    // 300 pending: not polled at the start; the miss polls once (one stream, none complete).
    a.malloc(4 * MIB, S0).unwrap();
    assert_eq!(a.device().event_done_calls(), 215);
    check_consistency(&a);
}
