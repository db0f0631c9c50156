//! `malloc` up to the miss path: check and size the request (torch's `round_size`, pool and
//! `alloc_size`), then take the best-fitting cached block under the oversize rules (torch's
//! `get_free_block`). A miss continues in `oom_retry`.

use alloc_conf::AllocConf;

use crate::allocator::{Allocator, Request};
use crate::block::BlockId;
use crate::device::Device;
use crate::error::AllocError;
use crate::oom_retry::MallocStep;
use crate::private_pool::{PoolId, PoolSet};
use crate::size::{self, PoolKind};

/// What the pool lookup of a malloc found.
enum Lookup<S> {
    /// An address to return (0 for a zero-size request).
    Found(u64),
    /// Nothing: the miss path runs.
    Miss(Request<S>),
}

impl<D: Device> Allocator<D> {
    /// Allocates `size` bytes for use on `stream`. Returns the address, or 0 for a zero-size
    /// request (which changes no stats).
    pub fn malloc(&mut self, size: u64, stream: D::Stream) -> Result<u64, AllocError<D::Error>> {
        self.malloc_to(size, stream, 0)
    }

    /// [`Allocator::malloc`] from private pool `pool` (torch's allocation inside a
    /// `use_mem_pool` scope): served only from that pool's blocks and segments. `PoolId::DEFAULT`
    /// is the default pools.
    pub fn malloc_in(
        &mut self,
        size: u64,
        stream: D::Stream,
        pool: PoolId,
    ) -> Result<u64, AllocError<D::Error>> {
        let set = self.routable_set(pool)?;
        self.malloc_to(size, stream, set)
    }

    /// `malloc` into pool set `set`.
    // Always inlined, as are the hot helpers under it (`lookup`, `get_free_block`, the pool's
    // `take_best_fit`, the counters' updates): under the bench profile's whole-program LTO,
    // LLVM otherwise outlined a different level in each caller (the runtime's malloc went two
    // calls deep), each call a dozen instructions of saves and restores.
    #[inline(always)]
    fn malloc_to(
        &mut self,
        size: u64,
        stream: D::Stream,
        set: PoolSet,
    ) -> Result<u64, AllocError<D::Error>> {
        // The hit path returns without building a step.
        let req = match self.lookup(size, stream, set)? {
            Lookup::Found(addr) => return Ok(addr),
            Lookup::Miss(req) => req,
        };
        let mut step = self.miss(req);
        loop {
            match step {
                MallocStep::Done(result) => return result,
                MallocStep::NeedSegment { bytes, pending } => {
                    let segment = self.device.malloc(bytes);
                    step = self.resume_malloc(pending, segment);
                }
                // This path cannot let the caller drain its queue: release nothing.
                MallocStep::NeedSync { pending } => step = self.resume_after_sync(pending, false),
            }
        }
    }

    /// [`Allocator::malloc`] up to its first device malloc, if it needs one.
    pub fn begin_malloc(
        &mut self,
        size: u64,
        stream: D::Stream,
    ) -> MallocStep<D::Error, D::Stream> {
        self.begin_malloc_in(size, stream, PoolId::DEFAULT)
    }

    /// [`Allocator::begin_malloc`] from private pool `pool`, as [`Allocator::malloc_in`].
    pub fn begin_malloc_in(
        &mut self,
        size: u64,
        stream: D::Stream,
        pool: PoolId,
    ) -> MallocStep<D::Error, D::Stream> {
        let set = match self.routable_set(pool) {
            Ok(set) => set,
            Err(e) => return MallocStep::Done(Err(e)),
        };
        match self.lookup(size, stream, set) {
            Ok(Lookup::Found(addr)) => MallocStep::Done(Ok(addr)),
            Ok(Lookup::Miss(req)) => self.miss(req),
            Err(e) => MallocStep::Done(Err(e)),
        }
    }

    /// torch's malloc up to the miss path: size the request and take a cached block if one fits.
    #[inline(always)]
    fn lookup(
        &mut self,
        size: u64,
        stream: D::Stream,
        set: PoolSet,
    ) -> Result<Lookup<D::Stream>, AllocError<D::Error>> {
        let Some(req) = self.request(size, stream, set)? else {
            return Ok(Lookup::Found(0));
        };
        Ok(match self.get_free_block(&req) {
            Some(id) => Lookup::Found(self.alloc_found_block(id, &req)),
            None => Lookup::Miss(req),
        })
    }

    /// Checks and sizes a request: `Ok(None)` for a zero-size one. Runs `process_events` first,
    /// as torch's malloc does (with `multi_stream_lazy_reclaim`, only past 512 pending events).
    #[inline(always)]
    pub(crate) fn request(
        &mut self,
        size: u64,
        stream: D::Stream,
        set: PoolSet,
    ) -> Result<Option<Request<D::Stream>>, AllocError<D::Error>> {
        if size == 0 {
            return Ok(None);
        }
        // Beyond 1 EiB, or where the pad would take the padded size to 2^63: with torch_npu's
        // 32-byte pad that is never, but an absurd pad (a `DeviceFacts` field, or a trace's `pad`
        // line) gets there, and rounding the padded size would overflow.
        if size >= self.request_limit {
            return Err(AllocError::TooLarge { size });
        }
        let padded = size + self.facts.pad;
        self.reap_for_malloc().map_err(AllocError::Device)?;
        let rounded = if self.divides {
            size::round_size(padded, &self.conf)
        } else {
            size::round_512(padded)
        };
        Ok(Some(Request {
            stream,
            requested: size,
            size: rounded,
            pool: PoolKind::for_size(rounded),
            set,
            // Only a miss needs it: `miss` computes it.
            alloc_size: 0,
        }))
    }

    /// torch's `get_free_block`: best fit on the request's stream, under the oversize rules.
    #[inline(always)]
    pub(crate) fn get_free_block(&mut self, req: &Request<D::Stream>) -> Option<BlockId> {
        let gc = self.gc_enabled();
        if self.live_expandable > 0 {
            return self.get_free_block_expandable(req, gc);
        }
        let pool = &mut self.pools[(req.set, req.pool)];
        if gc {
            pool.lookups += 1;
        }
        let (conf, size) = (&self.conf, req.size);
        pool.take_best_fit(req.stream, size, |candidate| {
            oversize_rules_allow(conf, size, candidate)
        })
    }

    /// `get_free_block` while blocks of expandable segments exist (torch's step 3). With
    /// expandable segments on, a block that can grow into the unmapped space after it counts as
    /// that much larger, so best fit walks on while the next block is smaller by that measure;
    /// with them off, blocks of expandable segments are passed over.
    #[inline(never)]
    fn get_free_block_expandable(&mut self, req: &Request<D::Stream>, gc: bool) -> Option<BlockId> {
        let pool = &mut self.pools[(req.set, req.pool)];
        if gc {
            pool.lookups += 1;
        }
        let blocks = &self.blocks;
        let mut fits = pool
            .at_least(req.stream, req.size)
            .map(|(_, id)| id)
            .peekable();
        let mut found = fits.next()?;
        if blocks[found].is_expandable() {
            if self.conf.expandable_segments {
                let growable = |id: BlockId| {
                    let b = &blocks[id];
                    let after = b.next.filter(|&n| !blocks[n].mapped);
                    b.size + after.map_or(0, |n| blocks[n].size)
                };
                while blocks[found].is_expandable() {
                    match fits.peek() {
                        Some(&next) if growable(next) < growable(found) => {
                            found = next;
                            fits.next();
                        }
                        _ => break,
                    }
                }
            } else {
                found = fits.find(|&id| !blocks[id].is_expandable())?;
            }
        }
        drop(fits);
        if !oversize_rules_allow(&self.conf, req.size, blocks[found].size) {
            return None;
        }
        pool.remove(&self.blocks, found);
        Some(found)
    }
}

/// torch's oversize rules for a best-fit candidate of `candidate` bytes.
#[inline]
fn oversize_rules_allow(conf: &AllocConf, size: u64, candidate: u64) -> bool {
    let Some(max_split) = conf.max_split_size else {
        return true;
    };
    // Rule A: a request below max_split never takes an oversize block.
    if size < max_split && candidate >= max_split {
        return false;
    }
    // Rule B: an oversize request takes a block only if it is less than max_non_split_rounding
    // larger. An allowance reaching past 2^64 bytes (a `max_non_split_rounding_mb` near 2^44)
    // allows any block; torch's size_t sum would wrap around and refuse every block instead.
    let limit = size.saturating_add(conf.max_non_split_rounding);
    !(size >= max_split && candidate >= limit)
}
