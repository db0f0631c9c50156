//! `npu-alloc tune`: the alloc-conf that fits a workload, from its trace or PyTorch snapshot,
//! found by replaying it under candidate configurations (`alloc-tune`).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use alloc_core::FormatSize;
use alloc_trace::{Observe, Setup};
use alloc_tune::{DEFAULT_EVALS, Eval, Key, Options, Outcome, Target};
use serde_json::json;

use crate::plot;
use crate::replay::parse_size_arg;
use crate::say;

/// Arguments of `npu-alloc tune`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// A `.trace` file, or a PyTorch memory snapshot (pickle), imported on the fly.
    input: PathBuf,
    /// Device capacity (bytes, or with a K/M/G suffix), at least 2 MiB; default: the trace's
    /// own.
    #[arg(long, value_parser = parse_capacity)]
    capacity: Option<u64>,
    /// Bytes added to each request before rounding (32 torch_npu, 0 CUDA); default: the trace's.
    #[arg(long, value_parser = parse_size_arg)]
    pad: Option<u64>,
    /// The keys to search, comma-separated (default: all of them).
    #[arg(long, value_delimiter = ',', value_parser = parse_key)]
    keys: Option<Vec<Key>>,
    /// The most configurations to replay, the defaults included (the search is bounded by this,
    /// never by time); at least 1.
    #[arg(long, default_value_t = DEFAULT_EVALS, value_parser = parse_evals)]
    evals: usize,
    /// Whose allocator to recommend for: npu-alloc, or torch_npu (only what it treats alike).
    #[arg(long, default_value = "npu-alloc", value_parser = parse_target)]
    target: Target,
    /// Stop after this many seconds (more than 0); the answer then depends on the machine's
    /// speed.
    #[arg(long, value_parser = parse_seconds)]
    max_seconds: Option<f64>,
    /// Worker threads, 1 to 1024 (default: one per core); the answer is the same for any number.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=MAX_THREADS as i64))]
    threads: Option<u16>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// Overlay the memory curves of the default and of the recommendation in this SVG file.
    #[arg(long, value_name = "OUT.svg")]
    plot: Option<PathBuf>,
}

fn parse_key(s: &str) -> Result<Key, String> {
    Key::from_name(s.trim()).ok_or_else(|| {
        let names: Vec<&str> = Key::ALL.iter().map(|k| k.name()).collect();
        format!("`{s}` is not a key tune searches: {}", names.join(", "))
    })
}

/// The most worker threads `--threads` takes: far beyond any host's cores, and few enough that
/// starting them takes no time.
const MAX_THREADS: u16 = 1024;

/// A capacity below one small segment (2 MiB) holds no allocation at all.
fn parse_capacity(s: &str) -> Result<u64, String> {
    match parse_size_arg(s)? {
        c if c < 2 << 20 => Err("at least 2 MiB (one small segment)".into()),
        c => Ok(c),
    }
}

fn parse_evals(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("at least 1 (the defaults are always replayed)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 => Ok(t),
        Ok(_) => Err("a finite number of seconds above 0".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_target(s: &str) -> Result<Target, String> {
    match s {
        "npu-alloc" => Ok(Target::NpuAlloc),
        "torch_npu" => Ok(Target::TorchNpu),
        _ => Err(format!("`{s}` is not a target: npu-alloc or torch_npu")),
    }
}

/// How a configuration is shown: `(defaults)` for the empty string.
fn shown(conf: &str) -> &str {
    if conf.is_empty() { "(defaults)" } else { conf }
}

/// Runs `npu-alloc tune`.
pub(crate) fn run(args: Args) -> ExitCode {
    let Some(trace) = crate::import::load_trace(&args.input) else {
        return ExitCode::FAILURE;
    };
    if !trace
        .ops
        .iter()
        .any(|op| matches!(op.kind, alloc_trace::OpKind::Alloc { size: 1.., .. }))
    {
        eprintln!(
            "error: {}: no allocation to replay: nothing to tune",
            args.input.display()
        );
        return ExitCode::FAILURE;
    }
    if let Some(keys) = &args.keys {
        for (key, why) in alloc_tune::inert_keys(keys, args.target) {
            eprintln!("note: {} keeps its default: {why}", key.name());
        }
    }
    let bar = (!args.json && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(args.evals as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "tuning {bar:40} {pos} configurations replayed (at most {len}), {elapsed}",
            )
            .expect("a valid template"),
        );
        bar
    });
    let progress = |done: usize, _budget: usize| {
        if let Some(bar) = &bar {
            bar.set_position(done as u64);
        }
    };
    let options = Options {
        capacity: args.capacity,
        pad: args.pad,
        keys: args.keys.clone().unwrap_or_else(|| Key::ALL.to_vec()),
        evals: args.evals,
        target: args.target,
        max_seconds: args.max_seconds,
        progress: Some(&progress),
    };
    let start = std::time::Instant::now();
    let pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads.map_or(0, usize::from))
        .build()
    {
        Ok(pool) => pool,
        Err(e) => {
            eprintln!("error: cannot start the worker threads: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = pool.install(|| alloc_tune::tune(&trace, &options));
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    if args.json {
        say!("{}", to_json(&outcome, seconds, pool.current_num_threads()));
    } else {
        print_table(&args, &outcome, seconds, pool.current_num_threads());
    }
    if let Some(out) = &args.plot {
        if let Err(e) = draw(&trace, &options, &outcome, out) {
            eprintln!("error: --plot {}: {e}", out.display());
            return ExitCode::FAILURE;
        }
        eprintln!("wrote {}", out.display());
    }
    ExitCode::SUCCESS
}

fn row(e: &Eval) -> String {
    format!(
        "{:>12} {:>10.3} {:>5} {:>8} {:>6}  {}",
        FormatSize(e.peak_reserved).to_string(),
        e.reserved_per_requested(),
        e.ooms,
        e.device_mallocs,
        e.device_frees,
        shown(&e.conf)
    )
}

fn print_table(args: &Args, o: &Outcome, seconds: f64, threads: usize) {
    say!(
        "input       {} (capacity {}, pad {} bytes)",
        args.input.display(),
        FormatSize(o.capacity),
        o.pad
    );
    say!(
        "searched    {} configuration{} in {seconds:.1} s on {threads} thread{} (target {})",
        o.evals,
        crate::out::plural(o.evals as u64),
        crate::out::plural(threads as u64),
        match args.target {
            Target::NpuAlloc => "npu-alloc",
            Target::TorchNpu => "torch_npu",
        }
    );
    if o.stopped_early {
        say!("            stopped by --max-seconds: another machine may give another answer");
    } else if o.budget_spent {
        say!("            stopped at --evals: a larger budget may find a better one");
    }
    say!();
    // The header in the rows' widths (`row`), behind the 8 columns of "default " and "#1 ".
    say!(
        "{:8}{:>12} {:>10} {:>5} {:>8} {:>6}  configuration",
        "",
        "peak resv",
        "resv/req",
        "OOMs",
        "mallocs",
        "frees"
    );
    say!("default {}", row(&o.default));
    for (i, e) in o.ranked.iter().take(5).enumerate() {
        say!("#{:<6} {}", i + 1, row(e));
    }
    say!();
    let best = o.best();
    if !best.fits() {
        say!(
            "no configuration fits in {}: the fewest out-of-memory errors ({}) come with {}",
            FormatSize(o.capacity),
            best.ooms,
            shown(&best.conf)
        );
        return;
    }
    if !o.default.fits() {
        say!(
            "the defaults run out of memory {} times in {}; {} fits",
            o.default.ooms,
            FormatSize(o.capacity),
            shown(&best.conf)
        );
    }
    if best.conf.is_empty() {
        say!("the defaults are best; nothing to set:");
        say!("unset PYTORCH_NPU_ALLOC_CONF");
    } else {
        if o.default.fits() && best.peak_reserved == o.default.peak_reserved {
            // Ranked above the defaults by its device calls alone.
            say!(
                "peak reserved {}, as with the defaults, with {} device mallocs and frees instead of {}",
                FormatSize(best.peak_reserved),
                best.device_mallocs + best.device_frees,
                o.default.device_mallocs + o.default.device_frees
            );
        } else if o.default.fits() {
            say!(
                "peak reserved {} instead of {} ({:.1}% less)",
                FormatSize(best.peak_reserved),
                FormatSize(o.default.peak_reserved),
                100.0 * (1.0 - best.peak_reserved as f64 / o.default.peak_reserved.max(1) as f64)
            );
        }
        // Quoted: a roundup list's `>` is a redirection to the shell.
        say!("export PYTORCH_NPU_ALLOC_CONF='{}'", best.conf);
        match args.target {
            Target::NpuAlloc => say!(
                "(for npu-alloc as the allocator; for torch_npu's own, tune with --target torch_npu)"
            ),
            Target::TorchNpu => {
                for (key, releases) in alloc_tune::recent_keys(&best.conf) {
                    say!(
                        "note: torch_npu accepts {key} in {releases}; older releases refuse the \
                         string at the first allocation"
                    );
                }
            }
        }
    }
}

fn eval_json(e: &Eval) -> serde_json::Value {
    json!({
        "conf": e.conf,
        "peak_reserved": e.peak_reserved,
        "peak_requested": e.peak_requested,
        "reserved_per_requested": e.reserved_per_requested(),
        "ooms": e.ooms,
        "device_mallocs": e.device_mallocs,
        "device_frees": e.device_frees,
        "fits": e.fits(),
    })
}

fn to_json(o: &Outcome, seconds: f64, threads: usize) -> serde_json::Value {
    let best = o.best();
    json!({
        "capacity": o.capacity,
        "pad": o.pad,
        "evals": o.evals,
        "seconds": seconds,
        "threads": threads,
        "stopped_early": o.stopped_early,
        "budget_spent": o.budget_spent,
        "default": eval_json(&o.default),
        "best": eval_json(best),
        "top": o.ranked.iter().take(5).map(eval_json).collect::<Vec<_>>(),
        // Null when nothing fits, and when the defaults are best: the variable is then unset,
        // not set empty (torch_npu counts an empty variable as set).
        "export": (best.fits() && !best.conf.is_empty())
            .then(|| format!("PYTORCH_NPU_ALLOC_CONF={}", best.conf)),
    })
}

fn draw(
    trace: &alloc_trace::Trace,
    options: &Options<'_>,
    o: &Outcome,
    out: &std::path::Path,
) -> Result<(), String> {
    let observe = Observe {
        series: true,
        ..Observe::default()
    };
    let mut runs = Vec::new();
    for conf in [&o.default.conf, &o.best().conf] {
        let setup = Setup::from_trace(
            trace,
            alloc_conf::parse(conf).conf,
            options.capacity,
            options.pad,
        );
        let (_, observed) = alloc_trace::replay_observed(trace, &setup, None, &observe)
            .map_err(|f| f.error.to_string())?;
        runs.push((conf.clone(), observed.series));
    }
    let curves: Vec<plot::Curves<'_>> = runs
        .iter()
        .map(|(conf, points)| plot::Curves {
            label: shown(conf),
            points,
        })
        .collect();
    let name = trace.file.rsplit('/').next().unwrap_or(&trace.file);
    plot::draw(out, &format!("{name}: defaults vs recommendation"), &curves)
        .map_err(|e| e.to_string())
}
