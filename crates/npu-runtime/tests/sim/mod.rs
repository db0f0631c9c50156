//! The runtime over `alloc-sim`'s simulated devices (behind fault injectors): what the loom
//! models, the threaded tests and the benches drive. Device `i`'s segments start at
//! `BASE_ADDRESS + i * 2^40`, so devices hand out distinct addresses as real ones do.
#![allow(dead_code)]

use alloc_core::DeviceFacts;
use alloc_sim::{BASE_ADDRESS, SimDevice, TestDevice};
use npu_runtime::{Config, Runtime};

/// A runtime over `devices` simulated devices of `capacity` bytes each, with `config`.
pub fn runtime(devices: u32, capacity: u64, config: Config) -> Runtime<TestDevice> {
    runtime_with(devices, config, move |i| {
        SimDevice::new(capacity).with_base_address(BASE_ADDRESS + (u64::from(i) << 40))
    })
}

/// A runtime over `devices` devices made by `make`, torch_npu's facts (32-byte pad).
pub fn runtime_with(
    devices: u32,
    config: Config,
    make: impl Fn(u32) -> SimDevice + Send + Sync + 'static,
) -> Runtime<TestDevice> {
    Runtime::new(
        devices,
        move |i| Ok((TestDevice::new(make(i)), DeviceFacts::npu(i))),
        config,
    )
}

/// Bytes the simulated devices have handed out, all together.
pub fn device_bytes(rt: &Runtime<TestDevice>) -> u64 {
    (0..rt.device_count())
        .map(|d| rt.with_device(d, |dev| dev.outstanding_bytes()).unwrap())
        .sum()
}

/// Completes every event recorded so far on every device.
pub fn complete_all(rt: &Runtime<TestDevice>) {
    for d in 0..rt.device_count() {
        rt.with_device(d, |dev| dev.complete_all()).unwrap();
    }
}
