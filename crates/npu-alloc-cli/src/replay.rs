//! `npu-alloc replay`: replay a `.trace` through the policy on the simulated device and print what
//! happened (format: `docs/trace-format.md`); with `--check`, judge every operation and check every
//! invariant after it, as the stress engine does. `--plot` draws the memory curves (one set per
//! `--conf`), `--snapshot` writes the end state and history as a PyTorch memory snapshot.

use crate::plot;
use crate::say;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use alloc_core::FormatSize;
use alloc_trace::{Checks, Observe, Observed, Report, Setup, StatsRecord, Trace, parse_size};
use serde_json::{Map, Value, json};

/// History entries `--snapshot` keeps by default: torch's `_record_memory_history` default.
const DEFAULT_HISTORY: usize = 100_000;

/// Traces with at least this many operations show progress on a terminal.
const PROGRESS_FROM: usize = 200_000;
/// The same with `--check`, which spends up to about a thousand blocks' worth of checking on
/// each operation.
const PROGRESS_FROM_CHECKED: usize = 10_000;

/// Arguments of `npu-alloc replay`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The trace file, or a PyTorch memory snapshot (pickle), imported as `import-snapshot` does.
    file: PathBuf,
    /// Print one JSON object per `stats` line and a last one labelled "end".
    #[arg(long)]
    json: bool,
    /// Alloc-conf string; overrides the trace's `conf` directive. Repeat it to replay the trace
    /// once per config (summaries one after the other, curves overlaid by `--plot`).
    #[arg(long = "conf", value_name = "CONF")]
    confs: Vec<String>,
    /// Device capacity (bytes, or with a K/M/G suffix); overrides the trace's `capacity`.
    #[arg(long, value_parser = parse_size_arg)]
    capacity: Option<u64>,
    /// Bytes added to each request before rounding (32 torch_npu, 0 CUDA); overrides `pad`.
    #[arg(long, value_parser = parse_size_arg)]
    pad: Option<u64>,
    /// Whose retry chain to follow (torch_npu or cuda); overrides the trace's `flavour`.
    #[arg(long, value_parser = crate::stress::parse_flavour)]
    flavour: Option<alloc_core::Flavour>,
    /// Judge every operation's result and check every invariant after it (what `stress` does);
    /// the first failure is printed and the exit code is 1. Above 1,024 live allocations the
    /// snapshot of every block is compared with the replay's own view every ⌈live / 1,024⌉
    /// operations and after the last, so that the run stays linear in the trace's length.
    #[arg(long)]
    check: bool,
    /// Test-only: break a check on purpose (see `stress --sabotage`).
    #[arg(long, hide = true, requires = "check")]
    sabotage: bool,
    /// Draw allocated, reserved and active bytes over the operations into this SVG file.
    #[arg(long, value_name = "OUT.svg")]
    plot: Option<PathBuf>,
    /// Write the end state and the history of the replay as a PyTorch memory snapshot (a pickle
    /// that PyTorch's memory_viz reads); the time of each entry is its operation's index.
    #[arg(long, value_name = "OUT.pickle")]
    snapshot: Option<PathBuf>,
    /// The history entries `--snapshot` keeps (torch's `max_entries`, at least 1 as in torch;
    /// the oldest are dropped).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_HISTORY, requires = "snapshot")]
    history_entries: usize,
}

/// A size argument (`4096`, `2M`, `1.5GiB`), for clap.
pub(crate) fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Runs `npu-alloc replay`.
pub(crate) fn run(args: Args) -> ExitCode {
    if args.snapshot.is_some() && args.confs.len() > 1 {
        eprintln!("error: --snapshot writes one replay's state: give at most one --conf with it");
        return ExitCode::from(2);
    }
    let path = args.file.clone();
    // A PyTorch snapshot is imported on the fly, as `tune` does.
    let Some(trace) = crate::import::load_trace(&path) else {
        return ExitCode::FAILURE;
    };
    let confs: Vec<&str> = if args.confs.is_empty() {
        vec![trace.conf.as_deref().unwrap_or("")]
    } else {
        args.confs.iter().map(String::as_str).collect()
    };
    let from = if args.check {
        PROGRESS_FROM_CHECKED
    } else {
        PROGRESS_FROM
    };
    let progress = Progress::new(trace.ops.len(), confs.len(), from);
    let mut runs = Vec::with_capacity(confs.len());
    for (i, &conf) in confs.iter().enumerate() {
        if i > 0 && !args.json {
            say!();
        }
        match replay_one(&args, &trace, conf, &progress) {
            Ok(observed) => runs.push((conf, observed)),
            Err(code) => return code,
        }
    }
    progress.finish();
    if let Some(out) = &args.plot {
        let curves: Vec<plot::Curves<'_>> = runs
            .iter()
            .map(|(conf, observed)| plot::Curves {
                label: conf_label(conf),
                points: &observed.series,
            })
            .collect();
        let title = plot_title(&path, &confs);
        if let Err(e) = plot::draw(out, &title, &curves) {
            eprintln!("error: --plot {}: {e}", out.display());
            return ExitCode::FAILURE;
        }
        eprintln!("wrote {}", out.display());
    }
    if let (Some(out), Some((_, observed))) = (&args.snapshot, runs.first()) {
        let Some(end) = &observed.end else {
            unreachable!("history is recorded whenever --snapshot is given")
        };
        let mut snapshot = alloc_snapshot::Snapshot::new(Some(&end.conf));
        let written = match snapshot.add_device(0, &end.segments, &end.history) {
            Ok(()) => snapshot.write(out).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = written {
            eprintln!("error: --snapshot {}: {e}", out.display());
            return ExitCode::FAILURE;
        }
        if end.dropped > 0 {
            eprintln!(
                "note: the history kept the last {} entries and dropped {} older ones \
                 (--history-entries)",
                end.history.len(),
                end.dropped
            );
        }
        eprintln!("wrote {}", out.display());
    }
    ExitCode::SUCCESS
}

/// Replays `trace` under one config and prints its summary (or JSON records).
fn replay_one(
    args: &Args,
    trace: &Trace,
    conf_text: &str,
    progress: &Progress,
) -> Result<Observed, ExitCode> {
    let path = &args.file;
    let parsed = alloc_conf::parse(conf_text);
    for w in &parsed.warnings {
        eprintln!("warning: alloc conf: {w}");
    }
    let mut setup = Setup::from_trace(trace, parsed.conf, args.capacity, args.pad);
    if let Some(f) = args.flavour {
        setup.flavour = f;
    }
    let checks = args.check.then(|| {
        if args.sabotage {
            Checks::sabotaged()
        } else {
            Checks::default()
        }
    });
    let tick = |done: u64| progress.tick(done);
    // Each `stats` record is printed as it is taken (`--json`) or dropped (the summary prints
    // only the end): none is kept for the whole run.
    let print_record = |record: StatsRecord| {
        if args.json {
            progress.suspend(|| print_record_json(&record, args, conf_text));
        }
    };
    let observe = Observe {
        series: args.plot.is_some(),
        history: args.snapshot.is_some().then_some(args.history_entries),
        progress: progress.enabled().then_some(&tick as &dyn Fn(u64)),
        stats: Some(&print_record),
    };
    let start = Instant::now();
    let (report, observed) = match alloc_trace::replay_observed(trace, &setup, checks, &observe) {
        Ok(done) => done,
        Err(f) => {
            progress.finish();
            eprintln!(
                "{}:{}: {} (operation {})",
                path.display(),
                f.line,
                f.error,
                f.index
            );
            return Err(ExitCode::FAILURE);
        }
    };
    progress.run_done(trace.ops.len());
    let seconds = start.elapsed().as_secs_f64();
    for notice in &report.notices {
        eprintln!("note: {notice}");
    }
    for (line, w) in &report.settings_warnings {
        eprintln!(
            "warning: {}:{line}: set_allocator_settings: {w}",
            path.display()
        );
    }
    if args.json {
        print_record_json(&report.end, args, conf_text);
    } else {
        print_summary(path, conf_text, &report, seconds);
    }
    Ok(observed)
}

/// How a config is named in a legend.
fn conf_label(conf: &str) -> &str {
    if conf.is_empty() { "(defaults)" } else { conf }
}

/// The plot's title: the trace's file name and its config(s).
fn plot_title(path: &Path, confs: &[&str]) -> String {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    match confs {
        [one] => format!("{name}: {}", conf_label(one)),
        _ => format!("{name}: {} configs", confs.len()),
    }
}

/// A progress bar on stderr for long replays, when stderr is a terminal; silent otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    /// Operations of the runs already finished.
    base: std::cell::Cell<u64>,
}

impl Progress {
    /// A bar for `runs` replays of `ops` operations each, if `ops` reaches `from`.
    fn new(ops: usize, runs: usize, from: usize) -> Progress {
        let bar = (ops >= from && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new((ops * runs) as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "replaying {bar:40} {human_pos}/{human_len} operations, {eta} left",
                )
                .expect("a valid template"),
            );
            bar
        });
        Progress {
            bar,
            base: std::cell::Cell::new(0),
        }
    }

    fn enabled(&self) -> bool {
        self.bar.is_some()
    }

    fn tick(&self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(self.base.get() + done);
        }
    }

    /// One run (of `ops` operations) is over.
    fn run_done(&self, ops: usize) {
        self.base.set(self.base.get() + ops as u64);
        self.tick(0);
    }

    /// Runs `f` (which prints) with the bar cleared, so the two do not mix on one terminal.
    fn suspend(&self, f: impl FnOnce()) {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Prints one record as a line of JSON, with its config when several are replayed.
fn print_record_json(record: &StatsRecord, args: &Args, conf_text: &str) {
    let mut value = record_json(record);
    if args.confs.len() > 1 {
        value["conf"] = json!(conf_text);
    }
    say!("{value}");
}

/// One stats record as torch's flat `memory_stats()` keys plus `label` and `line`.
fn record_json(record: &StatsRecord) -> Value {
    let mut map = Map::new();
    map.insert("label".into(), json!(record.label));
    map.insert("line".into(), json!(record.line));
    for (key, value) in record.stats.flat() {
        map.insert(key, json!(value));
    }
    Value::Object(map)
}

fn print_summary(path: &Path, conf: &str, report: &Report, seconds: f64) {
    let s = &report.end.stats;
    let setup = &report.setup;
    let peak_alloc = s.allocated_bytes.all.peak as u64;
    let peak_reserved = s.reserved_bytes.all.peak as u64;
    let peak_requested = s.requested_bytes.all.peak as u64;
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let c = &report.counts;
    say!("trace               {}", path.display());
    say!(
        "config              {}",
        if conf.is_empty() { "(defaults)" } else { conf }
    );
    say!(
        "device              capacity {}, pad {} bytes",
        FormatSize(setup.capacity),
        setup.pad
    );
    say!(
        "operations          {} ({} alloc, {} free)",
        c.ops,
        c.allocs,
        c.frees
    );
    say!("peak requested      {}", FormatSize(peak_requested));
    say!("peak allocated      {}", FormatSize(peak_alloc));
    say!(
        "peak reserved       {} ({} bytes)",
        FormatSize(peak_reserved),
        peak_reserved
    );
    say!(
        "reserved/allocated  {:.3}",
        ratio(peak_reserved, peak_alloc)
    );
    say!(
        "reserved/requested  {:.3}",
        ratio(peak_reserved, peak_requested)
    );
    if !report.saver.tags.is_empty() {
        let saver = &report.saver;
        say!(
            "peak held           {} ({} bytes): physical memory with the memory saver's pauses",
            FormatSize(saver.held_bytes.peak as u64),
            saver.held_bytes.peak
        );
        say!(
            "peak without pauses {} ({} bytes): peak reserved, as if nothing were paused",
            FormatSize(s.reserved_bytes.all.peak as u64),
            s.reserved_bytes.all.peak
        );
        say!(
            "peak paused         {} ({} bytes)",
            FormatSize(saver.paused_bytes.peak as u64),
            saver.paused_bytes.peak
        );
        let c = &report.counts;
        say!(
            "pauses / resumes    {} / {} ({} pause{} out of host memory, {} resume{} out of \
             memory, {} allocation{} refused while paused)",
            c.pauses,
            c.resumes,
            c.pause_ooms,
            crate::out::plural(c.pause_ooms),
            c.resume_ooms,
            crate::out::plural(c.resume_ooms),
            c.paused_refusals,
            crate::out::plural(c.paused_refusals),
        );
    }
    say!("segments now        {}", s.segment.all.current);
    say!("device mallocs      {}", report.device_mallocs);
    say!("device frees        {}", report.device_frees);
    say!("OOMs                {}", s.num_ooms);
    if s.num_oom_rejections > 0 {
        say!(
            "OOM rejections      {} (throw_on_npumalloc_oom)",
            s.num_oom_rejections
        );
    }
    say!("alloc retries       {}", s.num_alloc_retries);
    if c.refused + c.skipped > 0 {
        say!("refused (≥1 EiB)    {}", c.refused);
        say!("skipped free/record {}", c.skipped);
    }
    let build = if cfg!(debug_assertions) {
        " (debug build: `cargo run --release -p npu-alloc-cli -- replay ...` or `cargo xtask bench` for speed)"
    } else {
        ""
    };
    say!(
        "ops per second      {:.0}{build}",
        c.ops as f64 / seconds.max(1e-9)
    );
    say!("(peaks are since the trace's last reset_peak, as torch reports them)");
}
