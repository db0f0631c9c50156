//! The torch-named API: one [`Runtime`] holds an allocator per device (created on first use)
//! and the OOM observers.
//!
//! Locks: each device's allocator has its own lock (`device_allocator`); the device table and
//! the observer list each have a short one, never held across a device call except the device
//! table while a device is first opened. There is no process-wide pointer map: `free` finds a
//! pointer's device by the address spans of `route`. OOM observers run with no lock held, so
//! they may allocate or free.

use std::path::Path;

use acl_sys::AclError;
use alloc_core::{DeviceStats, GcStatus, OutOfMemory, SegmentInfo};

use crate::acl_device::AclBackend;
use crate::backend::Backend;
use crate::config::Config;
use crate::device_allocator::DeviceAllocator;
use crate::error::RuntimeError;
use crate::no_caching::Uncached;
use crate::route::Span;
use crate::summary;
use crate::sync::{Arc, Mutex, OnceSlot};

/// The runtime over ACL: what a program uses.
pub type NpuAllocator = Runtime<AclBackend>;

/// A function told about each out-of-memory error, after the allocator's lock is released
/// (torch's `attachOutOfMemoryObserver`).
pub type OomObserver = dyn Fn(&OutOfMemory) + Send + Sync;

/// Result of the runtime's calls.
pub type Result<T, E = AclError> = core::result::Result<T, RuntimeError<E>>;

/// One device: a caching allocator, or none (`PYTORCH_NO_NPU_MEMORY_CACHING=1`).
// Built once per device and kept in its slot for the runtime's life: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum Entry<B: Backend> {
    Caching(DeviceAllocator<B>),
    Uncached(Uncached<B>),
}

/// The first answer of `op` over `entries` other than "not mine" ([`RuntimeError::InvalidPointer`]).
fn first_answer<'a, B: Backend + 'a>(
    entries: impl Iterator<Item = &'a Entry<B>>,
    op: &impl Fn(&Entry<B>) -> Result<(), B::Error>,
) -> Option<Result<(), B::Error>> {
    entries
        .map(op)
        .find(|answer| !matches!(answer, Err(RuntimeError::InvalidPointer { .. })))
}

/// One device's slot in the runtime: its allocator once opened, and the addresses it returned.
struct Slot<B: Backend> {
    /// Filled on first use and read without a lock afterwards.
    entry: OnceSlot<Entry<B>>,
    /// Where its allocations lie, so `free` can find it.
    span: Span,
}

/// The caching allocator of every device of a [`Backend`], with torch's API.
pub struct Runtime<B: Backend> {
    backend: Arc<B>,
    config: Config,
    devices: Vec<Slot<B>>,
    observers: Mutex<Vec<Arc<Box<OomObserver>>>>,
}

impl NpuAllocator {
    /// The library found by the search path (`$NPU_ALLOC_ACL_LIB`, the CANN install
    /// locations, the system loader) with the environment's configuration.
    pub fn from_env() -> core::result::Result<NpuAllocator, AclError> {
        Ok(Runtime::new(AclBackend::search(None)?, Config::from_env()))
    }

    /// The library at `path` with an explicit configuration.
    pub fn with_library(
        path: impl AsRef<Path>,
        config: Config,
    ) -> core::result::Result<NpuAllocator, AclError> {
        Ok(Runtime::new(AclBackend::load(path)?, config))
    }
}

impl<B: Backend> Runtime<B> {
    /// A runtime over `backend` with `config`; no device is opened yet.
    pub fn new(backend: B, config: Config) -> Self {
        let count = backend.device_count() as usize;
        Runtime {
            backend: Arc::new(backend),
            config,
            devices: (0..count)
                .map(|_| Slot {
                    entry: OnceSlot::new(),
                    span: Span::new(),
                })
                .collect(),
            observers: Mutex::new(Vec::new()),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Number of devices.
    pub fn device_count(&self) -> u32 {
        self.backend.device_count()
    }

    fn check_device(&self, device: u32) -> Result<(), B::Error> {
        let count = self.device_count();
        if device < count {
            Ok(())
        } else {
            Err(RuntimeError::InvalidDevice { device, count })
        }
    }

    /// Device `device`'s allocator, opened on first use.
    fn entry(&self, device: u32) -> Result<&Entry<B>, B::Error> {
        self.check_device(device)?;
        self.devices[device as usize].entry.get_or_try_init(|| {
            let backend = self.backend.clone();
            Ok(if self.config.caching {
                Entry::Caching(DeviceAllocator::new(backend, device, &self.config.alloc)?)
            } else {
                Entry::Uncached(Uncached::new(backend, device))
            })
        })
    }

    /// Device `device`'s allocator if it was opened.
    fn opened(&self, device: u32) -> Result<Option<&Entry<B>>, B::Error> {
        self.check_device(device)?;
        Ok(self.devices[device as usize].entry.get())
    }

    /// Every opened device.
    fn opened_all(&self) -> impl Iterator<Item = &Entry<B>> {
        self.devices.iter().filter_map(|slot| slot.entry.get())
    }

    /// `malloc(size, device, stream)`: `size` bytes on `device` for use on `stream`; 0 for a
    /// zero-size request. Out of memory calls the observers, then returns the error.
    pub fn malloc(&self, size: u64, device: u32, stream: B::Stream) -> Result<u64, B::Error> {
        let entry = self.entry(device)?;
        let result = match entry {
            Entry::Caching(a) => a.malloc(size, B::stream_id(stream)),
            Entry::Uncached(u) => u.malloc(size),
        };
        match result {
            Ok(0) => Ok(0),
            Ok(addr) => {
                self.devices[device as usize].span.note(addr);
                Ok(addr)
            }
            Err(RuntimeError::OutOfMemory(oom)) => {
                let observers = self.observers.lock().clone();
                for observer in observers {
                    observer(&oom);
                }
                Err(RuntimeError::OutOfMemory(oom))
            }
            Err(e) => Err(e),
        }
    }

    /// `free(addr)`: returns an allocation (0 is a no-op). An address no device knows is
    /// [`RuntimeError::InvalidPointer`], one inside a segment that is not a live allocation
    /// [`RuntimeError::NotAllocated`]; on any error the allocation stays live.
    pub fn free(&self, addr: u64) -> Result<(), B::Error> {
        if addr == 0 {
            return Ok(());
        }
        self.route(addr, |entry| match entry {
            Entry::Caching(a) => a.free(addr),
            Entry::Uncached(u) => u.free(addr),
        })
    }

    /// `record_stream(addr, stream)`: the allocation is also used on `stream`, so its memory
    /// is reused only after the work queued there when it is freed has completed.
    pub fn record_stream(&self, addr: u64, stream: B::Stream) -> Result<(), B::Error> {
        if addr == 0 {
            return Ok(());
        }
        self.route(addr, |entry| match entry {
            Entry::Caching(a) => a.record_stream(addr, B::stream_id(stream)),
            Entry::Uncached(u) if u.contains(addr) => Ok(()),
            Entry::Uncached(_) => Err(RuntimeError::InvalidPointer { addr }),
        })
    }

    /// Runs `op` on the device that owns `addr`, until a device answers something other than
    /// [`RuntimeError::InvalidPointer`]: first each opened device whose span holds `addr` (the
    /// fast path, no lock but the owner's), then, if none did, every device, each read under its
    /// creation lock. The second pass catches an owner whose span or opening this thread had
    /// not seen yet (a pointer handed over with only relaxed atomics carries no ordering), and
    /// gives an interior or stale pointer the owning allocator's precise error.
    #[inline]
    fn route(
        &self,
        addr: u64,
        op: impl Fn(&Entry<B>) -> Result<(), B::Error>,
    ) -> Result<(), B::Error> {
        let candidates = self.devices.iter().filter(|slot| slot.span.may_hold(addr));
        match first_answer(candidates.filter_map(|slot| slot.entry.get()), &op) {
            Some(answer) => answer,
            None => self.route_slow(addr, op),
        }
    }

    /// The second pass of [`Runtime::route`]. A device asked in the first pass may be asked
    /// again: it answers the same, unless the caller raced its own malloc of `addr`.
    #[cold]
    fn route_slow(
        &self,
        addr: u64,
        op: impl Fn(&Entry<B>) -> Result<(), B::Error>,
    ) -> Result<(), B::Error> {
        let opened = self
            .devices
            .iter()
            .filter_map(|slot| slot.entry.get_synchronized());
        first_answer(opened, &op).unwrap_or(Err(RuntimeError::InvalidPointer { addr }))
    }

    /// `empty_cache()`: on every opened device, synchronize and give every whole cached
    /// segment back. Returns the first error after trying every device.
    pub fn empty_cache(&self) -> Result<(), B::Error> {
        let mut result = Ok(());
        for entry in self.opened_all() {
            if let Entry::Caching(a) = entry {
                let r = a.empty_cache();
                if result.is_ok() {
                    result = r;
                }
            }
        }
        result
    }

    /// Polls `device`'s event queues: blocks whose recorded streams finished become reusable.
    pub fn process_events(&self, device: u32) -> Result<(), B::Error> {
        match self.opened(device)? {
            Some(Entry::Caching(a)) => a.process_events(),
            _ => Ok(()),
        }
    }

    /// Every statistic of `device` (zeros for a device not used yet, or without caching).
    pub fn device_stats(&self, device: u32) -> Result<DeviceStats, B::Error> {
        Ok(match self.opened(device)? {
            Some(Entry::Caching(a)) => a.stats(),
            _ => DeviceStats {
                max_split_size: self.config.alloc.max_split_size,
                ..DeviceStats::default()
            },
        })
    }

    /// `memory_stats(device)`: torch's flat keys (`allocated_bytes.all.current`, ...), sorted.
    pub fn memory_stats(&self, device: u32) -> Result<Vec<(String, i64)>, B::Error> {
        Ok(self.device_stats(device)?.flat())
    }

    /// `memory_allocated(device)`: bytes of live allocations (rounded sizes).
    pub fn memory_allocated(&self, device: u32) -> Result<u64, B::Error> {
        Ok(self.device_stats(device)?.allocated_bytes.all.current as u64)
    }

    /// `max_memory_allocated(device)`: the peak of [`Runtime::memory_allocated`].
    pub fn max_memory_allocated(&self, device: u32) -> Result<u64, B::Error> {
        Ok(self.device_stats(device)?.allocated_bytes.all.peak as u64)
    }

    /// `memory_reserved(device)`: bytes of all segments.
    pub fn memory_reserved(&self, device: u32) -> Result<u64, B::Error> {
        Ok(self.device_stats(device)?.reserved_bytes.all.current as u64)
    }

    /// `max_memory_reserved(device)`: the peak of [`Runtime::memory_reserved`].
    pub fn max_memory_reserved(&self, device: u32) -> Result<u64, B::Error> {
        Ok(self.device_stats(device)?.reserved_bytes.all.peak as u64)
    }

    /// `reset_peak_memory_stats(device)`.
    pub fn reset_peak_memory_stats(&self, device: u32) -> Result<(), B::Error> {
        if let Some(Entry::Caching(a)) = self.opened(device)? {
            a.reset_peak();
        }
        Ok(())
    }

    /// `reset_accumulated_memory_stats(device)`.
    pub fn reset_accumulated_memory_stats(&self, device: u32) -> Result<(), B::Error> {
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
    ) -> Result<(), B::Error> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(RuntimeError::Fraction(
                alloc_core::FractionError::OutOfRange(fraction),
            ));
        }
        match self.entry(device)? {
            Entry::Caching(a) => a.set_fraction(fraction),
            Entry::Uncached(_) => Ok(()),
        }
    }

    /// `get_per_process_memory_fraction(device)`: 1.0 when unlimited.
    pub fn get_per_process_memory_fraction(&self, device: u32) -> Result<f64, B::Error> {
        Ok(match self.opened(device)? {
            Some(Entry::Caching(a)) => a.fraction(),
            Some(Entry::Uncached(_)) => 1.0,
            None => self.config.alloc.per_process_memory_fraction,
        })
    }

    /// `mem_get_info(device)`: (free, total) bytes as the device reports them.
    pub fn mem_get_info(&self, device: u32) -> Result<(u64, u64), B::Error> {
        self.check_device(device)?;
        let info = self
            .backend
            .mem_get_info(device)
            .map_err(RuntimeError::Device)?;
        Ok((info.free, info.total))
    }

    /// `memory_summary(device, abbreviated)`: torch's table of the device's stats.
    pub fn memory_summary(&self, device: u32, abbreviated: bool) -> Result<String, B::Error> {
        let stats = self.device_stats(device)?;
        Ok(summary::memory_summary(device, &stats, abbreviated))
    }

    /// `memory_snapshot()` of `device`: its segments and blocks in address order.
    pub fn memory_snapshot(&self, device: u32) -> Result<Vec<SegmentInfo>, B::Error> {
        Ok(match self.opened(device)? {
            Some(Entry::Caching(a)) => a.snapshot(),
            _ => Vec::new(),
        })
    }

    /// Whether and how garbage collection runs on `device` (`Off` until it is opened, and
    /// without caching).
    pub fn gc_status(&self, device: u32) -> Result<GcStatus, B::Error> {
        Ok(match self.opened(device)? {
            Some(Entry::Caching(a)) => a.gc_status(),
            _ => GcStatus::Off,
        })
    }

    /// Calls `observer` with each out-of-memory error, after the device's lock is released.
    pub fn attach_out_of_memory_observer<F>(&self, observer: F)
    where
        F: Fn(&OutOfMemory) + Send + Sync + 'static,
    {
        let observer: Box<OomObserver> = Box::new(observer);
        self.observers.lock().push(Arc::new(observer));
    }
}

impl<B: Backend> std::fmt::Debug for Runtime<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let opened: Vec<usize> = self
            .devices
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.entry.get().map(|_| i))
            .collect();
        f.debug_struct("Runtime")
            .field("device_count", &self.device_count())
            .field("opened", &opened)
            .field("config", &self.config)
            .finish()
    }
}
