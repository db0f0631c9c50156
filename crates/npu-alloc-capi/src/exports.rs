//! The exported functions.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;

use alloc_core::PoolId;
use npu_runtime::{AclError, NpuAllocator, RuntimeError, Stream, keeping_current_device};

use crate::error::{Fail, NpuAllocStatus, last_error, or, status};
use crate::hook::synchronize_before_release;

/// The process-wide runtime, or why it could not be made.
static RUNTIME: OnceLock<Result<NpuAllocator, String>> = OnceLock::new();

/// The process-wide runtime, made on first use; why not, if it could not be.
pub(crate) fn runtime() -> Result<&'static NpuAllocator, Fail> {
    RUNTIME
        .get_or_init(|| {
            crate::stderr_log::install();
            let rt = NpuAllocator::from_env().map_err(|e| {
                // A library not found says where to point NPU_ALLOC_ACL_LIB itself.
                let message = format!("cannot start npu-alloc: {e}");
                // Said once here as well: under torch_npu a failed malloc shows only as
                // "Get data_ptr failed", and every later call fails with this same error.
                warn(format_args!("{message}"));
                message
            })?;
            // Until a synchronize hook is set, a malloc never gives cached memory back: work
            // torch_npu queued on the host may still use it (docs/c-abi.md).
            crate::hook::apply_at_start(&rt);
            Ok(rt)
        })
        .as_ref()
        .map_err(|e| Fail::new(NpuAllocStatus::NotInitialized, e))
}

/// The runtime once [`runtime`] has made it, waiting for a start under way; never starts it.
pub(crate) fn started_runtime() -> Option<&'static NpuAllocator> {
    RUNTIME.wait().as_ref().ok()
}

/// [`status`] for a call that may act on a device other than the caller's thread's (every
/// device, or the one it names, which it may open): the thread's ACL device is bound again
/// afterwards, as torch_npu expects ([`keeping_current_device`]).
pub(crate) fn status_keeping_device(f: impl FnOnce() -> Result<(), Fail>) -> NpuAllocStatus {
    status(|| keeping_current_device(f))
}

fn device(device: c_int) -> Result<u32, Fail> {
    u32::try_from(device).map_err(|_| Fail::invalid(format!("invalid device {device}")))
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `s` is null or points at a NUL-terminated string that stays valid for the call.
unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if s.is_null() {
        return Err(Fail::invalid(format!("{what} is a null pointer")));
    }
    // SAFETY: non-null, and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|e| Fail::invalid(format!("{what} is not UTF-8: {e}")))
}

/// An `aclrtStream` handle as the runtime's stream (NULL: the default stream).
///
/// # Safety
/// `s` is NULL or a live `aclrtStream` of the device it is used on.
unsafe fn stream(s: *mut c_void) -> Stream {
    // SAFETY: the caller's contract is `Stream::from_raw`'s.
    unsafe { Stream::from_raw(s) }
}

/// Writes one line to stderr; a closed stderr is not an error (`eprintln!` would panic, and a
/// panic must not cross the C boundary).
pub(crate) fn warn(message: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "npu-alloc: {message}");
}

/// torch_npu's pluggable `alloc`: `size` bytes on `device` for use on `stream`. NULL for a
/// zero-size request (no error) and on failure (the reason in the last error; for out of
/// memory, torch_npu's message).
///
/// # Safety
/// `stream` is NULL (the default stream) or a live `aclrtStream` of `device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    // SAFETY: forwarded from the caller's contract.
    or(core::ptr::null_mut(), || unsafe {
        malloc(size, device, stream)
    })
}

/// [`npu_alloc_malloc`] with a status: `*ptr` gets the address (NULL for size 0) on success and
/// is left as it was on failure; [`NpuAllocStatus::OutOfMemory`] with torch_npu's message,
/// [`NpuAllocStatus::Refused`] in a paused memory-saver region, and so on.
///
/// # Safety
/// `stream` is NULL (the default stream) or a live `aclrtStream` of `device`; `ptr` is a
/// writable `void *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_malloc_checked(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    ptr: *mut *mut c_void,
) -> NpuAllocStatus {
    status(|| {
        if ptr.is_null() {
            return Err(Fail::invalid("malloc_checked: null ptr"));
        }
        // SAFETY: forwarded from the caller's contract.
        let p = unsafe { malloc(size, device, stream) }?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *ptr = p };
        Ok(())
    })
}

/// The malloc of both exports.
///
/// # Safety
/// As [`npu_alloc_malloc`].
unsafe fn malloc(size: usize, device: c_int, stream: *mut c_void) -> Result<*mut c_void, Fail> {
    if size == 0 {
        return Ok(core::ptr::null_mut());
    }
    let d = self::device(device)?;
    // SAFETY: forwarded from the caller's contract.
    let stream = unsafe { self::stream(stream) };
    let rt = runtime()?;
    // The device named may not be the caller's, and the host program may have moved the
    // thread's device since the library last bound one (torch's `set_device`): a miss binds
    // the named device for its ACL calls without trusting that cache, and binds the caller's
    // back. A hit makes no ACL call (two thread-local accesses more).
    let addr = keeping_current_device(|| rt.malloc(size as u64, d, stream))?;
    Ok(addr as usize as *mut c_void)
}

/// torch_npu's pluggable `free`. `size`, `device` and `stream` are what torch_npu recorded at
/// allocation; the block is found by its address. NULL does nothing; a pointer this library did
/// not return, or a double free, changes nothing and sets the last error (and warns on stderr
/// once per thread).
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_free(
    ptr: *mut c_void,
    _size: usize,
    _device: c_int,
    _stream: *mut c_void,
) {
    if npu_alloc_free_checked(ptr) != NpuAllocStatus::Ok {
        thread_local!(static WARNED: core::cell::Cell<bool> = const { core::cell::Cell::new(false) });
        if !WARNED.with(|w| w.replace(true)) {
            warn(format_args!("npu_alloc_free: {}", last_error()));
        }
    }
}

/// `free(ptr)` with a status: [`NpuAllocStatus::UnknownPointer`] for a pointer this library did
/// not return or a double free (nothing changes). NULL does nothing, and does not start the
/// library.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_free_checked(ptr: *mut c_void) -> NpuAllocStatus {
    if ptr.is_null() {
        return NpuAllocStatus::Ok;
    }
    // Recording a block's events, or (without caching) synchronizing before the device free,
    // binds the block's device, which need not be the caller's.
    status_keeping_device(|| {
        let (rt, addr) = (runtime()?, ptr as usize as u64);
        match rt.free(addr) {
            // Used on other streams, with the synchronize hook set: drained first.
            Err(RuntimeError::Free(alloc_core::FreeError::DrainFirst { .. })) => {
                Ok(rt.free_after_drain(addr)?)
            }
            result => Ok(result?),
        }
    })
}

/// torch_npu's `init_fn(device_count)`: starts the runtime (loads ACL); nothing else to do.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_init(_device_count: c_int) {
    or((), || runtime().map(|_| ()));
}

/// torch_npu's `reset_fn(check_error)`, called by `torch.npu.empty_cache()`: the synchronize
/// hook, then `empty_cache`. Errors go to the last error (and stderr with `check_error`).
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_reset(check_error: bool) {
    let status = npu_alloc_empty_cache();
    if check_error {
        warn_if_refused("empty_cache", status);
    }
}

/// For a torch_npu hook that returns nothing: a refusal goes to stderr as well as the last
/// error, where torch_npu's own allocator would raise.
fn warn_if_refused(what: &str, status: NpuAllocStatus) {
    if status != NpuAllocStatus::Ok {
        warn(format_args!("{what}: {}", last_error()));
    }
}

/// Writes `value()` into the caller's `out`; a null `out` is refused (`InvalidArgument` with
/// `missing`) before anything runs.
///
/// # Safety
/// `out` is null or writable.
pub(crate) unsafe fn write_out<T>(
    out: *mut T,
    missing: &str,
    value: impl FnOnce() -> Result<T, Fail>,
) -> Result<(), Fail> {
    if out.is_null() {
        return Err(Fail::invalid(missing));
    }
    let value = value()?;
    // SAFETY: non-null and writable by the caller's contract.
    unsafe { *out = value };
    Ok(())
}

/// torch_npu's `memory_fraction_fn(fraction, device)`. The hook returns nothing, so an error
/// (a fraction outside 0 to 1, an unknown device) goes to stderr as well as the last error.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_set_memory_fraction(fraction: f64, device: c_int) {
    warn_if_refused(
        "set_per_process_memory_fraction",
        npu_alloc_set_per_process_memory_fraction(fraction, device),
    );
}

/// torch_npu's `base_alloc_fn(ptr, size)`: for a live allocation `ptr` (an address
/// `npu_alloc_malloc` returned and not freed, as torch's `get_allocated_block` finds it), the
/// start of its segment, and the segment's size in `*size` (when `size` is not NULL); `ptr`
/// itself, `*size` untouched, for any other address.
///
/// # Safety
/// `size` is null or points at a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_base_alloc(ptr: *mut c_void, size: *mut usize) -> *mut c_void {
    or(ptr, || {
        let addr = ptr as usize as u64;
        let rt = runtime()?;
        for d in 0..rt.device_count() {
            for seg in rt.memory_snapshot(d)? {
                let live = |b: &alloc_core::BlockInfo| {
                    b.address == addr && b.state == alloc_core::BlockState::ActiveAllocated
                };
                if seg.blocks.iter().any(live) {
                    if !size.is_null() {
                        // SAFETY: non-null and writable by the caller's contract.
                        unsafe { *size = seg.total_size as usize };
                    }
                    return Ok(seg.address as usize as *mut c_void);
                }
            }
        }
        Ok(ptr)
    })
}

/// torch_npu's `c10_npu::NPUStream`, as its record/erase hooks receive it (by invisible
/// reference): `c10::Stream`'s device type, device index and stream id.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NpuAllocStreamRepr {
    /// `c10::DeviceType` (PrivateUse1 for NPU).
    pub device_type: i8,
    /// The device index.
    pub device_index: i8,
    /// torch_npu's stream id: not an `aclrtStream`.
    pub stream_id: i64,
}

/// torch_npu's `record_stream_fn(ptr, stream)`. torch_npu hands an `NPUStream` whose id is not
/// an `aclrtStream` handle, and npu-alloc records events on handles, so this hook only checks
/// its arguments: call [`npu_alloc_record_stream_handle`] with the stream's handle (the Python
/// package does, from `stream.npu_stream`).
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_record_stream(ptr: *mut c_void, stream: *const NpuAllocStreamRepr) {
    or((), || {
        if ptr.is_null() || stream.is_null() {
            return Err(Fail::invalid("record_stream: null pointer"));
        }
        Ok(())
    });
}

/// torch_npu's `erase_stream_fn(ptr, stream)`: a no-op, as [`npu_alloc_record_stream`] records
/// nothing (it cannot read the stream's handle from its arguments), so there is nothing to
/// undo. With handles, [`npu_alloc_erase_stream_handle`] undoes
/// [`npu_alloc_record_stream_handle`].
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_erase_stream(_ptr: *mut c_void, _stream: *const NpuAllocStreamRepr) {}

/// torch_npu's `eraseStream(ptr, stream)` with the stream's `aclrtStream` handle: undoes
/// [`npu_alloc_record_stream_handle`], so that freeing `ptr` waits for no work on `stream`. As
/// in torch_npu, call it only for an allocation made on its device's current stream (npu-alloc
/// does not know which stream is current). A NULL `ptr` is [`NpuAllocStatus::InvalidArgument`];
/// a pointer that is not a live allocation, [`NpuAllocStatus::UnknownPointer`].
///
/// # Safety
/// `stream` is NULL (the default stream) or a live `aclrtStream` of the block's device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_erase_stream_handle(
    ptr: *mut c_void,
    stream: *mut c_void,
) -> NpuAllocStatus {
    // SAFETY: forwarded from the caller's contract.
    unsafe { stream_use("erase_stream", ptr, stream, NpuAllocator::erase_stream) }
}

/// `record_stream(ptr, stream)` with the stream's `aclrtStream` handle: the block's memory is
/// reused only after the work queued on `stream` when it is freed has completed. A NULL `ptr`
/// is [`NpuAllocStatus::InvalidArgument`].
///
/// # Safety
/// `stream` is NULL (the default stream) or a live `aclrtStream` of the block's device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_record_stream_handle(
    ptr: *mut c_void,
    stream: *mut c_void,
) -> NpuAllocStatus {
    // SAFETY: forwarded from the caller's contract.
    unsafe { stream_use("record_stream", ptr, stream, NpuAllocator::record_stream) }
}

/// `record_stream` or `erase_stream` (`change`, named `what` in errors) of `ptr` on the stream
/// handle `stream`; a NULL `ptr` is [`NpuAllocStatus::InvalidArgument`].
///
/// # Safety
/// `stream` is NULL (the default stream) or a live `aclrtStream` of the block's device.
unsafe fn stream_use(
    what: &str,
    ptr: *mut c_void,
    stream: *mut c_void,
    change: fn(&NpuAllocator, u64, Stream) -> Result<(), RuntimeError<AclError>>,
) -> NpuAllocStatus {
    status(|| {
        if ptr.is_null() {
            return Err(Fail::invalid(format!("{what}: null pointer")));
        }
        // SAFETY: forwarded from the caller's contract.
        let stream = unsafe { self::stream(stream) };
        Ok(change(runtime()?, ptr as usize as u64, stream)?)
    })
}

/// torch_npu's `reset_peak_status_fn(device)`: `reset_peak_memory_stats`. The device is an
/// `int8_t`, torch's `DeviceIndex`, as torch_npu calls the hook: read as an `int`, the bits
/// above the first byte would be whatever the caller's register held.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_reset_peak_stats(device: i8) {
    warn_if_refused(
        "reset_peak_memory_stats",
        npu_alloc_reset_peak_memory_stats(c_int::from(device)),
    );
}

/// torch's `reset_peak_memory_stats(device)`: every peak becomes its current value.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_reset_peak_memory_stats(device: c_int) -> NpuAllocStatus {
    status(|| Ok(runtime()?.reset_peak_memory_stats(self::device(device)?)?))
}

/// `torch.npu.empty_cache()`: the synchronize hook (if set), then every whole free segment of
/// every device goes back.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_empty_cache() -> NpuAllocStatus {
    status_keeping_device(|| {
        let rt = runtime()?;
        synchronize_before_release(rt, None)?;
        Ok(rt.empty_cache()?)
    })
}

/// torch_npu's `empty_virt_addr_cache()`: as `npu_alloc_empty_cache`, but the pages unmapped
/// from expandable segments are kept for later maps instead of freed (`npu_alloc_empty_cache`
/// frees them). `Refused` without `expandable_segments:True`, with torch_npu's message.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_empty_virt_addr_cache() -> NpuAllocStatus {
    status_keeping_device(|| {
        let rt = runtime()?;
        rt.check_expandable()?;
        synchronize_before_release(rt, None)?;
        Ok(rt.empty_virt_addr_cache()?)
    })
}

/// `memory_stats(device)` as a JSON object of torch's flat keys, NUL-terminated, into `buf`
/// (`len` bytes). `*needed` (when not NULL) gets the length with the NUL; a buffer too small
/// gets nothing and the status says so.
///
/// # Safety
/// `buf` is null or writable for `len` bytes; `needed` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_memory_stats(
    device: c_int,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> NpuAllocStatus {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        text_status(buf, len, needed, || {
            let stats = runtime()?.memory_stats(self::device(device)?)?;
            let map: serde_json::Map<String, serde_json::Value> =
                stats.into_iter().map(|(k, v)| (k, v.into())).collect();
            Ok(serde_json::Value::Object(map).to_string())
        })
    }
}

/// torch's `memory_summary(device, abbreviated)`: torch_npu's table, NUL-terminated, into `buf`
/// (`len` bytes), as [`npu_alloc_memory_stats`].
///
/// # Safety
/// `buf` is null or writable for `len` bytes; `needed` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_memory_summary(
    device: c_int,
    abbreviated: bool,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> NpuAllocStatus {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        text_status(buf, len, needed, || {
            Ok(runtime()?.memory_summary(self::device(device)?, abbreviated)?)
        })
    }
}

/// torch's `reset_accumulated_memory_stats(device)`: the allocated and freed totals and the
/// `num_*` counters go back to 0.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_reset_accumulated_stats(device: c_int) -> NpuAllocStatus {
    status(|| Ok(runtime()?.reset_accumulated_memory_stats(self::device(device)?)?))
}

/// The status of an export that writes `text`'s result into a caller's buffer: the text and a
/// NUL if they fit, the needed length to `needed`.
///
/// # Safety
/// As [`npu_alloc_memory_stats`].
unsafe fn text_status(
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
    text: impl FnOnce() -> Result<String, Fail>,
) -> NpuAllocStatus {
    status(|| {
        let text = text()?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy_out(&text, buf, len, needed) }
    })
}

/// Copies `text` and a NUL into `buf` if it fits; writes the needed length to `needed`.
///
/// # Safety
/// As [`npu_alloc_memory_stats`].
unsafe fn copy_out(
    text: &str,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> Result<(), Fail> {
    let want = text.len() + 1;
    if !needed.is_null() {
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *needed = want };
    }
    if buf.is_null() || len < want {
        return Err(Fail::new(
            NpuAllocStatus::BufferTooSmall,
            format!("the buffer holds {len} bytes; {want} are needed"),
        ));
    }
    // SAFETY: `buf` is writable for `len >= want` bytes and does not overlap `text`.
    unsafe {
        core::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        *buf.add(text.len()) = 0;
    }
    Ok(())
}

/// This thread's last error as text, NUL-terminated, into `buf` (`len` bytes, truncated to fit;
/// NULL only asks). Returns the length the whole text needs, with the NUL (0 only if npu-alloc
/// panicked, which it catches).
///
/// # Safety
/// `buf` is null or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_last_error(buf: *mut c_char, len: usize) -> usize {
    let copy = || {
        let text = last_error();
        if !buf.is_null() && len > 0 {
            let n = text.len().min(len - 1);
            // SAFETY: `buf` is writable for `len > n` bytes by the caller's contract.
            unsafe {
                core::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        text.len() + 1
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(copy)).unwrap_or(0)
}

/// `torch.npu.mem_get_info(device)`: free and total device memory.
///
/// # Safety
/// `free` and `total` are writable `size_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_mem_get_info(
    device: c_int,
    free: *mut usize,
    total: *mut usize,
) -> NpuAllocStatus {
    status_keeping_device(|| {
        if free.is_null() || total.is_null() {
            return Err(Fail::invalid("mem_get_info: null pointer"));
        }
        let (f, t) = runtime()?.mem_get_info(self::device(device)?)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe {
            *free = f as usize;
            *total = t as usize;
        }
        Ok(())
    })
}

/// `torch.npu.set_per_process_memory_fraction(fraction, device)`; NaN or outside [0, 1] is
/// refused and changes nothing.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_set_per_process_memory_fraction(
    fraction: f64,
    device: c_int,
) -> NpuAllocStatus {
    status_keeping_device(|| {
        Ok(runtime()?.set_per_process_memory_fraction(fraction, self::device(device)?)?)
    })
}

/// `torch.npu.get_per_process_memory_fraction(device)` into `*fraction`: the fraction set for
/// the device, 1.0 when unlimited.
///
/// # Safety
/// `fraction` is a writable `double`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_get_per_process_memory_fraction(
    device: c_int,
    fraction: *mut f64,
) -> NpuAllocStatus {
    status(|| {
        // SAFETY: `fraction` is null or writable by the caller's contract.
        unsafe {
            write_out(
                fraction,
                "get_per_process_memory_fraction: null pointer",
                || Ok(runtime()?.get_per_process_memory_fraction(self::device(device)?)?),
            )
        }
    })
}

/// `torch.npu.memory._set_allocator_settings(settings)` on every device. A key torch_npu does
/// not take there (known or not) refuses the whole string, as torch_npu raises: `Refused`, and
/// nothing changes. Each other warning about the string (a bad value, an unsupported key: the
/// rest of the string still applies) is written to stderr.
///
/// # Safety
/// `settings` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_set_allocator_settings(
    settings: *const c_char,
) -> NpuAllocStatus {
    status_keeping_device(|| {
        // SAFETY: forwarded from the caller's contract.
        let s = unsafe { text(settings, "settings") }?;
        // Each warning reaches stderr through the runtime's log (once per text, as torch's
        // TORCH_WARN_ONCE).
        let warnings = runtime()?.set_allocator_settings(s);
        match warnings
            .iter()
            .find(|w| w.kind == alloc_conf::WarningKind::NotAtRunTime)
        {
            Some(refused) => Err(Fail::new(
                NpuAllocStatus::Refused,
                format_args!("set_allocator_settings: {}", refused.message),
            )),
            None => Ok(()),
        }
    })
}

/// `torch.npu.memory._dump_snapshot(path)`: a pickle PyTorch's memory_viz reads.
///
/// # Safety
/// `path` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_dump_snapshot(path: *const c_char) -> NpuAllocStatus {
    status(|| {
        // SAFETY: forwarded from the caller's contract.
        let p = unsafe { text(path, "path") }?;
        runtime()?.dump_snapshot(Path::new(p)).map_err(|e| match e {
            npu_runtime::DumpError::Runtime(e) => Fail::from(e),
            npu_runtime::DumpError::Write(e @ npu_runtime::WriteError::Io(_)) => {
                Fail::new(NpuAllocStatus::IoError, e)
            }
            // A value the pickle cannot hold: not the file's fault.
            npu_runtime::DumpError::Write(e) => Fail::new(NpuAllocStatus::Refused, e),
        })
    })
}

/// `torch.npu.MemPool()` on `device`: a private pool with use count 1; `*id` gets its number
/// (torch's `MempoolId_t` is `(0, id)`).
///
/// # Safety
/// `id` is a writable `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_mem_pool_create(device: c_int, id: *mut u64) -> NpuAllocStatus {
    status_keeping_device(|| {
        // SAFETY: `id` is null or writable by the caller's contract.
        unsafe {
            write_out(id, "mem_pool_create: null id", || {
                Ok(runtime()?.create_pool(self::device(device)?)?.1)
            })
        }
    })
}

/// torch's `setUseOnOOM` (`MemPool(use_on_oom=True)`): while `on`, a malloc of `device`'s
/// default pools that gets no segment at its first attempt takes a cached block of pool `id`
/// that fits, before it releases anything. An unknown pool is `Refused`;
/// [`npu_alloc_mem_pool_release`] turns it off.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_mem_pool_set_use_on_oom(
    device: c_int,
    id: u64,
    on: bool,
) -> NpuAllocStatus {
    status_keeping_device(|| {
        Ok(runtime()?.set_use_on_oom(self::device(device)?, PoolId(0, id), on)?)
    })
}

/// torch_npu's `setNoSplit` (`MemPool(no_split=True)`): pool `id` hands its blocks out whole
/// from now on. An unknown pool is `Refused`.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_mem_pool_set_no_split(device: c_int, id: u64) -> NpuAllocStatus {
    status_keeping_device(|| Ok(runtime()?.set_no_split(self::device(device)?, PoolId(0, id))?))
}

/// `use_mem_pool(pool).__enter__()`: this thread's allocations on `device` come from pool `id`.
/// A pool id `device` does not know gets a pool of its own there, freeable once the scope ends
/// (torch's `beginAllocateToPool`); a pool a scope already allocates to is `Refused`.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_mem_pool_begin(device: c_int, id: u64) -> NpuAllocStatus {
    status_keeping_device(|| Ok(runtime()?.begin_use_pool(self::device(device)?, PoolId(0, id))?))
}

/// `MemPool.use_count()`: `*count` gets the holders of pool `id` on `device` (the pool object and
/// each scope allocating to it); an unknown pool is `Refused`.
///
/// # Safety
/// `count` is a writable `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_mem_pool_use_count(
    device: c_int,
    id: u64,
    count: *mut u32,
) -> NpuAllocStatus {
    // It may open the device: the caller's binding comes back.
    status_keeping_device(|| {
        // SAFETY: `count` is null or writable by the caller's contract.
        unsafe {
            write_out(count, "mem_pool_use_count: null count", || {
                Ok(runtime()?.pool_use_count(self::device(device)?, PoolId(0, id))?)
            })
        }
    })
}

/// `use_mem_pool(pool).__exit__()`.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_mem_pool_end(device: c_int, id: u64) -> NpuAllocStatus {
    status(|| Ok(runtime()?.end_use_pool(self::device(device)?, PoolId(0, id))?))
}

/// `del pool`: drops the hold of [`npu_alloc_mem_pool_create`] and empties the pool's cache
/// (after the synchronize hook).
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_mem_pool_release(device: c_int, id: u64) -> NpuAllocStatus {
    status_keeping_device(|| {
        let (rt, d) = (runtime()?, self::device(device)?);
        synchronize_before_release(rt, Some(d))?;
        Ok(rt.release_pool(d, PoolId(0, id))?)
    })
}

/// torch_memory_saver's `region(tag, enable_cpu_backup)` entered on this thread for `device`.
///
/// # Safety
/// `tag` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_region_begin(
    device: c_int,
    tag: *const c_char,
    cpu_backup: bool,
) -> NpuAllocStatus {
    status_keeping_device(|| {
        // SAFETY: forwarded from the caller's contract.
        let tag = unsafe { text(tag, "tag") }?;
        runtime()?.begin_region(self::device(device)?, tag, cpu_backup)?;
        Ok(())
    })
}

/// Leaves this thread's innermost region on `device`.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_region_end(device: c_int) -> NpuAllocStatus {
    status(|| Ok(runtime()?.end_region(self::device(device)?)?))
}

/// The tag of a pause or resume: NULL or `""` is every tag, as torch_memory_saver's
/// `tms_pause("")`.
///
/// # Safety
/// `tag` is null or a NUL-terminated string.
unsafe fn saver_tag<'a>(tag: *const c_char) -> Result<Option<&'a str>, Fail> {
    if tag.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, and NUL-terminated by the caller's contract.
    let tag = unsafe { text(tag, "tag") }?;
    Ok((!tag.is_empty()).then_some(tag))
}

/// torch_memory_saver's `pause(tag)` (NULL or `""`: every tag) on every device, after the
/// synchronize hook.
///
/// # Safety
/// `tag` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_pause(tag: *const c_char) -> NpuAllocStatus {
    status_keeping_device(|| {
        // SAFETY: forwarded from the caller's contract.
        let tag = unsafe { saver_tag(tag) }?;
        let rt = runtime()?;
        synchronize_before_release(rt, None)?;
        rt.pause(tag)?;
        Ok(())
    })
}

/// torch_memory_saver's `resume(tag)` (NULL or `""`: every paused tag) on every device.
///
/// # Safety
/// `tag` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_resume(tag: *const c_char) -> NpuAllocStatus {
    status_keeping_device(|| {
        // SAFETY: forwarded from the caller's contract.
        let tag = unsafe { saver_tag(tag) }?;
        runtime()?.resume(tag)?;
        Ok(())
    })
}

/// Whether any device opened so far knows memory-saver tag `tag` (a region of it was entered):
/// `*known` is set. `npu_alloc_pause` and `npu_alloc_resume` of a tag no device knows are
/// `Refused`; torch_memory_saver does nothing for one, and a stand-in for it asks here first.
///
/// # Safety
/// `tag` is a NUL-terminated string; `known` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_memory_saver_has_tag(
    tag: *const c_char,
    known: *mut bool,
) -> NpuAllocStatus {
    status(|| {
        if known.is_null() {
            return Err(Fail::invalid("known is a null pointer"));
        }
        // SAFETY: forwarded from the caller's contract.
        let tag = unsafe { text(tag, "tag") }?;
        let found = runtime()?.has_saver_tag(tag);
        // SAFETY: non-null, and writable by the caller's contract.
        unsafe { *known = found };
        Ok(())
    })
}

/// The memory saver's figures on `device` as a JSON object, NUL-terminated, into `buf` (`len`
/// bytes), as [`npu_alloc_memory_stats`]: `paused_bytes` and `held_bytes` (each `current` and
/// `peak`) and `tags`, one object per tag in tag order (`tag`, `paused`, `segments`, `bytes`,
/// `paused_bytes`). torch's own stats do not move on a pause; these do. A device not opened yet
/// has no tags.
///
/// # Safety
/// `buf` is null or writable for `len` bytes; `needed` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_memory_saver_stats(
    device: c_int,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> NpuAllocStatus {
    // SAFETY: forwarded from the caller's contract.
    unsafe { text_status(buf, len, needed, || saver_stats_json(device)) }
}

/// The JSON text of [`npu_alloc_memory_saver_stats`].
fn saver_stats_json(device: c_int) -> Result<String, Fail> {
    let stats = runtime()?.memory_saver_stats(self::device(device)?)?;
    let figure = |s: &alloc_core::Stat| serde_json::json!({"current": s.current, "peak": s.peak});
    let tags: Vec<serde_json::Value> = stats
        .tags
        .iter()
        .map(|t| {
            serde_json::json!({
                "tag": t.tag,
                "paused": t.paused,
                "segments": t.segments,
                "bytes": t.bytes,
                "paused_bytes": figure(&t.paused_bytes),
            })
        })
        .collect();
    Ok(serde_json::json!({
        "paused_bytes": figure(&stats.paused_bytes),
        "held_bytes": figure(&stats.held_bytes),
        "tags": tags,
    })
    .to_string())
}
