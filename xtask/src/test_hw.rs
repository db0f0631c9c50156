//! `cargo xtask test-hw`: the hardware suite on a real Ascend box.
//!
//! First the probe chain of docs/acl.md, in order, stopping at the first step that fails:
//! a `/dev/davinci<N>` node, `libascendcl.so` found and loaded, `aclInit`, a device count
//! above 0, `aclrtSetDevice(0)`, an HBM total above 0. A toolkit-only box (CANN's stub
//! `devlib`) loads the library and fails a later step, so each step is reported.
//!
//! Without hardware it says which step failed and exits 0 (`--require`: exit 1). With
//! hardware it runs `npu-runtime`'s hardware tests (`tests/hw.rs`, `#[ignore]`d in normal
//! runs) against the library the probe found.

use npu_alloc_cli::say;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use acl_sys::{Lib, MemAttr};

use crate::cargo::cargo;

/// Arguments of `cargo xtask test-hw`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Exit 1 instead of 0 when no usable hardware is found.
    #[arg(long)]
    require: bool,
    /// Load this libascendcl.so instead of searching for it.
    #[arg(long)]
    lib: Option<PathBuf>,
}

/// The probe steps, in order.
const STEPS: [&str; 6] = [
    "device node (/dev/davinci<N>)",
    "libascendcl.so loads",
    "aclInit",
    "aclrtGetDeviceCount > 0",
    "aclrtSetDevice(0)",
    "aclrtGetMemInfo(ACL_HBM_MEM) total > 0",
];

/// The `/dev/davinci<N>` nodes (not `davinci_manager`).
fn davinci_nodes(dev: &Path) -> Vec<String> {
    let mut nodes: Vec<String> = std::fs::read_dir(dev)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("davinci")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    nodes.sort();
    nodes
}

/// Runs the probe chain; the loaded library, or the failed step's index and reason.
fn probe(explicit: Option<&Path>) -> Result<Lib, (usize, String)> {
    let report =
        |step: usize, detail: &str| say!("  {}. {} ... ok ({detail})", step + 1, STEPS[step]);
    let nodes = davinci_nodes(Path::new("/dev"));
    if nodes.is_empty() {
        return Err((
            0,
            "no /dev/davinci<N> node: no NPU is visible to this machine".into(),
        ));
    }
    report(0, &nodes.join(", "));
    let lib = match explicit {
        // SAFETY: `--lib` names the libascendcl to test; the developer running the hardware
        // suite vouches for it.
        Some(path) => unsafe { Lib::load(path) },
        None => Lib::search(),
    }
    .map_err(|e| (1, e.to_string()))?;
    report(1, &lib.path().display().to_string());
    let init = lib.init(None).map_err(|e| (2, e.to_string()))?;
    report(2, &format!("{init:?}"));
    let count = lib.device_count().map_err(|e| (3, e.to_string()))?;
    if count == 0 {
        return Err((
            3,
            "aclrtGetDeviceCount reports 0 devices (check ASCEND_RT_VISIBLE_DEVICES)".into(),
        ));
    }
    report(3, &format!("{count} device(s)"));
    lib.set_device(0).map_err(|e| (4, e.to_string()))?;
    report(4, "device 0 bound");
    let (free, total) = lib
        .get_mem_info(MemAttr::HBM_MEM)
        .map_err(|e| (5, e.to_string()))?;
    if total == 0 {
        return Err((
            5,
            "HBM total is 0 (a stub library, or a part without HBM)".into(),
        ));
    }
    report(5, &format!("{free} of {total} bytes free"));
    Ok(lib)
}

/// Runs `cargo xtask test-hw`.
pub(crate) fn run(args: Args) -> ExitCode {
    say!("test-hw: probing for Ascend hardware (see docs/acl.md)");
    let lib = match probe(args.lib.as_deref()) {
        Ok(lib) => lib,
        Err((step, why)) => {
            say!("  {}. {} ... FAILED: {why}", step + 1, STEPS[step]);
            say!(
                "test-hw: no usable Ascend hardware: step {} ({}) failed; hardware suite not run",
                step + 1,
                STEPS[step]
            );
            return if args.require {
                eprintln!("test-hw: --require given: failing");
                ExitCode::FAILURE
            } else {
                say!("test-hw: exit 0 without hardware (pass --require to make this an error)");
                ExitCode::SUCCESS
            };
        }
    };
    let path = lib.path().to_path_buf();
    drop(lib);
    say!(
        "test-hw: running npu-runtime's hardware suite against {}",
        path.display()
    );
    let status = cargo()
        .env("NPU_ALLOC_ACL_LIB", &path)
        .args([
            "test",
            "-p",
            "npu-runtime",
            "--test",
            "hw",
            "--",
            "--ignored",
            "--test-threads=1",
        ])
        .status();
    match status {
        Ok(s) if s.success() => python_suite(&path),
        Ok(s) => {
            eprintln!("test-hw: the hardware suite failed ({s})");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("test-hw: cannot run cargo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The Python package's tests against the real library (the tests that need the fake's
/// controls are skipped there), with a release build of the C library.
fn python_suite(acl: &std::path::Path) -> ExitCode {
    say!(
        "test-hw: running the Python package's tests against {}",
        acl.display()
    );
    let built = cargo()
        .args(["build", "--release", "-p", "npu-alloc-capi"])
        .status();
    if !matches!(built, Ok(s) if s.success()) {
        eprintln!("test-hw: cannot build the C library");
        return ExitCode::FAILURE;
    }
    let root = crate::cargo::workspace_root();
    let status = std::process::Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s", "tests"])
        .current_dir(root.join("python"))
        .env("PYTHONPATH", root.join("python"))
        .env("NPU_ALLOC_LIB", root.join("target/release/libnpu_alloc.so"))
        .env("NPU_ALLOC_ACL_LIB", acl)
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("test-hw: the Python tests failed ({s})");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("test-hw: cannot run python3: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn davinci_nodes_are_numbered_ones_only() {
        let dir = std::env::temp_dir().join(format!("xtask-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "davinci0",
            "davinci12",
            "davinci_manager",
            "davinci",
            "null",
        ] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        assert_eq!(davinci_nodes(&dir), ["davinci0", "davinci12"]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(davinci_nodes(&dir).is_empty());
    }
}
