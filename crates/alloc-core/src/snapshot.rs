//! The allocator's state as torch's `memory_snapshot()` reports it: segments in address order,
//! each with its blocks and their states. Tests recount every stat from it. An expandable
//! segment shows as one segment per contiguous mapped range, marked `is_expandable`; its unmapped
//! address space is left out, as in torch.

use alloc::string::String;
use alloc::vec::Vec;

use crate::allocator::Allocator;
use crate::device::Device;
use crate::private_pool::PoolId;
use crate::size::PoolKind;

/// State of one block, with torch's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out to a caller.
    ActiveAllocated,
    /// Freed by the caller, waiting on stream events.
    ActivePendingFree,
    /// Free in its pool.
    Inactive,
}

impl BlockState {
    /// torch's string for the state.
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    /// Device address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// The caller's size while active, else 0.
    pub requested_size: u64,
    /// The block's state.
    pub state: BlockState,
}

/// One device segment and its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo<S> {
    /// Device address of the segment.
    pub address: u64,
    /// Segment size in bytes.
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active (allocated or pending-free) blocks.
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// The stream the segment belongs to.
    pub stream: S,
    /// The pool the segment belongs to.
    pub pool: PoolKind,
    /// A mapped range of an expandable segment rather than a device segment.
    pub is_expandable: bool,
    /// The private pool the segment belongs to, `PoolId::DEFAULT` for the default pools
    /// (torch's `segment_pool_id`).
    pub pool_id: PoolId,
    /// The memory-saver tag of a segment of a memory-saver pool.
    pub saver_tag: Option<String>,
    /// Whether the memory saver has paused the segment (its addresses stay reserved, its
    /// physical memory is gone until `resume`).
    pub paused: bool,
    /// Blocks in address order.
    pub blocks: Vec<BlockInfo>,
}

impl<D: Device> Allocator<D> {
    /// Every segment with its blocks, in address order: torch's `memory_snapshot()`.
    pub fn snapshot(&self) -> Vec<SegmentInfo<D::Stream>> {
        let mut out = Vec::with_capacity(self.segments.len());
        for &head in self.segments.values() {
            let first = &self.blocks[head];
            let is_expandable = first.is_expandable();
            let saver = self.saver_segment_state(first.addr);
            let mut seg: Option<SegmentInfo<D::Stream>> = None;
            let mut next = Some(head);
            while let Some(id) = next {
                let b = &self.blocks[id];
                next = b.next;
                if !b.mapped {
                    // An unmapped gap ends the mapped range before it.
                    out.extend(seg.take());
                    continue;
                }
                let seg = seg.get_or_insert_with(|| SegmentInfo {
                    address: b.addr,
                    total_size: 0,
                    allocated_size: 0,
                    active_size: 0,
                    requested_size: 0,
                    stream: b.stream,
                    pool: b.pool,
                    is_expandable,
                    pool_id: self.pools.id_of(b.set),
                    saver_tag: saver.as_ref().map(|s| s.0.clone()),
                    paused: saver.as_ref().is_some_and(|s| s.1),
                    blocks: Vec::new(),
                });
                let state = if b.allocated {
                    BlockState::ActiveAllocated
                } else if !b.is_idle() {
                    BlockState::ActivePendingFree
                } else {
                    BlockState::Inactive
                };
                seg.total_size += b.size;
                if state == BlockState::ActiveAllocated {
                    seg.allocated_size += b.size;
                }
                if state != BlockState::Inactive {
                    seg.active_size += b.size;
                    seg.requested_size += b.requested;
                }
                seg.blocks.push(BlockInfo {
                    address: b.addr,
                    size: b.size,
                    requested_size: b.requested,
                    state,
                });
            }
            out.extend(seg);
        }
        out
    }

    /// Number of events recorded for pending frees and not yet processed.
    pub fn pending_events(&self) -> usize {
        self.events.pending()
    }
}
