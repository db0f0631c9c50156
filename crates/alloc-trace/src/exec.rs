//! The one executor: runs [`Op`]s through `alloc-core`'s [`Allocator`] on the simulated device
//! behind a fault injector, exactly as a runtime drives it. The replayer, `replay --check`, the
//! stress engine, the property tests and the fuzz targets all run operations through it.
//!
//! Without checks it is the replayer's fast path: each operation is one allocator call and the
//! bookkeeping of its id. With checks ([`Executor::checked`]) every operation's result is judged
//! against its contract and every invariant is checked after it:
//!
//! - everything [`check_allocations`] checks: blocks tile their segments, every stat equals a
//!   recount from the block table, peaks are at least the current values, reserved equals the
//!   device's outstanding bytes and segments, allocated ≤ active ≤ reserved, and every address the
//!   caller holds is an allocated block of its own;
//! - that every returned address is 512-aligned, lies inside a live device segment and overlaps no
//!   other live allocation;
//! - that the result is what the API promises: a zero-size request gives the null address and a
//!   request of 1 EiB or more is refused, both changing nothing; an out-of-memory error is
//!   legitimate (the device or the fraction limit really had no room, unless a fault was
//!   injected) and counted in `num_ooms`; a device error appears only when a fault fired, and
//!   then allocates and frees nothing; misuse (double free, foreign or interior pointer,
//!   `record_stream` of a freed block) is a typed error that changes no stat and makes no device
//!   call; the `num_device_*` and `num_ooms` counters match the device and the executor's counts;
//! - after a `drain` (free everything and `empty_cache`, faults cleared first), that the device
//!   has no bytes, segments or events outstanding.

use core::fmt;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

use alloc_conf::AllocConf;
use alloc_core::size::MAX_REQUEST;
use alloc_core::{
    AllocError, Allocator, BlockState, DeviceFacts, DeviceStats, Flavour, FractionError, FreeError,
    PoolError, PoolId, STAT_ARRAY_NAMES, SaverError,
};
use alloc_sim::{
    DeviceCall, Fault, FaultError, Inconsistency, SimDevice, SimError, SimStream, TestDevice,
    check_allocations,
};

use crate::op::{IdRef, Misuse, Op, OpKind, PoolOp, Trace};
use crate::parse::Echo;

/// The simulated device's error as the executor sees it (behind the fault injector).
pub type DeviceErr = FaultError<SimError>;

/// The pad torch_npu adds on today's Ascend parts, the default of a trace without `pad`.
pub const DEFAULT_PAD: u64 = 32;

/// Everything that shapes a run besides the operations: the trace's directives, overridden by
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
    /// Whose retry chain the allocator follows (torch_npu's unless the trace says `cuda`).
    pub flavour: Flavour,
}

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
            capacity: capacity
                .or(trace.capacity)
                .unwrap_or(alloc_sim::DEFAULT_CAPACITY),
            device_overhead: trace.device_overhead.unwrap_or(0),
            pad: pad.or(trace.pad).unwrap_or(DEFAULT_PAD),
            flavour: trace.flavour.unwrap_or(Flavour::TorchNpu),
        }
    }

    /// A fresh allocator on a fresh simulated device for this setup.
    pub fn allocator(&self) -> Allocator<TestDevice> {
        let device = SimDevice::new(self.capacity).with_device_overhead(self.device_overhead);
        let facts = DeviceFacts {
            index: 0,
            pad: self.pad,
            total_memory: None,
            flavour: self.flavour,
            huge_pages_1g: true,
        };
        Allocator::new(TestDevice::new(device), &self.conf, facts)
    }
}

/// torch's stats at one point of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsRecord {
    /// The `stats` line's label, or `"end"`.
    pub label: String,
    /// The trace line the record was taken at.
    pub line: usize,
    /// Every stat of `memory_stats()`.
    pub stats: DeviceStats,
}

/// What a run did, operation by operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpCounts {
    /// Operations executed (every line but comments and directives).
    pub ops: u64,
    /// `alloc` operations.
    pub allocs: u64,
    /// `free` operations, and the frees of a `drain`.
    pub frees: u64,
    /// `record` operations that reached the allocator.
    pub records: u64,
    /// `empty_cache` calls (a `drain`'s included).
    pub empty_caches: u64,
    /// Allocations that failed with out-of-memory (each counts in `num_ooms`).
    pub ooms: u64,
    /// Allocations of 1 EiB or more, refused before the allocator runs.
    pub refused: u64,
    /// Allocations refused by `throw_on_npumalloc_oom` (each counts in `num_oom_rejections`).
    pub rejections: u64,
    /// `free` / `record` / misuse operations of ids whose allocation had failed, and `alloc` /
    /// `double_free` / `record_freed` of ids a failed `free` left live.
    pub skipped: u64,
    /// Misuse operations, each refused with a typed error.
    pub misuses: u64,
    /// `drain` operations.
    pub drains: u64,
    /// `fault` operations that scheduled a fault.
    pub faults_scheduled: u64,
    /// Scheduled faults that fired (counted with checks only).
    pub faults_fired: u64,
    /// Operations that returned a device error because an injected fault fired.
    pub device_errors: u64,
    /// Operations that succeeded although a fault fired in them: a documented fallback, or an
    /// injected out-of-memory the retry chain absorbed (counted with checks only).
    pub absorbed_faults: u64,
    /// Allocations refused because their region's tag was paused.
    pub paused_refusals: u64,
    /// `pause` operations that paused something, and the bytes they paused.
    pub pauses: u64,
    /// `resume` operations that mapped something again.
    pub resumes: u64,
    /// Of those, the ones under `retain_cpu_backup on`, which kept their CPU backups for the
    /// next pause to reuse.
    pub retained_resumes: u64,
    /// `resume` operations that ran out of device memory (the tag stays paused).
    pub resume_ooms: u64,
    /// Allocations in a memory-saver region that ran out of memory only because the device
    /// would not have kept the `memory_margin` free beside their segment (counted with checks
    /// only).
    pub margin_ooms: u64,
    /// `pause` operations that ran out of host memory for a CPU backup (what they had not
    /// reached stays mapped).
    pub pause_ooms: u64,
}

/// Where one trace id stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Never allocated.
    Never,
    /// Allocated at `addr` (0 for a zero-size allocation) by the `alloc` at `line`.
    Live {
        addr: u64,
        requested: u64,
        line: usize,
        /// The byte a `fill` wrote into it, if any.
        filled: Option<u8>,
        /// Made in a memory-saver region without CPU backup: a pause loses its bytes.
        volatile: bool,
        /// A `free` of it failed by an injected fault: lines that expect it freed (`alloc`,
        /// `double_free`, `record_freed`) are skipped, as the lines of a failed id are.
        free_failed: bool,
    },
    /// Its allocation failed; a later `free` / `record` is skipped until it is allocated again.
    Failed,
    /// Freed by the operation at `line`; `addr` is where it lived.
    Freed { addr: u64, line: usize },
}

/// An operation that names an id in a state that does not allow it: the script is malformed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdError {
    /// An `alloc` of an id that is still live.
    AllocLive {
        /// The id.
        id: String,
        /// The line of the `alloc` that made it live.
        allocated_at: usize,
    },
    /// An operation on a live allocation (`free`, `record`, `free_interior`) of an id that is not
    /// live.
    NotLive {
        /// The operation's keyword.
        op: &'static str,
        /// The id.
        id: String,
        /// The line of the `free` that freed it, or `None` if it was never allocated.
        freed_at: Option<usize>,
    },
    /// A `double_free` / `record_freed` of an id that is not freed.
    NotFreed {
        /// The operation's keyword.
        op: &'static str,
        /// The id.
        id: String,
        /// The line of the `alloc` that made it live, or `None` if it was never allocated.
        allocated_at: Option<usize>,
    },
}

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdError::AllocLive { id, allocated_at } => write!(
                f,
                "alloc of `{}`, which is still live (allocated at line {allocated_at})",
                Echo(id)
            ),
            IdError::NotLive { op, id, freed_at } => match freed_at {
                None => write!(f, "{op} of `{}`, which was never allocated", Echo(id)),
                Some(line) => write!(
                    f,
                    "{op} of `{}`, which was already freed at line {line}",
                    Echo(id)
                ),
            },
            IdError::NotFreed {
                op,
                id,
                allocated_at,
            } => match allocated_at {
                None => write!(f, "{op} of `{}`, which was never allocated", Echo(id)),
                Some(line) => write!(
                    f,
                    "{op} of `{}`, which is still live (allocated at line {line})",
                    Echo(id)
                ),
            },
        }
    }
}

impl std::error::Error for IdError {}

/// Which check an operation broke, besides the invariants of [`Inconsistency`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
    /// freed) disagrees with what the executor counted.
    Counter,
    /// `empty_cache` left a whole free segment or a pending event behind.
    CacheNotEmptied,
    /// `set_per_process_memory_fraction` set a different limit.
    Fraction,
    /// After freeing everything and `empty_cache`, the device still has something outstanding.
    Leak,
    /// The rule the test-only sabotage switch breaks on purpose ([`Checks::sabotage`]).
    Sabotaged,
    /// Bytes read back after a pause and resume with CPU backup differ from those written.
    Contents,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rule::UnexpectedResult => "unexpected result",
            Rule::BadAddress => "bad address",
            Rule::Overlap => "overlapping allocations",
            Rule::OutsideSegment => "allocation outside device memory",
            Rule::SpuriousOutOfMemory => "spurious out-of-memory",
            Rule::StatsChanged => "stats changed",
            Rule::DeviceCalled => "device called",
            Rule::Counter => "counter mismatch",
            Rule::CacheNotEmptied => "empty_cache left cached memory",
            Rule::Fraction => "wrong memory limit",
            Rule::Leak => "leak",
            Rule::Sabotaged => "sabotaged check (test-only switch)",
            Rule::Contents => "contents lost",
        })
    }
}

/// Why a checked operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckError {
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

impl CheckError {
    /// Whether `other` is the same kind of failure (same variant, rule or invariant), which is
    /// what shrinking preserves.
    pub fn same_kind(&self, other: &CheckError) -> bool {
        match (self, other) {
            (CheckError::Inconsistent(a), CheckError::Inconsistent(b)) => {
                core::mem::discriminant(a) == core::mem::discriminant(b)
            }
            (CheckError::Broken { rule: a, .. }, CheckError::Broken { rule: b, .. }) => a == b,
            (CheckError::Panic(_), CheckError::Panic(_)) => true,
            _ => false,
        }
    }
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::Inconsistent(e) => write!(f, "inconsistent: {e}"),
            CheckError::Broken { rule, detail } => write!(f, "{rule}: {detail}"),
            CheckError::Panic(msg) => write!(f, "panic: {msg}"),
        }
    }
}

impl std::error::Error for CheckError {}

/// What stopped a run at one operation.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ExecError {
    /// The operation names an id in a state that does not allow it.
    Id(IdError),
    /// A device error no injected fault explains.
    Device(DeviceErr),
    /// A `malloc` refused in a way the executor does not know.
    Alloc(AllocError<DeviceErr>),
    /// A `free` or `record` of a live allocation refused.
    Free(FreeError<DeviceErr>),
    /// A `fraction` the allocator refused.
    Fraction(FractionError),
    /// A pool or region operation the trace cannot make: an unknown or reused pool name, an
    /// `end_pool` / `end_region` without its opening line, a refused pool operation.
    Scope(ScopeError),
    /// A `pause` or `resume` the allocator refused for a reason the trace controls (an unknown
    /// tag, pausing twice, resuming what is not paused).
    Saver(SaverError<DeviceErr>),
    /// A misuse the allocator accepted.
    MisuseAccepted {
        /// The misuse.
        misuse: Misuse,
        /// The address it used.
        addr: u64,
    },
    /// With checks: the operation broke a rule or an invariant.
    Check(CheckError),
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecError::Id(e) => e.fmt(f),
            ExecError::Device(e) => write!(f, "device error: {e}"),
            ExecError::Alloc(e) => e.fmt(f),
            ExecError::Free(e) => e.fmt(f),
            ExecError::Fraction(e) => e.fmt(f),
            ExecError::Scope(e) => e.fmt(f),
            ExecError::Saver(e) => e.fmt(f),
            ExecError::MisuseAccepted { misuse, addr } => write!(
                f,
                "{} at {addr:#x} was accepted; it must be refused",
                misuse.keyword()
            ),
            ExecError::Check(e) => write!(f, "check failed: {e}"),
        }
    }
}

impl std::error::Error for ExecError {}

impl From<CheckError> for ExecError {
    fn from(e: CheckError) -> Self {
        ExecError::Check(e)
    }
}

/// A pool or region line the trace cannot make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeError {
    /// `pool` of a name already used.
    PoolExists(String),
    /// `use_pool` / `release_pool` of a name never created, or already released.
    NoPool(String),
    /// `end_pool` or `end_region` (the keyword) with no such scope innermost.
    NotOpen(&'static str),
    /// The allocator refused a pool operation.
    Refused(PoolError),
}

impl fmt::Display for ScopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeError::PoolExists(name) => write!(f, "pool `{}` already exists", Echo(name)),
            ScopeError::NoPool(name) => {
                write!(
                    f,
                    "no pool `{}` is held (never created, or released)",
                    Echo(name)
                )
            }
            ScopeError::NotOpen(keyword) => {
                write!(f, "`{keyword}` with no matching scope innermost")
            }
            ScopeError::Refused(e) => e.fmt(f),
        }
    }
}

/// A failed run: the index of the failing operation in the trace's `ops`, its line, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The trace's file name.
    pub file: String,
    /// Index of the failing operation.
    pub index: usize,
    /// Its line (0 when it was not read from a file).
    pub line: usize,
    /// What went wrong.
    pub error: ExecError,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.error)
    }
}

impl std::error::Error for Failure {}

/// What the checks know beyond the allocator: the caller's view and the executor's counts.
#[derive(Debug, Default)]
pub struct Checks {
    /// Live non-null allocations by address: the requested size.
    by_addr: BTreeMap<u64, u64>,
    /// The stats right after the last accumulated reset, and the device counters then.
    base: DeviceStats,
    base_mallocs: u64,
    base_frees: u64,
    ooms_since_reset: u64,
    rejections_since_reset: u64,
    /// Faults scheduled and not fired yet.
    faults: Vec<Scheduled>,
    /// Test-only: break [`Rule::Sabotaged`] at the first successful `free` after a fault fired
    /// and a misuse was refused, to prove that a failure reproduces from its printed trace.
    sabotage: bool,
    fired_any: bool,
    misused: bool,
    /// Operations since the last full structural check ([`FULL_CHECK_LIVE`]).
    since_full: usize,
    /// The trace's operations when the run started: the last one always runs the full check.
    ops: u64,
}

/// Live allocations up to which every operation ends with the full structural check (a
/// snapshot of every block against the caller's view). Above it the check runs every
/// ⌈live / this⌉ operations, and after the trace's last one (a stress run ends with a drain, which
/// leaves nothing live), so that a checked replay stays linear in
/// the trace's length instead of quadratic; each operation's result and the counters are still
/// checked at every operation.
pub const FULL_CHECK_LIVE: usize = 1024;

impl Checks {
    /// The checks with the test-only sabotage switch set: the first successful `free` after
    /// both an injected fault fired and a misuse was refused fails with [`Rule::Sabotaged`].
    pub fn sabotaged() -> Checks {
        Checks {
            sabotage: true,
            ..Checks::default()
        }
    }
}

/// A fault scheduled on the device, as the checks model it: it fires on call number `at` of
/// `call` (the device's own plan is checked against this model after every operation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scheduled {
    call: DeviceCall,
    at: u64,
    fault: Fault,
}

impl Scheduled {
    /// The error an operation returns when this fault surfaces.
    fn error(&self) -> DeviceErr {
        FaultError::Injected {
            call: self.call,
            code: self.fault.code(),
        }
    }

    /// Whether the fault aborts the call's operation: every fault but an out-of-memory of
    /// `malloc` or `create_page`, which enters the retry chain, any failed `malloc` in
    /// torch_npu's flavour, which does too, a failed `mem_info`, which only loses numbers, and a
    /// failed `release_page`, whose page the allocator keeps.
    fn aborts(&self, flavour: Flavour) -> bool {
        match (self.call, self.fault) {
            (DeviceCall::Malloc | DeviceCall::CreatePage, Fault::OutOfMemory)
            | (DeviceCall::MemInfo, _) => false,
            (DeviceCall::Malloc, Fault::Error(_)) => flavour == Flavour::Cuda,
            // A page, host buffer or range the device refuses to take back is kept for the next
            // empty_cache.
            (DeviceCall::ReleasePage | DeviceCall::FreeHost | DeviceCall::ReleaseAddress, _) => {
                false
            }
            _ => true,
        }
    }
}

/// The one device error an operation must return given the faults that fired in it, or `None`
/// when it must succeed (or run out of memory). The first aborting fault ends the operation; the
/// only device calls after it undo what the operation had done (an unmap, a range given back),
/// and their failures are absorbed (the memory stays mapped, the range is kept to retry).
fn surfacing(
    fired: &[Scheduled],
    flavour: Flavour,
    what: &str,
) -> Result<Option<DeviceErr>, CheckError> {
    let aborting: Vec<&Scheduled> = fired.iter().filter(|f| f.aborts(flavour)).collect();
    let primary: Vec<&&Scheduled> = if aborting.len() > 1 {
        aborting
            .iter()
            .filter(|f| !matches!(f.call, DeviceCall::Unmap | DeviceCall::ReleaseAddress))
            .collect()
    } else {
        aborting.iter().collect()
    };
    match primary[..] {
        [] if aborting.is_empty() => Ok(None),
        [f] => Ok(Some(f.error())),
        _ => Err(broken(
            Rule::UnexpectedResult,
            format!("{what}: the device failed again after a failure: {fired:?}"),
        )),
    }
}

fn broken(rule: Rule, detail: String) -> CheckError {
    CheckError::Broken { rule, detail }
}

fn injected(e: &DeviceErr) -> bool {
    matches!(e, FaultError::Injected { .. })
}

/// What a malloc of the simulated device's allocator returns.
type AllocResult = Result<u64, AllocError<DeviceErr>>;
/// What its free (or `record_stream`) returns.
type FreeResult = Result<(), FreeError<DeviceErr>>;

/// What an operation did, for the checks to judge.
enum Outcome {
    /// Nothing to judge beyond the invariants (or the operation was skipped).
    Done,
    Alloc {
        id: IdRef,
        size: u64,
        stream: u64,
        result: AllocResult,
    },
    Free {
        addr: u64,
        result: FreeResult,
    },
    Record {
        result: FreeResult,
    },
    Complete,
    EmptyCache(Result<(), DeviceErr>),
    Fraction(f64),
    ResetPeak,
    ResetAccumulated,
    /// The configuration `set_allocator_settings` asked for (boxed: the outcome of every
    /// operation is moved, so it stays small).
    Settings(Box<AllocConf>),
    Fault {
        scheduled: Option<Scheduled>,
    },
    Misuse {
        misuse: Misuse,
        addr: u64,
        result: FreeResult,
    },
    Drain(Result<(), ExecError>),
    /// A `pause` (or `resume`) of `tag` and what it returned.
    Saver {
        pause: bool,
        tag: Option<String>,
        result: Result<u64, SaverError<DeviceErr>>,
    },
    /// An `expect` and the bytes found.
    Expect {
        id: IdRef,
        byte: u8,
        found: Vec<u8>,
    },
    /// What emptying a released pool's cache gave.
    EmptyPool(Result<(), DeviceErr>),
    /// An operation whose device failures are all absorbed.
    Absorbed,
}

/// What a check compares an operation's result with: the state just before it.
struct Before {
    stats: DeviceStats,
    calls: [u64; DeviceCall::ALL.len()],
    /// The simulator's address-space refusals.
    address_space_refusals: u64,
    /// Whether expandable segments were on.
    expandable: bool,
    /// The `max_split_size_mb` in force.
    max_split_size: Option<u64>,
}

/// Runs operations through the allocator on the simulated device, with or without checks.
pub struct Executor {
    alloc: Allocator<TestDevice>,
    slots: Vec<Slot>,
    names: Vec<Box<str>>,
    counts: OpCounts,
    records: Vec<StatsRecord>,
    peak_requested: u64,
    settings_warnings: Vec<(usize, alloc_conf::Warning)>,
    last_line: usize,
    checks: Option<Box<Checks>>,
    /// Open `use_pool` and `region` scopes, innermost last: (is a region, the pool).
    scopes: Vec<(bool, PoolId)>,
    /// Pools by trace name, with whether the trace still holds them.
    pool_names: Vec<(String, PoolId, bool)>,
    /// Memory-saver pools the regions used.
    saver_pools: Vec<PoolId>,
    /// Those of them with CPU backup.
    saver_backups: Vec<PoolId>,
    /// Map and unmap runs of pauses and resumes, which torch does not count as device
    /// allocations and frees.
    saver_runs: (u64, u64),
    /// Paused memory-saver segments released (torch counts each in `num_device_free`, though
    /// nothing is unmapped).
    paused_releases: u64,
}

impl Executor {
    /// An executor for `trace`'s ids with `setup`, without checks (the replayer).
    pub fn new(trace: &Trace, setup: &Setup) -> Executor {
        Executor {
            alloc: setup.allocator(),
            slots: vec![Slot::Never; trace.id_count()],
            names: trace.ids.clone(),
            counts: OpCounts::default(),
            records: Vec::new(),
            peak_requested: 0,
            settings_warnings: Vec::new(),
            last_line: 0,
            checks: None,
            scopes: Vec::new(),
            pool_names: Vec::new(),
            saver_pools: Vec::new(),
            saver_backups: Vec::new(),
            saver_runs: (0, 0),
            paused_releases: 0,
        }
    }

    /// An executor that judges every operation and checks every invariant after it.
    pub fn checked(trace: &Trace, setup: &Setup, mut checks: Checks) -> Executor {
        let mut exec = Executor::new(trace, setup);
        checks.ops = trace.ops.len() as u64;
        exec.checks = Some(Box::new(checks));
        exec
    }

    /// Makes room for ids added to the trace after the executor was built (the stress engine
    /// names a new id for each allocation it draws).
    pub fn add_ids(&mut self, trace: &Trace) {
        self.slots.resize(trace.id_count(), Slot::Never);
        let known = self.names.len();
        self.names.extend(trace.ids[known..].iter().cloned());
    }

    /// The allocator under test.
    pub fn allocator(&self) -> &Allocator<TestDevice> {
        &self.alloc
    }

    /// The allocator under test, mutably (to record its history, to set its clock).
    pub fn allocator_mut(&mut self) -> &mut Allocator<TestDevice> {
        &mut self.alloc
    }

    /// The operation counts so far.
    pub fn counts(&self) -> &OpCounts {
        &self.counts
    }

    /// Whether `id` is live now.
    pub fn is_live(&self, id: IdRef) -> bool {
        matches!(self.slots[id.index()], Slot::Live { .. })
    }

    /// Whether `id` was freed (and not allocated again since).
    pub fn is_freed(&self, id: IdRef) -> bool {
        matches!(self.slots[id.index()], Slot::Freed { .. })
    }

    fn name(&self, id: IdRef) -> String {
        self.names
            .get(id.index())
            .map_or_else(|| "?".to_owned(), |s| s.to_string())
    }

    fn not_live(&self, op: &'static str, id: IdRef) -> ExecError {
        let freed_at = match self.slots[id.index()] {
            Slot::Freed { line, .. } => Some(line),
            _ => None,
        };
        ExecError::Id(IdError::NotLive {
            op,
            id: self.name(id),
            freed_at,
        })
    }

    /// Executes one operation (and, with checks, judges it and checks every invariant).
    #[inline(always)]
    pub fn step(&mut self, op: &Op) -> Result<(), ExecError> {
        self.counts.ops += 1;
        self.last_line = op.line;
        if self.checks.is_none() && self.alloc.paused_bytes() == 0 {
            // The replayer's own path: nothing to compare with and no paused segment to watch,
            // so an alloc or a free is judged as it returns, without building an outcome.
            match op.kind {
                OpKind::Alloc { id, size, stream } => {
                    // A success first: nothing to count.
                    return match self.alloc_op(id, size, stream, op.line)? {
                        Some(Ok(_)) | None => Ok(()),
                        Some(failed) => self.judge_alloc(failed),
                    };
                }
                OpKind::Free { id } => {
                    return match self.free_op(id, op.line)? {
                        Some((_, result)) => self.judge_free(result),
                        None => Ok(()),
                    };
                }
                _ => {}
            }
        }
        self.step_outcome(op)
    }

    /// [`Executor::step`] through an outcome: with checks, while something is paused, and for
    /// every operation but `alloc` and `free`. Out of line, so that the replayer's path above
    /// stays small where it is inlined.
    #[inline(never)]
    fn step_outcome(&mut self, op: &Op) -> Result<(), ExecError> {
        let before = self.checks.is_some().then(|| Before {
            stats: self.alloc.stats(),
            calls: self.calls(),
            address_space_refusals: self.alloc.device().address_space_refusals(),
            expandable: self.alloc.conf().expandable_segments,
            max_split_size: self.alloc.conf().max_split_size,
        });
        let paused: Vec<u64> = if self.alloc.paused_bytes() > 0 {
            self.alloc
                .saver_segments()
                .into_iter()
                .filter(|s| !s.2)
                .map(|s| s.0)
                .collect()
        } else {
            Vec::new()
        };
        let outcome = self.execute(op)?;
        if !paused.is_empty() {
            let now: Vec<u64> = self.alloc.saver_segments().iter().map(|s| s.0).collect();
            self.paused_releases += paused.iter().filter(|a| !now.contains(a)).count() as u64;
        }
        match before {
            None => self.judge(outcome),
            Some(before) => self.verify(op, &before, outcome).map_err(ExecError::Check),
        }
    }

    /// Runs the operation and keeps the ids' bookkeeping.
    #[inline(always)]
    fn execute(&mut self, op: &Op) -> Result<Outcome, ExecError> {
        Ok(match op.kind {
            OpKind::Alloc { id, size, stream } => match self.alloc_op(id, size, stream, op.line)? {
                Some(result) => Outcome::Alloc {
                    id,
                    size,
                    stream,
                    result,
                },
                None => Outcome::Done,
            },
            OpKind::Free { id } => match self.free_op(id, op.line)? {
                Some((addr, result)) => Outcome::Free { addr, result },
                None => Outcome::Done,
            },
            OpKind::Record { id, stream } => match self.slots[id.index()] {
                Slot::Live { addr, .. } => {
                    self.counts.records += 1;
                    Outcome::Record {
                        result: self.alloc.record_stream(addr, SimStream(stream)),
                    }
                }
                Slot::Failed => {
                    self.counts.skipped += 1;
                    Outcome::Done
                }
                _ => return Err(self.not_live("record", id)),
            },
            OpKind::Complete { stream } => {
                let device = self.alloc.device_mut();
                match stream {
                    Some(s) => device.complete_stream(SimStream(s)),
                    None => device.complete_all(),
                }
                Outcome::Complete
            }
            OpKind::EmptyCache {
                free_physical: true,
            } => {
                self.counts.empty_caches += 1;
                Outcome::EmptyCache(self.alloc.empty_cache())
            }
            // torch_npu refuses the call without expandable segments, before it does anything.
            OpKind::EmptyCache {
                free_physical: false,
            } if !self.alloc.conf().expandable_segments => Outcome::Done,
            OpKind::EmptyCache {
                free_physical: false,
            } => {
                self.counts.empty_caches += 1;
                Outcome::EmptyCache(self.alloc.empty_virt_addr_cache())
            }
            OpKind::Fraction(f) => {
                self.alloc
                    .set_memory_fraction(f)
                    .map_err(ExecError::Fraction)?;
                Outcome::Fraction(f)
            }
            OpKind::ResetPeak => {
                self.alloc.reset_peak_stats();
                Outcome::ResetPeak
            }
            OpKind::ResetAccumulated => {
                self.alloc.reset_accumulated_stats();
                Outcome::ResetAccumulated
            }
            OpKind::Settings(ref text) => {
                let parsed = alloc_conf::parse_settings(self.alloc.conf(), text);
                self.settings_warnings
                    .extend(parsed.warnings.iter().map(|w| (op.line, w.clone())));
                self.alloc.set_conf(&parsed.conf);
                Outcome::Settings(Box::new(parsed.conf))
            }
            OpKind::Stats { ref label } => {
                self.records.push(StatsRecord {
                    label: label.clone().unwrap_or_else(|| format!("line {}", op.line)),
                    line: op.line,
                    stats: self.alloc.stats(),
                });
                Outcome::Done
            }
            OpKind::Fault { call, nth, fault } => {
                let device = self.alloc.device_mut();
                // As the simulator counts it: an `nth` near 2^64 is due at no call.
                let at = device.calls(call).saturating_add(nth.max(1));
                let pending = device.pending_faults();
                device.fail_nth(call, nth, fault);
                let scheduled =
                    (device.pending_faults() > pending).then_some(Scheduled { call, at, fault });
                if scheduled.is_some() {
                    self.counts.faults_scheduled += 1;
                }
                Outcome::Fault { scheduled }
            }
            OpKind::Misuse(misuse) => self.misuse(misuse)?,
            OpKind::Drain => Outcome::Drain(self.drain()),
            OpKind::Pool(ref p) => match self.pool_op(p)? {
                Some(emptied) => Outcome::EmptyPool(emptied),
                None => Outcome::Done,
            },
            OpKind::Region {
                ref tag,
                cpu_backup,
            } => self.region(tag, cpu_backup)?,
            OpKind::EndRegion => {
                self.end_scope(true)?;
                Outcome::Done
            }
            OpKind::Pause(ref tag) => self.pause_or_resume(tag.as_deref(), true),
            OpKind::Resume(ref tag) => self.pause_or_resume(tag.as_deref(), false),
            OpKind::RetainCpuBackup(retain) => {
                self.alloc.set_retain_cpu_backup(retain);
                Outcome::Done
            }
            OpKind::MemoryMargin(bytes) => {
                self.alloc.set_saver_memory_margin(bytes);
                Outcome::Done
            }
            OpKind::Fill { id, byte } => self.fill_or_expect(id, byte, true),
            OpKind::Expect { id, byte } => self.fill_or_expect(id, byte, false),
        })
    }

    /// An `alloc`: runs the malloc and keeps the id's bookkeeping.
    #[inline(always)]
    fn alloc_op(
        &mut self,
        id: IdRef,
        size: u64,
        stream: u64,
        line: usize,
    ) -> Result<Option<AllocResult>, ExecError> {
        self.counts.allocs += 1;
        if let Slot::Live {
            line, free_failed, ..
        } = self.slots[id.index()]
        {
            if free_failed {
                self.counts.skipped += 1;
                return Ok(None);
            }
            return Err(ExecError::Id(IdError::AllocLive {
                id: self.name(id),
                allocated_at: line,
            }));
        }
        // This malloc's map calls are not the last one's (the device counts runs of them).
        self.alloc.device_mut().end_runs();
        let result = match self.scopes.last() {
            Some(&(_, pool)) => self.alloc.malloc_in(size, SimStream(stream), pool),
            None => self.alloc.malloc(size, SimStream(stream)),
        };
        self.slots[id.index()] = match result {
            Ok(addr) => {
                let requested = self.alloc.memory_requested();
                self.peak_requested = self.peak_requested.max(requested);
                Slot::Live {
                    addr,
                    requested: size,
                    line,
                    filled: None,
                    volatile: !self.scopes.is_empty() && self.in_volatile_region(),
                    free_failed: false,
                }
            }
            Err(_) => Slot::Failed,
        };
        Ok(Some(result))
    }

    /// A `free`: frees a live id's allocation and keeps its bookkeeping; `None` when the id's
    /// allocation failed (the free is skipped). A free that fails leaves the id live.
    #[inline(always)]
    fn free_op(&mut self, id: IdRef, line: usize) -> Result<Option<(u64, FreeResult)>, ExecError> {
        self.counts.frees += 1;
        match &mut self.slots[id.index()] {
            &mut Slot::Live {
                addr,
                ref mut free_failed,
                ..
            } => {
                let result = self.alloc.free(addr);
                match result {
                    Ok(()) => self.slots[id.index()] = Slot::Freed { addr, line },
                    Err(_) => *free_failed = true,
                }
                Ok(Some((addr, result)))
            }
            Slot::Failed => {
                self.counts.skipped += 1;
                Ok(None)
            }
            _ => Err(self.not_live("free", id)),
        }
    }

    /// Without checks: what the replayer counts of a malloc's result, and what stops it.
    #[inline(always)]
    fn judge_alloc(&mut self, result: AllocResult) -> Result<(), ExecError> {
        match result {
            Ok(_) => {}
            Err(AllocError::OutOfMemory(_)) => self.counts.ooms += 1,
            Err(AllocError::Rejected(_)) => self.counts.rejections += 1,
            Err(AllocError::TooLarge { .. }) => self.counts.refused += 1,
            Err(AllocError::Paused { .. }) => self.counts.paused_refusals += 1,
            Err(AllocError::Device(e)) if injected(&e) => self.counts.device_errors += 1,
            Err(AllocError::Device(e)) => return Err(ExecError::Device(e)),
            Err(e) => return Err(ExecError::Alloc(e)),
        }
        Ok(())
    }

    /// Without checks: the same for a free's or a `record_stream`'s result.
    #[inline(always)]
    fn judge_free(&mut self, result: FreeResult) -> Result<(), ExecError> {
        match result {
            Ok(()) => {}
            Err(FreeError::Device(e)) if injected(&e) => self.counts.device_errors += 1,
            Err(FreeError::Device(e)) => return Err(ExecError::Device(e)),
            Err(e) => return Err(ExecError::Free(e)),
        }
        Ok(())
    }

    /// Whether the innermost scope is a memory-saver region without CPU backup.
    fn in_volatile_region(&self) -> bool {
        self.scopes
            .last()
            .is_some_and(|&(region, pool)| region && !self.saver_backups.contains(&pool))
    }

    /// The byte `expect` should find in live allocation `id`: what a `fill` wrote, for memory
    /// whose contents survive pauses.
    pub fn filled(&self, id: IdRef) -> Option<u8> {
        match self.slots[id.index()] {
            Slot::Live {
                filled,
                volatile: false,
                ..
            } => filled,
            _ => None,
        }
    }

    /// Whether the memory saver has paused `tag` now.
    pub fn is_paused(&self, tag: &str) -> bool {
        self.alloc
            .saver_stats()
            .tags
            .iter()
            .any(|t| t.tag == tag && t.paused)
    }

    /// Device allocations as torch counts them: segments, plus one per map call of pages
    /// (pauses' and resumes' left out).
    fn device_allocs(&self, d: &SimDevice) -> u64 {
        d.successful_mallocs() + d.map_runs() - self.saver_runs.0
    }

    /// Device frees as torch counts them: segments, plus one per unmapped range (pauses' and
    /// resumes' left out).
    fn device_frees(&self, d: &SimDevice) -> u64 {
        d.frees() + d.unmap_runs() - self.saver_runs.1 + self.paused_releases
    }

    /// Enters a memory-saver region.
    #[cold]
    fn region(&mut self, tag: &str, cpu_backup: bool) -> Result<Outcome, ExecError> {
        let pool = self
            .alloc
            .saver_pool(tag, cpu_backup)
            .map_err(|e| ExecError::Scope(ScopeError::Refused(e)))?;
        self.alloc
            .retain_pool(pool)
            .map_err(|e| ExecError::Scope(ScopeError::Refused(e)))?;
        if !self.saver_pools.contains(&pool) {
            self.saver_pools.push(pool);
        }
        if cpu_backup && !self.saver_backups.contains(&pool) {
            self.saver_backups.push(pool);
        }
        self.scopes.push((true, pool));
        // A new tag's pool probes the device; a failed probe is ignored.
        Ok(Outcome::Absorbed)
    }

    /// Runs a `pause` or `resume`, leaving its map and unmap runs out of torch's counters.
    #[cold]
    fn pause_or_resume(&mut self, tag: Option<&str>, pause: bool) -> Outcome {
        let runs = |d: &SimDevice| (d.map_runs(), d.unmap_runs());
        let (maps, unmaps) = runs(self.alloc.device());
        let result = if pause {
            self.alloc.pause(tag)
        } else {
            self.alloc.resume(tag)
        };
        let (maps_after, unmaps_after) = runs(self.alloc.device());
        self.saver_runs.0 += maps_after - maps;
        self.saver_runs.1 += unmaps_after - unmaps;
        Outcome::Saver {
            pause,
            tag: tag.map(str::to_owned),
            result,
        }
    }

    /// Runs a pool line; a `release_pool` returns what emptying the pool's cache gave.
    #[cold]
    fn pool_op(&mut self, op: &PoolOp) -> Result<Option<Result<(), DeviceErr>>, ExecError> {
        let refused = |e| ExecError::Scope(ScopeError::Refused(e));
        let held = |this: &Self, name: &str| {
            this.pool_names
                .iter()
                .position(|(n, _, h)| n == name && *h)
                .ok_or_else(|| ExecError::Scope(ScopeError::NoPool(name.to_owned())))
        };
        match op {
            PoolOp::Create {
                name,
                use_on_oom,
                no_split,
            } => {
                if self.pool_names.iter().any(|(n, ..)| n == name) {
                    return Err(ExecError::Scope(ScopeError::PoolExists(name.clone())));
                }
                let id = self.alloc.create_pool().map_err(refused)?;
                // torch's MemPool constructor: created, then marked.
                if *use_on_oom {
                    self.alloc.set_use_on_oom(id, true).map_err(refused)?;
                }
                if *no_split {
                    self.alloc.set_no_split(id).map_err(refused)?;
                }
                self.pool_names.push((name.clone(), id, true));
            }
            PoolOp::Use(name) => {
                let id = self.pool_names[held(self, name)?].1;
                self.alloc.enter_pool(id).map_err(refused)?;
                self.scopes.push((false, id));
            }
            PoolOp::End => self.end_scope(false)?,
            PoolOp::Release(name) => {
                let i = held(self, name)?;
                let id = self.pool_names[i].1;
                self.pool_names[i].2 = false;
                self.alloc.release_pool(id).map_err(refused)?;
                self.counts.empty_caches += 1;
                return Ok(Some(self.alloc.empty_pool_cache(id)));
            }
        }
        Ok(None)
    }

    /// Leaves the innermost scope, which must be a region (`region`) or a pool scope.
    fn end_scope(&mut self, region: bool) -> Result<(), ExecError> {
        let keyword = if region { "end_region" } else { "end_pool" };
        match self.scopes.last() {
            Some(&(r, id)) if r == region => {
                self.scopes.pop();
                self.leave_scope(region, id)
            }
            _ => Err(ExecError::Scope(ScopeError::NotOpen(keyword))),
        }
    }

    /// Drops a closed scope's hold: a region's on its tag's pool, a pool scope's on its pool.
    fn leave_scope(&mut self, region: bool, id: PoolId) -> Result<(), ExecError> {
        let left = if region {
            self.alloc.release_pool(id)
        } else {
            self.alloc.leave_pool(id)
        };
        left.map_err(|e| ExecError::Scope(ScopeError::Refused(e)))
    }

    /// Writes (`fill`) or reads back (`expect`) the 8 bytes at each end of a live allocation.
    /// Memory that is not backed now (a paused tag's) is skipped.
    #[cold]
    fn fill_or_expect(&mut self, id: IdRef, byte: u8, fill: bool) -> Outcome {
        let Slot::Live {
            addr,
            requested,
            filled,
            ..
        } = self.slots[id.index()]
        else {
            self.counts.skipped += 1;
            return Outcome::Done;
        };
        // An `expect` of bytes no `fill` wrote (none ran, or it was skipped) has nothing to
        // compare: zeros read there would say nothing of the allocator, and a shrunk failure
        // would end on such a pair instead of its cause.
        if !fill && filled.is_none() {
            self.counts.skipped += 1;
            return Outcome::Done;
        }
        let n = requested.min(8);
        if addr == 0 || n == 0 {
            return Outcome::Done;
        }
        // A paused tag's memory: what its backup holds comes back at the resume, whatever a
        // segment still mapped (a failed resume's) reads now; a fill there is not made.
        if self.alloc.saver_paused_at(addr) {
            self.counts.skipped += 1;
            return Outcome::Done;
        }
        let ends = [addr, addr + requested - n];
        let device = self.alloc.device_mut();
        if fill {
            let written = ends
                .iter()
                .all(|&at| device.write_bytes(at, &vec![byte; n as usize]).is_ok());
            if let Slot::Live { filled, .. } = &mut self.slots[id.index()] {
                *filled = written.then_some(byte);
            }
            if !written {
                self.counts.skipped += 1;
            }
            return Outcome::Done;
        }
        let found: Option<Vec<u8>> = ends
            .iter()
            .map(|&at| device.read_bytes(at, n).ok())
            .collect::<Option<Vec<Vec<u8>>>>()
            .map(|v| v.concat());
        match found {
            Some(bytes) => Outcome::Expect {
                id,
                byte,
                found: bytes,
            },
            None => {
                self.counts.skipped += 1;
                Outcome::Done
            }
        }
    }

    /// Runs a misuse: the call the API must refuse.
    fn misuse(&mut self, misuse: Misuse) -> Result<Outcome, ExecError> {
        let target = match misuse {
            Misuse::DoubleFree { id } | Misuse::RecordFreed { id, .. } => {
                match self.slots[id.index()] {
                    Slot::Freed { addr, .. } => Some(addr),
                    Slot::Failed
                    | Slot::Live {
                        free_failed: true, ..
                    } => None,
                    Slot::Live { line, .. } => {
                        return Err(ExecError::Id(IdError::NotFreed {
                            op: misuse.keyword(),
                            id: self.name(id),
                            allocated_at: Some(line),
                        }));
                    }
                    Slot::Never => {
                        return Err(ExecError::Id(IdError::NotFreed {
                            op: misuse.keyword(),
                            id: self.name(id),
                            allocated_at: None,
                        }));
                    }
                }
            }
            Misuse::InteriorPointer { id } => match self.slots[id.index()] {
                Slot::Live { addr, .. } => Some(addr + 1).filter(|_| addr != 0),
                Slot::Failed => None,
                _ => return Err(self.not_live(misuse.keyword(), id)),
            },
            Misuse::ForeignPointer { addr } => Some(addr),
        };
        // A freed address handed out again (or a null allocation's) is not a misuse to try.
        let Some(addr) = target.filter(|&a| a != 0 && !self.is_live_address(a)) else {
            self.counts.skipped += 1;
            return Ok(Outcome::Done);
        };
        self.counts.misuses += 1;
        let result = match misuse {
            Misuse::RecordFreed { stream, .. } => self.alloc.record_stream(addr, SimStream(stream)),
            _ => self.alloc.free(addr),
        };
        Ok(Outcome::Misuse {
            misuse,
            addr,
            result,
        })
    }

    /// Whether a live allocation starts at `addr`.
    fn is_live_address(&self, addr: u64) -> bool {
        match &self.checks {
            Some(c) => c.by_addr.contains_key(&addr),
            None => self
                .slots
                .iter()
                .any(|s| matches!(*s, Slot::Live { addr: a, .. } if a == addr)),
        }
    }

    /// Clears the faults, frees every live allocation, `empty_cache`.
    fn drain(&mut self) -> Result<(), ExecError> {
        self.counts.drains += 1;
        self.alloc.device_mut().clear_all_faults();
        if let Some(c) = &mut self.checks {
            c.faults.clear();
        }
        for i in 0..self.slots.len() {
            if let Slot::Live { addr, .. } = self.slots[i] {
                self.counts.frees += 1;
                self.alloc.free(addr).map_err(ExecError::Free)?;
                self.slots[i] = Slot::Freed {
                    addr,
                    line: self.last_line,
                };
                if let Some(c) = &mut self.checks {
                    c.by_addr.remove(&addr);
                }
            }
        }
        // The end of the program: every scope left, every pool dropped (the memory saver's
        // included, paused or not), so that everything can go back.
        let refused = |e| ExecError::Scope(ScopeError::Refused(e));
        for (region, id) in std::mem::take(&mut self.scopes).into_iter().rev() {
            self.leave_scope(region, id)?;
        }
        for (_, id, held) in std::mem::take(&mut self.pool_names) {
            if held {
                self.alloc.release_pool(id).map_err(refused)?;
            }
        }
        for id in std::mem::take(&mut self.saver_pools) {
            self.alloc.release_pool(id).map_err(refused)?;
        }
        self.saver_backups.clear();

        self.counts.empty_caches += 1;
        self.alloc.empty_cache().map_err(ExecError::Device)
    }

    /// Without checks: what the replayer counts, and what stops it.
    #[inline]
    fn judge(&mut self, outcome: Outcome) -> Result<(), ExecError> {
        match outcome {
            Outcome::Alloc { result, .. } => return self.judge_alloc(result),
            Outcome::Free { result, .. } | Outcome::Record { result } => {
                return self.judge_free(result);
            }
            Outcome::EmptyCache(result) => match result {
                Ok(()) => {}
                Err(e) if injected(&e) => self.counts.device_errors += 1,
                Err(e) => return Err(ExecError::Device(e)),
            },
            Outcome::Misuse {
                misuse,
                addr,
                result,
            } => match result {
                Ok(()) => return Err(ExecError::MisuseAccepted { misuse, addr }),
                Err(FreeError::Device(e)) => return Err(ExecError::Device(e)),
                Err(_) => {}
            },
            Outcome::Drain(result) => result?,
            Outcome::EmptyPool(result) => match result {
                Ok(()) => {}
                Err(e) if injected(&e) => self.counts.device_errors += 1,
                Err(e) => return Err(ExecError::Device(e)),
            },
            Outcome::Saver { pause, result, .. } => {
                if !self.count_saver(pause, &result)
                    && let Err(e) = result
                {
                    match e {
                        SaverError::Device(e) if injected(&e) => self.counts.device_errors += 1,
                        SaverError::Device(e) => return Err(ExecError::Device(e)),
                        e => return Err(ExecError::Saver(e)),
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Counts a pause's or resume's result that a replay goes on after: bytes moved, or the
    /// out-of-memory of a resume (device) or a pause (host). Any other error is the caller's to
    /// judge: `false`.
    fn count_saver(&mut self, pause: bool, result: &Result<u64, SaverError<DeviceErr>>) -> bool {
        match result {
            Ok(0) => {}
            Ok(_) if pause => self.counts.pauses += 1,
            Ok(_) => {
                self.counts.resumes += 1;
                if self.alloc.retain_cpu_backup() {
                    self.counts.retained_resumes += 1;
                }
            }
            Err(SaverError::OutOfMemory { .. }) if !pause => self.counts.resume_ooms += 1,
            Err(SaverError::HostOutOfMemory { .. }) if pause => self.counts.pause_ooms += 1,
            Err(_) => return false,
        }
        true
    }

    fn calls(&self) -> [u64; DeviceCall::ALL.len()] {
        let device = self.alloc.device();
        DeviceCall::ALL.map(|c| device.calls(c))
    }

    fn checks(&mut self) -> &mut Checks {
        self.checks.as_mut().expect("only called with checks")
    }

    /// With checks: judges the outcome against the state before the operation, then every
    /// invariant.
    fn verify(&mut self, op: &Op, before: &Before, outcome: Outcome) -> Result<(), CheckError> {
        match outcome {
            Outcome::Done | Outcome::Fault { scheduled: None } => {}
            Outcome::Alloc {
                result: Err(AllocError::Paused { tag }),
                ..
            } => {
                let paused = self
                    .alloc
                    .saver_stats()
                    .tags
                    .iter()
                    .any(|t| t.tag == tag && t.paused);
                if !paused {
                    return Err(broken(
                        Rule::UnexpectedResult,
                        format!("malloc refused for tag {tag:?}, which is not paused"),
                    ));
                }
                self.counts.paused_refusals += 1;
                self.stats_are(&before.stats, "malloc in a paused region")?;
                self.no_device_calls(before.calls, "malloc in a paused region")?;
            }
            Outcome::Alloc {
                id,
                size,
                stream,
                result,
            } => self.verify_malloc(id, size, stream, result, before)?,
            Outcome::Saver { pause, tag, result } => {
                self.verify_saver(pause, tag.as_deref(), result, before)?
            }
            Outcome::Absorbed => {
                self.take_fired();
            }
            Outcome::EmptyPool(result) => {
                let fired = self.take_fired();
                let flavour = self.alloc.facts().flavour;
                match (result, surfacing(&fired, flavour, "release_pool")?) {
                    (Ok(()), None) => {}
                    (Err(got), Some(want)) if got == want => self.counts.device_errors += 1,
                    (result, want) => {
                        return Err(broken(
                            Rule::UnexpectedResult,
                            format!(
                                "release_pool's empty_cache returned {result:?}, expected error \
                                 {want:?}"
                            ),
                        ));
                    }
                }
            }
            Outcome::Expect { id, byte, found } => {
                if found.iter().any(|&b| b != byte) {
                    return Err(broken(
                        Rule::Contents,
                        format!(
                            "{} holds {found:?}, expected {byte} throughout",
                            self.name(id)
                        ),
                    ));
                }
            }
            Outcome::Free { addr, result } => self.verify_free(addr, result, before)?,
            Outcome::Record { result } => {
                result
                    .map_err(|e| broken(Rule::UnexpectedResult, format!("record_stream: {e}")))?;
                self.stats_are(&before.stats, "record_stream")?;
                self.no_device_calls(before.calls, "record_stream")?;
            }
            Outcome::Complete => self.stats_are(&before.stats, "complete")?,
            Outcome::EmptyCache(result) => {
                let fired = self.take_fired();
                let flavour = self.alloc.facts().flavour;
                match (result, surfacing(&fired, flavour, "empty_cache")?) {
                    (Ok(()), None) => self.check_emptied(&before.stats)?,
                    (Err(got), Some(want)) if got == want => self.counts.device_errors += 1,
                    (result, want) => {
                        return Err(broken(
                            Rule::UnexpectedResult,
                            format!("empty_cache returned {result:?}, expected error {want:?}"),
                        ));
                    }
                }
            }
            Outcome::Fraction(f) => {
                let capacity = self.alloc.device().capacity();
                let expected = (f < 1.0).then_some((f * capacity as f64) as u64);
                if self.alloc.allowed_memory() != expected {
                    return Err(broken(
                        Rule::Fraction,
                        format!(
                            "fraction {f}: limit {:?}, expected {expected:?}",
                            self.alloc.allowed_memory()
                        ),
                    ));
                }
                self.stats_are(&before.stats, "set_memory_fraction")?;
            }
            Outcome::ResetPeak => {
                let mut expected = before.stats.clone();
                expected.reset_peak();
                self.stats_are(&expected, "reset_peak")?;
            }
            Outcome::Settings(asked) => {
                // A failed probe leaves expandable segments off; nothing else may fail.
                let fired = self.take_fired();
                let conf = self.alloc.conf();
                let probe_failed = fired.iter().any(|f| f.call == DeviceCall::ReserveAddress);
                let on = asked.expandable_segments && (before.expandable || !probe_failed);
                if conf.expandable_segments != on || conf.max_split_size != asked.max_split_size {
                    return Err(broken(
                        Rule::UnexpectedResult,
                        format!(
                            "set_allocator_settings: expandable_segments {} and max_split_size {:?}, expected {on} and {:?}",
                            conf.expandable_segments, conf.max_split_size, asked.max_split_size
                        ),
                    ));
                }
                // The `max_split_size` stat keeps its start value, as in torch_npu; the
                // oversize counts follow a new limit (recounted by the invariants).
                let mut expected = before.stats.clone();
                if before.max_split_size != asked.max_split_size {
                    let now = self.alloc.stats();
                    expected.oversize_allocations = now.oversize_allocations;
                    expected.oversize_segments = now.oversize_segments;
                }
                self.stats_are(&expected, "set_allocator_settings")?;
            }
            Outcome::ResetAccumulated => {
                let mut expected = before.stats.clone();
                expected.reset_accumulated();
                self.stats_are(&expected, "reset_accumulated")?;
                let (mallocs, frees) = {
                    let d = self.alloc.device();
                    (self.device_allocs(d), self.device_frees(d))
                };
                let c = self.checks();
                c.base = expected;
                c.base_mallocs = mallocs;
                c.base_frees = frees;
                c.ooms_since_reset = 0;
                c.rejections_since_reset = 0;
            }
            Outcome::Fault { scheduled: Some(s) } => self.checks().faults.push(s),
            Outcome::Misuse {
                misuse,
                addr,
                result,
            } => self.verify_misuse(misuse, addr, result, before)?,
            Outcome::Drain(result) => {
                result.map_err(|e| broken(Rule::UnexpectedResult, format!("drain: {e}")))?;
                self.check_drained()?;
            }
        }
        // Operations that make no fallible device call must not have fired a fault.
        let stray = self.take_fired();
        if !stray.is_empty() {
            return Err(broken(
                Rule::UnexpectedResult,
                format!("{:?} fired faults {stray:?}", op.kind),
            ));
        }
        let pending = self.alloc.device().pending_faults();
        if pending != self.checks().faults.len() {
            return Err(broken(
                Rule::Counter,
                format!(
                    "the device has {pending} faults pending, the checks {:?}",
                    self.checks().faults
                ),
            ));
        }
        self.check_invariants()
    }

    /// The scheduled faults whose call has come, in call order; they are no longer pending.
    fn take_fired(&mut self) -> Vec<Scheduled> {
        let calls = self.calls();
        let index = |c: DeviceCall| DeviceCall::ALL.iter().position(|&x| x == c).unwrap();
        let c = self.checks();
        let (fired, pending): (Vec<_>, Vec<_>) =
            c.faults.iter().partition(|f| calls[index(f.call)] >= f.at);
        c.faults = pending;
        c.fired_any |= !fired.is_empty();
        self.counts.faults_fired += fired.len() as u64;
        fired
    }

    /// Fails unless the stats equal `expected`.
    fn stats_are(&self, expected: &DeviceStats, what: &str) -> Result<(), CheckError> {
        let now = self.alloc.stats();
        if now == *expected {
            return Ok(());
        }
        let changed: Vec<String> = now
            .flat()
            .into_iter()
            .zip(expected.flat())
            .filter(|(a, b)| a.1 != b.1)
            .map(|((key, got), (_, want))| format!("{key} {want} -> {got}"))
            .collect();
        Err(broken(
            Rule::StatsChanged,
            format!("{what}: {}", changed.join(", ")),
        ))
    }

    fn no_device_calls(
        &self,
        before: [u64; DeviceCall::ALL.len()],
        what: &str,
    ) -> Result<(), CheckError> {
        let now = self.calls();
        match DeviceCall::ALL
            .iter()
            .zip(before.iter().zip(now))
            .find(|(_, (b, n))| **b != *n)
        {
            None => Ok(()),
            Some((call, _)) => Err(broken(Rule::DeviceCalled, format!("{what} called {call}"))),
        }
    }

    fn allocation_count_is(&self, expected: i64, what: &str) -> Result<(), CheckError> {
        let now = self.alloc.stats().allocation.all.current;
        if now == expected {
            Ok(())
        } else {
            Err(broken(
                Rule::Counter,
                format!("{what}: allocation.all.current is {now}, expected {expected}"),
            ))
        }
    }

    /// A `pause` or `resume`: torch's stats never move; the result is what the tags' state and
    /// the faults that fired allow.
    fn verify_saver(
        &mut self,
        pause: bool,
        tag: Option<&str>,
        result: Result<u64, SaverError<DeviceErr>>,
        before: &Before,
    ) -> Result<(), CheckError> {
        let fired = self.take_fired();
        let what = format!("{}({tag:?})", if pause { "pause" } else { "resume" });
        let flavour = self.alloc.facts().flavour;
        // A resume unmaps only to undo itself after a failure, and a refused unmap is absorbed.
        let counted: Vec<Scheduled> = fired
            .iter()
            .filter(|f| pause || f.call != DeviceCall::Unmap)
            .copied()
            .collect();
        let must_fail = surfacing(&counted, flavour, &what)?;
        let tags = self.alloc.saver_stats().tags;
        let state = |t: &str| tags.iter().find(|x| x.tag == t).map(|x| x.paused);
        let oom_fired = |call: DeviceCall| {
            fired
                .iter()
                .any(|f| f.call == call && f.fault == Fault::OutOfMemory)
        };
        let ok = match &result {
            Ok(_) => must_fail.is_none(),
            Err(SaverError::Device(e)) => must_fail.as_ref() == Some(e),
            Err(SaverError::UnknownTag(t)) => state(t).is_none(),
            Err(SaverError::AlreadyPaused(t)) => pause && state(t) == Some(true),
            Err(SaverError::NotPaused(t)) => !pause && state(t) == Some(false),
            Err(SaverError::OutOfMemory { .. }) => {
                // The whole resume must fit: every paused byte of the tags it resumes.
                let needed: i64 = tags
                    .iter()
                    .filter(|t| tag.is_none_or(|want| want == t.tag))
                    .map(|t| t.paused_bytes.current)
                    .sum();
                let device = self.alloc.device();
                let used = device.outstanding_bytes() + device.page_bytes();
                !pause
                    && (oom_fired(DeviceCall::CreatePage)
                        || used + device.device_overhead() + needed as u64 > device.capacity())
            }
            // The simulated host never runs out: only an injected fault makes it.
            Err(SaverError::HostOutOfMemory { .. }) => pause && oom_fired(DeviceCall::AllocHost),
            Err(_) => false,
        };
        if !ok {
            return Err(broken(
                Rule::UnexpectedResult,
                format!("{what} returned {result:?} (faults fired: {fired:?})"),
            ));
        }
        // Checked above: a device error here is an injected one.
        if !self.count_saver(pause, &result) && matches!(result, Err(SaverError::Device(_))) {
            self.counts.device_errors += 1;
        }
        self.stats_are(&before.stats, &what)
    }

    fn verify_malloc(
        &mut self,
        id: IdRef,
        size: u64,
        stream: u64,
        result: Result<u64, AllocError<DeviceErr>>,
        before: &Before,
    ) -> Result<(), CheckError> {
        let fired = self.take_fired();
        let what = format!("malloc({size}, stream {stream})");
        let count = before.stats.allocation.all.current;
        let flavour = self.alloc.facts().flavour;
        let must_fail = surfacing(&fired, flavour, &what)?;
        let fired_oom = fired.iter().any(|f| {
            matches!(f.call, DeviceCall::Malloc | DeviceCall::CreatePage) && !f.aborts(flavour)
        });
        let fired_mem_info = fired.iter().any(|f| f.call == DeviceCall::MemInfo);
        // The out-of-memory message asks mem_info last; an earlier call (a new expandable
        // segment's) failing does not lose its numbers.
        let mem_info_calls = self.calls()[DeviceCall::MemInfo as usize];
        let message_lost_mem_info = fired
            .iter()
            .any(|f| f.call == DeviceCall::MemInfo && f.at == mem_info_calls);
        // In torch_npu's flavour a failed device malloc goes on through the chain; the error of
        // the op's last device malloc, if it was injected, is what a failed chain returns
        // (unless the fraction limit refused the last attempt before the device was asked).
        // With `throw_on_npumalloc_oom` each segment request asks the device's total first, and
        // in a memory-saver region with a margin each new segment asks for the free memory
        // (torch_memory_saver's check): a failure of either check's call ends the malloc with
        // its error.
        let rejecting = self.alloc.conf().throw_on_npumalloc_oom;
        let in_region = self.scopes.last().is_some_and(|&(region, _)| region);
        let margin = if in_region {
            self.alloc.saver_memory_margin()
        } else {
            0
        };
        let segment_check_error = fired
            .iter()
            .rfind(|f| f.call == DeviceCall::MemInfo)
            .filter(|_| rejecting || margin > 0)
            .map(Scheduled::error);
        let malloc_calls = self.calls()[DeviceCall::Malloc as usize];
        let last_error = fired
            .iter()
            .find(|f| f.call == DeviceCall::Malloc && f.at == malloc_calls)
            .filter(|f| matches!(f.fault, Fault::Error(_)) && flavour == Flavour::TorchNpu)
            .map(Scheduled::error);
        match (&result, &must_fail) {
            (Err(AllocError::Device(got)), Some(want)) if got == want => {}
            (Err(AllocError::Device(got)), None) if Some(got) == last_error.as_ref() => {}
            (_, Some(want)) => {
                return Err(broken(
                    Rule::UnexpectedResult,
                    format!("{what} returned {result:?} although a fault fired: {want}"),
                ));
            }
            (Err(AllocError::OutOfMemory(_)), None) => {}
            (Err(AllocError::Device(got)), None) if Some(got) == segment_check_error.as_ref() => {}
            // A new expandable segment asks for the device's total too, as does the rejection
            // check of each segment request and the margin's check of a region's.
            (_, None) if fired_mem_info && !before.expandable && !rejecting && margin == 0 => {
                return Err(broken(
                    Rule::UnexpectedResult,
                    format!("{what} asked mem_info without running out of memory: {result:?}"),
                ));
            }
            _ => {}
        }
        if !fired.is_empty() && must_fail.is_none() && !matches!(result, Err(AllocError::Device(_)))
        {
            self.counts.absorbed_faults += 1;
        }
        match result {
            Err(AllocError::TooLarge { size: s }) if size >= MAX_REQUEST && s == size => {
                self.counts.refused += 1;
                self.stats_are(&before.stats, &what)?;
                self.no_device_calls(before.calls, &what)?;
            }
            Ok(0) if size == 0 => {
                self.stats_are(&before.stats, &what)?;
                self.no_device_calls(before.calls, &what)?;
            }
            Ok(addr) if size > 0 && size < MAX_REQUEST => {
                self.check_new_range(addr, size, &what)?;
                self.allocation_count_is(count + 1, &what)?;
                self.checks().by_addr.insert(addr, size);
            }
            Err(AllocError::OutOfMemory(oom)) if size > 0 && size < MAX_REQUEST => {
                self.counts.ooms += 1;
                self.checks().ooms_since_reset += 1;
                self.allocation_count_is(count, &what)?;
                if oom.requested != size || oom.alloc_size < size {
                    return Err(broken(
                        Rule::UnexpectedResult,
                        format!(
                            "{what}: out-of-memory reports request {} and segment {}",
                            oom.requested, oom.alloc_size
                        ),
                    ));
                }
                let capacity = self.alloc.device().capacity();
                let device = self.alloc.device();
                let reserved = device.outstanding_bytes() + device.page_bytes();
                // What the device reports free, and must fit a new segment in, leaves out
                // the memory the process holds outside the allocator (`device_overhead`).
                let overhead = device.device_overhead();
                let used = reserved.saturating_add(overhead);
                let free = (!message_lost_mem_info).then_some(capacity.saturating_sub(used));
                if oom.free != free || oom.total != Some(capacity) {
                    return Err(broken(
                        Rule::UnexpectedResult,
                        format!(
                            "{what}: out-of-memory reports free {:?} of {:?}, expected {free:?} \
                             of {capacity}",
                            oom.free, oom.total,
                        ),
                    ));
                }
                // Legitimate only if the last device malloc really could not fit, or the fraction
                // limit refused it; an injected out-of-memory explains it too, an injected error
                // in the last device malloc only if the fraction then refused the last attempt.
                let need = used.saturating_add(oom.alloc_size);
                // A region's segment also leaves the margin free.
                let margin_full = margin > 0 && need.saturating_add(margin) > capacity;
                let full = if self.alloc.conf().expandable_segments {
                    // Pages are mapped on demand: memory ran out if the device lacks the pages
                    // the request could need (its pages, plus one for a sliver it may not use).
                    let conf = self.alloc.conf();
                    let page = if oom.alloc_size <= alloc_core::size::SMALL_BUFFER {
                        alloc_core::size::SMALL_BUFFER
                    } else {
                        conf.page_size.unwrap_or(conf.segment_size)
                    };
                    let pages = oom.alloc_size.div_ceil(page).saturating_add(1);
                    used.saturating_add(pages.saturating_mul(page)) > capacity
                } else {
                    need > capacity
                };
                // The limit counts torch's reserved bytes, paused ones included.
                let counted = self.alloc.memory_reserved();
                let wanted = counted.saturating_add(oom.alloc_size);
                // The reserve stops at i64::MAX bytes, a limit of its own.
                let limited = wanted > alloc_core::MAX_RESERVE
                    || self.alloc.allowed_memory().is_some_and(|a| wanted > a);
                if last_error.is_some() && !limited {
                    return Err(broken(
                        Rule::UnexpectedResult,
                        format!(
                            "{what}: out-of-memory after its last device malloc failed with {last_error:?}"
                        ),
                    ));
                }
                // The simulator never reuses an address: on a device of several EiB, the
                // 64-bit address space can run out before its memory does.
                let no_addresses = device.address_space_refusals() != before.address_space_refusals;
                if margin_full && !full && !limited {
                    self.counts.margin_ooms += 1;
                }
                let full = full || margin_full;
                if !fired_oom && !full && !limited && !no_addresses {
                    return Err(broken(
                        Rule::SpuriousOutOfMemory,
                        format!(
                            "{what}: segment of {} bytes with {reserved} of {capacity} reserved, \
                             limit {:?}",
                            oom.alloc_size,
                            self.alloc.allowed_memory()
                        ),
                    ));
                }
            }
            Err(AllocError::Rejected(r)) if rejecting && size > 0 && size < MAX_REQUEST => {
                self.counts.rejections += 1;
                self.checks().rejections_since_reset += 1;
                self.allocation_count_is(count, &what)?;
                // torch_npu's bound: the configured fraction of the device's total, truncated.
                let capacity = self.alloc.device().capacity();
                let fraction = self.alloc.conf().per_process_memory_fraction;
                let limit = (fraction * capacity as f64) as u64;
                let total = self.alloc.memory_reserved();
                if r.requested != size
                    || r.alloc_size < size
                    || r.device_total != capacity
                    || r.limit != limit
                    || r.total_allocated != total
                    || total.saturating_add(r.alloc_size) <= limit
                {
                    return Err(broken(
                        Rule::UnexpectedResult,
                        format!(
                            "{what}: rejected with {r:?}, expected a segment past {limit} of \
                             {capacity} bytes with {total} reserved"
                        ),
                    ));
                }
            }
            Err(AllocError::Device(_))
                if must_fail.is_some() || last_error.is_some() || segment_check_error.is_some() =>
            {
                self.counts.device_errors += 1;
                self.allocation_count_is(count, &what)?;
                if self.alloc.stats().num_ooms != before.stats.num_ooms {
                    return Err(broken(
                        Rule::Counter,
                        format!("{what}: a device error counted as out-of-memory"),
                    ));
                }
            }
            other => {
                return Err(broken(
                    Rule::UnexpectedResult,
                    format!(
                        "{what} returned {other:?} for `{}` (faults fired: {fired:?})",
                        self.name(id)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A new allocation `[addr, addr + size)`: aligned, inside one device segment, overlapping
    /// no live allocation.
    fn check_new_range(&mut self, addr: u64, size: u64, what: &str) -> Result<(), CheckError> {
        if addr == 0 || !addr.is_multiple_of(512) {
            return Err(broken(
                Rule::BadAddress,
                format!("{what} returned {addr:#x}"),
            ));
        }
        let end = addr + size;
        let by_addr = &self.checks().by_addr;
        if let Some((&a, &n)) = by_addr.range(..=addr).next_back()
            && a + n.max(1) > addr
        {
            return Err(broken(
                Rule::Overlap,
                format!("{what} returned {addr:#x}, inside the live {a:#x} of {n} bytes"),
            ));
        }
        if let Some((&a, &n)) = by_addr.range(addr..).next()
            && a < end
        {
            return Err(broken(
                Rule::Overlap,
                format!("{what} returned {addr:#x}, overlapping the live {a:#x} of {n} bytes"),
            ));
        }
        let device = self.alloc.device();
        if device.is_backed(addr, end) {
            return Ok(());
        }
        let seg = device.segment_containing(addr);
        Err(broken(
            Rule::OutsideSegment,
            format!("{what} returned {addr:#x}..{end:#x}; device segment {seg:x?}, not mapped"),
        ))
    }

    fn verify_free(
        &mut self,
        addr: u64,
        result: Result<(), FreeError<DeviceErr>>,
        before: &Before,
    ) -> Result<(), CheckError> {
        let fired = self.take_fired();
        let what = format!("free({addr:#x})");
        // A failed event record falls back to a synchronization; only if that fails too does
        // the free fail, with the record's error.
        let record = fired.iter().find(|f| f.call == DeviceCall::RecordEvent);
        let sync = fired.iter().any(|f| f.call == DeviceCall::Synchronize);
        let expected = match (record, sync) {
            (Some(r), true) if fired.len() == 2 => Err(FreeError::Device(r.error())),
            (Some(_), false) if fired.len() == 1 => Ok(()),
            (None, false) if fired.is_empty() => Ok(()),
            _ => {
                return Err(broken(
                    Rule::UnexpectedResult,
                    format!("{what} fired {fired:?}"),
                ));
            }
        };
        if result != expected {
            return Err(broken(
                Rule::UnexpectedResult,
                format!("{what} returned {result:?}, expected {expected:?} (fired {fired:?})"),
            ));
        }
        match result {
            Ok(()) => {
                if !fired.is_empty() {
                    self.counts.absorbed_faults += 1;
                }
                if addr == 0 {
                    self.stats_are(&before.stats, &what)?;
                } else {
                    self.allocation_count_is(before.stats.allocation.all.current - 1, &what)?;
                }
                self.checks().by_addr.remove(&addr);
                let c = self.checks();
                if c.sabotage && c.fired_any && c.misused {
                    return Err(broken(
                        Rule::Sabotaged,
                        format!("{what} after a fault fired and a misuse was refused"),
                    ));
                }
            }
            // Recording the stream events failed and so did the synchronization fallback: the
            // allocation stays the caller's, unchanged.
            Err(_) => {
                self.counts.device_errors += 1;
                self.stats_are(&before.stats, &what)?;
            }
        }
        Ok(())
    }

    /// After a successful `empty_cache`: no pending event, no whole free segment.
    fn check_emptied(&self, before: &DeviceStats) -> Result<(), CheckError> {
        if self.alloc.pending_events() != 0 {
            return Err(broken(
                Rule::CacheNotEmptied,
                format!("{} events still pending", self.alloc.pending_events()),
            ));
        }
        let whole_free = self.alloc.snapshot().into_iter().find(|s| {
            // A pool still held keeps its cache, as torch keeps a live MemPool's.
            let emptied = s.pool_id.is_default()
                || self.alloc.pool_use_count(s.pool_id).is_ok_and(|n| n == 0);
            emptied && s.blocks.len() == 1 && s.blocks[0].state == BlockState::Inactive
        });
        if let Some(seg) = whole_free {
            return Err(broken(
                Rule::CacheNotEmptied,
                format!(
                    "segment {:#x} of {} bytes is free and still cached",
                    seg.address, seg.total_size
                ),
            ));
        }
        let syncs = self.alloc.stats().num_sync_all_streams;
        if syncs != before.num_sync_all_streams + 1 {
            return Err(broken(
                Rule::Counter,
                format!(
                    "empty_cache: num_sync_all_streams {} -> {syncs}",
                    before.num_sync_all_streams
                ),
            ));
        }
        Ok(())
    }

    fn verify_misuse(
        &mut self,
        misuse: Misuse,
        addr: u64,
        result: Result<(), FreeError<DeviceErr>>,
        before: &Before,
    ) -> Result<(), CheckError> {
        let device = self.alloc.device();
        let inside =
            device.segment_containing(addr).is_some() || device.range_containing(addr).is_some();
        let expected = if inside {
            FreeError::NotAllocated { addr }
        } else {
            FreeError::ForeignPointer { addr }
        };
        let what = format!("{} at {addr:#x}", misuse.keyword());
        if result != Err(expected.clone()) {
            return Err(broken(
                Rule::UnexpectedResult,
                format!("{what} returned {result:?}, expected Err({expected:?})"),
            ));
        }
        self.checks().misused = true;
        self.stats_are(&before.stats, &what)?;
        self.no_device_calls(before.calls, &what)
    }

    /// After a drain: nothing left on the device or in the allocator.
    fn check_drained(&self) -> Result<(), CheckError> {
        let d = self.alloc.device();
        let s = self.alloc.stats();
        let left = [
            ("device bytes", d.outstanding_bytes() as i64),
            ("device segments", d.outstanding_segments() as i64),
            ("device events", d.outstanding_events() as i64),
            ("device pages", d.live_pages() as i64),
            ("mapped bytes", d.mapped_bytes() as i64),
            ("reserved ranges", d.reserved_ranges().count() as i64),
            ("reserved_bytes", s.reserved_bytes.all.current),
            ("pending events", self.alloc.pending_events() as i64),
            ("allocation", s.allocation.all.current),
            ("active", s.active.all.current),
            ("segment", s.segment.all.current),
            ("requested_bytes", s.requested_bytes.all.current),
        ];
        match left.iter().find(|(_, n)| *n != 0) {
            None => Ok(()),
            Some((what, n)) => Err(broken(
                Rule::Leak,
                format!("after freeing everything and empty_cache, {what} is {n}"),
            )),
        }
    }

    /// Every invariant, the caller's view, and the counters the executor can recount. The
    /// structural part runs on the schedule of [`FULL_CHECK_LIVE`].
    fn check_invariants(&mut self) -> Result<(), CheckError> {
        let c = self.checks.as_deref_mut().expect("only called with checks");
        c.since_full += 1;
        let live = c.by_addr.len();
        if live <= FULL_CHECK_LIVE
            || c.since_full.saturating_mul(FULL_CHECK_LIVE) >= live
            || self.counts.ops == c.ops
        {
            // The full structural check: every block of a snapshot against the caller's view.
            c.since_full = 0;
            check_allocations(
                &self.alloc,
                c.by_addr
                    .iter()
                    .map(|(&addr, &requested)| (addr, requested)),
            )
            .map_err(CheckError::Inconsistent)?;
        }
        let c = self.checks.as_deref().expect("only called with checks");
        let s = self.alloc.stats();
        let d = self.alloc.device();
        for (name, got, want) in [
            (
                "num_device_alloc",
                s.num_device_alloc,
                self.device_allocs(d) - c.base_mallocs,
            ),
            (
                "num_device_free",
                s.num_device_free,
                self.device_frees(d) - c.base_frees,
            ),
            ("num_ooms", s.num_ooms, c.ooms_since_reset),
            (
                "num_oom_rejections",
                s.num_oom_rejections,
                c.rejections_since_reset,
            ),
        ] {
            if got != want {
                return Err(broken(
                    Rule::Counter,
                    format!("{name} is {got}, the executor counted {want}"),
                ));
            }
        }
        // current = current at the last reset + allocated - freed, for every stat.
        for name in STAT_ARRAY_NAMES {
            let (now, base) = (s.array(name).unwrap(), c.base.array(name).unwrap());
            for (pool, n, b) in [
                ("all", now.all, base.all),
                ("small_pool", now.small_pool, base.small_pool),
                ("large_pool", now.large_pool, base.large_pool),
            ] {
                if n.current != b.current + n.allocated - n.freed {
                    return Err(broken(
                        Rule::Counter,
                        format!(
                            "{name}.{pool}: current {} but {} at the last reset + allocated {} - freed {}",
                            n.current, b.current, n.allocated, n.freed
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The `stats` records taken since the last call (or the run's start), handed over rather
    /// than kept for the report.
    pub(crate) fn take_records(&mut self) -> impl Iterator<Item = StatsRecord> + '_ {
        self.records.drain(..)
    }

    /// The report of the run so far.
    pub fn finish(self, setup: &Setup) -> Report {
        let device = self.alloc.device();
        let (device_mallocs, device_frees) =
            (self.device_allocs(device), self.device_frees(device));
        Report {
            end: StatsRecord {
                label: "end".into(),
                line: self.last_line,
                stats: self.alloc.stats(),
            },
            records: self.records,
            counts: self.counts,
            device_mallocs,
            device_frees,
            device_peak_bytes: device.peak_outstanding_bytes(),
            peak_requested_bytes: self.peak_requested,
            notices: self.alloc.notices().to_vec(),
            settings_warnings: self.settings_warnings,
            saver: self.alloc.saver_stats(),
            setup: setup.clone(),
        }
    }
}

/// The outcome of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// One record per `stats` line.
    pub records: Vec<StatsRecord>,
    /// The stats after the last operation.
    pub end: StatsRecord,
    /// Operation counts.
    pub counts: OpCounts,
    /// Device allocations as torch counts them: segments allocated, plus one per map call of
    /// expandable-segment pages.
    pub device_mallocs: u64,
    /// Device frees as torch counts them: segments freed, plus one per unmapped range.
    pub device_frees: u64,
    /// The largest number of bytes the device had handed out at once, over the whole run
    /// (peak reserved, unaffected by `reset_peak`).
    pub device_peak_bytes: u64,
    /// The largest `requested_bytes.all.current` over the whole run (unaffected by
    /// `reset_peak`).
    pub peak_requested_bytes: u64,
    /// Things the allocator reported (e.g. expandable segments without virtual memory).
    pub notices: Vec<alloc_core::Notice>,
    /// Warnings about the strings of `set_allocator_settings` lines, with their line numbers.
    pub settings_warnings: Vec<(usize, alloc_conf::Warning)>,
    /// The memory saver's figures at the end (peaks since the last `reset_peak`).
    pub saver: alloc_core::SaverStats,
    /// The setup the run used.
    pub setup: Setup,
}

/// Runs every operation of `trace` with `setup` (checked when `checks` is given) and returns the
/// report, or the first failure. A panic inside the allocator or the device is caught and, with
/// checks, reported as [`CheckError::Panic`].
pub fn run(trace: &Trace, setup: &Setup, checks: Option<Checks>) -> Result<Report, Box<Failure>> {
    run_watched(trace, setup, checks, &mut ())
}

/// What a run lets an observer see (the replayer's plots, history and progress,
/// [`crate::observe`]); `()` watches nothing and compiles away.
pub(crate) trait Watch {
    /// Before operation `index` runs.
    fn before(&mut self, _index: usize, _exec: &mut Executor) {}
    /// After operation `index` ran.
    fn after(&mut self, _index: usize, _exec: &mut Executor) {}
    /// After the last operation, before the report is made.
    fn end(&mut self, _exec: &Executor) {}
}

impl Watch for () {}

/// [`run`], with `watch` told about every operation.
pub(crate) fn run_watched(
    trace: &Trace,
    setup: &Setup,
    checks: Option<Checks>,
    watch: &mut impl Watch,
) -> Result<Report, Box<Failure>> {
    let Some(checks) = checks else {
        return run_ops(Executor::new(trace, setup), trace, setup, &mut 0, watch);
    };
    let mut index = 0;
    let exec = Executor::checked(trace, setup, checks);
    catch_panics(|| run_ops(exec, trace, setup, &mut index, watch)).unwrap_or_else(|msg| {
        Err(Box::new(Failure {
            file: trace.file.clone(),
            index,
            line: trace.ops.get(index).map_or(0, |op| op.line),
            error: ExecError::Check(CheckError::Panic(msg)),
        }))
    })
}

/// Steps `exec` through `trace`'s operations, keeping the index of the current one in `index`
/// (for a panic's report).
fn run_ops(
    mut exec: Executor,
    trace: &Trace,
    setup: &Setup,
    index: &mut usize,
    watch: &mut impl Watch,
) -> Result<Report, Box<Failure>> {
    for (i, op) in trace.ops.iter().enumerate() {
        *index = i;
        watch.before(i, &mut exec);
        exec.step(op).map_err(|error| {
            Box::new(Failure {
                file: trace.file.clone(),
                index: i,
                line: op.line,
                error,
            })
        })?;
        watch.after(i, &mut exec);
    }
    watch.end(&exec);
    Ok(exec.finish(setup))
}

thread_local! {
    /// Whether a panic on this thread is caught by a checked run (and so not printed).
    static CATCHING: Cell<bool> = const { Cell::new(false) };
    /// The message and location of the last panic caught on this thread.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `f`, turning a panic into its message; while it runs, panics on this thread are not
/// printed (a shrink may panic thousands of times). Other threads' panics print as usual.
pub(crate) fn catch_panics<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if CATCHING.with(Cell::get) {
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(info.to_string()));
            } else {
                previous(info);
            }
        }));
    });
    let was = CATCHING.with(|c| c.replace(true));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(was));
    result.map_err(|_| {
        LAST_PANIC
            .with(|p| p.borrow_mut().take())
            .unwrap_or_else(|| "panic without a message".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_str;

    /// The failure of replaying `text`, checking its line number.
    fn err(text: &str, line: usize) -> ExecError {
        let trace = parse_str("t.trace", text).unwrap();
        let setup = Setup::from_trace(&trace, AllocConf::default(), None, None);
        let f = run(&trace, &setup, None).expect_err(text);
        assert_eq!(f.line, line, "{f}");
        f.error
    }

    fn msg(text: &str) -> String {
        let trace = parse_str("t.trace", text).unwrap();
        let setup = Setup::from_trace(&trace, AllocConf::default(), None, None);
        run(&trace, &setup, None).expect_err(text).to_string()
    }

    fn not_live(op: &'static str, id: &str, freed_at: Option<usize>) -> ExecError {
        ExecError::Id(IdError::NotLive {
            op,
            id: id.into(),
            freed_at,
        })
    }

    /// `text` replayed with checks: its report, or the failure's message.
    fn checked(text: &str) -> Result<Report, String> {
        let trace = parse_str("t.trace", text).unwrap();
        let setup = Setup::from_trace(&trace, AllocConf::default(), None, None);
        run(&trace, &setup, Some(Checks::default())).map_err(|f| f.to_string())
    }

    #[test]
    fn an_expect_with_nothing_filled_is_skipped() {
        // Zeros read where no fill wrote say nothing of the allocator (stress seed 32 shrank
        // to such a pair, away from its cause).
        let r = checked("alloc a 1M\nexpect a 5\n").unwrap();
        assert_eq!(r.counts.skipped, 1);
        // A fill that could not be made (the tag paused) leaves nothing to compare either.
        let r = checked("region w\nalloc a 1M\npause w\nfill a 7\nresume w\nexpect a 7\n").unwrap();
        assert_eq!(r.counts.skipped, 2);
        // What was filled is still compared.
        let e = checked("alloc a 1M\nfill a 5\nexpect a 6\n").unwrap_err();
        assert!(e.contains("contents lost: a holds [5, 5"), "{e}");
    }

    #[test]
    fn a_paused_segment_left_mapped_by_a_double_fault_is_not_read() {
        // Stress seed 32 (`garbage_collection_threshold:0.6`, fault rate 0.05), shrunk: the
        // resume's copy back fails and so does the unmap undoing its map, so the segment stays
        // mapped, its bytes in the backup, the tag paused. Reading it then is the program's
        // error, not lost contents; the next resume copies the bytes back.
        let text = "region w cpu_backup\nalloc a 800K\nfill a 176\npause w\n\
                    fault copy_to_device 1 error 507899\nfault unmap 1 error 107002\n\
                    resume w\nexpect a 176\nfill a 9\nresume w\nexpect a 176\n";
        let r = checked(text).unwrap();
        // The expect and the fill while paused.
        assert_eq!(r.counts.skipped, 2);
        assert_eq!(r.counts.faults_fired, 2);
    }

    #[test]
    fn a_retained_backup_takes_the_next_pause_without_host_memory() {
        // Retained, the backup is reused: the next pause needs no aclrtMallocHost, so one that
        // would run out of host memory does not happen, and the bytes written since are those
        // copied. Without retention the same pause runs out of host memory.
        let steps = "region w cpu_backup\nalloc a 800K\nfill a 1\npause w\nresume w\n\
                     expect a 1\nfill a 2\nfault alloc_host 1 oom\npause w\nresume w\n\
                     expect a 2\n";
        let r = checked(&format!("retain_cpu_backup on\n{steps}drain\n")).unwrap();
        assert_eq!(r.counts.pause_ooms, 0);
        assert_eq!((r.counts.resumes, r.counts.retained_resumes), (2, 2));
        assert_eq!(r.counts.faults_fired, 0);
        let r = checked(&format!("{steps}drain\n")).unwrap();
        assert_eq!(r.counts.pause_ooms, 1);
        assert_eq!((r.counts.resumes, r.counts.retained_resumes), (1, 0));
        // A segment made after the retaining resume has no buffer yet: its pause needs one.
        let text = "retain_cpu_backup on\nregion w cpu_backup\nalloc a 800K\npause w\n\
                    resume w\nalloc b 30M\nfault alloc_host 1 oom\npause w\ndrain\n";
        let r = checked(text).unwrap();
        assert_eq!((r.counts.pause_ooms, r.counts.faults_fired), (1, 1));
    }

    #[test]
    fn a_region_runs_out_of_memory_unless_the_margin_stays_free_beside_its_segment() {
        // torch_memory_saver's check: margin + segment > free is out of memory, equal fits.
        let text = "capacity 100M\npad 0\nregion w\nmemory_margin 60M\nalloc a 30M\n\
                    alloc b 20M\nmemory_margin 50M\nalloc b 20M\nend_region\n\
                    memory_margin 60M\nalloc c 40M\n";
        let r = checked(text).unwrap();
        // b's first segment: 60 + 20 MiB > 100 − 30 MiB free; the second: 50 + 20 = 70 MiB.
        assert_eq!((r.counts.ooms, r.counts.margin_ooms), (1, 1));
        assert_eq!(r.counts.allocs, 4);
        // The default pools' c asks for no margin: 40 of the last 50 MiB.
        assert_eq!(r.end.stats.reserved_bytes.all.current, 90 << 20);
        assert_eq!(r.end.stats.num_ooms, 1);
        // Without the margin b fits at once.
        let r = checked("capacity 100M\npad 0\nregion w\nalloc a 30M\nalloc b 20M\n").unwrap();
        assert_eq!((r.counts.ooms, r.counts.margin_ooms), (0, 0));
        // A failed free-memory query ends the malloc with its error, as upstream's check.
        let r = checked("region w\nmemory_margin 1M\nfault mem_info 1 error 507899\nalloc a 1M\n")
            .unwrap();
        assert_eq!((r.counts.device_errors, r.counts.faults_fired), (1, 1));
    }

    #[test]
    fn a_fault_due_past_the_last_call_is_never_due() {
        // The checks' model of when a fault fires saturates, as the simulator does.
        let r = checked("alloc a 1\nfault malloc 18446744073709551615 oom\nalloc b 30M\ndrain\n")
            .unwrap();
        assert_eq!((r.counts.faults_scheduled, r.counts.faults_fired), (1, 0));
    }

    #[test]
    fn out_of_memory_is_judged_with_the_device_overhead() {
        // 100 MiB less 50 MiB held outside the allocator: 40 MiB fit, 20 more do not, and the
        // device reports 10 MiB free.
        let text = "capacity 100M\ndevice_overhead 50M\npad 0\nalloc a 40M\nalloc b 20M\n";
        assert_eq!(checked(text).unwrap().counts.ooms, 1);
        // With the free memory lost to a failed mem_info, too.
        let text = "capacity 100M\ndevice_overhead 50M\npad 0\nalloc a 40M\n\
                    fault mem_info 1 oom\nalloc b 20M\n";
        assert_eq!(checked(text).unwrap().counts.ooms, 1);
        // The reserve stops at i64::MAX bytes on a device larger than that.
        let mut text = String::from("capacity 18446744073709551615\n");
        for i in 0..9 {
            text += &format!("alloc a{i} 1152921504606846975\n");
        }
        assert_eq!(checked(&text).unwrap().counts.ooms, 2);
    }

    #[test]
    fn with_many_live_allocations_the_structure_is_checked_at_the_end() {
        let live = 3 * FULL_CHECK_LIVE + 1;
        let text: String = (0..live).map(|i| format!("alloc a{i} 4096\n")).collect();
        let trace = parse_str("t.trace", &text).unwrap();
        let setup = Setup::from_trace(&trace, AllocConf::default(), None, None);
        let mut exec = Executor::checked(&trace, &setup, Checks::default());
        let (last, rest) = trace.ops.split_last().unwrap();
        for op in rest {
            exec.step(op).unwrap();
        }
        // Past 2048 live, every third operation runs the snapshot: the one before the last
        // (3072 live) passed it over.
        let c = exec.checks.as_deref_mut().unwrap();
        assert_eq!(c.since_full, 1);
        // A view the allocator does not share is caught by the trace's last operation, whose
        // turn it is not.
        c.by_addr.insert(1 << 40, 4096);
        assert!(matches!(
            exec.step(last),
            Err(ExecError::Check(CheckError::Inconsistent(
                Inconsistency::NotAllocated { .. }
            )))
        ));
    }

    #[test]
    fn alloc_of_live_id() {
        assert_eq!(
            err("alloc a 1\nalloc b 1\nalloc a 2\n", 3),
            ExecError::Id(IdError::AllocLive {
                id: "a".into(),
                allocated_at: 1
            })
        );
        assert_eq!(
            msg("alloc a 0\nalloc a 0"),
            "t.trace:2: alloc of `a`, which is still live (allocated at line 1)"
        );
    }

    #[test]
    fn free_and_record_of_dead_ids() {
        assert_eq!(err("free a\n", 1), not_live("free", "a", None));
        assert_eq!(
            err("alloc a 1\nfree a\nfree a\n", 3),
            not_live("free", "a", Some(2))
        );
        assert_eq!(err("record a 1\n", 1), not_live("record", "a", None));
        assert_eq!(
            err("alloc a 1\nfree a\nrecord a 1\n", 3),
            not_live("record", "a", Some(2))
        );
        assert_eq!(
            msg("free ghost"),
            "t.trace:1: free of `ghost`, which was never allocated"
        );
        assert_eq!(
            msg("alloc a 1\nfree a\nrecord a 2"),
            "t.trace:3: record of `a`, which was already freed at line 2"
        );
    }

    #[test]
    fn null_allocations_still_pair() {
        let trace = parse_str("t.trace", "alloc z 0\nfree z\n").unwrap();
        let setup = Setup::from_trace(&trace, AllocConf::default(), None, None);
        assert_eq!(run(&trace, &setup, None).unwrap().counts.ops, 2);
        assert_eq!(
            err("alloc z 0\nfree z\nfree z\n", 3),
            not_live("free", "z", Some(2))
        );
    }

    #[test]
    fn misuse_needs_a_freed_or_live_id() {
        assert_eq!(
            msg("alloc a 1\ndouble_free a"),
            "t.trace:2: double_free of `a`, which is still live (allocated at line 1)"
        );
        assert_eq!(
            msg("record_freed b 1"),
            "t.trace:1: record_freed of `b`, which was never allocated"
        );
        assert_eq!(
            msg("alloc a 1\nfree a\nfree_interior a"),
            "t.trace:3: free_interior of `a`, which was already freed at line 2"
        );
    }

    #[test]
    fn misuse_is_refused_and_counted() {
        let text = "pad 0\nalloc a 4K\nalloc b 4K\nfree_interior a\nfree a\ndouble_free a\n\
                    record_freed a 1\nfree_foreign 0x10\nfree b\ndrain\n";
        let trace = parse_str("t.trace", text).unwrap();
        let setup = Setup::from_trace(&trace, AllocConf::default(), None, None);
        for checks in [None, Some(Checks::default())] {
            let r = run(&trace, &setup, checks).unwrap();
            assert_eq!(r.counts.misuses, 4);
            assert_eq!(r.end.stats.allocation.all.current, 0);
        }
    }

    /// Runs `text` with and without checks; both must pass with the same report.
    fn both(text: &str) -> Report {
        let trace = parse_str("t.trace", text).unwrap();
        let setup = Setup::from_trace(&trace, AllocConf::default(), None, None);
        let plain = run(&trace, &setup, None).unwrap();
        let checked = run(&trace, &setup, Some(Checks::default())).unwrap();
        assert_eq!(plain.end, checked.end);
        checked
    }

    #[test]
    fn injected_faults_are_counted_not_fatal() {
        // CUDA's flavour: the first device malloc fails with an injected error, the allocation
        // fails at once, the replay goes on, and a later free of the id is skipped.
        let text = "flavour cuda\nfault malloc 1 error 507899\nalloc a 4K\nfree a\nalloc b 4K\n\
                    free b\n";
        let r = both(text);
        assert_eq!(r.counts.device_errors, 1);
        assert_eq!(r.counts.skipped, 1);
        assert_eq!(r.device_mallocs, 1);
        let s = &r.end.stats;
        assert_eq!((s.num_alloc_retries, s.num_sync_all_streams), (0, 0));
    }

    #[test]
    fn a_failed_free_leaves_the_id_live_and_the_replay_goes_on() {
        // Recording the free's event and the fallback synchronization both fail: the free fails,
        // `a` stays allocated with its stream use. The lines that expect `a` freed (the next
        // `alloc a`, `double_free a`) are skipped; the next `free a` frees it.
        let text = "fault record_event 1 oom\nfault synchronize 1 oom\nalloc a 4K 1\nrecord a 0\n\
                    free a\nalloc a 8K\ndouble_free a\nfree a\nalloc a 8K\n";
        let r = both(text);
        assert_eq!((r.counts.faults_fired, r.counts.device_errors), (2, 1));
        assert_eq!((r.counts.skipped, r.counts.misuses), (2, 0));
        let s = &r.end.stats;
        assert_eq!(s.allocation.all.allocated, 2);
        // 8 KiB + torch_npu's 32-byte pad, rounded to 512.
        assert_eq!(s.allocated_bytes.all.current, 8704);
        // A live id whose free did not fail is still a malformed `alloc`.
        let trace = parse_str("t.trace", "alloc a 4K\nalloc a 4K\n").unwrap();
        let setup = Setup::from_trace(&trace, AllocConf::default(), None, None);
        assert!(matches!(
            run(&trace, &setup, None).unwrap_err().error,
            ExecError::Id(IdError::AllocLive { .. })
        ));
    }

    #[test]
    fn torch_npu_runs_the_whole_chain_after_a_device_error() {
        // torch_npu's flavour: the failed first malloc goes on through release_cached_blocks
        // (a synchronization) and the retry, which succeeds.
        let r = both("fault malloc 1 error 507899\nalloc a 4K\nfree a\n");
        assert_eq!((r.counts.device_errors, r.counts.skipped), (0, 0));
        let s = &r.end.stats;
        assert_eq!(
            (s.num_alloc_retries, s.num_sync_all_streams, s.num_ooms),
            (1, 1, 0)
        );
        assert_eq!((s.num_device_alloc, r.device_mallocs), (1, 1));
        // Both attempts fail: the last attempt's error is returned, not out-of-memory.
        let r =
            both("fault malloc 1 error 507899\nfault malloc 2 error 107000\nalloc a 4K\nfree a\n");
        assert_eq!((r.counts.device_errors, r.counts.skipped), (1, 1));
        let s = &r.end.stats;
        assert_eq!(
            (s.num_alloc_retries, s.num_sync_all_streams, s.num_ooms),
            (1, 1, 0)
        );
        assert_eq!(r.device_mallocs, 0);
        // An out-of-memory first and an error last: the error decides.
        let r = both("fault malloc 1 oom\nfault malloc 2 error 5\nalloc a 4K\nfree a\n");
        assert_eq!((r.counts.device_errors, r.end.stats.num_ooms), (1, 0));
        // An error first and an out-of-memory last: out-of-memory.
        let r = both("fault malloc 1 error 5\nfault malloc 2 oom\nalloc a 4K\nfree a\n");
        assert_eq!((r.counts.device_errors, r.counts.ooms), (0, 1));
        assert_eq!(r.end.stats.num_ooms, 1);
    }

    #[test]
    fn a_sabotaged_check_fails_at_the_first_free_after_a_fault_and_a_misuse() {
        let text = "fault synchronize 1 error 5\nalloc a 4K\nfree a\ndouble_free a\n\
                    alloc b 4K\nempty_cache\nfree b\n";
        let trace = parse_str("t.trace", text).unwrap();
        let setup = Setup::from_trace(&trace, AllocConf::default(), None, None);
        run(&trace, &setup, Some(Checks::default())).unwrap();
        let f = run(&trace, &setup, Some(Checks::sabotaged())).unwrap_err();
        assert_eq!(f.line, 7, "{f}");
        assert!(matches!(
            f.error,
            ExecError::Check(CheckError::Broken {
                rule: Rule::Sabotaged,
                ..
            })
        ));
    }
}
