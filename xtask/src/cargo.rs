//! Running cargo from xtask: the same cargo that runs us (`$CARGO`), in the workspace root.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (xtask's parent directory).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lies inside the workspace")
        .to_path_buf()
}

/// A `cargo` command run from the workspace root.
pub(crate) fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root());
    cmd
}
