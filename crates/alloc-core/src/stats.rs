//! torch's `DeviceStats`: every counter of `memory_stats()`, updated with torch's rule
//! (increase moves current, peak and allocated; decrease moves current and freed).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::size::PoolKind;

/// One statistic: current value, its peak, and the totals ever added and removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    /// The value now.
    pub current: i64,
    /// The largest `current` since the last peak reset.
    pub peak: i64,
    /// Sum of all increases since the last accumulated reset.
    pub allocated: i64,
    /// Sum of all decreases since the last accumulated reset.
    pub freed: i64,
}

/// `total + n` for the never-negative `allocated` / `freed` totals, stopping at `i64::MAX`.
///
/// Totals grow for the allocator's whole life (8 EiB is ~100 days at 1 TB/s of allocations), so
/// unlike current values they can reach the limit; torch's int64 would then wrap negative.
/// Cheaper than `saturating_add`: neither side is negative, so the sum fits in a `u64`.
#[inline]
fn add_total(total: i64, n: i64) -> i64 {
    (total as u64).wrapping_add(n as u64).min(i64::MAX as u64) as i64
}

impl Stat {
    /// Adds `n`: torch's `increase_stat`.
    ///
    /// `current` cannot overflow inside the allocator: every byte stat is bounded by the reserve,
    /// which never passes `i64::MAX` (a larger one is out of memory), and counts by the number
    /// of blocks. For any other caller it wraps, as torch's int64 would; an `n` past `i64::MAX`
    /// counts as `i64::MAX`.
    #[inline]
    pub fn increase(&mut self, n: u64) {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.current = self.current.wrapping_add(n);
        self.peak = self.peak.max(self.current);
        self.allocated = add_total(self.allocated, n);
    }

    /// Removes `n`: torch's `decrease_stat`.
    #[inline]
    pub fn decrease(&mut self, n: u64) {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.current = self.current.wrapping_sub(n);
        self.freed = add_total(self.freed, n);
    }

    /// Applies a signed net change as one increase or one decrease, as torch does.
    ///
    /// Written without branches (the sign of a merge's net change is data-dependent, so a
    /// branch on it is mispredicted often): a decrease cannot raise the peak, and the side
    /// that does not apply adds zero.
    #[inline]
    pub fn apply(&mut self, delta: i64) {
        self.current = self.current.wrapping_add(delta);
        self.peak = self.peak.max(self.current);
        self.allocated = add_total(self.allocated, delta.max(0));
        self.freed = add_total(self.freed, delta.wrapping_neg().max(0));
    }

    pub(crate) fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// A stat kept for all pools together and for each pool: torch's `StatArray`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatArray {
    /// Both pools.
    pub all: Stat,
    /// The small pool.
    pub small_pool: Stat,
    /// The large pool.
    pub large_pool: Stat,
}

impl StatArray {
    /// The per-pool stat for `pool`.
    #[inline]
    pub fn pool(&self, pool: PoolKind) -> &Stat {
        match pool {
            PoolKind::Small => &self.small_pool,
            PoolKind::Large => &self.large_pool,
        }
    }

    /// Increases `all` and `pool` by `n`.
    #[inline]
    pub fn increase(&mut self, pool: PoolKind, n: u64) {
        self.all.increase(n);
        self.pool_mut(pool).increase(n);
    }

    /// Decreases `all` and `pool` by `n`.
    #[inline]
    pub fn decrease(&mut self, pool: PoolKind, n: u64) {
        self.all.decrease(n);
        self.pool_mut(pool).decrease(n);
    }

    /// Applies a net change to `all` and `pool`.
    #[inline]
    pub fn apply(&mut self, pool: PoolKind, delta: i64) {
        self.all.apply(delta);
        self.pool_mut(pool).apply(delta);
    }

    #[inline]
    fn pool_mut(&mut self, pool: PoolKind) -> &mut Stat {
        match pool {
            PoolKind::Small => &mut self.small_pool,
            PoolKind::Large => &mut self.large_pool,
        }
    }

    fn each_mut(&mut self) -> [&mut Stat; 3] {
        [&mut self.all, &mut self.small_pool, &mut self.large_pool]
    }
}

/// Every statistic torch's `memory_stats()` reports for one device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceStats {
    /// Allocations handed out and not yet freed by the caller.
    pub allocation: StatArray,
    /// Device segments (one per device malloc).
    pub segment: StatArray,
    /// Allocated blocks plus blocks whose free waits on stream events.
    pub active: StatArray,
    /// Free blocks inside segments that hold more than one block.
    pub inactive_split: StatArray,
    /// Bytes of `allocation` (rounded sizes).
    pub allocated_bytes: StatArray,
    /// Bytes of `segment`.
    pub reserved_bytes: StatArray,
    /// Bytes of `active`.
    pub active_bytes: StatArray,
    /// Bytes of `inactive_split`.
    pub inactive_split_bytes: StatArray,
    /// Bytes the callers asked for (before padding and rounding) of active blocks.
    pub requested_bytes: StatArray,
    /// Allocations of blocks at least `max_split_size` large.
    pub oversize_allocations: Stat,
    /// Segments at least `max_split_size` large.
    pub oversize_segments: Stat,
    /// Device mallocs retried after freeing every cached segment.
    pub num_alloc_retries: u64,
    /// Out-of-memory errors raised.
    pub num_ooms: u64,
    /// Synchronizations of all streams (each `empty_cache` and each last OOM retry).
    pub num_sync_all_streams: u64,
    /// Successful device mallocs.
    pub num_device_alloc: u64,
    /// Device frees.
    pub num_device_free: u64,
    /// Segments refused up front by torch_npu's `throw_on_npumalloc_oom:True` (stats.md
    /// §3.10); reset with the accumulated stats.
    pub num_oom_rejections: u64,
    /// `max_split_size` from the config, `None` when unlimited (reported as −1).
    pub max_split_size: Option<u64>,
}

/// Names of the stat arrays, in torch's key order.
pub const STAT_ARRAY_NAMES: [&str; 9] = [
    "active",
    "active_bytes",
    "allocated_bytes",
    "allocation",
    "inactive_split",
    "inactive_split_bytes",
    "requested_bytes",
    "reserved_bytes",
    "segment",
];

const POOL_NAMES: [&str; 3] = ["all", "large_pool", "small_pool"];
const FIELD_NAMES: [&str; 4] = ["allocated", "current", "freed", "peak"];

fn field(stat: &Stat, name: &str) -> i64 {
    match name {
        "allocated" => stat.allocated,
        "current" => stat.current,
        "freed" => stat.freed,
        _ => stat.peak,
    }
}

impl DeviceStats {
    /// The stat array named as in torch's keys (`"allocated_bytes"`, `"segment"`, ...).
    pub fn array(&self, name: &str) -> Option<&StatArray> {
        Some(match name {
            "active" => &self.active,
            "active_bytes" => &self.active_bytes,
            "allocated_bytes" => &self.allocated_bytes,
            "allocation" => &self.allocation,
            "inactive_split" => &self.inactive_split,
            "inactive_split_bytes" => &self.inactive_split_bytes,
            "requested_bytes" => &self.requested_bytes,
            "reserved_bytes" => &self.reserved_bytes,
            "segment" => &self.segment,
            _ => return None,
        })
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.active,
            &mut self.active_bytes,
            &mut self.allocated_bytes,
            &mut self.allocation,
            &mut self.inactive_split,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
            &mut self.reserved_bytes,
            &mut self.segment,
        ]
    }

    /// torch's `reset_peak_memory_stats`: every peak becomes the current value.
    pub fn reset_peak(&mut self) {
        for array in self.arrays_mut() {
            for stat in array.each_mut() {
                stat.reset_peak();
            }
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// torch's `reset_accumulated_memory_stats`: allocated/freed totals and the `num_*` counters
    /// go to 0; `max_split_size` stays.
    pub fn reset_accumulated(&mut self) {
        for array in self.arrays_mut() {
            for stat in array.each_mut() {
                stat.reset_accumulated();
            }
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
        self.num_oom_rejections = 0;
    }

    /// torch's flat `memory_stats()` dictionary: every key with its value, sorted by key.
    pub fn flat(&self) -> Vec<(String, i64)> {
        let mut out = Vec::with_capacity(9 * 12 + 8 + 7);
        for name in STAT_ARRAY_NAMES {
            let array = self.array(name).expect("every listed name is an array");
            for (pool, stat) in
                POOL_NAMES
                    .iter()
                    .zip([&array.all, &array.large_pool, &array.small_pool])
            {
                for f in FIELD_NAMES {
                    out.push((format!("{name}.{pool}.{f}"), field(stat, f)));
                }
            }
        }
        for (name, stat) in [
            ("oversize_allocations", &self.oversize_allocations),
            ("oversize_segments", &self.oversize_segments),
        ] {
            for f in FIELD_NAMES {
                out.push((format!("{name}.{f}"), field(stat, f)));
            }
        }
        // torch's int64 values; a larger one (a `max_split_size_mb` near 2^44 MiB) is reported
        // as i64::MAX rather than wrapping negative: -1 means unset and nothing else is negative.
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for (name, value) in [
            ("max_split_size", self.max_split_size.map_or(-1, int)),
            ("num_alloc_retries", int(self.num_alloc_retries)),
            ("num_device_alloc", int(self.num_device_alloc)),
            ("num_device_free", int(self.num_device_free)),
            ("num_oom_rejections", int(self.num_oom_rejections)),
            ("num_ooms", int(self.num_ooms)),
            ("num_sync_all_streams", int(self.num_sync_all_streams)),
        ] {
            out.push((String::from(name), value));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increase_and_decrease_follow_torch() {
        let mut s = Stat::default();
        s.increase(10);
        s.increase(5);
        s.decrease(12);
        assert_eq!(
            s,
            Stat {
                current: 3,
                peak: 15,
                allocated: 15,
                freed: 12
            }
        );
        s.apply(-3);
        s.apply(0);
        s.apply(4);
        assert_eq!(
            s,
            Stat {
                current: 4,
                peak: 15,
                allocated: 19,
                freed: 15
            }
        );
    }

    #[test]
    fn totals_stop_at_i64_max_and_current_never_saturates() {
        let mut s = Stat {
            current: 10,
            peak: 10,
            allocated: i64::MAX - 5,
            freed: i64::MAX - 1,
        };
        s.increase(100);
        s.decrease(3);
        assert_eq!(
            s,
            Stat {
                current: 107,
                peak: 110,
                allocated: i64::MAX,
                freed: i64::MAX
            }
        );
        s.apply(-7);
        s.apply(1);
        assert_eq!((s.current, s.allocated, s.freed), (101, i64::MAX, i64::MAX));
    }

    #[test]
    fn resets() {
        let mut d = DeviceStats {
            max_split_size: Some(64 << 20),
            ..DeviceStats::default()
        };
        d.allocated_bytes.increase(PoolKind::Large, 100);
        d.allocated_bytes.decrease(PoolKind::Large, 60);
        d.oversize_segments.increase(1);
        d.num_ooms = 3;
        d.reset_peak();
        assert_eq!(d.allocated_bytes.all.peak, 40);
        assert_eq!(d.allocated_bytes.large_pool.peak, 40);
        d.reset_accumulated();
        assert_eq!(
            d.allocated_bytes.all,
            Stat {
                current: 40,
                peak: 40,
                allocated: 0,
                freed: 0
            }
        );
        assert_eq!(
            d.oversize_segments,
            Stat {
                current: 1,
                peak: 1,
                allocated: 0,
                freed: 0
            }
        );
        assert_eq!(d.num_ooms, 0);
        assert_eq!(d.max_split_size, Some(64 << 20));
    }

    #[test]
    fn flat_has_every_torch_key_sorted() {
        let d = DeviceStats::default();
        let flat = d.flat();
        assert_eq!(flat.len(), 9 * 3 * 4 + 2 * 4 + 7);
        assert!(flat.windows(2).all(|w| w[0].0 < w[1].0));
        let get = |k: &str| flat.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert_eq!(get("max_split_size"), Some(-1));
        assert_eq!(get("reserved_bytes.large_pool.peak"), Some(0));
        assert_eq!(get("oversize_allocations.current"), Some(0));
        assert_eq!(get("inactive_split_bytes.all.current"), Some(0));
        assert_eq!(get("num_sync_all_streams"), Some(0));
        assert_eq!(get("num_oom_rejections"), Some(0));
    }

    #[test]
    fn a_max_split_size_past_i64_max_is_reported_as_i64_max() {
        // max_split_size_mb:17592186044415 is 2^64 - 2^20 bytes: never negative in the report.
        let d = DeviceStats {
            max_split_size: Some(17_592_186_044_415 << 20),
            ..DeviceStats::default()
        };
        let flat = d.flat();
        let get = |k: &str| flat.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert_eq!(get("max_split_size"), Some(i64::MAX));
        let d = DeviceStats {
            max_split_size: Some(i64::MAX as u64),
            ..DeviceStats::default()
        };
        assert_eq!(
            d.flat()
                .iter()
                .find(|(n, _)| n == "max_split_size")
                .unwrap()
                .1,
            i64::MAX
        );
    }
}
