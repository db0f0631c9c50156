//! `npu-alloc`: the command-line tool (see the library's documentation for the subcommands and
//! their exit codes).

use std::process::ExitCode;

fn main() -> ExitCode {
    npu_alloc_cli::main_with(std::env::args_os())
}
