//! The caching allocator of one device: torch's `DeviceCachingAllocator`, minus the lock.
//!
//! `malloc` follows torch's order exactly: poll events, round, best fit in the request's pool,
//! then on a miss GC, device malloc, free just enough oversize blocks and retry, synchronize and
//! free every cached segment and retry, and finally out-of-memory.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use alloc_conf::AllocConf;
use hashbrown::HashMap;

use crate::address_index::AddressIndex;
use crate::block::{BlockId, Blocks};
use crate::counters::Counters;
use crate::device::Device;
use crate::error::{FractionError, Rejection};
use crate::expandable::{ExpandableSegment, Parked};
use crate::history::History;
use crate::memory_saver::Saver;
use crate::private_pool::{PoolSet, Pools};
use crate::size::{self, MAX_REQUEST, PoolKind};
use crate::stats::DeviceStats;
use crate::stream_events::EventQueues;

/// Padded request sizes from here on are refused as too large: every rounding of a smaller one
/// (power-of-two divisions, 2 MiB or 1 GiB segments) fits in 64 bits.
const MAX_PADDED: u64 = 1 << 63;

/// Whose behaviour the policy follows where torch_npu and PyTorch's CUDA allocator differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// torch_npu's `NPUCachingAllocator`: a device malloc that fails with an error other than
    /// out-of-memory still runs the rest of the retry chain (`alloc_block` returns false for any
    /// error); only the last attempt's error decides between out-of-memory and a device error.
    TorchNpu,
    /// PyTorch's `CUDACachingAllocator`: a device malloc error other than out-of-memory is
    /// returned at once.
    Cuda,
}

/// Facts about the device that change the policy, given when the allocator is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceFacts {
    /// Device index, printed in the out-of-memory message.
    pub index: u32,
    /// Bytes added to every request before rounding: 32 for torch_npu on today's Ascend parts, 0
    /// for CUDA parity.
    pub pad: u64,
    /// Total device memory; `None` asks the device's `mem_info` once at construction.
    pub total_memory: Option<u64>,
    /// Whose behaviour to follow where torch_npu and CUDA differ.
    pub flavour: Flavour,
    /// Whether the device can back `page_size:1g` with 1 GiB pages (torch_npu: CANN 8.1.RC1
    /// and driver 25.0.RC1 or later). Without, the setting is ignored with a notice, as
    /// torch_npu ignores it with a warning.
    pub huge_pages_1g: bool,
}

impl DeviceFacts {
    /// torch_npu on today's Ascend parts: a 32-byte pad on every request, torch_npu's retry
    /// chain.
    pub fn npu(index: u32) -> DeviceFacts {
        DeviceFacts {
            index,
            pad: 32,
            total_memory: None,
            flavour: Flavour::TorchNpu,
            huge_pages_1g: true,
        }
    }

    /// PyTorch's CUDA allocator: no pad, CUDA's retry chain.
    pub fn cuda_parity(index: u32) -> DeviceFacts {
        DeviceFacts {
            index,
            pad: 0,
            total_memory: None,
            flavour: Flavour::Cuda,
            huge_pages_1g: true,
        }
    }
}

/// Drops `page_size:1g` from `conf` where the device has no 1 GiB pages (torch_npu's
/// `IsMallocPage1GMem`); returns whether it did.
fn gate_page_size(conf: &mut AllocConf, facts: &DeviceFacts) -> bool {
    let gated = conf.page_size.is_some() && !facts.huge_pages_1g;
    if gated {
        conf.page_size = None;
    }
    gated
}

/// Something the embedder should tell its user once; the allocator keeps working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// `garbage_collection_threshold` is set but the device did not report its total memory: GC
    /// is off until it does (asked again at each cache miss).
    GcWithoutMemInfo,
    /// `per_process_memory_fraction` is set but the device did not report its total memory: no
    /// limit until it does (asked again at each cache miss).
    FractionWithoutMemInfo,
    /// `expandable_segments:True` was asked for but the device has no virtual-memory calls
    /// (ACL 207000, or a `libascendcl` without them): it runs as `False`, as torch_npu does.
    ExpandableSegmentsUnsupported,
    /// `expandable_segments:True` was asked for but the probe reservation failed with an error:
    /// it runs as `False` (torch_npu raises the error instead).
    ExpandableSegmentsProbeFailed,
    /// `page_size:1g` was asked for but the device cannot give 1 GiB pages (torch_npu's gate:
    /// CANN 8.1.RC1 and driver 25.0.RC1 or later): it runs as if unset, as torch_npu does.
    PageSize1gUnsupported,
    /// `throw_on_npumalloc_oom:True` refused a segment for the first time (torch_npu's
    /// warn-once, with that first refusal's numbers; each refused malloc's error has its own).
    OomRejection(Rejection),
}

impl Notice {
    /// How many kinds of notice there are.
    pub const KINDS: usize = 6;
}

impl core::fmt::Display for Notice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let text = match self {
            Notice::OomRejection(r) => return r.fmt_warning(f),
            Notice::GcWithoutMemInfo => {
                "garbage_collection_threshold is ignored until the device reports its total memory (mem_get_info failed); it is asked again at the next cache miss"
            }
            Notice::FractionWithoutMemInfo => {
                "per_process_memory_fraction is ignored until the device reports its total memory (mem_get_info failed); it is asked again at the next cache miss"
            }
            Notice::ExpandableSegmentsUnsupported => {
                "expandable_segments setting failure, now change to `False`: the device has no virtual-memory support (feature not supported; driver and firmware packages may not match)"
            }
            Notice::ExpandableSegmentsProbeFailed => {
                "expandable_segments setting failure, now change to `False`: reserving 512 bytes of virtual address space failed"
            }
            Notice::PageSize1gUnsupported => {
                "The application for 1G large-page physical memory failed: page_size:1g is ignored (segments and expandable pages are sized as without it), because 1G large pages need CANN 8.1.RC1 and a driver (HDK) of 25.0.RC1 or later, and the versions found are older or could not be read. Please upgrade the CANN and driver packages."
            }
        };
        f.write_str(text)
    }
}

/// The notices of one allocator: each kind at most once, so a fixed capacity of one slot per kind.
type Notices = heapless::Vec<Notice, { Notice::KINDS }>;

/// The most bytes all segments together may hold: the largest value of an i64 statistic. A
/// segment that would take the reserve past it is given back and the request runs out of memory.
pub const MAX_RESERVE: u64 = i64::MAX as u64;

/// What a request needs, computed once per `malloc`: torch's `AllocParams`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<S> {
    pub(crate) stream: S,
    /// The caller's size.
    pub(crate) requested: u64,
    /// The rounded size (pad included).
    pub(crate) size: u64,
    pub(crate) pool: PoolKind,
    /// The pool set it is served from (0: the default pools).
    pub(crate) set: PoolSet,
    /// The segment size to ask the device for on a miss (torch's `alloc_size`): 0 until
    /// `miss` computes it, under the same lock as the rounding.
    pub(crate) alloc_size: u64,
}

/// A caching allocator for one device, generic over the device backend.
pub struct Allocator<D: Device> {
    pub(crate) device: D,
    pub(crate) conf: AllocConf,
    /// Whether `conf` rounds any size to power-of-two divisions ([`size::divides`]): cached with
    /// the configuration ([`Allocator::cache_conf`]), as every malloc asks.
    pub(crate) divides: bool,
    /// The smallest oversize block (`max_split_size`, or `u64::MAX`, which no block reaches):
    /// cached with the configuration, as every malloc and free asks.
    oversize_from: u64,
    /// The smallest request refused as too large: [`MAX_REQUEST`], or less where the device's
    /// pad would take a padded size to 2^63 (rounding it would overflow). Every malloc asks.
    pub(crate) request_limit: u64,
    pub(crate) facts: DeviceFacts,
    pub(crate) blocks: Blocks<D::Stream>,
    /// The default pools and the private pools, indexed by (set, kind).
    pub(crate) pools: Pools<D::Stream>,
    /// Blocks by address: every block handed out at least once, for as long as its record
    /// exists. A freed block keeps its entry, so a cached block handed out again (the common
    /// hit) needs no hash update, and `free` only looks up; an entry goes when its block is
    /// merged into a neighbour or its segment is released. Whether the block is live is its
    /// `allocated` flag.
    pub(crate) by_addr: AddressIndex,
    /// The other streams each allocated block was used on (torch's `stream_uses`), for the
    /// blocks with any: a side table, so that the block record stays one cache line.
    pub(crate) stream_uses: HashMap<BlockId, Vec<D::Stream>>,
    /// Segment start address → the block at that address (it keeps its id for the segment's life).
    pub(crate) segments: BTreeMap<u64, BlockId>,
    pub(crate) events: EventQueues<D::Event, D::Stream>,
    pub(crate) stats: Counters,
    /// Bytes of all device segments: torch's `total_allocated_memory`.
    pub(crate) total_allocated: u64,
    /// The per-process limit; `None` when the fraction is 1 (or while the device's total is
    /// unknown).
    pub(crate) allowed: Option<u64>,
    /// The fraction asked for, applied as `allowed` once the total is known.
    pub(crate) fraction: f64,
    /// The device's total memory; asked again (on a cache miss, or when a fraction is set) for as
    /// long as the device could not tell, as torch_npu asks when it needs it.
    pub(crate) total_memory: Option<u64>,
    /// The GC limit in bytes while GC is on; recomputed whenever the fraction changes, because
    /// every pool lookup asks whether GC is on.
    pub(crate) gc_limit: Option<u64>,
    /// Expandable segments by `VmId`; `None` marks a free slot.
    pub(crate) expandable: Vec<Option<ExpandableSegment<D::Page>>>,
    /// Live expandable segments: while there are none, best fit takes the fast path.
    pub(crate) live_expandable: usize,
    /// Pages and ranges the device refused to take back, and pages kept for later maps.
    pub(crate) parked: Parked<D::Page>,
    /// The memory saver's segments and figures.
    pub(crate) saver: Saver<D::Page, D::HostBuffer>,
    /// The trace-entry ring while history is recorded.
    pub(crate) history: Option<alloc::boxed::Box<History<D::Stream>>>,
    /// What a malloc does before it releases cached memory ([`HostQueue`]).
    pub(crate) host_queue: crate::oom_retry::HostQueue,
    /// With `multi_stream_lazy_reclaim`: the mallocs counted so far when a malloc last polled
    /// the events at its start (torch_npu's `reaped`), taken by its miss. Kept here rather than
    /// in the request, which the hit path builds: a field there cost it 11 instructions a
    /// fenced pair (docs/performance.md). A malloc that polled and then hit counts one more, so
    /// a later malloc's miss does not take it for its own.
    pub(crate) reaped_at: Option<u128>,
    /// Inside [`Allocator::free_after_drain`]: the host's queue was just drained. A field, not
    /// a parameter of `free`: with `drained` passed down, the runtime's inlined hit pair
    /// compiled to more instructions (docs/performance.md).
    pub(crate) queue_drained: bool,
    notices: Notices,
}

impl<D: Device> Allocator<D> {
    /// Builds an allocator over `device` with configuration `conf`.
    pub fn new(mut device: D, conf: &AllocConf, facts: DeviceFacts) -> Self {
        let total_memory = facts
            .total_memory
            .or_else(|| device.mem_info().ok().map(|m| m.total));
        let mut conf = conf.clone();
        let gated = gate_page_size(&mut conf, &facts);
        let fraction = conf.per_process_memory_fraction;
        let stats = Counters {
            max_split_size: conf.max_split_size,
            ..Counters::default()
        };
        let mut allocator = Allocator {
            device,
            divides: false,
            oversize_from: u64::MAX,
            request_limit: MAX_REQUEST.min(MAX_PADDED.saturating_sub(facts.pad)),
            conf,
            facts,
            blocks: Blocks::default(),
            pools: Pools::default(),
            by_addr: AddressIndex::new(),
            stream_uses: HashMap::new(),
            segments: BTreeMap::new(),
            events: EventQueues::default(),
            stats,
            total_allocated: 0,
            allowed: None,
            fraction,
            total_memory,
            gc_limit: None,
            expandable: Vec::new(),
            live_expandable: 0,
            parked: Parked::default(),
            saver: Saver::default(),
            history: None,
            host_queue: crate::oom_retry::HostQueue::None,
            reaped_at: None,
            queue_drained: false,
            notices: Notices::new(),
        };
        allocator.cache_conf();
        if gated {
            allocator.notice(Notice::PageSize1gUnsupported);
        }
        if allocator.conf.garbage_collection_threshold.is_some() && total_memory.is_none() {
            allocator.notice(Notice::GcWithoutMemInfo);
        }
        if fraction < 1.0 && total_memory.is_none() {
            allocator.notice(Notice::FractionWithoutMemInfo);
        }
        if allocator.conf.expandable_segments && !allocator.probe_virtual_memory() {
            allocator.conf.expandable_segments = false;
        }
        allocator.apply_limits();
        allocator
    }

    /// Caches what every malloc asks of the configuration.
    fn cache_conf(&mut self) {
        self.divides = size::divides(&self.conf);
        self.oversize_from = self.conf.max_split_size.unwrap_or(u64::MAX);
    }

    /// Records `n` once.
    pub(crate) fn notice(&mut self, n: Notice) {
        // One of each kind: a notice that carries numbers keeps its first occurrence's.
        let kind = core::mem::discriminant(&n);
        if !self
            .notices
            .iter()
            .any(|m| core::mem::discriminant(m) == kind)
        {
            // Cannot fail: there are `Notice::KINDS` kinds and each is stored at most once.
            let _ = self.notices.push(n);
        }
    }

    /// Applies a new configuration at run time, as torch's `_set_allocator_settings` does once
    /// it has parsed its string (see `alloc_conf::parse_settings`): later requests follow it.
    /// Blocks of expandable segments stay where they are; while `expandable_segments` is off,
    /// best fit passes over them. Turning expandable segments on probes the device again; without
    /// support they stay off and a notice is recorded. Returns whether expandable segments are on.
    ///
    /// As in torch_npu, two values stay those the allocator was built with: the memory fraction
    /// (its limit is set once, from the configuration, when the device's allocator is made; only
    /// [`Allocator::set_memory_fraction`] changes it later) and the `max_split_size` stat, which
    /// torch_npu also sets only then, though the policy follows the new `max_split_size_mb`.
    pub fn set_conf(&mut self, conf: &AllocConf) -> bool {
        let was = self.conf.expandable_segments;
        let max_split_changed = self.conf.max_split_size != conf.max_split_size;
        self.conf = conf.clone();
        if gate_page_size(&mut self.conf, &self.facts) {
            self.notice(Notice::PageSize1gUnsupported);
        }
        self.cache_conf();
        if max_split_changed {
            self.recount_oversize();
        }
        if conf.expandable_segments && !was && !self.probe_virtual_memory() {
            self.conf.expandable_segments = false;
        }
        // The garbage-collection threshold may have been reset.
        self.apply_limits();
        self.conf.expandable_segments
    }

    /// The device's total memory, asked of the device again if it could not tell before.
    pub(crate) fn refresh_total_memory(&mut self) -> Option<u64> {
        if self.total_memory.is_none() {
            self.total_memory = self.device.mem_info().ok().map(|m| m.total);
        }
        self.total_memory
    }

    /// Whether a setting waits for the device's total memory (a fraction below 1, or a GC
    /// threshold), which is then asked again.
    #[inline]
    pub(crate) fn limits_pending(&self) -> bool {
        self.total_memory.is_none()
            && (self.fraction < 1.0 || self.conf.garbage_collection_threshold.is_some())
    }

    /// Asks for the total again if a setting waits for it, and applies the limits it gives.
    pub(crate) fn refresh_limits(&mut self) {
        if self.limits_pending() && self.refresh_total_memory().is_some() {
            self.apply_limits();
        }
    }

    /// Sets `allowed` from the fraction and the total, and the GC limit from them.
    fn apply_limits(&mut self) {
        self.allowed = match self.total_memory {
            Some(total) if self.fraction < 1.0 => Some((self.fraction * total as f64) as u64),
            _ => None,
        };
        self.update_gc_limit();
    }

    /// Drops the address-index entry of a block whose record is about to go.
    #[inline]
    pub(crate) fn unindex(&mut self, id: BlockId) {
        let block = &self.blocks[id];
        if block.indexed {
            self.by_addr.remove(block.addr);
        }
    }

    /// One past the last byte of the segment whose first block is `head`.
    pub(crate) fn segment_end(&self, head: BlockId) -> u64 {
        let mut id = head;
        while let Some(next) = self.blocks[id].next {
            id = next;
        }
        let last = &self.blocks[id];
        last.addr + last.size
    }

    /// `empty_cache`: synchronize, return blocks whose events are done to their pools, and give
    /// every whole free segment of the default pools and of the freeable private pools back to
    /// the device. Split segments stay, and so do the cached segments of private pools still
    /// held (torch keeps a live `MemPool`'s cache).
    pub fn empty_cache(&mut self) -> Result<(), D::Error> {
        self.release_cached_blocks()
    }

    /// torch's `emptyCache(pool)` (what dropping a `MemPool` runs after releasing it): gives
    /// back the whole free segments of private pool `pool` if it is freeable, and forgets it
    /// once it holds none; nothing for a pool still held.
    pub fn empty_pool_cache(&mut self, pool: crate::PoolId) -> Result<(), D::Error> {
        if pool.is_default() {
            return self.release_cached_blocks();
        }
        self.release_cached_blocks_of(Some(pool), true)
    }

    /// torch_npu's `empty_virt_addr_cache()`, a lighter `empty_cache`: the same release, except
    /// that the pages unmapped from expandable segments are kept (torch_npu's
    /// `free_physical_handles_`) and mapped again by the next misses of their pool instead of
    /// new ones; `empty_cache` and the OOM retry chain free them. Statistics move as with
    /// `empty_cache` (`reserved_bytes` falls by the unmapped pages); the kept pages are in
    /// [`Allocator::held`]. torch_npu refuses the call without expandable segments; the runtime
    /// does, here it is `empty_cache` keeping any pages already cached.
    pub fn empty_virt_addr_cache(&mut self) -> Result<(), D::Error> {
        self.release_cached_blocks_of(None, false)
    }

    /// `set_per_process_memory_fraction`: limits the bytes of all segments to `fraction` of the
    /// device's total memory. Checked only when a new segment is needed. The configuration's
    /// `per_process_memory_fraction` does not change.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), FractionError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(FractionError::OutOfRange(fraction));
        }
        if fraction < 1.0 && self.refresh_total_memory().is_none() {
            return Err(FractionError::TotalUnknown);
        }
        // The configuration's `per_process_memory_fraction` stays, as torch_npu's
        // `setMemoryFraction` leaves `NPUAllocatorConfig`'s: `throw_on_npumalloc_oom` reads it.
        self.fraction = fraction;
        self.apply_limits();
        Ok(())
    }

    /// `get_per_process_memory_fraction`: 1.0 when unlimited, else allowed / total.
    pub fn memory_fraction(&self) -> f64 {
        match (self.allowed, self.total_memory) {
            (Some(allowed), Some(total)) if total > 0 => allowed as f64 / total as f64,
            _ => 1.0,
        }
    }

    /// The per-process limit in bytes, when a fraction below 1 is set.
    pub fn allowed_memory(&self) -> Option<u64> {
        self.allowed
    }

    /// Every statistic of torch's `memory_stats()`, built from the counters the hot path
    /// keeps (torch's `getDeviceStats` copies them too).
    pub fn stats(&self) -> DeviceStats {
        self.stats.report()
    }

    /// torch's `memory_allocated()`: `allocated_bytes.all.current`, without building the
    /// whole report.
    pub fn memory_allocated(&self) -> u64 {
        self.stats.allocated_bytes.all_current() as u64
    }

    /// torch's `memory_reserved()`: `reserved_bytes.all.current`, without building the whole
    /// report.
    pub fn memory_reserved(&self) -> u64 {
        self.stats.reserved_bytes.all_current() as u64
    }

    /// `requested_bytes.all.current`: the bytes callers asked for, of live allocations.
    pub fn memory_requested(&self) -> u64 {
        self.stats.requested_bytes.all_current() as u64
    }

    /// `reset_peak_memory_stats`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
        self.reset_saver_peaks();
    }

    /// `reset_accumulated_memory_stats`.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
        // Its mark counts from the totals just reset (no malloc is between its start and its
        // miss here, so none loses its own).
        self.reaped_at = None;
    }

    /// The configuration in force (after notices such as unsupported expandable segments).
    pub fn conf(&self) -> &AllocConf {
        &self.conf
    }

    /// The device facts the allocator was built with.
    pub fn facts(&self) -> DeviceFacts {
        self.facts
    }

    /// Things the embedder should report to its user once.
    pub fn notices(&self) -> &[Notice] {
        &self.notices
    }

    /// The device backend.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device backend, mutably (for tests that complete events or inject faults).
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// Sets the current oversize counts to what the blocks hold under the `max_split_size` now
    /// in force, so that later frees and releases, which test sizes against it, keep them
    /// exact (torch keeps the counts of the old limit, and they drift; docs/deviations.md).
    fn recount_oversize(&mut self) {
        let mut allocations = 0i64;
        let mut segments = 0i64;
        for &head in self.segments.values() {
            let whole = !self.blocks[head].is_expandable();
            let mut size = 0;
            let mut next = Some(head);
            while let Some(id) = next {
                let b = &self.blocks[id];
                allocations += i64::from(b.allocated && self.is_oversize(b.size));
                size += b.size;
                next = b.next;
            }
            segments += i64::from(whole && self.is_oversize(size));
        }
        self.stats.oversize_allocations.recount(allocations);
        self.stats.oversize_segments.recount(segments);
    }

    /// Whether a block of `size` bytes is oversize (≥ `max_split_size`).
    pub(crate) fn is_oversize(&self, size: u64) -> bool {
        size >= self.oversize_from
    }
}

/// Events still pending when the allocator goes (its owner's last `empty_cache` could not
/// synchronize the device) go back to the device, which owns their release: dropped as values,
/// a backend's events (ACL's `aclrtEvent`) would leak. Their blocks stay as they are; the
/// segments go with whatever the owner does with the device.
impl<D: Device> Drop for Allocator<D> {
    fn drop(&mut self) {
        for (event, _) in self.events.take_all() {
            self.device.release_event(event);
        }
    }
}
