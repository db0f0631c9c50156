//! The free path: torch's `free`, `recordStream`, `insert_events`, `process_events` and
//! `synchronize_and_free_events`.
//!
//! A block recorded on other streams (`record_stream`) is not reusable when the caller frees it:
//! work queued on those streams may still touch it. One event per stream is recorded at free and
//! the block stays active ("pending free") until every one of them has completed; then
//! `free_block` (in `split`) merges it with its free neighbours and returns it to its pool.

use alloc::vec::Vec;

use crate::allocator::Allocator;
use crate::block::BlockId;
use crate::device::Device;
use crate::error::FreeError;
use crate::history::Action;
use crate::private_pool::PoolSet;

/// torch_npu's `kLazyQuerySize`: with `multi_stream_lazy_reclaim`, a malloc polls the pending
/// events at its start only when more than this many are queued.
pub(crate) const LAZY_QUERY_SIZE: usize = 512;

impl<D: Device> Allocator<D> {
    /// Frees the allocation at `addr` (0 is a no-op). A block used on other streams returns to its
    /// pool only once events recorded on those streams complete.
    pub fn free(&mut self, addr: u64) -> Result<(), FreeError<D::Error>> {
        if addr == 0 {
            return Ok(());
        }
        let id = self.live_block(addr)?;
        // Read in one look at the record: recording events changes neither pool nor size.
        let block = &self.blocks[id];
        let (pool, size, used_elsewhere) = (block.pool, block.size, block.used_elsewhere);
        let recorded = used_elsewhere && self.free_events(id)?;
        if self.history.is_some() {
            self.record_free(id, recorded);
        }
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        if self.is_oversize(size) {
            self.stats.oversize_allocations.decrease(1);
        }
        if recorded {
            // Still active: allocated no longer, pending until its events complete.
            self.blocks[id].allocated = false;
            self.stats.start_pending(pool, size);
        } else {
            // return_block clears `allocated` where it writes the record anyway; the history
            // has the free's completion already.
            self.return_block(id);
        }
        Ok(())
    }

    /// The history entries of a free: requested, and completed unless it waits on events (the
    /// last event's completion records that). One check of the history on the free path.
    #[cold]
    #[inline(never)]
    fn record_free(&mut self, id: BlockId, waits: bool) {
        self.record_block(Action::FreeRequested, id);
        if !waits {
            self.record_block(Action::FreeCompleted, id);
        }
    }

    /// torch's `recordStream`: the allocation at `addr` is also used on `stream`.
    pub fn record_stream(
        &mut self,
        addr: u64,
        stream: D::Stream,
    ) -> Result<(), FreeError<D::Error>> {
        if addr == 0 {
            return Ok(());
        }
        let id = self.live_block(addr)?;
        let block = &mut self.blocks[id];
        if stream != block.stream {
            block.used_elsewhere = true;
            let uses = self.stream_uses.entry(id).or_default();
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        }
        Ok(())
    }

    /// torch_npu's `eraseStream`: undoes `record_stream(addr, stream)`, so that the free of the
    /// allocation at `addr` waits for no work on `stream` (HCCL calls it once a collective no
    /// longer needs the tensor). A live block has no event yet (they are recorded when it is
    /// freed), so only its streams change; a stream it was not used on changes nothing.
    /// torch_npu's wrapper also skips the call unless the block was allocated on the device's
    /// current stream: there is no current stream here, so that check is the caller's.
    pub fn erase_stream(
        &mut self,
        addr: u64,
        stream: D::Stream,
    ) -> Result<(), FreeError<D::Error>> {
        if addr == 0 {
            return Ok(());
        }
        let id = self.live_block(addr)?;
        if let Some(uses) = self.stream_uses.get_mut(&id) {
            uses.retain(|&s| s != stream);
            if uses.is_empty() {
                self.stream_uses.remove(&id);
                self.blocks[id].used_elsewhere = false;
            }
        }
        Ok(())
    }

    /// The live block at `addr`, or why there is none.
    #[inline(always)]
    fn live_block(&self, addr: u64) -> Result<BlockId, FreeError<D::Error>> {
        match self.by_addr.get(addr) {
            Some(id) if self.blocks[id].allocated => Ok(id),
            // A cached block (or one whose free waits on events): inside a segment.
            Some(_) => Err(FreeError::NotAllocated { addr }),
            None => Err(self.pointer_error(addr)),
        }
    }

    /// Why `addr` is not a live allocation: it lies inside memory we hold (one of our segments,
    /// or a reserved range parked after the device refused to release it), or it is foreign.
    fn pointer_error(&self, addr: u64) -> FreeError<D::Error> {
        let inside = self
            .segments
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, &head)| addr < self.segment_end(head))
            || self
                .parked
                .ranges
                .iter()
                .any(|&(start, bytes)| (start..start + bytes).contains(&addr));
        if inside {
            FreeError::NotAllocated { addr }
        } else {
            FreeError::ForeignPointer { addr }
        }
    }

    /// [`Allocator::free`] after the host's queued work was drained: the events of a block used
    /// on other streams are recorded behind that work. What a caller does after
    /// [`FreeError::DrainFirst`].
    pub fn free_after_drain(&mut self, addr: u64) -> Result<(), FreeError<D::Error>> {
        self.queue_drained = true;
        let result = self.free(addr);
        self.queue_drained = false;
        result
    }

    /// The events of the free of block `id`, used on other streams: whether the block
    /// must wait for them. With [`HostQueue::SyncFirst`](crate::HostQueue::SyncFirst) the host's
    /// queue must be drained first ([`FreeError::DrainFirst`]): work still queued on the host for
    /// those streams would reach them after events recorded now, which would then complete
    /// while the work still reads the block (torch_npu records its events through that queue).
    #[cold]
    #[inline(never)]
    fn free_events(&mut self, id: BlockId) -> Result<bool, FreeError<D::Error>> {
        if self.host_queue == crate::oom_retry::HostQueue::SyncFirst && !self.queue_drained {
            let addr = self.blocks[id].addr;
            return Err(FreeError::DrainFirst { addr });
        }
        self.record_free_events(id).map_err(FreeError::Device)
    }

    /// Records one event per stream in the stream uses of a block used on other streams, and
    /// queues them. Returns whether the block must wait for them (`false` when recording failed
    /// and a device synchronization made waiting unnecessary). On error nothing has changed.
    fn record_free_events(&mut self, id: BlockId) -> Result<bool, D::Error> {
        debug_assert!(
            self.blocks[id].used_elsewhere,
            "only free's check calls this"
        );
        let uses = self.stream_uses.remove(&id).unwrap_or_default();
        self.blocks[id].used_elsewhere = false;
        let mut recorded = Vec::with_capacity(uses.len());
        for &stream in &uses {
            match self.device.record_event(stream) {
                Ok(event) => recorded.push((stream, event)),
                Err(e) => {
                    // Fall back to waiting for everything, as mindtorch does; if even that fails,
                    // the free fails and the block stays allocated with its uses.
                    for (_, event) in recorded {
                        self.device.release_event(event);
                    }
                    if self.device.synchronize().is_ok() {
                        return Ok(false);
                    }
                    self.blocks[id].used_elsewhere = true;
                    self.stream_uses.insert(id, uses);
                    return Err(e);
                }
            }
        }
        for (stream, event) in recorded {
            self.events.push(stream, event, id);
            self.blocks[id].event_count += 1;
        }
        Ok(true)
    }

    /// torch's `process_events`: for each stream, pop completed events in order and return blocks
    /// whose last event completed to their pools. Stops at each stream's first pending event.
    #[inline]
    pub fn process_events(&mut self) -> Result<(), D::Error> {
        // Every malloc calls this; without pending events it is one compare, inlined.
        if self.events.pending() == 0 {
            return Ok(());
        }
        self.poll_events()
    }

    /// `process_events` at the start of a malloc. With `multi_stream_lazy_reclaim` (torch_npu)
    /// the events are polled only while more than [`LAZY_QUERY_SIZE`] are pending, and a poll
    /// then is marked in `reaped_at` (torch_npu's `reaped`: the malloc's miss does not poll
    /// again).
    #[inline(always)]
    pub(crate) fn reap_for_malloc(&mut self) -> Result<(), D::Error> {
        if self.events.pending() == 0 {
            return Ok(());
        }
        self.reap_pending()
    }

    #[inline(never)]
    fn reap_pending(&mut self) -> Result<(), D::Error> {
        if !self.conf.multi_stream_lazy_reclaim {
            return self.poll_events();
        }
        if self.events.pending() <= LAZY_QUERY_SIZE {
            return Ok(());
        }
        self.poll_events()?;
        self.reaped_at = Some(self.stats.allocation.increases());
        Ok(())
    }

    /// Whether this malloc, now at its miss, polled the events at its start under lazy reclaim
    /// (see [`Allocator::reaped_at`]); forgets it.
    pub(crate) fn take_reaped(&mut self) -> bool {
        self.reaped_at.take() == Some(self.stats.allocation.increases())
    }

    #[inline(never)]
    fn poll_events(&mut self) -> Result<(), D::Error> {
        for i in 0..self.events.streams() {
            while let Some(event) = self.events.front(i) {
                if !self.device.event_done(event)? {
                    break;
                }
                let (event, id) = self.events.pop(i).expect("front exists");
                self.complete_event(event, id);
            }
        }
        Ok(())
    }

    /// torch's `synchronize_and_free_events`: wait for the device, then every queued event is
    /// complete and every pending block returns to its pool.
    pub(crate) fn synchronize_and_free_events(&mut self) -> Result<(), D::Error> {
        // The device's synchronization stands for torch_npu's `npuSynchronizeDevice`, which runs
        // before `synchronize_and_free_events` and throws on failure: then nothing is counted.
        self.device.synchronize()?;
        self.stats.num_sync_all_streams += 1;
        for (event, id) in self.events.take_all() {
            self.complete_event(event, id);
        }
        Ok(())
    }

    /// torch's `synchronize_and_free_events(pool)`, after the device synchronized: completes the
    /// events of private pool set `set`'s blocks only, and counts a synchronization all the same.
    pub(crate) fn free_events_of(&mut self, set: PoolSet) {
        self.stats.num_sync_all_streams += 1;
        let blocks = &self.blocks;
        for (event, id) in self.events.take_where(|id| blocks[id].set == set) {
            self.complete_event(event, id);
        }
    }

    /// Releases a completed event; the block's last one returns it to its pool.
    fn complete_event(&mut self, event: D::Event, id: BlockId) {
        self.device.release_event(event);
        let block = &mut self.blocks[id];
        block.event_count -= 1;
        if block.event_count == 0 {
            let (pool, size) = (block.pool, block.size);
            self.stats.end_pending(pool, size);
            self.free_block(id);
        }
    }
}
