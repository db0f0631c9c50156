//! The snapshot importer on arbitrary histories: whatever the entries say (frees of addresses
//! never allocated, allocations of live addresses, completions out of order, several streams,
//! pending blocks at the end, segment frees and failed requests, private pools used before or
//! after their release), the import succeeds, its text parses back to the same operations and
//! the trace replays to the end, with and without a capacity. The bytes are also tried as a pickle, so a corpus of real
//! snapshots reaches the importer through the reader.
#![no_main]

use alloc_snapshot::{Action, Block, BlockState, Segment, SegmentType, Snapshot, TraceEntry};
use alloc_trace::{ImportOptions, OpKind, Setup, import_snapshot, parse_str, replay};
use libfuzzer_sys::fuzz_target;

const STREAMS: [i64; 3] = [0, 0x7f00_0000, 0x7f80_0000];

fn check(snapshot: &Snapshot, capacity: Option<u64>) {
    let options = ImportOptions {
        capacity,
        ..ImportOptions::default()
    };
    let Ok(imported) = import_snapshot(snapshot, &options, None) else {
        return;
    };
    let text = imported.to_text("fuzz.pickle");
    let parsed = parse_str("fuzz.trace", &text).expect("the import's text parses");
    let kinds = |t: &alloc_trace::Trace| t.ops.iter().map(|o| o.kind.clone()).collect::<Vec<_>>();
    assert_eq!(kinds(&parsed), kinds(&imported.trace));
    let allocs = parsed
        .ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Alloc { .. }))
        .count() as u64;
    let s = &imported.summary;
    assert_eq!(allocs, s.allocs + s.prologue + s.failed_requests);
    let setup = Setup::from_trace(&parsed, Default::default(), Some(1 << 30), Some(0));
    if let Err(f) = replay(&parsed, &setup) {
        panic!("the imported trace stops at line {}: {}\n{text}", f.line, f.error);
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(read) = alloc_snapshot::read(data) {
        check(&read.snapshot, None);
        check(&read.snapshot, Some(1 << 30));
    }
    let Some((&head, body)) = data.split_first() else {
        return;
    };
    // The end state: up to 3 blocks in one segment, in states the first byte picks.
    let blocks: Vec<Block> = (0..head % 4)
        .map(|i| Block {
            address: 0x1000 * (i64::from(i) + 1),
            size: 0x1000,
            requested_size: 0x800,
            state: match (head >> (2 + 2 * i)) % 3 {
                0 => BlockState::ActiveAllocated,
                1 => BlockState::ActivePendingFree,
                _ => BlockState::Inactive,
            },
            frames: Vec::new(),
        })
        .collect();
    let segments = vec![Segment {
        device: 0,
        address: 0x1000,
        total_size: 0x1000 * blocks.len() as i64,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream: 0,
        segment_type: SegmentType::Large,
        segment_pool_id: (0, 0),
        is_expandable: false,
        frames: Vec::new(),
        blocks,
    }];
    // The history: 4 bytes per entry (action, address among 8, size, stream and pool).
    let entries = body
        .chunks_exact(4)
        .enumerate()
        .map(|(i, c)| TraceEntry {
            action: match c[0] % 8 {
                0 | 1 => Action::Alloc,
                2 => Action::FreeRequested,
                3 => Action::FreeCompleted,
                4 => Action::SegmentAlloc,
                5 => Action::SegmentFree,
                6 => Action::Oom,
                _ => Action::Other("fuzz".into()),
            },
            addr: (c[0] % 8 != 6).then(|| 0x1000 * (i64::from(c[1] % 8) + 1)),
            device_free: (c[0] % 8 == 6).then_some(1 << 20),
            size: i64::from(c[2]) * 4096 + 1,
            stream: STREAMS[usize::from(c[3] % 3)],
            // The default pools, or one of two private pools.
            pool_id: Some((0, i64::from(c[3] / 3 % 3))),
            time_us: i as i64,
            compile_context: "N/A".into(),
            user_metadata: String::new(),
            frames: Vec::new(),
        })
        .collect();
    let snapshot = Snapshot {
        segments,
        device_traces: vec![entries],
        ..Snapshot::default()
    };
    check(&snapshot, None);
    check(&snapshot, Some(1 << 30));
});
