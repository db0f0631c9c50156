//! `cargo xtask bench --instructions` runs this under callgrind: `N` cache-hit malloc + free
//! pairs through the runtime (one simulated device, the `runtime_hit` population). Two runs with
//! different `N` give the instructions of one pair, free of the set-up's.

use std::hint::black_box;

use alloc_core::DeviceFacts;
use alloc_sim::{SimDevice, SimStream};
use alloc_trace::workload::hit_size;
use npu_runtime::{Config, Runtime};

fn main() {
    let pairs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let rt = Runtime::new(
        1,
        |i| Ok((SimDevice::new(u64::MAX / 2), DeviceFacts::cuda_parity(i))),
        Config::default(),
    );
    for j in 0..16 {
        black_box(rt.malloc(hit_size(j), 0, SimStream(0)).expect("unlimited"));
        let hole = rt.malloc(hit_size(j), 0, SimStream(0)).expect("unlimited");
        rt.free(hole).expect("just allocated");
    }
    for i in 0..pairs {
        let p = rt
            .malloc(black_box(hit_size(i as usize)), 0, SimStream(0))
            .expect("a cache hit");
        rt.free(black_box(p)).expect("just allocated");
    }
}
