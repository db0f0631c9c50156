//! The stress engine behind `cargo xtask stress`: long random sequences of every allocator
//! operation, with random device faults and misuse, on a capacity-limited simulated device, every
//! operation judged and every invariant checked by the [checked executor](crate::exec).
//!
//! A run is generated from a seed by a small PRNG ([`StressParams::seed`]) as [`Op`]s, the same
//! operations a `.trace` file holds. A failing run is shrunk to a short sequence that still fails
//! the same way ([`shrink`]) and printed as `.trace` text, fault and misuse lines included, which
//! `replay --check` re-runs to the same failure.

mod generate;
mod rng;
mod shrink;

use core::fmt;
use std::time::Duration;

use alloc_conf::AllocConf;
use alloc_core::Flavour;

use crate::exec::{
    self, CheckError, Checks, DEFAULT_PAD, ExecError, Executor, Failure, Report, Setup,
};
use crate::op::{Op, OpKind, Trace, well_formed};
use crate::write::to_text;

pub use shrink::shrink;

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
    /// Whose retry chain the allocator follows.
    pub flavour: Flavour,
    /// Streams `0..streams` are used.
    pub streams: u64,
    /// Above this many live allocations the generator frees more than it allocates.
    pub max_live: usize,
    /// The probability that an operation is an injected device fault.
    pub fault_rate: f64,
    /// Whether `set_per_process_memory_fraction` operations are generated.
    pub fraction_ops: bool,
    /// Whether virtual-memory faults and `set_allocator_settings` switches of
    /// `expandable_segments` are generated (for a configuration with expandable segments).
    pub expandable_ops: bool,
    /// Whether private pools and memory-saver regions, pauses and resumes (with host-copy
    /// faults, and `fill` / `expect` of contents) are generated.
    pub pool_ops: bool,
    /// Test-only: break a check on purpose ([`Checks::sabotaged`]), to prove that a failure
    /// reproduces from its printed trace.
    pub sabotage: bool,
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
    /// [`DEFAULT_FAULT_RATE`], fraction operations unless the configuration's GC relies on
    /// running without a fraction, and virtual-memory faults and switches when it has expandable
    /// segments.
    pub fn new(seed: u64, ops: u64, conf_text: &str) -> StressParams {
        let conf = alloc_conf::parse(conf_text).conf;
        let expandable_ops = conf.expandable_segments;
        let fraction_ops =
            conf.garbage_collection_threshold.is_none() || conf.per_process_memory_fraction < 1.0;
        StressParams {
            seed,
            ops,
            conf_text: conf_text.to_string(),
            conf,
            capacity: DEFAULT_CAPACITY,
            pad: DEFAULT_PAD,
            flavour: Flavour::TorchNpu,
            streams: 4,
            max_live: DEFAULT_MAX_LIVE,
            fault_rate: DEFAULT_FAULT_RATE,
            fraction_ops,
            expandable_ops,
            pool_ops: true,
            sabotage: false,
        }
    }

    /// The setup of the run's allocator and device.
    pub fn setup(&self) -> Setup {
        Setup {
            conf: self.conf.clone(),
            capacity: self.capacity,
            device_overhead: 0,
            pad: self.pad,
            flavour: self.flavour,
        }
    }

    /// The checks every operation gets.
    pub fn checks(&self) -> Checks {
        if self.sabotage {
            Checks::sabotaged()
        } else {
            Checks::default()
        }
    }

    /// A trace with the run's directives and no operation yet.
    pub fn empty_trace(&self) -> Trace {
        Trace {
            capacity: Some(self.capacity),
            pad: Some(self.pad),
            flavour: Some(self.flavour),
            conf: Some(self.conf_text.trim().to_owned()).filter(|c| !c.is_empty()),
            ..Trace::new(&format!("stress-seed-{}.trace", self.seed))
        }
    }

    /// The `cargo xtask stress` command line that runs exactly these parameters.
    pub fn command(&self, ops: u64) -> String {
        format!(
            "cargo xtask stress --seed {} --ops {} --conf {:?} --capacity {} --pad {} \
             --flavour {} --max-live {} --fault-rate {}{}",
            self.seed,
            ops,
            self.conf_text,
            self.capacity,
            self.pad,
            crate::op::flavour_name(self.flavour),
            self.max_live,
            self.fault_rate,
            if self.sabotage { " --sabotage" } else { "" }
        )
    }
}

/// The configurations that change the policy, each a (name, alloc-conf string) pair: the ones
/// `cargo xtask stress` runs when no `--conf` is given.
pub const VARIANTS: [(&str, &str); 8] = [
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
    (
        "lazy_reclaim+throw_on_oom",
        "multi_stream_lazy_reclaim:True,throw_on_npumalloc_oom:True",
    ),
    (
        "expandable+lazy_reclaim+throw_on_oom+fraction",
        "expandable_segments:True,multi_stream_lazy_reclaim:True,throw_on_npumalloc_oom:True,\
         per_process_memory_fraction:0.7",
    ),
];

/// A failed stress run: how to reproduce it, and the shrunk operations that still fail.
#[derive(Debug, Clone, PartialEq)]
pub struct StressFailure {
    /// The run's parameters (seed, configuration, capacity...).
    pub params: StressParams,
    /// Index of the failing operation in the generated run (`ops`: the final drain).
    pub op_index: u64,
    /// The failure at that operation.
    pub error: ExecError,
    /// The shortest failing trace found; its last operation is the one that fails.
    pub shrunk: Trace,
    /// The failure of the shrunk trace (same kind as `error`).
    pub shrunk_failure: Failure,
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
            "reproduce: {}",
            p.command((self.op_index + 1).min(p.ops))
        )?;
        writeln!(
            f,
            "shrunk to {} operations (failing at operation {}: {}); replay it with \
             `cargo xtask replay --check FILE`{}:",
            self.shrunk.ops.len(),
            self.shrunk_failure.index,
            self.shrunk_failure.error,
            if p.sabotage { " --sabotage" } else { "" },
        )?;
        writeln!(
            f,
            "# cargo xtask stress, seed {}: {} operations, faults and misuse included",
            p.seed,
            self.shrunk.ops.len()
        )?;
        f.write_str(&to_text(&self.shrunk))
    }
}

impl std::error::Error for StressFailure {}

/// Whether two failures are of the same kind, which is what shrinking preserves.
fn same_kind(a: &ExecError, b: &ExecError) -> bool {
    match (a, b) {
        (ExecError::Check(a), ExecError::Check(b)) => a.same_kind(b),
        _ => core::mem::discriminant(a) == core::mem::discriminant(b),
    }
}

/// Runs the stress test `params` describes; on failure, shrinks the failing sequence for at
/// most `shrink_budget`.
pub fn run(params: &StressParams, shrink_budget: Duration) -> Result<Report, Box<StressFailure>> {
    let (trace, failure) = match generate_and_run(params) {
        Ok(report) => return Ok(report),
        Err(failed) => *failed,
    };
    let setup = params.setup();
    // The failing operation is the last one kept.
    let prefix: Vec<OpKind> = trace.ops[..=failure.index]
        .iter()
        .map(|op| op.kind.clone())
        .collect();
    let with_ops = |ops: Vec<OpKind>| {
        let mut t = Trace {
            ops: Vec::with_capacity(ops.len()),
            ..trace.clone()
        };
        for kind in ops {
            t.push(kind);
        }
        t
    };
    let ops = shrink(prefix, shrink_budget, |candidate| {
        let candidate = well_formed(candidate.iter().cloned(), trace.id_count());
        match exec::run(&with_ops(candidate.clone()), &setup, Some(params.checks())) {
            Err(f) if same_kind(&f.error, &failure.error) => Some(candidate[..=f.index].to_vec()),
            _ => None,
        }
    });
    let shrunk = with_ops(ops);
    // Runs are deterministic: the shrunk trace fails at its last operation, as it did when the
    // shrinker kept it (or, kept whole, as the generated run did).
    let shrunk_failure = exec::run(&shrunk, &setup, Some(params.checks()))
        .err()
        .map_or_else(|| failure.clone(), |f| *f);
    Err(Box::new(StressFailure {
        params: params.clone(),
        op_index: failure.index as u64,
        error: failure.error.clone(),
        shrunk,
        shrunk_failure,
    }))
}

/// Generates `params.ops` operations, executing and checking each, then the final drain.
/// Returns the report, or the trace generated up to the failing operation and the failure.
pub fn generate_and_run(params: &StressParams) -> Result<Report, Box<(Trace, Failure)>> {
    let mut trace = params.empty_trace();
    let setup = params.setup();
    let mut index = 0;
    let outcome = exec::catch_panics(|| {
        let mut exec = Executor::checked(&trace, &setup, params.checks());
        let mut generator = generate::Generator::new(params);
        for i in 0..=params.ops {
            let kind = if i == params.ops {
                OpKind::Drain
            } else {
                generator.next(&mut trace, &exec)
            };
            exec.add_ids(&trace);
            trace.ops.push(Op { line: 0, kind });
            index = trace.ops.len() - 1;
            let op = &trace.ops[index];
            exec.step(op).map_err(|error| {
                Box::new(Failure {
                    file: trace.file.clone(),
                    index,
                    line: 0,
                    error,
                })
            })?;
            generator.observe(&op.kind, &exec);
        }
        Ok::<_, Box<Failure>>(exec.finish(&setup))
    });
    match outcome {
        Ok(Ok(report)) => Ok(report),
        Ok(Err(failure)) => Err(Box::new((trace, *failure))),
        Err(msg) => {
            let file = trace.file.clone();
            let failure = Failure {
                file,
                index,
                line: 0,
                error: ExecError::Check(CheckError::Panic(msg)),
            };
            Err(Box::new((trace, failure)))
        }
    }
}
