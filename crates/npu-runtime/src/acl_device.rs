//! The ACL device: `alloc-core`'s [`Device`] over a loaded `libascendcl` ([`acl_sys::Lib`]).
//!
//! - Memory calls act on the calling thread's current device (docs/acl.md), so every
//!   call first binds the device with `aclrtSetDevice`, once per thread and device: the binding
//!   is remembered per thread, as torch_npu's `c10_npu::SetDevice` does. Code that changes the
//!   thread's device behind the runtime's back must not share the thread with it.
//! - Segments come from `aclrtMallocAlign32` (no ACL padding) with `ACL_MEM_MALLOC_HUGE_FIRST`
//!   (under `page_size:1g`, a segment of whole GiB asks for `ACL_MEM_MALLOC_HUGE1G_ONLY` first,
//!   [`AclDevice::with_1g_pages`]), or `aclrtMalloc` when the library lacks it (§2.4);
//!   out-of-memory is what
//!   [`AclError::is_out_of_memory`] says (207001, 207018, 200000, `EL0004`).
//! - `free` is a plain `aclrtFree`, which does not wait for queued work: `alloc-core` calls
//!   [`Device::synchronize`] (`aclrtSynchronizeDevice`) once before each batch of frees.
//! - Events come from a per-device pool, created with `ACL_EVENT_CAPTURE_STREAM_PROGRESS` as
//!   torch_npu's pool does, and are polled with `aclrtQueryEventStatus` (COMPLETE = 1), or
//!   `aclrtQueryEvent` (COMPLETE = 0) on libraries without it.
//! - `mem_info` is `aclrtGetMemInfo(ACL_HBM_MEM)`; a failure reads as "unknown", which turns
//!   GC off (`alloc-core`'s `Notice::GcWithoutMemInfo`).
//! - Virtual memory (expandable segments) is torch_npu's: `aclrtReserveMemAddress(size,
//!   alignment 0, expectPtr NULL, flags 1)`; pages are `aclrtMallocPhysical` of pinned device
//!   memory, `ACL_HBM_MEM_HUGE`, or `ACL_HBM_MEM_HUGE1G` for a page of exactly 1 GiB, retried
//!   once with `ACL_HBM_MEM_HUGE` when that fails (warned once); `aclrtMapMem(va, size, 0, page,
//!   0)`, `aclrtUnmapMem(va)`, `aclrtFreePhysical`, `aclrtReleaseMemAddress(va)`. A missing
//!   symbol or 207000 is [`VmmError::Unsupported`], 207001 from `aclrtMallocPhysical` is
//!   [`VmmError::OutOfMemory`], anything else is [`VmmError::Other`]; a page whose free fails
//!   goes back to the caller.
//! - Host memory for the memory saver's CPU backup is `aclrtMallocHost` ([`HostMem`], which
//!   knows its size) and `aclrtFreeHost`; copies are synchronous `aclrtMemcpy`,
//!   DEVICE_TO_HOST into the start of the buffer (`destMax` = the buffer's size) and
//!   HOST_TO_DEVICE from it (`destMax` = `count`), as the sgl-kernel-npu port of
//!   torch_memory_saver copies. A copy larger than the buffer is refused before ACL is called. A
//!   missing symbol or 207000 is [`VmmError::Unsupported`], an out-of-memory code from
//!   `aclrtMallocHost` ([`AclError::is_out_of_memory`]) is [`VmmError::OutOfMemory`], anything
//!   else [`VmmError::Other`]; a buffer whose free fails goes back to the caller.

use std::cell::{Cell, RefCell};
use std::path::Path;

use acl_sys::{
    ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_MEMORY_ALLOCATION, AclError, CannPackage, DevicePtr,
    Event, EventFlags, HostMem, Lib, MemAttr, MemMallocPolicy, PhysicalMem, PhysicalMemProp,
    RESERVE_MEM_FLAG_COMPAT,
};
use alloc_core::{Device, DeviceError, DeviceFacts, MemInfo, VmmError};

use crate::api::{NpuAllocator, Runtime};
use crate::config::Config;
use crate::sync::Arc;
use crate::sync::global::{AtomicU64, Ordering};
use crate::warn_once::warn_once;

thread_local! {
    /// The (platform id, device) this thread last bound with `aclrtSetDevice`.
    static BOUND: Cell<Option<(u64, u32)>> = const { Cell::new(None) };
    /// Inside [`keeping_current_device`]: what to bind again when it ends.
    static KEEP: RefCell<Keep> = const { RefCell::new(Keep::Off) };
}

/// The state of [`keeping_current_device`] on a thread.
enum Keep {
    /// Not inside it.
    Off,
    /// Inside it, and nothing bound yet: the thread's cached binding from before, which stands
    /// again at the end if nothing was bound (no ACL call made it any less true).
    Watching(Option<(u64, u32)>),
    /// Inside it, after the first bind: the library, its platform id, and the device the thread
    /// had before (`None`: none, or ACL could not say).
    Saved(Arc<Lib>, u64, Option<i32>),
}

/// Runs `f`, then makes the calling thread's current ACL device again the one it had before, if
/// `f` bound another one (torch_npu's `emptyCache` does the same around its loop over devices).
///
/// For calls that act on devices other than the caller's: `empty_cache` and the memory saver's
/// `pause` and `resume` over every device, or any call naming another device. torch_npu caches
/// its thread's device and never asks ACL again, so a binding moved behind its back would stay
/// moved, and its next kernel would go to the wrong device. Inside `f` the runtime does not
/// trust its own cache of the binding either (the host program may have changed it since):
/// each device is bound with `aclrtSetDevice` at its first call, and the device before is read
/// once with `aclrtGetDevice`. Nested calls act as one.
pub fn keeping_current_device<R>(f: impl FnOnce() -> R) -> R {
    // On a thread that is exiting, after its thread-locals were destroyed, there is nothing
    // to keep: `f` runs as it is.
    let outer = KEEP
        .try_with(|k| {
            let mut k = k.borrow_mut();
            let outer = matches!(*k, Keep::Off);
            if outer {
                *k = Keep::Watching(BOUND.with(|b| b.replace(None)));
            }
            outer
        })
        .unwrap_or(false);
    if !outer {
        return f();
    }
    /// Binds the device back when the scope ends, on a panic too.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            let (lib, id, device) =
                match KEEP.try_with(|k| core::mem::replace(&mut *k.borrow_mut(), Keep::Off)) {
                    Ok(Keep::Saved(lib, id, Some(device))) => (lib, id, device),
                    // Nothing bound: a call that made no ACL call (a free of a cached block)
                    // costs the next one no `aclrtSetDevice`.
                    Ok(Keep::Watching(before)) => {
                        BOUND.with(|b| b.set(before));
                        return;
                    }
                    _ => return,
                };
            let key = Some((id, device as u32));
            if BOUND.with(Cell::get) == key {
                return;
            }
            match lib.set_device(device) {
                Ok(()) => BOUND.with(|b| b.set(key)),
                Err(e) => {
                    BOUND.with(|b| b.set(None));
                    warn_once(&format!(
                        "could not make device {device} this thread's device again: {e}"
                    ));
                }
            }
        }
    }
    let _restore = Restore;
    f()
}

/// An ACL stream as the runtime takes it: the default stream, or a handle the caller got from ACL
/// (an [`acl_sys::Stream`], whose constructor is where the `unsafe` promise is made). The
/// runtime only compares it and passes it back to ACL, so no integer ever becomes a stream.
///
/// Safe code cannot invent one:
///
/// ```compile_fail
/// let s = npu_runtime::Stream(0xdead_beef as *mut core::ffi::c_void); // private field
/// ```
///
/// ```compile_fail
/// let s = npu_runtime::Stream::from_raw(0x4141_4141 as *mut core::ffi::c_void); // unsafe fn
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Stream(acl_sys::Stream);

impl Stream {
    /// The default stream of the thread's current device (a null `aclrtStream`).
    pub const DEFAULT: Stream = Stream(acl_sys::Stream::DEFAULT);

    /// Wraps a stream created elsewhere (e.g. by torch_npu, handed over as an integer).
    ///
    /// # Safety
    /// `raw` must be null or a live `aclrtStream` of the library it will be used with, for as
    /// long as this value or a copy of it is used, including by the allocator: a block recorded
    /// on the stream (`record_stream`) gets an event recorded on it when it is freed.
    pub unsafe fn from_raw(raw: *mut core::ffi::c_void) -> Self {
        // SAFETY: forwarded to the caller.
        Stream(unsafe { acl_sys::Stream::from_raw(raw) })
    }

    /// The handle value.
    pub fn as_raw(self) -> *mut core::ffi::c_void {
        self.0.as_raw()
    }
}

impl From<acl_sys::Stream> for Stream {
    fn from(stream: acl_sys::Stream) -> Self {
        Stream(stream)
    }
}

impl PartialOrd for Stream {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Stream {
    fn cmp(&self, other: &Self) -> core::cmp::Ordering {
        (self.as_raw() as usize).cmp(&(other.as_raw() as usize))
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl alloc_core::Stream for Stream {
    fn number(self) -> u64 {
        self.as_raw() as usize as u64
    }
}

/// The ACL runtime: a loaded, initialised library and its devices, shared by every device's
/// allocator.
#[derive(Clone)]
pub struct AclPlatform {
    lib: Arc<Lib>,
    /// Distinguishes platforms in the per-thread binding cache (libraries can be reloaded).
    id: u64,
    align32: bool,
    device_count: u32,
}

impl std::fmt::Debug for AclPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclPlatform")
            .field("lib", &self.lib)
            .field("align32", &self.align32)
            .field("device_count", &self.device_count)
            .finish()
    }
}

impl AclPlatform {
    /// Initialises ACL (`aclInit`; already initialised is fine) and counts the devices.
    pub fn new(lib: Lib) -> Result<AclPlatform, AclError> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        lib.init(None)?;
        let device_count = lib.device_count()?;
        Ok(AclPlatform {
            align32: lib.has_malloc_align32(),
            lib: Arc::new(lib),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            device_count,
        })
    }

    /// Loads the library at `path` ([`Lib::load`]) and initialises it.
    ///
    /// ```compile_fail
    /// // Loading a caller-chosen library runs its code: not without `unsafe`.
    /// let p = npu_runtime::AclPlatform::load("/tmp/libascendcl.so");
    /// ```
    ///
    /// # Safety
    /// `path` must be a `libascendcl` (or a faithful stand-in such as testkit's fake): loading
    /// runs its initialisers and its functions are called through ACL's signatures.
    pub unsafe fn load(path: impl AsRef<Path>) -> Result<AclPlatform, AclError> {
        // SAFETY: forwarded to the caller.
        AclPlatform::new(unsafe { Lib::load(path) }?)
    }

    /// Searches for the installed library ([`Lib::search`]: `$NPU_ALLOC_ACL_LIB`, the CANN
    /// install locations, the system loader) and initialises it.
    pub fn search() -> Result<AclPlatform, AclError> {
        AclPlatform::new(Lib::search()?)
    }

    /// Number of devices.
    pub fn device_count(&self) -> u32 {
        self.device_count
    }

    /// Opens device `index` for its allocator (binding it to the calling thread).
    pub fn open(&self, index: u32) -> Result<AclDevice, AclError> {
        self.bind(index)?;
        Ok(AclDevice {
            platform: self.clone(),
            index,
            pool: Vec::new(),
            pages_1g: false,
        })
    }

    /// Bytes added to every request before rounding: torch_npu's pad, 32 except on an Ascend
    /// 950 part (`aclrtGetSocName`) with CANN 9.1.0 or later (`aclsysGetCANNVersion`), where it
    /// is 0.
    pub fn pad(&self) -> u64 {
        crate::cann_version::pad(self.lib.soc_name().as_deref(), || {
            self.lib.cann_version(CannPackage::CANN).ok()
        })
    }

    /// Whether `page_size:1g` gets 1 GiB pages here: torch_npu's gate, CANN 8.1.RC1 and driver
    /// 25.0.RC1 or later as `aclsysGetCANNVersion` reports them (a library without it, or a
    /// version it cannot report or that cannot be read, counts as too old).
    pub fn huge_pages_1g(&self) -> bool {
        let (cann, driver) = self.versions();
        crate::cann_version::huge_pages_1g(cann.as_deref(), driver.as_deref())
    }

    /// The CANN and driver versions `aclsysGetCANNVersion` reports (`None`: not reported).
    fn versions(&self) -> (Option<String>, Option<String>) {
        let version = |package| self.lib.cann_version(package).ok();
        (version(CannPackage::CANN), version(CannPackage::DRIVER))
    }

    /// A runtime over every device of this library with `config`.
    pub fn runtime(self, config: Config) -> NpuAllocator {
        let count = self.device_count;
        // As torch_npu, the versions are asked only when `page_size:1g` is set. Each device's
        // allocator then notes the setting ignored (`Notice::PageSize1gUnsupported`); this
        // warning says which versions were found.
        let huge_pages_1g = config.alloc.page_size.is_none() || {
            let (cann, driver) = self.versions();
            let ok = crate::cann_version::huge_pages_1g(cann.as_deref(), driver.as_deref());
            if !ok {
                let found = |v: &Option<String>| v.clone().unwrap_or_else(|| "not reported".into());
                warn_once(&format!(
                    "page_size:1g needs CANN {} and a driver (HDK) of {} or later for 1G \
                     large pages; found CANN {} and driver {}",
                    crate::cann_version::MIN_CANN_VERSION,
                    crate::cann_version::MIN_DRIVER_VERSION,
                    found(&cann),
                    found(&driver),
                ));
            }
            ok
        };
        let pages_1g = config.alloc.page_size.is_some() && huge_pages_1g;
        // Once for the process's chip, as torch_npu's `AddPadSize` keeps its first answer.
        let pad = self.pad();
        Runtime::new(
            count,
            move |index| {
                let facts = DeviceFacts {
                    pad,
                    huge_pages_1g,
                    ..DeviceFacts::npu(index)
                };
                Ok((self.open(index)?.with_1g_pages(pages_1g), facts))
            },
            config,
        )
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
        let _ = KEEP.try_with(|k| {
            let mut k = k.borrow_mut();
            if matches!(*k, Keep::Watching(_)) {
                *k = Keep::Saved(self.lib.clone(), self.id, self.lib.get_device().ok());
            }
        });
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

/// The page size that torch_npu backs with 1 GiB pages (`kExtraLargeBuffer`, `page_size:1g`).
const HUGE1G_PAGE: u64 = 1 << 30;

/// torch_npu's warning when a 1 GiB page falls back to 2 MiB pages (`AclrtMallocPhysical`).
const HUGE1G_FALLBACK_WARNING: &str = concat!(
    "The malloc 1G large-page physical memory failed, so malloc 2M page memory. ",
    "Using the 2M memory page may result in performance degradation. ",
    "This warning occurs because the PYTORCH_NPU_ALLOC_CONF = page_size:1g configuration is ",
    "enabled, but the pre-allocated number of 1G large pages is insufficient or 1G large-page ",
    "memory pre-allocation is not enabled."
);

/// A failed VMM call: a missing symbol or a "not supported" status (207000, 200001, 200006) is
/// [`VmmError::Unsupported`], anything else [`VmmError::Other`].
fn vmm_error(e: AclError) -> VmmError<AclError> {
    if e.is_unsupported() {
        VmmError::Unsupported
    } else {
        VmmError::Other(e)
    }
}

/// A failed `aclrtMallocPhysical`: 207001 is out of memory (torch_npu's
/// `ExpandableSegment::map` checks exactly that code), the rest as [`vmm_error`].
fn page_error(e: AclError) -> VmmError<AclError> {
    if e.code() == Some(ACL_ERROR_RT_MEMORY_ALLOCATION) {
        VmmError::OutOfMemory
    } else {
        vmm_error(e)
    }
}

/// A failed `aclrtMallocHost`: an out-of-memory code or text (207001, 207018, 200000, `EL0004`)
/// is out of memory, the rest as [`vmm_error`].
fn host_error(e: AclError) -> VmmError<AclError> {
    if e.is_out_of_memory() {
        VmmError::OutOfMemory
    } else {
        vmm_error(e)
    }
}

/// A copy of `bytes` bytes that must fit `buffer`, as a `size_t`; refused before ACL is called
/// when it does not.
fn copy_size(bytes: u64, buffer: &HostMem) -> Result<usize, VmmError<AclError>> {
    match usize::try_from(bytes) {
        Ok(count) if count <= buffer.len() => Ok(count),
        _ => Err(refused(
            "aclrtMemcpy",
            format!(
                "{bytes} bytes do not fit the host buffer of {} bytes",
                buffer.len()
            ),
        )),
    }
}

/// An argument refused before ACL is called (a size past `size_t`, address 0), with the code
/// ACL gives a bad argument.
fn refused(function: &'static str, what: String) -> VmmError<AclError> {
    VmmError::Other(AclError::from_code(
        function,
        ACL_ERROR_INVALID_PARAM,
        Some(format!("npu-runtime: {what}")),
    ))
}

/// `bytes` as a `size_t` for `function`.
fn vmm_size(function: &'static str, bytes: u64) -> Result<usize, VmmError<AclError>> {
    usize::try_from(bytes).map_err(|_| refused(function, format!("{bytes} bytes exceed size_t")))
}

/// `addr` as a device address for `function` (never 0).
fn vmm_ptr(function: &'static str, addr: u64) -> Result<DevicePtr, VmmError<AclError>> {
    DevicePtr::from_addr(addr)
        .ok_or_else(|| refused(function, format!("{addr:#x} is not a device address")))
}

/// One ACL device as `alloc-core` drives it: the platform, the device index and its event pool.
pub struct AclDevice {
    platform: AclPlatform,
    index: u32,
    /// Completed events, ready to be recorded again.
    pool: Vec<Event>,
    /// torch_npu's `page_size:1g` in force: segments of whole GiB ask for 1 GiB pages first.
    pages_1g: bool,
}

impl AclDevice {
    /// With `on`, as torch_npu does under `page_size:1g` (where CANN and the driver have 1 GiB
    /// pages): a segment of a whole number of GiB (every large-pool segment then) asks
    /// `aclrtMallocAlign32` for `ACL_MEM_MALLOC_HUGE1G_ONLY` first, and retries once with
    /// `HUGE_FIRST` if that fails, with torch_npu's warning. Off (the default), segments ask
    /// for `HUGE_FIRST`. (A physical page of exactly 1 GiB asks for 1 GiB pages either way, as
    /// torch_npu's expandable segments decide by their page size alone.)
    pub fn with_1g_pages(mut self, on: bool) -> AclDevice {
        self.pages_1g = on;
        self
    }
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
    type Stream = Stream;
    type Event = Event;
    type Error = AclError;
    type Page = PhysicalMem;
    type HostBuffer = HostMem;

    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError<AclError>> {
        let p = &self.platform;
        p.bind(self.index).map_err(DeviceError::Other)?;
        let size = usize::try_from(bytes).map_err(|_| DeviceError::OutOfMemory)?;
        let malloc = |policy| {
            if p.align32 {
                p.lib.malloc_align32(size, policy)
            } else {
                p.lib.malloc(size, policy)
            }
        };
        let result = if self.pages_1g && bytes.is_multiple_of(HUGE1G_PAGE) {
            // torch_npu's `AclrtMallocAlign32`: any failure retries with the usual pages.
            malloc(MemMallocPolicy::HUGE1G_ONLY).or_else(|_| {
                warn_once(HUGE1G_FALLBACK_WARNING);
                malloc(MemMallocPolicy::HUGE_FIRST)
            })
        } else {
            malloc(MemMallocPolicy::HUGE_FIRST)
        };
        match result {
            Ok(ptr) => Ok(ptr.addr()),
            Err(e) if e.is_out_of_memory() => Err(DeviceError::OutOfMemory),
            Err(e) => Err(DeviceError::Other(e)),
        }
    }

    fn free(&mut self, addr: u64, _bytes: u64) -> Result<(), AclError> {
        self.platform.bind(self.index)?;
        self.platform.lib.free(device_ptr(addr)?)
    }

    fn mem_info(&mut self) -> Result<MemInfo, AclError> {
        self.platform.bind(self.index)?;
        let (free, total) = self.platform.lib.get_mem_info(MemAttr::HBM_MEM)?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    /// A failure is said once: the core's free then waits for the whole device instead (a
    /// full synchronization where an event would have done). An event whose record failed is
    /// destroyed, not pooled: it may be what is broken, and the pool hands out the last one
    /// first.
    fn record_event(&mut self, stream: Stream) -> Result<Event, AclError> {
        self.platform.bind(self.index)?;
        let lib = &self.platform.lib;
        let event = match self.pool.pop() {
            Some(event) => event,
            // torch_npu's `AclrtCreateEventWithFlag` prefers the Ex event where the library has
            // it: reusable without reset and not limited in number; it is queried only through
            // `aclrtQueryEventStatus`, so the plain one serves where that is missing.
            None if lib.has_create_event_ex() && lib.has_symbol("aclrtQueryEventStatus") => lib
                .create_event_ex(EventFlags::CAPTURE_STREAM_PROGRESS)
                .inspect_err(|e| self.warn_event_fallback(e))?,
            None => lib
                .create_event(EventFlags::CAPTURE_STREAM_PROGRESS)
                .inspect_err(|e| self.warn_event_fallback(e))?,
        };
        match lib.record_event(&event, stream.0) {
            Ok(()) => Ok(event),
            Err(e) => {
                if let Err(d) = lib.destroy_event(event) {
                    log::warn!("NPU {}: destroying an event failed: {d}", self.index);
                }
                self.warn_event_fallback(&e);
                Err(e)
            }
        }
    }

    fn event_done(&mut self, event: &Event) -> Result<bool, AclError> {
        self.platform.lib.query_event_status(event)
    }

    fn release_event(&mut self, event: Event) {
        self.pool.push(event);
    }

    fn synchronize(&mut self) -> Result<(), AclError> {
        self.platform.bind(self.index)?;
        self.platform.lib.synchronize_device()
    }

    /// `aclrtReserveMemAddress(&va, bytes, 0, NULL, 1)`, as torch_npu reserves.
    fn reserve_address(&mut self, bytes: u64) -> Result<u64, VmmError<AclError>> {
        let p = &self.platform;
        p.bind(self.index).map_err(vmm_error)?;
        let size = vmm_size("aclrtReserveMemAddress", bytes)?;
        p.lib
            .reserve_mem_address(size, 0, RESERVE_MEM_FLAG_COMPAT)
            .map(DevicePtr::addr)
            .map_err(vmm_error)
    }

    /// `aclrtReleaseMemAddress(va)`: ACL takes the start only.
    fn release_address(&mut self, addr: u64, _bytes: u64) -> Result<(), VmmError<AclError>> {
        let p = &self.platform;
        p.bind(self.index).map_err(vmm_error)?;
        let va = vmm_ptr("aclrtReleaseMemAddress", addr)?;
        p.lib.release_mem_address(va).map_err(vmm_error)
    }

    /// `aclrtMallocPhysical(&handle, bytes, prop, 0)` of pinned memory on this device:
    /// `ACL_HBM_MEM_HUGE`, or `ACL_HBM_MEM_HUGE1G` for a 1 GiB page, which is retried once with
    /// `ACL_HBM_MEM_HUGE` when it fails (torch_npu's `AclrtMallocPhysical`, warned once).
    fn create_page(&mut self, bytes: u64) -> Result<PhysicalMem, VmmError<AclError>> {
        let p = &self.platform;
        p.bind(self.index).map_err(vmm_error)?;
        // No page that size can exist, as in `malloc`.
        let size = usize::try_from(bytes).map_err(|_| VmmError::OutOfMemory)?;
        let huge = PhysicalMemProp::device(self.index, MemAttr::HBM_MEM_HUGE);
        if bytes != HUGE1G_PAGE {
            return p.lib.malloc_physical(size, &huge).map_err(page_error);
        }
        let huge1g = PhysicalMemProp::device(self.index, MemAttr::HBM_MEM_HUGE1G);
        match p.lib.malloc_physical(size, &huge1g) {
            // torch_npu retries on any failed status; a missing symbol never reached ACL.
            Err(AclError::Code { .. }) => {
                warn_once(HUGE1G_FALLBACK_WARNING);
                p.lib.malloc_physical(size, &huge).map_err(page_error)
            }
            result => result.map_err(page_error),
        }
    }

    /// `aclrtFreePhysical(handle)`; on failure the page comes back.
    fn release_page(&mut self, page: PhysicalMem) -> Result<(), (PhysicalMem, VmmError<AclError>)> {
        let p = &self.platform;
        if let Err(e) = p.bind(self.index) {
            return Err((page, vmm_error(e)));
        }
        p.lib
            .free_physical(page)
            .map_err(|(page, e)| (page, vmm_error(e)))
    }

    /// `aclrtMapMem(va, bytes, 0, handle, 0)`.
    fn map(&mut self, addr: u64, bytes: u64, page: &PhysicalMem) -> Result<(), VmmError<AclError>> {
        let p = &self.platform;
        p.bind(self.index).map_err(vmm_error)?;
        let va = vmm_ptr("aclrtMapMem", addr)?;
        let size = vmm_size("aclrtMapMem", bytes)?;
        p.lib.map_mem(va, size, 0, page).map_err(vmm_error)
    }

    /// `aclrtUnmapMem(va)`: ACL takes the start of the mapping only.
    fn unmap(&mut self, addr: u64, _bytes: u64) -> Result<(), VmmError<AclError>> {
        let p = &self.platform;
        p.bind(self.index).map_err(vmm_error)?;
        let va = vmm_ptr("aclrtUnmapMem", addr)?;
        p.lib.unmap_mem(va).map_err(vmm_error)
    }

    /// `aclrtMallocHost(&p, bytes)`: pinned host memory of exactly `bytes` bytes.
    fn alloc_host(&mut self, bytes: u64) -> Result<HostMem, VmmError<AclError>> {
        let p = &self.platform;
        p.bind(self.index).map_err(vmm_error)?;
        // No host holds that much, as in `malloc`.
        let size = usize::try_from(bytes).map_err(|_| VmmError::OutOfMemory)?;
        p.lib.malloc_host(size).map_err(host_error)
    }

    /// `aclrtFreeHost(p)`; on failure the buffer comes back.
    fn free_host(&mut self, buffer: HostMem) -> Result<(), (HostMem, VmmError<AclError>)> {
        let p = &self.platform;
        if let Err(e) = p.bind(self.index) {
            return Err((buffer, vmm_error(e)));
        }
        p.lib
            .free_host(buffer)
            .map_err(|(buffer, e)| (buffer, vmm_error(e)))
    }

    /// `aclrtMemcpy(dst, dst.len(), src, bytes, ACL_MEMCPY_DEVICE_TO_HOST)`. More bytes than
    /// the buffer holds are refused before ACL is called; 0 bytes call nothing.
    fn copy_to_host(
        &mut self,
        dst: &mut HostMem,
        src: u64,
        bytes: u64,
    ) -> Result<(), VmmError<AclError>> {
        let count = copy_size(bytes, dst)?;
        if count == 0 {
            return Ok(());
        }
        let p = &self.platform;
        p.bind(self.index).map_err(vmm_error)?;
        let src = vmm_ptr("aclrtMemcpy", src)?;
        p.lib.memcpy_to_host(dst, src, count).map_err(vmm_error)
    }

    /// `aclrtMemcpy(dst, bytes, src, bytes, ACL_MEMCPY_HOST_TO_DEVICE)`. More bytes than the
    /// buffer holds are refused before ACL is called; 0 bytes call nothing.
    fn copy_to_device(
        &mut self,
        dst: u64,
        src: &HostMem,
        bytes: u64,
    ) -> Result<(), VmmError<AclError>> {
        let count = copy_size(bytes, src)?;
        if count == 0 {
            return Ok(());
        }
        let p = &self.platform;
        p.bind(self.index).map_err(vmm_error)?;
        let dst = vmm_ptr("aclrtMemcpy", dst)?;
        p.lib.memcpy_to_device(dst, src, count).map_err(vmm_error)
    }
}

impl AclDevice {
    /// Once per device: a failed event create or record, after which frees of blocks used on
    /// other streams synchronize the device instead.
    #[cold]
    fn warn_event_fallback(&self, e: &AclError) {
        warn_once(&format!(
            "NPU {}: an event for a block used on other streams could not be recorded ({e}): \
             such frees wait for the whole device instead (aclrtSynchronizeDevice)",
            self.index
        ));
    }
}

impl Drop for AclDevice {
    fn drop(&mut self) {
        for event in self.pool.drain(..) {
            if let Err(e) = self.platform.lib.destroy_event(event) {
                log::warn!("NPU {}: destroying a pooled event failed: {e}", self.index);
            }
        }
    }
}

impl NpuAllocator {
    /// The library found by the search path (`$NPU_ALLOC_ACL_LIB`, the CANN install
    /// locations, the system loader) with the environment's configuration.
    pub fn from_env() -> Result<NpuAllocator, AclError> {
        Ok(AclPlatform::search()?.runtime(Config::from_env()))
    }

    /// The library at `path` with an explicit configuration.
    ///
    /// # Safety
    /// As [`AclPlatform::load`]: `path` must be a `libascendcl` or a faithful stand-in.
    pub unsafe fn with_library(
        path: impl AsRef<Path>,
        config: Config,
    ) -> Result<NpuAllocator, AclError> {
        // SAFETY: forwarded to the caller.
        Ok(unsafe { AclPlatform::load(path) }?.runtime(config))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use testkit::fake_acl::{FakeAcl, Variant};

    #[test]
    fn devices_and_pages_cross_threads() {
        fn send<T: Send>() {}
        fn sync<T: Sync>() {}
        send::<AclDevice>();
        send::<PhysicalMem>();
        sync::<PhysicalMem>();
        send::<HostMem>();
        sync::<HostMem>();
    }

    #[test]
    fn host_errors_are_classified() {
        let code = |c| AclError::from_code("aclrtMallocHost", c, None);
        for c in [207_001, 207_018, 200_000] {
            assert_eq!(host_error(code(c)), VmmError::OutOfMemory, "{c}");
        }
        let text = AclError::from_code("aclrtMallocHost", 507_899, Some("EL0004: x".into()));
        assert_eq!(host_error(text), VmmError::OutOfMemory);
        for c in [207_000, 200_001, 200_006] {
            assert_eq!(host_error(code(c)), VmmError::Unsupported, "{c}");
        }
        let missing = AclError::Unsupported {
            symbol: "aclrtMallocHost",
        };
        assert_eq!(host_error(missing), VmmError::Unsupported);
        assert_eq!(host_error(code(507_899)), VmmError::Other(code(507_899)));
    }

    #[test]
    fn vmm_errors_are_classified_as_torch_npu_does() {
        let code = |c| AclError::from_code("aclrtMallocPhysical", c, None);
        assert_eq!(page_error(code(207_001)), VmmError::OutOfMemory);
        assert_eq!(vmm_error(code(207_001)), VmmError::Other(code(207_001)));
        // Only 207001 is out of memory here: torch_npu's map path checks that code alone.
        assert_eq!(page_error(code(207_018)), VmmError::Other(code(207_018)));
        for c in [207_000, 200_001, 200_006] {
            assert_eq!(page_error(code(c)), VmmError::Unsupported, "{c}");
            assert_eq!(vmm_error(code(c)), VmmError::Unsupported, "{c}");
        }
        let missing = AclError::Unsupported {
            symbol: "aclrtMapMem",
        };
        assert_eq!(vmm_error(missing.clone()), VmmError::Unsupported);
        assert_eq!(page_error(missing), VmmError::Unsupported);
        assert_eq!(vmm_error(code(507_899)), VmmError::Other(code(507_899)));
    }

    #[test]
    fn address_zero_is_refused_before_acl() {
        match vmm_ptr("aclrtUnmapMem", 0) {
            Err(VmmError::Other(e)) => {
                assert_eq!(e.code(), Some(ACL_ERROR_INVALID_PARAM));
                assert_eq!(
                    e.to_string(),
                    "aclrtUnmapMem failed with ACL error 100000 (ACL_ERROR_INVALID_PARAM): \
                     npu-runtime: 0x0 is not a device address"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(vmm_size("aclrtMapMem", 2 << 20), Ok(2 << 20));
    }

    #[test]
    fn a_failed_1g_page_falls_back_to_2m_pages_and_warns_once() {
        let fake = FakeAcl::new(Variant::Full, 4 << 30, 1);
        // SAFETY: the fake libascendcl built from this workspace.
        let platform = unsafe { AclPlatform::load(fake.path()) }.unwrap();
        let mut device = platform.open(0).unwrap();
        fake.fail_next("aclrtMallocPhysical", 207_001, 1);
        let page = device.create_page(HUGE1G_PAGE).unwrap();
        assert_eq!(fake.calls("aclrtMallocPhysical"), 2);
        // The fallback logged torch_npu's warning; it is not logged a second time.
        assert!(!warn_once(HUGE1G_FALLBACK_WARNING));
        device.release_page(page).map_err(|(_, e)| e).unwrap();
        assert_eq!(fake.live_pages(0), 0);
    }
}
