//! `npu-alloc`, the command-line tool ML engineers run on their own traces and configurations:
//!
//! - `npu-alloc replay FILE`: replay a `.trace` through the exact policy on the simulated device
//!   (`--check`: with every check of the stress engine after every operation);
//! - `npu-alloc conf [STRING]`: parse an alloc-conf string (or the environment) and explain it;
//! - `npu-alloc stress`: random operations, faults and misuse, every invariant checked;
//! - `npu-alloc import-snapshot SNAPSHOT -o OUT.trace`: a PyTorch memory snapshot as a trace;
//! - `npu-alloc tune INPUT`: the alloc-conf that fits a workload, found by replaying it.
//!
//! Exit codes: 0 success; 1 the command ran and found a problem (a malformed trace, a replay
//! that stopped, a failed check or stress run, a warning under `conf --strict`); 2 a malformed
//! command line (or a `conf` STRING that is not UTF-8).
//!
//! Every subcommand is also `cargo xtask <subcommand>` in a checkout: xtask forwards to
//! [`main_with`].
#![warn(unreachable_pub)]

mod conf;
mod import;
mod out;
mod plot;
mod replay;
mod stress;
mod tune;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The exit codes, shown under every `--help`.
const EXIT_CODES: &str = "Exit codes: 0 success; 1 the command ran and found a problem (a \
malformed trace, a replay that stopped, a failed check or stress run, a warning under \
`conf --strict`); 2 a malformed command line.";

/// npu-alloc: PyTorch's caching allocator for Ascend NPUs, on the command line.
#[derive(Parser)]
#[command(name = "npu-alloc", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a `.trace` file (or a PyTorch memory snapshot) through the policy on the simulated
    /// device.
    #[command(after_help = EXIT_CODES)]
    Replay(replay::Args),
    /// Parse an allocator config string (or the environment) and explain the result.
    #[command(after_help = EXIT_CODES)]
    Conf(conf::Args),
    /// Random operations with device faults and misuse, every invariant checked after each.
    #[command(after_help = EXIT_CODES)]
    Stress(stress::Args),
    /// Convert a PyTorch memory snapshot (pickle) into a `.trace` that `replay` runs.
    #[command(after_help = EXIT_CODES)]
    ImportSnapshot(import::Args),
    /// Recommend the alloc-conf that fits a workload, by replaying its trace or snapshot.
    #[command(after_help = EXIT_CODES)]
    Tune(tune::Args),
}

/// Writes one line to stdout, ending the program quietly (exit code 0) when the reader went
/// away, as every command does (for `cargo xtask`'s own commands).
pub use out::line as print_line;

/// The subcommands, by name (for `cargo xtask`'s aliases).
pub const SUBCOMMANDS: [&str; 5] = ["replay", "conf", "stress", "import-snapshot", "tune"];

/// Parses a command line into `P`, or prints why not and returns the exit code: help and
/// version go to stdout with success, a malformed command line exits 2. (xtask parses its own
/// command line the same way.)
pub fn parse_args<P: Parser>(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
) -> Result<P, ExitCode> {
    P::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// Runs the tool with `args` (the first one is the program name) and returns its exit code.
pub fn main_with(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> ExitCode {
    let cli: Cli = match parse_args(args) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match cli.command {
        Command::Replay(args) => replay::run(args),
        Command::Conf(args) => conf::run(args),
        Command::Stress(args) => stress::run(args),
        Command::ImportSnapshot(args) => import::run(args),
        Command::Tune(args) => tune::run(args),
    }
}
