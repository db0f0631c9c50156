//! torch's `_record_memory_history`, `_snapshot` and `_dump_snapshot` over simulated devices;
//! the file is read back by Python's own `pickle`.
#![cfg(not(loom))]

mod sim;

use alloc_sim::SimStream;
use alloc_snapshot::{Action, BlockState, SegmentType};
use npu_runtime::Config;

const MIB: u64 = 1 << 20;
const S0: SimStream = SimStream(0);
const S1: SimStream = SimStream(1);

#[test]
fn a_dumped_snapshot_reads_back_in_python_with_the_totals_of_memory_stats() {
    let rt = sim::runtime(2, 256 * MIB, Config::default());
    rt.record_memory_history(true, 1000);
    let a = rt.malloc(3 * MIB, 0, S0).unwrap();
    let b = rt.malloc(1000, 0, S0).unwrap();
    let c = rt.malloc(30 * MIB, 1, S1).unwrap();
    let d = rt.malloc(5 * MIB, 0, S0).unwrap();
    rt.record_stream(d, S1).unwrap();
    rt.free(d).unwrap(); // pending on stream 1's event
    rt.free(b).unwrap();
    let pool = rt.mem_pool(1).unwrap();
    let e = {
        let _scope = rt.use_mem_pool(&pool).unwrap();
        rt.malloc(2 * MIB, 1, S0).unwrap()
    };
    assert!(rt.malloc(1 << 40, 1, S0).unwrap_err().is_out_of_memory());

    let snap = rt.snapshot().unwrap();
    let totals = snap.totals();
    let dir = std::env::temp_dir().join(format!("npu-alloc-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rt.pickle");
    rt.dump_snapshot(&path).unwrap();
    let py = testkit::python_snapshot::read_with_python(&path);
    std::fs::remove_dir_all(&dir).unwrap();

    let mut expected = Vec::new();
    for device in 0..2 {
        let stats = rt.device_stats(device).unwrap();
        expected.push((
            i64::from(device),
            stats.segment.all.current as u64,
            stats.reserved_bytes.all.current as u64,
            stats.allocated_bytes.all.current as u64,
        ));
    }
    assert_eq!(py.devices, expected);
    assert_eq!(
        totals.reserved,
        expected.iter().map(|d| d.2).sum::<u64>(),
        "reserved = Σ segment sizes"
    );
    assert_eq!(totals.allocated, expected.iter().map(|d| d.3).sum::<u64>());
    // Device 0: a (3 MiB + pad → 4 MiB block of a 20 MiB segment), b freed (small pool), d
    // pending; device 1: c and the pool's block.
    assert_eq!(expected[0].3, 3 * MIB + 512);
    assert_eq!(totals.blocks[1], 1, "one block pending on stream 1's event");
    assert_eq!(py.pool_ids, ["(0,0)", "(0,1)"]);
    assert_eq!(
        py.actions,
        [
            "alloc",
            "free_completed",
            "free_requested",
            "oom",
            "segment_alloc",
            "snapshot"
        ]
    );
    assert_eq!(py.trace_lengths.len(), 2, "one trace per device");
    let count = |dev: usize, action: Action| {
        snap.device_traces[dev]
            .iter()
            .filter(|e| e.action == action)
            .count()
    };
    assert_eq!(count(0, Action::Alloc), 3);
    assert_eq!(count(0, Action::FreeRequested), 2);
    // b completes at once (no other stream used it); d waits for stream 1's event.
    assert_eq!(count(0, Action::FreeCompleted), 1);
    assert_eq!(count(1, Action::Alloc), 2);
    assert_eq!(count(1, Action::Oom), 1);
    // A snapshot's own entry shows in the next one (the dump's), as in torch_npu, whose
    // `snapshot()` copies the trace before it records the entry.
    assert_eq!(count(0, Action::Snapshot), 0);
    let oom = snap.device_traces[1]
        .iter()
        .find(|e| e.action == Action::Oom)
        .unwrap();
    // torch records the rounded size (`params.size()`): 2^40 + the 32-byte pad, rounded to 512.
    assert_eq!((oom.addr, oom.size), (None, (1 << 40) + 512));
    assert!(oom.device_free.unwrap() > 0);
    // Time is the epoch in microseconds, from a monotonic clock.
    let first = snap.device_traces[0][0].time_us;
    assert!(first > 1_700_000_000_000_000, "{first}");
    let pool_segment = snap
        .segments
        .iter()
        .find(|s| s.segment_pool_id == (0, 1))
        .unwrap();
    assert_eq!(pool_segment.device, 1);
    assert_eq!(pool_segment.segment_type, SegmentType::Large);
    assert_eq!(pool_segment.blocks[0].state, BlockState::ActiveAllocated);
    let settings = snap.allocator_settings.as_ref().unwrap();
    assert_eq!(settings.max_split_size, -1);
    for p in [a, c, e] {
        rt.free(p).unwrap();
    }
}

#[test]
fn history_is_off_by_default_follows_devices_opened_later_and_forgets_when_turned_off() {
    let rt = sim::runtime(2, 64 * MIB, Config::default());
    let x = rt.malloc(1000, 0, S0).unwrap();
    rt.free(x).unwrap();
    assert!(
        rt.snapshot()
            .unwrap()
            .device_traces
            .iter()
            .all(Vec::is_empty)
    );
    rt.record_memory_history(true, 2);
    // Device 1 opens after history was turned on.
    let y = rt.malloc(1000, 1, S0).unwrap();
    rt.free(y).unwrap();
    let names = |snap: &alloc_snapshot::Snapshot| -> Vec<String> {
        snap.device_traces[1]
            .iter()
            .map(|e| e.action.name().to_owned())
            .collect()
    };
    // The last 2 of segment_alloc, alloc, free_requested, free_completed; the snapshot's own
    // entry comes after its copy of the trace, as in torch_npu, and shows in the next one.
    assert_eq!(
        names(&rt.snapshot().unwrap()),
        ["free_requested", "free_completed"]
    );
    assert_eq!(
        names(&rt.snapshot().unwrap()),
        ["free_completed", "snapshot"]
    );
    // The per-device memory_snapshot() records nothing (torch_npu's goes through snapshot(),
    // which Runtime::snapshot is).
    rt.memory_snapshot(1).unwrap();
    assert_eq!(names(&rt.snapshot().unwrap()), ["snapshot", "snapshot"]);
    rt.memory_snapshot(1).unwrap();
    rt.memory_snapshot(0).unwrap();
    assert_eq!(names(&rt.snapshot().unwrap()), ["snapshot", "snapshot"]);
    rt.record_memory_history(false, 0);
    let snap = rt.snapshot().unwrap();
    assert!(snap.device_traces.iter().all(Vec::is_empty));
    assert_eq!(snap.totals().segments, 2, "the cached segments stay");
}
