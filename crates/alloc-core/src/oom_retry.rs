//! The OOM retry chain, as resumable steps: what torch does after `get_free_block` fails (GC,
//! `alloc_block`, `release_available_cached_blocks` and `alloc_block`, `release_cached_blocks`
//! and `alloc_block` again) stops at each device malloc and hands it to the caller.
//!
//! This is what lets a runtime release its lock around the device malloc, as torch_npu does
//! with `release_lock_on_npumalloc:True`: [`Allocator::begin_malloc`] returns
//! [`MallocStep::NeedSegment`], the runtime unlocks, allocates, relocks, and
//! [`Allocator::resume_malloc`] carries on where the chain stopped. Other threads may use the
//! allocator in between; as in torch_npu, the chain then goes on without looking at the cache
//! again. [`Allocator::malloc`] is the same loop with the device called in place.

use alloc::boxed::Box;

use crate::allocator::{Allocator, Flavour, MAX_RESERVE, Notice, Request};
use crate::block::{Block, BlockId};
use crate::device::{Device, DeviceError, VmmError};
use crate::error::{AllocError, OutOfMemory, Rejection};
use crate::history::Action;

/// Which `alloc_block` of the retry chain a segment request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The first, right after the pool lookup (and GC) failed.
    First,
    /// After `release_available_cached_blocks` freed enough oversize blocks.
    AfterRelease,
    /// The last, after `release_cached_blocks` (counted in `num_alloc_retries`).
    Retry,
}

/// A `malloc` stopped at a device malloc; give it back to [`Allocator::resume_malloc`] with the
/// device's answer.
/// Neither `Clone` nor `Copy`: it is resumed once.
#[derive(Debug)]
#[must_use = "a pending malloc must be resumed with the device's answer, or a segment leaks"]
pub struct PendingMalloc<S> {
    req: Request<S>,
    stage: Stage,
    /// What the malloc does once resumed after [`MallocStep::NeedSync`].
    after_sync: AfterSync,
}

/// What a malloc stopped at [`MallocStep::NeedSync`] was about to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterSync {
    /// Nothing: the malloc waits for a segment.
    Nothing,
    /// Garbage-collect, then ask for the first segment.
    Gc,
    /// The release step of the retry chain at its stage, then ask again.
    Release,
}

/// Whether work the host queued but the device has not seen yet (torch_npu's task queue) may
/// still use memory the cache holds, and so what a malloc does before it gives cached memory
/// back inside its retry chain or GC. `empty_cache` and the memory saver are the caller's: it
/// synchronizes before calling them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostQueue {
    /// No host queue: the device's own synchronize is enough (torch's behaviour).
    #[default]
    None,
    /// Stop at [`MallocStep::NeedSync`] before releasing: the caller drops its lock, drains the
    /// queue and synchronizes, then calls [`Allocator::resume_after_sync`] (torch_npu's
    /// `UnlockGuard` + `npuSynchronizeDevice`). [`Allocator::malloc`] cannot stop, so it
    /// releases nothing (as [`HostQueue::NoRelease`]); drive the miss path with
    /// [`Allocator::begin_malloc`]. A free of an allocation used on other streams returns
    /// [`FreeError::DrainFirst`](crate::FreeError::DrainFirst) before it records events: the
    /// caller drains the queue, then calls [`Allocator::free_after_drain`].
    SyncFirst,
    /// Never release cached memory inside a malloc: no GC, and out-of-memory instead of the
    /// release-and-retry steps, since nothing can make the release safe.
    NoRelease,
}

/// Where a `malloc` stands: finished, or waiting for a device segment.
#[derive(Debug)]
pub enum MallocStep<E, S> {
    /// The malloc finished: the address (0 for a zero-size request) or why not.
    Done(Result<u64, AllocError<E>>),
    /// With [`HostQueue::SyncFirst`]: the malloc is about to give cached memory back; drain the
    /// host's queued work and synchronize the device (without the allocator's lock), then call
    /// [`Allocator::resume_after_sync`].
    NeedSync {
        /// What to resume.
        pending: PendingMalloc<S>,
    },
    /// Allocate `bytes` on the device, then call [`Allocator::resume_malloc`] with the result.
    NeedSegment {
        /// The segment size (torch's `alloc_size`).
        bytes: u64,
        /// What to resume.
        pending: PendingMalloc<S>,
    },
}

impl<D: Device> Allocator<D> {
    /// The miss path from its start: with `multi_stream_lazy_reclaim`, the events the malloc's
    /// start left pending polled and the pool searched again; then GC if enabled, then the first
    /// segment request.
    pub(crate) fn miss(&mut self, mut req: Request<D::Stream>) -> MallocStep<D::Error, D::Stream> {
        if self.conf.multi_stream_lazy_reclaim
            && !self.take_reaped()
            && let Some(done) = self.reap_and_search(&req)
        {
            return MallocStep::Done(done);
        }
        req.alloc_size = crate::size::allocation_size(req.size, &self.conf);
        if self.limits_pending() {
            self.refresh_limits();
        }
        if self.gc_enabled() {
            match self.host_queue {
                HostQueue::None => {}
                HostQueue::SyncFirst if self.gc_due() => {
                    return MallocStep::NeedSync {
                        pending: PendingMalloc {
                            req,
                            stage: Stage::First,
                            after_sync: AfterSync::Gc,
                        },
                    };
                }
                HostQueue::SyncFirst | HostQueue::NoRelease => {
                    return self.request_segment(req, Stage::First);
                }
            }
            if let Err(e) = self.garbage_collect_cached_blocks() {
                return MallocStep::Done(Err(AllocError::Device(e)));
            }
        }
        self.request_segment(req, Stage::First)
    }

    /// Lazy reclaim's step at a miss: poll the events, then search the pool again; the malloc's
    /// end if that found a block (or the poll failed). Out of line: the hit path inlines `miss`'s
    /// caller, and the search and hand-out it would inline here are large.
    #[inline(never)]
    fn reap_and_search(
        &mut self,
        req: &Request<D::Stream>,
    ) -> Option<Result<u64, AllocError<D::Error>>> {
        if let Err(e) = self.process_events() {
            return Some(Err(AllocError::Device(e)));
        }
        let id = self.get_free_block(req)?;
        Some(Ok(self.alloc_found_block(id, req)))
    }

    /// What to do before cached memory is given back from inside a malloc ([`HostQueue`]).
    pub fn set_host_queue(&mut self, host_queue: HostQueue) {
        self.host_queue = host_queue;
    }

    /// The [`HostQueue`] in force.
    pub fn host_queue(&self) -> HostQueue {
        self.host_queue
    }

    /// Continues a malloc stopped at [`MallocStep::NeedSync`]: `synchronized` says whether the
    /// host's queue was drained and the device synchronized. If not, nothing is released and
    /// the malloc runs out of memory.
    pub fn resume_after_sync(
        &mut self,
        pending: PendingMalloc<D::Stream>,
        synchronized: bool,
    ) -> MallocStep<D::Error, D::Stream> {
        let PendingMalloc {
            req,
            stage,
            after_sync,
        } = pending;
        if !synchronized {
            return self.give_up(None, &req);
        }
        // The lock was dropped for the hook: the pool may have been released, or its tag
        // paused, by another thread since the malloc started.
        if let Some(e) = self.set_refusal(req.set) {
            return MallocStep::Done(Err(e));
        }
        match after_sync {
            AfterSync::Gc => {
                if let Err(e) = self.garbage_collect_cached_blocks() {
                    return MallocStep::Done(Err(AllocError::Device(e)));
                }
                self.request_segment(req, Stage::First)
            }
            AfterSync::Release => self.release_and_retry(req, stage),
            AfterSync::Nothing => self.request_segment(req, stage),
        }
    }

    /// Continues a malloc with the device's answer to its segment request.
    ///
    /// A device error other than out-of-memory ends the malloc at once in CUDA's flavour; in
    /// torch_npu's the chain goes on as after out-of-memory, and the error is returned only if
    /// the last attempt failed with it. The cache is left as the chain had it.
    pub fn resume_malloc(
        &mut self,
        pending: PendingMalloc<D::Stream>,
        segment: Result<u64, DeviceError<D::Error>>,
    ) -> MallocStep<D::Error, D::Stream> {
        let req = pending.req;
        match segment {
            // Other mallocs may have grown the reserve while this one waited for the device
            // without the lock; the bound that keeps the stats exact is checked again.
            Ok(addr) if self.total_allocated + req.alloc_size > MAX_RESERVE => {
                match self.device.free(addr, req.alloc_size) {
                    Ok(()) => self.after_failed_segment(req, pending.stage, None),
                    Err(e) => MallocStep::Done(Err(AllocError::Device(e))),
                }
            }
            Ok(addr) => {
                let id = self.add_segment(addr, &req);
                MallocStep::Done(Ok(self.alloc_found_block(id, &req)))
            }
            Err(DeviceError::Other(e)) if self.facts.flavour == Flavour::Cuda => {
                MallocStep::Done(Err(AllocError::Device(e)))
            }
            Err(DeviceError::Other(e)) => self.after_failed_segment(req, pending.stage, Some(e)),
            Err(DeviceError::OutOfMemory) => self.after_failed_segment(req, pending.stage, None),
        }
    }

    /// torch's `alloc_block` up to the device call: count a retry, and refuse without calling
    /// the device past the fraction limit (or past the largest reserve an i64 statistic can
    /// count, which only a simulated device offers; that bound is what lets every current
    /// statistic be updated without overflow checks). A refusal moves down the chain.
    fn request_segment(
        &mut self,
        req: Request<D::Stream>,
        stage: Stage,
    ) -> MallocStep<D::Error, D::Stream> {
        if stage == Stage::Retry {
            self.stats.num_alloc_retries += 1;
        }
        let total = self.total_allocated + req.alloc_size;
        let refused = total > MAX_RESERVE || self.allowed.is_some_and(|allowed| total > allowed);
        if refused {
            return self.after_failed_segment(req, stage, None);
        }
        if self.conf.throw_on_npumalloc_oom {
            match self.reject(&req) {
                Ok(None) => {}
                Ok(Some(r)) => return MallocStep::Done(Err(AllocError::Rejected(Box::new(r)))),
                Err(e) => return MallocStep::Done(Err(AllocError::Device(e))),
            }
        }
        if req.set != 0 && self.is_saver_set(req.set) {
            return self.alloc_saver_segment(req, stage);
        }
        if self.conf.expandable_segments {
            // Pages are mapped in place, under the caller's lock, as in torch_npu.
            match self.try_allocate_expandable_block(&req) {
                Ok(Some(id)) => return MallocStep::Done(Ok(self.alloc_found_block(id, &req))),
                Ok(None) => return self.after_failed_segment(req, stage, None),
                Err(VmmError::Other(e)) => return MallocStep::Done(Err(AllocError::Device(e))),
                Err(VmmError::OutOfMemory) => return self.after_failed_segment(req, stage, None),
                // The device lost its virtual memory after the probe: go on without it.
                Err(VmmError::Unsupported) => {
                    self.conf.expandable_segments = false;
                    self.notice(crate::allocator::Notice::ExpandableSegmentsUnsupported);
                }
            }
        }
        MallocStep::NeedSegment {
            bytes: req.alloc_size,
            pending: PendingMalloc {
                req,
                stage,
                after_sync: AfterSync::Nothing,
            },
        }
    }

    /// torch_npu's `throw_on_npumalloc_oom` check, after the fraction's: the device's total is
    /// asked each time (`aclrtGetMemInfo`), and a segment that would take every segment's bytes
    /// past the configured `per_process_memory_fraction` of it (the configuration's value, not a
    /// fraction set later with `set_per_process_memory_fraction`) is refused, counted and
    /// noticed once. The refusal ends the malloc: no release, no retry, no OOM count or entry.
    #[inline(never)]
    fn reject(&mut self, req: &Request<D::Stream>) -> Result<Option<Rejection>, D::Error> {
        let device_total = self.device.mem_info()?.total;
        let fraction = self.conf.per_process_memory_fraction;
        // torch_npu's `static_cast<size_t>(fraction * double(total))`.
        let limit = (fraction * device_total as f64) as u64;
        if self.total_allocated + req.alloc_size <= limit {
            return Ok(None);
        }
        self.stats.num_oom_rejections += 1;
        let rejection = Rejection {
            device: self.facts.index,
            requested: req.requested,
            alloc_size: req.alloc_size,
            total_allocated: self.total_allocated,
            limit,
            device_total,
        };
        self.notice(Notice::OomRejection(rejection));
        Ok(Some(rejection))
    }

    /// The chain after the `alloc_block` at `stage` got no segment (`error`: the device's error
    /// when it was not out-of-memory): release what torch releases there and ask again, or, after
    /// the last, return out-of-memory (or that last attempt's device error).
    pub(crate) fn after_failed_segment(
        &mut self,
        req: Request<D::Stream>,
        stage: Stage,
        error: Option<D::Error>,
    ) -> MallocStep<D::Error, D::Stream> {
        // torch's `try_mempool_fallback` releases nothing: it comes before the host queue's
        // synchronize.
        if stage == Stage::First
            && self.pools.use_on_oom
            && let Some(addr) = self.use_on_oom_fallback(&req)
        {
            return MallocStep::Done(Ok(addr));
        }
        match (stage, self.host_queue) {
            (Stage::Retry, _) | (_, HostQueue::None) => {}
            (_, HostQueue::SyncFirst) => {
                return MallocStep::NeedSync {
                    pending: PendingMalloc {
                        req,
                        stage,
                        after_sync: AfterSync::Release,
                    },
                };
            }
            (_, HostQueue::NoRelease) => return self.give_up(error, &req),
        }
        if stage == Stage::Retry {
            return self.give_up(error, &req);
        }
        self.release_and_retry(req, stage)
    }

    /// The release step of the retry chain at `stage` (First or AfterRelease), then the next
    /// segment request.
    fn release_and_retry(
        &mut self,
        req: Request<D::Stream>,
        stage: Stage,
    ) -> MallocStep<D::Error, D::Stream> {
        let next = match stage {
            Stage::First => match self.release_available_cached_blocks(&req) {
                Ok(true) => Ok(Stage::AfterRelease),
                Ok(false) => self.release_cached_blocks().map(|()| Stage::Retry),
                Err(e) => Err(e),
            },
            // (The chain ends at Retry before releasing again.)
            Stage::AfterRelease | Stage::Retry => {
                self.release_cached_blocks().map(|()| Stage::Retry)
            }
        };
        match next {
            Ok(stage) => self.request_segment(req, stage),
            Err(e) => MallocStep::Done(Err(AllocError::Device(e))),
        }
    }

    /// Registers a new device segment of `req.alloc_size` bytes at `addr` (the rest of torch's
    /// `alloc_block`) and returns its block.
    pub(crate) fn add_segment(&mut self, addr: u64, req: &Request<D::Stream>) -> BlockId {
        let size = req.alloc_size;
        self.total_allocated += size;
        let id = self
            .blocks
            .insert(Block::segment(addr, size, req.stream, req.pool, req.set));
        self.segments.insert(addr, id);
        self.count_pool_segment(req.set, 1);
        self.stats.segment.increase(req.pool, 1);
        self.stats.reserved_bytes.increase(req.pool, size);
        if self.is_oversize(size) {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.note_held();
        if self.history.is_some() {
            self.record(Action::SegmentAlloc, addr, size, Some(req.stream), req.set);
        }
        id
    }

    /// The end of a chain that found no memory: the device's error if its last call failed
    /// otherwise, else out of memory.
    fn give_up(
        &mut self,
        error: Option<D::Error>,
        req: &Request<D::Stream>,
    ) -> MallocStep<D::Error, D::Stream> {
        MallocStep::Done(Err(match error {
            Some(e) => AllocError::Device(e),
            None => AllocError::OutOfMemory(Box::new(self.out_of_memory(req))),
        }))
    }

    /// Counts the OOM and builds the error with torch_npu's numbers.
    fn out_of_memory(&mut self, req: &Request<D::Stream>) -> OutOfMemory {
        let info = self.device.mem_info().ok();
        self.stats.num_ooms += 1;
        if self.history.is_some() {
            let free = info.map_or(0, |m| m.free);
            self.record(Action::Oom, free, req.size, Some(req.stream), req.set);
        }
        OutOfMemory {
            device: self.facts.index,
            requested: req.requested,
            alloc_size: req.alloc_size,
            total: info.map(|m| m.total).or(self.total_memory),
            free: info.map(|m| m.free),
            allocated: self.stats.allocated_bytes.all_current() as u64,
            active: self.stats.pending_bytes.active(&self.stats.allocated_bytes) as u64,
            reserved: self.stats.reserved_bytes.all_current() as u64,
            allowed: self.allowed,
        }
    }
}
