//! The memory saver's settings and CPU backups, as torch_memory_saver offers them:
//! `retain_cpu_backup`, `memory_margin_bytes` and `get_cpu_backup` (a copy, or with `zero_copy`
//! the host memory itself).

use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use acl_sys::HostMem;

use crate::error::{Fail, NpuAllocStatus, status};
use crate::exports::{runtime, write_out};
use crate::hook::set_setting;

/// The retention setting, given to the runtime at its start: `TMS_RETAIN_CPU_BACKUP`, as
/// torch_memory_saver reads it when it starts, until a setter changes it.
fn retain_setting() -> &'static AtomicBool {
    static RETAIN: OnceLock<AtomicBool> = OnceLock::new();
    RETAIN.get_or_init(|| {
        let value = std::env::var_os(RETAIN_ENV);
        let value = value.as_ref().map(|v| v.to_str().unwrap_or("(not UTF-8)"));
        AtomicBool::new(bool_env(value).unwrap_or_else(|text| {
            crate::exports::warn(format_args!(
                "{RETAIN_ENV}={text} is not a boolean (1, true, TRUE, yes, YES or 0, false, \
                 FALSE, no, NO): CPU backups are not retained"
            ));
            false
        }))
    })
}

/// torch_memory_saver's variable for [`retain_setting`].
const RETAIN_ENV: &str = "TMS_RETAIN_CPU_BACKUP";

/// torch_memory_saver's `get_bool_env_var`: unset is false; another word than its ten is an
/// error (upstream ends the process).
fn bool_env(value: Option<&str>) -> Result<bool, &str> {
    match value {
        None | Some("0" | "false" | "FALSE" | "no" | "NO") => Ok(false),
        Some("1" | "true" | "TRUE" | "yes" | "YES") => Ok(true),
        Some(other) => Err(other),
    }
}
/// The margin, given to the runtime at its start.
static MARGIN: AtomicU64 = AtomicU64::new(0);

/// Gives a starting runtime the settings.
pub(crate) fn apply_at_start(rt: &npu_runtime::NpuAllocator) {
    rt.set_retain_cpu_backup(retain_setting().load(Ordering::Relaxed));
    rt.set_memory_margin_bytes(MARGIN.load(Ordering::Relaxed));
}

/// torch_memory_saver's `memory_margin_bytes = bytes`: a new segment of a memory-saver region
/// (an allocation no cached block of its tag serves) runs out of memory, through the retry
/// chain, unless the device would keep `bytes` free beside it (asked with `aclrtGetMemInfo`
/// before each such segment). 0, the default, turns the check off. Other pools and resumes are
/// not checked, as upstream. Does not start the library.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_set_memory_margin_bytes(bytes: u64) -> NpuAllocStatus {
    set_setting(
        || MARGIN.store(bytes, Ordering::Relaxed),
        |rt| rt.set_memory_margin_bytes(bytes),
    )
}

/// torch_memory_saver's `retain_cpu_backup = retain`: with it, a resume keeps each segment's
/// CPU backup (its bytes at the pause, not updated while the memory is in use) for
/// [`npu_alloc_copy_cpu_backup`] to read, and the next pause copies into it instead of
/// allocating host memory again (so, for those segments, it cannot run out of host memory).
/// Read at each resume: turning it off frees nothing at once; the next resume of a tag frees
/// its backups. Until it is called, `TMS_RETAIN_CPU_BACKUP` decides, as upstream (`1`, `true`,
/// `TRUE`, `yes`, `YES`; another word than those and their five negatives is a warning, and
/// false). Does not start the library.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_set_retain_cpu_backup(retain: bool) -> NpuAllocStatus {
    set_setting(
        || retain_setting().store(retain, Ordering::Relaxed),
        |rt| rt.set_retain_cpu_backup(retain),
    )
}

/// Whether resumes keep CPU backups ([`npu_alloc_set_retain_cpu_backup`]) into `*retain`.
/// Does not start the library.
///
/// # Safety
/// `retain` is a writable `bool`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_get_retain_cpu_backup(retain: *mut bool) -> NpuAllocStatus {
    status(|| {
        // SAFETY: `retain` is null or writable by the caller's contract.
        unsafe {
            write_out(retain, "get_retain_cpu_backup: null pointer", || {
                Ok(retain_setting().load(Ordering::Relaxed))
            })
        }
    })
}

/// Runs `read` on the backup of the `nbytes` bytes at device address `ptr` (the host memory
/// and the offset in it, `None` for memory in use without a kept backup), under the device's
/// lock.
fn with_backup<R>(
    ptr: *const c_void,
    nbytes: usize,
    read: impl FnOnce(Option<(&HostMem, usize)>) -> R,
) -> Result<R, Fail> {
    let (addr, len) = (ptr as usize as u64, nbytes as u64);
    Ok(runtime()?.cpu_backup(addr, len, |backup| {
        // The offset and length lie inside the buffer (the core checked them against its
        // segment, whose size the buffer has), so they fit in a `usize`.
        read(backup.map(|b| (b.buffer, b.offset as usize)))
    })?)
}

/// torch_memory_saver's `get_cpu_backup(x)`: copies the CPU backup of the `nbytes` bytes at
/// device address `ptr` into `dst` and sets `*found`. Paused memory of a region with CPU
/// backup has one (its bytes at the pause); memory in use has one while
/// [`npu_alloc_set_retain_cpu_backup`] kept it (its bytes at the last pause); otherwise
/// `*found` is false and `dst` untouched (upstream's `None`). Paused memory of a region
/// without backup is `Refused`; bytes outside every region's memory, or across two of its
/// segments, are `UnknownPointer`.
///
/// # Safety
/// `dst` is writable for `nbytes` bytes and does not overlap a CPU backup (memory
/// [`npu_alloc_cpu_backup_pointer`] hands out); `found` is a writable `bool`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_copy_cpu_backup(
    ptr: *const c_void,
    nbytes: usize,
    dst: *mut c_void,
    found: *mut bool,
) -> NpuAllocStatus {
    status(|| {
        if dst.is_null() && nbytes > 0 {
            return Err(Fail::invalid("copy_cpu_backup: null destination"));
        }
        let copy = || {
            with_backup(ptr, nbytes, |backup| {
                let Some((buffer, offset)) = backup else {
                    return false;
                };
                let bytes = &buffer.as_slice()[offset..offset + nbytes];
                // SAFETY: `dst` is writable for `nbytes` bytes by the caller's contract
                // (non-null when `nbytes` > 0, checked above), and by the same contract it does
                // not overlap a backup.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.cast::<u8>(), nbytes) };
                true
            })
        };
        // SAFETY: `found` is null or writable by the caller's contract.
        unsafe { write_out(found, "copy_cpu_backup: null found", copy) }
    })
}

/// torch_memory_saver's `get_cpu_backup(x, zero_copy=True)`: the host address of the CPU
/// backup of the `nbytes` bytes at device address `ptr` into `*host`, NULL where
/// [`npu_alloc_copy_cpu_backup`] finds none (same errors). Rely on the memory only until the
/// next pause or resume of its tag: a resume without retention frees it (as upstream's, valid
/// only while the memory is paused unless retained), and so may a pause that fails. Read it, do
/// not write it.
///
/// # Safety
/// `host` is a writable pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_cpu_backup_pointer(
    ptr: *const c_void,
    nbytes: usize,
    host: *mut *mut c_void,
) -> NpuAllocStatus {
    status(|| {
        // SAFETY: `host` is null or writable by the caller's contract.
        unsafe {
            write_out(host, "cpu_backup_pointer: null host", || {
                with_backup(ptr, nbytes, |backup| match backup {
                    Some((buffer, offset)) => {
                        buffer.as_ptr().cast::<u8>().wrapping_add(offset).cast()
                    }
                    None => std::ptr::null_mut(),
                })
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::bool_env;

    #[test]
    fn tms_retain_cpu_backup_reads_torch_memory_saver_words() {
        for word in ["1", "true", "TRUE", "yes", "YES"] {
            assert_eq!(bool_env(Some(word)), Ok(true));
        }
        for word in [
            None,
            Some("0"),
            Some("false"),
            Some("FALSE"),
            Some("no"),
            Some("NO"),
        ] {
            assert_eq!(bool_env(word), Ok(false));
        }
        for word in ["True", "on", "", " 1"] {
            assert_eq!(bool_env(Some(word)), Err(word));
        }
    }
}
