//! Block pools: the free, cached blocks of one pool (small or large), ordered for best fit.
//!
//! torch keeps one `std::set` ordered by (stream, size, address): the first entry at or after
//! (stream, size, 0) is the smallest free block on the same stream that fits, lowest address
//! first. Blocks are never reused across streams, so here each stream has its own ordered map
//! keyed by (size, address) packed into one `u128`: the same order, half the key size and one
//! integer comparison per step. Streams are few, so they live in a short sorted `Vec`.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use crate::block::{BlockId, Blocks};
use crate::device::StreamId;

/// (size, address) packed so that integer order is (size, address) order.
fn key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

fn size_of(key: u128) -> u64 {
    (key >> 64) as u64
}

/// The free blocks of one stream, by (size, address).
type StreamBlocks = BTreeMap<u128, BlockId>;

/// The free blocks of one pool and its lookup counter (the clock of GC ages).
#[derive(Debug, Default)]
pub(crate) struct BlockPool {
    /// Per stream, sorted by stream.
    streams: Vec<(StreamId, StreamBlocks)>,
    /// Number of `get_free_block` lookups while GC is enabled: torch's `get_free_blocks_call_count`.
    pub(crate) lookups: u64,
}

impl BlockPool {
    fn stream(&self, stream: StreamId) -> Option<&StreamBlocks> {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, m)| m)
    }

    fn stream_mut(&mut self, stream: StreamId) -> &mut StreamBlocks {
        let i = match self.streams.iter().position(|(s, _)| *s == stream) {
            Some(i) => i,
            None => {
                let i = self.streams.partition_point(|(s, _)| *s < stream);
                self.streams.insert(i, (stream, BTreeMap::new()));
                i
            }
        };
        &mut self.streams[i].1
    }

    /// Puts a free block into the pool and starts its GC age.
    pub(crate) fn insert(&mut self, blocks: &mut Blocks, id: BlockId) {
        let block = &mut blocks[id];
        block.gc_base = self.lookups;
        let (stream, k) = (block.stream, key(block.size, block.addr));
        self.stream_mut(stream).insert(k, id);
    }

    /// Takes a block out of the pool; returns whether it was there.
    pub(crate) fn remove(&mut self, blocks: &Blocks, id: BlockId) -> bool {
        let b = &blocks[id];
        let k = key(b.size, b.addr);
        self.streams
            .iter_mut()
            .find(|(s, _)| *s == b.stream)
            .is_some_and(|(_, m)| m.remove(&k).is_some())
    }

    /// The smallest free block on `stream` at least `size` bytes large: (its size, its id).
    pub(crate) fn best_fit(&self, stream: StreamId, size: u64) -> Option<(u64, BlockId)> {
        let (&k, &id) = self.stream(stream)?.range(key(size, 0)..).next()?;
        Some((size_of(k), id))
    }

    /// Free blocks on `stream` of at least `size` bytes, smallest first.
    pub(crate) fn at_least(
        &self,
        stream: StreamId,
        size: u64,
    ) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.stream(stream)
            .into_iter()
            .flat_map(move |m| m.range(key(size, 0)..))
            .map(|(&k, &id)| (size_of(k), id))
    }

    /// Free blocks on `stream` smaller than `size` bytes, largest first.
    pub(crate) fn below_desc(
        &self,
        stream: StreamId,
        size: u64,
    ) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.stream(stream)
            .into_iter()
            .flat_map(move |m| m.range(..key(size, 0)).rev())
            .map(|(&k, &id)| (size_of(k), id))
    }

    /// Every free block in torch's pool order: (stream, size, address).
    pub(crate) fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.streams.iter().flat_map(|(_, m)| m.values().copied())
    }

    /// GC age of a free block: lookups on this pool since it entered the pool.
    pub(crate) fn age(&self, blocks: &Blocks, id: BlockId) -> u64 {
        self.lookups - blocks[id].gc_base
    }
}
