//! One device's caching allocator behind its lock: `alloc-core`'s [`Allocator`] in a
//! [`Mutex`], plus `release_lock_on_npumalloc`.
//!
//! `alloc-core` calls the device from inside `Allocator::malloc`, so the lock cannot be dropped
//! around that call. With `release_lock_on_npumalloc:True` the device is wrapped in
//! [`Deferring`]: the first device malloc of a `malloc` is refused with
//! [`DeferError::Deferred`] (a non-OOM error, so `alloc-core` returns at once, its cache
//! untouched), the runtime unlocks, allocates the segment with [`Backend::raw_malloc`],
//! relocks, and runs `malloc` again with that result waiting in the wrapper. The second run
//! takes it at its first device malloc, or finds a block another thread freed meanwhile, in
//! which case the unused segment goes straight back to the device. Later device mallocs of
//! the same call (after the cache is freed) run under the lock.

use alloc_core::{
    AllocConf, AllocError, Allocator, Device, DeviceError, DeviceFacts, DeviceStats, FreeError,
    GcStatus, MemInfo, SegmentInfo, StreamId,
};

use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::sync::{Arc, Mutex, MutexGuard};
use crate::warn_once::warn_once;

/// The device error seen by `alloc-core` when the lock may be released around device mallocs.
#[derive(Debug)]
pub(crate) enum DeferError<E> {
    /// The device's own error.
    Device(E),
    /// The runtime will allocate `bytes` without the lock and retry.
    Deferred {
        /// The segment size `alloc-core` asked for.
        bytes: u64,
    },
}

impl<E: core::fmt::Display> core::fmt::Display for DeferError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DeferError::Device(e) => e.fmt(f),
            DeferError::Deferred { bytes } => {
                write!(
                    f,
                    "device malloc of {bytes} bytes deferred until the lock is released"
                )
            }
        }
    }
}

/// A device malloc made without the lock: (bytes, result).
type Prefetched<E> = (u64, Result<u64, DeviceError<E>>);

/// A device whose next malloc can be deferred, or served from a segment allocated outside
/// the lock.
pub(crate) struct Deferring<D: Device> {
    inner: D,
    /// Refuse the next device malloc with [`DeferError::Deferred`].
    defer_next: bool,
    /// A device malloc made without the lock, for the next run of `malloc`.
    prefetched: Option<Prefetched<D::Error>>,
}

impl<D: Device> Device for Deferring<D> {
    type Event = D::Event;
    type Error = DeferError<D::Error>;

    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError<Self::Error>> {
        if self.prefetched.as_ref().is_some_and(|(b, _)| *b == bytes) {
            if let Some((_, result)) = self.prefetched.take() {
                return result.map_err(|e| match e {
                    DeviceError::OutOfMemory => DeviceError::OutOfMemory,
                    DeviceError::Other(e) => DeviceError::Other(DeferError::Device(e)),
                });
            }
        }
        if self.defer_next {
            self.defer_next = false;
            return Err(DeviceError::Other(DeferError::Deferred { bytes }));
        }
        self.inner.malloc(bytes).map_err(|e| match e {
            DeviceError::OutOfMemory => DeviceError::OutOfMemory,
            DeviceError::Other(e) => DeviceError::Other(DeferError::Device(e)),
        })
    }

    fn free(&mut self, addr: u64, bytes: u64) -> Result<(), Self::Error> {
        self.inner.free(addr, bytes).map_err(DeferError::Device)
    }

    fn mem_info(&mut self) -> Option<MemInfo> {
        self.inner.mem_info()
    }

    fn record_event(&mut self, stream: StreamId) -> Result<Self::Event, Self::Error> {
        self.inner.record_event(stream).map_err(DeferError::Device)
    }

    fn event_done(&mut self, event: &Self::Event) -> Result<bool, Self::Error> {
        self.inner.event_done(event).map_err(DeferError::Device)
    }

    fn release_event(&mut self, event: Self::Event) {
        self.inner.release_event(event);
    }

    fn synchronize(&mut self) -> Result<(), Self::Error> {
        self.inner.synchronize().map_err(DeferError::Device)
    }
}

/// A device error that cannot be a deferral (only `malloc` defers, and handles it).
fn device_error<E>(e: DeferError<E>) -> RuntimeError<E> {
    match e {
        DeferError::Device(e) => RuntimeError::Device(e),
        DeferError::Deferred { .. } => unreachable!("only malloc defers, and it retries"),
    }
}

fn alloc_error<E>(e: AllocError<DeferError<E>>) -> RuntimeError<E> {
    match e {
        AllocError::OutOfMemory(oom) => RuntimeError::OutOfMemory(oom),
        AllocError::TooLarge { size } => RuntimeError::TooLarge { size },
        AllocError::Device(e) => device_error(e),
    }
}

fn free_error<E>(e: FreeError<DeferError<E>>) -> RuntimeError<E> {
    match e {
        FreeError::ForeignPointer { addr } => RuntimeError::InvalidPointer { addr },
        FreeError::NotAllocated { addr } => RuntimeError::NotAllocated { addr },
        FreeError::Device(e) => device_error(e),
    }
}

/// One device's allocator and its lock.
pub(crate) struct DeviceAllocator<B: Backend> {
    index: u32,
    backend: Arc<B>,
    release_lock: bool,
    inner: Mutex<Allocator<Deferring<B::Device>>>,
}

impl<B: Backend> DeviceAllocator<B> {
    /// Opens device `index` and builds its allocator; logs each of its notices once.
    pub(crate) fn new(
        backend: Arc<B>,
        index: u32,
        conf: &AllocConf,
    ) -> Result<Self, RuntimeError<B::Error>> {
        let device = Deferring {
            inner: backend.open(index).map_err(RuntimeError::Device)?,
            defer_next: false,
            prefetched: None,
        };
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

    fn lock(&self) -> MutexGuard<'_, Allocator<Deferring<B::Device>>> {
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
        // Nothing is ever deferred or prefetched: the device is called under the lock.
        self.lock().malloc(size, stream).map_err(alloc_error)
    }

    /// `malloc` with `release_lock_on_npumalloc:True`.
    fn malloc_releasing_lock(
        &self,
        size: u64,
        stream: StreamId,
    ) -> Result<u64, RuntimeError<B::Error>> {
        let mut defer = true;
        let mut guard = self.lock();
        let result = loop {
            guard.device_mut().defer_next = defer;
            defer = false;
            let result = guard.malloc(size, stream);
            guard.device_mut().defer_next = false;
            match result {
                Err(AllocError::Device(DeferError::Deferred { bytes })) => {
                    drop(guard);
                    let segment = self.backend.raw_malloc(self.index, bytes);
                    guard = self.lock();
                    guard.device_mut().prefetched = Some((bytes, segment));
                }
                other => break other,
            }
        };
        let unused = guard.device_mut().prefetched.take();
        drop(guard);
        if let Some((bytes, Ok(addr))) = unused {
            // Never known to the allocator and never used: no synchronization needed.
            if let Err(e) = self.backend.raw_free(self.index, addr, bytes) {
                log::warn!("NPU {}: freeing an unused segment failed: {e}", self.index);
            }
        }
        result.map_err(alloc_error)
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
        self.lock().empty_cache().map_err(device_error)
    }

    /// Polls the event queues (blocks whose events completed return to their pools).
    pub(crate) fn process_events(&self) -> Result<(), RuntimeError<B::Error>> {
        self.lock().process_events().map_err(device_error)
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
