//! Block pools: the free, cached blocks of one pool (small or large), ordered for best fit.
//!
//! torch keeps one C++ ordered set keyed by (stream, size, address): the first entry at or after
//! (stream, size, 0) is the smallest free block on the same stream that fits, lowest address
//! first. Blocks are never reused across streams, so here each stream has its own
//! [`SizeClasses`], which keep the same (size, address) order.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use crate::block::{Block, BlockId, Blocks};
use crate::size_class::{SizeClasses, key, size_of};

/// The free blocks of one pool and its lookup counter (the clock of GC ages).
#[derive(Debug)]
pub(crate) struct BlockPool<S> {
    /// Per stream, sorted by stream.
    streams: Vec<(S, SizeClasses)>,
    /// Number of `get_free_block` lookups while GC is enabled: torch's `get_free_blocks_call_count`.
    pub(crate) lookups: u64,
    /// Unmapped blocks of expandable segments by (stream, address): torch's `pool.unmapped`,
    /// searched lowest address first.
    pub(crate) unmapped: BTreeMap<(S, u64), BlockId>,
}

impl<S> Default for BlockPool<S> {
    fn default() -> Self {
        BlockPool {
            streams: Vec::new(),
            lookups: 0,
            unmapped: BTreeMap::new(),
        }
    }
}

impl<S: Ord + Copy> BlockPool<S> {
    #[inline]
    fn stream(&self, stream: S) -> Option<&SizeClasses> {
        self.index_of(stream).map(|i| &self.streams[i].1)
    }

    /// Where `stream`'s classes are, if it has any: the first stream (most programs use one) is
    /// tried before the search.
    #[inline(always)]
    fn index_of(&self, stream: S) -> Option<usize> {
        match self.streams.first() {
            Some((s, _)) if *s == stream => Some(0),
            _ => self.streams.iter().position(|(s, _)| *s == stream),
        }
    }

    #[inline(always)]
    fn stream_mut(&mut self, stream: S) -> &mut SizeClasses {
        let i = match self.index_of(stream) {
            Some(i) => i,
            None => self.add_stream(stream),
        };
        &mut self.streams[i].1
    }

    /// Adds `stream`'s (empty) classes in stream order; returns their index.
    #[inline(never)]
    fn add_stream(&mut self, stream: S) -> usize {
        let i = self.streams.partition_point(|(s, _)| *s < stream);
        self.streams.insert(i, (stream, SizeClasses::default()));
        i
    }

    /// Puts free block `id` (its record `block`) into the pool and starts its GC age.
    #[inline(always)]
    pub(crate) fn insert(&mut self, block: &mut Block<S>, id: BlockId) {
        block.gc_base = self.lookups;
        let (stream, k) = (block.stream, key(block.size, block.addr));
        self.stream_mut(stream).insert(k, id);
    }

    /// Takes a block out of the pool; returns whether it was there.
    #[inline]
    pub(crate) fn remove(&mut self, blocks: &Blocks<S>, id: BlockId) -> bool {
        let b = &blocks[id];
        let k = key(b.size, b.addr);
        self.index_of(b.stream)
            .is_some_and(|i| self.streams[i].1.remove(k))
    }

    /// Takes the smallest free block on `stream` at least `size` bytes large out of the pool
    /// if `accept` agrees to its size; one search serves both the lookup and the removal.
    #[inline]
    pub(crate) fn take_best_fit(
        &mut self,
        stream: S,
        size: u64,
        accept: impl FnOnce(u64) -> bool,
    ) -> Option<BlockId> {
        let i = self.index_of(stream)?;
        let blocks = &mut self.streams[i].1;
        let (c, found) = blocks.find_from(key(size, 0))?;
        if !accept(size_of(found.key)) {
            return None;
        }
        blocks.remove_found(c, found);
        Some(found.id)
    }

    /// Free blocks on `stream` of at least `size` bytes, smallest first.
    pub(crate) fn at_least(
        &self,
        stream: S,
        size: u64,
    ) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.walk(stream, move |m| m.from(key(size, 0)))
    }

    /// Free blocks on `stream` smaller than `size` bytes, largest first.
    pub(crate) fn below_desc(
        &self,
        stream: S,
        size: u64,
    ) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.walk(stream, move |m| m.below_desc(key(size, 0)))
    }

    /// The (size, block) entries `entries` picks from `stream`'s blocks; none for a stream
    /// without free blocks.
    fn walk<'a, I: Iterator<Item = (u128, BlockId)> + 'a>(
        &'a self,
        stream: S,
        entries: impl FnMut(&'a SizeClasses) -> I + 'a,
    ) -> impl Iterator<Item = (u64, BlockId)> + 'a {
        self.stream(stream)
            .into_iter()
            .flat_map(entries)
            .map(|(k, id)| (size_of(k), id))
    }

    /// Every free block in torch's pool order: (stream, size, address).
    pub(crate) fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.streams.iter().flat_map(|(_, m)| m.values())
    }

    /// GC age of a free block: lookups on this pool since it entered the pool.
    #[inline]
    pub(crate) fn age(&self, blocks: &Blocks<S>, id: BlockId) -> u64 {
        self.lookups - blocks[id].gc_base
    }
}
