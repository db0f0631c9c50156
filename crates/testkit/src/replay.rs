//! The trace replayer: feeds a parsed `.trace` through `alloc-core`'s [`Allocator`] on a
//! [`SimDevice`], exactly as a runtime would drive it, and collects torch's stats at every
//! `stats` line and at the end.
//!
//! Parsing the config string is the caller's job (it owns how warnings are shown); the replayer
//! takes the typed [`AllocConf`].

use core::fmt;

use alloc_conf::AllocConf;
use alloc_core::{
    AllocError, Allocator, DeviceFacts, DeviceStats, FractionError, FreeError, Notice, StreamId,
};

use crate::sim_device::{DEFAULT_CAPACITY, SimDevice, SimError};
use crate::trace::{OpKind, Trace};

/// Everything that shapes a replay besides the operations: the trace's directives, overridden by
/// the command line where given.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// The allocator configuration.
    pub conf: AllocConf,
    /// Total memory of the simulated device.
    pub capacity: u64,
    /// Memory the device reports as used by others.
    pub device_overhead: u64,
    /// Bytes added to every request before rounding (32 for torch_npu, 0 for CUDA parity).
    pub pad: u64,
}

/// The pad torch_npu adds on today's Ascend parts, the default of a trace without `pad`.
pub const DEFAULT_PAD: u64 = 32;

impl Setup {
    /// The trace's directives with `capacity` / `pad` overrides applied.
    pub fn from_trace(
        trace: &Trace,
        conf: AllocConf,
        capacity: Option<u64>,
        pad: Option<u64>,
    ) -> Setup {
        Setup {
            conf,
            capacity: capacity.or(trace.capacity).unwrap_or(DEFAULT_CAPACITY),
            device_overhead: trace.device_overhead.unwrap_or(0),
            pad: pad.or(trace.pad).unwrap_or(DEFAULT_PAD),
        }
    }
}

/// torch's stats at one point of the replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsRecord {
    /// The `stats` line's label, or `"end"`.
    pub label: String,
    /// The trace line the record was taken at.
    pub line: usize,
    /// Every stat of `memory_stats()`.
    pub stats: DeviceStats,
}

/// Operation counts of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpCounts {
    /// Operations executed (every line but comments and directives).
    pub ops: u64,
    /// `alloc` lines.
    pub allocs: u64,
    /// `free` lines.
    pub frees: u64,
    /// Allocations that failed with out-of-memory (each counts in `num_ooms`).
    pub ooms: u64,
    /// Allocations of 1 EiB or more, refused before the allocator runs.
    pub refused: u64,
    /// `free` / `record` lines of ids whose allocation had failed.
    pub skipped: u64,
}

/// The outcome of a replay.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    /// One record per `stats` line.
    pub records: Vec<StatsRecord>,
    /// The stats after the last operation.
    pub end: StatsRecord,
    /// Operation counts.
    pub counts: OpCounts,
    /// Device mallocs that succeeded.
    pub device_mallocs: u64,
    /// Device frees.
    pub device_frees: u64,
    /// The largest number of bytes the device had handed out at once, over the whole replay
    /// (peak reserved, unaffected by `reset_peak`).
    pub device_peak_bytes: u64,
    /// The largest `requested_bytes.all.current` over the whole replay (unaffected by
    /// `reset_peak`).
    pub peak_requested_bytes: u64,
    /// Things the allocator reported (e.g. unsupported expandable segments).
    pub notices: Vec<Notice>,
    /// The setup the replay ran with.
    pub setup: Setup,
}

/// A replay that could not go on: the simulated device failed in a way a trace cannot cause
/// without fault injection, or an operation was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayError {
    /// A device error other than out-of-memory.
    Device {
        /// Trace line of the operation.
        line: usize,
        /// The device's error.
        error: SimError,
    },
    /// A `free` or `record` the allocator refused.
    Free {
        /// Trace line of the operation.
        line: usize,
        /// The allocator's error.
        error: FreeError<SimError>,
    },
    /// A `fraction` the allocator refused.
    Fraction {
        /// Trace line of the operation.
        line: usize,
        /// The allocator's error.
        error: FractionError,
    },
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Device { line, error } => write!(f, "line {line}: device error: {error}"),
            ReplayError::Free { line, error } => write!(f, "line {line}: {error}"),
            ReplayError::Fraction { line, error } => write!(f, "line {line}: {error}"),
        }
    }
}

impl std::error::Error for ReplayError {}

/// Where one trace id stands during the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Not allocated.
    Dead,
    /// Allocated at this address (0 for a zero-size allocation).
    Live(u64),
    /// Its allocation failed; a later `free` / `record` is skipped.
    Failed,
}

/// Replays `trace` with `setup` and returns the stats records and counts.
pub fn replay(trace: &Trace, setup: &Setup) -> Result<ReplayReport, ReplayError> {
    let device = SimDevice::new(setup.capacity).with_device_overhead(setup.device_overhead);
    let facts = DeviceFacts {
        index: 0,
        pad: setup.pad,
        total_memory: None,
    };
    let mut alloc = Allocator::new(device, &setup.conf, facts);
    let mut slots = vec![Slot::Dead; trace.id_count()];
    let mut counts = OpCounts::default();
    let mut records = Vec::new();
    let mut last_line = 0;
    let mut peak_requested = 0;
    for op in &trace.ops {
        let line = op.line;
        last_line = line;
        counts.ops += 1;
        match &op.kind {
            OpKind::Alloc { id, size, stream } => {
                counts.allocs += 1;
                slots[id.index()] = match alloc.malloc(*size, StreamId(*stream)) {
                    Ok(addr) => {
                        let requested = alloc.stats().requested_bytes.all.current as u64;
                        peak_requested = peak_requested.max(requested);
                        Slot::Live(addr)
                    }
                    Err(AllocError::OutOfMemory(_)) => {
                        counts.ooms += 1;
                        Slot::Failed
                    }
                    Err(AllocError::TooLarge { .. }) => {
                        counts.refused += 1;
                        Slot::Failed
                    }
                    Err(AllocError::Device(error)) => {
                        return Err(ReplayError::Device { line, error });
                    }
                };
            }
            OpKind::Free { id } => {
                counts.frees += 1;
                match std::mem::replace(&mut slots[id.index()], Slot::Dead) {
                    Slot::Live(addr) => alloc
                        .free(addr)
                        .map_err(|error| ReplayError::Free { line, error })?,
                    Slot::Failed | Slot::Dead => counts.skipped += 1,
                }
            }
            OpKind::Record { id, stream } => match slots[id.index()] {
                Slot::Live(addr) => alloc
                    .record_stream(addr, StreamId(*stream))
                    .map_err(|error| ReplayError::Free { line, error })?,
                Slot::Failed | Slot::Dead => counts.skipped += 1,
            },
            OpKind::Complete { stream: Some(s) } => {
                alloc.device_mut().complete_stream(StreamId(*s))
            }
            OpKind::Complete { stream: None } => alloc.device_mut().complete_all(),
            OpKind::EmptyCache => alloc
                .empty_cache()
                .map_err(|error| ReplayError::Device { line, error })?,
            OpKind::Fraction(f) => alloc
                .set_memory_fraction(*f)
                .map_err(|error| ReplayError::Fraction { line, error })?,
            OpKind::ResetPeak => alloc.reset_peak_stats(),
            OpKind::ResetAccumulated => alloc.reset_accumulated_stats(),
            OpKind::Stats { label } => records.push(StatsRecord {
                label: label.clone().unwrap_or_else(|| format!("line {line}")),
                line,
                stats: alloc.stats().clone(),
            }),
        }
    }
    let device = alloc.device();
    Ok(ReplayReport {
        end: StatsRecord {
            label: "end".into(),
            line: last_line,
            stats: alloc.stats().clone(),
        },
        records,
        counts,
        device_mallocs: device.successful_mallocs(),
        device_frees: device.frees(),
        device_peak_bytes: device.peak_outstanding_bytes(),
        peak_requested_bytes: peak_requested,
        notices: alloc.notices().to_vec(),
        setup: setup.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::parse_str;

    const MIB: u64 = 1 << 20;

    fn run(text: &str) -> ReplayReport {
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
}
