//! The allocation history (torch's `_record_memory_history`): which entries each operation
//! records, their fields, the bound of the ring, and nothing while off.

mod common;

use alloc_core::{Action, AllocConf};
use common::*;

fn actions(a: &alloc_core::Allocator<alloc_sim::TestDevice>) -> Vec<(&'static str, u64, u64)> {
    a.history()
        .0
        .iter()
        .map(|e| (e.action.name(), e.time_us, e.size))
        .collect()
}

#[test]
fn each_operation_records_torchs_entries() {
    let mut a = cuda(64 * MIB, &AllocConf::default());
    a.record_history(Some(100));
    a.set_time(1);
    let x = a.malloc(1000, S0).unwrap();
    a.set_time(2);
    a.record_stream(x, S1).unwrap();
    a.free(x).unwrap();
    a.set_time(3);
    a.empty_cache().unwrap();
    a.set_time(4);
    assert!(a.malloc(100 * MIB, S0).is_err());
    let y = a.malloc(3000, S0).unwrap();
    assert_ne!(y, 0);
    a.mark_snapshot();
    assert_eq!(
        actions(&a),
        [
            ("segment_alloc", 1, 2 * MIB),
            ("alloc", 1, 1000),
            ("free_requested", 2, 1000),
            // The free completes when empty_cache synchronizes (the block was used on stream 1).
            ("free_completed", 3, 1000),
            ("segment_free", 3, 2 * MIB),
            ("oom", 4, 100 * MIB),
            ("segment_alloc", 4, 2 * MIB),
            ("alloc", 4, 3000),
            // Its size is torch's total_active: the active bytes (3000 rounded to 3072).
            ("snapshot", 4, 3072),
        ]
    );
    let (entries, dropped) = a.history();
    assert_eq!(dropped, 0);
    assert_eq!(entries[1].addr, x);
    assert_eq!(entries[1].stream, Some(S0));
    // The oom entry carries the device's free bytes.
    assert_eq!(entries[5].addr, 64 * MIB);
    assert_eq!(entries[5].action, Action::Oom);
}

#[test]
fn the_ring_keeps_the_last_entries_and_nothing_is_kept_while_off() {
    let mut a = cuda(64 * MIB, &AllocConf::default());
    let x = a.malloc(1000, S0).unwrap();
    a.free(x).unwrap();
    assert!(a.history().0.is_empty());
    a.record_history(Some(3));
    for _ in 0..4 {
        let x = a.malloc(1000, S0).unwrap();
        a.free(x).unwrap();
    }
    let (entries, dropped) = a.history();
    assert_eq!(entries.len(), 3);
    assert_eq!(dropped, 9);
    assert_eq!(entries[2].action, Action::FreeCompleted);
    // Asking again starts an empty ring, as torch_npu's recordHistory clears its buffer at
    // every call; a ring of 0 entries keeps 1 (its `std::max(size_t(1), ...)`).
    a.record_history(Some(3));
    let (entries, dropped) = a.history();
    assert!(entries.is_empty());
    assert_eq!(dropped, 0);
    a.record_history(Some(0));
    let x = a.malloc(1000, S0).unwrap();
    a.free(x).unwrap();
    let (entries, dropped) = a.history();
    assert_eq!(entries.len(), 1);
    assert_eq!(dropped, 2);
    assert_eq!(entries[0].action, Action::FreeCompleted);
    a.record_history(None);
    assert!(!a.recording_history());
    assert_eq!(a.history().1, 0);
}

#[test]
fn expandable_segments_record_maps_and_unmaps() {
    let mut a = cuda(GIB, &conf("expandable_segments:True"));
    a.record_history(Some(10));
    let x = a.malloc(8 * MIB, S0).unwrap();
    a.free(x).unwrap();
    a.empty_cache().unwrap();
    let names: Vec<_> = actions(&a).iter().map(|e| (e.0, e.2)).collect();
    assert_eq!(
        names,
        [
            ("segment_map", 20 * MIB),
            ("alloc", 8 * MIB),
            ("free_requested", 8 * MIB),
            ("free_completed", 8 * MIB),
            ("segment_unmap", 20 * MIB),
        ]
    );
}
