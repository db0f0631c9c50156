//! The stress engine behind `cargo xtask stress`: long random sequences of every allocator
//! operation, with random device faults, on a capacity-limited [`SimDevice`], checked after every
//! operation.
//!
//! A run is generated from a seed by a small PRNG ([`StressParams::seed`]); every operation is
//! recorded as data ([`StressOp`]) so that a failure can be re-executed, shrunk to a short
//! sequence that still fails the same way ([`shrink`]), and printed as `.trace` text
//! ([`to_trace`]). After each operation the runner checks:
//!
//! - everything [`check_allocations`](crate::check::check_allocations) checks: blocks tile their
//!   segments, every stat equals a recount from the block table, peaks are at least the current
//!   values, reserved equals the device's outstanding bytes and segments, allocated ≤ active ≤
//!   reserved, and every address the caller holds is an allocated block of its own;
//! - that every returned address is 512-aligned, lies inside a live device segment and overlaps no
//!   other live allocation;
//! - that the operation's result is what the API promises: a zero-size request gives the null
//!   address and a request of 1 EiB or more is refused, both changing nothing; an out-of-memory
//!   error is legitimate (the device or the fraction limit really had no room, unless a fault was
//!   injected) and counted in `num_ooms`; a device error appears only when a fault fired, and
//!   then allocates and frees nothing; misuse (double free, foreign or interior pointer,
//!   `record_stream` of a freed block) is a typed error that changes no stat and makes no device
//!   call; the `num_device_*` and `num_ooms` counters match the device and the runner's counts;
//! - after freeing everything and `empty_cache` (every [`StressOp::Drain`], and always at the end,
//!   with faults cleared first), that the device has no bytes, segments or events outstanding.

mod exec;
mod generate;
mod rng;
mod shrink;
mod text;

use core::fmt;
use std::time::Duration;

use alloc_conf::AllocConf;
use alloc_core::{Allocator, DeviceFacts, Notice};

use crate::check::Inconsistency;
use crate::fault::{DeviceCall, Fault};
use crate::sim_device::SimDevice;

pub use shrink::shrink;
pub use text::to_trace;

/// One operation of a stress run. Allocations are named by `id`, the index of the operation
/// that made them; an operation naming an id that is not live when it runs is skipped, so any
/// subsequence of a run is a valid run (which is what shrinking needs).
#[derive(Debug, Clone, PartialEq)]
pub enum StressOp {
    /// `malloc(size, stream)`; the allocation is named `id`.
    Alloc {
        /// The allocation's name.
        id: u64,
        /// Requested bytes.
        size: u64,
        /// The stream.
        stream: u64,
    },
    /// `free` of allocation `id`.
    Free {
        /// The allocation's name.
        id: u64,
    },
    /// `record_stream` of allocation `id` on `stream`.
    Record {
        /// The allocation's name.
        id: u64,
        /// The stream it is used on.
        stream: u64,
    },
    /// Work queued on `stream` (every stream if `None`) completes on the device.
    Complete {
        /// The stream, or `None` for all.
        stream: Option<u64>,
    },
    /// `empty_cache`.
    EmptyCache,
    /// `set_per_process_memory_fraction`.
    Fraction(f64),
    /// `reset_peak_memory_stats`.
    ResetPeak,
    /// `reset_accumulated_memory_stats`.
    ResetAccumulated,
    /// A call the API must refuse with a typed error, changing nothing.
    Misuse(Misuse),
    /// The device fails its `nth` next call of `call` with `fault`.
    Fault {
        /// The device call that fails.
        call: DeviceCall,
        /// Which call from now (1: the next one).
        nth: u64,
        /// How it fails.
        fault: Fault,
    },
    /// Clear pending faults, free every live allocation, `empty_cache`, and check that the device
    /// has nothing outstanding.
    Drain,
}

/// A misuse of the API; each must fail with a typed error and change nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misuse {
    /// `free` of an address freed earlier (the `pick`-th most recently freed one still dead).
    DoubleFree {
        /// Which recently freed address.
        pick: u64,
    },
    /// `record_stream` of an address freed earlier.
    RecordFreed {
        /// Which recently freed address.
        pick: u64,
    },
    /// `free` of an address no segment contains.
    ForeignPointer {
        /// The address.
        addr: u64,
    },
    /// `free` of a live allocation's address plus one byte.
    InteriorPointer {
        /// The allocation's name.
        id: u64,
    },
}

/// Everything that shapes a stress run.
#[derive(Debug, Clone, PartialEq)]
pub struct StressParams {
    /// The PRNG seed: the same seed and parameters give the same operations.
    pub seed: u64,
    /// Operations to generate (the final drain comes on top).
    pub ops: u64,
    /// The alloc-conf string, as shown in reports and trace output.
    pub conf_text: String,
    /// The parsed configuration.
    pub conf: AllocConf,
    /// Total memory of the simulated device.
    pub capacity: u64,
    /// Bytes added to every request before rounding (32: torch_npu).
    pub pad: u64,
    /// Streams `0..streams` are used.
    pub streams: u64,
    /// Above this many live allocations the generator frees more than it allocates.
    pub max_live: usize,
    /// The probability that an operation is an injected device fault.
    pub fault_rate: f64,
    /// Whether `set_per_process_memory_fraction` operations are generated.
    pub fraction_ops: bool,
}

/// Capacity of the simulated device by default: small enough that the real traces' sizes run
/// out of memory often.
pub const DEFAULT_CAPACITY: u64 = 2 << 30;
/// Live allocations the generator aims to stay below by default.
pub const DEFAULT_MAX_LIVE: usize = 128;
/// Default fault rate: one operation in 50 injects a device fault.
pub const DEFAULT_FAULT_RATE: f64 = 0.02;

impl StressParams {
    /// Defaults for `conf_text` (parsed with `alloc_conf::parse`; warnings are the caller's to
    /// show): [`DEFAULT_CAPACITY`], torch_npu's 32-byte pad, 4 streams, [`DEFAULT_MAX_LIVE`],
    /// [`DEFAULT_FAULT_RATE`], and fraction operations unless the configuration's GC relies on
    /// running without a fraction.
    pub fn new(seed: u64, ops: u64, conf_text: &str) -> StressParams {
        let conf = alloc_conf::parse(conf_text).conf;
        let fraction_ops =
            conf.garbage_collection_threshold.is_none() || conf.per_process_memory_fraction < 1.0;
        StressParams {
            seed,
            ops,
            conf_text: conf_text.to_string(),
            conf,
            capacity: DEFAULT_CAPACITY,
            pad: crate::replay::DEFAULT_PAD,
            streams: 4,
            max_live: DEFAULT_MAX_LIVE,
            fault_rate: DEFAULT_FAULT_RATE,
            fraction_ops,
        }
    }

    /// A fresh allocator on a fresh device for these parameters.
    pub fn allocator(&self) -> Allocator<SimDevice> {
        let facts = DeviceFacts {
            index: 0,
            pad: self.pad,
            total_memory: None,
        };
        Allocator::new(SimDevice::new(self.capacity), &self.conf, facts)
    }
}

/// The configurations that change the policy, each a (name, alloc-conf string) pair: the ones
/// `cargo xtask stress` runs when no `--conf` is given.
pub const VARIANTS: [(&str, &str); 6] = [
    ("defaults", ""),
    ("max_split_size_mb", "max_split_size_mb:40"),
    (
        "roundup_power2_divisions",
        "roundup_power2_divisions:[1:4,64:8,>:2]",
    ),
    ("gc", "garbage_collection_threshold:0.6"),
    (
        "gc+fraction",
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
    ),
    ("expandable_segments", "expandable_segments:True"),
];

/// Why a configuration cannot be stressed as itself (today: `expandable_segments:True`, which the
/// allocator runs as `False` until it is implemented), or `None` when it can.
pub fn unsupported(conf: &AllocConf) -> Option<Notice> {
    let alloc = Allocator::new(SimDevice::new(1 << 30), conf, DeviceFacts::npu(0));
    alloc
        .notices()
        .iter()
        .copied()
        .find(|n| *n == Notice::ExpandableSegmentsUnsupported)
}

/// What a passing run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StressReport {
    /// Operations executed, the final drain included.
    pub ops: u64,
    /// `malloc` calls (every size).
    pub allocs: u64,
    /// `free` calls of live allocations.
    pub frees: u64,
    /// `record_stream` calls.
    pub records: u64,
    /// `empty_cache` calls (drains included).
    pub empty_caches: u64,
    /// Allocations that failed with out-of-memory.
    pub ooms: u64,
    /// Allocations of 1 EiB or more, refused up front.
    pub refused: u64,
    /// Misuse calls, each refused with a typed error.
    pub misuses: u64,
    /// Drains (free everything, `empty_cache`, check the device is empty).
    pub drains: u64,
    /// Faults scheduled on the device.
    pub faults_scheduled: u64,
    /// Scheduled faults that fired (a fault still waiting for its call at a drain is dropped).
    pub faults_fired: u64,
    /// Operations that returned a typed device error because a fault fired.
    pub device_errors: u64,
    /// Operations that succeeded although a fault fired in them (a documented fallback, or an
    /// injected out-of-memory the retry chain absorbed).
    pub absorbed_faults: u64,
    /// Segments the device handed out.
    pub device_mallocs: u64,
    /// Segments given back to the device.
    pub device_frees: u64,
    /// The most live allocations at once.
    pub peak_live: usize,
    /// The most bytes the device had handed out at once.
    pub peak_reserved: u64,
}

/// Which check an operation broke, besides the invariants of [`Inconsistency`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A call returned a result its contract does not allow.
    UnexpectedResult,
    /// A returned address is 0 or not a multiple of 512.
    BadAddress,
    /// A returned address range overlaps a live allocation.
    Overlap,
    /// A returned address range is not inside one live device segment.
    OutsideSegment,
    /// Out-of-memory although the device and the fraction limit had room and no fault fired.
    SpuriousOutOfMemory,
    /// An operation that must change no stat changed one.
    StatsChanged,
    /// An operation that must not call the device did.
    DeviceCalled,
    /// A counter (`num_ooms`, `num_device_alloc`, `num_device_free`, `allocation`, allocated,
    /// freed) disagrees with what the runner counted.
    Counter,
    /// `empty_cache` left a whole free segment or a pending event behind.
    CacheNotEmptied,
    /// `set_per_process_memory_fraction` set a different limit.
    Fraction,
    /// After freeing everything and `empty_cache`, the device still has something outstanding.
    Leak,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rule::UnexpectedResult => "unexpected result",
            Rule::BadAddress => "bad address",
            Rule::Overlap => "overlapping allocations",
            Rule::OutsideSegment => "allocation outside a device segment",
            Rule::SpuriousOutOfMemory => "spurious out-of-memory",
            Rule::StatsChanged => "stats changed",
            Rule::DeviceCalled => "device called",
            Rule::Counter => "counter mismatch",
            Rule::CacheNotEmptied => "empty_cache left cached memory",
            Rule::Fraction => "wrong memory limit",
            Rule::Leak => "leak",
        })
    }
}

/// Why a stress run failed at one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StressError {
    /// An allocator invariant is broken.
    Inconsistent(Inconsistency),
    /// An operation broke a rule of its contract.
    Broken {
        /// Which rule.
        rule: Rule,
        /// The numbers.
        detail: String,
    },
    /// The allocator (or the simulated device) panicked.
    Panic(String),
}

impl StressError {
    /// Whether `other` is the same kind of failure (same variant, rule or invariant), which is
    /// what shrinking preserves.
    pub fn same_kind(&self, other: &StressError) -> bool {
        match (self, other) {
            (StressError::Inconsistent(a), StressError::Inconsistent(b)) => {
                core::mem::discriminant(a) == core::mem::discriminant(b)
            }
            (StressError::Broken { rule: a, .. }, StressError::Broken { rule: b, .. }) => a == b,
            (StressError::Panic(_), StressError::Panic(_)) => true,
            _ => false,
        }
    }
}

impl fmt::Display for StressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StressError::Inconsistent(e) => write!(f, "inconsistent: {e}"),
            StressError::Broken { rule, detail } => write!(f, "{rule}: {detail}"),
            StressError::Panic(msg) => write!(f, "panic: {msg}"),
        }
    }
}

impl std::error::Error for StressError {}

/// A failed stress run: how to reproduce it, and the shrunk operations that still fail.
#[derive(Debug, Clone, PartialEq)]
pub struct StressFailure {
    /// The run's parameters (seed, configuration, capacity...).
    pub params: StressParams,
    /// Index of the failing operation in the generated run (`ops` generated: the final drain).
    pub op_index: u64,
    /// The failure at that operation.
    pub error: StressError,
    /// The shortest failing operation sequence found (the final drain is implicit).
    pub ops: Vec<StressOp>,
    /// The error of the shrunk sequence (same kind as `error`).
    pub shrunk_error: StressError,
    /// Index of the failing operation in `ops` (`ops.len()`: the final drain).
    pub shrunk_index: usize,
}

impl fmt::Display for StressFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.params;
        writeln!(
            f,
            "stress failure: seed {} conf {:?}, operation {} of {}: {}",
            p.seed, p.conf_text, self.op_index, p.ops, self.error
        )?;
        writeln!(
            f,
            "reproduce: cargo xtask stress --seed {} --ops {} --conf {:?} --capacity {} --pad {} \
             --max-live {} --fault-rate {}",
            p.seed,
            (self.op_index + 1).min(p.ops),
            p.conf_text,
            p.capacity,
            p.pad,
            p.max_live,
            p.fault_rate
        )?;
        writeln!(
            f,
            "shrunk to {} operations (failing at {}: {}):",
            self.ops.len(),
            self.shrunk_index,
            self.shrunk_error
        )?;
        f.write_str(&to_trace(p, &self.ops))
    }
}

impl std::error::Error for StressFailure {}

/// Runs the stress test `params` describes; on failure, shrinks the failing sequence for at
/// most `shrink_budget`.
pub fn run(
    params: &StressParams,
    shrink_budget: Duration,
) -> Result<StressReport, Box<StressFailure>> {
    let (ops, result) = exec::generate_and_run(params);
    let (op_index, error) = match result {
        Ok(report) => return Ok(report),
        Err(failure) => failure,
    };
    // The failing operation is the last one kept (the final drain is implicit).
    let prefix = ops[..(op_index + 1).min(ops.len())].to_vec();
    let ops = shrink(prefix, shrink_budget, |candidate| {
        match exec::run_ops(params, candidate) {
            Err((index, e)) if e.same_kind(&error) => Some(index),
            _ => None,
        }
    });
    let (shrunk_index, shrunk_error) = match exec::run_ops(params, &ops) {
        Err(failure) => failure,
        // Runs are deterministic, so this only happens if the device or allocator is not.
        Ok(_) => (op_index, error.clone()),
    };
    Err(Box::new(StressFailure {
        params: params.clone(),
        op_index: op_index as u64,
        error,
        ops,
        shrunk_error,
        shrunk_index,
    }))
}

/// Re-executes a recorded operation sequence (plus the final drain) with every check, as a
/// run does: `Err((index, error))` names the failing operation (`ops.len()`: the final drain).
pub fn run_ops(
    params: &StressParams,
    ops: &[StressOp],
) -> Result<StressReport, (usize, StressError)> {
    exec::run_ops(params, ops)
}
