//! The fake `libascendcl` (crate `fake-ascendcl`) for end-to-end tests and the runtime stress:
//! built once per process with a nested `cargo build` into its own target directory, then copied
//! to a fresh directory per use, so each user loads its own instance (the dynamic loader keys
//! loaded libraries by file, and each copy has its own statics) and tests can run in parallel.
//!
//! [`FakeAcl`] also reaches the fake's test-only controls (`fake_acl_*`): counters, injected
//! failures, event completion, the bytes in use, the pages, mappings and reserved ranges alive,
//! the device bytes themselves, and the host memory alive.
//! [`Variant`] picks the build: full, legacy CANN, or without the virtual-memory symbols. This
//! is an FFI edge: each control is a C function called through `libloading`, with its exact
//! signature.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use libloading::Library;

/// Which build of the fake.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Variant {
    /// Every symbol the runtime uses.
    Full,
    /// Without `aclrtMallocAlign32`, `aclrtQueryEventStatus` and `aclrtCreateEventExWithFlag`
    /// (feature `legacy-cann`).
    Legacy,
    /// Without the virtual-memory symbols (feature `no-vmm`): `aclrtReserveMemAddress`,
    /// `aclrtReleaseMemAddress`, `aclrtMallocPhysical`, `aclrtFreePhysical`, `aclrtMapMem`,
    /// `aclrtUnmapMem` and `aclrtMemGetAllocationGranularity` are not in the library at all.
    ///
    /// A CANN older than virtual memory lacks these names, and `acl-sys` tells that apart from a
    /// driver that refuses the calls (207000) only by `dlsym` failing. Injected failures cannot
    /// fake a missing symbol, so this build leaves the functions out (`#[cfg]` in the fake's
    /// source) rather than patching names in a copied file: the symbols are truly absent from
    /// `.dynsym`, and everything else is the same code as [`Variant::Full`].
    NoVmm,
}

/// The target directory the running executable was built into: the parent of its profile
/// directory (`<target>/debug/deps/<test>` or `<target>/release/xtask`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    exe.ancestors()
        .find(|dir| {
            dir.file_name()
                .is_some_and(|n| n == "debug" || n == "release")
        })
        .and_then(Path::parent)
        .expect("the executable lies in <target>/<profile>")
        .to_path_buf()
}

/// Builds the fake (once per process and variant) and returns the built file.
pub fn built(variant: Variant) -> &'static Path {
    static FULL: OnceLock<PathBuf> = OnceLock::new();
    static LEGACY: OnceLock<PathBuf> = OnceLock::new();
    static NO_VMM: OnceLock<PathBuf> = OnceLock::new();
    let (cell, name, features) = match variant {
        Variant::Full => (&FULL, "full", None),
        Variant::Legacy => (&LEGACY, "legacy", Some("legacy-cann")),
        Variant::NoVmm => (&NO_VMM, "no-vmm", Some("no-vmm")),
    };
    cell.get_or_init(|| {
        // Its own target directory: no wait on the lock of the `cargo test` that runs us.
        let dir = target_dir().join("fake-ascendcl").join(name);
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(&workspace)
            .args(["build", "--quiet", "-p", "fake-ascendcl", "--target-dir"])
            .arg(&dir);
        if let Some(features) = features {
            cmd.args(["--features", features]);
        }
        let status = cmd.status().expect("run cargo build -p fake-ascendcl");
        assert!(
            status.success(),
            "cargo build -p fake-ascendcl failed: {status}"
        );
        dir.join("debug").join("libfake_ascendcl.so")
    })
}

/// A fresh directory holding a copy of the fake as `libascendcl.so`.
pub fn fresh_copy(variant: Variant) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("npu-runtime-e2e-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the copy's directory");
    std::fs::copy(built(variant), dir.join("libascendcl.so")).expect("copy the fake");
    dir
}

/// One loaded instance of the fake, with its test controls.
pub struct FakeAcl {
    dir: PathBuf,
    lib: Library,
}

impl FakeAcl {
    /// A fresh instance: `devices` devices of `capacity` bytes.
    pub fn new(variant: Variant, capacity: u64, devices: u32) -> FakeAcl {
        let dir = fresh_copy(variant);
        // SAFETY: the file is the fake libascendcl just built from this workspace; its
        // initialisers are Rust's std ones.
        let lib = unsafe { Library::new(dir.join("libascendcl.so")) }.expect("load the fake");
        let fake = FakeAcl { dir, lib };
        // SAFETY: `fake_acl_reset(u64, u32)` is the fake's signature.
        unsafe { fake.sym::<unsafe extern "C" fn(u64, u32)>("fake_acl_reset")(capacity, devices) };
        fake
    }

    /// A symbol of the fake, copied out (valid while `self` lives).
    ///
    /// # Safety
    /// `T` must be the symbol's exact function pointer type.
    unsafe fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: forwarded from the caller.
        *unsafe { self.lib.get::<T>(name.as_bytes()) }.expect("fake control symbol")
    }

    /// The library file.
    pub fn path(&self) -> PathBuf {
        self.dir.join("libascendcl.so")
    }

    /// The directory holding the library file.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Calls of the ACL function `name` since the reset.
    pub fn calls(&self, name: &str) -> u64 {
        let name = CString::new(name).unwrap();
        // SAFETY: the fake's signature; `name` is NUL-terminated and outlives the call.
        unsafe {
            self.sym::<unsafe extern "C" fn(*const c_char) -> u64>("fake_acl_calls")(name.as_ptr())
        }
    }

    /// Makes the next `count` calls of `name` fail with `code`.
    pub fn fail_next(&self, name: &str, code: i32, count: u32) {
        let name = CString::new(name).unwrap();
        // SAFETY: the fake's signature; `name` is NUL-terminated and outlives the call.
        unsafe {
            self.sym::<unsafe extern "C" fn(*const c_char, i32, u32)>("fake_acl_fail_next")(
                name.as_ptr(),
                code,
                count,
            )
        }
    }

    fn unit(&self, name: &str) {
        // SAFETY: the fake's `void f(void)` controls.
        unsafe { self.sym::<unsafe extern "C" fn()>(name)() }
    }

    fn count(&self, name: &str) -> u64 {
        // SAFETY: the fake's `uint64_t f(void)` controls.
        unsafe { self.sym::<unsafe extern "C" fn() -> u64>(name)() }
    }

    fn per_device(&self, name: &str, device: u32) -> u64 {
        // SAFETY: the fake's `uint64_t f(uint32_t)` controls.
        unsafe { self.sym::<unsafe extern "C" fn(u32) -> u64>(name)(device) }
    }

    /// Makes `aclrtGetDeviceCount` report `count` devices, as a broken library would.
    pub fn report_devices(&self, count: u32) {
        // SAFETY: the fake's `void f(uint32_t)` control.
        unsafe { self.sym::<unsafe extern "C" fn(u32)>("fake_acl_report_devices")(count) }
    }

    /// Makes `aclsysGetCANNVersion` report these CANN and driver versions (`None`: the query
    /// fails with 207000) until the next reset.
    pub fn set_versions(&self, cann: Option<&str>, driver: Option<&str>) {
        let (cann, driver) = (OptionalCStr::new(cann), OptionalCStr::new(driver));
        // SAFETY: the fake's `void f(const char *, const char *)` control; both strings are
        // NUL-terminated (or null) and outlive the call.
        unsafe {
            self.sym::<unsafe extern "C" fn(*const c_char, *const c_char)>("fake_acl_set_versions")(
                cann.as_ptr(),
                driver.as_ptr(),
            )
        }
    }

    /// Makes `aclrtGetSocName` return `name` (`None`: null) until the next reset.
    pub fn set_soc_name(&self, name: Option<&str>) {
        let name = OptionalCStr::new(name);
        // SAFETY: the fake's `void f(const char *)` control; the string is NUL-terminated (or
        // null) and outlives the call (the fake copies it).
        unsafe {
            self.sym::<unsafe extern "C" fn(*const c_char)>("fake_acl_set_soc_name")(name.as_ptr())
        }
    }

    /// Drops every injected failure still waiting for its call.
    pub fn clear_failures(&self) {
        self.unit("fake_acl_clear_failures");
    }

    /// Completes every recorded event.
    pub fn complete_all_events(&self) {
        self.unit("fake_acl_complete_all_events");
    }

    /// Events recorded and not complete.
    pub fn pending_events(&self) -> u64 {
        self.count("fake_acl_pending_events")
    }

    /// Events created and not destroyed.
    pub fn live_events(&self) -> u64 {
        self.count("fake_acl_live_events")
    }

    /// Bytes charged on `device`.
    pub fn used(&self, device: u32) -> u64 {
        self.per_device("fake_acl_used", device)
    }

    /// Live device allocations on `device` (`aclrtMalloc*`; pages are counted apart).
    pub fn live_allocations(&self, device: u32) -> u64 {
        self.per_device("fake_acl_live_allocations", device)
    }

    /// Physical pages (`aclrtMallocPhysical`) alive on `device`.
    pub fn live_pages(&self, device: u32) -> u64 {
        self.per_device("fake_acl_live_pages", device)
    }

    /// Bytes of the physical pages alive on `device` (also in [`FakeAcl::used`]).
    pub fn page_bytes(&self, device: u32) -> u64 {
        self.per_device("fake_acl_page_bytes", device)
    }

    /// Mappings (`aclrtMapMem`) alive in `device`'s reserved ranges.
    pub fn mappings(&self, device: u32) -> u64 {
        self.per_device("fake_acl_mappings", device)
    }

    /// Bytes mapped in `device`'s reserved ranges.
    pub fn mapped_bytes(&self, device: u32) -> u64 {
        self.per_device("fake_acl_mapped_bytes", device)
    }

    /// Reserved ranges (`aclrtReserveMemAddress`) alive on `device`.
    pub fn reserved_ranges(&self, device: u32) -> u64 {
        self.per_device("fake_acl_reserved_ranges", device)
    }

    /// Bytes of the reserved ranges alive on `device` (address space, not charged).
    pub fn reserved_bytes(&self, device: u32) -> u64 {
        self.per_device("fake_acl_reserved_bytes", device)
    }

    /// Writes `data` into device memory at `addr` (inside one segment, or across mappings
    /// without a gap); the fake's error code when the range is not device memory (107000). Not an
    /// ACL call: not counted or logged.
    pub fn write_device(&self, addr: u64, data: &[u8]) -> Result<(), i32> {
        // SAFETY: the fake's `int32_t f(uint64_t, const uint8_t *, size_t)` control; `data` is
        // readable for `data.len()` bytes.
        let code =
            unsafe {
                self.sym::<unsafe extern "C" fn(u64, *const u8, usize) -> i32>(
                    "fake_acl_write_device",
                )(addr, data.as_ptr(), data.len())
            };
        if code == 0 { Ok(()) } else { Err(code) }
    }

    /// Reads `len` bytes of device memory at `addr` (zeros where never written); the fake's
    /// error code when the range is not device memory (107000). Not an ACL call.
    pub fn read_device(&self, addr: u64, len: usize) -> Result<Vec<u8>, i32> {
        let mut buf = vec![0u8; len];
        // SAFETY: the fake's `int32_t f(uint64_t, uint8_t *, size_t)` control; `buf` is writable
        // for `len` bytes.
        let code = unsafe {
            self.sym::<unsafe extern "C" fn(u64, *mut u8, usize) -> i32>("fake_acl_read_device")(
                addr,
                buf.as_mut_ptr(),
                len,
            )
        };
        if code == 0 { Ok(buf) } else { Err(code) }
    }

    /// Host allocations (`aclrtMallocHost`) alive.
    pub fn live_host_buffers(&self) -> u64 {
        self.count("fake_acl_live_host_buffers")
    }

    /// Host memory the fake holds for the written bytes of `device`'s segments and pages (whole
    /// 4 KiB chunks; 0 while nothing non-zero was written).
    pub fn content_bytes(&self, device: u32) -> u64 {
        self.per_device("fake_acl_content_bytes", device)
    }

    /// One of the fake's `size_t f(uint8_t *buf, size_t len)` text controls, split at `sep`.
    fn text(&self, name: &str, sep: char) -> Vec<String> {
        // SAFETY: the fake's signature; a null buffer only asks for the length.
        let f = unsafe { self.sym::<unsafe extern "C" fn(*mut u8, usize) -> usize>(name) };
        // SAFETY: as above.
        let len = unsafe { f(std::ptr::null_mut(), 0) };
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` is writable for `len` bytes.
        unsafe { f(buf.as_mut_ptr(), len) };
        let text = String::from_utf8(buf).unwrap();
        text.split(sep)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The ACL calls since the last [`FakeAcl::clear_log`].
    pub fn log(&self) -> Vec<String> {
        self.text("fake_acl_call_log", ',')
    }

    /// [`FakeAcl::log`] with the arguments of `aclrtSetDevice`, the VMM calls and the host
    /// calls, e.g.
    /// `aclrtMapMem(virPtr=0x800000000000, size=2097152, offset=0, handle=0x90000010, flags=0)`
    /// or `aclrtMemcpy(dst=0x.., destMax=4096, src=0x.., count=4096, kind=2)`; other calls are
    /// bare names.
    pub fn call_details(&self) -> Vec<String> {
        self.text("fake_acl_call_details", '\n')
    }

    /// Empties the call log.
    pub fn clear_log(&self) {
        self.unit("fake_acl_clear_log");
    }
}

impl Drop for FakeAcl {
    fn drop(&mut self) {
        // The mapping outlives the file; only the copy on disk goes.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A string argument of the fake's controls that may be null.
struct OptionalCStr(Option<CString>);

impl OptionalCStr {
    fn new(text: Option<&str>) -> OptionalCStr {
        OptionalCStr(text.map(|t| CString::new(t).expect("no NUL")))
    }

    /// The pointer to pass: null for `None`, valid while `self` lives.
    fn as_ptr(&self) -> *const c_char {
        self.0.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
    }
}
