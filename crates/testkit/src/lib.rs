//! Test and demo support for npu-alloc: a simulated device, the `.trace` parser, the replayer and
//! the stress engine.
//!
//! Nothing here is needed by a program at run time; it exists so the policy in `alloc-core` can be
//! exercised deterministically (see [`SimDevice`]) and so allocation traces can be parsed (see
//! [`trace`]) and replayed.
#![forbid(unsafe_code)]

pub mod check;
pub mod fault;
pub mod paired;
pub mod replay;
pub mod sim_device;
pub mod size;
pub mod stress;
pub mod trace;
pub mod workload;

pub use check::{Inconsistency, check_allocations, check_consistency};
pub use fault::{DeviceCall, Fault};
pub use paired::{Paired, PairedResult};
pub use replay::{OpCounts, ReplayError, ReplayReport, Setup, StatsRecord, replay};
pub use sim_device::{
    BASE_ADDRESS, DEFAULT_CAPACITY, SEGMENT_ALIGNMENT, SimDevice, SimError, SimEvent,
};
pub use size::{SizeError, parse_size};
pub use trace::{IdRef, LoadError, Op, OpKind, Trace, TraceError, TraceErrorKind};
