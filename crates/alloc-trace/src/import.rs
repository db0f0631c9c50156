//! A PyTorch memory snapshot as a replayable `.trace`: the caller's side of the history
//! (allocations and frees), with the allocator's own decisions (segments, completions that
//! happen at once) left for the replaying allocator to make again.
//!
//! - `alloc` entries become `alloc a<n> <size> <stream>` (torch's `size` is the requested size);
//!   `free_requested` becomes `free`.
//! - A `free_completed` that does not follow its `free_requested` at once means the block
//!   waited on another stream's work: the import gives the block a `record` on a stream of its
//!   own before the `free` and a `complete` of that stream where torch completed it, so the
//!   replay holds the block exactly as long.
//! - Blocks live before the history started are rebuilt as a prologue, in address order: the
//!   end state's active blocks that no `alloc` of the history accounts for, and blocks the
//!   history frees without having allocated them. Then `reset_peak` and `stats prologue`, so
//!   peaks are the recorded window's.
//! - Streams are renumbered: torch's stream 0 stays 0, the others get 1, 2, … in order of first
//!   appearance; the streams of delayed frees come after them.
//! - The caller's releases come back: a run of segment frees that is the caller's
//!   (`empty_cache`; see [`release_runs`] for how it is told from GC's and the retry chain's)
//!   becomes `empty_cache`, and with a capacity each `oom` entry becomes an `alloc` of its size
//!   and its `free`. The allocator's own segment entries, snapshot and annotation entries are
//!   skipped (counted in [`ImportSummary`]); so is what does not pair up (a free of an address
//!   freed already, an `alloc` of an address still live), each counted as a warning.
//! - torch_npu's snapshots carry no allocator settings: expandable segments (an `is_expandable`
//!   segment, a `segment_map` entry) turn `expandable_segments:True` on in the trace's `conf`.
//!   Settings with blanks are written in their canonical form.
//! - Private pools come back when the entries name their pool (torch_npu's per-entry
//!   `pool_id`): `pool` at the first allocation, `use_pool` around each, `release_pool` at the
//!   first segment free that is neither the requesting pool's own retry nor followed by another
//!   allocation to the pool. Their `use_on_oom` /
//!   `no_split` and memory-saver tags are not in a snapshot: they come back as plain pools.
//!   From PyTorch's entries, which name none, their blocks replay in the default pools (an
//!   [`ImportNote`] says how many segments).
//! - torch_npu's workspace allocator (`NPUWorkspaceAllocator`) takes device memory outside the
//!   caching allocator, and its snapshot adds that memory as segments and, at the front of
//!   the trace, a `workspace_snapshot`, `segment_alloc` and `alloc` for each block. None of it
//!   is the caching allocator's: those entries and segments are left out, and the blocks'
//!   bytes become the trace's `device_overhead`, memory the device has given to others.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use alloc_snapshot::{Action, BlockState, Snapshot, TraceEntry};

use crate::op::{IdRef, OpKind, PoolOp, Trace};

/// What to import.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// The device whose history to import; by default the one with the longest history.
    pub device: Option<i64>,
    /// The device capacity to write as the trace's `capacity` directive. A PyTorch snapshot
    /// does not record the device's total memory, so none is written unless given.
    pub capacity: Option<u64>,
}

/// Why a snapshot cannot be imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportError {
    /// The snapshot has no history to replay (`_record_memory_history` was off).
    NoHistory,
    /// The device asked for has no history.
    NoSuchDevice {
        /// The device asked for.
        device: i64,
        /// Devices with a history.
        available: Vec<i64>,
    },
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportError::NoHistory => f.write_str(
                "the snapshot has no trace entries: record it with \
                 torch.cuda.memory._record_memory_history() on",
            ),
            ImportError::NoSuchDevice { device, available } => {
                write!(
                    f,
                    "device {device} has no trace entries; devices with some: {available:?}"
                )
            }
        }
    }
}

impl std::error::Error for ImportError {}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportSummary {
    /// The device imported.
    pub device: i64,
    /// Trace entries of that device.
    pub entries: u64,
    /// Prologue allocations: blocks live before the history started.
    pub prologue: u64,
    /// Of them, blocks the history frees without allocating them.
    pub prologue_freed: u64,
    /// `alloc` lines from the history.
    pub allocs: u64,
    /// `free` lines.
    pub frees: u64,
    /// Frees completed later, on another stream's work (`record` + `complete` pairs).
    pub delayed_frees: u64,
    /// `empty_cache` lines: runs of `segment_free` / `segment_unmap` entries judged the
    /// caller's (`release_runs`: no segment request or out-of-memory follows, or the request
    /// would have fitted without the release), not the allocator's GC or retry chain.
    pub empty_caches: u64,
    /// Failed requests (`oom` entries) replayed as an `alloc` of their size and its `free`
    /// (skipped when the replay fails it too); only with a capacity.
    pub failed_requests: u64,
    /// Private pools imported as the trace's pools (from torch_npu's per-entry `pool_id` and
    /// the segments' `segment_pool_id`).
    pub pools: u64,
    /// Streams of the snapshot, in id order: torch's stream value of id 0, 1, ….
    pub streams: Vec<i64>,
    /// Streams added for delayed frees.
    pub extra_streams: u64,
    /// torch_npu workspace blocks left out (their `workspace_snapshot` entries).
    pub workspace_blocks: u64,
    /// Their bytes, written as the trace's `device_overhead`.
    pub workspace_bytes: u64,
    /// Entries skipped as the allocator's own decisions or annotations, by action name.
    pub skipped: BTreeMap<String, u64>,
    /// Entries that did not pair up and were left out, by what was wrong.
    pub warnings: BTreeMap<&'static str, LeftOut>,
    /// What the import decided that the snapshot does not say, or could not keep.
    pub notes: Vec<ImportNote>,
}

/// Something an import inferred, or kept in another form than the snapshot's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImportNote {
    /// The snapshot has no allocator settings (torch_npu's snapshots write none) but expandable
    /// segments (`is_expandable` segments, or `segment_map`/`segment_unmap` entries): the
    /// trace's `conf` turns them on.
    ExpandableInferred,
    /// The allocator settings had blanks; the trace's `conf` is their canonical form.
    SettingsCanonical,
    /// This many segments of the device belong to private pools (`segment_pool_id` other than
    /// (0, 0)): their blocks and history are replayed in the default pools.
    PrivatePools {
        /// The segments.
        segments: u64,
    },
    /// This many blocks were still waiting for their free at the end of a free the history does
    /// not hold: the prologue allocates each, then frees it after a `record` on a stream that
    /// never completes, so they end pending as in the snapshot.
    PendingBeforeHistory {
        /// The blocks.
        blocks: u64,
    },
    /// This many `oom` entries (failed requests) were skipped: without the device's capacity
    /// the replay would not run out of memory where torch did.
    OomsWithoutCapacity {
        /// The entries.
        entries: u64,
    },
}

impl fmt::Display for ImportNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportNote::ExpandableInferred => f.write_str(
                "the snapshot has expandable segments and no allocator settings: the trace \
                 replays with `conf expandable_segments:True`",
            ),
            ImportNote::SettingsCanonical => f.write_str(
                "the allocator settings had blanks: the trace's `conf` is their canonical form",
            ),
            ImportNote::PrivatePools { segments } => write!(
                f,
                "{segments} segment(s) of private pools: their blocks and history replay in \
                 the default pools"
            ),
            ImportNote::PendingBeforeHistory { blocks } => write!(
                f,
                "{blocks} block(s) freed before the history and still pending at its end: \
                 replayed as pending on a stream that never completes"
            ),
            ImportNote::OomsWithoutCapacity { entries } => write!(
                f,
                "{entries} failed request(s) (oom entries) skipped: give the device's capacity \
                 (--capacity) to replay them as requests that run out of memory"
            ),
        }
    }
}

/// How many entries one kind of problem left out of an import, and where the first was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeftOut {
    /// How many.
    pub count: u64,
    /// The index of the first in the device's trace entries; `None` for what is not a trace
    /// entry (a block of the end state, the allocator settings).
    pub first_entry: Option<usize>,
}

impl ImportSummary {
    /// One line per kind of entry left out: "2 × free of an address not live (first at trace
    /// entry 17)".
    pub fn left_out_lines(&self) -> impl Iterator<Item = String> + '_ {
        self.warnings.iter().map(|(what, left_out)| {
            let mut line = format!("{} × {what}", left_out.count);
            if let Some(i) = left_out.first_entry {
                line.push_str(&format!(" (first at trace entry {i})"));
            }
            line
        })
    }
}

/// A snapshot imported as a trace.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The trace.
    pub trace: Trace,
    /// What was imported and left out.
    pub summary: ImportSummary,
}

impl Imported {
    /// The trace as `.trace` text, with a header saying where it came from (`source`, e.g. the
    /// file name) and what was imported.
    pub fn to_text(&self, source: &str) -> String {
        let s = &self.summary;
        let mut out = String::new();
        out.push_str(
            "# .trace v1, imported from a PyTorch memory snapshot by `npu-alloc import-snapshot`\n",
        );
        out.push_str(&format!(
            "# source: {source}, device {}, {} trace entries\n",
            s.device, s.entries
        ));
        out.push_str(&format!(
            "# prologue: {} allocations live when recording started ({} of them freed in the history), address order\n",
            s.prologue, s.prologue_freed
        ));
        out.push_str(&format!(
            "# history: {} alloc, {} free ({} completed later on another stream: record + complete)\n",
            s.allocs, s.frees, s.delayed_frees
        ));
        if s.empty_caches > 0 {
            out.push_str(&format!(
                "# empty_cache: {} (runs of segment frees judged the caller's: no segment request or oom follows, or the request fitted without them)\n",
                s.empty_caches
            ));
        }
        if s.pools > 0 {
            out.push_str(&format!(
                "# pools: {} private pools (pool_<a>_<b>: torch's pool id), each released at its first segment free after its last allocation\n",
                s.pools
            ));
        }
        if s.failed_requests > 0 {
            out.push_str(&format!(
                "# failed requests: {} oom entries, each as alloc + free (the free is skipped when the replay runs out too)\n",
                s.failed_requests
            ));
        }
        let streams: Vec<String> = s
            .streams
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{i} = {v:#x}"))
            .collect();
        out.push_str(&format!(
            "# streams: {}{}\n",
            streams.join(", "),
            if s.extra_streams > 0 {
                format!("; {} more for delayed frees", s.extra_streams)
            } else {
                String::new()
            }
        ));
        if s.workspace_blocks > 0 {
            out.push_str(&format!(
                "# workspace: {} blocks of torch_npu's workspace allocator, {} bytes, as device_overhead\n",
                s.workspace_blocks, s.workspace_bytes
            ));
        }
        for (action, n) in &s.skipped {
            let why = match Action::from_name(action) {
                Action::Other(_) => "an action npu-alloc does not know",
                Action::Oom => "failed requests: --capacity replays them",
                Action::Snapshot | Action::WorkspaceSnapshot | Action::Annotate => "annotations",
                _ => "the allocator's own decisions",
            };
            out.push_str(&format!("# skipped: {n} {action} entries ({why})\n"));
        }
        for note in &s.notes {
            out.push_str(&format!("# note: {note}\n"));
        }
        for line in s.left_out_lines() {
            out.push_str(&format!("# left out: {line}\n"));
        }
        out.push_str("# sizes are the requested sizes; replay with --pad 0 for CUDA's rounding\n");
        out.push_str(&crate::write::to_text(&self.trace));
        out
    }
}

/// Counts one entry left out because of `what`; `entry` is its index in the device's trace
/// entries, if it is one.
fn warn(warnings: &mut BTreeMap<&'static str, LeftOut>, what: &'static str, entry: Option<usize>) {
    let left_out = warnings.entry(what).or_default();
    left_out.count += 1;
    left_out.first_entry = left_out.first_entry.or(entry);
}

/// Devices with a history, and the length of each.
fn histories(snapshot: &Snapshot) -> impl Iterator<Item = (i64, &[TraceEntry])> {
    snapshot
        .device_traces
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .map(|(i, t)| (i as i64, t.as_slice()))
}

/// torch_npu's workspace blocks in a device's trace entries: each `workspace_snapshot` and
/// the `segment_alloc` and `alloc` of its address that its snapshot puts right after it.
#[derive(Default)]
struct Workspace {
    /// The indexes of those entries.
    entries: HashSet<usize>,
    /// The blocks' addresses (their segments' too: a workspace segment is one block).
    addrs: HashSet<i64>,
}

impl Workspace {
    fn find(entries: &[TraceEntry], summary: &mut ImportSummary) -> Workspace {
        let mut w = Workspace::default();
        for (i, e) in entries.iter().enumerate() {
            if e.action != Action::WorkspaceSnapshot {
                continue;
            }
            w.entries.insert(i);
            let Some(addr) = e.addr else { continue };
            w.addrs.insert(addr);
            summary.workspace_blocks += 1;
            summary.workspace_bytes = summary
                .workspace_bytes
                .saturating_add(u64::try_from(e.size).unwrap_or(0));
            let made_up = [Action::SegmentAlloc, Action::Alloc];
            for (j, action) in (i + 1..).zip(made_up) {
                match entries.get(j) {
                    Some(f) if f.action == action && f.addr == Some(addr) => {
                        w.entries.insert(j);
                    }
                    _ => break,
                }
            }
        }
        w
    }
}

/// Streams renumbered: torch's 0 stays 0, others in order of first appearance.
#[derive(Default)]
struct Streams {
    ids: HashMap<i64, u64>,
    values: Vec<i64>,
}

impl Streams {
    fn new() -> Streams {
        let mut s = Streams::default();
        s.id(0);
        s
    }

    fn id(&mut self, value: i64) -> u64 {
        *self.ids.entry(value).or_insert_with(|| {
            self.values.push(value);
            self.values.len() as u64 - 1
        })
    }
}

/// Converts device `options.device` (or the one with the longest history) of `snapshot` into a
/// trace; `progress` is called now and then with the entries done.
pub fn import_snapshot(
    snapshot: &Snapshot,
    options: &ImportOptions,
    progress: Option<&dyn Fn(u64)>,
) -> Result<Imported, ImportError> {
    let (device, entries) =
        match options.device {
            Some(d) => histories(snapshot).find(|&(i, _)| i == d).ok_or_else(|| {
                ImportError::NoSuchDevice {
                    device: d,
                    available: histories(snapshot).map(|(i, _)| i).collect(),
                }
            })?,
            None => histories(snapshot)
                .max_by_key(|&(i, t)| (t.len(), -i))
                .ok_or(ImportError::NoHistory)?,
        };
    let mut summary = ImportSummary {
        device,
        entries: entries.len() as u64,
        ..ImportSummary::default()
    };
    let mut streams = Streams::new();
    let workspace = Workspace::find(entries, &mut summary);

    // Pass 1: which addresses the history allocates and frees (to find the prologue), where
    // each free completes, and every stream in order of first appearance.
    let mut live: HashMap<i64, ()> = HashMap::new();
    // addr → (size, stream, pool)
    let mut freed_before: BTreeMap<i64, (i64, i64, PoolKey)> = BTreeMap::new();
    let mut requested: HashMap<i64, usize> = HashMap::new(); // addr → its free_requested
    let mut completed_at: HashMap<usize, usize> = HashMap::new(); // free_requested → completed
    let mut last_freed: HashMap<i64, ()> = HashMap::new(); // addresses last seen freed
    for (i, e) in entries.iter().enumerate() {
        let Some(addr) = e.addr else { continue };
        if workspace.entries.contains(&i) {
            continue;
        }
        match e.action {
            Action::Alloc => {
                streams.id(e.stream);
                live.insert(addr, ());
                last_freed.remove(&addr);
            }
            Action::FreeRequested => {
                // A free of a live address, or the first free of an address the history has not
                // used before (a block that predates it). A second free of a freed address is a
                // double free, which pass 2 leaves out with a warning: it neither makes a
                // prologue block nor takes the first free's completion.
                let was_live = live.remove(&addr).is_some();
                let predates = !was_live && !last_freed.contains_key(&addr);
                if predates {
                    freed_before
                        .entry(addr)
                        .or_insert((e.size, e.stream, pool_of(e)));
                }
                if was_live || predates {
                    requested.insert(addr, i);
                    last_freed.insert(addr, ());
                }
            }
            Action::FreeCompleted => {
                if let Some(r) = requested.remove(&addr) {
                    completed_at.insert(r, i);
                }
            }
            _ => {}
        }
    }
    // End-state active blocks the history's allocations do not account for.
    // addr → (size, stream, pending at the end with its free before the history, pool)
    let mut prologue: BTreeMap<i64, (i64, i64, bool, PoolKey)> = BTreeMap::new();
    let mut pending_at_end: HashMap<i64, ()> = HashMap::new();
    let segments: Vec<_> = snapshot
        .segments
        .iter()
        .filter(|s| s.device == device && !workspace.addrs.contains(&s.address))
        .collect();
    let pooled = segments
        .iter()
        .filter(|s| s.segment_pool_id != DEFAULT_POOL)
        .count() as u64;
    // torch_npu's entries name their pool; PyTorch's do not.
    let entries_name_pools = entries.iter().any(|e| e.pool_id.is_some());
    if pooled > 0 && !entries_name_pools {
        summary
            .notes
            .push(ImportNote::PrivatePools { segments: pooled });
    }
    for seg in &segments {
        for b in &seg.blocks {
            if b.state == BlockState::ActivePendingFree {
                pending_at_end.insert(b.address, ());
            }
            // The history accounts for a block allocated in it and not freed, or one it freed
            // last (still pending at the end).
            let accounted = match b.state {
                BlockState::Inactive => true,
                BlockState::ActiveAllocated => live.contains_key(&b.address),
                BlockState::ActivePendingFree => last_freed.contains_key(&b.address),
            };
            if accounted {
                continue;
            }
            let size = if b.requested_size > 0 && b.requested_size <= b.size {
                b.requested_size
            } else {
                b.size
            };
            streams.id(seg.stream);
            let pending = b.state == BlockState::ActivePendingFree;
            prologue.insert(b.address, (size, seg.stream, pending, seg.segment_pool_id));
        }
    }
    summary.prologue_freed = freed_before
        .keys()
        .filter(|a| !prologue.contains_key(a))
        .count() as u64;
    for (addr, (size, stream, pool)) in freed_before {
        streams.id(stream);
        prologue.entry(addr).or_insert((size, stream, false, pool));
    }
    let real_streams = streams.values.len() as u64;
    // The streams added for frees: one that never completes for the prologue's pending blocks,
    // then one per delayed free of the history at a time.
    let mut extra = 0u64;
    let prologue_pending = prologue.values().filter(|p| p.2).count() as u64;
    let never_completes = (prologue_pending > 0).then(|| {
        extra += 1;
        real_streams
    });
    if prologue_pending > 0 {
        summary.notes.push(ImportNote::PendingBeforeHistory {
            blocks: prologue_pending,
        });
    }

    let mut trace = Trace::new("imported.trace");
    trace.capacity = options.capacity;
    trace.device_overhead = (summary.workspace_bytes > 0).then_some(summary.workspace_bytes);
    if let Some(conf) = snapshot
        .allocator_settings
        .as_ref()
        .map(|s| s.alloc_conf.trim())
        .filter(|c| !c.is_empty())
    {
        // A `conf` line ends at a `#` (a comment) and at the end of the line: settings with
        // blanks are written in their canonical form when they parse cleanly; anything else
        // would replay under other settings than the snapshot's.
        let parsed = alloc_conf::parse(conf);
        if !conf.contains(|c: char| c.is_whitespace() || c == '#') {
            trace.conf = Some(conf.to_owned());
        } else if !conf.contains('#') && parsed.warnings.is_empty() {
            let canonical = parsed.conf.to_string();
            trace.conf = (!canonical.is_empty()).then_some(canonical);
            summary.notes.push(ImportNote::SettingsCanonical);
        } else {
            warn(
                &mut summary.warnings,
                "allocator settings with a `#`, or blanks and a problem (replayed with the \
                 defaults)",
                None,
            );
        }
    } else if snapshot.allocator_settings.is_none()
        && (segments.iter().any(|s| s.is_expandable)
            || entries
                .iter()
                .any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap)))
    {
        trace.conf = Some("expandable_segments:True".to_owned());
        summary.notes.push(ImportNote::ExpandableInferred);
    }
    let mut by_addr: HashMap<i64, IdRef> = HashMap::new();
    let mut n = 0;
    let mut pools = Pools {
        enabled: entries_name_pools,
        names: HashMap::new(),
        released: HashSet::new(),
    };
    for (addr, &(size, stream, pending, pool)) in &prologue {
        let Ok(size) = u64::try_from(size) else {
            warn(&mut summary.warnings, "block of a negative size", None);
            continue;
        };
        let id = trace.add_id(format!("p{n}"));
        n += 1;
        let alloc = OpKind::Alloc {
            id,
            size,
            stream: streams.id(stream),
        };
        pools.alloc(&mut trace, pool, alloc);
        match never_completes {
            Some(s) if pending => {
                trace.push(OpKind::Record { id, stream: s });
                trace.push(OpKind::Free { id });
            }
            _ => {
                by_addr.insert(*addr, id);
            }
        }
    }
    summary.prologue = n;
    trace.push(OpKind::ResetPeak);
    trace.push(OpKind::Stats {
        label: Some("prologue".to_owned()),
    });

    // Pass 2: the history. Delayed frees get streams of their own: `complete <s>` finishes all
    // work queued on `s`, so a stream serves one pending free at a time.
    let mut pending: HashMap<i64, u64> = HashMap::new(); // addr → its stream
    let mut idle_streams: Vec<u64> = Vec::new();
    let mut next_alloc = 0u64;
    let end_reserved = segments
        .iter()
        .fold(0i64, |sum, s| sum.saturating_add(s.total_size));
    // The settings the snapshot was taken under; torch_npu's snapshots have none, and are then
    // taken to have had no GC and no fraction, as the trace replays them.
    let conf = trace
        .conf
        .as_deref()
        .map(|c| alloc_conf::parse(c).conf)
        .unwrap_or_default();
    // What the device let the allocator have: the fraction's limit of the total, and no more
    // than the workspace left.
    let capacity = options.capacity.map(|c| {
        let limit = ((conf.per_process_memory_fraction * c as f64) as u64)
            .min(c.saturating_sub(summary.workspace_bytes));
        i64::try_from(limit).unwrap_or(i64::MAX)
    });
    // The last entry that allocates in each private pool.
    let last_use: HashMap<PoolKey, usize> = entries
        .iter()
        .enumerate()
        .filter(|&(j, e)| {
            !workspace.entries.contains(&j)
                && matches!(
                    e.action,
                    Action::Alloc | Action::Oom | Action::SegmentAlloc | Action::SegmentMap
                )
        })
        .map(|(j, e)| (pool_of(e), j))
        .collect();
    let gc = conf.garbage_collection_threshold.is_some();
    let runs = release_runs(entries, &workspace, end_reserved, capacity, gc);
    for (i, e) in entries.iter().enumerate() {
        if let Some(tick) = progress
            && i % 65_536 == 0
        {
            tick(i as u64);
        }
        if workspace.entries.contains(&i) {
            continue;
        }
        let addr = match (&e.action, e.addr) {
            (Action::Alloc | Action::FreeRequested | Action::FreeCompleted, Some(a)) => a,
            (Action::Alloc | Action::FreeRequested | Action::FreeCompleted, None) => {
                warn(&mut summary.warnings, "entry without an address", Some(i));
                continue;
            }
            (Action::SegmentFree | Action::SegmentUnmap, _) => {
                let run = runs[&i];
                if run.start == i {
                    // The pools this run releases first, then the caller's `empty_cache` unless
                    // the run frees only the segments of pools it releases (a `MemPool`
                    // deleted: `release_pool` empties its cache).
                    let mut released_here = HashSet::new();
                    let mut more = false;
                    let member = |j: &usize| runs.get(j).is_some_and(|r| r.start == i);
                    let within = |j: &usize| {
                        member(j)
                            || entries[*j].action == Action::FreeCompleted
                            || workspace.entries.contains(j)
                    };
                    for j in (i..entries.len()).take_while(within).filter(member) {
                        let pool = pool_of(&entries[j]);
                        if released_here.contains(&pool) {
                            continue;
                        }
                        // torch frees a private pool's segment only once the pool is released,
                        // except the requesting pool's own, on the way to its request; a pool
                        // allocated to later is not released (its ids are never reused), even
                        // where another thread's entry split the retry chain's run.
                        let releases = pool != DEFAULT_POOL
                            && run.request_pool != Some(pool)
                            && last_use.get(&pool).is_none_or(|&u| u < j);
                        if releases && pools.release(&mut trace, pool) {
                            released_here.insert(pool);
                        } else {
                            more = true;
                        }
                    }
                    if run.callers && more {
                        trace.push(OpKind::EmptyCache {
                            free_physical: true,
                        });
                        summary.empty_caches += 1;
                    }
                }
                *summary
                    .skipped
                    .entry(e.action.name().to_owned())
                    .or_insert(0) += 1;
                continue;
            }
            (Action::Oom, _) if e.size < 0 => {
                warn(&mut summary.warnings, "oom of a negative size", Some(i));
                continue;
            }
            (Action::Oom, _) if options.capacity.is_some() => {
                if pools.released(pool_of(e)) {
                    warn(&mut summary.warnings, ALLOC_TO_RELEASED_POOL, Some(i));
                    continue;
                }
                let id = trace.add_id(format!("o{}", summary.failed_requests));
                let alloc = OpKind::Alloc {
                    id,
                    size: e.size as u64,
                    stream: streams.id(e.stream),
                };
                pools.alloc(&mut trace, pool_of(e), alloc);
                trace.push(OpKind::Free { id });
                summary.failed_requests += 1;
                continue;
            }
            (other, _) => {
                *summary.skipped.entry(other.name().to_owned()).or_insert(0) += 1;
                continue;
            }
        };
        match e.action {
            Action::Alloc => {
                if by_addr.contains_key(&addr) {
                    warn(
                        &mut summary.warnings,
                        "alloc of an address still live",
                        Some(i),
                    );
                    continue;
                }
                let Ok(size) = u64::try_from(e.size) else {
                    warn(&mut summary.warnings, "alloc of a negative size", Some(i));
                    continue;
                };
                if pools.released(pool_of(e)) {
                    warn(&mut summary.warnings, ALLOC_TO_RELEASED_POOL, Some(i));
                    continue;
                }
                let id = trace.add_id(format!("a{next_alloc}"));
                next_alloc += 1;
                by_addr.insert(addr, id);
                let alloc = OpKind::Alloc {
                    id,
                    size,
                    stream: streams.id(e.stream),
                };
                pools.alloc(&mut trace, pool_of(e), alloc);
                summary.allocs += 1;
            }
            Action::FreeRequested => {
                let Some(id) = by_addr.remove(&addr) else {
                    warn(
                        &mut summary.warnings,
                        "free of an address not live",
                        Some(i),
                    );
                    continue;
                };
                // A free completed later, or never (the block is still pending at the end).
                let completes_later = match completed_at.get(&i) {
                    Some(&c) => c > i + 1,
                    None => pending_at_end.contains_key(&addr),
                };
                if completes_later {
                    let stream = idle_streams.pop().unwrap_or_else(|| {
                        extra += 1;
                        real_streams + extra - 1
                    });
                    trace.push(OpKind::Record { id, stream });
                    pending.insert(addr, stream);
                    summary.delayed_frees += 1;
                }
                trace.push(OpKind::Free { id });
                summary.frees += 1;
            }
            Action::FreeCompleted => {
                if let Some(stream) = pending.remove(&addr) {
                    trace.push(OpKind::Complete {
                        stream: Some(stream),
                    });
                    idle_streams.push(stream);
                }
                // Otherwise it followed its free_requested at once, or the request was not
                // recorded (the ring dropped it): nothing to do either way.
            }
            _ => unreachable!("other actions were skipped above"),
        }
    }
    // Frees still pending at the end stay pending in the replay too (their streams are never
    // completed), as the snapshot's `active_pending_free` blocks are.
    trace.push(OpKind::Stats {
        label: Some("end".to_owned()),
    });
    if let Some(tick) = progress {
        tick(entries.len() as u64);
    }
    let ooms = summary
        .skipped
        .get(Action::Oom.name())
        .copied()
        .unwrap_or(0);
    if ooms > 0 {
        summary
            .notes
            .push(ImportNote::OomsWithoutCapacity { entries: ooms });
    }
    summary.pools = pools.names.len() as u64;
    summary.streams = streams.values;
    summary.extra_streams = extra;
    Ok(Imported { trace, summary })
}

/// The warning for an allocation to a pool whose segments the history has freed already.
const ALLOC_TO_RELEASED_POOL: &str =
    "allocation to a private pool after one of its segments was freed (its release)";

/// torch's id of the default pools.
const DEFAULT_POOL: PoolKey = (0, 0);

/// A pool id as torch writes it (`segment_pool_id`, torch_npu's per-entry `pool_id`).
type PoolKey = (i64, i64);

/// The pool an entry names: the default pools when it names none (PyTorch's entries).
fn pool_of(e: &TraceEntry) -> PoolKey {
    e.pool_id.unwrap_or(DEFAULT_POOL)
}

/// The private pools met in the snapshot, as the trace's pools (`pool_<a>_<b>`), each created
/// at its first allocation and released at its first segment free after its last allocation
/// (not the requesting pool's own retry). Only when the entries name
/// their pools (torch_npu's): from PyTorch's, whose entries do not, everything replays in the
/// default pools (a note says so).
struct Pools {
    enabled: bool,
    names: HashMap<PoolKey, String>,
    released: HashSet<PoolKey>,
}

impl Pools {
    fn name(&mut self, trace: &mut Trace, pool: PoolKey) -> String {
        self.names
            .entry(pool)
            .or_insert_with(|| {
                let name = format!("pool_{}_{}", pool.0, pool.1);
                trace.push(OpKind::Pool(PoolOp::Create {
                    name: name.clone(),
                    use_on_oom: false,
                    no_split: false,
                }));
                name
            })
            .clone()
    }

    /// Whether `pool` is a private pool released already, which torch would not allocate to
    /// (its ids are not reused): its allocations are left out.
    fn released(&self, pool: PoolKey) -> bool {
        self.enabled && self.released.contains(&pool)
    }

    /// Pushes `alloc`, inside `use_pool` for a private pool (not [`Pools::released`]).
    fn alloc(&mut self, trace: &mut Trace, pool: PoolKey, alloc: OpKind) {
        if pool == DEFAULT_POOL || !self.enabled {
            trace.push(alloc);
            return;
        }
        let name = self.name(trace, pool);
        trace.push(OpKind::Pool(PoolOp::Use(name)));
        trace.push(alloc);
        trace.push(OpKind::Pool(PoolOp::End));
    }

    /// Releases a private pool once (a segment of it was freed, which torch does only for a
    /// released pool); whether it did now.
    fn release(&mut self, trace: &mut Trace, pool: PoolKey) -> bool {
        if pool != DEFAULT_POOL && self.enabled && self.released.insert(pool) {
            let name = self.name(trace, pool);
            trace.push(OpKind::Pool(PoolOp::Release(name)));
            return true;
        }
        false
    }
}

/// A run of segment frees (`segment_free` / `segment_unmap`), as [`release_runs`] judges it.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// The entry the run starts at.
    start: usize,
    /// Whether it is the caller's release (`empty_cache`, a pool's release) rather than the
    /// allocator's own.
    callers: bool,
    /// The pool of the segment request or `oom` the run ends in, if it does: the retry chain
    /// (`release_available_cached_blocks`) frees the requesting pool's own cached segments,
    /// which releases no pool.
    request_pool: Option<PoolKey>,
}

/// Each segment free's run. GC and the retry chain release segments only on the way to a
/// segment request, so their runs end in a `segment_alloc` / `segment_map`, or in the `oom` of
/// the request that still failed; a run that ends otherwise is the caller's. One that ends in
/// a segment request is the caller's too when that request would have fitted without a
/// release: the bytes reserved before the run plus the request's within `bound` (the configured
/// fraction of the device's capacity, and no more than the capacity less the workspace, when
/// known; else the history's peak of reserved bytes, which the device did hold), and GC off (it releases on the way to
/// requests that fit). A run goes on through segment frees, the frees its synchronize
/// completed, and workspace entries.
fn release_runs(
    entries: &[TraceEntry],
    workspace: &Workspace,
    end_reserved: i64,
    bound: Option<i64>,
    gc: bool,
) -> HashMap<usize, Run> {
    let is_release = |a: &Action| matches!(a, Action::SegmentFree | Action::SegmentUnmap);
    let counted = |i: usize| !workspace.entries.contains(&i);
    // The bytes reserved just before each entry, walked back from the end state.
    let mut before = vec![0i64; entries.len()];
    let mut reserved = end_reserved;
    for (i, e) in entries.iter().enumerate().rev() {
        if counted(i) {
            match e.action {
                // Saturating: a history is input, and may not add up.
                Action::SegmentAlloc | Action::SegmentMap => {
                    reserved = reserved.saturating_sub(e.size)
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    reserved = reserved.saturating_add(e.size)
                }
                _ => {}
            }
        }
        before[i] = reserved;
    }
    let bound = bound.unwrap_or_else(|| before.iter().copied().fold(end_reserved, i64::max));
    let mut runs = HashMap::new();
    let mut run: Option<Run> = None;
    for (i, e) in entries.iter().enumerate() {
        if !counted(i) {
            continue;
        }
        if !is_release(&e.action) {
            if e.action != Action::FreeCompleted {
                run = None;
            }
            continue;
        }
        let current = *run.get_or_insert_with(|| {
            let next = entries
                .iter()
                .enumerate()
                .skip(i + 1)
                .find(|&(j, n)| {
                    counted(j) && !is_release(&n.action) && n.action != Action::FreeCompleted
                })
                .map(|(_, n)| n);
            let (callers, request_pool) = match next {
                Some(n) if matches!(n.action, Action::SegmentAlloc | Action::SegmentMap) => (
                    !gc && before[i].saturating_add(n.size) <= bound,
                    Some(pool_of(n)),
                ),
                Some(n) if n.action == Action::Oom => (false, Some(pool_of(n))),
                _ => (true, None),
            };
            Run {
                start: i,
                callers,
                request_pool,
            }
        });
        runs.insert(i, current);
    }
    runs
}
