//! Splitting a found block on allocation and merging free neighbours on free: torch's
//! `should_split`, `alloc_found_block`, `free_block` and `try_merge_blocks`, with the
//! `inactive_split` bookkeeping that goes with them, and torch_npu's base-address alignment of
//! large blocks while expandable segments are on.

use crate::allocator::{Allocator, Request};
use crate::block::{Block, BlockId};
use crate::device::Device;
use crate::history::Action;
use crate::private_pool::PoolSet;
use crate::size::{MIN_BLOCK_SIZE, PoolKind, ROUND_LARGE, SMALL_SIZE};

/// torch's `should_split`: small-pool blocks split when at least 512 bytes remain; large-pool
/// blocks only for requests below `max_split_size` and when more than 1 MiB remains (smaller
/// large-pool remainders would only be usable by small requests, which never look there). While
/// expandable segments are on, every block splits at 512 bytes remaining, as in the small pool
/// (torch_npu reads the global setting, not the block's kind).
#[inline]
pub fn should_split(
    pool: PoolKind,
    block_size: u64,
    size: u64,
    max_split_size: Option<u64>,
    expandable_segments: bool,
) -> bool {
    let remaining = block_size - size;
    if pool == PoolKind::Small || expandable_segments {
        return remaining >= MIN_BLOCK_SIZE;
    }
    max_split_size.is_none_or(|m| size < m) && remaining > SMALL_SIZE
}

impl<D: Device> Allocator<D> {
    /// Splits `id` if torch would, marks the front allocated and updates the stats.
    #[inline(always)]
    pub(crate) fn alloc_found_block(&mut self, id: BlockId, req: &Request<D::Stream>) -> u64 {
        let id = if self.conf.expandable_segments
            && req.size >= ROUND_LARGE
            && !(req.set != 0 && self.is_saver_set(req.set))
        {
            self.align_base(id, req.size)
        } else {
            id
        };
        let size = req.size;
        let pool = req.pool;
        // torch turns expandable segments off for a pool with its own allocator, as the memory
        // saver's pools are.
        let expandable =
            self.conf.expandable_segments && !(req.set != 0 && self.is_saver_set(req.set));
        let block = &mut self.blocks[id];
        let already_split = block.is_split();
        // torch leaves blocks of expandable segments out of `inactive_split`.
        let counted = !block.is_expandable();
        // A block taken whole keeps the one reference to its record (no second lookup in the
        // slab); a split relinks the segment and looks the front up again.
        let split = should_split(pool, block.size, size, self.conf.max_split_size, expandable)
                // torch_npu's `no_split` pools hand their blocks out whole: asked only of a
                // block that would split, so that a block taken whole asks nothing.
                && (req.set == 0 || !self.pools.no_split(req.set));
        let block = if split {
            self.split_front(id, size, pool, already_split, counted);
            &mut self.blocks[id]
        } else {
            if already_split && counted {
                // An already-split free block becomes active whole.
                self.stats.inactive_split_bytes.decrease(pool, block.size);
                self.stats.inactive_split.decrease(pool, 1);
            }
            block
        };
        block.allocated = true;
        block.requested = req.requested;
        let (addr, size) = (block.addr, block.size);
        if !block.indexed {
            block.indexed = true;
            self.by_addr.insert(addr, id);
        }
        self.stats.allocation.increase(pool, 1);
        self.stats.allocated_bytes.increase(pool, size);
        self.stats.note_active_peak(pool);
        self.stats.requested_bytes.increase(pool, req.requested);
        if self.is_oversize(size) {
            self.stats.oversize_allocations.increase(1);
        }
        if self.history.is_some() {
            let stream = self.blocks[id].stream;
            self.record(Action::Alloc, addr, req.requested, Some(stream), req.set);
        }
        addr
    }

    /// Splits free block `id` so that it keeps its first `size` bytes; the rest becomes a new
    /// free block in its pool. `already_split`: the block shared its segment before; `counted`:
    /// it is not part of an expandable segment (else `inactive_split` does not move).
    #[inline(always)]
    fn split_front(
        &mut self,
        id: BlockId,
        size: u64,
        pool: PoolKind,
        already_split: bool,
        counted: bool,
    ) {
        // The front keeps the id and address; the remainder becomes a new free block.
        let rid = self.carve(id, size);
        let remainder = &mut self.blocks[rid];
        let (remainder_size, set) = (remainder.size, remainder.set);
        self.pools[(set, pool)].insert(remainder, rid);
        if counted && already_split {
            // An already-split free block shrinks by `size` bytes.
            self.stats.inactive_split_bytes.decrease(pool, size);
        } else if counted {
            // A previously whole segment now holds one more inactive split block.
            self.stats
                .inactive_split_bytes
                .increase(pool, remainder_size);
            self.stats.inactive_split.increase(pool, 1);
        }
    }

    /// Cuts block `id` `at` bytes in: the part above becomes a new free block, next in the
    /// segment's chain (same stream, pool, set and expandable segment), and its id is returned.
    /// Neither part is put into a pool here.
    #[inline(always)]
    fn carve(&mut self, id: BlockId, at: u64) -> BlockId {
        let block = &self.blocks[id];
        let upper = Block {
            addr: block.addr + at,
            size: block.size - at,
            prev: Some(id),
            next: block.next,
            vm: block.vm,
            ..Block::segment(0, 0, block.stream, block.pool, block.set)
        };
        let uid = self.blocks.insert(upper);
        if let Some(next) = self.blocks[id].next {
            self.blocks[next].prev = Some(uid);
        }
        let block = &mut self.blocks[id];
        block.next = Some(uid);
        block.size = at;
        uid
    }

    /// torch_npu's `base_addr_aligned_kb`: a large request found at an address that is not a
    /// multiple of the alignment starts at the next multiple instead, if it still fits; the bytes
    /// skipped stay behind as a free block (not merged with a free block before it, its GC age
    /// starting again). Returns the block to allocate from.
    #[cold]
    #[inline(never)]
    fn align_base(&mut self, id: BlockId, size: u64) -> BlockId {
        let align = self.conf.base_addr_aligned;
        let block = &self.blocks[id];
        if align == 0 || block.addr.is_multiple_of(align) {
            return id;
        }
        let offset = align - block.addr % align;
        if offset.saturating_add(size) > block.size {
            // torch_npu hands the block out unaligned.
            return id;
        }
        let (pool, set, was_split, whole) = (block.pool, block.set, block.is_split(), block.size);
        let aid = self.carve(id, offset);
        // Its GC age starts again, as torch_npu's: the block found was reset when it was taken.
        self.pools[(set, pool)].insert(&mut self.blocks[id], id);
        if !self.blocks[id].is_expandable() {
            // Both parts are now free split blocks (torch_npu leaves the head out of the count;
            // docs/deviations.md).
            if was_split {
                self.stats.inactive_split.increase(pool, 1);
            } else {
                self.stats.inactive_split.increase(pool, 2);
                self.stats.inactive_split_bytes.increase(pool, whole);
            }
        }
        aid
    }

    /// torch's `free_block`: merge with idle neighbours, return to the pool, update stats.
    pub(crate) fn free_block(&mut self, id: BlockId) {
        if self.history.is_some() {
            self.record_block(Action::FreeCompleted, id);
        }
        self.return_block(id);
    }

    /// [`Allocator::free_block`] but its history entry, which `free` records with its own.
    #[inline(always)]
    pub(crate) fn return_block(&mut self, id: BlockId) {
        let block = &self.blocks[id];
        let (pool, set, requested, mapped) = (block.pool, block.set, block.requested, block.mapped);
        let (below, above) = (block.prev, block.next);
        // First, so that `requested` is not kept live (in a register, or spilled) across the
        // merges.
        self.stats.requested_bytes.decrease(pool, requested);
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        // Merge with the block below first, then the one above, as torch does. The links are
        // read once: merging below leaves the block above where it was.
        let mut id = id;
        if let Some((merged, bytes)) = below.and_then(|b| self.merge_with(id, b, false, mapped)) {
            id = merged;
            net_bytes -= bytes as i64;
            net_blocks -= 1;
        }
        if let Some((_, bytes)) = above.and_then(|a| self.merge_with(id, a, true, mapped)) {
            net_bytes -= bytes as i64;
            net_blocks -= 1;
        }
        let block = &mut self.blocks[id];
        block.requested = 0;
        block.allocated = false;
        let (split, size) = (block.is_split(), block.size);
        let counted = !block.is_expandable();
        self.pools[(set, pool)].insert(block, id);
        if counted {
            if net_blocks == 0 {
                // Nothing merged (each merge counts one block off): the block is one more
                // inactive split block, or a whole segment, which is none.
                if split {
                    self.stats.inactive_split.increase(pool, 1);
                    self.stats.inactive_split_bytes.increase(pool, size);
                }
            } else {
                if split {
                    net_blocks += 1;
                    net_bytes += size as i64;
                }
                self.stats.inactive_split.apply(pool, net_blocks);
                self.stats.inactive_split_bytes.apply(pool, net_bytes);
            }
        }
    }

    /// torch's `try_merge_blocks`: folds the neighbour of `id` (the one above if `next`, else the
    /// one below) into it if that neighbour is idle and mapped alike, taking it out of its pool
    /// set. Returns the merged block's id (the lower one's) and the bytes taken in.
    pub(crate) fn try_merge(&mut self, id: BlockId, next: bool) -> Option<(BlockId, u64)> {
        let block = &self.blocks[id];
        let other = if next { block.next } else { block.prev }?;
        let mapped = block.mapped;
        self.merge_with(id, other, next, mapped)
    }

    /// [`Allocator::try_merge`] with the neighbour `other` and whether block `id` is `mapped`
    /// already read.
    // Always inlined: `next` is a constant at every call, and the free path is hot.
    #[inline(always)]
    fn merge_with(
        &mut self,
        id: BlockId,
        other: BlockId,
        next: bool,
        mapped: bool,
    ) -> Option<(BlockId, u64)> {
        let o = &self.blocks[other];
        if !o.is_idle() || o.mapped != mapped {
            return None;
        }
        let (size, stream, addr) = (o.size, o.stream, o.addr);
        let (pool, set) = (o.pool, o.set);
        if o.mapped {
            self.pools[(set, pool)].remove(&self.blocks, other);
        } else {
            self.forget_unmapped(set, pool, stream, addr);
        }
        Some(if next {
            self.absorb(id, other);
            (id, size)
        } else {
            self.absorb(other, id);
            (other, size)
        })
    }

    /// Takes an unmapped block out of its pool's `unmapped` set; out of line, as only expandable
    /// segments have unmapped blocks.
    #[cold]
    #[inline(never)]
    fn forget_unmapped(&mut self, set: PoolSet, pool: PoolKind, stream: D::Stream, addr: u64) {
        self.pools[(set, pool)].unmapped.remove(&(stream, addr));
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
        assert!(should_split(
            PoolKind::Small,
            2 * MIB,
            2 * MIB - 512,
            None,
            false
        ));
        assert!(!should_split(
            PoolKind::Small,
            2 * MIB,
            2 * MIB - 511,
            None,
            false
        ));
        assert!(!should_split(
            PoolKind::Small,
            2 * MIB,
            2 * MIB,
            None,
            false
        ));
    }

    #[test]
    fn large_pool_needs_more_than_one_mib_and_a_small_enough_request() {
        assert!(
            !should_split(PoolKind::Large, 20 * MIB, 19 * MIB, None, false),
            "exactly 1 MiB left"
        );
        assert!(should_split(
            PoolKind::Large,
            20 * MIB,
            19 * MIB - 512,
            None,
            false
        ));
        assert!(!should_split(
            PoolKind::Large,
            100 * MIB,
            40 * MIB,
            Some(40 * MIB),
            false
        ));
        assert!(should_split(
            PoolKind::Large,
            100 * MIB,
            40 * MIB - 512,
            Some(40 * MIB),
            false
        ));
    }

    #[test]
    fn expandable_segments_split_every_pool_at_512_remaining() {
        assert!(should_split(
            PoolKind::Large,
            20 * MIB,
            20 * MIB - 512,
            None,
            true
        ));
        assert!(!should_split(
            PoolKind::Large,
            20 * MIB,
            20 * MIB - 511,
            None,
            true
        ));
    }
}
