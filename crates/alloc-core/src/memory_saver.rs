//! The memory saver: torch_memory_saver's `region`, `pause` and `resume`, built into the cache.
//!
//! A tag names a private pool (one per tag and backup choice) whose segments are backed by
//! virtual memory: each segment is its own reserved address range with one physical page of the
//! segment's size mapped into it. `pause(tag)` synchronizes the device, copies each mapped
//! segment of the tag to host memory if the tag keeps a CPU backup, then unmaps and frees its
//! physical memory; the address ranges stay reserved and every block (live or cached) stays
//! where it is, so torch's stats do not move. `resume(tag)` creates new physical memory, maps it
//! at the same addresses and copies the backup back. Unlike torch_memory_saver, which sits below
//! the cache, the policy knows every segment's state, so each misuse is a typed error:
//!
//! - allocating in a paused tag's region: [`AllocError::Paused`](crate::AllocError::Paused)
//!   (never an unmapped address, never a new segment that a later resume would trip over);
//! - freeing into a paused tag: allowed, bookkeeping only (no device access);
//! - `pause(tag)` of a paused tag: [`SaverError::AlreadyPaused`]; `pause()` of every tag skips
//!   the paused ones;
//! - `resume(tag)` of a tag that is not paused: [`SaverError::NotPaused`]; `resume()` of every
//!   tag resumes the paused ones;
//! - an unknown tag: [`SaverError::UnknownTag`];
//! - `empty_cache` while paused: the tags' pools are held, so their segments stay, as torch
//!   keeps a live `MemPool`'s cache;
//! - out of memory while resuming: every segment this call mapped is unmapped again (its backup
//!   kept), the tag stays paused and a later `resume` can still succeed;
//! - out of host memory for a CPU backup while pausing: [`SaverError::HostOutOfMemory`]; the
//!   segments paused so far stay paused, the rest stay mapped, and `pause(tag)` again retries
//!   them.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use crate::allocator::{Allocator, Request};
use crate::device::{Device, VmmError};
use crate::error::AllocError;
use crate::oom_retry::MallocStep;
use crate::private_pool::{PoolError, PoolId, PoolSet, SaverTag};
use crate::stats::Stat;

/// One memory-saver segment: its physical page while mapped, its CPU backup while paused (and
/// after a resume that retained it or an undo that failed).
#[derive(Debug)]
pub(crate) struct SaverSegment<P, H> {
    size: u64,
    set: PoolSet,
    page: Option<P>,
    backup: Option<H>,
    /// Mapped, but its backup's bytes were never copied back (the copy failed and so did the
    /// unmap that would have undone the map): the next resume copies them.
    stale: bool,
}

/// The memory saver's books.
#[derive(Debug)]
pub(crate) struct Saver<P, H> {
    /// Every memory-saver segment by address.
    segments: BTreeMap<u64, SaverSegment<P, H>>,
    /// Bytes paused, all tags together.
    paused: Stat,
    /// Physical memory held: reserved bytes less paused ones.
    held: Stat,
    /// Bytes paused per tag.
    per_tag: BTreeMap<String, Stat>,
    /// Host buffers the device refused to take back, offered again by `empty_cache`.
    pub(crate) parked_host: Vec<H>,
    /// torch_memory_saver's `retain_cpu_backup`: a resume keeps each segment's host buffer,
    /// which the next pause reuses (read at each resume).
    retain_cpu_backup: bool,
    /// torch_memory_saver's `memory_margin_bytes`: a new segment of a tag is refused (out of
    /// memory) unless the device keeps this many bytes free beside it. 0: no check.
    memory_margin: u64,
}

impl<P, H> Default for Saver<P, H> {
    fn default() -> Self {
        Saver {
            segments: BTreeMap::new(),
            paused: Stat::default(),
            held: Stat::default(),
            per_tag: BTreeMap::new(),
            parked_host: Vec::new(),
            retain_cpu_backup: false,
            memory_margin: 0,
        }
    }
}

/// A failed `pause` or `resume`; see the module documentation for what each leaves behind.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SaverError<E> {
    /// No region of this tag was ever entered on this device.
    UnknownTag(String),
    /// `pause(tag)` of a tag whose memory is already paused.
    AlreadyPaused(String),
    /// `resume(tag)` of a tag that is not paused.
    NotPaused(String),
    /// `resume` could not create physical memory for a segment of `bytes` bytes; what this call
    /// had mapped was unmapped again and the tag stays paused.
    OutOfMemory {
        /// The tag being resumed.
        tag: String,
        /// The segment that did not fit.
        bytes: u64,
    },
    /// `pause` could not get host memory for the CPU backup of a segment of `bytes` bytes. The
    /// segments it paused before stay paused; this one and those after it stay mapped, with
    /// their bytes, and `pause(tag)` again retries them (`pause()` of every tag skips a tag
    /// already marked paused).
    HostOutOfMemory {
        /// The tag being paused.
        tag: String,
        /// The segment whose backup did not fit.
        bytes: u64,
    },
    /// The device has no virtual memory or host copies.
    Unsupported,
    /// `cpu_backup` of a range no memory-saver segment holds whole.
    NotSaverMemory {
        /// The range's first byte.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// `cpu_backup` of paused memory of a tag without CPU backup: its bytes are gone.
    NoCpuBackup(String),
    /// A device call failed; the books are exact and the call can be retried. A failed `pause`
    /// leaves the tag marked paused with its segments from the failed one on mapped:
    /// `pause(tag)` retries them (`pause()` of every tag skips a tag already marked paused).
    Device(E),
}

impl<E: fmt::Display> fmt::Display for SaverError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SaverError::UnknownTag(tag) => write!(f, "memory saver tag {tag:?} has no region"),
            SaverError::AlreadyPaused(tag) => {
                write!(f, "memory saver tag {tag:?} is already paused")
            }
            SaverError::NotPaused(tag) => write!(f, "memory saver tag {tag:?} is not paused"),
            SaverError::OutOfMemory { tag, bytes } => write!(
                f,
                "out of device memory resuming tag {tag:?} (a segment of {bytes} bytes); it stays \
                 paused"
            ),
            SaverError::HostOutOfMemory { tag, bytes } => write!(
                f,
                "out of host memory backing up tag {tag:?} (a segment of {bytes} bytes) while \
                 pausing; that segment and those after it stay mapped, and pausing the tag again \
                 retries them"
            ),
            SaverError::Unsupported => f.write_str(
                "the memory saver needs virtual memory and host copies, which the device lacks",
            ),
            SaverError::NotSaverMemory { addr, len } => write!(
                f,
                "no memory-saver segment holds the {len} bytes at {addr:#x} (memory allocated \
                 outside every region has no CPU backup)"
            ),
            SaverError::NoCpuBackup(tag) => write!(
                f,
                "memory saver tag {tag:?} is paused without a CPU backup: its bytes are gone \
                 (enter its region with enable_cpu_backup)"
            ),
            SaverError::Device(e) => write!(f, "device error: {e}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> core::error::Error for SaverError<E> {}

/// The CPU backup holding a range ([`Allocator::cpu_backup`]): the host buffer of the
/// memory-saver segment that holds it (the whole segment's bytes) and the range's offset in it.
#[derive(Debug)]
pub struct CpuBackup<'a, H> {
    /// The segment's host buffer.
    pub buffer: &'a H,
    /// Where the range starts in it.
    pub offset: u64,
}

/// The memory saver's figures (not torch keys: torch's stats do not move on a pause).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SaverStats {
    /// Bytes paused, all tags together (current and peak).
    pub paused_bytes: Stat,
    /// Physical memory held: `reserved_bytes` less the paused bytes (current and peak).
    pub held_bytes: Stat,
    /// Per tag, in tag order.
    pub tags: Vec<TagStats>,
}

/// One tag's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagStats {
    /// The tag.
    pub tag: String,
    /// Whether it is paused.
    pub paused: bool,
    /// Its segments (both backup choices).
    pub segments: usize,
    /// Bytes of its segments.
    pub bytes: u64,
    /// Bytes paused (current and peak).
    pub paused_bytes: Stat,
}

/// The error of a virtual-memory call, as a saver error.
fn saver_err<E>(e: VmmError<E>, tag: &str, bytes: u64) -> SaverError<E> {
    match e {
        VmmError::Unsupported => SaverError::Unsupported,
        VmmError::OutOfMemory => SaverError::OutOfMemory {
            tag: tag.to_string(),
            bytes,
        },
        VmmError::Other(e) => SaverError::Device(e),
    }
}

impl<D: Device> Allocator<D> {
    /// The private pool of memory-saver tag `tag` with or without CPU backup, made on first use
    /// (torch_memory_saver keeps one `MemPool` per tag and backup choice for the process's
    /// life). The device must have virtual memory: it is probed as for expandable segments.
    pub fn saver_pool(&mut self, tag: &str, cpu_backup: bool) -> Result<PoolId, PoolError> {
        let existing = self.pools.private.iter().flatten().find(|p| {
            p.saver
                .as_ref()
                .is_some_and(|s| s.tag == tag && s.cpu_backup == cpu_backup)
        });
        if let Some(p) = existing {
            return Ok(p.id);
        }
        // A probe that fails with an error says nothing: the first segment will tell.
        if self.probe() == crate::expandable::Probe::Unsupported {
            return Err(PoolError::NoVirtualMemory);
        }
        // A tag paused before keeps refusing allocations in its new pool too.
        let paused = self.tag_sets(tag).iter().any(|&set| self.set_paused(set));
        self.add_pool(Some(SaverTag {
            tag: tag.to_string(),
            cpu_backup,
            paused,
        }))
    }

    /// Whether pool set `set` is a memory-saver pool.
    #[inline]
    pub(crate) fn is_saver_set(&self, set: PoolSet) -> bool {
        self.pools.private(set).is_some_and(|p| p.saver.is_some())
    }

    fn saver_tag(&self, set: PoolSet) -> &SaverTag {
        self.pools
            .private(set)
            .and_then(|p| p.saver.as_ref())
            .expect("a memory-saver set")
    }

    fn set_paused(&self, set: PoolSet) -> bool {
        self.saver_tag(set).paused
    }

    /// The memory-saver sets of `tag`.
    fn tag_sets(&self, tag: &str) -> Vec<PoolSet> {
        self.pools
            .sets()
            .filter(|&set| self.is_saver_set(set) && self.saver_tag(set).tag == tag)
            .collect()
    }

    /// The memory-saver sets a pause or resume of `tag` (every tag for `None`) acts on.
    fn saver_sets(&self, tag: Option<&str>) -> Result<Vec<PoolSet>, SaverError<D::Error>> {
        match tag {
            Some(tag) => {
                let sets = self.tag_sets(tag);
                if sets.is_empty() {
                    return Err(SaverError::UnknownTag(tag.to_string()));
                }
                Ok(sets)
            }
            None => Ok(self
                .pools
                .sets()
                .filter(|&set| self.is_saver_set(set))
                .collect()),
        }
    }

    /// The mapped (`mapped`) or paused segments of `sets`, in address order.
    fn saver_segments_of(&self, sets: &[PoolSet], mapped: bool) -> Vec<u64> {
        self.saver
            .segments
            .iter()
            .filter(|(_, s)| sets.contains(&s.set) && s.page.is_some() == mapped)
            .map(|(&addr, _)| addr)
            .collect()
    }

    /// torch_memory_saver's `pause(tag)` (every tag for `None`): returns the bytes paused.
    pub fn pause(&mut self, tag: Option<&str>) -> Result<u64, SaverError<D::Error>> {
        let mut sets = self.saver_sets(tag)?;
        if tag.is_none() {
            // `pause()` leaves the tags already paused alone, but not one a failed pause left
            // with segments still mapped: a retry finishes it.
            sets.retain(|&set| {
                !self.set_paused(set) || !self.saver_segments_of(&[set], true).is_empty()
            });
        }
        let targets = self.saver_segments_of(&sets, true);
        if let Some(tag) = tag {
            let all_paused = sets.iter().all(|&set| self.set_paused(set));
            if all_paused && targets.is_empty() {
                return Err(SaverError::AlreadyPaused(tag.to_string()));
            }
        }
        // Work queued on the device may still use the memory: wait for it first.
        self.device.synchronize().map_err(SaverError::Device)?;
        let was_paused: Vec<bool> = sets.iter().map(|&set| self.set_paused(set)).collect();
        for &set in &sets {
            self.mark_paused(set, true);
        }
        let mut paused = 0;
        for addr in targets {
            match self.pause_segment(addr) {
                Ok(bytes) => paused += bytes,
                Err(e) => {
                    // A set this call marked but left wholly mapped is not paused: it keeps
                    // allocating until a retry pauses it.
                    for (&set, &was) in sets.iter().zip(&was_paused) {
                        if !was && self.saver_segments_of(&[set], false).is_empty() {
                            self.mark_paused(set, false);
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(paused)
    }

    /// Marks set `set`'s tag paused or not.
    fn mark_paused(&mut self, set: PoolSet, paused: bool) {
        if let Some(s) = self.pools.private_mut(set).and_then(|p| p.saver.as_mut()) {
            s.paused = paused;
        }
    }

    /// Backs up (if the tag asks), unmaps and frees one mapped segment's memory.
    fn pause_segment(&mut self, addr: u64) -> Result<u64, SaverError<D::Error>> {
        let seg = &self.saver.segments[&addr];
        let (size, set, stale) = (seg.size, seg.set, seg.stale);
        let SaverTag {
            tag, cpu_backup, ..
        } = self.saver_tag(set).clone();
        let kept = self
            .saver
            .segments
            .get_mut(&addr)
            .and_then(|s| s.backup.take());
        let backup = if cpu_backup {
            // A segment left mapped by a failed resume still has its host buffer: reuse it.
            let mut buffer = match kept {
                Some(buffer) => buffer,
                None => self.device.alloc_host(size).map_err(|e| match e {
                    // The host's memory, not the device's (`saver_err`'s out of memory).
                    VmmError::OutOfMemory => SaverError::HostOutOfMemory {
                        tag: tag.clone(),
                        bytes: size,
                    },
                    e => saver_err(e, &tag, size),
                })?,
            };
            // A stale segment's buffer holds its bytes; the device's are not them.
            if !stale && let Err(e) = self.device.copy_to_host(&mut buffer, addr, size) {
                self.give_back_host(buffer);
                return Err(saver_err(e, &tag, size));
            }
            Some(buffer)
        } else {
            None
        };
        if let Err(e) = self.device.unmap(addr, size) {
            if let Some(buffer) = backup {
                if stale {
                    // Its bytes live only there.
                    if let Some(seg) = self.saver.segments.get_mut(&addr) {
                        seg.backup = Some(buffer);
                    }
                } else {
                    self.give_back_host(buffer);
                }
            }
            return Err(saver_err(e, &tag, size));
        }
        let seg = self.saver.segments.get_mut(&addr).expect("a saver segment");
        let page = seg.page.take().expect("a mapped segment");
        seg.backup = backup;
        seg.stale = false;
        self.give_back_page(page);
        self.saver.paused.increase(size);
        self.saver.per_tag.entry(tag).or_default().increase(size);
        self.note_held();
        Ok(size)
    }

    /// torch_memory_saver's `resume(tag)` (every paused tag for `None`): returns the bytes
    /// mapped again. On failure every segment this call mapped is unmapped again, with its
    /// backup kept, and the tag stays paused.
    pub fn resume(&mut self, tag: Option<&str>) -> Result<u64, SaverError<D::Error>> {
        let mut sets = self.saver_sets(tag)?;
        sets.retain(|&set| self.set_paused(set));
        if let (Some(tag), true) = (tag, sets.is_empty()) {
            return Err(SaverError::NotPaused(tag.to_string()));
        }
        // Segments a double fault left mapped without their bytes: copied back first.
        let stale: Vec<u64> = self
            .saver
            .segments
            .iter()
            .filter(|(_, s)| s.stale && sets.contains(&s.set))
            .map(|(&addr, _)| addr)
            .collect();
        for addr in stale {
            self.restore_stale(addr)?;
        }
        let targets = self.saver_segments_of(&sets, false);
        let mut done = Vec::with_capacity(targets.len());
        for addr in targets {
            match self.resume_segment(addr) {
                Ok(()) => done.push(addr),
                Err(e) => {
                    for &addr in done.iter().rev() {
                        self.unmap_again(addr);
                    }
                    return Err(e);
                }
            }
        }
        let bytes = done.iter().map(|addr| self.saver.segments[addr].size).sum();
        if !self.saver.retain_cpu_backup {
            // What this call mapped, and what an earlier one left mapped with its backup (an
            // undo whose unmap failed): no mapped segment of these tags keeps one.
            let kept: Vec<_> = self
                .saver
                .segments
                .values_mut()
                .filter(|s| s.page.is_some() && sets.contains(&s.set))
                .filter_map(|s| s.backup.take())
                .collect();
            for buffer in kept {
                self.give_back_host(buffer);
            }
        }
        for &set in &sets {
            if let Some(s) = self.pools.private_mut(set).and_then(|p| p.saver.as_mut()) {
                s.paused = false;
            }
        }
        Ok(bytes)
    }

    /// Creates and maps new memory for one paused segment, and copies its backup back.
    fn resume_segment(&mut self, addr: u64) -> Result<(), SaverError<D::Error>> {
        let seg = &self.saver.segments[&addr];
        let (size, set) = (seg.size, seg.set);
        let tag = self.saver_tag(set).tag.clone();
        let page = self
            .device
            .create_page(size)
            .map_err(|e| saver_err(e, &tag, size))?;
        if let Err(e) = self.device.map(addr, size, &page) {
            self.give_back_page(page);
            return Err(saver_err(e, &tag, size));
        }
        if let Err(e) = self.copy_back(addr) {
            if self.device.unmap(addr, size).is_ok() {
                self.give_back_page(page);
            } else {
                // Still mapped: keep the page there, so the books match the device; its bytes
                // are copied back at the next resume.
                self.finish_resume(addr, page, &tag);
                if let Some(seg) = self.saver.segments.get_mut(&addr) {
                    seg.stale = true;
                }
            }
            return Err(saver_err(e, &tag, size));
        }
        self.finish_resume(addr, page, &tag);
        Ok(())
    }

    /// Copies a mapped segment's backup (if its tag keeps one) back onto the device.
    fn copy_back(&mut self, addr: u64) -> Result<(), VmmError<D::Error>> {
        let seg = &self.saver.segments[&addr];
        match seg.backup.as_ref() {
            Some(backup) => self.device.copy_to_device(addr, backup, seg.size),
            None => Ok(()),
        }
    }

    /// Copies a stale segment's backup back, and gives the buffer back.
    fn restore_stale(&mut self, addr: u64) -> Result<(), SaverError<D::Error>> {
        if let Err(e) = self.copy_back(addr) {
            let seg = &self.saver.segments[&addr];
            return Err(saver_err(e, &self.saver_tag(seg.set).tag, seg.size));
        }
        let seg = self.saver.segments.get_mut(&addr).expect("a saver segment");
        seg.stale = false;
        if !self.saver.retain_cpu_backup
            && let Some(buffer) = seg.backup.take()
        {
            self.give_back_host(buffer);
        }
        Ok(())
    }

    /// Records a segment as mapped again.
    fn finish_resume(&mut self, addr: u64, page: D::Page, tag: &str) {
        let seg = self.saver.segments.get_mut(&addr).expect("a saver segment");
        seg.page = Some(page);
        let size = seg.size;
        self.saver.paused.decrease(size);
        if let Some(stat) = self.saver.per_tag.get_mut(tag) {
            stat.decrease(size);
        }
        self.note_held();
    }

    /// Undoes a resume of one segment (its backup is still held); if the device refuses the
    /// unmap the segment stays mapped, which a later resume skips.
    fn unmap_again(&mut self, addr: u64) {
        let seg = &self.saver.segments[&addr];
        let (size, set) = (seg.size, seg.set);
        if self.device.unmap(addr, size).is_err() {
            return;
        }
        let tag = self.saver_tag(set).tag.clone();
        let seg = self.saver.segments.get_mut(&addr).expect("a saver segment");
        let page = seg.page.take().expect("mapped by this resume");
        self.give_back_page(page);
        self.saver.paused.increase(size);
        self.saver.per_tag.entry(tag).or_default().increase(size);
        self.note_held();
    }

    /// Gives a physical page back to the device, or parks it.
    fn give_back_page(&mut self, page: D::Page) {
        if let Err((page, _)) = self.device.release_page(page) {
            self.parked.pages.push(page);
        }
    }

    /// Gives a host buffer back to the device, or parks it.
    fn give_back_host(&mut self, buffer: D::HostBuffer) {
        if let Err((buffer, _)) = self.device.free_host(buffer) {
            self.saver.parked_host.push(buffer);
        }
    }

    /// Offers parked host buffers again.
    pub(crate) fn retry_parked_host(&mut self) {
        for buffer in core::mem::take(&mut self.saver.parked_host) {
            self.give_back_host(buffer);
        }
    }

    /// Updates the held-memory figure after reserved or paused bytes changed.
    pub(crate) fn note_held(&mut self) {
        let held = self.stats.reserved_bytes.all_current() - self.saver.paused.current;
        let h = &mut self.saver.held;
        h.current = held;
        h.peak = h.peak.max(held);
    }

    /// Resets the memory saver's peaks (with `reset_peak_memory_stats`).
    pub(crate) fn reset_saver_peaks(&mut self) {
        self.saver.paused.reset_peak();
        self.saver.held.reset_peak();
        for stat in self.saver.per_tag.values_mut() {
            stat.reset_peak();
        }
    }

    /// torch_memory_saver's `retain_cpu_backup`: with it, a resume keeps each segment's CPU
    /// backup (what it held at the pause, not updated while the memory is in use) and the next
    /// pause copies into it instead of allocating host memory again. Read at each resume:
    /// turning it off frees nothing at once; the next resume of a tag frees the backups of its
    /// mapped segments, and a segment's release frees its own.
    pub fn set_retain_cpu_backup(&mut self, retain: bool) {
        self.saver.retain_cpu_backup = retain;
    }

    /// torch_memory_saver's `memory_margin_bytes`: a new segment of a memory-saver tag (a
    /// region's allocation that no cached block serves) runs out of memory, going on along
    /// torch's retry chain, unless the device would have `bytes` free beside it (asked with
    /// `mem_info` before each such segment; 0, the default, asks nothing). Resumes and other
    /// pools are not checked, as upstream.
    pub fn set_saver_memory_margin(&mut self, bytes: u64) {
        self.saver.memory_margin = bytes;
    }

    /// The memory saver's margin ([`Allocator::set_saver_memory_margin`]).
    pub fn saver_memory_margin(&self) -> u64 {
        self.saver.memory_margin
    }

    /// Whether resumes keep CPU backups ([`Allocator::set_retain_cpu_backup`]).
    pub fn retain_cpu_backup(&self) -> bool {
        self.saver.retain_cpu_backup
    }

    /// torch_memory_saver's `get_cpu_backup`: the host copy of the `len` bytes at `addr`, in
    /// the backup buffer of the memory-saver segment that holds them.
    /// Paused memory of a tag with CPU backup has one (its bytes at the pause); memory in use
    /// has one only while [`Allocator::retain_cpu_backup`] kept it (its bytes at the last
    /// pause), else `Ok(None)`. Paused memory of a tag without backup is
    /// [`SaverError::NoCpuBackup`]; a range outside every memory-saver segment (or across two)
    /// is [`SaverError::NotSaverMemory`].
    pub fn cpu_backup(
        &self,
        addr: u64,
        len: u64,
    ) -> Result<Option<CpuBackup<'_, D::HostBuffer>>, SaverError<D::Error>> {
        let outside = || SaverError::NotSaverMemory { addr, len };
        let (&base, seg) = self
            .saver
            .segments
            .range(..=addr)
            .next_back()
            .ok_or_else(outside)?;
        let offset = addr - base;
        if offset.checked_add(len).is_none_or(|end| end > seg.size) {
            return Err(outside());
        }
        match (&seg.backup, seg.page.is_none()) {
            (Some(buffer), _) => Ok(Some(CpuBackup { buffer, offset })),
            (None, true) => Err(SaverError::NoCpuBackup(self.saver_tag(seg.set).tag.clone())),
            (None, false) => Ok(None),
        }
    }

    /// Whether a region of `tag` was ever entered on this device: whether `pause(Some(tag))`
    /// can find it (else [`SaverError::UnknownTag`]).
    pub fn has_saver_tag(&self, tag: &str) -> bool {
        !self.tag_sets(tag).is_empty()
    }

    /// The memory saver's figures.
    pub fn saver_stats(&self) -> SaverStats {
        let mut held = self.saver.held;
        held.current = self.stats.reserved_bytes.all_current() - self.saver.paused.current;
        let mut tags: BTreeMap<&str, TagStats> = BTreeMap::new();
        for set in self.pools.sets().filter(|&s| self.is_saver_set(s)) {
            let t = self.saver_tag(set);
            let entry = tags.entry(&t.tag).or_insert_with(|| TagStats {
                tag: t.tag.clone(),
                paused: false,
                segments: 0,
                bytes: 0,
                paused_bytes: self.saver.per_tag.get(&t.tag).copied().unwrap_or_default(),
            });
            entry.paused |= t.paused;
            for s in self.saver.segments.values().filter(|s| s.set == set) {
                entry.segments += 1;
                entry.bytes += s.size;
            }
        }
        SaverStats {
            paused_bytes: self.saver.paused,
            held_bytes: held,
            tags: tags.into_values().collect(),
        }
    }

    /// The tag of the memory-saver segment at `addr` and whether it is paused, for snapshots.
    pub(crate) fn saver_segment_state(&self, addr: u64) -> Option<(String, bool)> {
        let seg = self.saver.segments.get(&addr)?;
        Some((self.saver_tag(seg.set).tag.clone(), seg.page.is_none()))
    }

    /// A miss in a memory-saver pool: a new segment is a reserved range of `alloc_size` bytes
    /// with one physical page of that size mapped into it. Out of memory goes on along the
    /// chain; nothing of a failed attempt is left.
    pub(crate) fn alloc_saver_segment(
        &mut self,
        req: Request<D::Stream>,
        stage: crate::oom_retry::Stage,
    ) -> MallocStep<D::Error, D::Stream> {
        let bytes = req.alloc_size;
        if self.saver.memory_margin > 0 {
            // torch_memory_saver's check: the margin and the segment within the free memory.
            match self.device.mem_info() {
                Ok(info) if self.saver.memory_margin.saturating_add(bytes) > info.free => {
                    return self.after_failed_segment(req, stage, None);
                }
                Ok(_) => {}
                Err(e) => return MallocStep::Done(Err(AllocError::Device(e))),
            }
        }
        let outcome = (|| {
            let addr = self.device.reserve_address(bytes)?;
            let page = match self.device.create_page(bytes) {
                Ok(page) => page,
                Err(e) => {
                    self.give_back_range(addr, bytes);
                    return Err(e);
                }
            };
            if let Err(e) = self.device.map(addr, bytes, &page) {
                self.give_back_page(page);
                self.give_back_range(addr, bytes);
                return Err(e);
            }
            Ok((addr, page))
        })();
        match outcome {
            Ok((addr, page)) => {
                self.saver.segments.insert(
                    addr,
                    SaverSegment {
                        size: bytes,
                        set: req.set,
                        page: Some(page),
                        backup: None,
                        stale: false,
                    },
                );
                let id = self.add_segment(addr, &req);
                MallocStep::Done(Ok(self.alloc_found_block(id, &req)))
            }
            Err(VmmError::Other(e)) => MallocStep::Done(Err(AllocError::Device(e))),
            // The pool was made after a probe that failed with an error, and the device turns
            // out to have no virtual memory: not a lack of memory, so no retry chain.
            Err(VmmError::Unsupported) => {
                MallocStep::Done(Err(AllocError::Pool(PoolError::NoVirtualMemory)))
            }
            Err(VmmError::OutOfMemory) => self.after_failed_segment(req, stage, None),
        }
    }

    /// Gives a reserved range back, or parks it.
    fn give_back_range(&mut self, addr: u64, bytes: u64) {
        if self.device.release_address(addr, bytes).is_err() {
            self.parked.ranges.push((addr, bytes));
        }
    }

    /// Releases a whole free memory-saver segment: unmaps and frees its memory (if mapped), its
    /// backup (if it has one) and its range. `Ok(false)` when the device refused the unmap in a way
    /// with no error to report (the segment stays).
    pub(crate) fn release_saver_segment(&mut self, addr: u64, size: u64) -> Result<bool, D::Error> {
        let seg = self.saver.segments.get_mut(&addr).expect("a saver segment");
        if let Some(page) = seg.page.take() {
            match self.device.unmap(addr, size) {
                Ok(()) => self.give_back_page(page),
                Err(e) => {
                    self.saver
                        .segments
                        .get_mut(&addr)
                        .expect("a saver segment")
                        .page = Some(page);
                    return match e {
                        VmmError::Other(e) => Err(e),
                        VmmError::Unsupported | VmmError::OutOfMemory => Ok(false),
                    };
                }
            }
        } else {
            // A paused segment's bytes leave the paused figures with it.
            let set = seg.set;
            let tag = self.saver_tag(set).tag.clone();
            self.saver.paused.decrease(size);
            if let Some(stat) = self.saver.per_tag.get_mut(&tag) {
                stat.decrease(size);
            }
        }
        let seg = self.saver.segments.remove(&addr).expect("a saver segment");
        if let Some(buffer) = seg.backup {
            self.give_back_host(buffer);
        }
        self.give_back_range(addr, size);
        Ok(true)
    }

    /// Whether a memory-saver segment lives at `addr`.
    #[inline]
    pub(crate) fn is_saver_segment(&self, addr: u64) -> bool {
        !self.saver.segments.is_empty() && self.saver.segments.contains_key(&addr)
    }

    /// Whether `addr` lies in a segment of a paused tag: memory the program must not touch
    /// until its tag resumes (a segment a double fault left mapped gets its bytes back then).
    pub fn saver_paused_at(&self, addr: u64) -> bool {
        self.saver
            .segments
            .range(..=addr)
            .next_back()
            .is_some_and(|(&base, s)| addr - base < s.size && self.set_paused(s.set))
    }

    /// Bytes the memory saver has paused now.
    pub fn paused_bytes(&self) -> u64 {
        self.saver.paused.current as u64
    }

    /// Memory-saver segments and their state, for the checker: (address, size, mapped).
    pub fn saver_segments(&self) -> Vec<(u64, u64, bool)> {
        self.saver
            .segments
            .iter()
            .map(|(&a, s)| (a, s.size, s.page.is_some()))
            .collect()
    }

    /// Host buffers the allocator holds: segments' backups (paused, retained, or kept by a
    /// failed resume) and parked ones.
    pub fn held_host_buffers(&self) -> usize {
        self.saver
            .segments
            .values()
            .filter(|s| s.backup.is_some())
            .count()
            + self.saver.parked_host.len()
    }
}
