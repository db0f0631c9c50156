//! `npu-alloc import-snapshot`: a PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`,
//! torch_npu's or npu-alloc's own) as a `.trace` that `replay` runs. The pickle is read by
//! npu-alloc's own reader, which accepts plain data only and runs nothing in the file.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use alloc_trace::{ImportOptions, import_snapshot};

use crate::replay::parse_size_arg;

/// Histories with at least this many entries show progress on a terminal.
const PROGRESS_FROM: usize = 200_000;

/// Arguments of `npu-alloc import-snapshot`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The snapshot (a pickle written by `torch.cuda.memory._dump_snapshot` or `replay
    /// --snapshot`).
    snapshot: PathBuf,
    /// Where to write the trace.
    #[arg(short, long, value_name = "OUT.trace")]
    output: PathBuf,
    /// The device whose history to import (default: the one with the longest history).
    #[arg(long)]
    device: Option<i64>,
    /// The device capacity to write into the trace (bytes, or with a K/M/G suffix): PyTorch's
    /// snapshots do not record it.
    #[arg(long, value_parser = parse_size_arg)]
    capacity: Option<u64>,
}

/// Whether `path` holds a pickle (a snapshot) rather than `.trace` text: pickles of protocol 2
/// and later start with the PROTO opcode, 0x80, which no text trace does.
pub(crate) fn is_pickle(path: &std::path::Path) -> bool {
    magic(path)[0] == 0x80
}

/// The first four bytes of `path` (zeros past its end, or when it cannot be read: the reader
/// that follows says why).
fn magic(path: &std::path::Path) -> [u8; 4] {
    use std::io::Read;
    let mut first = [0u8; 4];
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(4).read(&mut first);
    }
    first
}

/// What a file that is neither a `.trace` nor a snapshot pickle looks like, by its first bytes.
fn foreign_format(path: &std::path::Path) -> Option<&'static str> {
    match magic(path) {
        [b'P', b'K', 3, 4] => Some("a zip archive (torch.save's format?)"),
        [0x1f, 0x8b, _, _] => Some("gzip-compressed (decompress it first)"),
        _ => None,
    }
}

/// A `.trace`, or a PyTorch snapshot imported on the fly (device with the longest history);
/// problems are printed to stderr.
pub(crate) fn load_trace(path: &std::path::Path) -> Option<alloc_trace::Trace> {
    if let Some(what) = foreign_format(path) {
        eprintln!(
            "error: {}: {what}, not a .trace or a PyTorch memory snapshot pickle",
            path.display()
        );
        return None;
    }
    if !is_pickle(path) {
        return alloc_trace::load(path).map_err(|e| eprintln!("{e}")).ok();
    }
    let read = alloc_snapshot::read_file(path)
        .map_err(|e| eprintln!("error: {}: {e}", path.display()))
        .ok()?;
    for w in &read.warnings {
        eprintln!("warning: {}: {w}", path.display());
    }
    let imported = import_snapshot(&read.snapshot, &ImportOptions::default(), None)
        .map_err(|e| eprintln!("error: {}: {e}", path.display()))
        .ok()?;
    let mut trace = imported.trace;
    trace.file = path.display().to_string();
    Some(trace)
}

/// Runs `npu-alloc import-snapshot`.
pub(crate) fn run(args: Args) -> ExitCode {
    if let Some(what) = foreign_format(&args.snapshot) {
        eprintln!(
            "error: {}: {what}, not a PyTorch memory snapshot pickle",
            args.snapshot.display()
        );
        return ExitCode::FAILURE;
    }
    // The trace would take the snapshot's place (a link or another spelling of its path too).
    let same = |a: &std::path::Path, b: &std::path::Path| {
        a == b
            || std::fs::canonicalize(a)
                .is_ok_and(|a| std::fs::canonicalize(b).is_ok_and(|b| a == b))
    };
    if same(&args.snapshot, &args.output) {
        eprintln!(
            "error: {}: the output would overwrite the snapshot; name another file with -o",
            args.output.display()
        );
        return ExitCode::from(2);
    }
    let read = match alloc_snapshot::read_file(&args.snapshot) {
        Ok(read) => read,
        Err(e) => {
            eprintln!("error: {}: {e}", args.snapshot.display());
            return ExitCode::FAILURE;
        }
    };
    for w in &read.warnings {
        eprintln!("warning: {}: {w}", args.snapshot.display());
    }
    let entries: usize = read.snapshot.device_traces.iter().map(Vec::len).sum();
    let bar = (entries >= PROGRESS_FROM && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(entries as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "importing {bar:40} {human_pos}/{human_len} entries, {eta} left",
            )
            .expect("a valid template"),
        );
        bar
    });
    let tick = |done: u64| {
        if let Some(bar) = &bar {
            bar.set_position(done);
        }
    };
    let options = ImportOptions {
        device: args.device,
        capacity: args.capacity,
    };
    let imported = import_snapshot(
        &read.snapshot,
        &options,
        bar.is_some().then_some(&tick as &dyn Fn(u64)),
    );
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let imported = match imported {
        Ok(imported) => imported,
        Err(e) => {
            eprintln!("error: {}: {e}", args.snapshot.display());
            return ExitCode::FAILURE;
        }
    };
    let source = args.snapshot.file_name().map_or_else(
        || args.snapshot.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    if let Err(e) = std::fs::write(&args.output, imported.to_text(&source)) {
        eprintln!("error: cannot write {}: {e}", args.output.display());
        return ExitCode::FAILURE;
    }
    let s = &imported.summary;
    let streams = s.streams.len() as u64 + s.extra_streams;
    eprintln!(
        "wrote {}: device {}, {} prologue allocation{}, {} alloc, {} free ({} delayed), {streams} \
         stream{}",
        args.output.display(),
        s.device,
        s.prologue,
        crate::out::plural(s.prologue as u64),
        s.allocs,
        s.frees,
        s.delayed_frees,
        crate::out::plural(streams),
    );
    if s.workspace_blocks > 0 {
        eprintln!(
            "note: {} blocks of torch_npu's workspace allocator ({} bytes) are not the caching \
             allocator's: written as device_overhead",
            s.workspace_blocks, s.workspace_bytes
        );
    }
    for note in &s.notes {
        eprintln!("note: {note}");
    }
    for line in s.left_out_lines() {
        eprintln!("warning: left out {line}");
    }
    ExitCode::SUCCESS
}
