//! The statistics as the hot path keeps them: every value of torch's `memory_stats()` stays
//! exact, but a malloc or free does little work for it.
//!
//! torch updates current, peak, allocated and freed of "all" and of the pool at each change.
//! Here each pool keeps only its current value, its peak and its total of increases; a decrease
//! is one subtraction. The rest is derived when [`Counters::report`] builds the [`DeviceStats`]:
//! - freed = (current at the last accumulated reset) + allocated − current, since every change
//!   since that reset is an increase or a decrease;
//! - "all" current, allocated and freed are the sums of the pools';
//! - only the peak of "all" is kept apart (a peak of a sum is not the sum of peaks), moved on
//!   increases only, as a decrease cannot raise it.
//!
//! `active` and `active_bytes` are not kept at all: an active block is an allocated one or one
//! whose free waits on stream events ("pending"), so they are `allocation` and
//! `allocated_bytes` plus the pending blocks ([`Pending`]), which a cache hit never touches.
//!
//! Totals stop at `i64::MAX`, as [`Stat`] documents. A pool's total of increases stops at
//! `u64::MAX` instead, which keeps the derivation exact below it and reports `i64::MAX` at it:
//! a freed total derived from a stopped sum is at least `u64::MAX − i64::MAX`, and so is the
//! true one.

use crate::size::PoolKind;
use crate::stats::{DeviceStats, Stat, StatArray};

/// `n` as a signed change: past `i64::MAX` it counts as `i64::MAX`, as in [`Stat::increase`].
#[inline]
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A total reported as torch's int64, stopping at `i64::MAX`.
#[inline]
fn total(n: i128) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One statistic of one pool (or one without pools, such as the oversize counts).
///
/// Inside the allocator `current` never leaves `0..=i64::MAX`: byte values are bounded by the
/// reserve and counts by the number of blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counter {
    current: i64,
    peak: i64,
    /// Sum of increases since the accumulated reset, stopping at `u64::MAX`.
    added: u64,
    /// `current` at the accumulated reset.
    base: i64,
}

impl Counter {
    /// torch's `increase_stat`.
    #[inline]
    pub(crate) fn increase(&mut self, n: u64) {
        let n = signed(n);
        self.current = self.current.wrapping_add(n);
        self.peak = self.peak.max(self.current);
        self.added = self.added.saturating_add(n as u64);
    }

    /// torch's `decrease_stat`.
    #[inline]
    pub(crate) fn decrease(&mut self, n: u64) {
        self.current = self.current.wrapping_sub(signed(n));
    }

    /// A signed net change as one increase or one decrease, as torch applies it; without
    /// branches (the sign of a merge's net change is data-dependent).
    #[inline]
    pub(crate) fn apply(&mut self, delta: i64) {
        self.current = self.current.wrapping_add(delta);
        self.peak = self.peak.max(self.current);
        self.added = self.added.saturating_add(delta.max(0) as u64);
    }

    /// The value now.
    #[inline]
    pub(crate) fn current(&self) -> i64 {
        self.current
    }

    /// Exact total of decreases since the accumulated reset (below the stop of `added`).
    fn freed(&self) -> i128 {
        i128::from(self.base) + i128::from(self.added) - i128::from(self.current)
    }

    /// The reported statistic.
    pub(crate) fn stat(&self) -> Stat {
        Stat {
            current: self.current,
            peak: self.peak,
            allocated: total(i128::from(self.added)),
            freed: total(self.freed()),
        }
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.added = 0;
        self.base = self.current;
    }
}

/// One statistic kept per pool, reported for "all" and each pool: torch's `StatArray`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PoolCounters {
    /// Indexed by [`pool_index`].
    pools: [Counter; 2],
    /// Peak of the sum of the pools' current values.
    all_peak: i64,
}

/// The slot of `pool` in [`PoolCounters`].
#[inline]
fn pool_index(pool: PoolKind) -> usize {
    match pool {
        PoolKind::Small => 0,
        PoolKind::Large => 1,
    }
}

impl PoolCounters {
    /// Increases `pool` (and so "all") by `n`.
    #[inline]
    pub(crate) fn increase(&mut self, pool: PoolKind, n: u64) {
        self.pools[pool_index(pool)].increase(n);
        self.all_peak = self.all_peak.max(self.all_current());
    }

    /// Decreases `pool` (and so "all") by `n`.
    #[inline]
    pub(crate) fn decrease(&mut self, pool: PoolKind, n: u64) {
        self.pools[pool_index(pool)].decrease(n);
    }

    /// Applies a net change to `pool` (and so "all").
    #[inline]
    pub(crate) fn apply(&mut self, pool: PoolKind, delta: i64) {
        self.pools[pool_index(pool)].apply(delta);
        self.all_peak = self.all_peak.max(self.all_current());
    }

    /// The current value for all pools together.
    #[inline]
    pub(crate) fn all_current(&self) -> i64 {
        let [small, large] = &self.pools;
        small.current.wrapping_add(large.current)
    }

    /// torch's `StatArray` for this statistic.
    pub(crate) fn report(&self) -> StatArray {
        let [small, large] = &self.pools;
        StatArray {
            all: Stat {
                current: self.all_current(),
                peak: self.all_peak,
                allocated: total(i128::from(small.added) + i128::from(large.added)),
                freed: total(small.freed() + large.freed()),
            },
            small_pool: small.stat(),
            large_pool: large.stat(),
        }
    }

    fn reset_peak(&mut self) {
        self.pools.iter_mut().for_each(Counter::reset_peak);
        self.all_peak = self.all_current();
    }

    fn reset_accumulated(&mut self) {
        self.pools.iter_mut().for_each(Counter::reset_accumulated);
    }
}

/// Blocks freed by their caller whose free waits on stream events, per pool: what `active`
/// holds beyond `allocation` (and `active_bytes` beyond `allocated_bytes`).
///
/// Active rises only when a block is allocated (a free that waits moves a block from allocated
/// to pending, which leaves active as it was). So its peak is the larger of the allocation's
/// peak and the peaks tracked at allocations made while something is pending: at any other time
/// active equals the allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Pending {
    /// Pending blocks and bytes now, per pool ([`pool_index`]).
    count: [i64; 2],
    bytes: [i64; 2],
    /// Them at the accumulated reset (for the derived freed totals).
    count_base: [i64; 2],
    bytes_base: [i64; 2],
    /// Pending blocks, all pools: while 0, nothing is tracked.
    total: i64,
    /// Active peaks (blocks, bytes) seen at allocations while something was pending, per pool
    /// and for all pools.
    count_peak: [i64; 2],
    bytes_peak: [i64; 2],
    count_all_peak: i64,
    bytes_all_peak: i64,
}

/// torch's `active` or `active_bytes` array: `allocated` (the allocation's array) plus
/// `pending` blocks or bytes (`base` of them at the accumulated reset), with `peak` and
/// `all_peak` tracked while something was pending.
fn active_report(
    allocated: &PoolCounters,
    pending: [i64; 2],
    base: [i64; 2],
    peak: [i64; 2],
    all_peak: i64,
) -> StatArray {
    let pool = |i: usize| {
        let a = &allocated.pools[i];
        let current = a.current.wrapping_add(pending[i]);
        // Active decreases since the reset: the allocation's, less the frees still pending.
        let freed =
            i128::from(a.base) + i128::from(base[i]) + i128::from(a.added) - i128::from(current);
        let stat = Stat {
            current,
            peak: a.peak.max(peak[i]),
            allocated: total(i128::from(a.added)),
            freed: total(freed),
        };
        (stat, freed)
    };
    let ((small, small_freed), (large, large_freed)) = (pool(0), pool(1));
    let [s, l] = &allocated.pools;
    StatArray {
        all: Stat {
            current: small.current.wrapping_add(large.current),
            peak: allocated.all_peak.max(all_peak),
            allocated: total(i128::from(s.added) + i128::from(l.added)),
            freed: total(small_freed + large_freed),
        },
        small_pool: small,
        large_pool: large,
    }
}

/// Every statistic of one device, in the form the hot path updates; [`Counters::report`] gives
/// torch's [`DeviceStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) allocation: PoolCounters,
    pub(crate) segment: PoolCounters,
    pub(crate) inactive_split: PoolCounters,
    pub(crate) allocated_bytes: PoolCounters,
    pub(crate) reserved_bytes: PoolCounters,
    pub(crate) inactive_split_bytes: PoolCounters,
    /// What `active` and `active_bytes` hold beyond the allocations.
    pending: Pending,
    pub(crate) requested_bytes: PoolCounters,
    pub(crate) oversize_allocations: Counter,
    pub(crate) oversize_segments: Counter,
    pub(crate) num_alloc_retries: u64,
    pub(crate) num_ooms: u64,
    pub(crate) num_sync_all_streams: u64,
    pub(crate) num_device_alloc: u64,
    pub(crate) num_device_free: u64,
    pub(crate) max_split_size: Option<u64>,
}

impl Counters {
    /// No statistic yet; `max_split_size` as configured.
    pub(crate) fn new(max_split_size: Option<u64>) -> Self {
        Counters {
            max_split_size,
            ..Counters::default()
        }
    }

    fn arrays_mut(&mut self) -> [&mut PoolCounters; 7] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// A block of `size` bytes handed out: `allocation`, `allocated_bytes`, and so `active` and
    /// `active_bytes`.
    #[inline]
    pub(crate) fn allocate(&mut self, pool: PoolKind, size: u64) {
        self.allocation.increase(pool, 1);
        self.allocated_bytes.increase(pool, size);
        if self.pending.total != 0 {
            self.track_active(pool);
        }
    }

    /// The active peaks while something is pending (out of the hit path).
    #[cold]
    #[inline(never)]
    fn track_active(&mut self, pool: PoolKind) {
        let (i, p) = (pool_index(pool), &mut self.pending);
        let count = self.allocation.pools[i].current + p.count[i];
        let bytes = self.allocated_bytes.pools[i].current + p.bytes[i];
        p.count_peak[i] = p.count_peak[i].max(count);
        p.bytes_peak[i] = p.bytes_peak[i].max(bytes);
        let count_all = self.allocation.all_current() + p.count[0] + p.count[1];
        let bytes_all = self.allocated_bytes.all_current() + p.bytes[0] + p.bytes[1];
        p.count_all_peak = p.count_all_peak.max(count_all);
        p.bytes_all_peak = p.bytes_all_peak.max(bytes_all);
    }

    /// A block of `size` bytes freed by its caller: `allocation` and `allocated_bytes`. Unless
    /// it then waits on events ([`Counters::pend`]), it leaves `active` too.
    #[inline]
    pub(crate) fn free(&mut self, pool: PoolKind, size: u64) {
        self.allocation.decrease(pool, 1);
        self.allocated_bytes.decrease(pool, size);
    }

    /// The block just freed waits on stream events: it stays active.
    pub(crate) fn pend(&mut self, pool: PoolKind, size: u64) {
        let (i, p) = (pool_index(pool), &mut self.pending);
        p.count[i] += 1;
        p.bytes[i] += signed(size);
        p.total += 1;
    }

    /// A pending block's events completed: it is no longer active.
    pub(crate) fn unpend(&mut self, pool: PoolKind, size: u64) {
        let (i, p) = (pool_index(pool), &mut self.pending);
        p.count[i] -= 1;
        p.bytes[i] -= signed(size);
        p.total -= 1;
    }

    /// `active_bytes.all.current`.
    pub(crate) fn active_bytes_current(&self) -> i64 {
        let p = &self.pending;
        self.allocated_bytes.all_current() + p.bytes[0] + p.bytes[1]
    }

    /// torch's `reset_peak_memory_stats`: every peak becomes the current value.
    pub(crate) fn reset_peak(&mut self) {
        self.arrays_mut()
            .into_iter()
            .for_each(PoolCounters::reset_peak);
        let p = &mut self.pending;
        for i in 0..2 {
            p.count_peak[i] = self.allocation.pools[i].current + p.count[i];
            p.bytes_peak[i] = self.allocated_bytes.pools[i].current + p.bytes[i];
        }
        p.count_all_peak = self.allocation.all_current() + p.count[0] + p.count[1];
        p.bytes_all_peak = self.allocated_bytes.all_current() + p.bytes[0] + p.bytes[1];
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// torch's `reset_accumulated_memory_stats`: allocated/freed totals and the `num_*` counters
    /// go to 0; `max_split_size` stays.
    pub(crate) fn reset_accumulated(&mut self) {
        self.arrays_mut()
            .into_iter()
            .for_each(PoolCounters::reset_accumulated);
        self.pending.count_base = self.pending.count;
        self.pending.bytes_base = self.pending.bytes;
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// torch's `DeviceStats`.
    pub(crate) fn report(&self) -> DeviceStats {
        DeviceStats {
            allocation: self.allocation.report(),
            segment: self.segment.report(),
            active: active_report(
                &self.allocation,
                self.pending.count,
                self.pending.count_base,
                self.pending.count_peak,
                self.pending.count_all_peak,
            ),
            inactive_split: self.inactive_split.report(),
            allocated_bytes: self.allocated_bytes.report(),
            reserved_bytes: self.reserved_bytes.report(),
            active_bytes: active_report(
                &self.allocated_bytes,
                self.pending.bytes,
                self.pending.bytes_base,
                self.pending.bytes_peak,
                self.pending.bytes_all_peak,
            ),
            inactive_split_bytes: self.inactive_split_bytes.report(),
            requested_bytes: self.requested_bytes.report(),
            oversize_allocations: self.oversize_allocations.stat(),
            oversize_segments: self.oversize_segments.stat(),
            num_alloc_retries: self.num_alloc_retries,
            num_ooms: self.num_ooms,
            num_sync_all_streams: self.num_sync_all_streams,
            num_device_alloc: self.num_device_alloc,
            num_device_free: self.num_device_free,
            num_oom_rejections: 0,
            max_split_size: self.max_split_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::DeviceStats;
    use alloc::vec::Vec;

    /// Applies the same changes to the counters and to torch's model ([`StatArray`]'s
    /// increase/decrease/apply), checking the report after each.
    #[test]
    fn report_equals_torchs_update_rule_step_by_step() {
        let mut fast = Counters::default();
        let mut model = DeviceStats::default();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..5_000 {
            let pool = if next() % 2 == 0 {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            let n = next() % 1000;
            // Keep current non-negative, as inside the allocator.
            let cur = model.requested_bytes.pool(pool).current as u64;
            match next() % 6 {
                0 | 1 => {
                    fast.requested_bytes.increase(pool, n);
                    model.requested_bytes.increase(pool, n);
                }
                2 | 3 => {
                    fast.requested_bytes.decrease(pool, n.min(cur));
                    model.requested_bytes.decrease(pool, n.min(cur));
                }
                4 => {
                    let delta = n as i64 - cur.min(500) as i64;
                    fast.requested_bytes.apply(pool, delta);
                    model.requested_bytes.apply(pool, delta);
                }
                _ => match next() % 8 {
                    0 => {
                        fast.reset_peak();
                        model.reset_peak();
                    }
                    1 => {
                        fast.reset_accumulated();
                        model.reset_accumulated();
                    }
                    _ => {}
                },
            }
            assert_eq!(fast.report(), model, "step {step}");
        }
    }

    /// `active` and `active_bytes`, derived from the allocations and the pending frees, against
    /// torch's rule applied where torch applies it: allocations, frees that return at once,
    /// frees that wait on events and their completion, and resets.
    #[test]
    fn derived_active_equals_torchs_step_by_step() {
        let mut fast = Counters::default();
        let mut model = DeviceStats::default();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // (pool, size) of live and of pending blocks.
        let mut live: Vec<(PoolKind, u64)> = Vec::new();
        let mut pending: Vec<(PoolKind, u64)> = Vec::new();
        let arrays = |d: &DeviceStats| (d.allocation, d.allocated_bytes, d.active, d.active_bytes);
        for step in 0..20_000 {
            match next() % 10 {
                0..=3 => {
                    let pool = if next() % 2 == 0 {
                        PoolKind::Small
                    } else {
                        PoolKind::Large
                    };
                    let size = 512 * (1 + next() % 64);
                    fast.allocate(pool, size);
                    model.allocation.increase(pool, 1);
                    model.allocated_bytes.increase(pool, size);
                    model.active.increase(pool, 1);
                    model.active_bytes.increase(pool, size);
                    live.push((pool, size));
                }
                4..=6 if !live.is_empty() => {
                    let (pool, size) = live.swap_remove(next() as usize % live.len());
                    fast.free(pool, size);
                    model.allocation.decrease(pool, 1);
                    model.allocated_bytes.decrease(pool, size);
                    if next() % 3 == 0 {
                        // Recorded on another stream: active until its events complete.
                        fast.pend(pool, size);
                        pending.push((pool, size));
                    } else {
                        model.active.decrease(pool, 1);
                        model.active_bytes.decrease(pool, size);
                    }
                }
                7 | 8 if !pending.is_empty() => {
                    let (pool, size) = pending.swap_remove(next() as usize % pending.len());
                    fast.unpend(pool, size);
                    model.active.decrease(pool, 1);
                    model.active_bytes.decrease(pool, size);
                }
                9 => match next() % 4 {
                    0 => {
                        fast.reset_peak();
                        model.reset_peak();
                    }
                    1 => {
                        fast.reset_accumulated();
                        model.reset_accumulated();
                    }
                    _ => {}
                },
                _ => {}
            }
            assert_eq!(arrays(&fast.report()), arrays(&model), "step {step}");
            assert_eq!(
                fast.active_bytes_current(),
                model.active_bytes.all.current,
                "step {step}"
            );
        }
    }

    #[test]
    fn totals_stop_at_i64_max() {
        let mut c = PoolCounters::default();
        c.increase(PoolKind::Large, 10);
        c.decrease(PoolKind::Large, 4);
        // Close to the top: the "all" sum passes i64::MAX first, then the pool's own.
        c.pools[1].added = i64::MAX as u64 - 3;
        c.increase(PoolKind::Small, 5);
        let r = c.report();
        assert_eq!(
            (r.all.allocated, r.large_pool.allocated),
            (i64::MAX, i64::MAX - 3)
        );
        c.increase(PoolKind::Large, 100);
        c.decrease(PoolKind::Large, 100);
        let r = c.report();
        assert_eq!(r.large_pool.current, 6);
        assert_eq!(r.large_pool.allocated, i64::MAX);
        assert_eq!(
            r.small_pool,
            Stat {
                current: 5,
                peak: 5,
                allocated: 5,
                freed: 0
            }
        );
        // Past u64::MAX increases: the freed total derived from the stopped sum is i64::MAX,
        // as the true one would be.
        c.pools[1].added = u64::MAX - 1;
        c.increase(PoolKind::Large, 50);
        c.decrease(PoolKind::Large, 56);
        let r = c.report();
        assert_eq!(r.large_pool.freed, i64::MAX);
        assert_eq!(r.all.freed, i64::MAX);
        assert_eq!(r.large_pool.current, 0);
        // A change past i64::MAX counts as i64::MAX.
        let mut one = Counter::default();
        one.increase(u64::MAX);
        assert_eq!(one.stat().current, i64::MAX);
    }
}
