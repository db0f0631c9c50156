//! `cargo xtask conf`: explain an allocator config string (not built yet).

use std::process::ExitCode;

/// Arguments of `cargo xtask conf`.
#[derive(clap::Args)]
pub(crate) struct Args {}

/// Runs `cargo xtask conf`.
pub(crate) fn run(_args: Args) -> ExitCode {
    ExitCode::SUCCESS
}
