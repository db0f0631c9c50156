//! One device's caching allocator behind its lock: `alloc-core`'s [`Allocator`] in a
//! [`Mutex`], plus `release_lock_on_npumalloc`.
//!
//! With `release_lock_on_npumalloc:True` a malloc that needs a device segment runs as
//! `alloc-core`'s resumable steps: [`Allocator::begin_malloc`] stops at the device malloc, the
//! runtime unlocks, allocates the segment with [`Backend::raw_malloc`], relocks and
//! [`Allocator::resume_malloc`]s, for every device malloc of the call, as torch_npu drops its
//! mutex around each `aclrtMalloc`. Other threads use the cache meanwhile.

use alloc_core::{
    AllocConf, AllocError, Allocator, DeviceFacts, DeviceStats, FreeError, GcStatus, MallocStep,
    SegmentInfo, StreamId,
};

use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::sync::{Arc, Mutex, MutexGuard};
use crate::warn_once::warn_once;

fn alloc_error<E>(e: AllocError<E>) -> RuntimeError<E> {
    match e {
        AllocError::OutOfMemory(oom) => RuntimeError::OutOfMemory(oom),
        AllocError::TooLarge { size } => RuntimeError::TooLarge { size },
        AllocError::Device(e) => RuntimeError::Device(e),
    }
}

fn free_error<E>(e: FreeError<E>) -> RuntimeError<E> {
    match e {
        FreeError::ForeignPointer { addr } => RuntimeError::InvalidPointer { addr },
        FreeError::NotAllocated { addr } => RuntimeError::NotAllocated { addr },
        FreeError::Device(e) => RuntimeError::Device(e),
    }
}

/// One device's allocator and its lock.
pub(crate) struct DeviceAllocator<B: Backend> {
    index: u32,
    backend: Arc<B>,
    release_lock: bool,
    inner: Mutex<Allocator<B::Device>>,
}

impl<B: Backend> DeviceAllocator<B> {
    /// Opens device `index` and builds its allocator; logs each of its notices once.
    pub(crate) fn new(
        backend: Arc<B>,
        index: u32,
        conf: &AllocConf,
    ) -> Result<Self, RuntimeError<B::Error>> {
        let device = backend.open(index).map_err(RuntimeError::Device)?;
        let facts = DeviceFacts {
            pad: backend.pad(),
            ..DeviceFacts::npu(index)
        };
        let allocator = Allocator::new(device, conf, facts);
        for notice in allocator.notices() {
            warn_once(&notice.to_string());
        }
        Ok(DeviceAllocator {
            index,
            release_lock: conf.release_lock_on_npumalloc,
            backend,
            inner: Mutex::new(allocator),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Allocator<B::Device>> {
        self.inner.lock()
    }

    /// `malloc(size, stream)`; see the module doc for `release_lock_on_npumalloc`.
    #[inline]
    pub(crate) fn malloc(
        &self,
        size: u64,
        stream: StreamId,
    ) -> Result<u64, RuntimeError<B::Error>> {
        if self.release_lock {
            return self.malloc_releasing_lock(size, stream);
        }
        self.lock().malloc(size, stream).map_err(alloc_error)
    }

    /// `malloc` with `release_lock_on_npumalloc:True`: the lock is dropped around each device
    /// malloc.
    fn malloc_releasing_lock(
        &self,
        size: u64,
        stream: StreamId,
    ) -> Result<u64, RuntimeError<B::Error>> {
        let mut guard = self.lock();
        let mut step = guard.begin_malloc(size, stream);
        loop {
            match step {
                MallocStep::Done(result) => return result.map_err(alloc_error),
                MallocStep::NeedSegment { bytes, pending } => {
                    drop(guard);
                    let segment = self.backend.raw_malloc(self.index, bytes);
                    guard = self.lock();
                    step = guard.resume_malloc(pending, segment);
                }
            }
        }
    }

    /// `free(addr)`.
    #[inline]
    pub(crate) fn free(&self, addr: u64) -> Result<(), RuntimeError<B::Error>> {
        self.lock().free(addr).map_err(free_error)
    }

    /// `record_stream(addr, stream)`.
    pub(crate) fn record_stream(
        &self,
        addr: u64,
        stream: StreamId,
    ) -> Result<(), RuntimeError<B::Error>> {
        self.lock().record_stream(addr, stream).map_err(free_error)
    }

    /// `empty_cache()`.
    pub(crate) fn empty_cache(&self) -> Result<(), RuntimeError<B::Error>> {
        self.lock().empty_cache().map_err(RuntimeError::Device)
    }

    /// Polls the event queues (blocks whose events completed return to their pools).
    pub(crate) fn process_events(&self) -> Result<(), RuntimeError<B::Error>> {
        self.lock().process_events().map_err(RuntimeError::Device)
    }

    /// A copy of the stats.
    pub(crate) fn stats(&self) -> DeviceStats {
        self.lock().stats().clone()
    }

    /// `reset_peak_memory_stats`.
    pub(crate) fn reset_peak(&self) {
        self.lock().reset_peak_stats();
    }

    /// `reset_accumulated_memory_stats`.
    pub(crate) fn reset_accumulated(&self) {
        self.lock().reset_accumulated_stats();
    }

    /// `set_per_process_memory_fraction`.
    pub(crate) fn set_fraction(&self, fraction: f64) -> Result<(), RuntimeError<B::Error>> {
        self.lock()
            .set_memory_fraction(fraction)
            .map_err(RuntimeError::Fraction)
    }

    /// `get_per_process_memory_fraction`.
    pub(crate) fn fraction(&self) -> f64 {
        self.lock().memory_fraction()
    }

    /// The segments and blocks, torch's `memory_snapshot()`.
    pub(crate) fn snapshot(&self) -> Vec<SegmentInfo> {
        self.lock().snapshot()
    }

    /// Whether and how GC runs.
    pub(crate) fn gc_status(&self) -> GcStatus {
        self.lock().gc_status()
    }
}

impl<B: Backend> Drop for DeviceAllocator<B> {
    fn drop(&mut self) {
        let mut guard = self.lock();
        let live = guard.stats().allocation.all.current;
        if live > 0 {
            log::warn!(
                "NPU {}: allocator dropped with {live} live allocation(s) ({} bytes); their segments are leaked",
                self.index,
                guard.stats().allocated_bytes.all.current
            );
        }
        if let Err(e) = guard.empty_cache() {
            log::warn!(
                "NPU {}: releasing the cache on drop failed: {e}",
                self.index
            );
        }
    }
}
