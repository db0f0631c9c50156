//! `cargo xtask loom`: the loom models of `npu-runtime` (`tests/loom_*.rs`), built with
//! `--cfg loom` in release mode into `target/loom` (so the flag does not invalidate the normal
//! build), with a preemption bound that keeps the run within CI's budget.

use npu_alloc_cli::say;
use std::io::{BufRead, BufReader};
use std::process::{ExitCode, Stdio};
use std::time::Instant;

use crate::cargo::{cargo, workspace_root};

/// Arguments of `cargo xtask loom`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Thread preemptions loom explores per execution (`LOOM_MAX_PREEMPTIONS`).
    #[arg(long, default_value_t = 2)]
    preemptions: u32,
    /// Run only the models whose name contains this.
    filter: Option<String>,
}

/// The `N passed; M failed` counts of one `test result:` line.
fn counts(line: &str) -> Option<(u64, u64)> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let number_before = |word: &str| -> Option<u64> {
        let end = rest.find(word)?;
        rest[..end].trim_end().rsplit(' ').next()?.parse().ok()
    };
    Some((number_before(" passed")?, number_before(" failed")?))
}

/// Runs `cargo xtask loom`.
pub(crate) fn run(args: Args) -> ExitCode {
    let mut rustflags = std::env::var("RUSTFLAGS").unwrap_or_default();
    if !rustflags.split_whitespace().any(|f| f == "loom") {
        rustflags = format!("{rustflags} --cfg loom").trim().to_owned();
    }
    let mut cmd = cargo();
    cmd.env("RUSTFLAGS", &rustflags)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("LOOM_MAX_PREEMPTIONS", args.preemptions.to_string())
        .env(
            "CARGO_TARGET_DIR",
            workspace_root().join("target").join("loom"),
        )
        .args([
            "test",
            "-p",
            "npu-runtime",
            "--release",
            "--test",
            "loom_*",
            "--",
        ])
        .args(args.filter)
        .stdout(Stdio::piped());
    say!(
        "== loom: RUSTFLAGS={rustflags:?} LOOM_MAX_PREEMPTIONS={} cargo test -p npu-runtime --release --test 'loom_*'",
        args.preemptions
    );
    let start = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("loom: cannot run cargo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (mut passed, mut failed) = (0, 0);
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            say!("{line}");
            if let Some((p, f)) = counts(&line) {
                passed += p;
                failed += f;
            }
        }
    }
    let status = match child.wait() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("loom: waiting for cargo failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let secs = start.elapsed().as_secs_f64();
    say!(
        "loom: {} models ran ({passed} passed, {failed} failed), preemption bound {}, {secs:.1}s",
        passed + failed,
        args.preemptions
    );
    if status.success() && failed == 0 && passed > 0 {
        ExitCode::SUCCESS
    } else {
        if passed == 0 && failed == 0 {
            eprintln!("loom: no model ran");
        }
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::counts;

    #[test]
    fn reads_test_result_lines() {
        assert_eq!(
            counts(
                "test result: ok. 6 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.99s"
            ),
            Some((6, 0))
        );
        assert_eq!(
            counts("test result: FAILED. 2 passed; 1 failed; 0 ignored"),
            Some((2, 1))
        );
        assert_eq!(counts("running 6 tests"), None);
    }
}
