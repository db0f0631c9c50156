//! Splitting a found block on allocation and merging free neighbours on free: torch's
//! `should_split`, `alloc_found_block`, `free_block` and `try_merge_blocks`, with the
//! `inactive_split` bookkeeping that goes with them.

use crate::allocator::{Allocator, Request, pool_index};
use crate::block::{Block, BlockId};
use crate::device::Device;
use crate::size::{MIN_BLOCK_SIZE, PoolKind, SMALL_SIZE};

/// torch's `should_split`: small-pool blocks split when at least 512 bytes remain; large-pool
/// blocks only for requests below `max_split_size` and when more than 1 MiB remains (smaller
/// large-pool remainders would only be usable by small requests, which never look there).
#[inline]
pub fn should_split(
    pool: PoolKind,
    block_size: u64,
    size: u64,
    max_split_size: Option<u64>,
) -> bool {
    let remaining = block_size - size;
    match pool {
        PoolKind::Small => remaining >= MIN_BLOCK_SIZE,
        PoolKind::Large => max_split_size.is_none_or(|m| size < m) && remaining > SMALL_SIZE,
    }
}

impl<D: Device> Allocator<D> {
    /// Splits `id` if torch would, marks the front allocated and updates the stats.
    pub(crate) fn alloc_found_block(&mut self, id: BlockId, req: &Request<D::Stream>) -> u64 {
        let size = req.size;
        let pool = req.pool;
        let block = &self.blocks[id];
        let already_split = block.is_split();
        if should_split(pool, block.size, size, self.conf.max_split_size) {
            // The front keeps the id and address; the remainder becomes a new free block.
            let remainder = Block {
                addr: block.addr + size,
                size: block.size - size,
                prev: Some(id),
                next: block.next,
                ..Block::segment(0, 0, block.stream, pool)
            };
            let remainder_size = remainder.size;
            let rid = self.blocks.insert(remainder);
            if let Some(next) = self.blocks[id].next {
                self.blocks[next].prev = Some(rid);
            }
            let block = &mut self.blocks[id];
            block.next = Some(rid);
            block.size = size;
            self.pools[pool_index(pool)].insert(&mut self.blocks, rid);
            if already_split {
                // An already-split free block shrinks by `size` bytes.
                self.stats.inactive_split_bytes.decrease(pool, size);
            } else {
                // A previously whole segment now holds one more inactive split block.
                self.stats
                    .inactive_split_bytes
                    .increase(pool, remainder_size);
                self.stats.inactive_split.increase(pool, 1);
            }
        } else if already_split {
            // An already-split free block becomes active whole.
            self.stats
                .inactive_split_bytes
                .decrease(pool, self.blocks[id].size);
            self.stats.inactive_split.decrease(pool, 1);
        }
        let block = &mut self.blocks[id];
        block.allocated = true;
        block.requested = req.requested;
        let (addr, size) = (block.addr, block.size);
        if !block.indexed {
            block.indexed = true;
            self.by_addr.insert(addr, id);
        }
        self.stats.allocation.increase(pool, 1);
        self.stats.allocated_bytes.increase(pool, size);
        self.stats.active.increase(pool, 1);
        self.stats.active_bytes.increase(pool, size);
        self.stats.requested_bytes.increase(pool, req.requested);
        if self.is_oversize(size) {
            self.stats.oversize_allocations.increase(1);
        }
        addr
    }

    /// torch's `free_block`: merge with idle neighbours, return to the pool, update stats.
    pub(crate) fn free_block(&mut self, id: BlockId) {
        let block = &self.blocks[id];
        let (pool, original_size, requested) = (block.pool, block.size, block.requested);
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        // Merge with the block below first, then the one above, as torch does.
        let mut id = id;
        if let Some(prev) = self.blocks[id].prev {
            if self.blocks[prev].is_idle() {
                net_bytes -= self.blocks[prev].size as i64;
                net_blocks -= 1;
                self.pools[pool_index(pool)].remove(&self.blocks, prev);
                self.absorb(prev, id);
                id = prev;
            }
        }
        if let Some(next) = self.blocks[id].next {
            if self.blocks[next].is_idle() {
                net_bytes -= self.blocks[next].size as i64;
                net_blocks -= 1;
                self.pools[pool_index(pool)].remove(&self.blocks, next);
                self.absorb(id, next);
            }
        }
        let block = &mut self.blocks[id];
        block.requested = 0;
        if block.is_split() {
            net_blocks += 1;
            net_bytes += block.size as i64;
        }
        self.pools[pool_index(pool)].insert(&mut self.blocks, id);
        self.stats.inactive_split.apply(pool, net_blocks);
        self.stats.inactive_split_bytes.apply(pool, net_bytes);
        self.stats.active.decrease(pool, 1);
        self.stats.active_bytes.decrease(pool, original_size);
        self.stats.requested_bytes.decrease(pool, requested);
    }

    /// Folds block `upper` into its lower neighbour `lower` (which keeps its id, so the block at
    /// a segment's start keeps its id for the segment's life) and frees `upper`'s record. Pool
    /// membership is the caller's business.
    fn absorb(&mut self, lower: BlockId, upper: BlockId) {
        let (size, after) = (self.blocks[upper].size, self.blocks[upper].next);
        let block = &mut self.blocks[lower];
        block.size += size;
        block.next = after;
        if let Some(after) = after {
            self.blocks[after].prev = Some(lower);
        }
        self.unindex(upper);
        self.blocks.remove(upper);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn small_pool_splits_at_512_remaining() {
        assert!(should_split(PoolKind::Small, 2 * MIB, 2 * MIB - 512, None));
        assert!(!should_split(PoolKind::Small, 2 * MIB, 2 * MIB - 511, None));
        assert!(!should_split(PoolKind::Small, 2 * MIB, 2 * MIB, None));
    }

    #[test]
    fn large_pool_needs_more_than_one_mib_and_a_small_enough_request() {
        assert!(
            !should_split(PoolKind::Large, 20 * MIB, 19 * MIB, None),
            "exactly 1 MiB left"
        );
        assert!(should_split(
            PoolKind::Large,
            20 * MIB,
            19 * MIB - 512,
            None
        ));
        assert!(!should_split(
            PoolKind::Large,
            100 * MIB,
            40 * MIB,
            Some(40 * MIB)
        ));
        assert!(should_split(
            PoolKind::Large,
            100 * MIB,
            40 * MIB - 512,
            Some(40 * MIB)
        ));
    }
}
