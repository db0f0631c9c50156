//! One device's caching allocator behind its lock: `alloc-core`'s [`Allocator`] in a
//! [`Mutex`], plus `release_lock_on_npumalloc`.
//!
//! The device itself sits behind a lock of its own ([`Shared`]), which the allocator takes for
//! each device call: that is what lets a malloc run the device's `malloc` with the allocator's
//! lock released. With `release_lock_on_npumalloc:True` a malloc that needs a device segment
//! runs as `alloc-core`'s resumable steps: [`Allocator::begin_malloc`] stops at the device
//! malloc, the runtime unlocks, allocates the segment, relocks and [`Allocator::resume_malloc`]s,
//! for every device malloc of the call, as torch_npu drops its mutex around each `aclrtMalloc`.
//! Other threads use the cache meanwhile. Locks are always taken allocator first, then device.

use alloc_core::{
    AllocConf, Allocator, Device, DeviceError, DeviceFacts, DeviceStats, GcStatus, HostQueue,
    MallocStep, MemInfo, PoolId, SegmentInfo, VmmError,
};
use crossbeam_utils::CachePadded;

use crate::error::RuntimeError;
use crate::sync::{Arc, AtomicU64, Mutex, MutexGuard, Ordering};
use crate::warn_once::warn_once;

/// A device shared by its allocator and the calls made without the allocator's lock; each
/// device call takes the device's lock for its duration. Padded to its own cache lines: the
/// devices are usually opened on one thread, so their heap chunks lie side by side, and each
/// is then written (locked, polled for events) by its own device's thread.
pub(crate) struct Shared<D>(Arc<CachePadded<Mutex<D>>>);

impl<D> Shared<D> {
    pub(crate) fn new(device: D) -> Self {
        Shared(Arc::new(CachePadded::new(Mutex::new(device))))
    }

    /// The device, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, D> {
        self.0.lock()
    }
}

impl<D> Clone for Shared<D> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<D: Device> Device for Shared<D> {
    type Stream = D::Stream;
    type Event = D::Event;
    type Error = D::Error;
    type Page = D::Page;
    type HostBuffer = D::HostBuffer;

    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError<D::Error>> {
        self.lock().malloc(bytes)
    }
    fn free(&mut self, addr: u64, bytes: u64) -> Result<(), D::Error> {
        self.lock().free(addr, bytes)
    }
    fn mem_info(&mut self) -> Result<MemInfo, D::Error> {
        self.lock().mem_info()
    }
    fn record_event(&mut self, stream: D::Stream) -> Result<D::Event, D::Error> {
        self.lock().record_event(stream)
    }
    fn event_done(&mut self, event: &D::Event) -> Result<bool, D::Error> {
        self.lock().event_done(event)
    }
    fn release_event(&mut self, event: D::Event) {
        self.lock().release_event(event);
    }
    fn synchronize(&mut self) -> Result<(), D::Error> {
        self.lock().synchronize()
    }
    fn reserve_address(&mut self, bytes: u64) -> Result<u64, VmmError<D::Error>> {
        self.lock().reserve_address(bytes)
    }
    fn release_address(&mut self, addr: u64, bytes: u64) -> Result<(), VmmError<D::Error>> {
        self.lock().release_address(addr, bytes)
    }
    fn create_page(&mut self, bytes: u64) -> Result<D::Page, VmmError<D::Error>> {
        self.lock().create_page(bytes)
    }
    fn release_page(&mut self, page: D::Page) -> Result<(), (D::Page, VmmError<D::Error>)> {
        self.lock().release_page(page)
    }
    fn map(&mut self, addr: u64, bytes: u64, page: &D::Page) -> Result<(), VmmError<D::Error>> {
        self.lock().map(addr, bytes, page)
    }
    fn unmap(&mut self, addr: u64, bytes: u64) -> Result<(), VmmError<D::Error>> {
        self.lock().unmap(addr, bytes)
    }
    fn alloc_host(&mut self, bytes: u64) -> Result<D::HostBuffer, VmmError<D::Error>> {
        self.lock().alloc_host(bytes)
    }
    fn free_host(
        &mut self,
        buffer: D::HostBuffer,
    ) -> Result<(), (D::HostBuffer, VmmError<D::Error>)> {
        self.lock().free_host(buffer)
    }
    fn copy_to_host(
        &mut self,
        dst: &mut D::HostBuffer,
        src: u64,
        bytes: u64,
    ) -> Result<(), VmmError<D::Error>> {
        self.lock().copy_to_host(dst, src, bytes)
    }
    fn copy_to_device(
        &mut self,
        dst: u64,
        src: &D::HostBuffer,
        bytes: u64,
    ) -> Result<(), VmmError<D::Error>> {
        self.lock().copy_to_device(dst, src, bytes)
    }
}

/// One device's allocator and its lock.
pub(crate) struct DeviceAllocator<D: Device> {
    index: u32,
    /// How many of the runtime's `set_allocator_settings` strings this allocator has applied
    /// (read and written under the runtime's settings lock).
    settings_applied: AtomicU64,
    device: Shared<D>,
    inner: Mutex<Allocator<Shared<D>>>,
    /// The host-queue hooks ([`HostQueue::SyncFirst`]), called without the lock: the
    /// synchronize hook before a malloc releases cached memory, the drain hook before a free
    /// records the events of an allocation used on other streams.
    hooks: Mutex<HostHooks>,
}

/// The hooks of a host queue (torch_npu's task queue), each called with a device index.
#[derive(Clone, Default)]
pub(crate) struct HostHooks {
    /// Drains the host's queued work for the device and synchronizes it (torch_npu's
    /// `npuSynchronizeDevice`); `false` when it could not.
    pub(crate) synchronize: Option<SyncHook>,
    /// Drains the host's queued work for the device without waiting for the device (torch_npu's
    /// `MakeSureQueueEmpty`); `false` when it could not. Without one, the synchronize hook
    /// serves, at the cost of waiting for the device.
    pub(crate) drain: Option<SyncHook>,
}

/// A hook that drains the host's queued work for a device and synchronizes it (torch_npu's
/// `npuSynchronizeDevice`); `false` when it could not.
pub type SyncHook = std::sync::Arc<dyn Fn(u32) -> bool + Send + Sync>;

impl<D: Device> DeviceAllocator<D> {
    /// The device's index.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// The allocator of `device` (device `facts.index`) with the start configuration `conf`,
    /// no run-time settings applied yet; logs each of its notices once.
    pub(crate) fn new(device: Shared<D>, facts: DeviceFacts, conf: &AllocConf) -> Self {
        let allocator = Allocator::new(device.clone(), conf, facts);
        for notice in allocator.notices() {
            warn_once(&notice.to_string());
        }
        DeviceAllocator {
            index: facts.index,
            settings_applied: AtomicU64::new(0),
            device,
            inner: Mutex::new(allocator),
            hooks: Mutex::new(HostHooks::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Allocator<Shared<D>>> {
        self.inner.lock()
    }

    /// `_record_memory_history` on this device: `Some(max_entries)` or off. Entries are
    /// stamped by the runtime's clock, read only when one is recorded.
    pub(crate) fn set_history(&self, max_entries: Option<usize>) {
        let mut allocator = self.lock();
        allocator.record_history(max_entries);
        allocator.set_clock(Some(crate::history::now_us));
    }

    /// Adds this device's segments and history, taken under one lock, to `snapshot`, and
    /// records a `snapshot` entry. As in torch_npu, whose `snapshot()` copies each device's
    /// trace before its segments record that entry, the entry shows in the next snapshot.
    pub(crate) fn add_to(
        &self,
        snapshot: &mut alloc_snapshot::Snapshot,
    ) -> Result<(), alloc_snapshot::ExportError> {
        let mut allocator = self.lock();
        let (history, _) = allocator.history();
        let segments = allocator.snapshot();
        allocator.mark_snapshot();
        snapshot.add_device(self.index, &segments, &history)
    }

    /// The segments and blocks (torch's `memory_snapshot()` of this device), recording nothing.
    pub(crate) fn memory_snapshot(&self) -> Vec<SegmentInfo<D::Stream>> {
        self.lock().snapshot()
    }

    /// `malloc(size, stream)` from private pool `pool` (`None`: the default pools); see the
    /// module doc for `release_lock_on_npumalloc`.
    // Always inlined into the runtime's malloc: under LTO it stayed a call of its own.
    #[inline(always)]
    pub(crate) fn malloc(
        &self,
        size: u64,
        stream: D::Stream,
        pool: Option<PoolId>,
    ) -> Result<u64, RuntimeError<D::Error>> {
        // `release_lock_on_npumalloc` is read under the lock: `set_allocator_settings` may
        // change it.
        let mut allocator = self.lock();
        if allocator.conf().release_lock_on_npumalloc
            || allocator.host_queue() == HostQueue::SyncFirst
        {
            drop(allocator);
            return self.malloc_in_steps(size, stream, pool.unwrap_or_default());
        }
        Ok(match pool {
            None => allocator.malloc(size, stream)?,
            Some(pool) => allocator.malloc_in(size, stream, pool)?,
        })
    }

    /// Runs `f` on the allocator under its lock, logging any notice it raised.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Allocator<Shared<D>>) -> R) -> R {
        let mut allocator = self.lock();
        let before = allocator.notices().len();
        let r = f(&mut allocator);
        for notice in &allocator.notices()[before..] {
            warn_once(&notice.to_string());
        }
        r
    }

    /// `malloc` driven step by step: with `release_lock_on_npumalloc:True` the lock is dropped
    /// around each device malloc; with [`HostQueue::SyncFirst`] it is dropped while the
    /// synchronize hook drains the host's queue before cached memory is released (torch_npu's
    /// `UnlockGuard` around `npuSynchronizeDevice`).
    fn malloc_in_steps(
        &self,
        size: u64,
        stream: D::Stream,
        pool: PoolId,
    ) -> Result<u64, RuntimeError<D::Error>> {
        let mut guard = self.lock();
        let mut step = guard.begin_malloc_in(size, stream, pool);
        loop {
            match step {
                MallocStep::Done(result) => return Ok(result?),
                MallocStep::NeedSegment { bytes, pending } => {
                    let segment = if guard.conf().release_lock_on_npumalloc {
                        drop(guard);
                        let segment = self.device.lock().malloc(bytes);
                        guard = self.lock();
                        segment
                    } else {
                        self.device.lock().malloc(bytes)
                    };
                    step = guard.resume_malloc(pending, segment);
                }
                MallocStep::NeedSync { pending } => {
                    drop(guard);
                    let hook = self.hooks.lock().synchronize.clone();
                    let synchronized = hook.is_some_and(|h| h(self.index));
                    if !synchronized {
                        self.warn_unsynchronized();
                    }
                    guard = self.lock();
                    step = guard.resume_after_sync(pending, synchronized);
                }
            }
        }
    }

    /// Once: a malloc ran out of memory while cached memory stayed, because no synchronize hook
    /// (or a failing one) could drain the host's queued work before it was given back.
    #[cold]
    pub(crate) fn warn_unsynchronized(&self) {
        warn_once(&format!(
            "NPU {}: out of memory with cached memory that could not be given back safely: no \
             synchronize hook drained the host's queued work",
            self.index
        ));
    }

    /// What a malloc does before it releases cached memory (and a free before it records
    /// events), and the hooks they call.
    pub(crate) fn set_host_queue(&self, host_queue: HostQueue, hooks: HostHooks) {
        *self.hooks.lock() = hooks;
        self.lock().set_host_queue(host_queue);
    }

    /// `free(addr)`. Under [`HostQueue::SyncFirst`] the free of an allocation used on other
    /// streams is [`FreeError::DrainFirst`]: the runtime then calls
    /// [`DeviceAllocator::free_after_drain`] (kept out of this function, which the runtime's
    /// free inlines with the allocator's).
    #[inline]
    pub(crate) fn free(&self, addr: u64) -> Result<(), RuntimeError<D::Error>> {
        Ok(self.lock().free(addr)?)
    }

    /// The free of an allocation used on other streams, under [`HostQueue::SyncFirst`]: the
    /// drain hook (else the synchronize hook, which drains too) runs without the lock, then the
    /// free records its events behind the work the host had queued.
    pub(crate) fn free_after_drain(&self, addr: u64) -> Result<(), RuntimeError<D::Error>> {
        let hook = {
            let hooks = self.hooks.lock();
            hooks.drain.clone().or_else(|| hooks.synchronize.clone())
        };
        if !hook.is_some_and(|h| h(self.index)) {
            // The events are recorded all the same: refusing the free would leak the block.
            warn_once(&format!(
                "NPU {}: a block used on other streams was freed without draining the host's \
                 queued work first (no drain or synchronize hook, or it failed); work still \
                 queued may use it after it is reused",
                self.index
            ));
        }
        Ok(self.lock().free_after_drain(addr)?)
    }

    /// `record_stream(addr, stream)`.
    pub(crate) fn record_stream(
        &self,
        addr: u64,
        stream: D::Stream,
    ) -> Result<(), RuntimeError<D::Error>> {
        Ok(self.lock().record_stream(addr, stream)?)
    }

    /// `erase_stream(ptr, stream)`.
    pub(crate) fn erase_stream(
        &self,
        addr: u64,
        stream: D::Stream,
    ) -> Result<(), RuntimeError<D::Error>> {
        Ok(self.lock().erase_stream(addr, stream)?)
    }

    /// `empty_cache()`.
    pub(crate) fn empty_cache(&self) -> Result<(), RuntimeError<D::Error>> {
        self.lock().empty_cache().map_err(RuntimeError::Device)
    }

    /// `empty_virt_addr_cache()`.
    pub(crate) fn empty_virt_addr_cache(&self) -> Result<(), RuntimeError<D::Error>> {
        self.lock()
            .empty_virt_addr_cache()
            .map_err(RuntimeError::Device)
    }

    /// Polls the event queues (blocks whose events completed return to their pools).
    pub(crate) fn process_events(&self) -> Result<(), RuntimeError<D::Error>> {
        self.lock().process_events().map_err(RuntimeError::Device)
    }

    /// A copy of the stats.
    pub(crate) fn stats(&self) -> DeviceStats {
        self.lock().stats()
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
    pub(crate) fn set_fraction(&self, fraction: f64) -> Result<(), RuntimeError<D::Error>> {
        Ok(self.lock().set_memory_fraction(fraction)?)
    }

    /// `get_per_process_memory_fraction`.
    pub(crate) fn fraction(&self) -> f64 {
        self.lock().memory_fraction()
    }

    /// Whether and how GC runs.
    pub(crate) fn gc_status(&self) -> GcStatus {
        self.lock().gc_status()
    }

    /// What the expandable segments hold, for `memory_summary`.
    pub(crate) fn expandable_summary(&self) -> crate::summary::ExpandableSummary {
        let allocator = self.lock();
        let ranges = allocator.expandable_segments();
        let mapped = allocator.snapshot().into_iter().filter(|s| s.is_expandable);
        let (mapped_ranges, mapped_bytes) =
            mapped.fold((0, 0), |(n, b), s| (n + 1, b + s.total_size));
        crate::summary::ExpandableSummary {
            mapped_ranges,
            mapped_bytes,
            reserved_ranges: ranges.len(),
            reserved_bytes: ranges.iter().map(|r| r.reserved_size).sum(),
        }
    }

    /// The configuration in force.
    pub(crate) fn conf(&self) -> AllocConf {
        self.lock().conf().clone()
    }

    /// Applies `settings[applied..]`, the run-time settings strings this allocator has not seen,
    /// each read on top of its own configuration (so its own fraction stays unless a string sets
    /// one); logs any new notice once. The caller holds the runtime's settings lock.
    pub(crate) fn catch_up(&self, settings: &[String]) {
        let applied = self.settings_applied.load(Ordering::Relaxed) as usize;
        if applied >= settings.len() {
            return;
        }
        let mut allocator = self.lock();
        for text in &settings[applied..] {
            let parsed = alloc_conf::parse_settings(allocator.conf(), text);
            allocator.set_conf(&parsed.conf);
        }
        for notice in allocator.notices() {
            warn_once(&notice.to_string());
        }
        self.settings_applied
            .store(settings.len() as u64, Ordering::Relaxed);
    }
}

impl<D: Device> Drop for DeviceAllocator<D> {
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
