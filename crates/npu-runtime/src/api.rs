//! The torch-named API: one [`Runtime`] holds an allocator per device (created on first use)
//! and the OOM observers.
//!
//! Locks: each device's allocator has its own lock (`device_allocator`); the device table and
//! the observer list each have a short one, never held across a device call except the device
//! table while a device is first opened. There is no process-wide pointer map: `free` finds a
//! pointer's device by the address spans of `route`. OOM observers run with no lock held, so
//! they may allocate or free.

use acl_sys::AclError;
use alloc_core::{
    AllocError, Device, DeviceFacts, DeviceStats, FreeError, GcStatus, OutOfMemory, Rejection,
    SegmentInfo,
};
use crossbeam_utils::CachePadded;

use crate::acl_device::AclDevice;
use crate::config::Config;
use crate::device_allocator::{DeviceAllocator, Shared};
use crate::error::RuntimeError;
use crate::no_caching::Uncached;
use crate::route::Span;
use crate::summary;
use crate::sync::{Arc, AtomicU64, Mutex, OnceSlot};

/// The runtime over ACL: what a program uses.
pub type NpuAllocator = Runtime<AclDevice>;

/// Opens device `index`: the device as the policy drives it, and the facts the policy needs
/// about it (its index, the pad, the flavour).
pub type Opener<D> = dyn Fn(u32) -> core::result::Result<(D, DeviceFacts), <D as Device>::Error>
    + Send
    + Sync
    + 'static;

/// A function told about each out-of-memory error, after the allocator's lock is released
/// (torch's `attachOutOfMemoryObserver`).
pub type OomObserver = dyn Fn(&OutOfMemory) + Send + Sync;

/// A function told about each malloc refused by `throw_on_npumalloc_oom`, on a thread of its
/// own (torch_npu's `attachOomRejectionObserver`, whose observers run on a detached thread).
pub type RejectionObserver = dyn Fn(&Rejection) + Send + Sync;

/// Result of the runtime's calls.
pub type Result<T, E = AclError> = core::result::Result<T, RuntimeError<E>>;

/// One device: a caching allocator, or none (`PYTORCH_NO_NPU_MEMORY_CACHING=1`).
// Built once per device and kept in its slot for the runtime's life: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Entry<D: Device> {
    Caching(DeviceAllocator<D>),
    Uncached(Uncached<D>),
}

/// Whether `answer` is a device's "not mine": a pointer it never returned.
fn foreign<E>(answer: &Result<(), E>) -> bool {
    matches!(
        answer,
        Err(RuntimeError::Free(FreeError::ForeignPointer { .. }))
    )
}

/// The first answer of `op` over `entries` other than "not mine".
fn first_answer<'a, D: Device + 'a>(
    entries: impl Iterator<Item = &'a Entry<D>>,
    op: &impl Fn(&Entry<D>) -> Result<(), D::Error>,
) -> Option<Result<(), D::Error>> {
    entries.map(op).find(|answer| !foreign(answer))
}

/// One device's slot in the runtime: its allocator once opened, and the addresses it returned.
struct Slot<D: Device> {
    /// Filled on first use and read without a lock afterwards.
    entry: OnceSlot<(Shared<D>, Entry<D>)>,
    /// Where its allocations lie, so `free` can find it. Every `free` reads its own device's
    /// span and those of the devices before it, so the span sits alone on its cache lines:
    /// beside the next device's slot, which that device's thread writes on every call, each
    /// free missed on it (docs/performance.md has the figures).
    span: CachePadded<Span>,
}

impl<D: Device> Runtime<D> {
    /// Number of devices (fixed when the runtime was built).
    pub fn device_count(&self) -> u32 {
        self.devices.len() as u32
    }

    /// Device `device`'s slot, or why the index is wrong.
    fn slot(&self, device: u32) -> Result<&Slot<D>, D::Error> {
        // `ok_or_else`: an error built eagerly is dropped on every success, through a call.
        self.devices
            .get(device as usize)
            .ok_or_else(|| RuntimeError::InvalidDevice {
                device,
                count: self.device_count(),
            })
    }

    /// Device `device`'s allocator if it was opened.
    pub(crate) fn opened(&self, device: u32) -> Result<Option<&Entry<D>>, D::Error> {
        Ok(self.slot(device)?.entry.get().map(|(_, e)| e))
    }

    /// The indexes of the devices opened so far (each on its first use).
    pub fn opened_devices(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.device_count()).filter(|&d| self.devices[d as usize].entry.get().is_some())
    }

    /// Every opened device.
    pub(crate) fn opened_all(&self) -> impl Iterator<Item = &Entry<D>> {
        self.devices
            .iter()
            .filter_map(|slot| slot.entry.get().map(|(_, e)| e))
    }
}

/// The caching allocator of every device of one kind (`D`), with torch's API.
pub struct Runtime<D: Device> {
    open: Box<Opener<D>>,
    config: Config,
    /// The run-time settings so far: the configuration they give, and every
    /// `set_allocator_settings` string in order (each device applies the ones it has not seen,
    /// under this lock, so none is missed by a device that opens meanwhile).
    pub(crate) settings: Mutex<(alloc_conf::AllocConf, Vec<String>)>,
    devices: Vec<Slot<D>>,
    observers: Mutex<Vec<Arc<Box<OomObserver>>>>,
    /// std's `Arc`, not the loom shim's: the observers go to a thread of their own.
    rejection_observers: Mutex<Vec<std::sync::Arc<RejectionObserver>>>,
    /// The history every device records (`record_memory_history`): its ring size, or `None`.
    pub(crate) history: Mutex<Option<usize>>,
    /// The host-queue mode and hooks every device uses (`set_host_queue`, `set_drain_hook`).
    pub(crate) host: Mutex<(alloc_core::HostQueue, crate::device_allocator::HostHooks)>,
    /// Tells this runtime's scopes apart in the thread-local scope stack (`scope`).
    pub(crate) id: u64,
    /// Scopes of this runtime open on any thread: while there are none, a malloc skips the
    /// thread-local lookup. Shared with each thread's scope stack, which takes its scopes out
    /// when its thread ends.
    pub(crate) open_scopes: Arc<AtomicU64>,
    /// The next private pool number, for every device: a pool id names one pool in the process,
    /// as torch's `MemPool` ids do.
    // std's, not the loom shim's: the allocators share it as plain data (a relaxed counter).
    pool_ids: std::sync::Arc<core::sync::atomic::AtomicU64>,
    /// torch_memory_saver's `retain_cpu_backup`, given to each device's resume.
    // std's, not the loom shim's: a setting read once per resume, with no order to keep.
    pub(crate) retain_cpu_backup: core::sync::atomic::AtomicBool,
    /// torch_memory_saver's `memory_margin_bytes`, every device's (set and read under
    /// `settings`, so a device opening meanwhile gets it).
    pub(crate) saver_margin: core::sync::atomic::AtomicU64,
}

impl<D> Runtime<D>
where
    D: Device<Stream: Send + Sync, Event: Send, Error: Send> + Send + 'static,
{
    /// A runtime over `count` devices, each opened by `open` on first use, with `config`.
    pub fn new(
        count: u32,
        open: impl Fn(u32) -> core::result::Result<(D, DeviceFacts), D::Error> + Send + Sync + 'static,
        config: Config,
    ) -> Self {
        Runtime {
            open: Box::new(open),
            settings: Mutex::new((config.alloc.clone(), Vec::new())),
            config,
            devices: (0..count)
                .map(|_| Slot {
                    entry: OnceSlot::new(),
                    span: CachePadded::new(Span::new()),
                })
                .collect(),
            observers: Mutex::new(Vec::new()),
            rejection_observers: Mutex::new(Vec::new()),
            history: Mutex::new(None),
            host: Mutex::new((alloc_core::HostQueue::None, Default::default())),
            id: crate::scope::next_runtime_id(),
            open_scopes: Arc::new(AtomicU64::new(0)),
            pool_ids: std::sync::Arc::new(core::sync::atomic::AtomicU64::new(1)),
            retain_cpu_backup: core::sync::atomic::AtomicBool::new(false),
            saver_margin: core::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Device `device` and its allocator, opened on first use.
    fn opened_or_open(&self, device: u32) -> Result<&(Shared<D>, Entry<D>), D::Error> {
        self.open_slot(self.slot(device)?, device)
    }

    /// [`Runtime::opened_or_open`] on the slot of `device`, already found.
    #[inline]
    fn open_slot<'a>(
        &'a self,
        slot: &'a Slot<D>,
        device: u32,
    ) -> Result<&'a (Shared<D>, Entry<D>), D::Error> {
        match slot.entry.get() {
            Some(opened) => Ok(opened),
            None => self.open_device(slot, device),
        }
    }

    /// Opens device `device` in its slot (or waits for the thread opening it).
    #[cold]
    #[inline(never)]
    fn open_device<'a>(
        &'a self,
        slot: &'a Slot<D>,
        device: u32,
    ) -> Result<&'a (Shared<D>, Entry<D>), D::Error> {
        // The run-time state is locked across the opening and its publication, in the order
        // the calls that change it take these locks: a `set_allocator_settings`,
        // `record_memory_history` or `set_host_queue` either comes first, and the device is
        // built with its effect, or finds the device opened. A device another thread can use is
        // caught up already.
        let settings = self.settings.lock();
        let history = self.history.lock();
        let host = self.host.lock();
        let opened: &(Shared<D>, Entry<D>) = slot.entry.get_or_try_init(|| {
            let (dev, facts) = (self.open)(device).map_err(RuntimeError::Device)?;
            let dev = Shared::new(dev);
            let entry = if self.config.caching {
                // Built as torch_npu builds every device's allocator at start-up, from the start
                // configuration (its memory fraction and `max_split_size` stat come from there),
                // then given the run-time settings so far.
                let a = DeviceAllocator::new(dev.clone(), facts, &self.config.alloc);
                a.with(|a| a.share_pool_ids(self.pool_ids.clone()));
                a.catch_up(&settings.1);
                let margin = self
                    .saver_margin
                    .load(core::sync::atomic::Ordering::Relaxed);
                if margin > 0 {
                    a.with(|a| a.set_saver_memory_margin(margin));
                }
                if history.is_some() {
                    a.set_history(*history);
                }
                Entry::Caching(a)
            } else {
                Entry::Uncached(Uncached::new(dev.clone(), facts.index, facts.pad))
            };
            entry.set_host(&host);
            Ok::<_, RuntimeError<D::Error>>((dev, entry))
        })?;
        Ok(opened)
    }

    /// torch's `torch.npu.memory._set_allocator_settings(settings)`: changes
    /// `expandable_segments`, `max_split_size_mb`, `max_non_split_rounding_mb`,
    /// `release_lock_on_npumalloc` or `throw_on_npumalloc_oom` while the allocator runs
    /// (`per_process_memory_fraction` is read but, as in torch_npu, changes no device's limit,
    /// which `set_per_process_memory_fraction` does: only the rejection bound of
    /// `throw_on_npumalloc_oom`),
    /// on every device (read on top of each device's configuration, and of the runtime's for
    /// devices opened later). As in torch_npu, `max_split_size_mb`, `roundup_power2_divisions`
    /// and `garbage_collection_threshold` go back to their defaults unless the string sets them
    /// (`alloc_conf::parse_settings`); a string naming another key (but for torch_npu's two
    /// pinned run-time keys, unsupported here) changes nothing, with a
    /// `not_at_run_time` warning, as torch_npu raises before it applies any key. Later
    /// allocations follow the new settings; blocks of
    /// expandable segments stay, and best fit passes over them while expandable segments are
    /// off. Turning them on probes each device again; a device without virtual memory logs a
    /// warning once and stays without. Returns the warnings about the string (also logged once).
    pub fn set_allocator_settings(&self, settings: &str) -> Vec<alloc_conf::Warning> {
        let mut state = self.settings.lock();
        let parsed = alloc_conf::parse_settings(&state.0, settings);
        for w in &parsed.warnings {
            crate::warn_once::warn_once(&format!("set_allocator_settings: {w}"));
        }
        state.0 = parsed.conf;
        state.1.push(settings.to_owned());
        for entry in self.opened_all() {
            if let Entry::Caching(a) = entry {
                a.catch_up(&state.1);
            }
        }
        parsed.warnings
    }

    /// The allocator configuration in force on `device` (the runtime's, for a device not used
    /// yet): the start configuration with every `set_allocator_settings` applied, and
    /// `expandable_segments` off where the device has no virtual memory.
    pub fn allocator_settings(&self, device: u32) -> Result<alloc_conf::AllocConf, D::Error> {
        Ok(match self.opened(device)? {
            Some(Entry::Caching(a)) => a.conf(),
            _ => self.settings.lock().0.clone(),
        })
    }

    /// Device `device`'s allocator, opened on first use.
    pub(crate) fn entry(&self, device: u32) -> Result<&Entry<D>, D::Error> {
        Ok(&self.opened_or_open(device)?.1)
    }

    /// Runs `f` on device `device` (opened on first use) under its lock: the embedder's own
    /// calls on the device (tests complete simulated events this way). `f` must not call the
    /// runtime: a malloc or free that needs the same device would wait for this lock forever.
    pub fn with_device<R>(&self, device: u32, f: impl FnOnce(&mut D) -> R) -> Result<R, D::Error> {
        let (dev, _) = self.opened_or_open(device)?;
        Ok(f(&mut dev.lock()))
    }

    /// `malloc(size, device, stream)`: `size` bytes on `device` for use on `stream`; 0 for a
    /// zero-size request. Out of memory calls the observers, then returns the error.
    // Always inlined, as is `free`: as calls of their own, their prologues, epilogues and the
    // caller's spills were 17 of the runtime's instructions a pair. Few places call them.
    #[inline(always)]
    pub fn malloc(&self, size: u64, device: u32, stream: D::Stream) -> Result<u64, D::Error> {
        // The slot is found once: its span is noted below.
        let slot = self.slot(device)?;
        let (_, entry) = self.open_slot(slot, device)?;
        let result = match entry {
            Entry::Caching(a) => a.malloc(size, stream, self.routed_pool(device)),
            Entry::Uncached(u) => u.malloc(size),
        };
        // The error moves whole into a function of its own: matching the out-of-memory report
        // out of it here left a partly moved result whose drop ran on every malloc.
        let addr = result.map_err(|e| self.malloc_failed(e))?;
        if addr != 0 {
            slot.span.note(addr);
        }
        Ok(addr)
    }

    /// A failed malloc: out of memory calls the observers first. torch_npu builds its message
    /// after the observers ran, from the stats then (an observer may free or empty the cache),
    /// so the error's allocated, active and reserved bytes are read again after them.
    #[cold]
    fn malloc_failed(&self, mut e: RuntimeError<D::Error>) -> RuntimeError<D::Error> {
        // Without a synchronize hook a malloc gives no cached memory back (cached blocks, or
        // pages `empty_virt_addr_cache` kept): say so, once.
        if let RuntimeError::Alloc(AllocError::OutOfMemory(oom)) = &e
            && let Ok(Entry::Caching(a)) = self.entry(oom.device)
            && a.with(|x| {
                x.host_queue() == alloc_core::HostQueue::NoRelease
                    && (oom.reserved > oom.active || x.held().cached_pages > 0)
            })
        {
            a.warn_unsynchronized();
        }
        if let RuntimeError::Alloc(AllocError::Rejected(r)) = &e {
            self.notify_rejection_observers(r);
        }
        if let RuntimeError::Alloc(AllocError::OutOfMemory(oom)) = &mut e
            && self.notify_observers(oom)
            && let Ok(stats) = self.device_stats(oom.device)
        {
            let bytes = |v: i64| u64::try_from(v).unwrap_or(0);
            oom.allocated = bytes(stats.allocated_bytes.all.current);
            oom.active = bytes(stats.active_bytes.all.current);
            oom.reserved = bytes(stats.reserved_bytes.all.current);
        }
        e
    }

    /// `free(addr)`: returns an allocation (0 is a no-op). An address no device knows is
    /// [`FreeError::ForeignPointer`], one inside a segment that is not a live allocation
    /// [`FreeError::NotAllocated`]; on any error the allocation stays live. With
    /// [`alloc_core::HostQueue::SyncFirst`], an allocation used on other streams is
    /// [`FreeError::DrainFirst`]: finish it with [`Runtime::free_after_drain`].
    #[inline(always)]
    pub fn free(&self, addr: u64) -> Result<(), D::Error> {
        if addr == 0 {
            return Ok(());
        }
        self.route(addr, |entry| match entry {
            Entry::Caching(a) => a.free(addr),
            Entry::Uncached(u) => u.free(addr),
        })
    }

    /// The free of an allocation used on other streams under [`alloc_core::HostQueue::SyncFirst`],
    /// after [`Runtime::free`] answered [`FreeError::DrainFirst`] (and changed nothing): the drain
    /// hook of [`Runtime::set_drain_hook`] (else the synchronize hook, which drains too) runs
    /// without any lock, then the free records its events behind the work the host had queued.
    ///
    /// A step of its own rather than inside `free`: any check for it there cost the runtime's
    /// cache-hit pair 10 to 23 instructions and about 3% of its time (docs/performance.md).
    #[cold]
    pub fn free_after_drain(&self, addr: u64) -> Result<(), D::Error> {
        self.route(addr, |entry| match entry {
            Entry::Caching(a) => a.free_after_drain(addr),
            Entry::Uncached(u) => u.free(addr),
        })
    }

    /// `record_stream(addr, stream)`: the allocation is also used on `stream`, so its memory
    /// is reused only after the work queued there when it is freed has completed.
    pub fn record_stream(&self, addr: u64, stream: D::Stream) -> Result<(), D::Error> {
        self.change_stream_uses(addr, |a| a.record_stream(addr, stream))
    }

    /// torch_npu's `erase_stream(ptr, stream)`: undoes `record_stream(ptr, stream)`, so that
    /// freeing `ptr` waits for no work on `stream`. torch_npu skips it unless `ptr` was
    /// allocated on its device's current stream; the runtime has no current stream, so that
    /// check is the caller's. Errors as [`Runtime::record_stream`]'s.
    pub fn erase_stream(&self, addr: u64, stream: D::Stream) -> Result<(), D::Error> {
        self.change_stream_uses(addr, |a| a.erase_stream(addr, stream))
    }

    /// `op`, a change of the streams the live allocation at `addr` is used on, on the device
    /// that owns it. Address 0 changes nothing, and neither does an allocation of a device
    /// without caching, whose frees wait for the whole device anyway.
    fn change_stream_uses(
        &self,
        addr: u64,
        op: impl Fn(&DeviceAllocator<D>) -> Result<(), D::Error>,
    ) -> Result<(), D::Error> {
        if addr == 0 {
            return Ok(());
        }
        self.route(addr, |entry| match entry {
            Entry::Caching(a) => op(a),
            Entry::Uncached(u) if u.contains(addr) => Ok(()),
            Entry::Uncached(_) => Err(FreeError::ForeignPointer { addr }.into()),
        })
    }

    /// Runs `op` on the device that owns `addr`, until a device answers something other than
    /// [`FreeError::ForeignPointer`]: first each opened device whose span holds `addr` (the
    /// fast path, no lock but the owner's), then, if none did, every device, each read under its
    /// creation lock. The second pass catches an owner whose span or opening this thread had
    /// not seen yet (a pointer handed over with only relaxed atomics carries no ordering), and
    /// gives an interior or stale pointer the owning allocator's precise error.
    #[inline(always)]
    fn route(
        &self,
        addr: u64,
        op: impl Fn(&Entry<D>) -> Result<(), D::Error>,
    ) -> Result<(), D::Error> {
        // A plain loop: this runs on every free, and the iterator chain cost instructions.
        for slot in &self.devices {
            if !slot.span.may_hold(addr) {
                continue;
            }
            if let Some((_, entry)) = slot.entry.get() {
                let answer = op(entry);
                // `Ok` first: returning it as `Ok(())` copies no error-sized value.
                if answer.is_ok() {
                    return Ok(());
                }
                if !foreign(&answer) {
                    return answer;
                }
            }
        }
        self.route_slow(addr, op)
    }

    /// The second pass of [`Runtime::route`]. A device asked in the first pass may be asked
    /// again: it answers the same, unless the caller raced its own malloc of `addr`.
    #[cold]
    fn route_slow(
        &self,
        addr: u64,
        op: impl Fn(&Entry<D>) -> Result<(), D::Error>,
    ) -> Result<(), D::Error> {
        let opened = self
            .devices
            .iter()
            .filter_map(|slot| slot.entry.get_synchronized().map(|(_, e)| e));
        first_answer(opened, &op).unwrap_or(Err(FreeError::ForeignPointer { addr }.into()))
    }

    /// `empty_cache()`: on every opened device, synchronize and give every whole cached
    /// segment back. Returns the first error after trying every device. torch_npu's
    /// `emptyCache` first drains its host task queue (`npuSynchronizeDevice`); this call does
    /// not run the [`Runtime::set_host_queue`] hook, so an embedder with a host queue drains it
    /// before calling (the C library's `npu_alloc_empty_cache` calls its hook first).
    pub fn empty_cache(&self) -> Result<(), D::Error> {
        self.on_every_cache(DeviceAllocator::empty_cache)
    }

    /// torch_npu's `empty_virt_addr_cache()`: [`Runtime::empty_cache`], except that the pages
    /// unmapped from expandable segments are kept, each for the next map in its pool, instead
    /// of freed (`empty_cache` and the OOM retry chain free them). Statistics move as with
    /// `empty_cache`. Refused with [`RuntimeError::NotExpandable`] unless the runtime's
    /// configuration has `expandable_segments:True`, as torch_npu refuses it.
    pub fn empty_virt_addr_cache(&self) -> Result<(), D::Error> {
        self.check_expandable()?;
        self.on_every_cache(DeviceAllocator::empty_virt_addr_cache)
    }

    /// [`RuntimeError::NotExpandable`] unless the runtime's configuration (with every
    /// `set_allocator_settings`) has expandable segments on: torch_npu's check before
    /// `empty_virt_addr_cache`, made before anything else (the C library's host-queue drain).
    pub fn check_expandable(&self) -> Result<(), D::Error> {
        if self.settings.lock().0.expandable_segments {
            Ok(())
        } else {
            Err(RuntimeError::NotExpandable)
        }
    }

    /// Runs `f` on every opened caching device; returns the first error after trying all.
    fn on_every_cache(
        &self,
        f: impl Fn(&DeviceAllocator<D>) -> Result<(), D::Error>,
    ) -> Result<(), D::Error> {
        let mut result = Ok(());
        for entry in self.opened_all() {
            if let Entry::Caching(a) = entry {
                let r = f(a);
                if result.is_ok() {
                    result = r;
                }
            }
        }
        result
    }

    /// Polls `device`'s event queues: blocks whose recorded streams finished become reusable.
    pub fn process_events(&self, device: u32) -> Result<(), D::Error> {
        match self.opened(device)? {
            Some(Entry::Caching(a)) => a.process_events(),
            _ => Ok(()),
        }
    }

    /// Every statistic of `device` (zeros for a device not used yet, or without caching).
    pub fn device_stats(&self, device: u32) -> Result<DeviceStats, D::Error> {
        Ok(match self.opened(device)? {
            Some(Entry::Caching(a)) => a.stats(),
            _ => DeviceStats {
                max_split_size: self.config.alloc.max_split_size,
                ..DeviceStats::default()
            },
        })
    }

    /// `memory_stats(device)`: torch's flat keys (`allocated_bytes.all.current`, ...), sorted.
    pub fn memory_stats(&self, device: u32) -> Result<Vec<(String, i64)>, D::Error> {
        Ok(self.device_stats(device)?.flat())
    }

    /// `memory_allocated(device)`: bytes of live allocations (rounded sizes).
    pub fn memory_allocated(&self, device: u32) -> Result<u64, D::Error> {
        Ok(self.device_stats(device)?.allocated_bytes.all.current as u64)
    }

    /// `max_memory_allocated(device)`: the peak of [`Runtime::memory_allocated`].
    pub fn max_memory_allocated(&self, device: u32) -> Result<u64, D::Error> {
        Ok(self.device_stats(device)?.allocated_bytes.all.peak as u64)
    }

    /// `memory_reserved(device)`: bytes of all segments.
    pub fn memory_reserved(&self, device: u32) -> Result<u64, D::Error> {
        Ok(self.device_stats(device)?.reserved_bytes.all.current as u64)
    }

    /// `max_memory_reserved(device)`: the peak of [`Runtime::memory_reserved`].
    pub fn max_memory_reserved(&self, device: u32) -> Result<u64, D::Error> {
        Ok(self.device_stats(device)?.reserved_bytes.all.peak as u64)
    }

    /// `reset_peak_memory_stats(device)`.
    pub fn reset_peak_memory_stats(&self, device: u32) -> Result<(), D::Error> {
        if let Some(Entry::Caching(a)) = self.opened(device)? {
            a.reset_peak();
        }
        Ok(())
    }

    /// `reset_accumulated_memory_stats(device)`.
    pub fn reset_accumulated_memory_stats(&self, device: u32) -> Result<(), D::Error> {
        if let Some(Entry::Caching(a)) = self.opened(device)? {
            a.reset_accumulated();
        }
        Ok(())
    }

    /// `set_per_process_memory_fraction(fraction, device)`: new segments of `device` stay
    /// within `fraction` × its total memory. `fraction` must lie in [0, 1]. Without caching
    /// there is nothing to limit and a valid fraction is accepted without effect.
    pub fn set_per_process_memory_fraction(
        &self,
        fraction: f64,
        device: u32,
    ) -> Result<(), D::Error> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(alloc_core::FractionError::OutOfRange(fraction).into());
        }
        match self.entry(device)? {
            Entry::Caching(a) => a.set_fraction(fraction),
            Entry::Uncached(_) => Ok(()),
        }
    }

    /// `get_per_process_memory_fraction(device)`: 1.0 when unlimited.
    pub fn get_per_process_memory_fraction(&self, device: u32) -> Result<f64, D::Error> {
        Ok(match self.opened(device)? {
            Some(Entry::Caching(a)) => a.fraction(),
            Some(Entry::Uncached(_)) => 1.0,
            None => self.config.alloc.per_process_memory_fraction,
        })
    }

    /// `mem_get_info(device)`: (free, total) bytes as the device reports them.
    pub fn mem_get_info(&self, device: u32) -> Result<(u64, u64), D::Error> {
        let info = self
            .with_device(device, |d| d.mem_info())?
            .map_err(RuntimeError::Device)?;
        Ok((info.free, info.total))
    }

    /// `memory_summary(device, abbreviated)`: torch's table of the device's stats.
    pub fn memory_summary(&self, device: u32, abbreviated: bool) -> Result<String, D::Error> {
        let stats = self.device_stats(device)?;
        let expandable = match self.opened(device)? {
            Some(Entry::Caching(a)) => a.expandable_summary(),
            _ => summary::ExpandableSummary::default(),
        };
        Ok(summary::memory_summary(
            device,
            &stats,
            abbreviated,
            expandable,
        ))
    }

    /// `memory_snapshot()` of `device`: its segments and blocks in address order. It records
    /// nothing: torch_npu's `memory_snapshot()` goes through `snapshot()`, which adds a
    /// `snapshot` entry to every device's history, and [`Runtime::snapshot`] does that.
    pub fn memory_snapshot(&self, device: u32) -> Result<Vec<SegmentInfo<D::Stream>>, D::Error> {
        Ok(match self.opened(device)? {
            Some(Entry::Caching(a)) => a.memory_snapshot(),
            _ => Vec::new(),
        })
    }

    /// Whether and how garbage collection runs on `device` (`Off` until it is opened, and
    /// without caching).
    pub fn gc_status(&self, device: u32) -> Result<GcStatus, D::Error> {
        Ok(match self.opened(device)? {
            Some(Entry::Caching(a)) => a.gc_status(),
            _ => GcStatus::Off,
        })
    }

    /// Calls every observer with `oom`, unless this thread is already inside an observer: an
    /// observer that allocates and runs out of memory again (on another device, say) would
    /// otherwise call the observers again, without end.
    /// Returns whether any observer was called.
    fn notify_observers(&self, oom: &OutOfMemory) -> bool {
        thread_local! {
            static NOTIFYING: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
        }
        if NOTIFYING.with(|n| n.replace(true)) {
            return false;
        }
        /// Clears the flag however the observers return (one may panic).
        struct Done;
        impl Drop for Done {
            fn drop(&mut self) {
                NOTIFYING.with(|n| n.set(false));
            }
        }
        let _done = Done;
        let observers = self.observers.lock().clone();
        for observer in &observers {
            observer(oom);
        }
        !observers.is_empty()
    }

    /// Runs the rejection observers on a thread of their own, as torch_npu does ("to minimize
    /// latency impact on rejection path"); where no thread can be started, on this one.
    fn notify_rejection_observers(&self, rejection: &Rejection) {
        let observers = self.rejection_observers.lock().clone();
        if observers.is_empty() {
            return;
        }
        // Made twice where the thread cannot start: `spawn` consumes the first.
        let run = || {
            let (observers, rejection) = (observers.clone(), *rejection);
            move || {
                for observer in &observers {
                    observer(&rejection);
                }
            }
        };
        let spawned = std::thread::Builder::new()
            .name("npu-alloc-oom-rejection".into())
            .spawn(run());
        if spawned.is_err() {
            run()();
        }
    }

    /// Calls `observer` with each malloc that `throw_on_npumalloc_oom` refused (device, the
    /// refused segment's size, the bytes of every segment before it, the device's total), on a
    /// thread of its own, after the device's lock is released (torch_npu's
    /// `attachOomRejectionObserver`). The malloc returns its error without waiting for them.
    pub fn attach_oom_rejection_observer<F>(&self, observer: F)
    where
        F: Fn(&Rejection) + Send + Sync + 'static,
    {
        self.rejection_observers
            .lock()
            .push(std::sync::Arc::new(observer));
    }

    /// Calls `observer` with each out-of-memory error, after the device's lock is released. An
    /// out-of-memory error raised inside an observer (by a malloc it makes) is returned to it
    /// without calling the observers again.
    pub fn attach_out_of_memory_observer<F>(&self, observer: F)
    where
        F: Fn(&OutOfMemory) + Send + Sync + 'static,
    {
        let observer: Box<OomObserver> = Box::new(observer);
        self.observers.lock().push(Arc::new(observer));
    }
}

impl<D: Device> std::fmt::Debug for Runtime<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let opened: Vec<usize> = self
            .devices
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.entry.get().map(|_| i))
            .collect();
        f.debug_struct("Runtime")
            .field("device_count", &self.devices.len())
            .field("opened", &opened)
            .field("config", &self.config)
            .finish()
    }
}
