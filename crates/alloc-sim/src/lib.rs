//! Simulation for npu-alloc: a device to run the policy on without hardware, failures on cue, and
//! the allocator's invariants checked from the outside.
//!
//! - [`SimDevice`]: a deterministic, capacity-limited device with predictable addresses and stream
//!   work that completes only when the caller says so. The replayer, the stress engine, the
//!   property tests, the runtime's tests and loom models and the benches all run on it.
//! - [`FaultInjector`]: wraps any [`Device`](alloc_core::Device) and fails the n-th call of a
//!   kind (smoltcp's `FaultInjector`), so the same faults reach the simulated device and any other.
//! - [`check_consistency`] / [`check_allocations`]: every stat against a recount from the
//!   snapshot, blocks tiling their segments, nothing unmerged, the device's ledger.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod check;
mod contents;
mod fault;
mod sim_device;

pub use check::{Inconsistency, check_allocations, check_consistency};
pub use fault::{DeviceCall, Fault, FaultError, FaultInjector};
pub use sim_device::{
    BASE_ADDRESS, DEFAULT_CAPACITY, SEGMENT_ALIGNMENT, SimDevice, SimError, SimEvent, SimPage,
    SimStream,
};

/// The device the replayer, the stress engine and most tests run on: the simulated device behind
/// a fault injector.
pub type TestDevice = FaultInjector<SimDevice>;
