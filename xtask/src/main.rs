//! `cargo xtask`: developer and CI commands for npu-alloc.
//!
//! One binary with a subcommand per job (matklad's xtask pattern); each job lives in its own module.
//! The user commands (`replay`, `conf`, `stress`, `import-snapshot`, `tune`) belong to the `npu-alloc` tool; here they are
//! aliases that forward their arguments to it, so `cargo xtask replay ...` works in a checkout.

mod bench;
mod cargo;
mod loom;
mod runtime_stress;
mod test_hw;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Developer and CI commands for npu-alloc.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The arguments of an alias, passed to `npu-alloc <subcommand>` unchanged (`--help` included).
#[derive(clap::Args)]
struct Forwarded {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

#[derive(Subcommand)]
enum Command {
    /// `npu-alloc replay`: replay a `.trace` file (or a PyTorch memory snapshot) through the
    /// policy on the simulated device.
    #[command(disable_help_flag = true)]
    Replay(Forwarded),
    /// `npu-alloc conf`: parse an allocator config string (or the environment) and explain it.
    #[command(disable_help_flag = true)]
    Conf(Forwarded),
    /// `npu-alloc stress`: random operations, faults and misuse, every invariant checked; with
    /// `--runtime` first, the threaded runtime over the fake libascendcl instead (see
    /// `cargo xtask stress --runtime --help`).
    #[command(disable_help_flag = true)]
    Stress(Forwarded),
    /// `npu-alloc import-snapshot`: convert a PyTorch memory snapshot into a `.trace`.
    #[command(disable_help_flag = true)]
    ImportSnapshot(Forwarded),
    /// `npu-alloc tune`: recommend the alloc-conf that fits a workload, from its trace or snapshot.
    #[command(disable_help_flag = true)]
    Tune(Forwarded),
    /// Run npu-runtime's loom models (`--cfg loom`, release, bounded preemptions).
    Loom(loom::Args),
    /// Run the criterion benches and print each case as a ratio to its baseline.
    Bench(bench::Args),
    /// Probe for Ascend hardware and run the hardware suite (exit 0 without hardware).
    TestHw(test_hw::Args),
}

/// `cargo xtask stress --runtime`'s own command line.
#[derive(Parser)]
struct RuntimeStress {
    #[command(flatten)]
    args: runtime_stress::Args,
}

/// Runs `npu-alloc <name> <args>`.
fn forward(name: &str, args: Forwarded) -> ExitCode {
    let argv = [OsString::from("npu-alloc"), OsString::from(name)];
    npu_alloc_cli::main_with(argv.into_iter().chain(args.args))
}

/// Runs `npu-alloc name args` from the release build, in the caller's directory: `tune` replays
/// a trace tens of thousands of times, fastest in the release build (xtask's own build is the
/// test profile: opt-level 1, debug assertions on).
fn forward_release(name: &str, args: Forwarded) -> ExitCode {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let manifest = cargo::workspace_root().join("Cargo.toml");
    let status = std::process::Command::new(cargo)
        .args([
            "run",
            "--release",
            "--quiet",
            "-p",
            "npu-alloc-cli",
            "--bin",
            "npu-alloc",
        ])
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--")
        .arg(name)
        .args(args.args)
        .status();
    match status {
        Ok(s) => ExitCode::from(s.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask: running cargo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli: Cli = match npu_alloc_cli::parse_args(std::env::args_os()) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match cli.command {
        Command::Replay(args) => forward("replay", args),
        Command::Conf(args) => forward("conf", args),
        Command::Stress(args) if args.args.first().is_some_and(|a| a == "--runtime") => {
            let argv = ["cargo xtask stress --runtime"].map(OsString::from);
            match npu_alloc_cli::parse_args::<RuntimeStress>(
                argv.into_iter().chain(args.args.into_iter().skip(1)),
            ) {
                Ok(cli) => runtime_stress::run(cli.args),
                Err(code) => code,
            }
        }
        Command::Stress(args) => forward("stress", args),
        Command::ImportSnapshot(args) => forward("import-snapshot", args),
        Command::Tune(args) => forward_release("tune", args),
        Command::Loom(args) => loom::run(args),
        Command::TestHw(args) => test_hw::run(args),
        Command::Bench(args) => bench::run(args),
    }
}
