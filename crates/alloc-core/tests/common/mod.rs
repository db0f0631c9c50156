//! Shared helpers for the alloc-core integration tests.
#![allow(dead_code)]

use alloc_core::{AllocConf, Allocator, DeviceFacts};
use alloc_sim::{SimDevice, SimStream, TestDevice};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const S0: SimStream = SimStream(0);
pub const S1: SimStream = SimStream(1);
pub const S2: SimStream = SimStream(2);

/// An allocator over a simulated device of `capacity` bytes (behind a fault injector), with
/// CUDA parity (no pad).
pub fn cuda(capacity: u64, conf: &AllocConf) -> Allocator<TestDevice> {
    Allocator::new(
        TestDevice::new(SimDevice::new(capacity)),
        conf,
        DeviceFacts::cuda_parity(0),
    )
}

/// An allocator with torch_npu's 32-byte pad.
pub fn npu(capacity: u64, conf: &AllocConf) -> Allocator<TestDevice> {
    Allocator::new(
        TestDevice::new(SimDevice::new(capacity)),
        conf,
        DeviceFacts::npu(0),
    )
}

/// Parses a config string the way the runtime does (no warnings expected).
pub fn conf(s: &str) -> AllocConf {
    let parsed = alloc_conf::parse(s);
    assert!(parsed.warnings.is_empty(), "{s}: {:?}", parsed.warnings);
    parsed.conf
}

/// Looks a flat stat up by torch's key.
pub fn stat<D: alloc_core::Device>(a: &Allocator<D>, key: &str) -> i64 {
    a.stats()
        .flat()
        .into_iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no stat {key}"))
        .1
}

/// Checks every invariant (see `alloc_sim::check_consistency`), panicking with the broken one.
pub fn check_consistency<D: alloc_core::Device + AsRef<SimDevice>>(a: &Allocator<D>) {
    if let Err(e) = alloc_sim::check_consistency(a) {
        panic!("{e}");
    }
}
