//! Deferred frees of blocks used on other streams: torch's `insert_events`, `process_events` and
//! `synchronize_and_free_events`.
//!
//! A block recorded on other streams (`record_stream`) is not reusable when the caller frees it:
//! work queued on those streams may still touch it. One event per stream is recorded at free and
//! the block stays active ("pending free") until every one of them has completed.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;

use crate::allocator::Allocator;
use crate::block::BlockId;
use crate::device::{Device, StreamId};

/// Per-stream FIFO queues of (event, block) pairs, polled in order.
#[derive(Debug)]
pub(crate) struct EventQueues<E> {
    queues: BTreeMap<StreamId, VecDeque<(E, BlockId)>>,
    pending: usize,
}

impl<E> Default for EventQueues<E> {
    fn default() -> Self {
        EventQueues {
            queues: BTreeMap::new(),
            pending: 0,
        }
    }
}

impl<E> EventQueues<E> {
    /// Number of events not yet completed and processed.
    pub(crate) fn pending(&self) -> usize {
        self.pending
    }
}

impl<D: Device> Allocator<D> {
    /// Records one event per stream in the block's `stream_uses` and queues them. Returns whether
    /// the block must wait for them (`false` when it had no other uses, or when recording failed
    /// and a device synchronization made waiting unnecessary). On error nothing has changed.
    pub(crate) fn record_free_events(&mut self, id: BlockId) -> Result<bool, D::Error> {
        if self.blocks[id].stream_uses.is_empty() {
            return Ok(false);
        }
        let uses = core::mem::take(&mut self.blocks[id].stream_uses);
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
                    self.blocks[id].stream_uses = uses;
                    return Err(e);
                }
            }
        }
        for (stream, event) in recorded {
            self.events
                .queues
                .entry(stream)
                .or_default()
                .push_back((event, id));
            self.blocks[id].event_count += 1;
            self.events.pending += 1;
        }
        Ok(true)
    }

    /// torch's `process_events`: for each stream, pop completed events in order and return blocks
    /// whose last event completed to their pools. Stops at each stream's first pending event.
    pub fn process_events(&mut self) -> Result<(), D::Error> {
        if self.events.pending == 0 {
            return Ok(());
        }
        let mut result = Ok(());
        let mut queues = core::mem::take(&mut self.events.queues);
        'streams: for queue in queues.values_mut() {
            while let Some((event, _)) = queue.front() {
                match self.device.event_done(event) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        result = Err(e);
                        break 'streams;
                    }
                }
                let (event, id) = queue.pop_front().expect("front exists");
                self.complete_event(event, id);
            }
        }
        queues.retain(|_, q| !q.is_empty());
        self.events.queues = queues;
        result
    }

    /// torch's `synchronize_and_free_events`: wait for the device, then every queued event is
    /// complete and every pending block returns to its pool.
    pub(crate) fn synchronize_and_free_events(&mut self) -> Result<(), D::Error> {
        // Counted on entry, as torch does, even if the synchronization then fails.
        self.stats.num_sync_all_streams += 1;
        self.device.synchronize()?;
        let queues = core::mem::take(&mut self.events.queues);
        for (_, queue) in queues {
            for (event, id) in queue {
                self.complete_event(event, id);
            }
        }
        Ok(())
    }

    fn complete_event(&mut self, event: D::Event, id: BlockId) {
        self.device.release_event(event);
        self.events.pending -= 1;
        let block = &mut self.blocks[id];
        block.event_count -= 1;
        if block.event_count == 0 {
            self.free_block(id);
        }
    }
}
