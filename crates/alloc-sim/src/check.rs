//! The allocator's invariants, checked from the outside: every stat equals a recount from the
//! snapshot (torch's `_check_memory_stat_consistency`), blocks tile their segments without
//! overlap, no two free neighbours are left unmerged, and reserved equals what the device has
//! handed out. Property tests and `cargo xtask stress` call this after every operation;
//! [`check_allocations`] also checks the caller's view (every address it holds is a live block of
//! its own, nothing else is allocated).

use core::fmt;

use alloc_core::{Allocator, BlockState, Device, STAT_ARRAY_NAMES, SegmentInfo, Stat, StatArray};

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
    /// A segment of the allocator is not a live device segment of that size.
    SegmentNotOnDevice {
        /// Address of the segment.
        addr: u64,
        /// Its size in the allocator's books.
        size: u64,
    },
    /// The device has live segments the allocator does not know about.
    DeviceSegmentCount {
        /// Segments in the allocator's snapshot.
        allocator: usize,
        /// Live segments on the device.
        device: usize,
    },
    /// A stat's peak is below its current value.
    PeakBelowCurrent {
        /// torch's key, e.g. `active.large_pool.peak`.
        key: String,
        /// The peak.
        peak: i64,
        /// The current value.
        current: i64,
    },
    /// An address the caller holds is not an allocated block of at least the requested size.
    NotAllocated {
        /// The caller's address.
        addr: u64,
        /// The size the caller asked for.
        requested: u64,
    },
    /// A block's `requested_size` differs from what its caller asked for.
    RequestedSize {
        /// The block's address.
        addr: u64,
        /// In the allocator's books.
        recorded: u64,
        /// What the caller asked for.
        requested: u64,
    },
    /// More blocks are allocated than the caller holds: an allocation leaked.
    Leaked {
        /// Allocated blocks.
        allocated: usize,
        /// Addresses the caller holds.
        held: usize,
    },
    /// A mapped range of an expandable segment is not exactly what the device has mapped there.
    MappingMismatch {
        /// Address of the range.
        addr: u64,
        /// Its size in the allocator's books.
        size: u64,
    },
    /// The device holds a different number of physical pages than the allocator has mapped or
    /// holds.
    PageLedger {
        /// Pages mapped in expandable segments plus pages held.
        allocator: usize,
        /// Live pages on the device.
        device: usize,
    },
    /// The device's live host buffers are not the memory saver's backups (plus those it holds).
    HostLedger {
        /// Backups of paused segments plus buffers held.
        allocator: usize,
        /// Live host buffers on the device.
        device: usize,
    },
    /// The device's reserved ranges are not the allocator's expandable segments (plus ranges it
    /// holds).
    RangeLedger {
        /// Expandable segments plus ranges held.
        allocator: usize,
        /// Reserved ranges on the device.
        device: usize,
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
            Inconsistency::SegmentNotOnDevice { addr, size } => write!(
                f,
                "segment {addr:#x} of {size} bytes is not a live device segment of that size"
            ),
            Inconsistency::DeviceSegmentCount { allocator, device } => write!(
                f,
                "the allocator has {allocator} segments but the device has {device}"
            ),
            Inconsistency::PeakBelowCurrent { key, peak, current } => {
                write!(f, "{key} is {peak}, below the current value {current}")
            }
            Inconsistency::NotAllocated { addr, requested } => write!(
                f,
                "{addr:#x} (requested {requested} bytes) is not an allocated block that large"
            ),
            Inconsistency::RequestedSize {
                addr,
                recorded,
                requested,
            } => write!(
                f,
                "block {addr:#x} records requested_size {recorded} but {requested} was asked for"
            ),
            Inconsistency::Leaked { allocated, held } => write!(
                f,
                "{allocated} blocks are allocated but the caller holds {held}"
            ),
            Inconsistency::MappingMismatch { addr, size } => write!(
                f,
                "expandable range {addr:#x} of {size} bytes is not exactly mapped on the device"
            ),
            Inconsistency::PageLedger { allocator, device } => write!(
                f,
                "the allocator maps or holds {allocator} pages but the device has {device}"
            ),
            Inconsistency::HostLedger { allocator, device } => write!(
                f,
                "the allocator holds {allocator} host buffers but the device has {device}"
            ),
            Inconsistency::RangeLedger { allocator, device } => write!(
                f,
                "the allocator has {allocator} reserved ranges but the device has {device}"
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

/// A single stat's value against its recount.
fn compare_one(key: &str, reported: i64, recounted: i64) -> Result<(), Inconsistency> {
    if reported == recounted {
        Ok(())
    } else {
        Err(Inconsistency::Stat {
            key: key.into(),
            reported,
            recounted,
        })
    }
}

/// Every peak is at least its current value.
fn check_peaks<D: Device>(alloc: &Allocator<D>) -> Result<(), Inconsistency> {
    let s = alloc.stats();
    let arrays = STAT_ARRAY_NAMES.iter().flat_map(|&name| {
        let a = s.array(name).expect("every listed name is an array");
        [
            (name, "all", a.all),
            (name, "small_pool", a.small_pool),
            (name, "large_pool", a.large_pool),
        ]
    });
    let singles = [
        ("oversize_allocations", "", s.oversize_allocations),
        ("oversize_segments", "", s.oversize_segments),
    ];
    for (name, pool, Stat { peak, current, .. }) in arrays.chain(singles) {
        if peak < current {
            let key = if pool.is_empty() {
                format!("{name}.peak")
            } else {
                format!("{name}.{pool}.peak")
            };
            return Err(Inconsistency::PeakBelowCurrent { key, peak, current });
        }
    }
    Ok(())
}

/// Checks every invariant of `alloc` on the simulated device.
pub fn check_consistency<D: Device + AsRef<SimDevice>>(
    alloc: &Allocator<D>,
) -> Result<(), Inconsistency> {
    check_snapshot(alloc, &alloc.snapshot())
}

/// Checks every invariant, as [`check_consistency`] does, and also the caller's view: `live`
/// holds every `(address, requested size)` the caller got from `malloc` and has not freed. Each
/// must be an allocated block of its own with that `requested_size` (so no two of them share
/// memory), and no other block may be allocated.
pub fn check_allocations<D: Device + AsRef<SimDevice>>(
    alloc: &Allocator<D>,
    live: impl IntoIterator<Item = (u64, u64)>,
) -> Result<(), Inconsistency> {
    let snapshot = alloc.snapshot();
    check_snapshot(alloc, &snapshot)?;
    let allocated: std::collections::HashMap<u64, (u64, u64)> = snapshot
        .iter()
        .flat_map(|seg| &seg.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| (b.address, (b.size, b.requested_size)))
        .collect();
    let mut held = 0;
    for (addr, requested) in live {
        held += 1;
        match allocated.get(&addr) {
            Some(&(size, recorded)) if size >= requested => {
                if recorded != requested {
                    return Err(Inconsistency::RequestedSize {
                        addr,
                        recorded,
                        requested,
                    });
                }
            }
            _ => return Err(Inconsistency::NotAllocated { addr, requested }),
        }
    }
    // Distinct held addresses that all name allocated blocks: equal counts mean no extra block.
    if held != allocated.len() {
        return Err(Inconsistency::Leaked {
            allocated: allocated.len(),
            held,
        });
    }
    Ok(())
}

/// Nothing of virtual memory leaks: the device's live pages are the pages mapped in expandable
/// segments plus those the allocator holds (refused, or cached by `empty_virt_addr_cache`), and
/// its reserved ranges are exactly the segments' ranges plus those held.
fn check_virtual_memory<D: Device>(
    alloc: &Allocator<D>,
    device: &SimDevice,
) -> Result<(), Inconsistency> {
    let segments = alloc.expandable_segments();
    let saver = alloc.saver_segments();
    let held = alloc.held();
    let saver_pages = saver.iter().filter(|s| s.2).count();
    let pages = segments.iter().map(|e| e.mapped_pages).sum::<usize>()
        + saver_pages
        + held.pages
        + held.cached_pages;
    if pages != device.live_pages() {
        return Err(Inconsistency::PageLedger {
            allocator: pages,
            device: device.live_pages(),
        });
    }
    let ranges = segments.len() + saver.len() + held.ranges;
    let device_ranges: std::collections::HashMap<u64, u64> = device.reserved_ranges().collect();
    let all_known = segments
        .iter()
        .all(|e| device_ranges.get(&e.address) == Some(&e.reserved_size))
        && saver
            .iter()
            .all(|&(a, size, _)| device_ranges.get(&a) == Some(&size));
    if ranges != device_ranges.len() || !all_known {
        return Err(Inconsistency::RangeLedger {
            allocator: ranges,
            device: device_ranges.len(),
        });
    }
    if alloc.held_host_buffers() != device.live_host_buffers() {
        return Err(Inconsistency::HostLedger {
            allocator: alloc.held_host_buffers(),
            device: device.live_host_buffers(),
        });
    }
    Ok(())
}

/// The invariants of [`check_consistency`] over a snapshot of `alloc`.
fn check_snapshot<D: Device + AsRef<SimDevice>>(
    alloc: &Allocator<D>,
    snapshot: &[SegmentInfo<D::Stream>],
) -> Result<(), Inconsistency> {
    let mut r = Recount::default();
    let mut last_end = 0u64;
    let device: &SimDevice = alloc.device().as_ref();
    let max_split = alloc.conf().max_split_size;
    let oversize = |size: u64| max_split.is_some_and(|m| size >= m);
    let (mut oversize_allocations, mut oversize_segments) = (0i64, 0i64);
    let mut device_segments = 0usize;
    let mut paused = 0u64;
    for seg in snapshot {
        let p = seg.pool.index();
        if seg.address < last_end {
            return Err(Inconsistency::SegmentOverlap { addr: seg.address });
        }
        last_end = seg.address + seg.total_size;
        if seg.is_expandable {
            // Mapped pages must tile the range exactly: no gap, nothing hanging over.
            let end = seg.address + seg.total_size;
            let mut at = seg.address;
            for (a, bytes) in device.mappings_in(seg.address, end) {
                if a != at {
                    break;
                }
                at += bytes;
            }
            if at != end
                || device
                    .mapping_covering(seg.address)
                    .is_some_and(|(a, _)| a < seg.address)
            {
                return Err(Inconsistency::MappingMismatch {
                    addr: seg.address,
                    size: seg.total_size,
                });
            }
        } else if seg.saver_tag.is_some() {
            // A memory-saver segment: its own reserved range, with one page of its size mapped
            // while it is not paused and nothing mapped while it is.
            let end = seg.address + seg.total_size;
            let range_ok =
                device.range_containing(seg.address) == Some((seg.address, seg.total_size));
            let mapped: Vec<(u64, u64)> = device.mappings_in(seg.address, end).collect();
            let mapping_ok = if seg.paused {
                mapped.is_empty()
            } else {
                mapped == [(seg.address, seg.total_size)]
            };
            if !range_ok || !mapping_ok {
                return Err(Inconsistency::MappingMismatch {
                    addr: seg.address,
                    size: seg.total_size,
                });
            }
            oversize_segments += i64::from(oversize(seg.total_size));
            r.segment[p] += 1;
            if seg.paused {
                paused += seg.total_size;
            }
        } else {
            if device.segment_size(seg.address) != Some(seg.total_size) {
                return Err(Inconsistency::SegmentNotOnDevice {
                    addr: seg.address,
                    size: seg.total_size,
                });
            }
            oversize_segments += i64::from(oversize(seg.total_size));
            r.segment[p] += 1;
            device_segments += 1;
        }
        r.reserved_bytes[p] += seg.total_size as i64;
        let mut addr = seg.address;
        // torch leaves blocks of expandable segments out of inactive_split.
        let split = seg.blocks.len() > 1 && !seg.is_expandable;
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
                    oversize_allocations += i64::from(oversize(b.size));
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
    compare_one(
        "oversize_allocations.current",
        s.oversize_allocations.current,
        oversize_allocations,
    )?;
    compare_one(
        "oversize_segments.current",
        s.oversize_segments.current,
        oversize_segments,
    )?;
    check_peaks(alloc)?;
    let reserved = s.reserved_bytes.all.current;
    // Paused memory-saver segments stay reserved in torch's figures but hold no memory.
    let on_device = device.outstanding_bytes() + device.mapped_bytes() + paused;
    let saver = alloc.saver_stats();
    if saver.paused_bytes.current != paused as i64 {
        return Err(Inconsistency::Stat {
            key: "memory saver paused_bytes.current".into(),
            reported: saver.paused_bytes.current,
            recounted: paused as i64,
        });
    }
    if reserved != on_device as i64 {
        return Err(Inconsistency::DeviceLedger {
            reserved,
            device: on_device,
        });
    }
    if device_segments != device.outstanding_segments() {
        return Err(Inconsistency::DeviceSegmentCount {
            allocator: device_segments,
            device: device.outstanding_segments(),
        });
    }
    check_virtual_memory(alloc, device)?;
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
    use alloc_core::DeviceFacts;

    use crate::sim_device::SimStream;

    #[test]
    fn a_fresh_and_a_busy_allocator_are_consistent() {
        let mut a = Allocator::new(
            SimDevice::new(1 << 30),
            &AllocConf::default(),
            DeviceFacts::npu(0),
        );
        check_consistency(&a).unwrap();
        let x = a.malloc(1000, SimStream(0)).unwrap();
        let y = a.malloc(30 << 20, SimStream(1)).unwrap();
        a.record_stream(y, SimStream(0)).unwrap();
        a.free(y).unwrap();
        check_consistency(&a).unwrap();
        a.free(x).unwrap();
        a.empty_cache().unwrap();
        check_consistency(&a).unwrap();
        assert_eq!(a.device().outstanding_bytes(), 0);
    }

    #[test]
    fn the_callers_view_is_checked() {
        let mut a = Allocator::new(
            SimDevice::new(1 << 30),
            &AllocConf::default(),
            DeviceFacts::npu(0),
        );
        let x = a.malloc(1000, SimStream(0)).unwrap();
        let y = a.malloc(3 << 20, SimStream(0)).unwrap();
        check_allocations(&a, [(x, 1000), (y, 3 << 20)]).unwrap();
        assert_eq!(
            check_allocations(&a, [(x, 1000)]),
            Err(Inconsistency::Leaked {
                allocated: 2,
                held: 1
            })
        );
        assert_eq!(
            check_allocations(&a, [(x, 999), (y, 3 << 20)]),
            Err(Inconsistency::RequestedSize {
                addr: x,
                recorded: 1000,
                requested: 999
            })
        );
        assert_eq!(
            check_allocations(&a, [(x, 1 << 20), (y, 3 << 20)]),
            Err(Inconsistency::NotAllocated {
                addr: x,
                requested: 1 << 20
            }),
            "the block is smaller than what the caller believes it holds"
        );
        a.free(y).unwrap();
        assert_eq!(
            check_allocations(&a, [(x, 1000), (y, 3 << 20)]),
            Err(Inconsistency::NotAllocated {
                addr: y,
                requested: 3 << 20
            })
        );
    }

    #[test]
    fn a_device_segment_the_allocator_forgot_is_caught() {
        let mut a = Allocator::new(
            SimDevice::new(1 << 30),
            &AllocConf::default(),
            DeviceFacts::npu(0),
        );
        a.malloc(1000, SimStream(0)).unwrap();
        // The device frees the segment behind the allocator's back and hands out another of the
        // same size: the byte ledger and the segment count still agree, the addresses do not.
        let addr = a.snapshot()[0].address;
        alloc_core::Device::free(a.device_mut(), addr, 2 << 20).unwrap();
        let other = alloc_core::Device::malloc(a.device_mut(), 2 << 20).unwrap();
        assert_eq!(
            check_consistency(&a),
            Err(Inconsistency::SegmentNotOnDevice {
                addr,
                size: 2 << 20
            })
        );
        assert_ne!(other, addr);
    }

    #[test]
    fn a_device_behind_the_allocators_back_is_caught() {
        let mut a = Allocator::new(
            SimDevice::new(1 << 30),
            &AllocConf::default(),
            DeviceFacts::npu(0),
        );
        a.malloc(1000, SimStream(0)).unwrap();
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
