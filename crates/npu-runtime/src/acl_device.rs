//! The ACL backend: `alloc-core`'s [`Device`] over a loaded `libascendcl` ([`acl_sys::Lib`]).
//!
//! - Memory calls act on the calling thread's current device (ascend-acl.md §1.1), so every
//!   call first binds the device with `aclrtSetDevice`, once per thread and device: the binding
//!   is remembered per thread, as torch_npu's `c10_npu::SetDevice` does. Code that changes the
//!   thread's device behind the runtime's back must not share the thread with it.
//! - Segments come from `aclrtMallocAlign32` (no ACL padding) with `ACL_MEM_MALLOC_HUGE_FIRST`,
//!   or `aclrtMalloc` when the library lacks it (§2.4); out-of-memory is what
//!   [`AclError::is_out_of_memory`] says (207001, 207018, 200000, `EL0004`).
//! - `free` is a plain `aclrtFree`, which does not wait for queued work: `alloc-core` calls
//!   [`Device::synchronize`] (`aclrtSynchronizeDevice`) once before each batch of frees.
//! - Events come from a per-device pool, created with `ACL_EVENT_CAPTURE_STREAM_PROGRESS` as
//!   torch_npu's pool does, and are polled with `aclrtQueryEventStatus` (COMPLETE = 1), or
//!   `aclrtQueryEvent` (COMPLETE = 0) on libraries without it.
//! - `mem_info` is `aclrtGetMemInfo(ACL_HBM_MEM)`; a failure reads as "unknown", which turns
//!   GC off (`alloc-core`'s `Notice::GcWithoutMemInfo`).

use std::cell::Cell;
use std::path::Path;

use acl_sys::{AclError, DevicePtr, Event, EventFlags, Lib, MemAttr, MemMallocPolicy, Stream};
use alloc_core::{Device, DeviceError, MemInfo, StreamId};

use crate::backend::Backend;
use crate::sync::Arc;
use crate::sync::global::{AtomicU64, Ordering};

thread_local! {
    /// The (backend id, device) this thread last bound with `aclrtSetDevice`.
    static BOUND: Cell<Option<(u64, u32)>> = const { Cell::new(None) };
}

/// The ACL runtime as a [`Backend`]: a loaded library shared by every device's allocator.
#[derive(Clone)]
pub struct AclBackend {
    lib: Arc<Lib>,
    /// Distinguishes backends in the per-thread binding cache (libraries can be reloaded).
    id: u64,
    align32: bool,
    device_count: u32,
}

impl std::fmt::Debug for AclBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclBackend")
            .field("lib", &self.lib)
            .field("align32", &self.align32)
            .field("device_count", &self.device_count)
            .finish()
    }
}

impl AclBackend {
    /// Initialises ACL (`aclInit`; already initialised is fine) and counts the devices.
    pub fn new(lib: Lib) -> Result<AclBackend, AclError> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        lib.init(None)?;
        let device_count = lib.device_count()?;
        Ok(AclBackend {
            align32: lib.has_malloc_align32(),
            lib: Arc::new(lib),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            device_count,
        })
    }

    /// Loads the library at `path` ([`Lib::load`]) and initialises it.
    pub fn load(path: impl AsRef<Path>) -> Result<AclBackend, AclError> {
        AclBackend::new(Lib::load(path)?)
    }

    /// Searches for the library ([`Lib::search`]: `explicit`, `$NPU_ALLOC_ACL_LIB`, the CANN
    /// install locations, the system loader) and initialises it.
    pub fn search(explicit: Option<&Path>) -> Result<AclBackend, AclError> {
        AclBackend::new(Lib::search(explicit)?)
    }

    /// The loaded library.
    pub fn lib(&self) -> &Lib {
        &self.lib
    }

    /// Whether segments come from `aclrtMallocAlign32` (else `aclrtMalloc`).
    pub fn uses_align32(&self) -> bool {
        self.align32
    }

    /// Makes `index` the calling thread's current device, unless it already is.
    fn bind(&self, index: u32) -> Result<(), AclError> {
        let key = Some((self.id, index));
        if BOUND.with(Cell::get) == key {
            return Ok(());
        }
        self.lib.set_device(index as i32)?;
        BOUND.with(|b| b.set(key));
        Ok(())
    }
}

/// Device addresses are never 0 (`alloc-core` uses 0 for "no allocation").
fn device_ptr(addr: u64) -> Result<DevicePtr, AclError> {
    DevicePtr::from_addr(addr).ok_or(AclError::NullResult {
        function: "aclrtFree",
    })
}

impl Backend for AclBackend {
    type Device = AclDevice;
    type Error = AclError;
    type Stream = Stream;

    fn device_count(&self) -> u32 {
        self.device_count
    }

    fn open(&self, index: u32) -> Result<AclDevice, AclError> {
        self.bind(index)?;
        Ok(AclDevice {
            backend: self.clone(),
            index,
            pool: Vec::new(),
        })
    }

    fn stream_id(stream: Stream) -> StreamId {
        StreamId(stream.as_raw() as usize as u64)
    }

    fn raw_malloc(&self, index: u32, bytes: u64) -> Result<u64, DeviceError<AclError>> {
        self.bind(index).map_err(DeviceError::Other)?;
        let size = usize::try_from(bytes).map_err(|_| DeviceError::OutOfMemory)?;
        let policy = MemMallocPolicy::HUGE_FIRST;
        let result = if self.align32 {
            self.lib.malloc_align32(size, policy)
        } else {
            self.lib.malloc(size, policy)
        };
        match result {
            Ok(ptr) => Ok(ptr.addr()),
            Err(e) if e.is_out_of_memory() => Err(DeviceError::OutOfMemory),
            Err(e) => Err(DeviceError::Other(e)),
        }
    }

    fn raw_free(&self, index: u32, addr: u64, _bytes: u64) -> Result<(), AclError> {
        self.bind(index)?;
        self.lib.free(device_ptr(addr)?)
    }

    fn synchronize(&self, index: u32) -> Result<(), AclError> {
        self.bind(index)?;
        self.lib.synchronize_device()
    }

    fn mem_get_info(&self, index: u32) -> Result<MemInfo, AclError> {
        self.bind(index)?;
        let (free, total) = self.lib.get_mem_info(MemAttr::HBM_MEM)?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }
}

/// One ACL device as `alloc-core` drives it: the backend, the device index and its event pool.
pub struct AclDevice {
    backend: AclBackend,
    index: u32,
    /// Completed events, ready to be recorded again.
    pool: Vec<Event>,
}

impl std::fmt::Debug for AclDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclDevice")
            .field("index", &self.index)
            .field("pooled_events", &self.pool.len())
            .finish()
    }
}

impl AclDevice {
    /// The device index.
    pub fn index(&self) -> u32 {
        self.index
    }
}

impl Device for AclDevice {
    type Event = Event;
    type Error = AclError;

    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError<AclError>> {
        self.backend.raw_malloc(self.index, bytes)
    }

    fn free(&mut self, addr: u64, bytes: u64) -> Result<(), AclError> {
        self.backend.raw_free(self.index, addr, bytes)
    }

    fn mem_info(&mut self) -> Option<MemInfo> {
        self.backend.mem_get_info(self.index).ok()
    }

    fn record_event(&mut self, stream: StreamId) -> Result<Event, AclError> {
        self.backend.bind(self.index)?;
        let lib = &self.backend.lib;
        let event = match self.pool.pop() {
            Some(event) => event,
            None => lib.create_event(EventFlags::CAPTURE_STREAM_PROGRESS)?,
        };
        // SAFETY: every `StreamId` this device sees comes from `AclBackend::stream_id` of an
        // `acl_sys::Stream` passed to the runtime's API (the allocator is private to it), so it
        // is null or a live stream by `Stream`'s own contract.
        let stream = unsafe { Stream::from_raw(stream.0 as usize as *mut core::ffi::c_void) };
        match lib.record_event(&event, stream) {
            Ok(()) => Ok(event),
            Err(e) => {
                self.pool.push(event);
                Err(e)
            }
        }
    }

    fn event_done(&mut self, event: &Event) -> Result<bool, AclError> {
        self.backend.lib.query_event_status(event)
    }

    fn release_event(&mut self, event: Event) {
        self.pool.push(event);
    }

    fn synchronize(&mut self) -> Result<(), AclError> {
        self.backend.synchronize(self.index)
    }
}

impl Drop for AclDevice {
    fn drop(&mut self) {
        for event in self.pool.drain(..) {
            if let Err(e) = self.backend.lib.destroy_event(event) {
                log::warn!("NPU {}: destroying a pooled event failed: {e}", self.index);
            }
        }
    }
}
