//! The caching allocator of one device: torch's `DeviceCachingAllocator`, minus the lock.
//!
//! `malloc` follows torch's order exactly: poll events, round, best fit in the request's pool,
//! then on a miss GC, device malloc, free just enough oversize blocks and retry, synchronize and
//! free every cached segment and retry, and finally out-of-memory.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use alloc_conf::AllocConf;
use hashbrown::HashMap;

use crate::block::{BlockId, Blocks};
use crate::device::{Device, StreamId};
use crate::error::{AllocError, FractionError, FreeError, OutOfMemory};
use crate::events::EventQueues;
use crate::pool::BlockPool;
use crate::size::{self, MAX_REQUEST, PoolKind};
use crate::stats::DeviceStats;

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
}

impl DeviceFacts {
    /// torch_npu on today's Ascend parts: a 32-byte pad on every request.
    pub fn npu(index: u32) -> DeviceFacts {
        DeviceFacts {
            index,
            pad: 32,
            total_memory: None,
        }
    }

    /// PyTorch's CUDA allocator: no pad.
    pub fn cuda_parity(index: u32) -> DeviceFacts {
        DeviceFacts {
            index,
            pad: 0,
            total_memory: None,
        }
    }
}

/// Something the embedder should tell its user once; the allocator keeps working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// `garbage_collection_threshold` is set but the device reports no total memory: GC is off.
    GcWithoutMemInfo,
    /// `per_process_memory_fraction` is set but the device reports no total memory: no limit.
    FractionWithoutMemInfo,
    /// `expandable_segments:True` is not implemented by this allocator yet; it behaves as
    /// `False`, as torch does on platforms without virtual-memory support.
    ExpandableSegmentsUnsupported,
}

impl core::fmt::Display for Notice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Notice::GcWithoutMemInfo => {
                "garbage_collection_threshold is ignored: the device does not report its total memory (mem_get_info unavailable)"
            }
            Notice::FractionWithoutMemInfo => {
                "per_process_memory_fraction is ignored: the device does not report its total memory"
            }
            Notice::ExpandableSegmentsUnsupported => {
                "expandable_segments is not supported by this allocator yet; using expandable_segments:False"
            }
        })
    }
}

/// Padded request sizes from here on are refused as too large: every rounding of a smaller one
/// (power-of-two divisions, 2 MiB or 1 GiB segments) fits in 64 bits.
const MAX_PADDED: u64 = 1 << 63;

/// The most bytes all segments together may hold: the largest value of an i64 statistic.
pub(crate) const MAX_RESERVE: u64 = i64::MAX as u64;

/// What a request needs, computed once per `malloc`: torch's `AllocParams`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub(crate) stream: StreamId,
    /// The caller's size.
    pub(crate) requested: u64,
    /// The rounded size (pad included).
    pub(crate) size: u64,
    pub(crate) pool: PoolKind,
    /// The segment size to ask the device for on a miss.
    pub(crate) alloc_size: u64,
}

/// A caching allocator for one device, generic over the device backend.
pub struct Allocator<D: Device> {
    pub(crate) device: D,
    pub(crate) conf: AllocConf,
    pub(crate) facts: DeviceFacts,
    pub(crate) blocks: Blocks,
    /// Indexed by `pool_index`: small, large.
    pub(crate) pools: [BlockPool; 2],
    /// Blocks by address: every block handed out at least once, for as long as its record
    /// exists. A freed block keeps its entry, so a cached block handed out again (the common
    /// hit) needs no hash update, and `free` only looks up; an entry goes when its block is
    /// merged into a neighbour or its segment is released. Whether the block is live is its
    /// `allocated` flag.
    pub(crate) by_addr: HashMap<u64, BlockId>,
    /// Segment start address → the block at that address (it keeps its id for the segment's life).
    pub(crate) segments: BTreeMap<u64, BlockId>,
    pub(crate) events: EventQueues<D::Event>,
    pub(crate) stats: DeviceStats,
    /// Bytes of all device segments: torch's `total_allocated_memory`.
    pub(crate) total_allocated: u64,
    /// The per-process limit; `None` when the fraction is 1.
    pub(crate) allowed: Option<u64>,
    pub(crate) total_memory: Option<u64>,
    /// The GC limit in bytes while GC is on; recomputed whenever the fraction changes, because
    /// every pool lookup asks whether GC is on.
    pub(crate) gc_limit: Option<u64>,
    notices: Vec<Notice>,
}

pub(crate) fn pool_index(pool: PoolKind) -> usize {
    match pool {
        PoolKind::Small => 0,
        PoolKind::Large => 1,
    }
}

impl<D: Device> Allocator<D> {
    /// Builds an allocator over `device` with configuration `conf`.
    pub fn new(mut device: D, conf: &AllocConf, facts: DeviceFacts) -> Self {
        let total_memory = facts
            .total_memory
            .or_else(|| device.mem_info().map(|m| m.total));
        let mut conf = conf.clone();
        let mut notices = Vec::new();
        if conf.expandable_segments {
            conf.expandable_segments = false;
            notices.push(Notice::ExpandableSegmentsUnsupported);
        }
        if conf.garbage_collection_threshold.is_some() && total_memory.is_none() {
            notices.push(Notice::GcWithoutMemInfo);
        }
        let fraction = conf.per_process_memory_fraction;
        let allowed = match total_memory {
            Some(total) if fraction < 1.0 => Some((fraction * total as f64) as u64),
            None if fraction < 1.0 => {
                notices.push(Notice::FractionWithoutMemInfo);
                None
            }
            _ => None,
        };
        let stats = DeviceStats {
            max_split_size: conf.max_split_size,
            ..DeviceStats::default()
        };
        let mut allocator = Allocator {
            device,
            conf,
            facts,
            blocks: Blocks::default(),
            pools: [BlockPool::default(), BlockPool::default()],
            by_addr: HashMap::new(),
            segments: BTreeMap::new(),
            events: EventQueues::default(),
            stats,
            total_allocated: 0,
            allowed,
            total_memory,
            gc_limit: None,
            notices,
        };
        allocator.update_gc_limit();
        allocator
    }

    /// Checks and sizes a request: `Ok(None)` for a zero-size one. Runs `process_events` first,
    /// as torch's malloc does.
    pub(crate) fn request(
        &mut self,
        size: u64,
        stream: StreamId,
    ) -> Result<Option<Request>, AllocError<D::Error>> {
        if size >= MAX_REQUEST {
            return Err(AllocError::TooLarge { size });
        }
        if size == 0 {
            return Ok(None);
        }
        // With torch_npu's 32-byte pad the padded size stays far below 2^63; only an absurd pad
        // (a `DeviceFacts` field, or a trace's `pad` line) gets there, and rounding it would
        // overflow: refuse it like any other request beyond 1 EiB.
        let Some(padded) = size.checked_add(self.facts.pad).filter(|&p| p < MAX_PADDED) else {
            return Err(AllocError::TooLarge { size });
        };
        self.process_events().map_err(AllocError::Device)?;
        let rounded = size::round_size(padded, &self.conf);
        Ok(Some(Request {
            stream,
            requested: size,
            size: rounded,
            pool: PoolKind::for_size(rounded),
            alloc_size: size::allocation_size(rounded, &self.conf),
        }))
    }

    /// torch's `get_free_block`: best fit on the request's stream, under the oversize rules.
    pub(crate) fn get_free_block(&mut self, req: &Request) -> Option<BlockId> {
        let gc = self.gc_enabled();
        let pool = &mut self.pools[pool_index(req.pool)];
        if gc {
            pool.lookups += 1;
        }
        let max_split = self.conf.max_split_size;
        let max_non_split_rounding = self.conf.max_non_split_rounding;
        pool.take_best_fit(req.stream, req.size, |candidate| {
            let Some(max_split) = max_split else {
                return true;
            };
            // Rule A: a request below max_split never takes an oversize block.
            if req.size < max_split && candidate >= max_split {
                return false;
            }
            // Rule B: an oversize request takes a block only if it is less than
            // max_non_split_rounding larger. An allowance reaching past 2^64 bytes (a
            // `max_non_split_rounding_mb` near 2^44) allows any block; torch's size_t sum would
            // wrap around and refuse every block instead.
            let limit = req.size.saturating_add(max_non_split_rounding);
            !(req.size >= max_split && candidate >= limit)
        })
    }

    /// Counts the OOM and builds the error with torch_npu's numbers.
    pub(crate) fn out_of_memory(&mut self, req: &Request) -> OutOfMemory {
        let info = self.device.mem_info();
        self.stats.num_ooms += 1;
        OutOfMemory {
            device: self.facts.index,
            requested: req.requested,
            alloc_size: req.alloc_size,
            total: info.map(|m| m.total).or(self.total_memory),
            free: info.map(|m| m.free),
            allocated: self.stats.allocated_bytes.all.current as u64,
            active: self.stats.active_bytes.all.current as u64,
            reserved: self.stats.reserved_bytes.all.current as u64,
            allowed: self.allowed,
        }
    }

    /// Frees the allocation at `addr` (0 is a no-op). A block used on other streams returns to its
    /// pool only once events recorded on those streams complete.
    pub fn free(&mut self, addr: u64) -> Result<(), FreeError<D::Error>> {
        if addr == 0 {
            return Ok(());
        }
        let id = self.live_block(addr)?;
        let recorded = self.record_free_events(id).map_err(FreeError::Device)?;
        let block = &mut self.blocks[id];
        block.allocated = false;
        let (pool, size) = (block.pool, block.size);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        if self.is_oversize(size) {
            self.stats.oversize_allocations.decrease(1);
        }
        if !recorded {
            self.free_block(id);
        }
        Ok(())
    }

    /// torch's `recordStream`: the allocation at `addr` is also used on `stream`.
    pub fn record_stream(
        &mut self,
        addr: u64,
        stream: StreamId,
    ) -> Result<(), FreeError<D::Error>> {
        if addr == 0 {
            return Ok(());
        }
        let id = self.live_block(addr)?;
        let block = &mut self.blocks[id];
        if stream != block.stream && !block.stream_uses.contains(&stream) {
            block.stream_uses.push(stream);
        }
        Ok(())
    }

    /// The live block at `addr`, or why there is none.
    #[inline]
    fn live_block(&self, addr: u64) -> Result<BlockId, FreeError<D::Error>> {
        match self.by_addr.get(&addr) {
            Some(&id) if self.blocks[id].allocated => Ok(id),
            // A cached block (or one whose free waits on events): inside a segment.
            Some(_) => Err(FreeError::NotAllocated { addr }),
            None => Err(self.pointer_error(addr)),
        }
    }

    /// Drops the address-index entry of a block whose record is about to go.
    #[inline]
    pub(crate) fn unindex(&mut self, id: BlockId) {
        let block = &self.blocks[id];
        if block.indexed {
            self.by_addr.remove(&block.addr);
        }
    }

    /// Why `addr` is not a live allocation: it lies inside one of our segments, or it is foreign.
    fn pointer_error(&self, addr: u64) -> FreeError<D::Error> {
        let inside = self
            .segments
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, &head)| addr < self.segment_end(head));
        if inside {
            FreeError::NotAllocated { addr }
        } else {
            FreeError::ForeignPointer { addr }
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
    /// every whole free segment back to the device. Split segments stay.
    pub fn empty_cache(&mut self) -> Result<(), D::Error> {
        self.release_cached_blocks()
    }

    /// `set_per_process_memory_fraction`: limits the bytes of all segments to `fraction` of the
    /// device's total memory. Checked only when a new segment is needed.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), FractionError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(FractionError::OutOfRange(fraction));
        }
        self.allowed = if fraction == 1.0 {
            None
        } else {
            let total = self.total_memory.ok_or(FractionError::TotalUnknown)?;
            Some((fraction * total as f64) as u64)
        };
        self.update_gc_limit();
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

    /// Every statistic of torch's `memory_stats()`.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// `reset_peak_memory_stats`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    /// `reset_accumulated_memory_stats`.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
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

    /// Whether a block of `size` bytes is oversize (≥ `max_split_size`).
    pub(crate) fn is_oversize(&self, size: u64) -> bool {
        self.conf.max_split_size.is_some_and(|m| size >= m)
    }
}
