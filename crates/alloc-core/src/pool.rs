//! Block pools: the free, cached blocks of one pool (small or large), ordered for best fit.
//!
//! torch keeps one C++ ordered set keyed by (stream, size, address): the first entry at or after
//! (stream, size, 0) is the smallest free block on the same stream that fits, lowest address
//! first. Blocks are never reused across streams, so here each stream has its own index, and
//! within a stream the blocks are spread over size classes (TLSF-style: 8 classes per power of
//! two of 512-byte units), each an ordered map keyed by (size, address) packed into one `u128`,
//! with a bitmap of non-empty classes. Classes are monotone in size, so walking the classes in
//! order and each map in order is exactly torch's order; but each map stays small, so a lookup is
//! a bitmap scan plus a search in a node or two instead of a walk down one deep tree.

use alloc::vec::Vec;

use crate::bin::{Bin, Found};
use crate::block::{BlockId, Blocks};
use crate::device::StreamId;

/// (size, address) packed so that integer order is (size, address) order.
#[inline]
fn key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

#[inline]
fn size_of(key: u128) -> u64 {
    (key >> 64) as u64
}

/// Number of size classes: 8 below 4 KiB, then 8 per power of two up to 2^64 bytes.
const CLASSES: usize = 8 + 52 * 8;
const WORDS: usize = CLASSES.div_ceil(64);

/// The size class of a block size: monotone, so class order agrees with size order.
#[inline]
fn class(size: u64) -> usize {
    let units = size >> 9;
    if units < 8 {
        return units as usize;
    }
    let exp = 63 - units.leading_zeros() as usize;
    let mantissa = ((units >> (exp - 3)) & 7) as usize;
    8 + (exp - 3) * 8 + mantissa
}

/// The free blocks of one stream, binned by size class.
#[derive(Debug)]
struct StreamBlocks {
    bins: Vec<Bin>,
    occupied: [u64; WORDS],
}

impl Default for StreamBlocks {
    fn default() -> Self {
        StreamBlocks {
            bins: (0..CLASSES).map(|_| Bin::default()).collect(),
            occupied: [0; WORDS],
        }
    }
}

impl StreamBlocks {
    #[inline]
    fn insert(&mut self, k: u128, id: BlockId) {
        let c = class(size_of(k));
        self.bins[c].insert(k, id);
        self.occupied[c / 64] |= 1 << (c % 64);
    }

    #[inline]
    fn remove(&mut self, k: u128) -> bool {
        let c = class(size_of(k));
        let removed = self.bins[c].remove(k);
        if self.bins[c].is_empty() {
            self.occupied[c / 64] &= !(1 << (c % 64));
        }
        removed
    }

    /// The first non-empty class at or after `from`.
    #[inline]
    fn next_class(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        if word >= WORDS {
            return None;
        }
        let mut bits = self.occupied[word] & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            if word == WORDS {
                return None;
            }
            bits = self.occupied[word];
        }
    }

    /// Non-empty classes in ascending order within `range`.
    fn classes(
        &self,
        range: core::ops::Range<usize>,
    ) -> impl DoubleEndedIterator<Item = usize> + '_ {
        range.filter(|&c| self.occupied[c / 64] & (1 << (c % 64)) != 0)
    }

    /// The first entry with key ≥ `k` and its class.
    #[inline]
    fn find_from(&self, k: u128) -> Option<(usize, Found)> {
        let c = class(size_of(k));
        if let Some(found) = self.bins[c].find_from(k) {
            return Some((c, found));
        }
        let next = self.next_class(c + 1)?;
        Some((next, self.bins[next].find_from(0)?))
    }

    /// Removes an entry just found by [`StreamBlocks::find_from`].
    #[inline]
    fn remove_found(&mut self, c: usize, found: Found) {
        self.bins[c].remove_at(found);
        if self.bins[c].is_empty() {
            self.occupied[c / 64] &= !(1 << (c % 64));
        }
    }

    /// Entries with key ≥ `k`, ascending.
    fn from(&self, k: u128) -> impl Iterator<Item = (u128, BlockId)> + '_ {
        let c = class(size_of(k));
        self.bins[c].range(k..).chain(
            self.classes(c + 1..CLASSES)
                .flat_map(|c| self.bins[c].range(..)),
        )
    }

    /// Entries with key < `k`, descending.
    fn below_desc(&self, k: u128) -> impl Iterator<Item = (u128, BlockId)> + '_ {
        let c = class(size_of(k));
        self.bins[c].range(..k).rev().chain(
            self.classes(0..c)
                .rev()
                .flat_map(|c| self.bins[c].range(..).rev()),
        )
    }

    /// All entries, ascending.
    fn values(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.classes(0..CLASSES)
            .flat_map(|c| self.bins[c].range(..).map(|(_, id)| id))
    }
}

/// The free blocks of one pool and its lookup counter (the clock of GC ages).
#[derive(Debug, Default)]
pub(crate) struct BlockPool {
    /// Per stream, sorted by stream.
    streams: Vec<(StreamId, StreamBlocks)>,
    /// Number of `get_free_block` lookups while GC is enabled: torch's `get_free_blocks_call_count`.
    pub(crate) lookups: u64,
}

impl BlockPool {
    #[inline]
    fn stream(&self, stream: StreamId) -> Option<&StreamBlocks> {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, m)| m)
    }

    #[inline]
    fn stream_mut(&mut self, stream: StreamId) -> &mut StreamBlocks {
        let i = match self.streams.iter().position(|(s, _)| *s == stream) {
            Some(i) => i,
            None => {
                let i = self.streams.partition_point(|(s, _)| *s < stream);
                self.streams.insert(i, (stream, StreamBlocks::default()));
                i
            }
        };
        &mut self.streams[i].1
    }

    /// Puts a free block into the pool and starts its GC age.
    #[inline]
    pub(crate) fn insert(&mut self, blocks: &mut Blocks, id: BlockId) {
        let block = &mut blocks[id];
        block.gc_base = self.lookups;
        let (stream, k) = (block.stream, key(block.size, block.addr));
        self.stream_mut(stream).insert(k, id);
    }

    /// Takes a block out of the pool; returns whether it was there.
    #[inline]
    pub(crate) fn remove(&mut self, blocks: &Blocks, id: BlockId) -> bool {
        let b = &blocks[id];
        let k = key(b.size, b.addr);
        self.streams
            .iter_mut()
            .find(|(s, _)| *s == b.stream)
            .is_some_and(|(_, m)| m.remove(k))
    }

    /// Takes the smallest free block on `stream` at least `size` bytes large out of the pool
    /// if `accept` agrees to its size; one search serves both the lookup and the removal.
    #[inline]
    pub(crate) fn take_best_fit(
        &mut self,
        stream: StreamId,
        size: u64,
        accept: impl FnOnce(u64) -> bool,
    ) -> Option<BlockId> {
        let blocks = self
            .streams
            .iter_mut()
            .find(|(s, _)| *s == stream)
            .map(|(_, m)| m)?;
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
        stream: StreamId,
        size: u64,
    ) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.walk(stream, move |m| m.from(key(size, 0)))
    }

    /// Free blocks on `stream` smaller than `size` bytes, largest first.
    pub(crate) fn below_desc(
        &self,
        stream: StreamId,
        size: u64,
    ) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.walk(stream, move |m| m.below_desc(key(size, 0)))
    }

    /// The (size, block) entries `entries` picks from `stream`'s blocks; none for a stream
    /// without free blocks.
    fn walk<'a, I: Iterator<Item = (u128, BlockId)> + 'a>(
        &'a self,
        stream: StreamId,
        entries: impl FnMut(&'a StreamBlocks) -> I + 'a,
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
    pub(crate) fn age(&self, blocks: &Blocks, id: BlockId) -> u64 {
        self.lookups - blocks[id].gc_base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotone_and_in_range() {
        let mut sizes: Vec<u64> = (0..1u64 << 16)
            .map(|i| i * 512)
            .chain((9..64).flat_map(|e| [(1u64 << e) - 512, 1u64 << e, (1u64 << e) + 512]))
            .chain([u64::MAX])
            .collect();
        sizes.sort_unstable();
        for w in sizes.windows(2) {
            assert!(class(w[0]) <= class(w[1]), "{} {}", w[0], w[1]);
            assert!(class(w[1]) < CLASSES);
        }
        for w in [
            512u64,
            1024,
            4096,
            4608,
            1 << 20,
            (1 << 20) + 512,
            20 << 20,
            1 << 40,
        ]
        .windows(2)
        {
            assert!(class(w[0]) <= class(w[1]));
        }
        assert_eq!(class(512), 1);
        assert_eq!(class(4096), 8);
        assert_eq!(class(4096 + 512), 9);
        assert_eq!(class(8192), 16);
        assert_eq!(class(u64::MAX), CLASSES - 1);
    }
}
