//! What the runtime needs from a device family beyond `alloc-core`'s per-device [`Device`]:
//! how many devices there are, how to open one, and the few calls made without a device's
//! allocator (its lock released, or no cache at all).
//!
//! [`AclBackend`](crate::AclBackend) is the real one; tests and loom models bring their own.

use core::fmt;

use alloc_core::{Device, DeviceError, MemInfo, StreamId};

/// A family of devices the runtime can drive, one `alloc-core` allocator per device.
pub trait Backend: Send + Sync + 'static {
    /// One device, as the policy core drives it.
    type Device: Device<Error = Self::Error, Event: Send> + Send;
    /// The backend's error (for ACL, [`acl_sys::AclError`] with its code).
    type Error: fmt::Debug + fmt::Display + Send + 'static;
    /// A stream handle as callers pass it; the allocator keys its pools by [`StreamId`].
    type Stream: Copy + Send;

    /// Number of devices; valid indices are `0..device_count()`.
    fn device_count(&self) -> u32;
    /// Opens device `index` for its allocator.
    fn open(&self, index: u32) -> Result<Self::Device, Self::Error>;
    /// The allocator's key for `stream`.
    fn stream_id(stream: Self::Stream) -> StreamId;
    /// Allocates a segment of `bytes` on device `index`, outside any allocator.
    fn raw_malloc(&self, index: u32, bytes: u64) -> Result<u64, DeviceError<Self::Error>>;
    /// Frees a segment from [`Backend::raw_malloc`] at once (no synchronization).
    fn raw_free(&self, index: u32, addr: u64, bytes: u64) -> Result<(), Self::Error>;
    /// Waits for all work queued on device `index`.
    fn synchronize(&self, index: u32) -> Result<(), Self::Error>;
    /// Free and total memory of device `index`.
    fn mem_get_info(&self, index: u32) -> Result<MemInfo, Self::Error>;
    /// Bytes added to every request before rounding (torch_npu's pad, 32 on today's parts).
    fn pad(&self) -> u64 {
        32
    }
}
