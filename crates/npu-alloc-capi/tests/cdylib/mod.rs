//! Where the tests that load this crate's C library find it.

use std::path::PathBuf;

/// The cdylib cargo built next to this test (`<target>/<profile>/libnpu_alloc.so`).
pub fn cdylib() -> PathBuf {
    // `cargo test` leaves it in `<target>/<profile>/deps` (next to this test); `cargo build`
    // also copies it to `<target>/<profile>`.
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|dir| dir.join("libnpu_alloc.so"))
        .find(|lib| lib.exists())
        .expect("libnpu_alloc.so is built with the crate")
}
