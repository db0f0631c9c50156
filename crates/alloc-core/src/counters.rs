//! The statistics as the hot path keeps them: every value of torch's `memory_stats()` stays
//! exact, but a malloc or free does little work for it.
//!
//! torch updates current, peak, allocated and freed of "all" and of the pool at each change.
//! Here each pool keeps its peak, its headroom (peak − current) and its total of increases.
//! An increase subtracts from the headroom and sets a new peak only when that goes below 0 (a
//! subtraction and a sign test, with no compare against a stored peak); a decrease adds to it.
//! The rest is derived when [`Counters::report`] builds the [`DeviceStats`]:
//! - current = peak − headroom;
//! - freed = base + allocated − current, with base the value at the last accumulated reset
//!   (moved by each recount, which is neither an increase nor a decrease), since every other
//!   change since that reset is an increase or a decrease;
//! - "all" allocated and freed are the sums of the pools';
//! - "all" keeps a peak and headroom of its own (a peak of a sum is not the sum of peaks),
//!   which every change moves with the pool's (see [`PoolCounters`]).
//!
//! `active` and `active_bytes` are not kept at all: a block is active while it is allocated or
//! while its free waits on stream events, so they are `allocation` and `allocated_bytes` plus
//! the [`Pending`] frees. A cache hit moves neither of them; see [`Pending`] for their peaks.
//!
//! Reported totals stop at `i64::MAX`, as [`Stat`] documents. A pool's total of increases is
//! kept as 64 bits and a count of their wraps, a 128-bit sum no run can fill (every change is
//! below 2^63), so the derivation is exact at any size; an increase adds to it with one add
//! and a branch not taken.
//!
//! Each of those steps is one read-modify-write of memory whose flags feed its branch (`add`
//! then `jc`, `sub` then `js`): an increase is six instructions. Testing two headrooms'
//! signs at once (an `or` of both) needs both values in registers: a load, the change and a
//! store for each, 16 instructions more a fenced pair for the same work (the time is the
//! same; the count is what callgrind compares).

use crate::size::PoolKind;
use crate::stats::{DeviceStats, Stat, StatArray};

/// `n` as a signed change. Every change the allocator makes is a block's size, a request's
/// size or a count, all far below `i64::MAX` (requests stop at 2^60 bytes, and rounding at
/// most doubles one), so this is a plain conversion: clamping as [`Stat::increase`] does for any
/// caller cost the hot path 10 instructions a malloc + free pair.
#[inline(always)]
fn signed(n: u64) -> i64 {
    debug_assert!(n <= i64::MAX as u64, "a change of {n} is beyond any block");
    n as i64
}

/// A total reported as torch's int64, stopping at `i64::MAX`.
#[inline]
fn total(n: i128) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Adds `n` to a total of increases kept as 64 bits (`added`) and a count of their wraps: one
/// add and a branch not taken.
#[inline(always)]
fn add_to_total(added: &mut u64, wraps: &mut u64, n: u64) {
    let (sum, wrapped) = added.overflowing_add(n);
    *added = sum;
    if wrapped {
        count_wrap(wraps);
    }
}

/// Out of line and cold, so that the add's fall-through is the hot path.
#[cold]
#[inline(never)]
fn count_wrap(wraps: &mut u64) {
    *wraps += 1;
}

/// A value and its peak, kept as the peak and the headroom below it (peak − current).
///
/// Inside the allocator the value never leaves `0..=i64::MAX` (byte values are bounded by the
/// reserve, counts by the number of blocks), so neither does the headroom.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Level {
    peak: i64,
    headroom: i64,
}

impl Level {
    /// Adds `n` (negative: removes), moving the peak up if the value passes it: once a
    /// workload has reached its peak, a subtraction and a sign test.
    #[inline(always)]
    fn rise(&mut self, n: i64) {
        self.headroom = self.headroom.wrapping_sub(n);
        if self.headroom < 0 {
            self.peak = self.peak.wrapping_sub(self.headroom);
            self.headroom = 0;
        }
    }

    /// Removes `n`: no peak can follow.
    #[inline(always)]
    fn fall(&mut self, n: i64) {
        self.headroom = self.headroom.wrapping_add(n);
    }

    #[inline]
    fn current(&self) -> i64 {
        self.peak.wrapping_sub(self.headroom)
    }

    fn reset_peak(&mut self) {
        self.peak = self.current();
        self.headroom = 0;
    }
}

/// One statistic of one pool (or one without pools, such as the oversize counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counter {
    level: Level,
    /// Sum of increases since the accumulated reset, modulo 2^64 ...
    added: u64,
    /// ... and how many times it wrapped: with `added`, a 128-bit sum no run can fill, kept
    /// as two words so that an increase is one add and a branch not taken.
    wraps: u64,
    /// The value at the accumulated reset, moved by each [`Counter::recount`].
    base: i64,
}

impl Counter {
    /// torch's `increase_stat`.
    #[inline(always)]
    pub(crate) fn increase(&mut self, n: u64) {
        let n = signed(n);
        self.add_total(n as u64);
        self.level.rise(n);
    }

    /// torch's `decrease_stat`.
    #[inline(always)]
    pub(crate) fn decrease(&mut self, n: u64) {
        self.level.fall(signed(n));
    }

    /// Sets the value to `value` without counting an increase or a decrease: the totals of
    /// both stay, and the peak follows a value above it (a recount, not a change).
    pub(crate) fn recount(&mut self, value: i64) {
        let delta = value.wrapping_sub(self.current());
        self.level.rise(delta);
        // freed = base + added − current: moving the base with the value keeps it.
        self.base = self.base.wrapping_add(delta);
    }

    /// Adds `n` to the total of increases.
    #[inline(always)]
    fn add_total(&mut self, n: u64) {
        add_to_total(&mut self.added, &mut self.wraps, n);
    }

    /// The total of increases since the accumulated reset.
    fn total_added(&self) -> u128 {
        (u128::from(self.wraps) << 64) | u128::from(self.added)
    }

    /// The value now.
    #[inline]
    pub(crate) fn current(&self) -> i64 {
        self.level.current()
    }

    /// Exact total of decreases since the accumulated reset.
    fn freed(&self) -> i128 {
        i128::from(self.base) + self.total_added() as i128 - i128::from(self.current())
    }

    /// The reported statistic.
    pub(crate) fn stat(&self) -> Stat {
        Stat {
            current: self.current(),
            peak: self.level.peak,
            allocated: total(self.total_added() as i128),
            freed: total(self.freed()),
        }
    }

    fn reset_peak(&mut self) {
        self.level.reset_peak();
    }

    fn reset_accumulated(&mut self) {
        self.added = 0;
        self.wraps = 0;
        self.base = self.current();
    }
}

/// One statistic kept per pool, reported for "all" and each pool: torch's `StatArray`.
///
/// Kept field by field, each an array indexed by [`PoolKind::index`], so that a pool's field
/// is one addressing mode away (a 40-byte [`Counter`] per pool cost a multiply-add of the
/// index on every update). "All" is the sum of the pools with a peak of its own (a peak of a
/// sum is not the sum of peaks), kept as its own [`Level`]: an increase subtracts from both
/// headrooms and tests each one's sign, a decrease adds to both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PoolCounters {
    headroom: [i64; 2],
    /// The hot half of [`Counter::added`], per pool.
    added: [u64; 2],
    all: Level,
    peak: [i64; 2],
    wraps: [u64; 2],
    base: [i64; 2],
}

impl PoolCounters {
    /// Increases `pool` (and so "all") by `n`.
    #[inline(always)]
    pub(crate) fn increase(&mut self, pool: PoolKind, n: u64) {
        let i = pool.index();
        add_to_total(&mut self.added[i], &mut self.wraps[i], n);
        self.rise(i, signed(n));
    }

    /// Decreases `pool` (and so "all") by `n`.
    #[inline(always)]
    pub(crate) fn decrease(&mut self, pool: PoolKind, n: u64) {
        let n = signed(n);
        let i = pool.index();
        self.headroom[i] = self.headroom[i].wrapping_add(n);
        self.all.fall(n);
    }

    /// Applies a net change to `pool` (and so "all"), as one increase or one decrease.
    #[inline(always)]
    pub(crate) fn apply(&mut self, pool: PoolKind, delta: i64) {
        let i = pool.index();
        add_to_total(&mut self.added[i], &mut self.wraps[i], delta.max(0) as u64);
        self.rise(i, delta);
    }

    /// Adds `n` (negative: removes) to pool `i` and "all", moving either peak it passes: while
    /// neither passes, two subtractions of memory, each with a branch on its sign.
    #[inline(always)]
    fn rise(&mut self, i: usize, n: i64) {
        self.headroom[i] = self.headroom[i].wrapping_sub(n);
        if self.headroom[i] < 0 {
            self.new_peak(i);
        }
        self.all.headroom = self.all.headroom.wrapping_sub(n);
        if self.all.headroom < 0 {
            self.new_all_peak();
        }
    }

    #[cold]
    #[inline(never)]
    fn new_peak(&mut self, i: usize) {
        self.update_pool(i, |pool| pool.level.rise(0));
    }

    #[cold]
    #[inline(never)]
    fn new_all_peak(&mut self) {
        self.all.rise(0);
    }

    /// Pool `i` as a [`Counter`] (a copy), for the derivations.
    fn pool(&self, i: usize) -> Counter {
        Counter {
            level: Level {
                peak: self.peak[i],
                headroom: self.headroom[i],
            },
            added: self.added[i],
            wraps: self.wraps[i],
            base: self.base[i],
        }
    }

    /// Changes pool `i` through its [`Counter`], so that the rules off the hot path (a new
    /// peak, the resets) are written once, in `Counter`.
    fn update_pool(&mut self, i: usize, f: impl FnOnce(&mut Counter)) {
        let mut c = self.pool(i);
        f(&mut c);
        (self.peak[i], self.headroom[i]) = (c.level.peak, c.level.headroom);
        (self.added[i], self.wraps[i], self.base[i]) = (c.added, c.wraps, c.base);
    }

    /// The increases of both pools since the accumulated reset (off the hot path: it reads
    /// every half).
    pub(crate) fn increases(&self) -> u128 {
        self.pool(0).total_added() + self.pool(1).total_added()
    }

    /// The current value for all pools together.
    #[inline]
    pub(crate) fn all_current(&self) -> i64 {
        self.all.current()
    }

    /// torch's `StatArray` for this statistic.
    pub(crate) fn report(&self) -> StatArray {
        let (small, large) = (self.pool(0), self.pool(1));
        StatArray {
            all: Stat {
                current: self.all_current(),
                peak: self.all.peak,
                allocated: total(small.total_added() as i128 + large.total_added() as i128),
                freed: total(small.freed() + large.freed()),
            },
            small_pool: small.stat(),
            large_pool: large.stat(),
        }
    }

    fn reset_peak(&mut self) {
        for i in 0..2 {
            self.update_pool(i, Counter::reset_peak);
        }
        self.all.reset_peak();
    }

    fn reset_accumulated(&mut self) {
        for i in 0..2 {
            self.update_pool(i, Counter::reset_accumulated);
        }
    }
}

/// The frees that wait on stream events (blocks, or their bytes): active but no longer
/// allocated. With the allocated counter `a` it pairs with, it gives torch's active statistic:
/// current = a + pending; every increase of active is a malloc, which increases `a` by the same
/// amount, so active's total of increases is `a`'s.
///
/// Active's peak: at a moment with nothing pending, active equals `a`, so `a`'s peak covers it;
/// `peak` covers the others: active can rise only at a malloc, and a malloc while something is
/// pending records active into `peak` ([`Pending::note_peak`]). So active's peak is the larger of
/// the two, exactly, and the hot path pays one never-taken branch for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pending {
    /// Per pool ([`PoolKind::index`]): pending now.
    current: [i64; 2],
    /// Per pool: pending at the accumulated reset.
    base: [i64; 2],
    /// Active's largest value per pool, then for "all", at mallocs while something was pending
    /// and at the last peak reset.
    peak: [i64; 3],
}

impl Pending {
    /// A free of `n` starts waiting on events.
    #[inline]
    fn add(&mut self, pool: PoolKind, n: u64) {
        self.current[pool.index()] += signed(n);
    }

    /// A pending free of `n` completed.
    #[inline]
    fn remove(&mut self, pool: PoolKind, n: u64) {
        self.current[pool.index()] -= signed(n);
    }

    /// Whether any free waits on events.
    #[inline(always)]
    fn any(&self) -> bool {
        (self.current[0] | self.current[1]) != 0
    }

    /// Records active (`allocated` plus pending) into the peaks, after a malloc in `pool` while
    /// something is pending.
    #[cold]
    #[inline(never)]
    fn note_peak(&mut self, pool: PoolKind, allocated: &PoolCounters) {
        let i = pool.index();
        self.peak[i] = self.peak[i].max(allocated.pool(i).current() + self.current[i]);
        self.peak[2] = self.peak[2].max(allocated.all_current() + self.all());
    }

    fn all(&self) -> i64 {
        self.current[0] + self.current[1]
    }

    /// Active now, for all pools.
    #[inline]
    pub(crate) fn active(&self, allocated: &PoolCounters) -> i64 {
        allocated.all_current() + self.all()
    }

    fn reset_peak(&mut self, allocated: &PoolCounters) {
        for i in 0..2 {
            self.peak[i] = allocated.pool(i).current() + self.current[i];
        }
        self.peak[2] = self.active(allocated);
    }

    fn reset_accumulated(&mut self) {
        self.base = self.current;
    }

    /// torch's `StatArray` of active, from the allocated counter this pairs with.
    fn report(&self, allocated: &PoolCounters) -> StatArray {
        // Active's decreases: allocated's, plus what stopped pending, less what started.
        let freed = |i: usize| {
            allocated.pool(i).freed() + i128::from(self.base[i]) - i128::from(self.current[i])
        };
        let pool = |i: usize| {
            let a = allocated.pool(i);
            Stat {
                current: a.current() + self.current[i],
                peak: a.level.peak.max(self.peak[i]),
                allocated: total(a.total_added() as i128),
                freed: total(freed(i)),
            }
        };
        let (small, large) = (allocated.pool(0), allocated.pool(1));
        StatArray {
            all: Stat {
                current: self.active(allocated),
                peak: allocated.all.peak.max(self.peak[2]),
                allocated: total(small.total_added() as i128 + large.total_added() as i128),
                freed: total(freed(0) + freed(1)),
            },
            small_pool: pool(0),
            large_pool: pool(1),
        }
    }
}

/// Every statistic of one device, in the form the hot path updates; [`Counters::report`] gives
/// torch's [`DeviceStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) allocation: PoolCounters,
    pub(crate) segment: PoolCounters,
    /// Blocks whose free waits on events: `active` is `allocation` plus these.
    pub(crate) pending: Pending,
    pub(crate) inactive_split: PoolCounters,
    pub(crate) allocated_bytes: PoolCounters,
    pub(crate) reserved_bytes: PoolCounters,
    /// Their bytes: `active_bytes` is `allocated_bytes` plus these.
    pub(crate) pending_bytes: Pending,
    pub(crate) inactive_split_bytes: PoolCounters,
    pub(crate) requested_bytes: PoolCounters,
    pub(crate) oversize_allocations: Counter,
    pub(crate) oversize_segments: Counter,
    pub(crate) num_alloc_retries: u64,
    pub(crate) num_ooms: u64,
    pub(crate) num_sync_all_streams: u64,
    pub(crate) num_device_alloc: u64,
    pub(crate) num_device_free: u64,
    pub(crate) num_oom_rejections: u64,
    pub(crate) max_split_size: Option<u64>,
}

impl Counters {
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

    /// A freed block of `size` bytes starts waiting on stream events: still active, no longer
    /// allocated (the free path has taken it out of the allocated stats).
    #[inline]
    pub(crate) fn start_pending(&mut self, pool: PoolKind, size: u64) {
        self.pending.add(pool, 1);
        self.pending_bytes.add(pool, size);
    }

    /// A pending free of `size` bytes completed: the block is no longer active.
    #[inline]
    pub(crate) fn end_pending(&mut self, pool: PoolKind, size: u64) {
        self.pending.remove(pool, 1);
        self.pending_bytes.remove(pool, size);
    }

    /// After a malloc in `pool` (its allocated stats already increased): active rose with them,
    /// and its peaks need a look while frees are pending.
    #[inline(always)]
    pub(crate) fn note_active_peak(&mut self, pool: PoolKind) {
        if self.pending.any() {
            self.pending.note_peak(pool, &self.allocation);
            self.pending_bytes.note_peak(pool, &self.allocated_bytes);
        }
    }

    /// torch's `reset_peak_memory_stats`: every peak becomes the current value.
    pub(crate) fn reset_peak(&mut self) {
        self.pending.reset_peak(&self.allocation);
        self.pending_bytes.reset_peak(&self.allocated_bytes);
        self.arrays_mut()
            .into_iter()
            .for_each(PoolCounters::reset_peak);
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// torch's `reset_accumulated_memory_stats`: allocated/freed totals and the `num_*` counters
    /// go to 0; `max_split_size` stays.
    pub(crate) fn reset_accumulated(&mut self) {
        self.pending.reset_accumulated();
        self.pending_bytes.reset_accumulated();
        self.arrays_mut()
            .into_iter()
            .for_each(PoolCounters::reset_accumulated);
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
        self.num_oom_rejections = 0;
    }

    /// torch's `DeviceStats`.
    pub(crate) fn report(&self) -> DeviceStats {
        DeviceStats {
            allocation: self.allocation.report(),
            segment: self.segment.report(),
            active: self.pending.report(&self.allocation),
            inactive_split: self.inactive_split.report(),
            allocated_bytes: self.allocated_bytes.report(),
            reserved_bytes: self.reserved_bytes.report(),
            active_bytes: self.pending_bytes.report(&self.allocated_bytes),
            inactive_split_bytes: self.inactive_split_bytes.report(),
            requested_bytes: self.requested_bytes.report(),
            oversize_allocations: self.oversize_allocations.stat(),
            oversize_segments: self.oversize_segments.stat(),
            num_alloc_retries: self.num_alloc_retries,
            num_ooms: self.num_ooms,
            num_sync_all_streams: self.num_sync_all_streams,
            num_device_alloc: self.num_device_alloc,
            num_device_free: self.num_device_free,
            num_oom_rejections: self.num_oom_rejections,
            max_split_size: self.max_split_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::DeviceStats;
    use crate::test_rng::xorshift;

    /// A reset of both sides when `draw` asks for one: 0 the peaks, 1 the accumulated totals.
    fn reset_both(fast: &mut Counters, model: &mut DeviceStats, draw: u64) {
        match draw {
            0 => {
                fast.reset_peak();
                model.reset_peak();
            }
            1 => {
                fast.reset_accumulated();
                model.reset_accumulated();
            }
            _ => {}
        }
    }

    /// A pool from a random draw.
    fn pick_pool(draw: u64) -> PoolKind {
        if draw.is_multiple_of(2) {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    /// Applies the same changes to the counters and to torch's model ([`StatArray`]'s
    /// increase/decrease/apply), checking the report after each.
    #[test]
    fn report_equals_torchs_update_rule_step_by_step() {
        let mut fast = Counters::default();
        let mut model = DeviceStats::default();
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        for step in 0..5_000 {
            let pool = pick_pool(next());
            let n = next() % 1000;
            // Keep current non-negative, as inside the allocator.
            let cur = model.reserved_bytes.pool(pool).current as u64;
            match next() % 6 {
                0 | 1 => {
                    fast.reserved_bytes.increase(pool, n);
                    model.reserved_bytes.increase(pool, n);
                }
                2 | 3 => {
                    fast.reserved_bytes.decrease(pool, n.min(cur));
                    model.reserved_bytes.decrease(pool, n.min(cur));
                }
                4 => {
                    let delta = n as i64 - cur.min(500) as i64;
                    fast.reserved_bytes.apply(pool, delta);
                    model.reserved_bytes.apply(pool, delta);
                }
                _ => reset_both(&mut fast, &mut model, next() % 8),
            }
            assert_eq!(fast.report(), model, "step {step}");
        }
    }

    /// Active derived from allocated plus pending frees, against torch's rule applied to an
    /// active statistic kept directly: mallocs, frees with and without events, completions and
    /// resets in random order, in both pools, checked after each step.
    #[test]
    fn derived_active_equals_torchs_active_step_by_step() {
        let mut fast = Counters::default();
        let mut model = DeviceStats::default();
        // Live allocations and pending frees: (pool, bytes).
        let (mut live, mut pending) = (alloc::vec::Vec::new(), alloc::vec::Vec::new());
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for step in 0..20_000 {
            let pool = pick_pool(next());
            let n = 512 * (1 + next() % 64);
            match next() % 10 {
                // A malloc, as alloc_found_block moves the stats.
                0..=3 => {
                    fast.allocation.increase(pool, 1);
                    fast.allocated_bytes.increase(pool, n);
                    fast.note_active_peak(pool);
                    model.allocation.increase(pool, 1);
                    model.allocated_bytes.increase(pool, n);
                    model.active.increase(pool, 1);
                    model.active_bytes.increase(pool, n);
                    live.push((pool, n));
                }
                // A free, with or without events to wait on.
                4..=6 if !live.is_empty() => {
                    let (pool, n) = live.swap_remove(next() as usize % live.len());
                    fast.allocation.decrease(pool, 1);
                    fast.allocated_bytes.decrease(pool, n);
                    model.allocation.decrease(pool, 1);
                    model.allocated_bytes.decrease(pool, n);
                    if next().is_multiple_of(2) {
                        fast.start_pending(pool, n);
                        pending.push((pool, n));
                    } else {
                        model.active.decrease(pool, 1);
                        model.active_bytes.decrease(pool, n);
                    }
                }
                // A pending free completes.
                7 | 8 if !pending.is_empty() => {
                    let (pool, n) = pending.swap_remove(next() as usize % pending.len());
                    fast.end_pending(pool, n);
                    model.active.decrease(pool, 1);
                    model.active_bytes.decrease(pool, n);
                }
                _ => reset_both(&mut fast, &mut model, next() % 4),
            }
            let report = fast.report();
            assert_eq!(
                (report.active, report.active_bytes),
                (model.active, model.active_bytes),
                "step {step}"
            );
            assert_eq!(report, model, "step {step}");
        }
    }

    #[test]
    fn totals_stop_at_i64_max() {
        let mut c = PoolCounters::default();
        c.increase(PoolKind::Large, 10);
        c.decrease(PoolKind::Large, 4);
        // Close to the top: the "all" sum passes i64::MAX first, then the pool's own.
        c.added[1] = i64::MAX as u64 - 3;
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
        // Past u64::MAX increases the sum goes on: freed is reported as i64::MAX, and the
        // derivation stays exact (a reset of the totals shows it).
        c.added[1] = u64::MAX - 1;
        c.increase(PoolKind::Large, 50);
        c.decrease(PoolKind::Large, 56);
        let r = c.report();
        assert_eq!(r.large_pool.freed, i64::MAX);
        assert_eq!(r.all.freed, i64::MAX);
        assert_eq!(r.large_pool.current, 0);
        assert_eq!((c.wraps[1], c.added[1]), (1, 48));
        assert_eq!(c.pool(1).total_added(), u128::from(u64::MAX) + 49);
        assert_eq!(c.pool(1).freed(), i128::from(u64::MAX) + 49);
        c.reset_accumulated();
        c.increase(PoolKind::Large, 7);
        c.decrease(PoolKind::Large, 3);
        let r = c.report();
        assert_eq!((r.large_pool.allocated, r.large_pool.freed), (7, 3));
    }
}
