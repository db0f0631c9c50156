//! The runtime's one error type: the core's errors, wrapped as they are, plus what only the
//! runtime can get wrong (a device index).

use core::fmt;

use acl_sys::AclError;
use alloc_core::{AllocError, FractionError, FreeError, PoolError, SaverError};

/// A failed runtime call. With the ACL device, `E` is [`AclError`] (which carries the code).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RuntimeError<E = AclError> {
    /// `malloc` failed: out of memory after torch's whole retry chain (torch_npu's message), a
    /// request of 1 EiB or more, or a device error.
    Alloc(AllocError<E>),
    /// `free` or `record_stream` was refused: a pointer no device returned
    /// ([`FreeError::ForeignPointer`]), one that is not a live allocation
    /// ([`FreeError::NotAllocated`]), or a device error; the allocation is unchanged.
    Free(FreeError<E>),
    /// `set_per_process_memory_fraction` was refused.
    Fraction(FractionError),
    /// The device index is not below the device count.
    InvalidDevice {
        /// The index given.
        device: u32,
        /// Number of devices.
        count: u32,
    },
    /// A device call outside malloc and free failed (opening the device, `empty_cache`, event
    /// polling, `mem_get_info`). The books stay exact; what the call did before the failure
    /// stays done (an `empty_cache` may have given some segments back already).
    Device(E),
    /// A private-pool call was refused (unknown or released pool, a device without virtual
    /// memory for the memory saver).
    Pool(PoolError),
    /// The memory saver's `pause` or `resume` failed or was refused.
    Saver(SaverError<E>),
    /// A `pause` or `resume` failed on `device` after devices before it had acted: what they
    /// did stays done, the devices after it are untouched, and the call can be made again.
    SaverStopped {
        /// The device it failed on.
        device: u32,
        /// The bytes the devices before it paused or resumed.
        bytes_done: u64,
        /// Why it failed there.
        error: SaverError<E>,
    },
    /// A scope (`use_mem_pool`, `region`) was ended that this thread has not open.
    ScopeNotOpen,
    /// A private-pool or memory-saver call while caching is off
    /// (`PYTORCH_NO_NPU_MEMORY_CACHING`): there are no pools.
    NoCaching,
    /// A snapshot could not hold a value (torch's fields are signed 64-bit integers).
    Snapshot(alloc_snapshot::ExportError),
    /// `empty_virt_addr_cache` without `expandable_segments:True` (torch_npu refuses it too).
    NotExpandable,
}

impl<E> From<PoolError> for RuntimeError<E> {
    fn from(e: PoolError) -> Self {
        RuntimeError::Pool(e)
    }
}

impl<E> From<SaverError<E>> for RuntimeError<E> {
    fn from(e: SaverError<E>) -> Self {
        RuntimeError::Saver(e)
    }
}

impl<E> From<AllocError<E>> for RuntimeError<E> {
    fn from(e: AllocError<E>) -> Self {
        RuntimeError::Alloc(e)
    }
}

impl<E> From<FreeError<E>> for RuntimeError<E> {
    fn from(e: FreeError<E>) -> Self {
        RuntimeError::Free(e)
    }
}

impl<E> From<FractionError> for RuntimeError<E> {
    fn from(e: FractionError) -> Self {
        RuntimeError::Fraction(e)
    }
}

impl<E> RuntimeError<E> {
    /// Whether this is out-of-memory (torch's `OutOfMemoryError`; torch_npu raises it for a
    /// `throw_on_npumalloc_oom` rejection too).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            RuntimeError::Alloc(
                AllocError::OutOfMemory(_) | AllocError::Rejected(_) | AllocError::TooLarge { .. }
            )
        )
    }

    /// The device's error, wherever it surfaced.
    pub fn device_error(&self) -> Option<&E> {
        match self {
            RuntimeError::Device(e)
            | RuntimeError::Alloc(AllocError::Device(e))
            | RuntimeError::Free(FreeError::Device(e))
            | RuntimeError::Saver(SaverError::Device(e))
            | RuntimeError::SaverStopped {
                error: SaverError::Device(e),
                ..
            } => Some(e),
            _ => None,
        }
    }
}

impl RuntimeError<AclError> {
    /// The ACL status code of a failed device call.
    pub fn acl_code(&self) -> Option<i32> {
        self.device_error().and_then(AclError::code)
    }
}

impl<E: fmt::Display> fmt::Display for RuntimeError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Alloc(e) => e.fmt(f),
            RuntimeError::Free(e) => e.fmt(f),
            RuntimeError::Fraction(e) => e.fmt(f),
            RuntimeError::InvalidDevice { device, count } => write!(
                f,
                "Invalid device argument {device}: did you call init? (device count is {count})"
            ),
            RuntimeError::Device(e) => write!(f, "NPU error: {e}"),
            RuntimeError::Pool(e) => e.fmt(f),
            RuntimeError::Saver(e) => e.fmt(f),
            RuntimeError::SaverStopped {
                device,
                bytes_done,
                error,
            } => write!(
                f,
                "device {device}: {error}; what the devices before it did stays done \
                 ({bytes_done} bytes), the devices after it are untouched"
            ),
            RuntimeError::ScopeNotOpen => {
                f.write_str("no such memory pool or memory saver scope is open on this thread")
            }
            RuntimeError::NoCaching => f.write_str(
                "no private pools or memory saver regions: caching is off \
                 (PYTORCH_NO_NPU_MEMORY_CACHING)",
            ),
            RuntimeError::Snapshot(e) => e.fmt(f),
            RuntimeError::NotExpandable => f.write_str(
                "Unsupported config for empty_virt_addr_cache, please enable expandable_segments.",
            ),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for RuntimeError<E> {}
