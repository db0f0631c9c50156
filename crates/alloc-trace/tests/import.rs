//! Importing PyTorch memory snapshots as traces: the shipped MAGMA27 snapshot gives exactly the
//! shipped GPT-2 trace; delayed frees become `record` + `complete`; a replay's own snapshot
//! imports back to the same figures.

use alloc_snapshot::{Action, Block, BlockState, Segment, SegmentType, Snapshot, TraceEntry};
use alloc_trace::{
    ImportError, ImportNote, ImportOptions, Observe, OpKind, Setup, import_snapshot, load,
    parse_str, replay, replay_observed, to_text,
};

const MAGMA27: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/traces/magma27_memory_snapshot.pickle"
);
const GPT2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/gpt2_step.trace");

fn cuda_setup(trace: &alloc_trace::Trace) -> Setup {
    Setup::from_trace(trace, Default::default(), None, Some(0))
}

fn kinds(trace: &alloc_trace::Trace) -> Vec<&OpKind> {
    trace.ops.iter().map(|op| &op.kind).collect()
}

#[test]
fn magma27_imports_as_the_shipped_gpt2_trace() {
    let read = alloc_snapshot::read_file(MAGMA27.as_ref()).unwrap();
    let imported = import_snapshot(&read.snapshot, &ImportOptions::default(), None).unwrap();
    let s = &imported.summary;
    assert_eq!(s.device, 0);
    assert_eq!(s.entries, 5163);
    // 227 blocks live at the end that no alloc of the history made, and 2 freed in it.
    assert_eq!((s.prologue, s.prologue_freed), (229, 2));
    assert_eq!((s.allocs, s.frees, s.delayed_frees), (1721, 1721, 0));
    assert_eq!(s.streams, [0]);
    assert!(s.skipped.is_empty() && s.warnings.is_empty(), "{s:?}");
    // The shipped trace was converted from the same snapshot by hand: same operations.
    let shipped = load(GPT2).unwrap();
    let text = imported.to_text("magma27_memory_snapshot.pickle");
    let parsed = parse_str("imported.trace", &text).unwrap();
    assert_eq!(kinds(&parsed), kinds(&shipped));
    // Replayed with CUDA's rounding: 240 segments, 14,088,667,136 bytes, where PyTorch held
    // 216 segments and 14,180,941,824 bytes after its five warm-up steps.
    let report = replay(&parsed, &cuda_setup(&parsed)).unwrap();
    let stats = &report.end.stats;
    assert_eq!(stats.reserved_bytes.all.peak, 14_088_667_136);
    assert_eq!(stats.segment.all.current, 240);
}

/// `snapshot` imported with the default options, and its trace's lines.
fn import_lines(snapshot: &Snapshot) -> (alloc_trace::Imported, Vec<String>) {
    let imported = import_snapshot(snapshot, &ImportOptions::default(), None).unwrap();
    let lines = to_text(&imported.trace)
        .lines()
        .map(str::to_owned)
        .collect();
    (imported, lines)
}

fn entry(action: Action, addr: i64, size: i64, stream: i64, time_us: i64) -> TraceEntry {
    TraceEntry {
        action,
        addr: Some(addr),
        device_free: None,
        size,
        stream,
        pool_id: None,
        time_us,
        compile_context: "N/A".into(),
        user_metadata: String::new(),
        frames: Vec::new(),
    }
}

fn block(address: i64, size: i64, state: BlockState) -> Block {
    Block {
        address,
        size,
        requested_size: size,
        state,
        frames: Vec::new(),
    }
}

/// A 2 MiB small-pool segment at 0x10_0000 on device 0, stream 0, holding `blocks`.
fn small_segment(blocks: Vec<Block>) -> Segment {
    Segment {
        device: 0,
        address: 0x10_0000,
        total_size: 2 << 20,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream: 0,
        segment_type: SegmentType::Small,
        segment_pool_id: (0, 0),
        is_expandable: false,
        frames: Vec::new(),
        blocks,
    }
}

#[test]
fn frees_completed_later_hold_their_block_on_a_stream_of_their_own() {
    use Action::{Alloc, FreeCompleted, FreeRequested, SegmentAlloc};
    const SIDE: i64 = 0x5555_0000; // a CUDA stream handle
    let snapshot = Snapshot {
        segments: vec![Segment {
            active_size: 512,
            requested_size: 512,
            ..small_segment(vec![block(0x10_0000, 512, BlockState::ActivePendingFree)])
        }],
        device_traces: vec![vec![
            entry(Alloc, 0x20_0000, 1000, SIDE, 1),
            entry(Alloc, 0x30_0000, 2000, 0, 2),
            entry(Alloc, 0x40_0000, 3000, 0, 3),
            entry(FreeRequested, 0x20_0000, 1000, SIDE, 4),
            entry(FreeRequested, 0x30_0000, 2000, 0, 5),
            entry(FreeCompleted, 0x30_0000, 2000, 0, 5),
            entry(FreeRequested, 0x40_0000, 3000, 0, 6),
            // torch completes frees when a malloc polls the events, before its own entries.
            entry(FreeCompleted, 0x20_0000, 1000, SIDE, 7),
            entry(FreeCompleted, 0x40_0000, 3000, 0, 7),
            entry(SegmentAlloc, 0x10_0000, 2 << 20, 0, 7),
            entry(Alloc, 0x10_0000, 500, 0, 7),
            // Still pending at the end (the segment shows it active_pending_free).
            entry(FreeRequested, 0x10_0000, 500, 0, 10),
        ]],
        ..Snapshot::default()
    };
    let (imported, body) = import_lines(&snapshot);
    assert_eq!(
        body,
        [
            "reset_peak",
            "stats prologue",
            "alloc a0 1000 1",
            "alloc a1 2000 0",
            "alloc a2 3000 0",
            // a0 completes after other entries: a stream of its own (2: after the snapshot's
            // streams 0 and 1).
            "record a0 2",
            "free a0",
            // a1 completes at once: a plain free.
            "free a1",
            // a2 completes later too, while stream 2 still waits: stream 3.
            "record a2 3",
            "free a2",
            "complete 2",
            "complete 3",
            "alloc a3 500 0",
            // a3 never completes: its stream (3, the last one to fall idle) is never completed.
            "record a3 3",
            "free a3",
            "stats end",
        ]
    );
    let s = &imported.summary;
    assert_eq!(s.streams, [0, SIDE]);
    assert_eq!((s.delayed_frees, s.extra_streams), (3, 2));
    assert_eq!(s.skipped.get("segment_alloc"), Some(&1));
    // Replayed, a0 and a2 return when a3's malloc polls the events, as in torch; a3 stays
    // pending at the end, as in the snapshot.
    let report = replay(
        &imported.trace,
        &Setup::from_trace(&imported.trace, Default::default(), None, Some(0)),
    )
    .unwrap();
    assert_eq!(report.end.stats.active_bytes.all.current, 512);
    assert_eq!(report.end.stats.allocated_bytes.all.current, 0);
}

#[test]
fn negative_sizes_and_settings_a_conf_line_cannot_hold_are_left_out_with_warnings() {
    use Action::{Alloc, FreeRequested};
    let live = BlockState::ActiveAllocated;
    let mut snapshot = Snapshot {
        segments: vec![small_segment(vec![
            block(0x10_0000, -100, live),
            block(0x10_0200, 512, live),
        ])],
        device_traces: vec![vec![
            entry(Alloc, 0x20_0000, -4096, 0, 1),
            entry(FreeRequested, 0x20_0000, -4096, 0, 2),
            entry(Alloc, 0x30_0000, 4096, 0, 3),
        ]],
        ..Snapshot::default()
    };
    let mut settings = alloc_snapshot::AllocatorSettings::from_conf(&Default::default());
    // The replayer would read `max_split_size_mb:64` and take `#x` for a comment.
    settings.alloc_conf = "max_split_size_mb:64#x".into();
    snapshot.allocator_settings = Some(settings);
    let (imported, body) = import_lines(&snapshot);
    assert_eq!(imported.trace.conf, None);
    assert_eq!(
        body,
        [
            "alloc p0 512 0",
            "reset_peak",
            "stats prologue",
            "alloc a0 4096 0",
            "stats end"
        ]
    );
    let w = &imported.summary.warnings;
    let left_out = |what: &str| w.get(what).map(|l| (l.count, l.first_entry));
    assert_eq!(left_out("block of a negative size"), Some((1, None)));
    assert_eq!(left_out("alloc of a negative size"), Some((1, Some(0))));
    assert_eq!(left_out("free of an address not live"), Some((1, Some(1))));
    assert_eq!(
        left_out(
            "allocator settings with a `#`, or blanks and a problem (replayed with the defaults)"
        ),
        Some((1, None))
    );
    assert_eq!(imported.summary.prologue, 1);
    let header = imported.to_text("x.pickle");
    assert!(
        header.contains("# left out: 1 × free of an address not live (first at trace entry 1)\n"),
        "{header}"
    );
    assert!(
        header.contains("# left out: 1 × block of a negative size\n"),
        "{header}"
    );
}

/// torch_npu's snapshots carry no allocator settings: expandable segments are inferred from
/// the segments (or the map entries). Settings with blanks are kept in canonical form.
#[test]
fn expandable_segments_are_inferred_and_settings_with_blanks_kept_canonical() {
    use Action::{Alloc, SegmentMap};
    let history = vec![
        entry(SegmentMap, 0x10_0000, 20 << 20, 0, 1),
        entry(Alloc, 0x10_0000, 4096, 0, 2),
    ];
    let snapshot = Snapshot {
        device_traces: vec![history.clone()],
        ..Snapshot::default()
    };
    let (imported, _) = import_lines(&snapshot);
    assert_eq!(
        imported.trace.conf.as_deref(),
        Some("expandable_segments:True")
    );
    assert_eq!(imported.summary.notes, [ImportNote::ExpandableInferred]);
    // From an expandable segment alone, too.
    let snapshot = Snapshot {
        segments: vec![Segment {
            is_expandable: true,
            ..small_segment(vec![block(0x10_0000, 2 << 20, BlockState::Inactive)])
        }],
        device_traces: vec![vec![entry(Alloc, 0x40_0000, 4096, 0, 1)]],
        ..Snapshot::default()
    };
    assert_eq!(
        import_lines(&snapshot).0.trace.conf.as_deref(),
        Some("expandable_segments:True")
    );
    // Settings given: they say what the allocator ran with, blanks or not.
    let mut settings = alloc_snapshot::AllocatorSettings::from_conf(&Default::default());
    settings.alloc_conf = "garbage_collection_threshold:0.8, max_split_size_mb:512".into();
    let snapshot = Snapshot {
        allocator_settings: Some(settings),
        device_traces: vec![history],
        ..Snapshot::default()
    };
    let (imported, _) = import_lines(&snapshot);
    assert_eq!(
        imported.trace.conf.as_deref(),
        Some("max_split_size_mb:512,garbage_collection_threshold:0.8")
    );
    assert_eq!(imported.summary.notes, [ImportNote::SettingsCanonical]);
}

/// A block whose free came before the history and that still waits at its end: allocated,
/// recorded on a stream that never completes and freed, so it ends pending (active, not
/// allocated) as in the snapshot. Segments of private pools are noted.
#[test]
fn a_block_pending_since_before_the_history_ends_pending() {
    use Action::Alloc;
    let snapshot = Snapshot {
        segments: vec![Segment {
            active_size: 1 << 20,
            segment_pool_id: (0, 1),
            ..small_segment(vec![
                block(0x10_0000, 1 << 20, BlockState::ActivePendingFree),
                block(0x20_0000, 1 << 20, BlockState::Inactive),
            ])
        }],
        device_traces: vec![vec![entry(Alloc, 0x40_0000, 4096, 0, 1)]],
        ..Snapshot::default()
    };
    let (imported, body) = import_lines(&snapshot);
    assert_eq!(
        body,
        [
            "alloc p0 1048576 0",
            "record p0 1",
            "free p0",
            "reset_peak",
            "stats prologue",
            "alloc a0 4096 0",
            "stats end"
        ]
    );
    assert_eq!(
        imported.summary.notes,
        [
            ImportNote::PrivatePools { segments: 1 },
            ImportNote::PendingBeforeHistory { blocks: 1 }
        ]
    );
    let setup = alloc_trace::Setup::from_trace(
        &imported.trace,
        alloc_conf::AllocConf::default(),
        None,
        None,
    );
    let report = alloc_trace::replay(&imported.trace, &setup).unwrap();
    let end = &report.end.stats;
    // With the default 32-byte pad: 4096 + 32 rounds to 4608, 1 MiB + 32 to 1 MiB + 512.
    assert_eq!(end.allocated_bytes.all.current, 4608);
    assert_eq!(end.active_bytes.all.current, (1 << 20) + 512 + 4608);
}

#[test]
fn a_double_free_is_left_out_and_does_not_make_a_prologue_block() {
    use Action::{Alloc, FreeRequested};
    let snapshot = Snapshot {
        device_traces: vec![vec![
            entry(FreeRequested, 0x30_0000, 1024, 0, 1),
            entry(Alloc, 0x20_0000, 4096, 0, 2),
            entry(FreeRequested, 0x20_0000, 4096, 0, 3),
            entry(FreeRequested, 0x20_0000, 4096, 0, 4),
            entry(FreeRequested, 0x30_0000, 1024, 0, 5),
            entry(FreeRequested, 0x20_0000, 4096, 0, 6),
        ]],
        ..Snapshot::default()
    };
    let (imported, body) = import_lines(&snapshot);
    // 0x30_0000 predates the history (its first free); 0x20_0000 is allocated in it, and its
    // second and third frees, like 0x30_0000's second, are double frees.
    assert_eq!(
        body,
        [
            "alloc p0 1024 0",
            "reset_peak",
            "stats prologue",
            "free p0",
            "alloc a0 4096 0",
            "free a0",
            "stats end"
        ]
    );
    let s = &imported.summary;
    assert_eq!(
        (s.prologue, s.prologue_freed, s.allocs, s.frees),
        (1, 1, 1, 2)
    );
    let left_out = s.warnings.get("free of an address not live").unwrap();
    assert_eq!((left_out.count, left_out.first_entry), (3, Some(3)));

    // The double free does not take the first free's completion: that completes two entries
    // after its request, so the free waits on a stream of its own.
    let snapshot = Snapshot {
        device_traces: vec![vec![
            entry(Alloc, 0x20_0000, 4096, 0, 1),
            entry(FreeRequested, 0x20_0000, 4096, 0, 2),
            entry(FreeRequested, 0x20_0000, 4096, 0, 3),
            entry(Action::FreeCompleted, 0x20_0000, 4096, 0, 4),
        ]],
        ..Snapshot::default()
    };
    let (_, body) = import_lines(&snapshot);
    assert_eq!(
        body,
        [
            "reset_peak",
            "stats prologue",
            "alloc a0 4096 0",
            "record a0 1",
            "free a0",
            "complete 1",
            "stats end"
        ]
    );
}

/// torch_npu's snapshot adds its workspace allocator's blocks (`Module.cpp`'s
/// `_npu_memorySnapshot`, `NPUWorkspaceAllocator::get_trace` and `get_segm`): a one-block
/// segment each, and at the front of the trace a `workspace_snapshot`, `segment_alloc` and
/// `alloc` of the block's whole size. None of it is the caching allocator's.
#[test]
fn torch_npu_workspace_blocks_become_device_overhead() {
    use Action::{Alloc, FreeRequested, SegmentAlloc, WorkspaceSnapshot};
    const WS: i64 = 0x7f00_1234_0000; // torch_npu's stream handles are never 0
    const WORKSPACE: i64 = 0x9000_0000;
    let workspace_segment = Segment {
        address: WORKSPACE,
        total_size: 6 << 20,
        allocated_size: 6 << 20,
        active_size: 6 << 20,
        requested_size: 5 << 20,
        stream: WS,
        segment_type: SegmentType::Large,
        blocks: vec![block(WORKSPACE, 6 << 20, BlockState::ActiveAllocated)],
        ..small_segment(Vec::new())
    };
    let snapshot = Snapshot {
        segments: vec![
            small_segment(vec![
                block(0x10_0000, 512, BlockState::ActiveAllocated),
                block(0x10_0200, (2 << 20) - 512, BlockState::Inactive),
            ]),
            workspace_segment,
        ],
        device_traces: vec![vec![
            entry(WorkspaceSnapshot, WORKSPACE, 6 << 20, WS, 0),
            entry(SegmentAlloc, WORKSPACE, 6 << 20, WS, 0),
            entry(Alloc, WORKSPACE, 6 << 20, WS, 0),
            entry(Alloc, 0x20_0000, 1000, WS, 1),
            entry(FreeRequested, 0x20_0000, 1000, WS, 2),
            // A later alloc at a workspace address is history: the caching allocator had the
            // range before the workspace did.
            entry(Alloc, WORKSPACE, 4096, WS, 3),
            entry(FreeRequested, WORKSPACE, 4096, WS, 4),
        ]],
        ..Snapshot::default()
    };
    let (imported, lines) = import_lines(&snapshot);
    assert_eq!(
        lines,
        [
            "device_overhead 6291456",
            "alloc p0 512 0",
            "reset_peak",
            "stats prologue",
            "alloc a0 1000 1",
            "free a0",
            "alloc a1 4096 1",
            "free a1",
            "stats end"
        ]
    );
    let s = &imported.summary;
    assert_eq!((s.workspace_blocks, s.workspace_bytes), (1, 6 << 20));
    assert_eq!((s.prologue, s.allocs, s.frees), (1, 2, 2));
    // The workspace's stream appears in the history only through the caching allocator's own
    // entries: stream 0 is the prologue segment's.
    assert_eq!(s.streams, [0, WS]);
    assert!(s.skipped.is_empty() && s.warnings.is_empty(), "{s:?}");
    assert!(
        imported
            .to_text("npu.pickle")
            .contains("# workspace: 1 blocks of torch_npu's workspace allocator, 6291456 bytes, as device_overhead\n")
    );
}

#[test]
fn a_snapshot_without_history_or_without_the_device_is_refused() {
    let empty = Snapshot::default();
    assert_eq!(
        import_snapshot(&empty, &ImportOptions::default(), None).unwrap_err(),
        ImportError::NoHistory
    );
    let one = Snapshot {
        device_traces: vec![vec![], vec![entry(Action::Alloc, 0x1000, 1, 0, 0)]],
        ..Snapshot::default()
    };
    let options = ImportOptions {
        device: Some(0),
        capacity: None,
    };
    let e = import_snapshot(&one, &options, None).unwrap_err();
    assert_eq!(
        e,
        ImportError::NoSuchDevice {
            device: 0,
            available: vec![1]
        }
    );
    assert_eq!(
        e.to_string(),
        "device 0 has no trace entries; devices with some: [1]"
    );
    let imported = import_snapshot(&one, &ImportOptions::default(), None).unwrap();
    assert_eq!(imported.summary.device, 1);
}

/// `trace` replayed with its whole history, and the end state as a PyTorch snapshot pickle.
fn replayed_snapshot(trace: &alloc_trace::Trace, setup: &Setup) -> (alloc_trace::Report, Vec<u8>) {
    let observe = Observe {
        history: Some(1 << 20),
        ..Observe::default()
    };
    let (report, observed) = replay_observed(trace, setup, None, &observe).unwrap();
    let end = observed.end.unwrap();
    let mut snapshot = Snapshot::new(Some(&end.conf));
    snapshot.add_device(0, &end.segments, &end.history).unwrap();
    (report, snapshot.to_pickle().unwrap())
}

#[test]
fn a_replays_own_snapshot_imports_back_to_the_same_figures() {
    let original = load(GPT2).unwrap();
    let (report, pickle) = replayed_snapshot(&original, &cuda_setup(&original));
    // Through the pickle and back.
    let read = alloc_snapshot::read(&pickle).unwrap();
    // Our segments tile, as torch's do.
    assert!(read.warnings.is_empty(), "{:?}", read.warnings);
    let snapshot = read.snapshot;
    let imported = import_snapshot(&snapshot, &ImportOptions::default(), None).unwrap();
    // The history began with the trace, so nothing predates it.
    assert_eq!(imported.summary.prologue, 0);
    assert_eq!(imported.summary.allocs, report.counts.allocs);
    assert_eq!(imported.summary.frees, report.counts.frees);
    assert_eq!(imported.summary.skipped.get("segment_alloc"), Some(&240));
    let again = replay(&imported.trace, &cuda_setup(&imported.trace)).unwrap();
    assert_eq!(
        again.end.stats.reserved_bytes.all.peak,
        report.end.stats.reserved_bytes.all.peak
    );
    assert_eq!(again.end.stats.segment.all.current, 240);
    assert_eq!(
        again.end.stats.allocated_bytes.all.current,
        report.end.stats.allocated_bytes.all.current
    );
}

/// `text` replayed with its history, exported, read back and imported (with the trace's
/// capacity when it has one), then the import replayed: (the original's report, the import,
/// the import's report).
fn round_trip(
    text: &str,
) -> (
    alloc_trace::Report,
    alloc_trace::Imported,
    alloc_trace::Report,
) {
    let conf_of = |t: &alloc_trace::Trace| alloc_conf::parse(t.conf.as_deref().unwrap_or("")).conf;
    let original = parse_str("t.trace", text).unwrap();
    let setup = Setup::from_trace(&original, conf_of(&original), None, None);
    let (report, pickle) = replayed_snapshot(&original, &setup);
    let snapshot = alloc_snapshot::read(&pickle).unwrap().snapshot;
    let options = ImportOptions {
        capacity: original.capacity,
        ..ImportOptions::default()
    };
    let imported = import_snapshot(&snapshot, &options, None).unwrap();
    let text = imported.to_text("t.pickle");
    let parsed = parse_str("imported.trace", &text).unwrap();
    let again = replay(
        &parsed,
        &Setup::from_trace(&parsed, conf_of(&parsed), None, None),
    )
    .unwrap();
    (report, imported, again)
}

/// The figures an import's replay must share with the original's: what the device holds at
/// the end, and the device calls and retries it took to get there.
fn assert_replays_alike(report: &alloc_trace::Report, again: &alloc_trace::Report) {
    let figures = |r: &alloc_trace::Report| {
        let s = &r.end.stats;
        (
            s.reserved_bytes.all.current,
            s.num_device_alloc,
            s.num_device_free,
            s.num_alloc_retries,
            r.counts.ooms,
        )
    };
    assert_eq!(figures(again), figures(report));
}

/// The caller's `empty_cache` shows in a snapshot only as its segment frees: a run of them that
/// no segment request follows, or one whose request would have fitted without it, is replayed
/// as `empty_cache`; the retry chain's runs, which end in the segment request they made room
/// for (or in its `oom`), are not.
#[test]
fn the_callers_empty_cache_is_imported_and_the_allocators_releases_are_not() {
    // With the capacity: the 2 MiB segment after the release fits a 1 GiB device.
    let (report, imported, again) =
        round_trip("capacity 1G\npad 0\nalloc a 3M\nfree a\nempty_cache\nalloc b 1000\n");
    assert_eq!(imported.summary.empty_caches, 1);
    assert_eq!(report.end.stats.segment.all.current, 1);
    assert_eq!(again.end.stats.segment.all.current, 1);
    assert_eq!(again.end.stats.reserved_bytes.all.current, 2 << 20);
    assert_eq!(again.end.stats.num_device_free, 1);
    assert!(imported.to_text("t").contains("\nempty_cache\n"));

    // Without it, the history's peak is what the device is known to hold: the second release
    // (20 MiB reserved, then a 2 MiB segment, within the 100 MiB peak) is the caller's; the
    // first (100 MiB, then 20 MiB more) may have been the retry chain's and is left to the
    // replay's allocator.
    let text = "pad 0\nalloc x 100M\nfree x\nempty_cache\nalloc a 3M\nfree a\nempty_cache\n\
                alloc b 1000\n";
    let (report, imported, again) = round_trip(text);
    assert_eq!(imported.summary.empty_caches, 1);
    assert_eq!(report.end.stats.reserved_bytes.all.current, 2 << 20);
    // The replay keeps the 100 MiB segment and takes `a` from it; the second release frees it.
    assert_eq!(again.end.stats.reserved_bytes.all.current, 2 << 20);

    // 40 MiB: the 36 MiB request releases the cached 30 MiB segment (the retry chain: 30 + 36
    // MiB does not fit) and gets its segment; a 50 MiB request then runs out. With the
    // capacity, the failed request is replayed as one that runs out of memory too, and its free
    // is skipped; the last line's release is the caller's.
    let text = "capacity 40M\npad 0\nalloc a 30M\nfree a\nalloc b 36M\nalloc c 50M\nfree b\n\
                empty_cache\n";
    let (report, imported, again) = round_trip(text);
    assert_eq!(report.counts.ooms, 1);
    assert_eq!(imported.summary.empty_caches, 1, "only the last line's");
    assert_eq!(imported.summary.failed_requests, 1);
    assert_eq!(again.end.stats.reserved_bytes.all.current, 0);
    assert_replays_alike(&report, &again);
}

/// Without a capacity an `oom` entry cannot be replayed as one: skipped, with a note.
#[test]
fn failed_requests_without_a_capacity_are_skipped_with_a_note() {
    let mut snapshot = Snapshot::new(None);
    let history = vec![
        entry(Action::Alloc, 0x1000, 512, 0, 1),
        entry(Action::Oom, 0, 1 << 30, 0, 2),
        entry(Action::Other("weird".into()), 0x1000, 512, 0, 2),
        entry(Action::FreeRequested, 0x1000, 512, 0, 3),
        entry(Action::FreeCompleted, 0x1000, 512, 0, 3),
    ];
    snapshot.segments.push(small_segment(vec![block(
        0x1000,
        2 << 20,
        BlockState::Inactive,
    )]));
    snapshot.device_traces.push(history);
    let (imported, lines) = import_lines(&snapshot);
    assert_eq!(imported.summary.failed_requests, 0);
    assert!(
        imported
            .summary
            .notes
            .contains(&ImportNote::OomsWithoutCapacity { entries: 1 }),
        "{:?}",
        imported.summary.notes
    );
    assert!(!lines.iter().any(|l| l.starts_with("alloc o")), "{lines:?}");
    // The header says why each kind of entry was skipped.
    let header = imported.to_text("t.pickle");
    assert!(
        header.contains("# skipped: 1 oom entries (failed requests: --capacity replays them)\n"),
        "{header}"
    );
    assert!(
        header.contains("# skipped: 1 weird entries (an action npu-alloc does not know)\n"),
        "{header}"
    );
}

/// torch_npu names each entry's pool: a private pool's allocations replay in a pool of the
/// trace, released where its first segment is freed (torch frees a pool's segments only once it
/// is released), so the next request gets a segment of its own as it did.
#[test]
fn private_pools_come_back_from_torch_npus_per_entry_pool_ids() {
    let text = "pad 0\npool p\nuse_pool p\nalloc e 7M\nend_pool\nfree e\nrelease_pool p\n\
                alloc f 7M\n";
    let (report, imported, again) = round_trip(text);
    assert_eq!(imported.summary.pools, 1);
    assert!(
        imported.summary.notes.is_empty(),
        "{:?}",
        imported.summary.notes
    );
    let text = imported.to_text("t");
    for line in [
        "pool pool_0_1",
        "use_pool pool_0_1",
        "end_pool",
        "release_pool pool_0_1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}: {text}");
    }
    assert_eq!(report.end.stats.num_device_alloc, 2);
    assert_replays_alike(&report, &again);
}

/// The retry chain's releases are left to the replay's allocator: with `max_split_size_mb` it
/// frees the requesting private pool's own cached segment (a pool that stays in use, so no
/// `release_pool`), and under a fraction a request past the limit releases too, though the
/// device's capacity would have held it.
#[test]
fn the_retry_chains_releases_in_a_pool_and_under_a_fraction_stay_the_allocators() {
    let text = "capacity 100M\nconf max_split_size_mb:25\npool P\nuse_pool P\nalloc a 30M\n\
                end_pool\nfree a\nalloc d 50M\nuse_pool P\nalloc b 40M\nend_pool\nuse_pool P\n\
                alloc c 1M\nend_pool\nfree b\nfree c\nfree d\nrelease_pool P\n";
    let (report, imported, again) = round_trip(text);
    assert_eq!(report.end.stats.num_alloc_retries, 2);
    assert!(
        imported.summary.warnings.is_empty(),
        "{:?}",
        imported.summary.warnings
    );
    let text = imported.to_text("t");
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("release_pool"))
            .count(),
        1,
        "{text}"
    );
    assert!(
        !text.contains("empty_cache\n"),
        "a pool's release only: {text}"
    );
    assert_eq!(report.counts.ooms, 1);
    assert_replays_alike(&report, &again);

    let text = "capacity 100M\nconf per_process_memory_fraction:0.5\nalloc a 30M\nfree a\n\
                alloc b 40M\nfree b\n";
    let (report, imported, again) = round_trip(text);
    assert_eq!(report.end.stats.num_alloc_retries, 1);
    assert_eq!(imported.summary.empty_caches, 0);
    assert_replays_alike(&report, &again);
}

/// A released pool's segment that still held a live block is freed by a later `empty_cache`:
/// that run frees only a pool's segment, but the pool was released before it, so it is the
/// caller's `empty_cache` all the same.
#[test]
fn an_empty_cache_after_a_pools_release_comes_back() {
    let text = "pad 0\npool p\nuse_pool p\nalloc a 12M\nalloc b 12M\nend_pool\nfree a\n\
                release_pool p\nfree b\nempty_cache\n";
    let (report, imported, again) = round_trip(text);
    assert_eq!(
        imported.summary.empty_caches,
        1,
        "{}",
        imported.to_text("t")
    );
    assert_eq!(report.end.stats.reserved_bytes.all.current, 0);
    assert_replays_alike(&report, &again);
}

/// A pool's retry chain frees its own cached segment, then synchronizes without the lock,
/// where another thread's entry may land: the run no longer ends in the pool's request, but
/// the pool is allocated to later, so it was not released (torch never reuses a pool's id).
#[test]
fn a_pool_allocated_to_later_is_not_released_by_a_split_run() {
    const MIB: i64 = 1 << 20;
    let pooled = |pool: i64, mut e: TraceEntry| {
        e.pool_id = Some((0, pool));
        e
    };
    for interleave in [false, true] {
        let mut history = vec![
            pooled(1, entry(Action::SegmentAlloc, 0x4000_0000, 20 * MIB, 0, 1)),
            pooled(1, entry(Action::Alloc, 0x4000_0000, 20 * MIB, 0, 2)),
            pooled(1, entry(Action::FreeRequested, 0x4000_0000, 20 * MIB, 0, 3)),
            pooled(1, entry(Action::FreeCompleted, 0x4000_0000, 20 * MIB, 0, 3)),
            pooled(1, entry(Action::SegmentFree, 0x4000_0000, 20 * MIB, 0, 4)),
        ];
        if interleave {
            history.push(pooled(0, entry(Action::Alloc, 0x10_0000, 512, 0, 5)));
        }
        history.extend([
            pooled(1, entry(Action::SegmentAlloc, 0x8000_0000, 40 * MIB, 0, 6)),
            pooled(1, entry(Action::Alloc, 0x8000_0000, 40 * MIB, 0, 7)),
            pooled(1, entry(Action::FreeRequested, 0x8000_0000, 40 * MIB, 0, 8)),
            pooled(1, entry(Action::FreeCompleted, 0x8000_0000, 40 * MIB, 0, 8)),
        ]);
        let state = if interleave {
            BlockState::ActiveAllocated
        } else {
            BlockState::Inactive
        };
        let snapshot = Snapshot {
            segments: vec![small_segment(vec![block(0x10_0000, 2 << 20, state)])],
            device_traces: vec![history],
            ..Snapshot::default()
        };
        let (imported, lines) = import_lines(&snapshot);
        assert!(imported.summary.warnings.is_empty(), "{lines:?}");
        assert!(
            !lines.iter().any(|l| l.starts_with("release_pool")),
            "{lines:?}"
        );
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("use_pool")).count(),
            2,
            "{lines:?}"
        );
    }
}
