//! A replay watched as it runs: memory curves for plots, the allocator's history and end state
//! for snapshots, and progress for long traces. The plain replayer pays for none of it.

use alloc_core::{SegmentInfo, TraceEntry};
use alloc_sim::SimStream;

use crate::exec::{self, Checks, Executor, Failure, Report, Setup, StatsRecord, Watch};
use crate::op::Trace;

/// What to watch during a replay.
#[derive(Default)]
pub struct Observe<'a> {
    /// Sample allocated, reserved and active bytes over the operations (at most
    /// [`SERIES_POINTS`] points: each one holds the largest values of its stretch of operations,
    /// so no peak is lost).
    pub series: bool,
    /// Record the allocator's history (torch's `_record_memory_history`) in a ring of this many
    /// entries, with each operation's index as its time, and keep the end state.
    pub history: Option<usize>,
    /// Called now and then with the number of operations done.
    pub progress: Option<&'a dyn Fn(u64)>,
    /// Handed each `stats` line's record as it is taken; the report then keeps none (a trace
    /// with a million `stats` lines would otherwise hold a million records).
    pub stats: Option<&'a dyn Fn(StatsRecord)>,
}

/// The most points a series keeps.
pub const SERIES_POINTS: usize = 4000;

/// One point of a memory curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// The index of the last operation of its stretch.
    pub op: u64,
    /// `allocated_bytes.all.current`, the largest over the stretch.
    pub allocated: i64,
    /// `reserved_bytes.all.current`, the largest over the stretch.
    pub reserved: i64,
    /// `active_bytes.all.current`, the largest over the stretch.
    pub active: i64,
}

/// The allocator's state at the end of a replay, for a snapshot.
#[derive(Debug, Clone)]
pub struct EndState {
    /// Segments and blocks (torch's `memory_snapshot()`).
    pub segments: Vec<SegmentInfo<SimStream>>,
    /// The history, oldest first.
    pub history: Vec<TraceEntry<SimStream>>,
    /// Entries the ring dropped.
    pub dropped: u64,
    /// The configuration in force at the end.
    pub conf: alloc_conf::AllocConf,
}

/// What a watched replay saw.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The memory curve, if asked for.
    pub series: Vec<Point>,
    /// The end state, if history was asked for.
    pub end: Option<EndState>,
}

/// Replays `trace` (with `checks`, if any) while watching what `observe` asks for.
pub fn replay_observed(
    trace: &Trace,
    setup: &Setup,
    checks: Option<Checks>,
    observe: &Observe<'_>,
) -> Result<(Report, Observed), Box<Failure>> {
    let n = trace.ops.len();
    let mut watcher = Watcher {
        observe,
        stretch: n.div_ceil(SERIES_POINTS).max(1),
        n,
        stretch_peak: None,
        observed: Observed::default(),
    };
    let report = exec::run_watched(trace, setup, checks, &mut watcher)?;
    Ok((report, watcher.observed))
}

/// The [`Watch`] behind [`replay_observed`].
struct Watcher<'o, 'p> {
    observe: &'o Observe<'p>,
    /// Operations per point of the series.
    stretch: usize,
    /// Operations in the trace.
    n: usize,
    /// The largest values of the current stretch.
    stretch_peak: Option<Point>,
    observed: Observed,
}

impl Watch for Watcher<'_, '_> {
    fn before(&mut self, index: usize, exec: &mut Executor) {
        let alloc = exec.allocator_mut();
        if index == 0
            && let Some(max) = self.observe.history
        {
            alloc.record_history(Some(max));
        }
        if self.observe.history.is_some() {
            alloc.set_time(index as u64);
        }
    }

    fn after(&mut self, index: usize, exec: &mut Executor) {
        if let Some(sink) = self.observe.stats {
            exec.take_records().for_each(sink);
        }
        if self.observe.series {
            let s = exec.allocator().stats();
            let now = Point {
                op: index as u64,
                allocated: s.allocated_bytes.all.current,
                reserved: s.reserved_bytes.all.current,
                active: s.active_bytes.all.current,
            };
            let p = self.stretch_peak.get_or_insert(now);
            p.op = now.op;
            p.allocated = p.allocated.max(now.allocated);
            p.reserved = p.reserved.max(now.reserved);
            p.active = p.active.max(now.active);
            if (index + 1).is_multiple_of(self.stretch) || index + 1 == self.n {
                self.observed.series.extend(self.stretch_peak.take());
            }
        }
        if let Some(progress) = self.observe.progress
            && index % 4096 == 4095
        {
            progress(index as u64 + 1);
        }
    }

    fn end(&mut self, exec: &Executor) {
        if self.observe.history.is_none() {
            return;
        }
        let alloc = exec.allocator();
        let (history, dropped) = alloc.history();
        self.observed.end = Some(EndState {
            segments: alloc.snapshot(),
            history,
            dropped,
            conf: alloc.conf().clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_str;
    use alloc_conf::AllocConf;
    use std::cell::RefCell;

    #[test]
    fn stats_records_go_to_the_sink_as_they_are_taken_and_the_report_keeps_none() {
        let trace = parse_str(
            "t",
            "pad 0\nalloc a 1000\nstats one\nalloc b 3M 1\nfree a\nstats\n",
        )
        .unwrap();
        let setup = Setup::from_trace(&trace, AllocConf::default(), None, None);
        let seen = RefCell::new(Vec::new());
        let sink = |r: StatsRecord| {
            seen.borrow_mut().push((
                r.label,
                r.line,
                r.stats.allocated_bytes.all.current,
                r.stats.reserved_bytes.all.current,
            ));
        };
        let observe = Observe {
            stats: Some(&sink),
            ..Observe::default()
        };
        let (report, _) = replay_observed(&trace, &setup, None, &observe).unwrap();
        assert!(report.records.is_empty());
        assert_eq!(
            seen.into_inner(),
            [
                ("one".to_owned(), 3, 1024, 2 << 20),
                ("line 6".to_owned(), 6, 3 << 20, 22 << 20),
            ]
        );
        assert_eq!(report.end.line, 6);
    }
}
