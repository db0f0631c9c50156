//! Status codes, the thread-local last error, and the guard every export runs in.

use std::cell::RefCell;
use std::fmt::Display;
use std::panic::{AssertUnwindSafe, catch_unwind};

use npu_runtime::{AclError, RuntimeError};

/// What a direct entry point returns: 0 for success, a negative code otherwise, with the text
/// in `npu_alloc_last_error`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpuAllocStatus {
    /// Success.
    Ok = 0,
    /// A null pointer where one is required, a device out of range, a fraction outside
    /// [0, 1] (NaN included), a string that is not UTF-8.
    InvalidArgument = -1,
    /// Out of memory after torch's whole retry chain (torch_npu's message in the last error),
    /// a memory-saver resume (device) or pause (host, for a CPU backup) that found none, or an
    /// ACL call outside the chain that ran out of memory (torch_npu's `isCannOOM`).
    OutOfMemory = -2,
    /// A pointer this library did not return, or one already freed.
    UnknownPointer = -3,
    /// An ACL call failed (its code and name in the last error), or the device does not report
    /// its total memory for a fraction below 1.
    DeviceError = -4,
    /// The caller's buffer is too small; the needed length was written.
    BufferTooSmall = -5,
    /// The library could not start: `libascendcl.so` was not found or `aclInit` failed.
    NotInitialized = -6,
    /// A private-pool or memory-saver call was refused (unknown or released pool, paused tag,
    /// a scope that is not open, ...), or a snapshot holds a value its pickle cannot.
    Refused = -7,
    /// A file could not be written.
    IoError = -8,
    /// npu-alloc panicked; nothing crossed the boundary, and the state is as the lock left it.
    Panic = -9,
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Records `message` as this thread's last error. A thread that is exiting may call in from a
/// thread-local destructor after this one was destroyed: the message is then dropped (a panic
/// there would abort the process).
pub(crate) fn set_last_error(message: impl Display) {
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = message.to_string());
}

/// This thread's last error ("" when none, or when the thread is exiting and it is gone).
pub(crate) fn last_error() -> String {
    LAST_ERROR
        .try_with(|e| e.borrow().clone())
        .unwrap_or_default()
}

/// A failure of an export: its status and message.
pub(crate) struct Fail {
    pub(crate) status: NpuAllocStatus,
    pub(crate) message: String,
}

impl Fail {
    pub(crate) fn new(status: NpuAllocStatus, message: impl Display) -> Fail {
        Fail {
            status,
            message: message.to_string(),
        }
    }

    pub(crate) fn invalid(message: impl Display) -> Fail {
        Fail::new(NpuAllocStatus::InvalidArgument, message)
    }
}

impl From<RuntimeError<AclError>> for Fail {
    fn from(e: RuntimeError<AclError>) -> Fail {
        use alloc_core::{AllocError, FractionError, FreeError, SaverError};
        let status = match &e {
            RuntimeError::Alloc(
                AllocError::OutOfMemory(_) | AllocError::Rejected(_) | AllocError::TooLarge { .. },
            ) => NpuAllocStatus::OutOfMemory,
            // A device call outside the retry chain that ran out of memory (mapping an
            // expandable segment's page, say): torch_npu's NPU_CHECK_ERROR raises
            // OutOfMemoryError for it too (isCannOOM), without counting an OOM.
            RuntimeError::Alloc(AllocError::Device(e)) | RuntimeError::Device(e)
                if e.is_out_of_memory() =>
            {
                NpuAllocStatus::OutOfMemory
            }
            // A pause or resume that stopped on a later device: the status of why it stopped.
            RuntimeError::Saver(error) | RuntimeError::SaverStopped { error, .. } => match error {
                SaverError::OutOfMemory { .. } | SaverError::HostOutOfMemory { .. } => {
                    NpuAllocStatus::OutOfMemory
                }
                SaverError::Device(_) => NpuAllocStatus::DeviceError,
                // get_cpu_backup of memory no region allocated.
                SaverError::NotSaverMemory { .. } => NpuAllocStatus::UnknownPointer,
                _ => NpuAllocStatus::Refused,
            },
            RuntimeError::Free(
                FreeError::ForeignPointer { .. } | FreeError::NotAllocated { .. },
            ) => NpuAllocStatus::UnknownPointer,
            RuntimeError::InvalidDevice { .. }
            | RuntimeError::Fraction(FractionError::OutOfRange(_)) => {
                NpuAllocStatus::InvalidArgument
            }
            RuntimeError::Pool(_)
            | RuntimeError::Alloc(AllocError::Paused { .. } | AllocError::Pool(_))
            | RuntimeError::ScopeNotOpen
            | RuntimeError::NoCaching
            | RuntimeError::NotExpandable
            | RuntimeError::Snapshot(_) => NpuAllocStatus::Refused,
            // What is left is a device's failure (a call, or a total it does not report).
            _ => NpuAllocStatus::DeviceError,
        };
        Fail::new(status, e)
    }
}

/// Runs `f`, catching a panic; on failure records the message and returns the status.
pub(crate) fn status(f: impl FnOnce() -> Result<(), Fail>) -> NpuAllocStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NpuAllocStatus::Ok,
        Ok(Err(fail)) => {
            set_last_error(&fail.message);
            fail.status
        }
        Err(_) => {
            set_last_error("npu-alloc panicked; the call did nothing it did not finish");
            NpuAllocStatus::Panic
        }
    }
}

/// Runs `f` for an export without a status (torch_npu's hooks): `fallback` on failure, with
/// the last error set.
pub(crate) fn or<T>(fallback: T, f: impl FnOnce() -> Result<T, Fail>) -> T {
    let mut out = None;
    let s = status(|| {
        out = Some(f()?);
        Ok(())
    });
    match (s, out) {
        (NpuAllocStatus::Ok, Some(v)) => v,
        _ => fallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc_core::AllocError;

    fn code(code: i32, message: Option<&str>) -> AclError {
        AclError::Code {
            function: "aclrtMallocPhysical",
            code,
            name: None,
            message: message.map(str::to_owned),
        }
    }

    #[test]
    fn a_device_call_out_of_memory_outside_the_retry_chain_is_out_of_memory() {
        let status = |e: RuntimeError<AclError>| Fail::from(e).status;
        // torch_npu's isCannOOM reads the recent-error text; ACL's out-of-memory codes too.
        let marked = code(507_899, Some("EL0004: Failed to allocate memory."));
        assert_eq!(
            status(RuntimeError::Alloc(AllocError::Device(marked))),
            NpuAllocStatus::OutOfMemory
        );
        assert_eq!(
            status(RuntimeError::Device(code(207_018, None))),
            NpuAllocStatus::OutOfMemory
        );
        assert_eq!(
            status(RuntimeError::Alloc(AllocError::Device(code(507_899, None)))),
            NpuAllocStatus::DeviceError
        );
    }
}
