//! Prints the replay benchmark's synthetic trace, for profiling a replay outside criterion:
//!
//! ```text
//! cargo run --release -p alloc-trace --example synthetic_trace -- 200000 > /tmp/big.trace
//! cargo build --release -p npu-alloc-cli
//! valgrind --tool=callgrind target/release/npu-alloc replay /tmp/big.trace
//! ```
//!
//! Arguments: operations (default 200,000), live-allocation cap (256), seed (42): the values
//! `cargo xtask bench` uses.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: u64| -> Result<u64, String> {
        args.get(i).map_or(Ok(default), |a| {
            a.parse().map_err(|e| format!("argument {a:?}: {e}"))
        })
    };
    let parsed = (|| Ok::<_, String>((arg(0, 200_000)?, arg(1, 256)?, arg(2, 42)?)))();
    match parsed {
        Ok((ops, max_live, seed)) => {
            print!(
                "{}",
                alloc_trace::workload::synthetic_trace(ops as usize, max_live as usize, seed)
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("synthetic_trace: {e}\nusage: synthetic_trace [OPS] [MAX_LIVE] [SEED]");
            ExitCode::from(2)
        }
    }
}
