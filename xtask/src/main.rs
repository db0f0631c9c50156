//! `cargo xtask`: developer and CI commands for npu-alloc.
//!
//! One binary with a subcommand per job (matklad's xtask pattern); each job lives in its own module.

mod bench;
mod cargo;
mod conf;
mod loom;
mod replay;
mod stress;
mod test_hw;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Developer and CI commands for npu-alloc.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a `.trace` file through the policy core on the simulated device.
    Replay(replay::Args),
    /// Parse an allocator config string (or the environment) and explain the result.
    Conf(conf::Args),
    /// Run npu-runtime's loom models (`--cfg loom`, release, bounded preemptions).
    Loom(loom::Args),
    /// Run the criterion benches and print each case as a ratio to its baseline.
    Bench(bench::Args),
    /// Probe for Ascend hardware and run the hardware suite (exit 0 without hardware).
    TestHw(test_hw::Args),
    /// Random operations with device faults on the simulated device, checked after every one.
    Stress(stress::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with success; malformed command lines exit 2.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Replay(args) => replay::run(args),
        Command::Conf(args) => conf::run(args),
        Command::Loom(args) => loom::run(args),
        Command::TestHw(args) => test_hw::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Stress(args) => stress::run(args),
    }
}
