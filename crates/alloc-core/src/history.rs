//! The allocation history behind torch's `_record_memory_history` / `_snapshot()`: a bounded
//! ring of trace entries, one per event torch records (allocations, frees requested and
//! completed, segments allocated, freed, mapped and unmapped, out-of-memory, snapshots).
//!
//! Off by default; while off the hot path pays one predictable branch per event site. The core
//! has no clock: the caller sets the time of the next events with
//! [`Allocator::set_time`] (the replayer: the operation's index) or hands it a clock read for
//! each entry with [`Allocator::set_clock`] (the runtime: a monotonic clock), and may attach an opaque context (the runtime's stack frames) with
//! [`Allocator::set_context`].

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::any::Any;

use crate::allocator::Allocator;
use crate::block::BlockId;
use crate::device::Device;
use crate::private_pool::{PoolId, PoolSet};

/// What happened, with torch's names ([`Action::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A block was handed out (`size`: the requested size).
    Alloc,
    /// The caller freed a block (it may still wait on stream events).
    FreeRequested,
    /// The block returned to its pool.
    FreeCompleted,
    /// A device segment was allocated.
    SegmentAlloc,
    /// A device segment was freed.
    SegmentFree,
    /// Pages of an expandable segment were mapped.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// A request ran out of memory (`addr` holds the device's free bytes).
    Oom,
    /// A snapshot was taken.
    Snapshot,
}

impl Action {
    /// torch's string for the action (`TraceEntry::Action`).
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
        }
    }
}

/// An opaque context attached to entries (the runtime's stack frames).
pub type Context = Arc<dyn Any + Send + Sync>;

/// One trace entry: torch's `TraceEntry`.
#[derive(Clone)]
pub struct TraceEntry<S> {
    /// What happened.
    pub action: Action,
    /// The block or segment address; for [`Action::Oom`], the device's free bytes (torch's
    /// `device_free`).
    pub addr: u64,
    /// Bytes: requested for allocations and frees, the segment's or mapped range's otherwise.
    pub size: u64,
    /// The stream (`None` for a snapshot marker).
    pub stream: Option<S>,
    /// The time the caller set for it, in microseconds.
    pub time_us: u64,
    /// The context the caller attached, if any.
    pub context: Option<Context>,
    /// The pool of the block or segment, [`PoolId::DEFAULT`] for the default pools (torch_npu's
    /// per-entry `pool_id`).
    pub pool_id: PoolId,
}

impl<S: core::fmt::Debug> core::fmt::Debug for TraceEntry<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TraceEntry")
            .field("action", &self.action)
            .field("addr", &self.addr)
            .field("size", &self.size)
            .field("stream", &self.stream)
            .field("time_us", &self.time_us)
            .field("context", &self.context.is_some())
            .field("pool_id", &self.pool_id)
            .finish()
    }
}

/// The ring of entries.
#[derive(Debug)]
pub(crate) struct History<S> {
    entries: VecDeque<TraceEntry<S>>,
    max: usize,
    /// Entries dropped because the ring was full (torch's `trace_alloc_overflowed`).
    dropped: u64,
    /// The time and context of the next entries.
    now: u64,
    /// The caller's clock, read for each entry instead of `now` when set.
    clock: Option<fn() -> u64>,
    context: Option<Context>,
}

impl<D: Device> Allocator<D> {
    /// torch's `_record_memory_history(enabled, max_entries)`: `Some(n)` records the last `n`
    /// entries (at least 1); `None` stops recording. Either way what was recorded is forgotten,
    /// as torch_npu's `recordHistory` clears its buffer at every call (`alloc_trace->clear()`),
    /// so turning history on again starts an empty ring. The clock and the context set for the
    /// entries stay.
    pub fn record_history(&mut self, max_entries: Option<usize>) {
        let (now, clock, context) = match self.history.take() {
            Some(h) => (h.now, h.clock, h.context),
            None => (0, None, None),
        };
        self.history = max_entries.map(|max| {
            let max = max.max(1);
            Box::new(History {
                entries: VecDeque::with_capacity(max.min(1 << 16)),
                max,
                dropped: 0,
                now,
                clock,
                context,
            })
        });
    }

    /// Whether history is being recorded.
    pub fn recording_history(&self) -> bool {
        self.history.is_some()
    }

    /// The time of the entries recorded from now on, in microseconds.
    #[inline]
    pub fn set_time(&mut self, time_us: u64) {
        if let Some(h) = &mut self.history {
            h.now = time_us;
        }
    }

    /// A clock of the caller's (microseconds), read once per recorded entry while history is on,
    /// so that a caller with a clock pays nothing per operation when history is off; `None`
    /// goes back to [`Allocator::set_time`]'s value. Forgotten when history is turned off.
    pub fn set_clock(&mut self, clock: Option<fn() -> u64>) {
        if let Some(h) = &mut self.history {
            h.clock = clock;
        }
    }

    /// The context attached to the entries recorded from now on.
    pub fn set_context(&mut self, context: Option<Context>) {
        if let Some(h) = &mut self.history {
            h.context = context;
        }
    }

    /// The recorded entries, oldest first, and how many older ones the ring dropped.
    pub fn history(&self) -> (Vec<TraceEntry<D::Stream>>, u64) {
        match &self.history {
            Some(h) => (h.entries.iter().cloned().collect(), h.dropped),
            None => (Vec::new(), 0),
        }
    }

    /// Records a snapshot marker, as torch does each time a snapshot is taken: address 0, and
    /// as its size the active bytes of every segment (torch's `total_active`).
    pub fn mark_snapshot(&mut self) {
        if self.history.is_some() {
            let active = self.stats.pending_bytes.active(&self.stats.allocated_bytes) as u64;
            self.record(Action::Snapshot, 0, active, None, 0);
        }
    }

    /// Appends an entry of block `id`: its address, requested bytes and stream (the request and
    /// the completion of its free). The caller has checked that history is on. Inlined: out of
    /// line, it changed the register use of the free path around its call (the runtime pair +10
    /// instructions); [`Allocator::record`] is the out-of-line part.
    #[inline(always)]
    pub(crate) fn record_block(&mut self, action: Action, id: BlockId) {
        let b = &self.blocks[id];
        let (addr, requested, stream, set) = (b.addr, b.requested, b.stream, b.set);
        self.record(action, addr, requested, Some(stream), set);
    }

    /// Appends an entry of pool set `set`; the caller has checked that history is on.
    #[cold]
    #[inline(never)]
    pub(crate) fn record(
        &mut self,
        action: Action,
        addr: u64,
        size: u64,
        stream: Option<D::Stream>,
        set: PoolSet,
    ) {
        let pool_id = self.pools.id_of(set);
        let Some(h) = &mut self.history else {
            return;
        };
        if h.entries.len() == h.max {
            h.entries.pop_front();
            h.dropped += 1;
        }
        h.entries.push_back(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us: h.clock.map_or(h.now, |clock| clock()),
            context: h.context.clone(),
            pool_id,
        });
    }
}
