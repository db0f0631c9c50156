//! The Python package's tests (`python/tests`), run by `python3 -m unittest` over the fake
//! libascendcl with this crate's cdylib. The expected stats come from the same sequence run
//! here through the Rust API. python3 is required (it is on CI): without it this test fails.

use std::path::PathBuf;
use std::process::Command;

use npu_runtime::{Config, NpuAllocator, Stream};
use testkit::fake_acl::{FakeAcl, Variant, fresh_copy};

mod cdylib;
use cdylib::cdylib;

const MIB: u64 = 1 << 20;

/// The stats of `python/tests`' `sequence` through the Rust API, as JSON.
fn expected_stats() -> String {
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    // SAFETY: the fake libascendcl just built from this workspace.
    let rt = unsafe { NpuAllocator::with_library(fake.path(), Config::default()) }.unwrap();
    let ptrs: Vec<u64> = [1000, 3 * MIB, 25 * MIB, 512, 2 * MIB]
        .iter()
        .map(|&size| rt.malloc(size, 0, Stream::DEFAULT).unwrap())
        .collect();
    rt.free(ptrs[1]).unwrap();
    rt.free(ptrs[3]).unwrap();
    let map: serde_json::Map<String, serde_json::Value> = rt
        .memory_stats(0)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.into()))
        .collect();
    serde_json::Value::Object(map).to_string()
}

#[test]
fn the_python_package_passes_its_tests_over_the_fake() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = fresh_copy(Variant::Full);
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(root.join("python/tests"))
        .current_dir(root.join("python"))
        .env("PYTHONPATH", root.join("python"))
        .env("NPU_ALLOC_LIB", cdylib())
        .env("NPU_ALLOC_ACL_LIB", dir.join("libascendcl.so"))
        .env("FAKE_ACL_CAPACITY", (1u64 << 30).to_string())
        .env("FAKE_ACL_DEVICES", "2")
        .env("EXPECTED_STATS", expected_stats())
        .env_remove("PYTORCH_NPU_ALLOC_CONF")
        .output()
        .expect("python3 runs (it is required on CI)");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Ran 32 tests"), "{text}");
    // The runtime's warnings reach stderr (the C library installs a logger): OomPath runs out
    // of memory with cached memory and no synchronize hook.
    assert!(
        text.contains(
            "npu-alloc: NPU 0: out of memory with cached memory that could not be given back"
        ),
        "{text}"
    );
    // Over the fake nothing may be skipped (only `cargo xtask test-hw` skips the fake's tests).
    assert!(!text.contains("skipped"), "{text}");
}
