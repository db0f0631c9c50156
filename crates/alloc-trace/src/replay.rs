//! The replayer: feeds a parsed `.trace` through `alloc-core`'s allocator on the simulated device,
//! exactly as a runtime would drive it, and collects torch's stats at every `stats` line and at
//! the end. It is the [executor](crate::exec) without checks; `replay --check` is the same run
//! with every check of the stress engine after every operation.
//!
//! Parsing the config string is the caller's job (it owns how warnings are shown); the replayer
//! takes the typed [`AllocConf`](alloc_conf::AllocConf) in its [`Setup`].

use crate::exec::{self, Checks, Failure, Report, Setup};
use crate::op::Trace;

/// Replays `trace` with `setup` and returns the stats records and counts, or the operation that
/// stopped it.
pub fn replay(trace: &Trace, setup: &Setup) -> Result<Report, Box<Failure>> {
    exec::run(trace, setup, None)
}

/// Replays `trace` with every check after every operation (`replay --check`).
pub fn replay_checked(
    trace: &Trace,
    setup: &Setup,
    checks: Checks,
) -> Result<Report, Box<Failure>> {
    exec::run(trace, setup, Some(checks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{DEFAULT_PAD, OpCounts, StatsRecord};
    use crate::parse::parse_str;
    use alloc_conf::AllocConf;
    use alloc_core::DeviceStats;
    use alloc_sim::DEFAULT_CAPACITY;

    const MIB: u64 = 1 << 20;

    fn run(text: &str) -> Report {
        let trace = parse_str("t.trace", text).unwrap();
        replay(
            &trace,
            &Setup::from_trace(&trace, AllocConf::default(), None, None),
        )
        .unwrap()
    }

    fn get(r: &StatsRecord, key: &str) -> i64 {
        r.stats
            .flat()
            .into_iter()
            .find(|(k, _)| k == key)
            .unwrap()
            .1
    }

    #[test]
    fn directives_and_overrides() {
        let trace = parse_str("t", "capacity 1G\npad 0\ndevice_overhead 1M\nalloc a 1\n").unwrap();
        let s = Setup::from_trace(&trace, AllocConf::default(), None, None);
        assert_eq!((s.capacity, s.pad, s.device_overhead), (1 << 30, 0, MIB));
        let s = Setup::from_trace(&trace, AllocConf::default(), Some(2 << 30), Some(32));
        assert_eq!((s.capacity, s.pad), (2 << 30, 32));
        let bare = parse_str("t", "alloc a 1\n").unwrap();
        let s = Setup::from_trace(&bare, AllocConf::default(), None, None);
        assert_eq!(
            (s.capacity, s.pad, s.device_overhead),
            (DEFAULT_CAPACITY, DEFAULT_PAD, 0)
        );
    }

    #[test]
    fn stats_records_and_end() {
        let r = run("pad 0\nalloc a 1000\nstats one\nalloc b 3M 1\nfree a\nstats\n");
        assert_eq!(r.records.len(), 2);
        assert_eq!((r.records[0].label.as_str(), r.records[0].line), ("one", 3));
        assert_eq!(get(&r.records[0], "allocated_bytes.all.current"), 1024);
        assert_eq!(r.records[1].label, "line 6");
        assert_eq!(
            get(&r.records[1], "allocated_bytes.all.current"),
            (3 * MIB) as i64
        );
        assert_eq!(
            get(&r.records[1], "reserved_bytes.all.current"),
            (22 * MIB) as i64
        );
        assert_eq!(r.end.line, 6);
        assert_eq!(
            r.counts,
            OpCounts {
                ops: 6 - 1,
                allocs: 2,
                frees: 1,
                ..OpCounts::default()
            }
        );
        assert_eq!((r.device_mallocs, r.device_frees), (2, 0));
    }

    #[test]
    fn oom_is_recorded_and_later_frees_are_skipped() {
        let r = run("capacity 30M\npad 0\nalloc a 12M\nalloc b 20M\nrecord b 1\nfree b\nfree a\n");
        assert_eq!(r.counts.ooms, 1);
        assert_eq!(r.counts.skipped, 2);
        assert_eq!(get(&r.end, "num_ooms"), 1);
        assert_eq!(get(&r.end, "num_alloc_retries"), 1);
        assert_eq!(get(&r.end, "allocated_bytes.all.current"), 0);
    }

    #[test]
    fn huge_and_zero_allocations() {
        let r = run("alloc a 0\nalloc b 1152921504606846976\nfree a\nfree b\n");
        assert_eq!(r.counts.refused, 1);
        assert_eq!(r.counts.ooms, 0);
        assert_eq!(r.counts.skipped, 1);
        assert_eq!(r.end.stats, DeviceStats::default());
    }

    #[test]
    fn record_complete_and_fraction() {
        let r = run(
            "pad 0\ncapacity 100M\nalloc a 4K\nrecord a 1\nfree a\nalloc b 4K\nstats pending\n\
             complete 1\nalloc c 4K\nstats done\nfraction 0.5\nempty_cache\n",
        );
        assert_eq!(get(&r.records[0], "active.all.current"), 2);
        assert_eq!(get(&r.records[1], "active.all.current"), 2, "a reused by c");
        assert_eq!(get(&r.end, "num_sync_all_streams"), 1);
    }

    #[test]
    fn frees_and_records_of_an_id_whose_alloc_ran_out_of_memory_are_skipped() {
        // The parser cannot know which allocs fail; the replay skips what names a failed id
        // until the id is allocated again (here the 2 MiB request needs a 20 MiB segment; the
        // 512 KiB one fits a 2 MiB small segment). The issue's own example first:
        let r = run("capacity 1M\nalloc a 2M\nfree a\nrecord a 1\n");
        assert_eq!((r.counts.ooms, r.counts.skipped), (1, 2));
        let r = run("capacity 4M\nalloc a 2M\nfree a\nrecord a 1\nalloc a 512K\nfree a\n");
        assert_eq!(r.counts.ooms, 1);
        assert_eq!(r.counts.skipped, 2);
        assert_eq!(get(&r.end, "num_ooms"), 1);
        assert_eq!(
            get(&r.end, "allocation.all.allocated"),
            1,
            "the second alloc of `a`"
        );
    }
}
