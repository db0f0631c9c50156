//! `npu-alloc stress`: random allocator operations with device faults and misuse on the simulated
//! device, every invariant checked after every operation, for each configuration that changes the
//! policy (see `alloc_trace::stress`). A failure prints the seed, the command that reproduces it,
//! and the shrunk operations as `.trace` text that `npu-alloc replay --check` re-runs.

use crate::say;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use alloc_core::{Flavour, FormatSize};
use alloc_trace::Report;
use alloc_trace::flavour_name;
use alloc_trace::stress::{self, StressParams, VARIANTS};

use crate::replay::parse_size_arg;

/// Arguments of `npu-alloc stress`.
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
    /// Whose retry chain the allocator follows: torch_npu (a device error runs the whole chain)
    /// or cuda (it is returned at once).
    #[arg(long, value_parser = parse_flavour, default_value = "torch_npu")]
    flavour: Flavour,
    /// Probability that an operation injects a device fault (0 turns fault injection off).
    #[arg(long, default_value_t = stress::DEFAULT_FAULT_RATE, value_parser = parse_rate)]
    fault_rate: f64,
    /// Above this many live allocations the generator mostly frees.
    #[arg(long, default_value_t = stress::DEFAULT_MAX_LIVE)]
    max_live: usize,
    /// Seconds to spend shrinking a failure to a short operation sequence.
    #[arg(long, default_value_t = 60)]
    shrink_secs: u64,
    /// Test-only: break a check on purpose (the first successful free after a fault fired and a
    /// misuse was refused fails), to prove a failure reproduces from its printed trace.
    #[arg(long, hide = true)]
    sabotage: bool,
}

/// A pad of at most 1 GiB: the checks expect only requests of 1 EiB or more to be refused, which
/// holds while the padded size stays below 2^63.
fn parse_pad(s: &str) -> Result<u64, String> {
    match parse_size_arg(s)? {
        pad if pad <= 1 << 30 => Ok(pad),
        _ => Err(format!("`{s}` is more than 1 GiB")),
    }
}

/// `torch_npu` or `cuda`, as the trace's `flavour` directive.
pub(crate) fn parse_flavour(s: &str) -> Result<Flavour, String> {
    [Flavour::TorchNpu, Flavour::Cuda]
        .into_iter()
        .find(|&f| flavour_name(f) == s)
        .ok_or_else(|| format!("`{s}` is not a flavour: torch_npu or cuda"))
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("`{s}` is not a probability in [0, 1]")),
    }
}

/// Runs `npu-alloc stress`.
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
    say!(
        "stress: seed {seed}, {} operations per configuration, capacity {}, pad {}, flavour {}, \
         fault rate {}, max live {}",
        args.ops,
        FormatSize(args.capacity),
        args.pad,
        flavour_name(args.flavour),
        args.fault_rate,
        args.max_live
    );
    let mut failed = false;
    let width = configs
        .iter()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(0);
    for (name, conf) in configs {
        let parsed = alloc_conf::parse(&conf);
        for w in &parsed.warnings {
            eprintln!("warning: alloc conf {conf:?}: {w}");
        }
        let mut params = StressParams::new(seed, args.ops, &conf);
        params.capacity = args.capacity;
        params.pad = args.pad;
        params.flavour = args.flavour;
        params.fault_rate = args.fault_rate;
        params.max_live = args.max_live;
        params.sabotage = args.sabotage;
        let start = Instant::now();
        match stress::run(&params, Duration::from_secs(args.shrink_secs)) {
            Ok(report) => print_report(&name, width, &report, start.elapsed()),
            Err(failure) => {
                failed = true;
                say!(
                    "{name:<26} FAILED after {:.1} s (shrinking included)",
                    start.elapsed().as_secs_f64()
                );
                say!("{failure}");
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn print_report(name: &str, width: usize, r: &Report, elapsed: Duration) {
    let c = &r.counts;
    say!(
        "{name:<width$} {} ops, {} allocs, {} OOMs, {}{} refused (>= 1 EiB), {} misuses, \
         {} faults ({} fired: {} device errors, {} absorbed), {} device mallocs, {} device frees, \
         {} pauses ({} out of host memory), {} resumes ({} out of memory), \
         {} allocations refused while paused, {} out of memory for the margin, \
         {} drains, peak reserved {}, {:.2} s",
        c.ops,
        c.allocs,
        c.ooms,
        if c.rejections > 0 {
            format!("{} rejected (throw_on_npumalloc_oom), ", c.rejections)
        } else {
            String::new()
        },
        c.refused,
        c.misuses,
        c.faults_scheduled,
        c.faults_fired,
        c.device_errors,
        c.absorbed_faults,
        r.device_mallocs,
        r.device_frees,
        c.pauses,
        c.pause_ooms,
        c.resumes,
        c.resume_ooms,
        c.paused_refusals,
        c.margin_ooms,
        c.drains,
        FormatSize(r.device_peak_bytes),
        elapsed.as_secs_f64()
    );
}
