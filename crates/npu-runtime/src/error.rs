//! The runtime's one error type.

use core::fmt;

use acl_sys::AclError;
use alloc_core::{FractionError, OutOfMemory};

/// A failed runtime call. With the ACL backend, `E` is [`AclError`] (which carries the code).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RuntimeError<E = AclError> {
    /// A device call failed with something other than out-of-memory; the allocator is unchanged.
    Device(E),
    /// No memory after torch's whole retry chain; displays torch_npu's message.
    OutOfMemory(OutOfMemory),
    /// A request of 1 EiB or more, refused before the allocator runs.
    TooLarge {
        /// The requested size.
        size: u64,
    },
    /// The device index is not below the device count.
    InvalidDevice {
        /// The index given.
        device: u32,
        /// Number of devices.
        count: u32,
    },
    /// The address was never returned by `malloc` (or was already freed and is in no segment).
    InvalidPointer {
        /// The address given.
        addr: u64,
    },
    /// The address lies in a cached segment but is not a live allocation (double free, or an
    /// interior pointer).
    NotAllocated {
        /// The address given.
        addr: u64,
    },
    /// `set_per_process_memory_fraction` was refused.
    Fraction(FractionError),
}

impl<E> RuntimeError<E> {
    /// Whether this is out-of-memory (torch's `OutOfMemoryError`).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            RuntimeError::OutOfMemory(_) | RuntimeError::TooLarge { .. }
        )
    }
}

impl RuntimeError<AclError> {
    /// The ACL status code of a failed device call.
    pub fn acl_code(&self) -> Option<i32> {
        match self {
            RuntimeError::Device(e) => e.code(),
            _ => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for RuntimeError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Device(e) => write!(f, "NPU error: {e}"),
            RuntimeError::OutOfMemory(oom) => oom.fmt(f),
            RuntimeError::TooLarge { .. } => {
                f.write_str("NPU out of memory. Tried to allocate more than 1EB memory.")
            }
            RuntimeError::InvalidDevice { device, count } => write!(
                f,
                "Invalid device argument {device}: did you call init? (device count is {count})"
            ),
            RuntimeError::InvalidPointer { addr } => {
                write!(f, "invalid device pointer: {addr:#x}")
            }
            RuntimeError::NotAllocated { addr } => write!(
                f,
                "invalid device pointer: {addr:#x} is not a live allocation (double free?)"
            ),
            RuntimeError::Fraction(e) => e.fmt(f),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for RuntimeError<E> {}
