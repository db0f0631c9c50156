//! The `.trace` format and everything that runs it: the parser (with `file:line` errors) and
//! writer, the one operation type ([`OpKind`]) shared by the replayer, the stress engine, the
//! property tests and the fuzz targets, the one [executor](exec) that runs operations through
//! `alloc-core` on the simulated device (with or without the stress engine's checks), the stress
//! generator and shrinker, the shipped traces (`traces/`) and the benchmark workloads.
//!
//! The format is documented in the repository's `docs/trace-format.md`.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod exec;
pub mod import;
pub mod observe;
mod op;
mod parse;
pub mod replay;
mod size;
pub mod stress;
pub mod workload;
mod write;

pub use exec::{
    CheckError, Checks, ExecError, Executor, FULL_CHECK_LIVE, Failure, IdError, OpCounts, Report,
    Rule, Setup, StatsRecord,
};
pub use import::{
    ImportError, ImportNote, ImportOptions, ImportSummary, Imported, LeftOut, import_snapshot,
};
pub use observe::{EndState, Observe, Observed, Point, replay_observed};
pub use op::{IdRef, Misuse, Op, OpKind, PoolOp, Trace, flavour_name, well_formed};
pub use parse::{
    Echo, KEYWORDS, LoadError, TraceError, TraceErrorKind, load, parse_bytes, parse_str,
};
pub use replay::{replay, replay_checked};
pub use size::{SizeError, parse_size};
pub use write::{Line, to_text};

/// The directory of the shipped traces (`crates/alloc-trace/traces`), for tests and tools run
/// from a checkout.
pub const TRACES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/traces");
