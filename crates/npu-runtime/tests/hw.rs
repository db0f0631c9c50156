//! The hardware suite: the end-to-end scenarios against a real `libascendcl` and NPU, plus
//! checks on real memory. Every test is `#[ignore]`d; `cargo xtask test-hw` runs them after
//! its probes pass (`NPU_ALLOC_ACL_LIB` names the library it found), one at a time.
#![cfg(not(loom))]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::c_void;

use acl_sys::{DevicePtr, MemcpyKind};
use npu_runtime::{AclPlatform, Config, NpuAllocator, Stream};

const MIB: u64 = 1 << 20;

fn platform() -> AclPlatform {
    let path = std::env::var_os("NPU_ALLOC_ACL_LIB").expect("run through cargo xtask test-hw");
    // SAFETY: `cargo xtask test-hw` probed this library: it is the installed libascendcl.
    unsafe { AclPlatform::load(path) }.expect("the probed libascendcl")
}

fn runtime() -> NpuAllocator {
    platform().runtime(Config::default())
}

fn stat(rt: &NpuAllocator, key: &str) -> i64 {
    rt.memory_stats(0)
        .unwrap()
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
        .unwrap()
}

#[test]
#[ignore = "needs an Ascend NPU: cargo xtask test-hw"]
fn cache_hit_reuses_the_block_without_a_device_malloc() {
    let rt = runtime();
    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(rt.memory_allocated(0).unwrap(), 1536);
    assert_eq!(rt.memory_reserved(0).unwrap(), 2 * MIB);
    rt.free(a).unwrap();
    let b = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    assert_eq!(a, b);
    assert_eq!(stat(&rt, "num_device_alloc"), 1);
    rt.free(b).unwrap();
    rt.empty_cache().unwrap();
    assert_eq!(rt.memory_reserved(0).unwrap(), 0);
}

#[test]
#[ignore = "needs an Ascend NPU: cargo xtask test-hw"]
fn empty_cache_gives_memory_back_to_the_device() {
    let rt = runtime();
    let a = rt.malloc(256 * MIB, 0, Stream::DEFAULT).unwrap();
    rt.free(a).unwrap();
    let (free_cached, _) = rt.mem_get_info(0).unwrap();
    rt.empty_cache().unwrap();
    let (free_after, _) = rt.mem_get_info(0).unwrap();
    assert!(
        free_after >= free_cached + 200 * MIB,
        "{free_cached} -> {free_after}"
    );
    assert_eq!(stat(&rt, "num_device_free"), 1);
}

#[test]
#[ignore = "needs an Ascend NPU: cargo xtask test-hw"]
fn oom_takes_the_retry_chain_with_torch_npus_message() {
    let rt = runtime();
    let (_, total) = rt.mem_get_info(0).unwrap();
    let err = rt.malloc(total * 2, 0, Stream::DEFAULT).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(
        err.to_string()
            .starts_with("NPU out of memory. Tried to allocate "),
        "{err}"
    );
    assert_eq!(stat(&rt, "num_ooms"), 1);
    assert_eq!(stat(&rt, "num_alloc_retries"), 1);
    assert_eq!(stat(&rt, "num_sync_all_streams"), 1);
}

#[test]
#[ignore = "needs an Ascend NPU: cargo xtask test-hw"]
fn memory_holds_data_and_record_stream_waits_for_the_stream() {
    let platform = platform();
    let rt = platform.clone().runtime(Config::default());
    let lib = platform.lib();
    lib.set_device(0).unwrap();
    let side = lib.create_stream().unwrap();
    let n = 4096usize;
    let a = rt.malloc(n as u64, 0, Stream::DEFAULT).unwrap();
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    let mut back = vec![0u8; n];
    let dev = DevicePtr::from_addr(a).unwrap().as_ptr();
    // SAFETY: `data` is readable and `back` writable for `n` bytes; `dev` is a live
    // allocation of at least `n` bytes.
    unsafe {
        lib.memcpy(
            dev,
            n,
            data.as_ptr().cast::<c_void>(),
            n,
            MemcpyKind::HOST_TO_DEVICE,
        )
        .unwrap();
        lib.memcpy(
            back.as_mut_ptr().cast::<c_void>(),
            n,
            dev,
            n,
            MemcpyKind::DEVICE_TO_HOST,
        )
        .unwrap();
    }
    assert_eq!(back, data);
    rt.record_stream(a, side.into()).unwrap();
    let active = stat(&rt, "active_bytes.all.current");
    assert!(active >= n as i64);
    rt.free(a).unwrap();
    // Pending on the side stream's event until an event poll sees it complete.
    assert_eq!(stat(&rt, "active_bytes.all.current"), active);
    assert_eq!(stat(&rt, "allocated_bytes.all.current"), 0);
    lib.synchronize_stream(side).unwrap();
    rt.process_events(0).unwrap();
    assert_eq!(stat(&rt, "active_bytes.all.current"), 0);
    assert_eq!(rt.malloc(n as u64, 0, Stream::DEFAULT).unwrap(), a);
    rt.free(a).unwrap();
    rt.empty_cache().unwrap();
    // SAFETY: the stream is live, idle, and not used afterwards.
    unsafe { lib.destroy_stream(side).unwrap() };
}

#[test]
#[ignore = "needs an Ascend NPU: cargo xtask test-hw"]
fn fraction_limits_new_segments() {
    let rt = runtime();
    let (_, total) = rt.mem_get_info(0).unwrap();
    rt.set_per_process_memory_fraction(0.01, 0).unwrap();
    let err = rt.malloc(total / 50, 0, Stream::DEFAULT).unwrap_err();
    assert!(err.to_string().contains(" allowed; "), "{err}");
}
