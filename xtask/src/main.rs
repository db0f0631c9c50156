//! `cargo xtask`: developer and CI commands for npu-alloc.
fn main() {}
