//! The queues of deferred frees: per stream, the events recorded when a block used on that stream
//! (`record_stream`) was freed, in the order they were recorded (torch's `cuda_events`).
//!
//! Only the data structure lives here; the free path that fills and drains it is `free.rs`.

use alloc::collections::{BTreeMap, VecDeque};

use crate::block::BlockId;

/// One stream's queue of (event, block) pairs, polled front to back.
pub(crate) type Queue<E> = VecDeque<(E, BlockId)>;

/// Per-stream FIFO queues of (event, block) pairs.
#[derive(Debug)]
pub(crate) struct EventQueues<E, S> {
    queues: BTreeMap<S, Queue<E>>,
    pending: usize,
}

impl<E, S> Default for EventQueues<E, S> {
    fn default() -> Self {
        EventQueues {
            queues: BTreeMap::new(),
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
        self.queues
            .entry(stream)
            .or_default()
            .push_back((event, id));
        self.pending += 1;
    }

    /// Takes every queue out, to walk them while the allocator changes; give the rest back with
    /// [`EventQueues::restore`].
    pub(crate) fn take(&mut self) -> BTreeMap<S, Queue<E>> {
        core::mem::take(&mut self.queues)
    }

    /// Puts back what [`EventQueues::take`] took, dropping empty queues.
    pub(crate) fn restore(&mut self, mut queues: BTreeMap<S, Queue<E>>) {
        queues.retain(|_, q| !q.is_empty());
        self.queues = queues;
    }

    /// Counts one taken event as completed.
    #[inline]
    pub(crate) fn completed(&mut self) {
        self.pending -= 1;
    }
}
