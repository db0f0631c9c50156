//! The one seam between the policy and real memory.
//!
//! The policy core never touches memory: it asks a [`Device`] for whole segments, returns them,
//! records and polls stream events, and synchronizes before it gives cached memory back. A runtime
//! (the ACL device in `npu-runtime`, `alloc-sim`'s `SimDevice`, or any other embedder) implements
//! this trait; the policy is generic over it (static dispatch, as wgpu-hal does).
//!
//! Expandable segments need a second, optional set of calls: reserve a virtual address range,
//! create physical pages, map and unmap them, give both back (ACL's `aclrtReserveMemAddress`,
//! `aclrtMallocPhysical`, `aclrtMapMem`, `aclrtUnmapMem`, `aclrtFreePhysical`,
//! `aclrtReleaseMemAddress`). Their default bodies answer [`VmmError::Unsupported`], so a device
//! without virtual memory implements none of them and the allocator runs without expandable
//! segments, as torch_npu does on a driver without them.
//!
//! The memory saver's CPU backup needs a third optional set: pinned host memory and copies
//! between it and the device (ACL's `aclrtMallocHost`, `aclrtFreeHost`, `aclrtMemcpy`), with the
//! same "unsupported" default.

use core::fmt;

/// Free and total device memory in bytes, as `mem_get_info` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    /// Bytes the device can still hand out.
    pub free: u64,
    /// Total device memory usable by this process.
    pub total: u64,
}

/// A failed device allocation: out-of-memory enters torch's retry path, anything else does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceError<E> {
    /// The device has no memory for the request (ACL 207001, CUDA `cudaErrorMemoryAllocation`).
    OutOfMemory,
    /// Any other failure, returned to the caller unchanged.
    Other(E),
}

impl<E: fmt::Display> fmt::Display for DeviceError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::OutOfMemory => f.write_str("device out of memory"),
            DeviceError::Other(e) => write!(f, "device error: {e}"),
        }
    }
}

/// A failed virtual-memory call, or a device that has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmmError<E> {
    /// The device or its driver has no virtual-memory calls (ACL 207000, or a `libascendcl`
    /// without the symbols).
    Unsupported,
    /// No memory left for the call: a physical page (`create_page`, ACL 207001; the request
    /// takes the out-of-memory path), address space (`reserve_address`), or host memory
    /// (`alloc_host`, for the memory saver's CPU backup).
    OutOfMemory,
    /// Any other failure, returned to the caller unchanged.
    Other(E),
}

impl<E: fmt::Display> fmt::Display for VmmError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VmmError::Unsupported => f.write_str("the device has no virtual-memory support"),
            VmmError::OutOfMemory => {
                f.write_str("out of memory (a physical page, address space or host memory)")
            }
            VmmError::Other(e) => write!(f, "device error: {e}"),
        }
    }
}

/// A stream handle of a [`Device`]: a value the policy copies, compares (blocks are reused only on
/// the stream they were allocated on) and gives back to [`Device::record_event`], never invents.
pub trait Stream: Copy + Ord + fmt::Debug {
    /// A number for reports and snapshots (torch prints the stream's handle value).
    fn number(self) -> u64;
}

/// What the policy needs from a device. Addresses are plain `u64`; only runtimes make pointers.
pub trait Device {
    /// The device's stream handle. Streams reach the policy only from its caller, so a device
    /// whose driver dereferences stream handles makes this a type that cannot be forged in
    /// safe code.
    type Stream: Stream;
    /// A recorded point on a stream that can be polled; opaque to the policy.
    type Event;
    /// The device's own error (for example an ACL status code).
    type Error: fmt::Debug + fmt::Display;
    /// A physical page of an expandable segment (ACL's `aclrtDrvMemHandle`). A device without
    /// virtual memory names a type it never creates, such as `core::convert::Infallible`.
    type Page;
    /// Host memory the device copies to and from (ACL's pinned `aclrtMallocHost` memory), for
    /// the memory saver's CPU backup. A device without host copies names a type it never
    /// creates, such as `core::convert::Infallible`.
    type HostBuffer;

    /// Allocates one segment of exactly `bytes` bytes and returns its address (never 0).
    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError<Self::Error>>;
    /// Returns a whole segment obtained from [`Device::malloc`].
    fn free(&mut self, addr: u64, bytes: u64) -> Result<(), Self::Error>;
    /// Free and total memory.
    fn mem_info(&mut self) -> Result<MemInfo, Self::Error>;
    /// Records an event on `stream` after all work queued on it so far.
    fn record_event(&mut self, stream: Self::Stream) -> Result<Self::Event, Self::Error>;
    /// Whether the work before `event` has completed.
    fn event_done(&mut self, event: &Self::Event) -> Result<bool, Self::Error>;
    /// Gives a completed (or abandoned) event back, for reuse or destruction.
    fn release_event(&mut self, event: Self::Event);
    /// Waits for all work on every stream; called before cached memory goes back to the device.
    fn synchronize(&mut self) -> Result<(), Self::Error>;

    /// Reserves `bytes` of virtual address space, backed by nothing yet, and returns its start
    /// (never 0).
    fn reserve_address(&mut self, bytes: u64) -> Result<u64, VmmError<Self::Error>> {
        let _ = bytes;
        Err(VmmError::Unsupported)
    }

    /// Gives back a range from [`Device::reserve_address`] whose pages are all unmapped.
    fn release_address(&mut self, addr: u64, bytes: u64) -> Result<(), VmmError<Self::Error>> {
        let _ = (addr, bytes);
        Err(VmmError::Unsupported)
    }

    /// Creates one physical page of `bytes` bytes (the segment's page size).
    fn create_page(&mut self, bytes: u64) -> Result<Self::Page, VmmError<Self::Error>> {
        let _ = bytes;
        Err(VmmError::Unsupported)
    }

    /// Frees a physical page that is not mapped. On failure the page comes back with the error,
    /// still owned by the caller, so nothing is lost.
    #[allow(clippy::type_complexity)]
    fn release_page(
        &mut self,
        page: Self::Page,
    ) -> Result<(), (Self::Page, VmmError<Self::Error>)> {
        Err((page, VmmError::Unsupported))
    }

    /// Maps `page` (of `bytes` bytes) at `addr`, inside a reserved range.
    fn map(
        &mut self,
        addr: u64,
        bytes: u64,
        page: &Self::Page,
    ) -> Result<(), VmmError<Self::Error>> {
        let _ = (addr, bytes, page);
        Err(VmmError::Unsupported)
    }

    /// Unmaps the page of `bytes` bytes mapped at `addr`; the page itself stays alive.
    fn unmap(&mut self, addr: u64, bytes: u64) -> Result<(), VmmError<Self::Error>> {
        let _ = (addr, bytes);
        Err(VmmError::Unsupported)
    }

    /// Allocates `bytes` of host memory for device copies.
    fn alloc_host(&mut self, bytes: u64) -> Result<Self::HostBuffer, VmmError<Self::Error>> {
        let _ = bytes;
        Err(VmmError::Unsupported)
    }

    /// Frees host memory from [`Device::alloc_host`]. On failure the buffer comes back with the
    /// error, still owned by the caller.
    #[allow(clippy::type_complexity)]
    fn free_host(
        &mut self,
        buffer: Self::HostBuffer,
    ) -> Result<(), (Self::HostBuffer, VmmError<Self::Error>)> {
        Err((buffer, VmmError::Unsupported))
    }

    /// Copies `bytes` bytes of device memory at `src` into the start of `dst`, waiting until
    /// the copy is done.
    fn copy_to_host(
        &mut self,
        dst: &mut Self::HostBuffer,
        src: u64,
        bytes: u64,
    ) -> Result<(), VmmError<Self::Error>> {
        let _ = (dst, src, bytes);
        Err(VmmError::Unsupported)
    }

    /// Copies the first `bytes` bytes of `src` to device memory at `dst`, waiting until the copy
    /// is done.
    fn copy_to_device(
        &mut self,
        dst: u64,
        src: &Self::HostBuffer,
        bytes: u64,
    ) -> Result<(), VmmError<Self::Error>> {
        let _ = (dst, src, bytes);
        Err(VmmError::Unsupported)
    }
}
