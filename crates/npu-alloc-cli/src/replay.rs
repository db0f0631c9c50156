//! `npu-alloc replay`: replay a `.trace` through the policy on the simulated device and print what
//! happened (format: `docs/trace-format.md`); with `--check`, judge every operation and check every
//! invariant after it, as the stress engine does.

use crate::out::say;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use alloc_core::FormatSize;
use alloc_trace::{Checks, Report, Setup, StatsRecord, parse_size};
use serde_json::{Map, Value, json};

/// Arguments of `npu-alloc replay`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The trace file.
    file: PathBuf,
    /// Print one JSON object per `stats` line and a last one labelled "end".
    #[arg(long)]
    json: bool,
    /// Alloc-conf string; overrides the trace's `conf` directive.
    #[arg(long)]
    conf: Option<String>,
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
    /// the first failure is printed and the exit code is 1.
    #[arg(long)]
    check: bool,
    /// Test-only: break a check on purpose (see `stress --sabotage`).
    #[arg(long, hide = true, requires = "check")]
    sabotage: bool,
}

/// A size argument (`4096`, `2M`, `1.5GiB`), for clap.
pub(crate) fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Runs `npu-alloc replay`.
pub(crate) fn run(args: Args) -> ExitCode {
    let path = args.file;
    let trace = match alloc_trace::load(&path) {
        Ok(trace) => trace,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let conf_text = args.conf.as_deref().or(trace.conf.as_deref()).unwrap_or("");
    let parsed = alloc_conf::parse(conf_text);
    for w in &parsed.warnings {
        eprintln!("warning: alloc conf: {w}");
    }
    let mut setup = Setup::from_trace(&trace, parsed.conf, args.capacity, args.pad);
    if let Some(f) = args.flavour {
        setup.flavour = f;
    }
    let start = Instant::now();
    let result = if args.check {
        let checks = if args.sabotage {
            Checks::sabotaged()
        } else {
            Checks::default()
        };
        alloc_trace::replay_checked(&trace, &setup, checks)
    } else {
        alloc_trace::replay(&trace, &setup)
    };
    let report = match result {
        Ok(report) => report,
        Err(f) => {
            eprintln!(
                "{}:{}: {} (operation {})",
                path.display(),
                f.line,
                f.error,
                f.index
            );
            return ExitCode::FAILURE;
        }
    };
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
        for record in report.records.iter().chain([&report.end]) {
            say!("{}", record_json(record));
        }
    } else {
        print_summary(&path, conf_text, &report, seconds);
    }
    ExitCode::SUCCESS
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
            "pauses / resumes    {} / {} ({} resumes out of memory, {} allocations refused \
             while paused)",
            c.pauses,
            c.resumes,
            c.resume_ooms,
            c.paused_refusals
        );
    }
    say!("segments now        {}", s.segment.all.current);
    say!("device mallocs      {}", report.device_mallocs);
    say!("device frees        {}", report.device_frees);
    say!("OOMs                {}", s.num_ooms);
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
