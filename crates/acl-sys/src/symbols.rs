//! The typed function table of `libascendcl.so` and the safe wrappers over it.
//!
//! [`Lib`] owns the `libloading::Library` and plain function pointers copied out of it. Copying
//! them out is sound because the pointers never leave the struct and the struct owns the library,
//! so the library stays mapped for as long as any pointer can be called (libloading's `Symbol`
//! borrow, made structural).
//!
//! Each symbol is resolved on its own:
//! - [`REQUIRED_SYMBOLS`] must all be present;
//! - of each group in [`REQUIRED_ONE_OF`] at least one must be present;
//! - [`OPTIONAL_SYMBOLS`] may be missing; the wrapper then returns [`AclError::Unsupported`].
//!
//! A library that lacks required symbols fails to load with [`AclError::MissingSymbols`] naming
//! all of them at once.
//!
//! Handle safety: events, streams and physical-memory handles are host pointers to runtime
//! objects, so they travel as [`Event`], [`Stream`] and [`PhysicalMem`], which only this crate
//! creates (or an `unsafe fn from_raw`); the event and physical handles are consumed by their
//! destroy calls (a failed [`Lib::free_physical`] hands its handle back). Device addresses
//! ([`DevicePtr`], from malloc and reserve) are never dereferenced by the host: the runtime
//! validates them and an invalid one gives an error code, so the calls that take them are safe
//! functions.
//!
//! Host memory from `aclrtMallocHost` is real host memory: it travels as [`HostMem`], which
//! knows its size, owns the allocation until [`Lib::free_host`] consumes it (a failed free hands
//! it back), and is the only host memory the safe copies ([`Lib::memcpy_to_host`],
//! [`Lib::memcpy_to_device`]) touch, within its size.

use core::ffi::{CStr, c_char, c_void};
use core::fmt;
use core::ptr::{self, NonNull};
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::error::{
    ACL_ERROR_INVALID_PARAM, ACL_ERROR_REPEAT_INITIALIZE, ACL_ERROR_RT_EVENT_NOT_COMPLETE,
    ACL_ERROR_RT_MEMORY_ALLOCATION, AclError,
};
use crate::types::{
    AclCode, CannPackage, CannPackageVersion, DevicePtr, EventFlags, EventRecordedStatus,
    EventStatus, MemAttr, MemGranularityOptions, MemMallocPolicy, MemcpyKind, PhysicalMemProp,
    RawDrvMemHandle, RawEvent, RawStream,
};

/// Result of this crate's calls.
pub type Result<T, E = AclError> = core::result::Result<T, E>;

/// Resolves one symbol as `Option<T>`: `None` when it is absent or null.
///
/// # Safety
/// `T` must be the `unsafe extern "C" fn` pointer type of the symbol's real C signature.
unsafe fn lookup<T: Copy>(library: &Library, name: &str) -> Option<T> {
    // SAFETY: the caller guarantees that `T` is the symbol's type. `Option<fn>` has the size of
    // a pointer and maps a null symbol to `None`, so no null function pointer is ever made.
    let symbol = unsafe { library.get::<Option<T>>(name.as_bytes()) }.ok()?;
    *symbol
}

macro_rules! acl_functions {
    (
        required { $( $r:ident ( $($ra:ty),* ) -> $rr:ty; )* }
        optional { $( $o:ident ( $($oa:ty),* ) -> $or:ty; )* }
        one_of { $( [ $($g:ident),+ ] )* }
    ) => {
        /// Symbols every usable `libascendcl.so` must export; loading fails without any of them.
        pub const REQUIRED_SYMBOLS: &[&str] = &[$(stringify!($r)),*];

        /// Groups of alternatives: each group needs at least one member exported.
        pub const REQUIRED_ONE_OF: &[&[&str]] = &[$( &[$(stringify!($g)),+] ),*];

        /// Symbols that may be missing (including the members of [`REQUIRED_ONE_OF`]); a call
        /// needing one that is absent returns [`AclError::Unsupported`].
        pub const OPTIONAL_SYMBOLS: &[&str] = &[$(stringify!($o)),*];

        #[allow(non_snake_case)]
        #[derive(Clone, Copy)]
        struct Functions {
            $( $r: unsafe extern "C" fn($($ra),*) -> $rr, )*
            $( $o: Option<unsafe extern "C" fn($($oa),*) -> $or>, )*
        }

        impl Functions {
            /// Resolves every symbol; on failure returns every missing required name.
            ///
            /// # Safety
            /// `library` must be a `libascendcl` whose symbols of these names have the C
            /// signatures declared above (CANN's `acl_rt.h`; docs/acl.md).
            #[allow(non_snake_case)]
            unsafe fn resolve(library: &Library) -> core::result::Result<Self, Vec<&'static str>> {
                let mut missing: Vec<&'static str> = Vec::new();
                $(
                    // SAFETY: the caller guarantees the signature declared for this name.
                    let $r = unsafe {
                        lookup::<unsafe extern "C" fn($($ra),*) -> $rr>(library, stringify!($r))
                    };
                    if $r.is_none() {
                        missing.push(stringify!($r));
                    }
                )*
                $(
                    // SAFETY: as above.
                    let $o = unsafe {
                        lookup::<unsafe extern "C" fn($($oa),*) -> $or>(library, stringify!($o))
                    };
                )*
                $(
                    if $( $g.is_none() )&&+ {
                        missing.extend([$(stringify!($g)),+]);
                    }
                )*
                match ($($r,)*) {
                    ($(Some($r),)*) if missing.is_empty() => Ok(Functions { $($r,)* $($o,)* }),
                    _ => Err(missing),
                }
            }

            /// Whether `symbol` was resolved (`false` for names not in the table).
            fn has(&self, symbol: &str) -> bool {
                match symbol {
                    $( stringify!($r) => true, )*
                    $( stringify!($o) => self.$o.is_some(), )*
                    _ => false,
                }
            }
        }
    };
}

acl_functions! {
    required {
        aclInit(*const c_char) -> AclCode;
        aclFinalize() -> AclCode;
        aclrtSetDevice(i32) -> AclCode;
        aclrtGetDevice(*mut i32) -> AclCode;
        aclrtGetDeviceCount(*mut u32) -> AclCode;
        aclrtMalloc(*mut *mut c_void, usize, MemMallocPolicy) -> AclCode;
        aclrtFree(*mut c_void) -> AclCode;
        aclrtGetMemInfo(MemAttr, *mut usize, *mut usize) -> AclCode;
        aclrtSynchronizeDevice() -> AclCode;
        aclrtRecordEvent(RawEvent, RawStream) -> AclCode;
        aclrtSynchronizeEvent(RawEvent) -> AclCode;
        aclrtDestroyEvent(RawEvent) -> AclCode;
    }
    optional {
        aclrtCreateEventWithFlag(*mut RawEvent, u32) -> AclCode;
        aclrtCreateEvent(*mut RawEvent) -> AclCode;
        aclrtQueryEventStatus(RawEvent, *mut EventRecordedStatus) -> AclCode;
        aclrtQueryEvent(RawEvent, *mut EventStatus) -> AclCode;
        aclrtCreateEventExWithFlag(*mut RawEvent, u32) -> AclCode;
        aclGetRecentErrMsg() -> *const c_char;
        aclrtResetDevice(i32) -> AclCode;
        aclrtMallocAlign32(*mut *mut c_void, usize, MemMallocPolicy) -> AclCode;
        aclrtFreeWithDevSync(*mut c_void) -> AclCode;
        aclrtCreateStream(*mut RawStream) -> AclCode;
        aclrtDestroyStream(RawStream) -> AclCode;
        aclrtSynchronizeStream(RawStream) -> AclCode;
        aclrtStreamWaitEvent(RawStream, RawEvent) -> AclCode;
        aclrtMemcpy(*mut c_void, usize, *const c_void, usize, MemcpyKind) -> AclCode;
        aclrtMallocHost(*mut *mut c_void, usize) -> AclCode;
        aclrtFreeHost(*mut c_void) -> AclCode;
        aclrtReserveMemAddress(*mut *mut c_void, usize, usize, *mut c_void, u64) -> AclCode;
        aclrtReleaseMemAddress(*mut c_void) -> AclCode;
        aclrtMallocPhysical(*mut RawDrvMemHandle, usize, *const PhysicalMemProp, u64) -> AclCode;
        aclrtFreePhysical(RawDrvMemHandle) -> AclCode;
        aclrtMapMem(*mut c_void, usize, usize, RawDrvMemHandle, u64) -> AclCode;
        aclrtUnmapMem(*mut c_void) -> AclCode;
        aclrtMemGetAllocationGranularity(*mut PhysicalMemProp, MemGranularityOptions, *mut usize) -> AclCode;
        aclsysGetCANNVersion(CannPackage, *mut CannPackageVersion) -> AclCode;
        aclrtGetSocName() -> *const c_char;
    }
    one_of {
        [aclrtCreateEventWithFlag, aclrtCreateEvent]
        [aclrtQueryEventStatus, aclrtQueryEvent]
    }
}

/// Calls a no-argument ACL query that returns a C string and copies the text out (lossily);
/// `None` for null.
///
/// # Safety
/// `f` must take no arguments and return null or a pointer to a NUL-terminated string that
/// stays valid until this function has copied it.
unsafe fn query_text(f: unsafe extern "C" fn() -> *const c_char) -> Option<String> {
    // SAFETY: per this function's contract.
    unsafe {
        let p = f();
        (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
    }
}

/// The most devices a library may report: far above any machine's NPU count (torch_npu is built
/// for 16), far below a garbage count.
pub const MAX_DEVICES: u32 = 1024;

/// The VMM symbols expandable segments need (granularity is optional: callers fall back to
/// 2 MiB).
pub const VMM_SYMBOLS: &[&str] = &[
    "aclrtReserveMemAddress",
    "aclrtReleaseMemAddress",
    "aclrtMallocPhysical",
    "aclrtFreePhysical",
    "aclrtMapMem",
    "aclrtUnmapMem",
];

/// The host-memory symbols the memory saver's CPU backup needs: pinned host memory and the
/// synchronous copy between it and the device (all optional).
pub const HOST_COPY_SYMBOLS: &[&str] = &["aclrtMallocHost", "aclrtFreeHost", "aclrtMemcpy"];

/// What `aclInit` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitStatus {
    /// This call initialised ACL; the caller owns the matching `aclFinalize`.
    Initialized,
    /// ACL was already initialised (code 100002); torch_npu then skips `aclFinalize`.
    AlreadyInitialized,
}

/// An ACL event created through [`Lib`]; destroy it with [`Lib::destroy_event`] (dropping it
/// leaks the runtime object).
#[derive(PartialEq, Eq, Hash)]
pub struct Event(RawEvent);

// SAFETY: an `aclrtEvent` is a process-wide runtime object usable from any thread; ACL's event
// calls are thread-safe and this wrapper never dereferences the pointer itself.
unsafe impl Send for Event {}
// SAFETY: as above; shared access only passes the handle value to ACL.
unsafe impl Sync for Event {}

impl Event {
    /// Wraps a handle created elsewhere.
    ///
    /// # Safety
    /// `raw` must be a live `aclrtEvent` of the library it will be used with, and stay live
    /// until it is destroyed through [`Lib::destroy_event`] or released with
    /// [`Event::into_raw`].
    pub unsafe fn from_raw(raw: RawEvent) -> Self {
        Event(raw)
    }

    /// The handle value.
    pub fn as_raw(&self) -> RawEvent {
        self.0
    }

    /// Gives up ownership of the handle without destroying it.
    pub fn into_raw(self) -> RawEvent {
        self.0
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event({:p})", self.0)
    }
}

/// An ACL stream handle; [`Stream::DEFAULT`] (null) is the current device's default stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stream(RawStream);

// SAFETY: an `aclrtStream` is a process-wide runtime object; this wrapper never dereferences it.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// The default stream of the thread's current device (a null `aclrtStream`).
    pub const DEFAULT: Stream = Stream(ptr::null_mut());

    /// Wraps a stream created elsewhere (e.g. by torch_npu, handed over as an integer).
    ///
    /// # Safety
    /// `raw` must be null or a live `aclrtStream` of the library it will be used with, for as
    /// long as this value or a copy of it is used.
    pub unsafe fn from_raw(raw: RawStream) -> Self {
        Stream(raw)
    }

    /// The handle value.
    pub fn as_raw(self) -> RawStream {
        self.0
    }

    /// Whether this is the default stream.
    pub fn is_default(self) -> bool {
        self.0.is_null()
    }
}

impl Default for Stream {
    fn default() -> Self {
        Stream::DEFAULT
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({:p})", self.0)
    }
}

/// A physical memory handle from [`Lib::malloc_physical`]; give it back with
/// [`Lib::free_physical`] (dropping it leaks the memory; a failed free returns it).
#[derive(PartialEq, Eq, Hash)]
pub struct PhysicalMem(RawDrvMemHandle);

// SAFETY: an `aclrtDrvMemHandle` is a process-wide runtime object; never dereferenced here.
unsafe impl Send for PhysicalMem {}
// SAFETY: as above.
unsafe impl Sync for PhysicalMem {}

impl PhysicalMem {
    /// Wraps a handle allocated elsewhere.
    ///
    /// # Safety
    /// `raw` must be a live `aclrtDrvMemHandle` of the library it will be used with, and stay
    /// live until it is freed through [`Lib::free_physical`] or released with
    /// [`PhysicalMem::into_raw`].
    pub unsafe fn from_raw(raw: RawDrvMemHandle) -> Self {
        PhysicalMem(raw)
    }

    /// The handle value.
    pub fn as_raw(&self) -> RawDrvMemHandle {
        self.0
    }

    /// Gives up ownership of the handle without freeing it.
    pub fn into_raw(self) -> RawDrvMemHandle {
        self.0
    }
}

impl fmt::Debug for PhysicalMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PhysicalMem({:p})", self.0)
    }
}

/// Host memory from [`Lib::malloc_host`] (`aclrtMallocHost`): `len` bytes at a non-null host
/// address, owned by this value. Give it back with [`Lib::free_host`] (dropping it leaks the
/// memory; a failed free returns it). [`Lib::memcpy_to_host`] and [`Lib::memcpy_to_device`] copy
/// between it and device memory; the bytes can also be read and written directly.
#[derive(PartialEq, Eq, Hash)]
pub struct HostMem {
    ptr: NonNull<c_void>,
    len: usize,
}

// SAFETY: the allocation is plain host memory owned by this value alone (it is not `Clone` and
// nothing else keeps its address), and ACL's host-memory calls may be made from any thread.
unsafe impl Send for HostMem {}
// SAFETY: shared access only reads the bytes (`as_slice`) or hands the address to ACL as the
// source of a copy; every write (`as_mut_slice`, a copy into it) needs `&mut`.
unsafe impl Sync for HostMem {}

impl HostMem {
    /// Wraps host memory allocated elsewhere.
    ///
    /// # Safety
    /// `ptr` must be the start of a live `aclrtMallocHost` allocation of the library it will be
    /// used with, valid for reads and writes of `len` bytes (`len` at most `isize::MAX`), used
    /// by nothing else while this value lives, until it is freed through [`Lib::free_host`] or
    /// released with [`HostMem::into_raw`].
    pub unsafe fn from_raw(ptr: NonNull<c_void>, len: usize) -> Self {
        HostMem { ptr, len }
    }

    /// The host address.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr.as_ptr()
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the memory is valid for reads of `len ≤ isize::MAX` bytes and owned by this
        // value (the type's invariant); nothing writes it while `&self` is borrowed, since writes
        // need `&mut`. Host memory handed out by the runtime holds defined bytes (pinned pages
        // the driver mapped; the fake zeroes them), as any memory an FFI call returns.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr().cast::<u8>(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, and `&mut self` makes this the only access.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr().cast::<u8>(), self.len) }
    }

    /// Gives up ownership without freeing: the address and the size.
    pub fn into_raw(self) -> (NonNull<c_void>, usize) {
        (self.ptr, self.len)
    }
}

impl fmt::Debug for HostMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostMem({:p}, {} bytes)", self.ptr, self.len)
    }
}

/// A loaded `libascendcl.so`: the library and its resolved function table.
pub struct Lib {
    functions: Functions,
    path: PathBuf,
    // Declared last: dropped (dlclose) after everything else.
    _library: Library,
}

impl fmt::Debug for Lib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lib")
            .field("path", &self.path)
            .field("missing_optional", &self.missing_optional())
            .finish()
    }
}

/// Calls an optional function, or returns `Unsupported` naming it.
macro_rules! optional {
    ($self:ident . $name:ident) => {
        match $self.functions.$name {
            Some(f) => f,
            None => {
                return Err(AclError::Unsupported {
                    symbol: stringify!($name),
                })
            }
        }
    };
}

impl Lib {
    /// Builds the table from an opened library, checking every required symbol.
    ///
    /// # Safety
    /// `library` must be a `libascendcl` (or a stand-in exporting the same C signatures under
    /// these names).
    pub(crate) unsafe fn from_library(library: Library, path: PathBuf) -> Result<Self> {
        // SAFETY: forwarded from the caller.
        match unsafe { Functions::resolve(&library) } {
            Ok(functions) => Ok(Lib {
                functions,
                path,
                _library: library,
            }),
            Err(symbols) => Err(AclError::MissingSymbols {
                library: path,
                symbols,
            }),
        }
    }

    /// The path the library was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the library exports `symbol` (one of [`REQUIRED_SYMBOLS`] or
    /// [`OPTIONAL_SYMBOLS`]; `false` for any other name).
    pub fn has_symbol(&self, symbol: &str) -> bool {
        self.functions.has(symbol)
    }

    /// The optional symbols this library lacks.
    pub fn missing_optional(&self) -> Vec<&'static str> {
        OPTIONAL_SYMBOLS
            .iter()
            .copied()
            .filter(|s| !self.functions.has(s))
            .collect()
    }

    /// Whether `aclrtMallocAlign32` is exported (else callers fall back to `aclrtMalloc`).
    pub fn has_malloc_align32(&self) -> bool {
        self.functions.aclrtMallocAlign32.is_some()
    }

    /// Whether `aclrtCreateEventExWithFlag` is exported (torch_npu prefers it when present).
    pub fn has_create_event_ex(&self) -> bool {
        self.functions.aclrtCreateEventExWithFlag.is_some()
    }

    /// Whether `aclrtFreeWithDevSync` is exported.
    pub fn has_free_with_dev_sync(&self) -> bool {
        self.functions.aclrtFreeWithDevSync.is_some()
    }

    /// Whether every symbol of [`HOST_COPY_SYMBOLS`] is exported (host memory and copies).
    pub fn has_host_copies(&self) -> bool {
        HOST_COPY_SYMBOLS.iter().all(|s| self.functions.has(s))
    }

    /// Whether every symbol of [`VMM_SYMBOLS`] is exported (expandable segments still need a
    /// run-time probe: the driver may refuse with 207000).
    pub fn has_vmm(&self) -> bool {
        VMM_SYMBOLS.iter().all(|s| self.functions.has(s))
    }

    /// Turns a status into a result, reading the thread's recent error text on failure.
    fn check(&self, function: &'static str, code: AclCode) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(AclError::from_code(function, code, self.recent_err_msg()))
        }
    }

    /// The calling thread's most recent ACL error text (`aclGetRecentErrMsg`), if the library
    /// exports it and there is one.
    pub fn recent_err_msg(&self) -> Option<String> {
        // SAFETY: `aclGetRecentErrMsg` takes no arguments and returns null or a pointer to a
        // NUL-terminated thread-local string, which is copied out before any other ACL call on
        // this thread could overwrite it.
        let text = unsafe { query_text(self.functions.aclGetRecentErrMsg?) }?;
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_owned())
    }

    /// The chip's name (`aclrtGetSocName`, as `Ascend910B1` or `Ascend950PR_9599`); `None`
    /// when the library lacks the function or returns null.
    pub fn soc_name(&self) -> Option<String> {
        // SAFETY: `aclrtGetSocName` takes no arguments and returns null or a pointer to a
        // NUL-terminated string that the library keeps for the process's life.
        unsafe { query_text(self.functions.aclrtGetSocName?) }
    }

    /// `aclInit(configPath)`; `None` passes NULL. Repeat initialisation is not an error.
    pub fn init(&self, config_path: Option<&CStr>) -> Result<InitStatus> {
        let path = config_path.map_or(ptr::null(), CStr::as_ptr);
        // SAFETY: `path` is NULL or a NUL-terminated string that outlives the call.
        let code = unsafe { (self.functions.aclInit)(path) };
        if code == ACL_ERROR_REPEAT_INITIALIZE {
            return Ok(InitStatus::AlreadyInitialized);
        }
        self.check("aclInit", code)
            .map(|()| InitStatus::Initialized)
    }

    /// `aclFinalize()`.
    pub fn finalize(&self) -> Result<()> {
        // SAFETY: no arguments.
        let code = unsafe { (self.functions.aclFinalize)() };
        self.check("aclFinalize", code)
    }

    /// `aclrtSetDevice(device)`: binds the device to the calling thread.
    pub fn set_device(&self, device: i32) -> Result<()> {
        // SAFETY: plain integer argument.
        let code = unsafe { (self.functions.aclrtSetDevice)(device) };
        self.check("aclrtSetDevice", code)
    }

    /// `aclrtResetDevice(device)` (optional).
    pub fn reset_device(&self, device: i32) -> Result<()> {
        let f = optional!(self.aclrtResetDevice);
        // SAFETY: plain integer argument.
        let code = unsafe { f(device) };
        self.check("aclrtResetDevice", code)
    }

    /// `aclrtGetDevice`: the calling thread's current device (an error if none was set).
    pub fn get_device(&self) -> Result<i32> {
        let mut device = 0i32;
        // SAFETY: the out-pointer is a valid, writable local.
        let code = unsafe { (self.functions.aclrtGetDevice)(&mut device) };
        self.check("aclrtGetDevice", code).map(|()| device)
    }

    /// `aclrtGetDeviceCount`: visible devices (honours `ASCEND_RT_VISIBLE_DEVICES`).
    ///
    /// A count above [`MAX_DEVICES`] is [`AclError::ImplausibleResult`]: no machine has that many
    /// NPUs, and a runtime would size its tables by it.
    pub fn device_count(&self) -> Result<u32> {
        let mut count = 0u32;
        // SAFETY: the out-pointer is a valid, writable local.
        let code = unsafe { (self.functions.aclrtGetDeviceCount)(&mut count) };
        self.check("aclrtGetDeviceCount", code)?;
        if count > MAX_DEVICES {
            return Err(AclError::ImplausibleResult {
                function: "aclrtGetDeviceCount",
                value: u64::from(count),
                limit: u64::from(MAX_DEVICES),
            });
        }
        Ok(count)
    }

    /// `aclrtMalloc(&p, size, policy)` on the current device. ACL pads the size (+32 bytes).
    pub fn malloc(&self, size: usize, policy: MemMallocPolicy) -> Result<DevicePtr> {
        let mut p = ptr::null_mut();
        // SAFETY: the out-pointer is a valid, writable local; the others are plain values.
        let code = unsafe { (self.functions.aclrtMalloc)(&mut p, size, policy) };
        self.check("aclrtMalloc", code)?;
        DevicePtr::new(p).ok_or(AclError::NullResult {
            function: "aclrtMalloc",
        })
    }

    /// `aclrtMallocAlign32(&p, size, policy)`: 32-byte aligned, no padding (optional; the
    /// fallback to [`Lib::malloc`] is the caller's choice).
    pub fn malloc_align32(&self, size: usize, policy: MemMallocPolicy) -> Result<DevicePtr> {
        let f = optional!(self.aclrtMallocAlign32);
        let mut p = ptr::null_mut();
        // SAFETY: the out-pointer is a valid, writable local; the others are plain values.
        let code = unsafe { f(&mut p, size, policy) };
        self.check("aclrtMallocAlign32", code)?;
        DevicePtr::new(p).ok_or(AclError::NullResult {
            function: "aclrtMallocAlign32",
        })
    }

    /// `aclrtFree(ptr)`: frees at once, with **no** implicit synchronization.
    pub fn free(&self, ptr: DevicePtr) -> Result<()> {
        // SAFETY: `ptr` is a device address, never dereferenced on the host; ACL validates it
        // and returns an error for an unknown one.
        let code = unsafe { (self.functions.aclrtFree)(ptr.as_ptr()) };
        self.check("aclrtFree", code)
    }

    /// `aclrtFreeWithDevSync(ptr)`: synchronizes the device, then frees (optional, newer CANN).
    pub fn free_with_dev_sync(&self, ptr: DevicePtr) -> Result<()> {
        let f = optional!(self.aclrtFreeWithDevSync);
        // SAFETY: as for `free`.
        let code = unsafe { f(ptr.as_ptr()) };
        self.check("aclrtFreeWithDevSync", code)
    }

    /// `aclsysGetCANNVersion(package, &version)` (optional, CANN 8.1 and later): the package's
    /// version string, as `8.1.RC1` or `25.0.rc1`.
    pub fn cann_version(&self, package: CannPackage) -> Result<String> {
        let f = optional!(self.aclsysGetCANNVersion);
        let mut version = CannPackageVersion::default();
        // SAFETY: the out-pointer is a valid, writable local of the C struct's layout, which the
        // function fills in (512 bytes).
        let code = unsafe { f(package, &mut version) };
        self.check("aclsysGetCANNVersion", code)?;
        Ok(version.version())
    }

    /// `aclrtGetMemInfo(attr, &free, &total)` for the current device: `(free, total)` bytes.
    pub fn get_mem_info(&self, attr: MemAttr) -> Result<(usize, usize)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both out-pointers are valid, writable locals.
        let code = unsafe { (self.functions.aclrtGetMemInfo)(attr, &mut free, &mut total) };
        self.check("aclrtGetMemInfo", code).map(|()| (free, total))
    }

    /// `aclrtSynchronizeDevice()`: waits for all work on the current device.
    pub fn synchronize_device(&self) -> Result<()> {
        // SAFETY: no arguments.
        let code = unsafe { (self.functions.aclrtSynchronizeDevice)() };
        self.check("aclrtSynchronizeDevice", code)
    }

    /// `aclrtCreateStream` (optional).
    pub fn create_stream(&self) -> Result<Stream> {
        let f = optional!(self.aclrtCreateStream);
        let mut s = ptr::null_mut();
        // SAFETY: the out-pointer is a valid, writable local.
        let code = unsafe { f(&mut s) };
        self.check("aclrtCreateStream", code)?;
        non_null("aclrtCreateStream", s).map(Stream)
    }

    /// `aclrtDestroyStream` (optional). Synchronize the stream first.
    ///
    /// # Safety
    /// `stream` must be a live stream of this library that no copy of the handle will be used
    /// with afterwards (`Stream` is `Copy`). That includes the caching allocator: a block
    /// recorded on the stream (`record_stream`) gets an event recorded on it when it is freed,
    /// and that event is polled until it completes. Free such blocks, and let the allocator
    /// process their events (any `malloc`, or `empty_cache`), before destroying the stream.
    pub unsafe fn destroy_stream(&self, stream: Stream) -> Result<()> {
        let f = optional!(self.aclrtDestroyStream);
        // SAFETY: the caller guarantees the stream is live and not used afterwards.
        let code = unsafe { f(stream.0) };
        self.check("aclrtDestroyStream", code)
    }

    /// `aclrtSynchronizeStream` (optional): waits for the work queued on `stream`.
    pub fn synchronize_stream(&self, stream: Stream) -> Result<()> {
        let f = optional!(self.aclrtSynchronizeStream);
        // SAFETY: `Stream` values are null or live streams (the `from_raw` contract).
        let code = unsafe { f(stream.0) };
        self.check("aclrtSynchronizeStream", code)
    }

    /// `aclrtStreamWaitEvent(stream, event)` (optional): later work on `stream` waits for it.
    pub fn stream_wait_event(&self, stream: Stream, event: &Event) -> Result<()> {
        let f = optional!(self.aclrtStreamWaitEvent);
        // SAFETY: both handles are live by their types' contracts.
        let code = unsafe { f(stream.0, event.0) };
        self.check("aclrtStreamWaitEvent", code)
    }

    /// Creates an event: `aclrtCreateEventWithFlag(&ev, flags)`, or `aclrtCreateEvent(&ev)`
    /// (which ignores `flags`) when the library has only that.
    pub fn create_event(&self, flags: EventFlags) -> Result<Event> {
        let mut ev = ptr::null_mut();
        let (function, code) = if let Some(f) = self.functions.aclrtCreateEventWithFlag {
            // SAFETY: the out-pointer is a valid, writable local; `flags` is a plain value.
            ("aclrtCreateEventWithFlag", unsafe {
                f(&mut ev, flags.bits())
            })
        } else if let Some(f) = self.functions.aclrtCreateEvent {
            // SAFETY: the out-pointer is a valid, writable local.
            ("aclrtCreateEvent", unsafe { f(&mut ev) })
        } else {
            // Unreachable for a loaded `Lib` (one of the two is required); kept panic-free.
            return Err(AclError::Unsupported {
                symbol: "aclrtCreateEventWithFlag",
            });
        };
        self.check(function, code)?;
        non_null(function, ev).map(Event)
    }

    /// `aclrtCreateEventExWithFlag(&ev, flags)` (optional): reusable without reset, query only
    /// through `aclrtQueryEventStatus`.
    pub fn create_event_ex(&self, flags: EventFlags) -> Result<Event> {
        let f = optional!(self.aclrtCreateEventExWithFlag);
        let mut ev = ptr::null_mut();
        // SAFETY: the out-pointer is a valid, writable local; `flags` is a plain value.
        let code = unsafe { f(&mut ev, flags.bits()) };
        self.check("aclrtCreateEventExWithFlag", code)?;
        non_null("aclrtCreateEventExWithFlag", ev).map(Event)
    }

    /// `aclrtRecordEvent(event, stream)`.
    pub fn record_event(&self, event: &Event, stream: Stream) -> Result<()> {
        // SAFETY: both handles are live by their types' contracts.
        let code = unsafe { (self.functions.aclrtRecordEvent)(event.0, stream.0) };
        self.check("aclrtRecordEvent", code)
    }

    /// Whether the work before `event` has completed, with torch_npu's polarity:
    /// `aclrtQueryEventStatus` reports COMPLETE as 1 (an event never recorded is not complete);
    /// without it, `aclrtQueryEvent` reports COMPLETE as 0 and 507006 means not ready.
    pub fn query_event_status(&self, event: &Event) -> Result<bool> {
        if let Some(f) = self.functions.aclrtQueryEventStatus {
            let mut status = EventRecordedStatus::NOT_READY;
            // SAFETY: the event is live by its type's contract; the out-pointer is a local.
            let code = unsafe { f(event.0, &mut status) };
            if code == ACL_ERROR_RT_EVENT_NOT_COMPLETE {
                return Ok(false);
            }
            self.check("aclrtQueryEventStatus", code)?;
            Ok(status == EventRecordedStatus::COMPLETE)
        } else if let Some(f) = self.functions.aclrtQueryEvent {
            let mut status = EventStatus::NOT_READY;
            // SAFETY: the event is live by its type's contract; the out-pointer is a local.
            let code = unsafe { f(event.0, &mut status) };
            if code == ACL_ERROR_RT_EVENT_NOT_COMPLETE {
                return Ok(false);
            }
            self.check("aclrtQueryEvent", code)?;
            Ok(status == EventStatus::COMPLETE)
        } else {
            // Unreachable for a loaded `Lib` (one of the two is required); kept panic-free.
            Err(AclError::Unsupported {
                symbol: "aclrtQueryEventStatus",
            })
        }
    }

    /// `aclrtSynchronizeEvent(event)`: blocks the host until the event completes.
    pub fn synchronize_event(&self, event: &Event) -> Result<()> {
        // SAFETY: the event is live by its type's contract.
        let code = unsafe { (self.functions.aclrtSynchronizeEvent)(event.0) };
        self.check("aclrtSynchronizeEvent", code)
    }

    /// `aclrtDestroyEvent(event)`. No task may still wait on it. On failure the handle is lost.
    pub fn destroy_event(&self, event: Event) -> Result<()> {
        // SAFETY: the event is live and, being moved in, never used again.
        let code = unsafe { (self.functions.aclrtDestroyEvent)(event.0) };
        self.check("aclrtDestroyEvent", code)
    }

    /// `aclrtMemcpy(dst, dst_max, src, count, kind)` (optional; synchronous).
    ///
    /// # Safety
    /// Host-side ranges named by `kind` must be valid: `dst` writable for `dst_max` bytes when
    /// it is host memory, `src` readable for `count` bytes when it is host memory.
    pub unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        dst_max: usize,
        src: *const c_void,
        count: usize,
        kind: MemcpyKind,
    ) -> Result<()> {
        let f = optional!(self.aclrtMemcpy);
        // SAFETY: the caller guarantees the host ranges.
        let code = unsafe { f(dst, dst_max, src, count, kind) };
        self.check("aclrtMemcpy", code)
    }

    /// `aclrtMallocHost(&p, size)` (optional): `size` bytes of pinned host memory, owned by the
    /// returned [`HostMem`]. A size above `isize::MAX` is refused before ACL is called, as out of
    /// memory (207001 with an `acl-sys:` message): no host holds it, and Rust cannot address it.
    pub fn malloc_host(&self, size: usize) -> Result<HostMem> {
        let f = optional!(self.aclrtMallocHost);
        if isize::try_from(size).is_err() {
            return Err(AclError::from_code(
                "aclrtMallocHost",
                ACL_ERROR_RT_MEMORY_ALLOCATION,
                Some(format!(
                    "acl-sys: {size} bytes of host memory exceed isize::MAX"
                )),
            ));
        }
        let mut p = ptr::null_mut();
        // SAFETY: the out-pointer is a valid, writable local; `size` is a plain value.
        let code = unsafe { f(&mut p, size) };
        self.check("aclrtMallocHost", code)?;
        let ptr = NonNull::new(p).ok_or(AclError::NullResult {
            function: "aclrtMallocHost",
        })?;
        Ok(HostMem { ptr, len: size })
    }

    /// `aclrtFreeHost(hostPtr)` (optional).
    ///
    /// On failure (a status other than 0, or the symbol missing) the memory comes back with the
    /// error: ACL did not free it, so it is still live and the caller still owns it.
    pub fn free_host(&self, mem: HostMem) -> Result<(), (HostMem, AclError)> {
        let Some(f) = self.functions.aclrtFreeHost else {
            let error = AclError::Unsupported {
                symbol: "aclrtFreeHost",
            };
            return Err((mem, error));
        };
        // SAFETY: the memory is a live `aclrtMallocHost` allocation by its type's contract. On
        // success ACL has freed it and, moved in, it is never used again; on failure ACL did not
        // free it and it goes back to the caller.
        let code = unsafe { f(mem.ptr.as_ptr()) };
        match self.check("aclrtFreeHost", code) {
            Ok(()) => Ok(()),
            Err(e) => Err((mem, e)),
        }
    }

    /// `aclrtMemcpy(dst, dst.len(), src, count, ACL_MEMCPY_DEVICE_TO_HOST)` (optional;
    /// synchronous): `count` bytes of device memory at `src` into the start of `dst`. A `count`
    /// above `dst.len()` is refused before ACL is called (100000 with an `acl-sys:` message).
    pub fn memcpy_to_host(&self, dst: &mut HostMem, src: DevicePtr, count: usize) -> Result<()> {
        let f = optional!(self.aclrtMemcpy);
        check_host_fits(count, dst)?;
        // SAFETY: `dst` is host memory valid for writes of `dst.len()` bytes (`HostMem`'s
        // invariant), borrowed mutably, so nothing else touches it during this synchronous copy;
        // ACL writes at most `destMax = dst.len()` bytes, and `count ≤ dst.len()` was checked.
        // `src` is a device address, validated by ACL and never dereferenced on the host.
        let code = unsafe {
            f(
                dst.as_ptr(),
                dst.len(),
                src.as_ptr(),
                count,
                MemcpyKind::DEVICE_TO_HOST,
            )
        };
        self.check("aclrtMemcpy", code)
    }

    /// `aclrtMemcpy(dst, count, src, count, ACL_MEMCPY_HOST_TO_DEVICE)` (optional;
    /// synchronous): the first `count` bytes of `src` to device memory at `dst`. A `count` above
    /// `src.len()` is refused before ACL is called (100000 with an `acl-sys:` message).
    pub fn memcpy_to_device(&self, dst: DevicePtr, src: &HostMem, count: usize) -> Result<()> {
        let f = optional!(self.aclrtMemcpy);
        check_host_fits(count, src)?;
        // SAFETY: `src` is host memory valid for reads of `src.len() ≥ count` bytes (`HostMem`'s
        // invariant, and the check above); it is borrowed shared, so nothing writes it during
        // this synchronous copy. `dst` is a device address, validated by ACL and never
        // dereferenced on the host.
        let code = unsafe {
            f(
                dst.as_ptr(),
                count,
                src.as_ptr().cast_const(),
                count,
                MemcpyKind::HOST_TO_DEVICE,
            )
        };
        self.check("aclrtMemcpy", code)
    }

    /// `aclrtReserveMemAddress(&va, size, alignment, NULL, flags)` (optional, VMM): a virtual
    /// range with no memory behind it. torch_npu passes alignment 0 and flags
    /// [`RESERVE_MEM_FLAG_COMPAT`](crate::RESERVE_MEM_FLAG_COMPAT).
    pub fn reserve_mem_address(
        &self,
        size: usize,
        alignment: usize,
        flags: u64,
    ) -> Result<DevicePtr> {
        let f = optional!(self.aclrtReserveMemAddress);
        let mut va = ptr::null_mut();
        // SAFETY: the out-pointer is a valid, writable local; expectPtr must be NULL.
        let code = unsafe { f(&mut va, size, alignment, ptr::null_mut(), flags) };
        self.check("aclrtReserveMemAddress", code)?;
        DevicePtr::new(va).ok_or(AclError::NullResult {
            function: "aclrtReserveMemAddress",
        })
    }

    /// `aclrtReleaseMemAddress(va)` (optional, VMM).
    pub fn release_mem_address(&self, va: DevicePtr) -> Result<()> {
        let f = optional!(self.aclrtReleaseMemAddress);
        // SAFETY: a device virtual address, validated by ACL, never dereferenced on the host.
        let code = unsafe { f(va.as_ptr()) };
        self.check("aclrtReleaseMemAddress", code)
    }

    /// `aclrtMallocPhysical(&handle, size, prop, 0)` (optional, VMM). 207001 here is OOM.
    pub fn malloc_physical(&self, size: usize, prop: &PhysicalMemProp) -> Result<PhysicalMem> {
        let f = optional!(self.aclrtMallocPhysical);
        let mut handle = ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; `prop` is a live `repr(C)` value of the C
        // layout; flags must be 0.
        let code = unsafe { f(&mut handle, size, prop, 0) };
        self.check("aclrtMallocPhysical", code)?;
        non_null("aclrtMallocPhysical", handle).map(PhysicalMem)
    }

    /// `aclrtFreePhysical(handle)` (optional, VMM). Unmap it first.
    ///
    /// On failure (a status other than 0, or the symbol missing) the handle comes back with the
    /// error: ACL did not free it, so it is still live and the caller still owns it.
    pub fn free_physical(&self, handle: PhysicalMem) -> Result<(), (PhysicalMem, AclError)> {
        let Some(f) = self.functions.aclrtFreePhysical else {
            let error = AclError::Unsupported {
                symbol: "aclrtFreePhysical",
            };
            return Err((handle, error));
        };
        // SAFETY: the handle is live by its type's contract. On success ACL has freed it and,
        // moved in, it is never used again; on failure ACL did not free it and it goes back to
        // the caller.
        let code = unsafe { f(handle.0) };
        match self.check("aclrtFreePhysical", code) {
            Ok(()) => Ok(()),
            Err(e) => Err((handle, e)),
        }
    }

    /// `aclrtMapMem(va, size, offset, handle, 0)` (optional, VMM): backs `size` bytes at `va`
    /// with `handle` from `offset`.
    pub fn map_mem(
        &self,
        va: DevicePtr,
        size: usize,
        offset: usize,
        handle: &PhysicalMem,
    ) -> Result<()> {
        let f = optional!(self.aclrtMapMem);
        // SAFETY: `va` is a device virtual address validated by ACL; the handle is live by its
        // type's contract; flags must be 0.
        let code = unsafe { f(va.as_ptr(), size, offset, handle.0, 0) };
        self.check("aclrtMapMem", code)
    }

    /// `aclrtUnmapMem(va)` (optional, VMM): unmaps the mapping that starts at `va`.
    pub fn unmap_mem(&self, va: DevicePtr) -> Result<()> {
        let f = optional!(self.aclrtUnmapMem);
        // SAFETY: a device virtual address, validated by ACL.
        let code = unsafe { f(va.as_ptr()) };
        self.check("aclrtUnmapMem", code)
    }

    /// `aclrtMemGetAllocationGranularity(prop, option, &g)` (optional, newer headers only;
    /// callers fall back to 2 MiB).
    pub fn mem_get_allocation_granularity(
        &self,
        prop: &PhysicalMemProp,
        option: MemGranularityOptions,
    ) -> Result<usize> {
        let f = optional!(self.aclrtMemGetAllocationGranularity);
        // The C signature takes a non-const pointer; pass a copy so `prop` is never written.
        let mut prop = *prop;
        let mut granularity = 0usize;
        // SAFETY: both pointers are valid, writable locals.
        let code = unsafe { f(&mut prop, option, &mut granularity) };
        self.check("aclrtMemGetAllocationGranularity", code)
            .map(|()| granularity)
    }
}

/// Refuses a copy of `count` bytes that does not fit `host`, before ACL is called.
fn check_host_fits(count: usize, host: &HostMem) -> Result<()> {
    if count <= host.len() {
        Ok(())
    } else {
        Err(AclError::from_code(
            "aclrtMemcpy",
            ACL_ERROR_INVALID_PARAM,
            Some(format!(
                "acl-sys: {count} bytes do not fit the host buffer of {} bytes",
                host.len()
            )),
        ))
    }
}

/// Maps a null result of a successful call to [`AclError::NullResult`].
fn non_null(function: &'static str, p: *mut c_void) -> Result<*mut c_void> {
    if p.is_null() {
        Err(AclError::NullResult { function })
    } else {
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbol_lists_are_disjoint_and_complete() {
        for r in REQUIRED_SYMBOLS {
            assert!(!OPTIONAL_SYMBOLS.contains(r), "{r}");
        }
        for group in REQUIRED_ONE_OF {
            assert!(group.len() >= 2);
            for s in *group {
                assert!(OPTIONAL_SYMBOLS.contains(s), "{s}");
            }
        }
        for s in VMM_SYMBOLS.iter().chain(HOST_COPY_SYMBOLS) {
            assert!(OPTIONAL_SYMBOLS.contains(s), "{s}");
        }
        assert_eq!(OPTIONAL_SYMBOLS.len(), 25);
        assert_eq!(REQUIRED_SYMBOLS.len(), 12);
        assert!(REQUIRED_SYMBOLS.contains(&"aclrtGetMemInfo"));
        assert!(OPTIONAL_SYMBOLS.contains(&"aclrtMallocAlign32"));
        assert!(OPTIONAL_SYMBOLS.contains(&"aclGetRecentErrMsg"));
        assert!(OPTIONAL_SYMBOLS.contains(&"aclrtGetSocName"));
    }

    #[test]
    fn handles_are_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<Lib>();
        check::<Event>();
        check::<Stream>();
        check::<PhysicalMem>();
        check::<HostMem>();
        assert!(Stream::DEFAULT.is_default());
        assert!(Stream::default().as_raw().is_null());
    }

    #[test]
    fn host_mem_is_its_bytes_and_checks_copy_sizes() {
        let mut backing = vec![7u8; 16];
        let ptr = NonNull::new(backing.as_mut_ptr().cast::<c_void>()).unwrap();
        // SAFETY: `backing` is valid for 16 bytes, outlives `mem`, and is not touched while
        // `mem` lives; `mem` is released with `into_raw`, never freed through ACL.
        let mut mem = unsafe { HostMem::from_raw(ptr, 16) };
        assert_eq!((mem.len(), mem.is_empty()), (16, false));
        assert_eq!(mem.as_ptr(), ptr.as_ptr());
        assert_eq!(mem.as_slice(), &[7; 16]);
        mem.as_mut_slice()[3] = 9;
        assert_eq!(mem.as_slice()[3], 9);
        assert_eq!(check_host_fits(16, &mem), Ok(()));
        let e = check_host_fits(17, &mem).unwrap_err();
        assert_eq!(e.code(), Some(ACL_ERROR_INVALID_PARAM));
        assert_eq!(
            e.to_string(),
            "aclrtMemcpy failed with ACL error 100000 (ACL_ERROR_INVALID_PARAM): \
             acl-sys: 17 bytes do not fit the host buffer of 16 bytes"
        );
        assert!(format!("{mem:?}").ends_with(", 16 bytes)"));
        assert_eq!(mem.into_raw(), (ptr, 16));
        assert_eq!(backing[3], 9);
    }

    #[test]
    fn non_null_maps_null() {
        assert_eq!(
            non_null("aclrtMalloc", ptr::null_mut()),
            Err(AclError::NullResult {
                function: "aclrtMalloc"
            })
        );
        let mut x = 0u8;
        let p = (&raw mut x).cast::<c_void>();
        assert_eq!(non_null("aclrtMalloc", p), Ok(p));
    }
}
