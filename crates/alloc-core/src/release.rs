//! Giving cached segments back to the device: torch's `release_block`,
//! `release_available_cached_blocks` (just enough oversize blocks) and `release_cached_blocks`
//! (`empty_cache` and the last OOM retry).
//!
//! ACL frees do not wait for queued work (unlike `cudaFree`), so the device is synchronized once
//! before a batch of frees, as torch_npu does.

use alloc::vec::Vec;

use crate::allocator::{Allocator, Flavour, Request};
use crate::block::BlockId;
use crate::device::{Device, VmmError};
use crate::history::Action;
use crate::private_pool::PoolId;
use crate::size::PoolKind;

impl<D: Device> Allocator<D> {
    /// Frees one whole free segment (a block with no neighbours) on the device and forgets it.
    /// On a device error the block stays cached and nothing changes.
    pub(crate) fn release_block(&mut self, id: BlockId) -> Result<(), D::Error> {
        let block = &self.blocks[id];
        debug_assert!(!block.is_split() && block.is_idle());
        let (addr, size, pool, set, stream) =
            (block.addr, block.size, block.pool, block.set, block.stream);
        if self.is_saver_segment(addr) {
            if !self.release_saver_segment(addr, size)? {
                return Ok(());
            }
        } else {
            self.device.free(addr, size)?;
        }
        if self.history.is_some() {
            // Before the count: a pool whose last segment this is may be forgotten with it.
            self.record(Action::SegmentFree, addr, size, Some(stream), set);
        }
        self.pools[(set, pool)].remove(&self.blocks, id);
        self.count_pool_segment(set, -1);
        self.segments.remove(&addr);
        self.unindex(id);
        self.blocks.remove(id);
        self.total_allocated -= size;
        self.stats.num_device_free += 1;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size);
        if self.is_oversize(size) {
            self.stats.oversize_segments.decrease(1);
        }
        Ok(())
    }

    /// Releases the given whole free segments, after one device synchronization unless
    /// `synchronized` says the caller made it.
    pub(crate) fn release_segments(
        &mut self,
        ids: &[BlockId],
        synchronized: bool,
    ) -> Result<(), D::Error> {
        if ids.is_empty() {
            return Ok(());
        }
        if !synchronized {
            self.device.synchronize()?;
        }
        for &id in ids {
            self.release_block(id)?;
        }
        Ok(())
    }

    /// torch's `release_available_cached_blocks`: with a `max_split_size`, free the smallest
    /// oversize block that covers the request, or else the largest oversize blocks (on the
    /// request's stream) until their sizes add up to the request. Returns whether enough was freed;
    /// blocks freed on the way stay freed either way.
    pub(crate) fn release_available_cached_blocks(
        &mut self,
        req: &Request<D::Stream>,
    ) -> Result<bool, D::Error> {
        let Some(max_split) = self.conf.max_split_size else {
            return Ok(false);
        };
        // torch_npu synchronizes the device here whether or not a block qualifies (every
        // release, back to v1.8); CUDA's `cudaFree` synchronizes only when something is freed.
        let synchronized = self.facts.flavour == Flavour::TorchNpu;
        if synchronized {
            self.device.synchronize()?;
        }
        let key = req.size.max(max_split);
        let pool = &self.pools[(req.set, req.pool)];
        // The smallest whole segment on this stream that covers `key`. Oversize blocks are never
        // split by the default rules, but with `page_size:1g` a split remainder can be ≥
        // max_split; freeing it would free part of a segment, so such blocks are passed over.
        // A block of an expandable segment ends the search, as in PyTorch (which then walks
        // down; torch_npu would reach an internal assert; docs/deviations.md).
        let covering = pool
            .at_least(req.stream, key)
            .map(|(_, id)| id)
            .take_while(|&id| !self.blocks[id].is_expandable())
            .find(|&id| self.is_whole_segment(id));
        if let Some(id) = covering {
            self.release_segments(&[id], synchronized)?;
            return Ok(true);
        }
        // Walk down from the largest block below `key` on this stream.
        let mut chosen = Vec::new();
        let mut released = 0;
        for (size, id) in pool.below_desc(req.stream, key) {
            if released >= key || size < max_split {
                break;
            }
            // Skip split blocks rather than free part of a segment (see above).
            if self.is_whole_segment(id) {
                chosen.push(id);
                released += size;
            }
        }
        self.release_segments(&chosen, synchronized)?;
        Ok(released >= key)
    }

    /// Whether free block `id` is a whole device segment (never one of an expandable segment).
    pub(crate) fn is_whole_segment(&self, id: BlockId) -> bool {
        let b = &self.blocks[id];
        !b.is_split() && !b.is_expandable()
    }

    /// torch's `release_cached_blocks`: synchronize and drain every event, then in the default
    /// large pool and then the small one free every whole free segment and unmap the free pages
    /// of expandable segments, and do the same (small, then large) in every freeable private
    /// pool, forgetting those left without segments. Split segments stay.
    pub(crate) fn release_cached_blocks(&mut self) -> Result<(), D::Error> {
        self.release_cached_blocks_of(None, true)
    }

    /// [`Allocator::release_cached_blocks`] for every pool (`None`), or for private pool
    /// `Some(id)` alone (torch_npu's `emptyCache(id)`): the device is synchronized, and only if
    /// the pool is freeable are the events of its blocks completed (counted in
    /// `num_sync_all_streams`) and its free segments given back; other blocks' events stay
    /// pending. With `free_physical` (all but `empty_virt_addr_cache`) the pages unmapped are
    /// freed, and so are those cached before; without, they are cached for later maps.
    pub(crate) fn release_cached_blocks_of(
        &mut self,
        only: Option<PoolId>,
        free_physical: bool,
    ) -> Result<(), D::Error> {
        let freeable = self.freeable_sets(only);
        if only.is_none() {
            self.synchronize_and_free_events()?;
        } else {
            self.device.synchronize()?;
            let Some(&set) = freeable.first() else {
                return Ok(());
            };
            self.free_events_of(set);
        }
        if self.live_expandable > 0
            || !self.parked.pages.is_empty()
            || !self.parked.ranges.is_empty()
        {
            release_result(self.retry_parked(only.map(|_| freeable.as_slice())))?;
        }
        self.retry_parked_host();
        let default = only
            .is_none()
            .then_some((0, [PoolKind::Large, PoolKind::Small]));
        let private = freeable
            .iter()
            .map(|&set| (set, [PoolKind::Small, PoolKind::Large]));
        let order: Vec<_> = default.into_iter().chain(private).collect();
        for (set, kinds) in order {
            for pool in kinds {
                let whole: Vec<BlockId> = self.pools[(set, pool)]
                    .iter()
                    .filter(|&id| self.is_whole_segment(id))
                    .collect();
                // The device was just synchronized; no second synchronization is needed.
                for id in whole {
                    self.release_block(id)?;
                }
                if self.live_expandable > 0 {
                    release_result(self.release_expandable_blocks(set, pool, !free_physical))?;
                }
                if free_physical {
                    self.release_cached_pages(set, Some(pool));
                }
            }
        }
        self.forget_empty_pools(&freeable);
        Ok(())
    }
}

/// The outcome of giving virtual memory back, as `empty_cache` reports it: the device's error,
/// or nothing for an answer a device cannot give there (unsupported or out of memory after it
/// mapped the pages; the books are exact either way and the pages stay mapped).
fn release_result<E>(result: Result<(), VmmError<E>>) -> Result<(), E> {
    match result {
        Err(VmmError::Other(e)) => Err(e),
        Ok(()) | Err(VmmError::Unsupported | VmmError::OutOfMemory) => Ok(()),
    }
}
