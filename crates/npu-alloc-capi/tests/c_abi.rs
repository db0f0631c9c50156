//! A C program compiled with the system `cc` against `include/npu_alloc.h`, linked with the
//! cdylib and run over the fake libascendcl, calls every exported function.

use std::path::PathBuf;
use std::process::Command;

use testkit::fake_acl::{Variant, fresh_copy};

mod cdylib;
use cdylib::cdylib;

#[test]
fn a_c_program_calls_every_export() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = cdylib();
    let dir = fresh_copy(Variant::Full);
    let exe = dir.join("smoke");
    let cc = Command::new("cc")
        .arg(root.join("crates/npu-alloc-capi/tests/c/smoke.c"))
        .arg("-I")
        .arg(root.join("include"))
        .arg("-L")
        .arg(lib.parent().unwrap())
        .args(["-lnpu_alloc", "-lm", "-ldl", "-pthread", "-o"])
        .arg(&exe)
        .output()
        .expect("cc runs (it is required on CI)");
    assert!(
        cc.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = Command::new(&exe)
        .env("LD_LIBRARY_PATH", lib.parent().unwrap())
        .env("NPU_ALLOC_ACL_LIB", dir.join("libascendcl.so"))
        .env("FAKE_ACL_CAPACITY", (1u64 << 30).to_string())
        .env("FAKE_ACL_DEVICES", "2")
        .env("SNAPSHOT_PATH", dir.join("c.pickle"))
        .env_remove("PYTORCH_NPU_ALLOC_CONF")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&run.stdout), "ok\n");
    let stderr = String::from_utf8_lossy(&run.stderr);
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("npu-alloc: set_allocator_settings: "))
        .unwrap_or_else(|| panic!("no settings warning on stderr:\n{stderr}"));
    assert!(warning.contains("bogus_key"), "{warning}");
    // The hooks that return nothing say why they refused.
    for (prefix, names) in [
        (
            "npu-alloc: set_per_process_memory_fraction: ",
            "Invalid fraction value: 2. Allowed range: 0~1",
        ),
        (
            "npu-alloc: reset_peak_memory_stats: ",
            "Invalid device argument 9",
        ),
    ] {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line on stderr:\n{stderr}"));
        assert!(line.contains(names), "{line}");
    }
    let py = testkit::python_snapshot::read_with_python(&dir.join("c.pickle"));
    assert_eq!(py.trace_lengths.len(), 2);
    // History turned on before the library started records from its first allocation: the
    // 3 MiB one's 20 MiB segment, then the allocation.
    let snapshot = alloc_snapshot::read_file(&dir.join("c.pickle"))
        .unwrap()
        .snapshot;
    let first: Vec<_> = snapshot.device_traces[0][..2]
        .iter()
        .map(|e| (e.action.name().to_owned(), e.size))
        .collect();
    assert_eq!(
        first,
        [
            ("segment_alloc".to_owned(), 20 << 20),
            ("alloc".to_owned(), 3 << 20)
        ]
    );
}
