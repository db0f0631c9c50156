//! `cargo xtask replay`: replay a trace (not built yet).

use std::process::ExitCode;

/// Arguments of `cargo xtask replay`.
#[derive(clap::Args)]
pub(crate) struct Args {}

/// Runs `cargo xtask replay`.
pub(crate) fn run(_args: Args) -> ExitCode {
    ExitCode::SUCCESS
}
