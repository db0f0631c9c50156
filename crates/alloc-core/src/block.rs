//! Block records: torch's `Block`, kept in a slab and linked by index instead of by pointer.
//!
//! A segment is a chain of blocks (`prev`/`next`) covering one device allocation; splitting and
//! merging relink the chain. The block at a segment's start keeps its id for the segment's whole
//! life, so the segment table can point at it.

use alloc::vec::Vec;

use crate::private_pool::PoolSet;
use crate::size::PoolKind;

/// Index of an expandable segment in the allocator's table (`expandable`), stored plus one so
/// that `Option<VmId>` takes four bytes of the block record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VmId(core::num::NonZeroU32);

impl VmId {
    /// The id of table slot `index`.
    pub(crate) fn new(index: usize) -> VmId {
        let n = u32::try_from(index + 1).expect("fewer than 2^32 - 1 expandable segments");
        VmId(core::num::NonZeroU32::new(n).expect("index + 1 is not 0"))
    }

    /// The table slot.
    pub(crate) fn index(self) -> usize {
        self.0.get() as usize - 1
    }
}

/// Index of a block record in the slab. Slot 0 is never a block's, so that `Option<BlockId>`
/// (a block's neighbour links) takes four bytes of the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BlockId(core::num::NonZeroU32);

impl BlockId {
    /// The id of slab slot `index` (not 0).
    #[inline]
    fn new(index: u32) -> BlockId {
        BlockId(core::num::NonZeroU32::new(index).expect("slot 0 holds no block"))
    }

    /// Any id, for tests of tables that store ids.
    #[cfg(test)]
    pub(crate) fn for_test(n: u32) -> BlockId {
        BlockId::new(n)
    }

    /// The slab slot.
    #[inline]
    fn index(self) -> usize {
        self.0.get() as usize
    }
}

/// One block of device memory: allocated, free in a pool, or waiting on stream events.
///
/// With an 8-byte stream handle (the runtime's and the simulator's) the record is one 64-byte
/// cache line, aligned to one: a lookup, a split or a merge reads one line per block. The
/// streams of `record_stream` live in the allocator's side table (`stream_uses`), which only
/// blocks used on other streams have an entry in.
#[derive(Debug, Clone)]
#[repr(align(64))]
pub(crate) struct Block<S> {
    /// Device address of the first byte.
    pub(crate) addr: u64,
    /// Size in bytes (rounded).
    pub(crate) size: u64,
    /// The size the caller asked for, while the block is active; 0 otherwise.
    pub(crate) requested: u64,
    /// The stream the segment was allocated on; blocks are reused only there.
    pub(crate) stream: S,
    /// The pool the segment belongs to.
    pub(crate) pool: PoolKind,
    /// The pool set (default or private pool) the segment belongs to.
    pub(crate) set: PoolSet,
    /// Handed out to a caller and not yet freed.
    pub(crate) allocated: bool,
    /// Has an entry in the allocator's address index (it was handed out at least once).
    pub(crate) indexed: bool,
    /// The block just below in the same segment.
    pub(crate) prev: Option<BlockId>,
    /// The block just above in the same segment.
    pub(crate) next: Option<BlockId>,
    /// Stream events still outstanding before the block may return to its pool.
    pub(crate) event_count: u32,
    /// Used on other streams (`record_stream`): the allocator's `stream_uses` has its streams.
    /// Only ever set on an allocated block: its free takes the uses.
    pub(crate) used_elsewhere: bool,
    /// The pool's lookup counter when the block last entered the pool (GC age base).
    pub(crate) gc_base: u64,
    /// The expandable segment the block lies in (torch's `expandable_segment_`), or `None` for a
    /// block of a device segment.
    pub(crate) vm: Option<VmId>,
    /// Backed by memory: always for device segments; for expandable ones, whether its pages are
    /// mapped (an unmapped block is reserved address space, kept in the pool's `unmapped` set).
    pub(crate) mapped: bool,
}

impl<S> Block<S> {
    /// A new unsplit, unallocated block covering a whole segment.
    pub(crate) fn segment(addr: u64, size: u64, stream: S, pool: PoolKind, set: PoolSet) -> Self {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            pool,
            set,
            allocated: false,
            indexed: false,
            prev: None,
            next: None,
            event_count: 0,
            used_elsewhere: false,
            gc_base: 0,
            vm: None,
            mapped: true,
        }
    }

    /// A block of expandable segment `vm`, mapped or not.
    pub(crate) fn expandable(
        addr: u64,
        size: u64,
        stream: S,
        pool: PoolKind,
        set: PoolSet,
        vm: VmId,
        mapped: bool,
    ) -> Self {
        Block {
            vm: Some(vm),
            mapped,
            ..Block::segment(addr, size, stream, pool, set)
        }
    }

    /// Whether the block shares its segment with other blocks (torch's `is_split`).
    #[inline]
    pub(crate) fn is_split(&self) -> bool {
        // `|`, not `||`: each link's presence is data-dependent; one test of both is one
        // branch to predict, or none where the answer is kept as a value.
        self.prev.is_some() | self.next.is_some()
    }

    /// Whether the block is free and waits on nothing, so it may merge or be reused (torch's
    /// test in `try_merge_blocks` and `find_expandable_block`; an unmapped block is idle too).
    /// torch also tests the block's stream uses, which only an allocated block has.
    #[inline]
    pub(crate) fn is_idle(&self) -> bool {
        debug_assert!(self.allocated || !self.used_elsewhere);
        !self.allocated && self.event_count == 0
    }

    /// Whether the block lies in an expandable segment.
    #[inline]
    pub(crate) fn is_expandable(&self) -> bool {
        self.vm.is_some()
    }
}

/// The slab of block records, with a free list of vacant slots. Slot 0 is a placeholder (a copy
/// of the first block stored), so that ids index the slab without an offset.
///
/// The free list runs through the vacant records themselves (each one's `next`), not through a
/// vector of its own: a small vector is a heap chunk that can share a cache line with another
/// device's allocator, which another thread writes (the records are whole lines).
#[derive(Debug)]
pub(crate) struct Blocks<S> {
    slots: Vec<Block<S>>,
    /// The most recently vacated slot, whose `next` is the one vacated before it.
    vacant: Option<BlockId>,
}

impl<S> Default for Blocks<S> {
    fn default() -> Self {
        Blocks {
            slots: Vec::new(),
            vacant: None,
        }
    }
}

impl<S: Clone> Blocks<S> {
    /// Stores a block and returns its id.
    #[inline(always)]
    pub(crate) fn insert(&mut self, block: Block<S>) -> BlockId {
        if let Some(id) = self.vacant {
            let slot = &mut self.slots[id.index()];
            self.vacant = slot.next;
            *slot = block;
            id
        } else {
            if self.slots.is_empty() {
                self.slots.push(block.clone());
            }
            let i = u32::try_from(self.slots.len()).expect("fewer than 2^32 blocks");
            self.slots.push(block);
            BlockId::new(i)
        }
    }

    /// Frees the slot of a block that is no longer linked anywhere.
    #[inline]
    pub(crate) fn remove(&mut self, id: BlockId) {
        let slot = &mut self.slots[id.index()];
        debug_assert!(!slot.used_elsewhere);
        slot.next = self.vacant;
        self.vacant = Some(id);
    }
}

impl<S> core::ops::Index<BlockId> for Blocks<S> {
    type Output = Block<S>;
    #[inline]
    fn index(&self, id: BlockId) -> &Block<S> {
        &self.slots[id.index()]
    }
}

impl<S> core::ops::IndexMut<BlockId> for Blocks<S> {
    #[inline]
    fn index_mut(&mut self, id: BlockId) -> &mut Block<S> {
        &mut self.slots[id.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_with_an_8_byte_stream_is_one_cache_line() {
        assert_eq!(core::mem::size_of::<Block<u64>>(), 64);
        assert_eq!(core::mem::align_of::<Block<u64>>(), 64);
        assert_eq!(core::mem::size_of::<Option<BlockId>>(), 4);
    }
}
