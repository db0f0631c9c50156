//! Block pools: the free, cached blocks of one pool (small or large), ordered for best fit.
//!
//! torch keeps a `std::set` ordered by (stream, size, address): the first entry at or after
//! (stream, size, 0) is the smallest free block on the same stream that fits.

use alloc::collections::BTreeMap;

use crate::block::{BlockId, Blocks};
use crate::device::StreamId;

/// Best-fit key: (stream, size, address).
pub(crate) type FitKey = (StreamId, u64, u64);

/// The free blocks of one pool and its lookup counter (the clock of GC ages).
#[derive(Debug, Default)]
pub(crate) struct BlockPool {
    /// Free blocks by (stream, size, address).
    pub(crate) free: BTreeMap<FitKey, BlockId>,
    /// Number of `get_free_block` lookups while GC is enabled: torch's `get_free_blocks_call_count`.
    pub(crate) lookups: u64,
}

impl BlockPool {
    /// Puts a free block into the pool and starts its GC age.
    pub(crate) fn insert(&mut self, blocks: &mut Blocks, id: BlockId) {
        let block = &mut blocks[id];
        block.gc_base = self.lookups;
        self.free.insert((block.stream, block.size, block.addr), id);
    }

    /// Takes a block out of the pool; returns whether it was there.
    pub(crate) fn remove(&mut self, blocks: &Blocks, id: BlockId) -> bool {
        let b = &blocks[id];
        self.free.remove(&(b.stream, b.size, b.addr)).is_some()
    }

    /// The smallest free block on `stream` at least `size` bytes large.
    pub(crate) fn best_fit(&self, stream: StreamId, size: u64) -> Option<(FitKey, BlockId)> {
        let (&key, &id) = self.free.range((stream, size, 0)..).next()?;
        (key.0 == stream).then_some((key, id))
    }

    /// GC age of a free block: lookups on this pool since it entered the pool.
    pub(crate) fn age(&self, blocks: &Blocks, id: BlockId) -> u64 {
        self.lookups - blocks[id].gc_base
    }
}
