//! `include/npu_alloc.h` is generated from the exports with cbindgen; this test fails when the
//! checked-in header is stale. Regenerate it with
//! `UPDATE_HEADER=1 cargo test -p npu-alloc-capi --test header`.

use std::path::PathBuf;

fn generated() -> String {
    let crate_dir = env!("CARGO_MANIFEST_DIR");
    let mut config = cbindgen::Config {
        language: cbindgen::Language::C,
        include_guard: Some("NPU_ALLOC_H".into()),
        header: Some(
            "/* npu-alloc's C API. Generated from crates/npu-alloc-capi by cbindgen: do not edit.\n \
             * `aclrtStream` arguments are `void *`, as in ACL's headers. See docs/c-abi.md. */"
                .into(),
        ),
        sys_includes: vec!["stdbool.h".into(), "stddef.h".into(), "stdint.h".into()],
        no_includes: true,
        documentation: true,
        cpp_compat: true,
        ..Default::default()
    };
    config.enumeration.prefix_with_name = true;
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut out);
    String::from_utf8(out).expect("UTF-8 header")
}

#[test]
fn the_checked_in_header_is_current() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../include/npu_alloc.h");
    let fresh = generated();
    if std::env::var_os("UPDATE_HEADER").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "include/npu_alloc.h is stale: run UPDATE_HEADER=1 cargo test -p npu-alloc-capi --test header"
    );
    for export in [
        "npu_alloc_malloc",
        "npu_alloc_free",
        "npu_alloc_last_error",
        "NpuAllocStatus_OutOfMemory",
    ] {
        assert!(fresh.contains(export), "{export}");
    }
}
