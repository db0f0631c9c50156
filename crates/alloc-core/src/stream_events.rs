//! The queues of deferred frees: per stream, the events recorded when a block used on that stream
//! (`record_stream`) was freed, in the order they were recorded (torch's `cuda_events`).
//!
//! Only the data structure lives here; the free path that fills and drains it is `free.rs`.
//! A process has few streams, so the queues sit in a vector sorted by stream handle, polled by
//! index: while frees are pending every malloc polls, and walking a vector in place costs far
//! less than taking a map out and putting it back. (torch walks a hash map, in an order no one
//! outside the process can know: docs/deviations.md.)

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::block::BlockId;

/// One stream's queue of (event, block) pairs, polled front to back.
pub(crate) type Queue<E> = VecDeque<(E, BlockId)>;

/// Per-stream FIFO queues of (event, block) pairs.
#[derive(Debug)]
pub(crate) struct EventQueues<E, S> {
    /// Sorted by stream; a stream's queue stays (perhaps empty) once it had an event.
    queues: Vec<(S, Queue<E>)>,
    pending: usize,
}

impl<E, S> Default for EventQueues<E, S> {
    fn default() -> Self {
        EventQueues {
            queues: Vec::new(),
            pending: 0,
        }
    }
}

impl<E, S: Ord> EventQueues<E, S> {
    /// Number of events recorded and not yet completed and processed.
    #[inline]
    pub(crate) fn pending(&self) -> usize {
        self.pending
    }

    /// Queues `event`, recorded on `stream` for block `id`.
    pub(crate) fn push(&mut self, stream: S, event: E, id: BlockId) {
        let i = match self.queues.binary_search_by(|(s, _)| s.cmp(&stream)) {
            Ok(i) => i,
            Err(i) => {
                self.queues.insert(i, (stream, VecDeque::new()));
                i
            }
        };
        self.queues[i].1.push_back((event, id));
        self.pending += 1;
    }

    /// Number of stream queues, for polling them by index in stream order.
    #[inline]
    pub(crate) fn streams(&self) -> usize {
        self.queues.len()
    }

    /// The oldest event of queue `i` not yet taken.
    #[inline]
    pub(crate) fn front(&self, i: usize) -> Option<&E> {
        self.queues[i].1.front().map(|(event, _)| event)
    }

    /// Takes the oldest event of queue `i` and its block, counting it as completed.
    #[inline]
    pub(crate) fn pop(&mut self, i: usize) -> Option<(E, BlockId)> {
        let popped = self.queues[i].1.pop_front();
        self.pending -= usize::from(popped.is_some());
        popped
    }

    /// Takes the queued events whose block `pick` chooses, stream by stream, each stream's
    /// oldest first, counting them as completed; the others stay queued in their order.
    pub(crate) fn take_where(
        &mut self,
        mut pick: impl FnMut(BlockId) -> bool,
    ) -> Vec<(E, BlockId)> {
        let mut taken = Vec::new();
        for (_, queue) in &mut self.queues {
            let (chosen, kept): (Queue<E>, Queue<E>) = queue.drain(..).partition(|e| pick(e.1));
            *queue = kept;
            taken.extend(chosen);
        }
        self.pending -= taken.len();
        taken
    }

    /// Takes every queued event and its block, stream by stream, each stream's oldest first,
    /// counting them all as completed.
    pub(crate) fn take_all(&mut self) -> Vec<(E, BlockId)> {
        self.pending = 0;
        self.queues
            .iter_mut()
            .flat_map(|(_, queue)| queue.drain(..))
            .collect()
    }
}
