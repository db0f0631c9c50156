//! Shared helpers for the alloc-core integration tests.
#![allow(dead_code)]

use alloc_core::{AllocConf, Allocator, BlockState, DeviceFacts, StreamId};
use testkit::SimDevice;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const S0: StreamId = StreamId(0);
pub const S1: StreamId = StreamId(1);
pub const S2: StreamId = StreamId(2);

/// An allocator over a simulated device of `capacity` bytes, with CUDA parity (no pad).
pub fn cuda(capacity: u64, conf: &AllocConf) -> Allocator<SimDevice> {
    Allocator::new(SimDevice::new(capacity), conf, DeviceFacts::cuda_parity(0))
}

/// An allocator with torch_npu's 32-byte pad.
pub fn npu(capacity: u64, conf: &AllocConf) -> Allocator<SimDevice> {
    Allocator::new(SimDevice::new(capacity), conf, DeviceFacts::npu(0))
}

/// Parses a config string the way the runtime does (no warnings expected).
pub fn conf(s: &str) -> AllocConf {
    let parsed = alloc_conf::parse(s);
    assert!(parsed.warnings.is_empty(), "{s}: {:?}", parsed.warnings);
    parsed.conf
}

/// Looks a flat stat up by torch's key.
pub fn stat<D: alloc_core::Device>(a: &Allocator<D>, key: &str) -> i64 {
    a.stats()
        .flat()
        .into_iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no stat {key}"))
        .1
}

/// Checks every invariant of torch's `_check_memory_stat_consistency` plus the device ledger:
/// stats equal a recount from the snapshot, no two blocks overlap, reserved equals the device's
/// outstanding bytes.
pub fn check_consistency(a: &Allocator<SimDevice>) {
    let snap = a.snapshot();
    let s = a.stats();
    let mut reserved = [0i64; 2];
    let mut segments = [0i64; 2];
    let mut allocated = [0i64; 2];
    let mut allocations = [0i64; 2];
    let mut active = [0i64; 2];
    let mut active_bytes = [0i64; 2];
    let mut requested = [0i64; 2];
    let mut inactive_split = [0i64; 2];
    let mut inactive_split_bytes = [0i64; 2];
    let mut last_end = 0u64;
    for seg in &snap {
        let p = match seg.pool {
            alloc_core::PoolKind::Small => 0,
            alloc_core::PoolKind::Large => 1,
        };
        assert!(
            seg.address >= last_end,
            "segments overlap at {:#x}",
            seg.address
        );
        last_end = seg.address + seg.total_size;
        segments[p] += 1;
        reserved[p] += seg.total_size as i64;
        let mut addr = seg.address;
        for b in &seg.blocks {
            assert_eq!(b.address, addr, "blocks of a segment are contiguous");
            addr += b.size;
            match b.state {
                BlockState::ActiveAllocated => {
                    allocations[p] += 1;
                    allocated[p] += b.size as i64;
                }
                BlockState::Inactive if seg.blocks.len() > 1 => {
                    inactive_split[p] += 1;
                    inactive_split_bytes[p] += b.size as i64;
                }
                _ => {}
            }
            if b.state != BlockState::Inactive {
                active[p] += 1;
                active_bytes[p] += b.size as i64;
                requested[p] += b.requested_size as i64;
            }
        }
        assert_eq!(addr, seg.address + seg.total_size);
        // Two free neighbours would have been merged.
        for w in seg.blocks.windows(2) {
            assert!(
                !(w[0].state == BlockState::Inactive && w[1].state == BlockState::Inactive),
                "adjacent free blocks left unmerged at {:#x}",
                w[1].address
            );
        }
    }
    let check = |name: &str, array: &alloc_core::StatArray, v: [i64; 2]| {
        assert_eq!(array.small_pool.current, v[0], "{name}.small_pool.current");
        assert_eq!(array.large_pool.current, v[1], "{name}.large_pool.current");
        assert_eq!(array.all.current, v[0] + v[1], "{name}.all.current");
    };
    check("segment", &s.segment, segments);
    check("reserved_bytes", &s.reserved_bytes, reserved);
    check("allocation", &s.allocation, allocations);
    check("allocated_bytes", &s.allocated_bytes, allocated);
    check("active", &s.active, active);
    check("active_bytes", &s.active_bytes, active_bytes);
    check("requested_bytes", &s.requested_bytes, requested);
    check("inactive_split", &s.inactive_split, inactive_split);
    check(
        "inactive_split_bytes",
        &s.inactive_split_bytes,
        inactive_split_bytes,
    );
    assert_eq!(
        a.device().outstanding_bytes() as i64,
        reserved[0] + reserved[1],
        "reserved == device outstanding"
    );
    assert!(s.allocated_bytes.all.current <= s.active_bytes.all.current);
    assert!(s.active_bytes.all.current <= s.reserved_bytes.all.current);
}
