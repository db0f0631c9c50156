//! The runtime's API on arbitrary call sequences: `npu_runtime::Runtime` over two simulated
//! devices behind fault injectors. Every call returns a value or a typed error; afterwards, with
//! faults cleared, everything freed, events completed and the cache emptied, nothing is
//! allocated or reserved and the devices hold nothing.
#![no_main]

use alloc_core::DeviceFacts;
use alloc_sim::{BASE_ADDRESS, DeviceCall, Fault, SimDevice, SimStream, TestDevice};
use libfuzzer_sys::fuzz_target;
use npu_runtime::{Config, Runtime};

const MIB: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let mut config = Config::default();
    config.alloc.release_lock_on_npumalloc = flags & 1 != 0;
    if flags & 2 != 0 {
        config.alloc.max_split_size = Some(40 * MIB);
    }
    let rt = Runtime::new(
        2,
        |i| {
            let device =
                SimDevice::new(96 * MIB).with_base_address(BASE_ADDRESS + (u64::from(i) << 40));
            Ok((TestDevice::new(device), DeviceFacts::npu(i)))
        },
        config,
    );
    let mut live: Vec<u64> = Vec::new();
    for c in body.chunks_exact(3) {
        let (k, a, b) = (c[0], u64::from(c[1]), u64::from(c[2]));
        let device = u32::from(c[1] & 1);
        let stream = SimStream(b % 3);
        match k % 10 {
            0..=2 => {
                let size =
                    [0, 1, 512, 4096, MIB, 3 * MIB, 12 * MIB, 50 * MIB, 1 << 60][(a % 9) as usize];
                if let Ok(p) = rt.malloc(size + b, device, stream) {
                    if p != 0 {
                        live.push(p);
                    }
                }
            }
            3 | 4 if !live.is_empty() => {
                let p = live.swap_remove((a as usize) % live.len());
                if rt.free(p).is_err() {
                    live.push(p); // a failed free leaves the allocation live
                }
            }
            5 if !live.is_empty() => {
                let _ = rt.record_stream(live[(a as usize) % live.len()], stream);
            }
            6 if a & 1 == 0 => {
                let _ = rt.empty_cache();
            }
            6 => {
                let _ = rt.empty_virt_addr_cache();
            }
            7 => {
                let _ = rt.set_per_process_memory_fraction(
                    [1.0, 0.5, 0.0, 2.0][(a % 4) as usize],
                    device,
                );
            }
            8 => rt.with_device(device, |d| d.complete_all()).unwrap(),
            _ => {
                let call = DeviceCall::ALL[(a as usize) % DeviceCall::ALL.len()];
                let fault = if b & 1 == 0 {
                    Fault::OutOfMemory
                } else {
                    Fault::Error(7)
                };
                rt.with_device(device, |d| d.fail_nth(call, 1 + b % 3, fault))
                    .unwrap();
            }
        }
        // Never: a live allocation's address freed twice or handed out twice.
        let mut sorted = live.clone();
        sorted.sort_unstable();
        assert!(
            sorted.windows(2).all(|w| w[0] != w[1]),
            "an address handed out twice"
        );
    }
    for d in 0..2 {
        rt.with_device(d, |dev| dev.clear_all_faults()).unwrap();
    }
    for p in live {
        rt.free(p).unwrap();
    }
    for d in 0..2 {
        rt.with_device(d, |dev| dev.complete_all()).unwrap();
    }
    rt.empty_cache().unwrap();
    for d in 0..2 {
        assert_eq!(rt.memory_allocated(d).unwrap(), 0);
        assert_eq!(rt.memory_reserved(d).unwrap(), 0);
        assert_eq!(rt.with_device(d, |dev| dev.outstanding_bytes()).unwrap(), 0);
    }
});
