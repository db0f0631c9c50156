//! Expandable segments: torch_npu's `ExpandableSegment`, `find_expandable_block`, `map_block`,
//! `try_allocate_expandable_block`, `unmap_block` and `release_expandable_segment`.
//!
//! With `expandable_segments:True` a pool does not ask the device for one segment per miss. It
//! reserves one virtual address range per (stream, pool), big enough for 9/8 of the device's
//! total memory, and maps physical pages into it on demand (2 MiB pages in the small pool; in
//! the large pool `large_segment_size_mb`, else `segment_size_mb`, else 20 MiB, or 1 GiB with
//! `page_size:1g`). A miss fills the lowest address that fits, mapping the pages it lacks; the
//! mapped range merges with its free neighbours, so one growing segment replaces many
//! fixed-size ones. Pages go back only on `empty_cache` and the last OOM retry: the whole pages
//! strictly inside each free block are unmapped (after a device synchronization) and freed, and
//! a range left with nothing mapped is released.
//!
//! Stats follow torch: `reserved_bytes` moves in whole pages, `num_device_alloc` counts one per
//! map call and `num_device_free` one per unmapped range, however many pages each covers;
//! `segment` never moves and `inactive_split` leaves these blocks out.
//!
//! A failed device call leaves the books exact: pages created by a failing map call are released,
//! pages already mapped stay mapped as free blocks, and a page or range the device refuses to
//! take back is kept (`parked`) and offered again at the next `empty_cache`.

use alloc::vec::Vec;

use crate::allocator::{Allocator, Notice, Request};
use crate::block::{Block, BlockId, VmId};
use crate::device::{Device, VmmError};
use crate::history::Action;
use crate::pool::BlockPool;
use crate::private_pool::PoolSet;
use crate::size::{PoolKind, SMALL_BUFFER};

/// The probe torch_npu makes before it turns expandable segments on: reserve this many bytes and
/// give them back.
const PROBE_BYTES: u64 = 512;

/// What the 512-byte probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The reservation worked.
    Supported,
    /// The device has no virtual memory.
    Unsupported,
    /// The reservation failed with an error.
    Failed,
}

/// One reserved virtual address range and the pages mapped into it.
#[derive(Debug)]
pub(crate) struct ExpandableSegment<P> {
    /// Start of the reserved range.
    pub(crate) base: u64,
    /// Bytes reserved: a whole number of pages.
    pub(crate) size: u64,
    /// Bytes per page.
    pub(crate) page: u64,
    /// The page mapped at each page index, up to the last mapped one.
    pages: Vec<Option<P>>,
}

impl<P> ExpandableSegment<P> {
    /// Pages mapped now.
    pub(crate) fn mapped_pages(&self) -> usize {
        self.pages.iter().filter(|p| p.is_some()).count()
    }

    /// Drops trailing empty slots (torch's `trimHandles`).
    fn trim(&mut self) {
        while matches!(self.pages.last(), Some(None)) {
            self.pages.pop();
        }
    }
}

/// Device resources held outside the segments: what the device refused to take back (offered
/// again at the next `empty_cache`), and the pages `empty_virt_addr_cache` unmapped and kept.
#[derive(Debug)]
pub(crate) struct Parked<P> {
    pub(crate) pages: Vec<P>,
    /// Reserved ranges as (address, bytes).
    pub(crate) ranges: Vec<(u64, u64)>,
    /// torch_npu's `free_physical_handles_`: pages unmapped by `empty_virt_addr_cache`, each
    /// kept for the next map in its pool, and released by `empty_cache`.
    pub(crate) cached: Vec<CachedPage<P>>,
}

impl<P> Default for Parked<P> {
    fn default() -> Self {
        Parked {
            pages: Vec::new(),
            ranges: Vec::new(),
            cached: Vec::new(),
        }
    }
}

/// A physical page kept unmapped for the next map of its pool (torch_npu keeps one list per
/// `BlockPool`; a page only fits a segment of its own page size).
#[derive(Debug)]
pub(crate) struct CachedPage<P> {
    set: PoolSet,
    pool: PoolKind,
    bytes: u64,
    page: P,
}

impl<P> Parked<P> {
    /// The last page cached for (`set`, `pool`) of `bytes` bytes, as torch_npu takes its
    /// list's back.
    fn take_cached(&mut self, set: PoolSet, pool: PoolKind, bytes: u64) -> Option<P> {
        let i = self
            .cached
            .iter()
            .rposition(|c| c.set == set && c.pool == pool && c.bytes == bytes)?;
        Some(self.cached.remove(i).page)
    }
}

/// One expandable segment as [`Allocator::expandable_segments`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpandableInfo<S> {
    /// Start of the reserved virtual range.
    pub address: u64,
    /// Bytes of virtual address space reserved.
    pub reserved_size: u64,
    /// Bytes per page.
    pub page_size: u64,
    /// Pages mapped now.
    pub mapped_pages: usize,
    /// The stream the segment serves.
    pub stream: S,
    /// The pool the segment serves.
    pub pool: PoolKind,
}

/// Device resources the allocator holds outside its segments: pages and ranges the device
/// refused to take back, kept to be offered again at the next `empty_cache`, and the pages
/// `empty_virt_addr_cache` unmapped and keeps for later maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    /// Physical pages created and not mapped, which the device refused to take back.
    pub pages: usize,
    /// Reserved virtual ranges with no segment.
    pub ranges: usize,
    /// Physical pages kept by `empty_virt_addr_cache` for the next maps (torch_npu's
    /// `free_physical_handles_`): device memory that no statistic counts.
    pub cached_pages: usize,
    /// Their bytes.
    pub cached_bytes: u64,
}

impl<D: Device> Allocator<D> {
    /// torch_npu's check before expandable segments go on: reserve 512 bytes of address space and
    /// give them back. Returns whether virtual memory works; records a notice when not.
    pub(crate) fn probe_virtual_memory(&mut self) -> bool {
        match self.probe() {
            Probe::Supported => true,
            Probe::Unsupported => {
                self.notice(Notice::ExpandableSegmentsUnsupported);
                false
            }
            Probe::Failed => {
                self.notice(Notice::ExpandableSegmentsProbeFailed);
                false
            }
        }
    }

    /// Reserves 512 bytes of address space and gives them back.
    pub(crate) fn probe(&mut self) -> Probe {
        match self.device.reserve_address(PROBE_BYTES) {
            Ok(addr) => {
                if self.device.release_address(addr, PROBE_BYTES).is_err() {
                    self.parked.ranges.push((addr, PROBE_BYTES));
                }
                Probe::Supported
            }
            Err(VmmError::Unsupported) => Probe::Unsupported,
            Err(VmmError::OutOfMemory | VmmError::Other(_)) => Probe::Failed,
        }
    }

    /// The page size of `pool`'s expandable segments.
    pub(crate) fn page_size(&self, pool: PoolKind) -> u64 {
        match pool {
            PoolKind::Small => SMALL_BUFFER,
            PoolKind::Large => self.conf.page_size.unwrap_or(self.conf.segment_size),
        }
    }

    /// torch's `try_allocate_expandable_block`: the lowest-address run of free and unmapped
    /// blocks that fits, with the pages it lacks mapped, out of its pool. `Ok(None)` when a page
    /// could not be created for lack of memory (the out-of-memory path goes on); pages mapped by
    /// earlier map calls of this request stay mapped, as free blocks.
    pub(crate) fn try_allocate_expandable_block(
        &mut self,
        req: &Request<D::Stream>,
    ) -> Result<Option<BlockId>, VmmError<D::Error>> {
        let mut c = self.find_expandable_block(req.stream, req.set, req.pool, req.size)?;
        if !self.blocks[c].mapped {
            let bytes = self.blocks[c].size.min(req.size);
            c = match self.map_block(c, bytes) {
                Ok(id) => id,
                Err(VmmError::OutOfMemory) => return Ok(None),
                Err(e) => return Err(e),
            };
        }
        while self.blocks[c].size < req.size {
            let Some(next) = self.blocks[c].next else {
                return Ok(None);
            };
            if self.blocks[next].mapped {
                // Two free mapped neighbours are always merged; if one was not (torch would
                // assert here), take it in.
                match self.try_merge(c, true) {
                    Some((id, _)) => c = id,
                    None => return Ok(None),
                }
                continue;
            }
            let bytes = (req.size - self.blocks[c].size).min(self.blocks[next].size);
            c = match self.map_block(next, bytes) {
                Ok(id) => id,
                Err(VmmError::OutOfMemory) => return Ok(None),
                Err(e) => return Err(e),
            };
        }
        self.pools[(req.set, req.pool)].remove(&self.blocks, c);
        Ok(Some(c))
    }

    /// torch's `find_expandable_block`: for each unmapped block of this stream in address order,
    /// start at the free block just before it if there is one, and take the first start whose
    /// run of idle blocks adds up to `size`. Without one, a new segment is reserved.
    fn find_expandable_block(
        &mut self,
        stream: D::Stream,
        set: PoolSet,
        pool: PoolKind,
        size: u64,
    ) -> Result<BlockId, VmmError<D::Error>> {
        let blocks = &self.blocks;
        let has_space = |start: BlockId| {
            let (mut run, mut b) = (0u64, Some(start));
            while let Some(id) = b.filter(|&id| run < size && blocks[id].is_idle()) {
                run += blocks[id].size;
                b = blocks[id].next;
            }
            run >= size
        };
        let found = self.pools[(set, pool)]
            .unmapped
            .range((stream, 0)..=(stream, u64::MAX))
            .map(|(_, &c)| match blocks[c].prev {
                Some(p) if blocks[p].is_idle() => p,
                _ => c,
            })
            .find(|&start| has_space(start));
        match found {
            Some(start) => Ok(start),
            None => self.new_expandable_segment(stream, set, pool),
        }
    }

    /// Reserves a new segment for (stream, pool): ceil(9/8 × total memory / page) pages, the
    /// total asked of the device anew, as torch_npu does (if the device cannot tell, the total
    /// it gave before serves). Its whole range is one unmapped block.
    fn new_expandable_segment(
        &mut self,
        stream: D::Stream,
        set: PoolSet,
        pool: PoolKind,
    ) -> Result<BlockId, VmmError<D::Error>> {
        let page = self.page_size(pool);
        let total = match (self.device.mem_info(), self.total_memory) {
            (Ok(info), _) => info.total,
            (Err(_), Some(total)) => total,
            (Err(e), None) => return Err(VmmError::Other(e)),
        };
        let pages = total.saturating_add(total / 8).div_ceil(page).max(1);
        // A device of nearly 2^64 bytes: the largest range of whole pages, for the device to
        // refuse (it has not that much address space).
        let bytes = pages.checked_mul(page).unwrap_or(u64::MAX / page * page);
        let base = self.device.reserve_address(bytes)?;
        let vm = match self.expandable.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.expandable.push(None);
                self.expandable.len() - 1
            }
        };
        let vm = VmId::new(vm);
        self.expandable[vm.index()] = Some(ExpandableSegment {
            base,
            size: bytes,
            page,
            pages: Vec::new(),
        });
        let id = self
            .blocks
            .insert(Block::expandable(base, bytes, stream, pool, set, vm, false));
        self.segments.insert(base, id);
        self.pools[(set, pool)].unmapped.insert((stream, base), id);
        self.live_expandable += 1;
        self.count_pool_segment(set, 1);
        Ok(id)
    }

    fn segment(&self, vm: VmId) -> &ExpandableSegment<D::Page> {
        self.expandable[vm.index()]
            .as_ref()
            .expect("a block's expandable segment is live")
    }

    /// torch's `map_block`: maps the pages under the first `bytes` bytes of unmapped block `id`
    /// (whole pages, so possibly more), merges the mapped block with its free neighbours and puts
    /// it in its pool. Returns the merged block. If the device fails part-way, the pages mapped
    /// so far are kept as a free block and the error is returned.
    fn map_block(&mut self, id: BlockId, bytes: u64) -> Result<BlockId, VmmError<D::Error>> {
        let block = &self.blocks[id];
        debug_assert!(!block.mapped && bytes <= block.size);
        let (addr, size, stream, pool, set, vm) = (
            block.addr,
            block.size,
            block.stream,
            block.pool,
            block.set,
            block.vm,
        );
        let vm = vm.expect("an unmapped block lies in an expandable segment");
        let seg = self.segment(vm);
        let page = seg.page;
        let begin = (addr - seg.base) / page;
        let end = (addr + bytes - seg.base).div_ceil(page);
        let (pages, error) = self.map_pages(vm, (set, pool), begin, end);
        let mapped = pages * page;
        if mapped == 0 {
            return Err(error.unwrap_or(VmmError::OutOfMemory));
        }
        let pool_set = &mut self.pools[(set, pool)];
        pool_set.unmapped.remove(&(stream, addr));
        if mapped < size {
            let rest = Block {
                prev: Some(id),
                next: self.blocks[id].next,
                ..Block::expandable(addr + mapped, size - mapped, stream, pool, set, vm, false)
            };
            let rid = self.blocks.insert(rest);
            if let Some(next) = self.blocks[id].next {
                self.blocks[next].prev = Some(rid);
            }
            self.blocks[id].next = Some(rid);
            self.blocks[id].size = mapped;
            pool_set.unmapped.insert((stream, addr + mapped), rid);
        }
        self.blocks[id].mapped = true;
        let mut id = id;
        for next in [false, true] {
            if let Some((merged, _)) = self.try_merge(id, next) {
                id = merged;
            }
        }
        self.pools[(set, pool)].insert(&mut self.blocks[id], id);
        self.total_allocated += mapped;
        self.stats.reserved_bytes.increase(pool, mapped);
        self.stats.num_device_alloc += 1;
        self.note_held();
        if self.history.is_some() {
            self.record(Action::SegmentMap, addr, mapped, Some(stream), set);
        }
        match error {
            None => Ok(id),
            Some(e) => Err(e),
        }
    }

    /// torch's `ExpandableSegment::map`: takes a page for each index in `begin..end` (one the
    /// pool cached, else a new one), then maps them in order. Returns how many pages from
    /// `begin` on are mapped, and the error that stopped it. A failed creation releases every
    /// page this call took, cached ones included, as torch_npu frees them.
    fn map_pages(
        &mut self,
        vm: VmId,
        (set, pool): (PoolSet, PoolKind),
        begin: u64,
        end: u64,
    ) -> (u64, Option<VmmError<D::Error>>) {
        let seg = self.expandable[vm.index()]
            .as_mut()
            .expect("a block's expandable segment is live");
        let (page, base) = (seg.page, seg.base);
        let (b, e) = (begin as usize, end as usize);
        if seg.pages.len() < e {
            seg.pages.resize_with(e, || None);
        }
        for i in b..e {
            debug_assert!(seg.pages[i].is_none());
            if let Some(p) = self.parked.take_cached(set, pool, page) {
                seg.pages[i] = Some(p);
                continue;
            }
            match self.device.create_page(page) {
                Ok(p) => seg.pages[i] = Some(p),
                Err(error) => {
                    let created: Vec<D::Page> = seg.pages[b..i]
                        .iter_mut()
                        .filter_map(Option::take)
                        .collect();
                    seg.trim();
                    self.release_pages(created);
                    return (0, Some(error));
                }
            }
        }
        for i in b..e {
            let addr = base + i as u64 * page;
            let p = seg.pages[i].as_ref().expect("created above");
            if let Err(error) = self.device.map(addr, page, p) {
                let unmapped: Vec<D::Page> = seg.pages[i..e]
                    .iter_mut()
                    .filter_map(Option::take)
                    .collect();
                seg.trim();
                self.release_pages(unmapped);
                return ((i - b) as u64, Some(error));
            }
        }
        (end - begin, None)
    }

    /// Gives pages back to the device; any it refuses are parked.
    fn release_pages(&mut self, pages: Vec<D::Page>) {
        for p in pages {
            if let Err((p, _)) = self.device.release_page(p) {
                self.parked.pages.push(p);
            }
        }
    }

    /// torch's `unmap_block`: unmaps the whole pages strictly inside free block `id` after a
    /// device synchronization; the free bytes before and after them stay mapped as free blocks.
    /// The unmapped range merges with unmapped neighbours and joins the pool's `unmapped` set.
    /// Returns it, or `None` when no whole page lay inside the block. With `keep`
    /// (`empty_virt_addr_cache`) the pages are cached for the pool's next maps instead of
    /// freed.
    pub(crate) fn unmap_block(
        &mut self,
        id: BlockId,
        keep: bool,
    ) -> Result<Option<BlockId>, VmmError<D::Error>> {
        let block = &self.blocks[id];
        let (addr, size, stream, pool, set) =
            (block.addr, block.size, block.stream, block.pool, block.set);
        let vm = block.vm.expect("only expandable blocks are unmapped");
        let seg = self.segment(vm);
        let (page, base) = (seg.page, seg.base);
        let begin = (addr - base).div_ceil(page);
        let end = (addr + size - base) / page;
        if begin >= end {
            return Ok(None);
        }
        let (pages, error) = self.unmap_pages(vm, keep.then_some((set, pool)), begin, end);
        if pages == 0 {
            return error.map_or(Ok(None), Err);
        }
        let (start, unmapped) = (base + begin * page, pages * page);
        self.pools[(set, pool)].remove(&self.blocks, id);
        let before = start - addr;
        let after = addr + size - (start + unmapped);
        let uid = if before > 0 {
            // The block keeps its id as the free bytes before the unmapped range.
            let u = Block {
                prev: Some(id),
                next: self.blocks[id].next,
                ..Block::expandable(start, unmapped, stream, pool, set, vm, false)
            };
            let uid = self.blocks.insert(u);
            if let Some(next) = self.blocks[id].next {
                self.blocks[next].prev = Some(uid);
            }
            self.blocks[id].next = Some(uid);
            self.blocks[id].size = before;
            self.pools[(set, pool)].insert(&mut self.blocks[id], id);
            uid
        } else {
            let b = &mut self.blocks[id];
            b.size = unmapped;
            b.mapped = false;
            id
        };
        if after > 0 {
            let a = Block {
                prev: Some(uid),
                next: self.blocks[uid].next,
                ..Block::expandable(start + unmapped, after, stream, pool, set, vm, true)
            };
            let aid = self.blocks.insert(a);
            if let Some(next) = self.blocks[uid].next {
                self.blocks[next].prev = Some(aid);
            }
            self.blocks[uid].next = Some(aid);
            self.pools[(set, pool)].insert(&mut self.blocks[aid], aid);
        }
        let mut uid = uid;
        for next in [false, true] {
            if let Some((merged, _)) = self.try_merge(uid, next) {
                uid = merged;
            }
        }
        let u = &self.blocks[uid];
        self.pools[(set, pool)]
            .unmapped
            .insert((stream, u.addr), uid);
        self.total_allocated -= unmapped;
        self.stats.reserved_bytes.decrease(pool, unmapped);
        self.stats.num_device_free += 1;
        if self.history.is_some() {
            self.record(Action::SegmentUnmap, start, unmapped, Some(stream), set);
        }
        match error {
            None => Ok(Some(uid)),
            Some(e) => Err(e),
        }
    }

    /// torch_npu's `unmapHandles`: synchronizes the device, then unmaps each page of
    /// `begin..end` in order and frees it, or caches it for pool `keep`. Returns how many pages
    /// from `begin` on were unmapped, and the error that stopped it.
    fn unmap_pages(
        &mut self,
        vm: VmId,
        keep: Option<(PoolSet, PoolKind)>,
        begin: u64,
        end: u64,
    ) -> (u64, Option<VmmError<D::Error>>) {
        if let Err(e) = self.device.synchronize() {
            return (0, Some(VmmError::Other(e)));
        }
        let seg = self.expandable[vm.index()]
            .as_mut()
            .expect("a block's expandable segment is live");
        let (page, base) = (seg.page, seg.base);
        for i in begin..end {
            if let Err(e) = self.device.unmap(base + i * page, page) {
                seg.trim();
                return (i - begin, Some(e));
            }
            let p = seg.pages[i as usize].take().expect("a mapped page");
            if let Some((set, pool)) = keep {
                self.parked.cached.push(CachedPage {
                    set,
                    pool,
                    bytes: page,
                    page: p,
                });
            } else if let Err((p, _)) = self.device.release_page(p) {
                self.parked.pages.push(p);
            }
        }
        seg.trim();
        (end - begin, None)
    }

    /// torch's `release_expandable_segment`: a segment whose whole range is one unmapped block
    /// gives its range back and is forgotten; a range the device refuses is kept to be offered
    /// again at the next `empty_cache`.
    pub(crate) fn release_expandable_segment(
        &mut self,
        id: BlockId,
    ) -> Result<(), VmmError<D::Error>> {
        let block = &self.blocks[id];
        debug_assert!(!block.mapped && !block.is_split());
        let (addr, size, stream, pool, set) =
            (block.addr, block.size, block.stream, block.pool, block.set);
        let vm = block
            .vm
            .expect("only expandable segments are released here");
        if self.device.release_address(addr, size).is_err() {
            // Nothing is mapped there any more: the range is kept to be given back later.
            self.parked.ranges.push((addr, size));
        }
        self.pools[(set, pool)].unmapped.remove(&(stream, addr));
        self.count_pool_segment(set, -1);
        self.segments.remove(&addr);
        self.unindex(id);
        self.blocks.remove(id);
        self.expandable[vm.index()] = None;
        self.live_expandable -= 1;
        Ok(())
    }

    /// torch's `release_blocks` for the expandable part of a pool: unmaps every free block's
    /// inner pages, in pool order, and releases each segment left wholly unmapped. The pages
    /// are freed, or with `keep` cached for the pool's next maps.
    pub(crate) fn release_expandable_blocks(
        &mut self,
        set: PoolSet,
        pool: PoolKind,
        keep: bool,
    ) -> Result<(), VmmError<D::Error>> {
        let free: Vec<BlockId> = self.pools[(set, pool)]
            .iter()
            .filter(|&id| self.blocks[id].is_expandable())
            .collect();
        for id in free {
            if let Some(uid) = self.unmap_block(id, keep)?
                && !self.blocks[uid].is_split()
            {
                self.release_expandable_segment(uid)?;
            }
        }
        Ok(())
    }

    /// The end of torch_npu's `release_blocks` with `free_physical`: frees the pages cached for
    /// (`set`, `pool`), or for every pool of `set` (`None`: a private pool being forgotten).
    /// Any the device refuses are parked.
    pub(crate) fn release_cached_pages(&mut self, set: PoolSet, pool: Option<PoolKind>) {
        if self.parked.cached.is_empty() {
            return;
        }
        let (cached, kept) = core::mem::take(&mut self.parked.cached)
            .into_iter()
            .partition(|c| c.set == set && pool.is_none_or(|p| c.pool == p));
        self.parked.cached = kept;
        let cached: Vec<CachedPage<D::Page>> = cached;
        self.release_pages(cached.into_iter().map(|c| c.page).collect());
    }

    /// Offers the device again what it refused to take back, and releases the segments left
    /// wholly unmapped (by an earlier failure, or a first map that ran out of memory) of every
    /// pool (`None`) or of the pool sets in `only` (a private pool's `empty_cache`, which
    /// leaves other pools' segments alone, as torch's). What the device refuses again stays
    /// parked.
    pub(crate) fn retry_parked(
        &mut self,
        only: Option<&[PoolSet]>,
    ) -> Result<(), VmmError<D::Error>> {
        let pages = core::mem::take(&mut self.parked.pages);
        self.release_pages(pages);
        for (addr, bytes) in core::mem::take(&mut self.parked.ranges) {
            if self.device.release_address(addr, bytes).is_err() {
                self.parked.ranges.push((addr, bytes));
            }
        }
        let pools: Vec<&BlockPool<D::Stream>> = match only {
            None => self.pools.all().collect(),
            Some(sets) => sets
                .iter()
                .flat_map(|&set| {
                    [PoolKind::Small, PoolKind::Large].map(|kind| &self.pools[(set, kind)])
                })
                .collect(),
        };
        let idle: Vec<BlockId> = pools
            .into_iter()
            .flat_map(|p| p.unmapped.values().copied())
            .filter(|&id| !self.blocks[id].is_split())
            .collect();
        for id in idle {
            self.release_expandable_segment(id)?;
        }
        Ok(())
    }

    /// Every expandable segment, in address order.
    pub fn expandable_segments(&self) -> Vec<ExpandableInfo<D::Stream>> {
        self.segments
            .values()
            .filter_map(|&head| {
                let b = &self.blocks[head];
                let seg = self.segment(b.vm?);
                Some(ExpandableInfo {
                    address: seg.base,
                    reserved_size: seg.size,
                    page_size: seg.page,
                    mapped_pages: seg.mapped_pages(),
                    stream: b.stream,
                    pool: b.pool,
                })
            })
            .collect()
    }

    /// Pages and ranges the device refused to take back, held for the next `empty_cache`.
    pub fn held(&self) -> Held {
        Held {
            pages: self.parked.pages.len(),
            ranges: self.parked.ranges.len(),
            cached_pages: self.parked.cached.len(),
            cached_bytes: self.parked.cached.iter().map(|c| c.bytes).sum(),
        }
    }
}
