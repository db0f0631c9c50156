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
    /// The first stream to put a block here, with its classes held inline: most programs use
    /// one stream, and then finding its classes reads no list (one dependent load fewer on
    /// every lookup and insert). Made on the first insert: a pool never used (a private pool's
    /// small pool, say) holds no classes, which are about 20 KiB.
    first: Option<(S, SizeClasses)>,
    /// The other streams, sorted by stream; empty while `first` is `None`.
    others: Vec<(S, SizeClasses)>,
    /// Number of `get_free_block` lookups while GC is enabled: torch's `get_free_blocks_call_count`.
    pub(crate) lookups: u64,
    /// Unmapped blocks of expandable segments by (stream, address): torch's `pool.unmapped`,
    /// searched lowest address first.
    pub(crate) unmapped: BTreeMap<(S, u64), BlockId>,
}

impl<S> Default for BlockPool<S> {
    fn default() -> Self {
        BlockPool {
            first: None,
            others: Vec::new(),
            lookups: 0,
            unmapped: BTreeMap::new(),
        }
    }
}

impl<S: Ord + Copy> BlockPool<S> {
    /// `stream`'s classes, if it has any.
    #[inline(always)]
    fn stream(&self, stream: S) -> Option<&SizeClasses> {
        if let Some((first, classes)) = &self.first
            && *first == stream
        {
            return Some(classes);
        }
        self.others
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, m)| m)
    }

    /// [`BlockPool::stream`], for changing them.
    #[inline(always)]
    fn stream_mut(&mut self, stream: S) -> Option<&mut SizeClasses> {
        if let Some((first, classes)) = &mut self.first
            && *first == stream
        {
            return Some(classes);
        }
        self.others
            .iter_mut()
            .find(|(s, _)| *s == stream)
            .map(|(_, m)| m)
    }

    /// `stream`'s classes, added (empty) if it has none.
    #[inline(always)]
    fn stream_or_add(&mut self, stream: S) -> &mut SizeClasses {
        // An index first and one borrow at the end: returning the first's classes from inside
        // a test of them would keep `self` borrowed on the other paths.
        let other = if matches!(&self.first, Some((first, _)) if *first == stream) {
            None
        } else {
            match self.others.iter().position(|(s, _)| *s == stream) {
                Some(i) => Some(i),
                None => self.add_stream(stream),
            }
        };
        match (other, &mut self.first) {
            (Some(i), _) => &mut self.others[i].1,
            (None, Some((_, classes))) => classes,
            (None, None) => unreachable!("the first stream was just found or added"),
        }
    }

    /// Adds `stream`: as the first if there is none yet (`None`), else to the others in stream
    /// order (its index there). Either way its classes are made now.
    #[inline(never)]
    fn add_stream(&mut self, stream: S) -> Option<usize> {
        if self.first.is_none() {
            self.first = Some((stream, SizeClasses::default()));
            return None;
        }
        let i = self.others.partition_point(|(s, _)| *s < stream);
        self.others.insert(i, (stream, SizeClasses::default()));
        Some(i)
    }

    /// Puts free block `id` (its record `block`) into the pool and starts its GC age.
    #[inline(always)]
    pub(crate) fn insert(&mut self, block: &mut Block<S>, id: BlockId) {
        block.gc_base = self.lookups;
        let (stream, k) = (block.stream, key(block.size, block.addr));
        self.stream_or_add(stream).insert(k, id);
    }

    /// Takes a block out of the pool; returns whether it was there.
    #[inline]
    pub(crate) fn remove(&mut self, blocks: &Blocks<S>, id: BlockId) -> bool {
        let b = &blocks[id];
        let k = key(b.size, b.addr);
        self.stream_mut(b.stream).is_some_and(|m| m.remove(k))
    }

    /// Takes the smallest free block on `stream` at least `size` bytes large out of the pool
    /// if `accept` agrees to its size; one search serves both the lookup and the removal.
    #[inline(always)]
    pub(crate) fn take_best_fit(
        &mut self,
        stream: S,
        size: u64,
        accept: impl FnOnce(u64) -> bool,
    ) -> Option<BlockId> {
        self.stream_mut(stream)?
            .take_from(key(size, 0), |k| accept(size_of(k)))
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
        // The others sorted below the first, the first, then the others above it.
        let first_stream = self.first.as_ref().map(|(s, _)| *s);
        let cut = self
            .others
            .partition_point(|(s, _)| Some(*s) < first_stream);
        let (below, above) = self.others.split_at(cut);
        let first = self.first.as_ref().map(|(_, m)| m);
        below
            .iter()
            .map(|(_, m)| m)
            .chain(first)
            .chain(above.iter().map(|(_, m)| m))
            .flat_map(SizeClasses::values)
    }

    /// GC age of a free block: lookups on this pool since it entered the pool.
    #[inline]
    pub(crate) fn age(&self, blocks: &Blocks<S>, id: BlockId) -> u64 {
        self.lookups - blocks[id].gc_base
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec::Vec;

    use super::*;
    use crate::size::PoolKind;

    /// Puts a free block of `size` bytes at `addr` on `stream` into `pool`.
    fn put(pool: &mut BlockPool<u32>, blocks: &mut Blocks<u32>, stream: u32, addr: u64, size: u64) {
        let id = blocks.insert(Block::segment(addr, size, stream, PoolKind::Large, 0));
        pool.insert(&mut blocks[id], id);
    }

    #[test]
    fn streams_keep_torch_order_whichever_came_first() {
        // The first stream's classes are held apart from the others; the pool's order is still
        // torch's (stream, size, address).
        let (mut pool, mut blocks) = (BlockPool::default(), Blocks::default());
        put(&mut pool, &mut blocks, 5, 0x9000, 4096);
        put(&mut pool, &mut blocks, 9, 0x1000, 2048);
        put(&mut pool, &mut blocks, 2, 0x5000, 8192);
        put(&mut pool, &mut blocks, 5, 0x3000, 4096);
        put(&mut pool, &mut blocks, 2, 0x7000, 1024);
        let order: Vec<(u32, u64, u64)> = pool
            .iter()
            .map(|id| (blocks[id].stream, blocks[id].size, blocks[id].addr))
            .collect();
        assert_eq!(
            order,
            [
                (2, 1024, 0x7000),
                (2, 8192, 0x5000),
                (5, 4096, 0x3000),
                (5, 4096, 0x9000),
                (9, 2048, 0x1000),
            ]
        );
        // Best fit stays on the request's stream, for the first stream and the others.
        assert_eq!(
            pool.take_best_fit(9, 1024, |_| true)
                .map(|id| blocks[id].addr),
            Some(0x1000)
        );
        assert_eq!(
            pool.take_best_fit(5, 4096, |_| true)
                .map(|id| blocks[id].addr),
            Some(0x3000)
        );
        assert_eq!(
            pool.take_best_fit(2, 2048, |_| true)
                .map(|id| blocks[id].addr),
            Some(0x5000)
        );
        assert_eq!(pool.take_best_fit(7, 512, |_| true), None);
        let left: Vec<u64> = pool.iter().map(|id| blocks[id].addr).collect();
        assert_eq!(left, [0x7000, 0x9000]);
        // Removal finds a block of the first stream and of another.
        let id = pool.iter().next().expect("two left");
        assert!(pool.remove(&blocks, id));
        assert!(!pool.remove(&blocks, id));
        let left: Vec<u64> = pool.iter().map(|id| blocks[id].addr).collect();
        assert_eq!(left, [0x9000]);
    }
}
