//! End-to-end through the process environment: the library found by `$NPU_ALLOC_ACL_LIB`, the
//! configuration read once from the environment, and each warning logged once. One test in
//! its own binary, since it sets environment variables.
#![cfg(not(loom))]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::sync::Mutex;

use npu_runtime::{AclError, AclPlatform, Config, NpuAllocator, Stream};
use testkit::fake_acl::{FakeAcl, Variant};

/// Captures every warning logged.
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            self.0.lock().unwrap().push(record.args().to_string());
        }
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture(Mutex::new(Vec::new()));

fn logged(part: &str) -> usize {
    CAPTURE
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|m| m.contains(part))
        .count()
}

#[test]
fn environment_library_config_and_warnings_once() {
    log::set_logger(&CAPTURE).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let fake = FakeAcl::new(Variant::Full, 1 << 30, 1);
    // SAFETY: this binary's only test; no other thread reads the environment meanwhile.
    unsafe {
        std::env::set_var("NPU_ALLOC_ACL_LIB", fake.dir());
        std::env::set_var("PYTORCH_NPU_ALLOC_CONF", "max_split_size_mb:64,bogus_key:1");
        std::env::set_var("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128");
        std::env::set_var("PYTORCH_NO_NPU_MEMORY_CACHING", "1");
    }

    let rt = NpuAllocator::from_env().expect("the fake, found through NPU_ALLOC_ACL_LIB");
    // The runtime initialised the fake (the only library that counts calls).
    assert_eq!(fake.calls("aclInit"), 1);
    let config = rt.config();
    assert!(!config.caching);
    assert_eq!(config.alloc.max_split_size, Some(64 << 20));
    assert_eq!(
        config.source.map(|s| s.name()),
        Some("PYTORCH_NPU_ALLOC_CONF")
    );
    assert_eq!(logged("unknown_key `bogus_key`"), 1);

    // No caching: each malloc goes to the device, each free synchronizes and frees.
    let a = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    rt.free(a).unwrap();
    let b = rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    rt.free(b).unwrap();
    assert_eq!(fake.calls("aclrtMallocAlign32"), 2);
    assert_eq!(fake.calls("aclrtSynchronizeDevice"), 2);
    assert_eq!(fake.calls("aclrtFree"), 2);

    // Read once: a changed environment does not change the configuration, nor log again.
    // SAFETY: as above.
    unsafe { std::env::set_var("PYTORCH_NO_NPU_MEMORY_CACHING", "0") };
    assert!(!Config::from_env().caching);
    assert_eq!(logged("unknown_key `bogus_key`"), 1);

    // A notice is logged once however many devices report it.
    let mut gc = Config::default();
    gc.alloc.garbage_collection_threshold = Some(0.5);
    for _ in 0..2 {
        // SAFETY: the fake libascendcl built from this workspace.
        let rt = unsafe { NpuAllocator::with_library(fake.path(), gc.clone()) }.unwrap();
        fake.fail_next("aclrtGetMemInfo", 507_899, 1);
        rt.malloc(1000, 0, Stream::DEFAULT).unwrap();
    }
    assert_eq!(logged("garbage_collection_threshold is ignored"), 1);

    // A missing library: a typed error listing every path searched, the variable's first.
    let missing = "/nonexistent-npu-runtime-env/libascendcl.so";
    // SAFETY: as above.
    unsafe { std::env::set_var("NPU_ALLOC_ACL_LIB", missing) };
    match AclPlatform::search() {
        Err(AclError::NotFound { searched }) => {
            let mut expected = acl_sys::candidate_paths(None, |n| std::env::var_os(n));
            // After the variable's path, the probe for a libascendcl.so already loaded: the
            // fake was loaded by its path and has no soname, so it is not that.
            expected.insert(1, "libascendcl.so (already loaded)".into());
            assert_eq!(searched.len(), expected.len());
            assert_eq!(searched[0].path, std::path::Path::new(missing));
            for (attempt, path) in searched.iter().zip(&expected) {
                assert_eq!(&attempt.path, path);
            }
        }
        // A machine with a real CANN install finds it further down the list.
        Err(AclError::MissingSymbols { .. }) | Ok(_) => {}
        Err(other) => panic!("unexpected {other:?}"),
    }
}
