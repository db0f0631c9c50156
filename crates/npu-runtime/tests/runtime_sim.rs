//! The runtime over simulated devices, without loom: device-table checks and OOM observers.
#![cfg(not(loom))]

mod sim;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use alloc_sim::SimStream;
use npu_runtime::{Config, RuntimeError};

const MIB: u64 = 1 << 20;
const S0: SimStream = SimStream(0);

#[test]
fn the_device_table_decides_which_indices_are_valid() {
    let rt = sim::runtime(2, 64 * MIB, Config::default());
    assert_eq!(rt.device_count(), 2);
    for device in [2, 3, u32::MAX] {
        assert_eq!(
            rt.malloc(1000, device, S0).unwrap_err(),
            RuntimeError::InvalidDevice { device, count: 2 }
        );
        assert!(matches!(
            rt.with_device(device, |_| ()),
            Err(RuntimeError::InvalidDevice { .. })
        ));
    }
    let p = rt.malloc(1000, 1, S0).unwrap();
    rt.free(p).unwrap();
}

#[test]
fn an_observer_that_runs_out_of_memory_again_is_not_called_again() {
    // Each device holds 3 MiB: a 20 MiB segment never fits. The observer tries one on the other
    // device, which runs out of memory too; that OOM is returned to the observer without calling
    // the observers again (before, this recursed until the stack overflowed).
    let rt = Arc::new(sim::runtime(2, 3 * MIB, Config::default()));
    let calls = Arc::new(AtomicU64::new(0));
    {
        let weak: Weak<_> = Arc::downgrade(&rt);
        let calls = calls.clone();
        rt.attach_out_of_memory_observer(move |oom| {
            calls.fetch_add(1, Ordering::Relaxed);
            let rt = weak.upgrade().unwrap();
            let other = (oom.device + 1) % 2;
            assert!(
                rt.malloc(5 * MIB, other, S0)
                    .unwrap_err()
                    .is_out_of_memory()
            );
        });
    }
    assert!(rt.malloc(5 * MIB, 0, S0).unwrap_err().is_out_of_memory());
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    // The next OOM outside an observer calls it again.
    assert!(rt.malloc(5 * MIB, 1, S0).unwrap_err().is_out_of_memory());
    assert_eq!(calls.load(Ordering::Relaxed), 2);
}
