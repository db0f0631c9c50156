//! The allocator's invariants, checked from the outside: every stat equals a recount from the
//! snapshot (torch's `_check_memory_stat_consistency`), blocks tile their segments without
//! overlap, no two free neighbours are left unmerged, and reserved equals what the device has
//! handed out. Property tests and `cargo xtask stress` call this after every operation.

use core::fmt;

use alloc_core::{Allocator, BlockState, PoolKind, StatArray};

use crate::sim_device::SimDevice;

/// The first invariant found broken, with the numbers that disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inconsistency {
    /// Two segments overlap.
    SegmentOverlap {
        /// Address of the second segment.
        addr: u64,
    },
    /// A segment's blocks do not tile it exactly.
    BlocksNotContiguous {
        /// Address of the segment.
        segment: u64,
    },
    /// Two adjacent free blocks were left unmerged.
    Unmerged {
        /// Address of the second block.
        addr: u64,
    },
    /// A stat differs from the recount.
    Stat {
        /// torch's key, e.g. `allocated_bytes.small_pool.current`.
        key: String,
        /// What the allocator reports.
        reported: i64,
        /// What the snapshot adds up to.
        recounted: i64,
    },
    /// Reserved bytes differ from the device's outstanding bytes.
    DeviceLedger {
        /// `reserved_bytes.all.current`.
        reserved: i64,
        /// Bytes the device has handed out.
        device: u64,
    },
    /// allocated ≤ active ≤ reserved does not hold.
    Ordering {
        /// allocated bytes.
        allocated: i64,
        /// active bytes.
        active: i64,
        /// reserved bytes.
        reserved: i64,
    },
}

impl fmt::Display for Inconsistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Inconsistency::SegmentOverlap { addr } => {
                write!(f, "segment at {addr:#x} overlaps the one before")
            }
            Inconsistency::BlocksNotContiguous { segment } => {
                write!(f, "blocks of segment {segment:#x} do not tile it")
            }
            Inconsistency::Unmerged { addr } => write!(
                f,
                "free block at {addr:#x} left unmerged with the one before"
            ),
            Inconsistency::Stat {
                key,
                reported,
                recounted,
            } => {
                write!(
                    f,
                    "{key} is {reported} but the blocks add up to {recounted}"
                )
            }
            Inconsistency::DeviceLedger { reserved, device } => {
                write!(
                    f,
                    "reserved_bytes is {reserved} but the device has {device} bytes out"
                )
            }
            Inconsistency::Ordering {
                allocated,
                active,
                reserved,
            } => write!(
                f,
                "allocated {allocated} <= active {active} <= reserved {reserved} does not hold"
            ),
        }
    }
}

impl std::error::Error for Inconsistency {}

/// Per-pool recounts: index 0 small, 1 large.
#[derive(Default)]
struct Recount {
    segment: [i64; 2],
    reserved_bytes: [i64; 2],
    allocation: [i64; 2],
    allocated_bytes: [i64; 2],
    active: [i64; 2],
    active_bytes: [i64; 2],
    requested_bytes: [i64; 2],
    inactive_split: [i64; 2],
    inactive_split_bytes: [i64; 2],
}

fn compare(name: &str, array: &StatArray, v: [i64; 2]) -> Result<(), Inconsistency> {
    for (pool, reported, recounted) in [
        ("small_pool", array.small_pool.current, v[0]),
        ("large_pool", array.large_pool.current, v[1]),
        ("all", array.all.current, v[0] + v[1]),
    ] {
        if reported != recounted {
            return Err(Inconsistency::Stat {
                key: format!("{name}.{pool}.current"),
                reported,
                recounted,
            });
        }
    }
    Ok(())
}

/// Checks every invariant of `alloc` on the simulated device.
pub fn check_consistency(alloc: &Allocator<SimDevice>) -> Result<(), Inconsistency> {
    let mut r = Recount::default();
    let mut last_end = 0u64;
    for seg in alloc.snapshot() {
        let p = match seg.pool {
            PoolKind::Small => 0,
            PoolKind::Large => 1,
        };
        if seg.address < last_end {
            return Err(Inconsistency::SegmentOverlap { addr: seg.address });
        }
        last_end = seg.address + seg.total_size;
        r.segment[p] += 1;
        r.reserved_bytes[p] += seg.total_size as i64;
        let mut addr = seg.address;
        let split = seg.blocks.len() > 1;
        let mut prev_free = false;
        for b in &seg.blocks {
            if b.address != addr {
                return Err(Inconsistency::BlocksNotContiguous {
                    segment: seg.address,
                });
            }
            addr += b.size;
            let free = b.state == BlockState::Inactive;
            if free && prev_free {
                return Err(Inconsistency::Unmerged { addr: b.address });
            }
            prev_free = free;
            match b.state {
                BlockState::ActiveAllocated => {
                    r.allocation[p] += 1;
                    r.allocated_bytes[p] += b.size as i64;
                }
                BlockState::Inactive if split => {
                    r.inactive_split[p] += 1;
                    r.inactive_split_bytes[p] += b.size as i64;
                }
                _ => {}
            }
            if !free {
                r.active[p] += 1;
                r.active_bytes[p] += b.size as i64;
                r.requested_bytes[p] += b.requested_size as i64;
            }
        }
        if addr != seg.address + seg.total_size {
            return Err(Inconsistency::BlocksNotContiguous {
                segment: seg.address,
            });
        }
    }
    let s = alloc.stats();
    compare("segment", &s.segment, r.segment)?;
    compare("reserved_bytes", &s.reserved_bytes, r.reserved_bytes)?;
    compare("allocation", &s.allocation, r.allocation)?;
    compare("allocated_bytes", &s.allocated_bytes, r.allocated_bytes)?;
    compare("active", &s.active, r.active)?;
    compare("active_bytes", &s.active_bytes, r.active_bytes)?;
    compare("requested_bytes", &s.requested_bytes, r.requested_bytes)?;
    compare("inactive_split", &s.inactive_split, r.inactive_split)?;
    compare(
        "inactive_split_bytes",
        &s.inactive_split_bytes,
        r.inactive_split_bytes,
    )?;
    let reserved = s.reserved_bytes.all.current;
    let device = alloc.device().outstanding_bytes();
    if reserved != device as i64 {
        return Err(Inconsistency::DeviceLedger { reserved, device });
    }
    let (allocated, active) = (s.allocated_bytes.all.current, s.active_bytes.all.current);
    if !(allocated <= active && active <= reserved) {
        return Err(Inconsistency::Ordering {
            allocated,
            active,
            reserved,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc_conf::AllocConf;
    use alloc_core::{DeviceFacts, StreamId};

    #[test]
    fn a_fresh_and_a_busy_allocator_are_consistent() {
        let mut a = Allocator::new(
            SimDevice::new(1 << 30),
            &AllocConf::default(),
            DeviceFacts::npu(0),
        );
        check_consistency(&a).unwrap();
        let x = a.malloc(1000, StreamId(0)).unwrap();
        let y = a.malloc(30 << 20, StreamId(1)).unwrap();
        a.record_stream(y, StreamId(0)).unwrap();
        a.free(y).unwrap();
        check_consistency(&a).unwrap();
        a.free(x).unwrap();
        a.empty_cache().unwrap();
        check_consistency(&a).unwrap();
        assert_eq!(a.device().outstanding_bytes(), 0);
    }

    #[test]
    fn a_device_behind_the_allocators_back_is_caught() {
        let mut a = Allocator::new(
            SimDevice::new(1 << 30),
            &AllocConf::default(),
            DeviceFacts::npu(0),
        );
        a.malloc(1000, StreamId(0)).unwrap();
        // Memory handed out by the device that the allocator does not know about.
        alloc_core::Device::malloc(a.device_mut(), 2 << 20).unwrap();
        assert_eq!(
            check_consistency(&a),
            Err(Inconsistency::DeviceLedger {
                reserved: 2 << 20,
                device: 4 << 20
            })
        );
    }
}
