//! `cargo xtask stress`: random allocator operations with device faults on the simulated device,
//! every invariant checked after every operation, for each configuration that changes the policy
//! (see `testkit::stress`). A failure prints the seed, the command that reproduces it, and the
//! shrunk operations as `.trace` text.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use alloc_core::FormatSize;
use testkit::stress::{self, StressParams, StressReport, VARIANTS};

use crate::replay::parse_size_arg;

/// Arguments of `cargo xtask stress`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Operations per configuration.
    #[arg(long, default_value_t = 100_000)]
    ops: u64,
    /// PRNG seed; by default one is drawn from the clock and printed.
    #[arg(long)]
    seed: Option<u64>,
    /// Run only this alloc-conf string; by default every variant that changes the policy.
    #[arg(long)]
    conf: Option<String>,
    /// Device capacity (bytes, or with a K/M/G suffix).
    #[arg(long, value_parser = parse_size_arg, default_value_t = stress::DEFAULT_CAPACITY)]
    capacity: u64,
    /// Bytes added to each request before rounding (32 torch_npu, 0 CUDA; at most 1 GiB).
    #[arg(long, value_parser = parse_pad, default_value_t = 32)]
    pad: u64,
    /// Probability that an operation injects a device fault (0 turns fault injection off).
    #[arg(long, default_value_t = stress::DEFAULT_FAULT_RATE, value_parser = parse_rate)]
    fault_rate: f64,
    /// Above this many live allocations the generator mostly frees.
    #[arg(long, default_value_t = stress::DEFAULT_MAX_LIVE)]
    max_live: usize,
    /// Seconds to spend shrinking a failure to a short operation sequence.
    #[arg(long, default_value_t = 60)]
    shrink_secs: u64,
}

/// A pad of at most 1 GiB: the checks expect only requests of 1 EiB or more to be refused, which
/// holds while the padded size stays below 2^63.
fn parse_pad(s: &str) -> Result<u64, String> {
    match parse_size_arg(s)? {
        pad if pad <= 1 << 30 => Ok(pad),
        _ => Err(format!("`{s}` is more than 1 GiB")),
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("`{s}` is not a probability in [0, 1]")),
    }
}

/// Runs `cargo xtask stress`.
pub(crate) fn run(args: Args) -> ExitCode {
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let configs: Vec<(String, String)> = match &args.conf {
        Some(conf) => vec![("--conf".into(), conf.clone())],
        None => VARIANTS
            .iter()
            .map(|(name, conf)| (name.to_string(), conf.to_string()))
            .collect(),
    };
    println!(
        "stress: seed {seed}, {} operations per configuration, capacity {}, pad {}, fault rate {}, \
         max live {}",
        args.ops,
        FormatSize(args.capacity),
        args.pad,
        args.fault_rate,
        args.max_live
    );
    let mut failed = false;
    for (name, conf) in configs {
        let parsed = alloc_conf::parse(&conf);
        for w in &parsed.warnings {
            eprintln!("warning: alloc conf {conf:?}: {w}");
        }
        if let Some(notice) = stress::unsupported(&parsed.conf) {
            println!("{name:<26} skipped: {notice}");
            continue;
        }
        let mut params = StressParams::new(seed, args.ops, &conf);
        params.capacity = args.capacity;
        params.pad = args.pad;
        params.fault_rate = args.fault_rate;
        params.max_live = args.max_live;
        let start = Instant::now();
        match stress::run(&params, Duration::from_secs(args.shrink_secs)) {
            Ok(report) => print_report(&name, &report, start.elapsed()),
            Err(failure) => {
                failed = true;
                println!(
                    "{name:<26} FAILED after {:.1} s (shrinking included)",
                    start.elapsed().as_secs_f64()
                );
                println!("{failure}");
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn print_report(name: &str, r: &StressReport, elapsed: Duration) {
    println!(
        "{name:<26} {} ops, {} allocs, {} OOMs, {} refused (>= 1 EiB), {} misuses, \
         {} faults ({} fired: {} device errors, {} absorbed), {} device mallocs, {} device frees, \
         {} drains, peak live {}, peak reserved {}, {:.2} s",
        r.ops,
        r.allocs,
        r.ooms,
        r.refused,
        r.misuses,
        r.faults_scheduled,
        r.faults_fired,
        r.device_errors,
        r.absorbed_faults,
        r.device_mallocs,
        r.device_frees,
        r.drains,
        r.peak_live,
        FormatSize(r.peak_reserved),
        elapsed.as_secs_f64()
    );
}
