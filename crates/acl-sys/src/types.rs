//! The C types of the ACL runtime API: handles, enums, flags and `aclrtPhysicalMemProp`.
//!
//! ACL enums are 4-byte C enums. They are modelled as `#[repr(transparent)]` newtypes over `u32`
//! with associated constants, never as Rust `enum`s: a value written by the library (an event
//! status, a future enumerator) may be one this crate does not know, and such a value in a Rust
//! `enum` would be undefined behaviour. A newtype is passed exactly like the C enum.
//! Values are those of CANN's ACL headers 1.15 and 1.17 (docs/acl.md).

use core::ffi::c_void;
use core::fmt;
use core::ops::{BitOr, BitOrAssign};
use core::ptr::{self, NonNull};

/// The C `aclError`: the status code every ACL runtime function returns (0 is success).
pub type AclCode = i32;

/// `aclrtStream` as passed across the C boundary (`void*`; null is the default stream).
pub type RawStream = *mut c_void;
/// `aclrtEvent` as passed across the C boundary (`void*`).
pub type RawEvent = *mut c_void;
/// `aclrtDrvMemHandle` as passed across the C boundary (`void*`).
pub type RawDrvMemHandle = *mut c_void;

/// A non-null device address (from `aclrtMalloc*` or `aclrtReserveMemAddress`).
///
/// Device memory is not host memory: the host never dereferences these, and ACL validates the
/// address of every call that takes one (an unknown address is an error code), so making one
/// from any integer is safe.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(NonNull<c_void>);

// SAFETY: a device address is a plain number to the host; nothing is ever read through it.
unsafe impl Send for DevicePtr {}
// SAFETY: as above.
unsafe impl Sync for DevicePtr {}

impl DevicePtr {
    /// Wraps a pointer returned by ACL; `None` for null.
    pub fn new(ptr: *mut c_void) -> Option<Self> {
        NonNull::new(ptr).map(DevicePtr)
    }

    /// The device address `addr`; `None` for 0.
    pub fn from_addr(addr: u64) -> Option<Self> {
        let addr = usize::try_from(addr).ok()?;
        Self::new(ptr::without_provenance_mut(addr))
    }

    /// The pointer value ACL deals in.
    pub fn as_ptr(self) -> *mut c_void {
        self.0.as_ptr()
    }

    /// The address as an integer (what the policy core keeps).
    pub fn addr(self) -> u64 {
        self.0.as_ptr().addr() as u64
    }

    /// The address `bytes` further on; `None` on overflow.
    pub fn offset(self, bytes: u64) -> Option<Self> {
        Self::from_addr(self.addr().checked_add(bytes)?)
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.addr())
    }
}

macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        $name:ident : $cname:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[doc = concat!("\n\nC type: `", $cname, "`.")]
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub u32);

        impl $name {
            $( $(#[$vmeta])* pub const $variant: Self = Self($value); )*

            /// The name of a known value (the C enumerator without its prefix), `None` otherwise.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( v if v == $value => Some(stringify!($variant)), )*
                    _ => None,
                }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(n) => write!(f, "{}::{}", stringify!($name), n),
                    None => write!(f, "{}({:#x})", stringify!($name), self.0),
                }
            }
        }
    };
}

c_enum! {
    /// Page policy of `aclrtMalloc`/`aclrtMallocAlign32`: a value, not a bit set (`3` is
    /// `HUGE_FIRST_P2P`, not `HUGE_ONLY | NORMAL_ONLY`). The [`MemPolicyBits`] can be OR-ed onto
    /// `HUGE_FIRST`, `HUGE_ONLY` and `NORMAL_ONLY`.
    MemMallocPolicy: "aclrtMemMallocPolicy" {
        /// `ACL_MEM_MALLOC_HUGE_FIRST`: 2 MiB pages for requests over 1 MiB, falling back to normal.
        HUGE_FIRST = 0,
        /// `ACL_MEM_MALLOC_HUGE_ONLY`: fails when huge pages run out.
        HUGE_ONLY = 1,
        /// `ACL_MEM_MALLOC_NORMAL_ONLY`: normal pages only.
        NORMAL_ONLY = 2,
        /// `ACL_MEM_MALLOC_HUGE_FIRST_P2P`.
        HUGE_FIRST_P2P = 3,
        /// `ACL_MEM_MALLOC_HUGE_ONLY_P2P`.
        HUGE_ONLY_P2P = 4,
        /// `ACL_MEM_MALLOC_NORMAL_ONLY_P2P`.
        NORMAL_ONLY_P2P = 5,
        /// `ACL_MEM_MALLOC_HUGE1G_ONLY`: 1 GiB pages; fails when they run out.
        HUGE1G_ONLY = 6,
        /// `ACL_MEM_MALLOC_HUGE1G_ONLY_P2P`.
        HUGE1G_ONLY_P2P = 7,
    }
}

c_enum! {
    /// Memory kind, for `aclrtGetMemInfo` and `aclrtPhysicalMemProp::memAttr`.
    MemAttr: "aclrtMemAttr" {
        /// `ACL_DDR_MEM`.
        DDR_MEM = 0,
        /// `ACL_HBM_MEM`: what torch_npu always queries.
        HBM_MEM = 1,
        /// `ACL_DDR_MEM_HUGE`.
        DDR_MEM_HUGE = 2,
        /// `ACL_DDR_MEM_NORMAL`.
        DDR_MEM_NORMAL = 3,
        /// `ACL_HBM_MEM_HUGE`: 2 MiB pages.
        HBM_MEM_HUGE = 4,
        /// `ACL_HBM_MEM_NORMAL`.
        HBM_MEM_NORMAL = 5,
        /// `ACL_DDR_MEM_P2P_HUGE`.
        DDR_MEM_P2P_HUGE = 6,
        /// `ACL_DDR_MEM_P2P_NORMAL`.
        DDR_MEM_P2P_NORMAL = 7,
        /// `ACL_HBM_MEM_P2P_HUGE`.
        HBM_MEM_P2P_HUGE = 8,
        /// `ACL_HBM_MEM_P2P_NORMAL`.
        HBM_MEM_P2P_NORMAL = 9,
        /// `ACL_HBM_MEM_HUGE1G`: 1 GiB pages.
        HBM_MEM_HUGE1G = 10,
        /// `ACL_HBM_MEM_P2P_HUGE1G`.
        HBM_MEM_P2P_HUGE1G = 11,
        /// `ACL_MEM_NORMAL` (header 1.17).
        MEM_NORMAL = 12,
        /// `ACL_MEM_HUGE` (header 1.17).
        MEM_HUGE = 13,
        /// `ACL_MEM_HUGE1G` (header 1.17).
        MEM_HUGE1G = 14,
        /// `ACL_MEM_P2P_NORMAL` (header 1.17).
        MEM_P2P_NORMAL = 15,
        /// `ACL_MEM_P2P_HUGE` (header 1.17).
        MEM_P2P_HUGE = 16,
        /// `ACL_MEM_P2P_HUGE1G` (header 1.17).
        MEM_P2P_HUGE1G = 17,
    }
}

c_enum! {
    /// Direction of `aclrtMemcpy`.
    MemcpyKind: "aclrtMemcpyKind" {
        /// `ACL_MEMCPY_HOST_TO_HOST`.
        HOST_TO_HOST = 0,
        /// `ACL_MEMCPY_HOST_TO_DEVICE`.
        HOST_TO_DEVICE = 1,
        /// `ACL_MEMCPY_DEVICE_TO_HOST`.
        DEVICE_TO_HOST = 2,
        /// `ACL_MEMCPY_DEVICE_TO_DEVICE`.
        DEVICE_TO_DEVICE = 3,
        /// `ACL_MEMCPY_DEFAULT`.
        DEFAULT = 4,
        /// `ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE`.
        HOST_TO_BUF_TO_DEVICE = 5,
        /// `ACL_MEMCPY_INNER_DEVICE_TO_DEVICE`.
        INNER_DEVICE_TO_DEVICE = 6,
        /// `ACL_MEMCPY_INTER_DEVICE_TO_DEVICE`.
        INTER_DEVICE_TO_DEVICE = 7,
    }
}

c_enum! {
    /// Status written by the deprecated `aclrtQueryEvent` (COMPLETE is 0).
    EventStatus: "aclrtEventStatus" {
        /// `ACL_EVENT_STATUS_COMPLETE`.
        COMPLETE = 0,
        /// `ACL_EVENT_STATUS_NOT_READY`.
        NOT_READY = 1,
        /// `ACL_EVENT_STATUS_RESERVED`.
        RESERVED = 2,
    }
}

c_enum! {
    /// Status written by `aclrtQueryEventStatus` (COMPLETE is 1: the opposite polarity of
    /// [`EventStatus`]); an event never recorded reads NOT_READY.
    EventRecordedStatus: "aclrtEventRecordedStatus" {
        /// `ACL_EVENT_RECORDED_STATUS_NOT_READY`.
        NOT_READY = 0,
        /// `ACL_EVENT_RECORDED_STATUS_COMPLETE`.
        COMPLETE = 1,
    }
}

c_enum! {
    /// Status of an event wait.
    EventWaitStatus: "aclrtEventWaitStatus" {
        /// `ACL_EVENT_WAIT_STATUS_COMPLETE`.
        COMPLETE = 0,
        /// `ACL_EVENT_WAIT_STATUS_NOT_READY`.
        NOT_READY = 1,
        /// `ACL_EVENT_WAIT_STATUS_RESERVED`.
        RESERVED = 0xFFFF,
    }
}

c_enum! {
    /// Status written by `aclrtStreamQuery`.
    StreamStatus: "aclrtStreamStatus" {
        /// `ACL_STREAM_STATUS_COMPLETE`.
        COMPLETE = 0,
        /// `ACL_STREAM_STATUS_NOT_READY`.
        NOT_READY = 1,
    }
}

c_enum! {
    /// Handle type of physical memory (VMM).
    MemHandleType: "aclrtMemHandleType" {
        /// `ACL_MEM_HANDLE_TYPE_NONE`.
        NONE = 0,
        /// `ACL_MEM_HANDLE_TYPE_POSIX` (header 1.17).
        POSIX = 2,
    }
}

c_enum! {
    /// Allocation type of physical memory (VMM).
    MemAllocationType: "aclrtMemAllocationType" {
        /// `ACL_MEM_ALLOCATION_TYPE_PINNED`: the only type the runtime accepts.
        PINNED = 0,
    }
}

c_enum! {
    /// Where physical memory lives (VMM).
    MemLocationType: "aclrtMemLocationType" {
        /// `ACL_MEM_LOCATION_TYPE_HOST`.
        HOST = 0,
        /// `ACL_MEM_LOCATION_TYPE_DEVICE`.
        DEVICE = 1,
        /// `ACL_MEM_LOCATION_TYPE_UNREGISTERED`.
        UNREGISTERED = 2,
        /// `ACL_MEM_LOCATION_TYPE_MANAGED` (header 1.17).
        MANAGED = 3,
        /// `ACL_MEM_LOCATION_TYPE_HOST_NUMA` (header 1.17).
        HOST_NUMA = 4,
    }
}

c_enum! {
    /// Which granularity `aclrtMemGetAllocationGranularity` reports.
    MemGranularityOptions: "aclrtMemGranularityOptions" {
        /// `ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM`.
        MINIMUM = 0,
        /// `ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
        RECOMMENDED = 1,
        /// `ACL_RT_MEM_ALLOC_GRANULARITY_UNDEF`.
        UNDEF = 0xFFFF,
    }
}

bitflags::bitflags! {
    /// The bits of `aclrtMemMallocPolicy` that are real flags, OR-ed onto a page policy value with
    /// `MemMallocPolicy | MemPolicyBits`.
    #[repr(transparent)]
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
    pub struct MemPolicyBits: u32 {
        /// `ACL_MEM_TYPE_LOW_BAND_WIDTH`.
        const TYPE_LOW_BAND_WIDTH = 0x0100;
        /// `ACL_MEM_TYPE_HIGH_BAND_WIDTH`.
        const TYPE_HIGH_BAND_WIDTH = 0x1000;
        /// `ACL_MEM_ACCESS_USER_SPACE_READONLY`.
        const ACCESS_USER_SPACE_READONLY = 0x10_0000;
    }
}

impl BitOr<MemPolicyBits> for MemMallocPolicy {
    type Output = Self;
    fn bitor(self, rhs: MemPolicyBits) -> Self {
        Self(self.0 | rhs.bits())
    }
}

impl BitOrAssign<MemPolicyBits> for MemMallocPolicy {
    fn bitor_assign(&mut self, rhs: MemPolicyBits) {
        self.0 |= rhs.bits();
    }
}

bitflags::bitflags! {
    /// Flags of `aclrtCreateEventWithFlag` / `aclrtCreateEventExWithFlag` (a `uint32_t` bit set).
    #[repr(transparent)]
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
    pub struct EventFlags: u32 {
        /// `ACL_EVENT_SYNC`: the event can be waited on from the host.
        const SYNC = 0x1;
        /// `ACL_EVENT_CAPTURE_STREAM_PROGRESS`: what torch_npu's allocator event pool uses.
        const CAPTURE_STREAM_PROGRESS = 0x2;
        /// `ACL_EVENT_TIME_LINE`: timestamps for elapsed-time queries.
        const TIME_LINE = 0x8;
        /// `ACL_EVENT_DEVICE_USE_ONLY` (header 1.17).
        const DEVICE_USE_ONLY = 0x10;
        /// `ACL_EVENT_EXTERNAL`.
        const EXTERNAL = 0x20;
        /// `ACL_EVENT_IPC`.
        const IPC = 0x40;
        /// torch_npu's private `ACL_EVENT_DEFAULT` (0x0E = CAPTURE_STREAM_PROGRESS | TIME_LINE | 0x4).
        const TORCH_DEFAULT = 0x0E;
    }
}

/// Flag of `aclrtReserveMemAddress` that torch_npu passes (1, "kept for early-interface
/// compatibility"); the only other accepted value is 0.
pub const RESERVE_MEM_FLAG_COMPAT: u64 = 1;

/// `aclrtMemLocation`: the `location` member of [`PhysicalMemProp`] (8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MemLocation {
    /// `id`: the device id for a device location.
    pub id: u32,
    /// `type` in C.
    pub kind: MemLocationType,
}

c_enum! {
    /// A CANN package whose version `aclsysGetCANNVersion` reports (`acl.h`).
    CannPackage: "aclCANNPackageName" {
        /// `ACL_PKG_NAME_CANN`: the CANN toolkit.
        CANN = 0,
        /// `ACL_PKG_NAME_RUNTIME`.
        RUNTIME = 1,
        /// `ACL_PKG_NAME_COMPILER`.
        COMPILER = 2,
        /// `ACL_PKG_NAME_HCCL`.
        HCCL = 3,
        /// `ACL_PKG_NAME_TOOLKIT`.
        TOOLKIT = 4,
        /// `ACL_PKG_NAME_OPP`.
        OPP = 5,
        /// `ACL_PKG_NAME_OPP_KERNEL`.
        OPP_KERNEL = 6,
        /// `ACL_PKG_NAME_DRIVER`: the NPU driver (HDK).
        DRIVER = 7,
    }
}

/// `ACL_PKG_VERSION_MAX_SIZE`.
pub const PKG_VERSION_MAX_SIZE: usize = 128;
/// `ACL_PKG_VERSION_PARTS_MAX_SIZE`.
pub const PKG_VERSION_PARTS_MAX_SIZE: usize = 64;

/// `aclCANNPackageVersion`: what `aclsysGetCANNVersion` fills in (512 bytes of NUL-terminated
/// strings, C layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CannPackageVersion {
    /// `version`: the whole version, e.g. `8.1.RC1` or `25.0.rc1`.
    pub version: [u8; PKG_VERSION_MAX_SIZE],
    /// `majorVersion`.
    pub major: [u8; PKG_VERSION_PARTS_MAX_SIZE],
    /// `minorVersion`.
    pub minor: [u8; PKG_VERSION_PARTS_MAX_SIZE],
    /// `releaseVersion`.
    pub release: [u8; PKG_VERSION_PARTS_MAX_SIZE],
    /// `patchVersion`.
    pub patch: [u8; PKG_VERSION_PARTS_MAX_SIZE],
    /// `reserved`.
    pub reserved: [u8; PKG_VERSION_MAX_SIZE],
}

impl Default for CannPackageVersion {
    fn default() -> Self {
        CannPackageVersion {
            version: [0; PKG_VERSION_MAX_SIZE],
            major: [0; PKG_VERSION_PARTS_MAX_SIZE],
            minor: [0; PKG_VERSION_PARTS_MAX_SIZE],
            release: [0; PKG_VERSION_PARTS_MAX_SIZE],
            patch: [0; PKG_VERSION_PARTS_MAX_SIZE],
            reserved: [0; PKG_VERSION_MAX_SIZE],
        }
    }
}

impl CannPackageVersion {
    /// The `version` string: up to its first NUL (or the whole field without one), with any
    /// invalid UTF-8 replaced.
    pub fn version(&self) -> String {
        let end = self
            .version
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(PKG_VERSION_MAX_SIZE);
        String::from_utf8_lossy(&self.version[..end]).into_owned()
    }
}

/// `aclrtPhysicalMemProp`, the description of a physical allocation (32 bytes, C layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PhysicalMemProp {
    /// `handleType` (offset 0).
    pub handle_type: MemHandleType,
    /// `allocationType` (offset 4).
    pub allocation_type: MemAllocationType,
    /// `memAttr` (offset 8).
    pub mem_attr: MemAttr,
    /// `location` (offset 12: `id` at 12, `type` at 16).
    pub location: MemLocation,
    /// `reserve` (offset 24); must be 0.
    pub reserve: u64,
}

impl PhysicalMemProp {
    /// The properties torch_npu uses for expandable segments: pinned device memory with no
    /// exportable handle, on `device`, of kind `mem_attr` (usually [`MemAttr::HBM_MEM_HUGE`]).
    pub const fn device(device: u32, mem_attr: MemAttr) -> Self {
        Self {
            handle_type: MemHandleType::NONE,
            allocation_type: MemAllocationType::PINNED,
            mem_attr,
            location: MemLocation {
                id: device,
                kind: MemLocationType::DEVICE,
            },
            reserve: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn physical_mem_prop_layout_matches_c() {
        assert_eq!(size_of::<PhysicalMemProp>(), 32);
        assert_eq!(align_of::<PhysicalMemProp>(), 8);
        assert_eq!(offset_of!(PhysicalMemProp, handle_type), 0);
        assert_eq!(offset_of!(PhysicalMemProp, allocation_type), 4);
        assert_eq!(offset_of!(PhysicalMemProp, mem_attr), 8);
        assert_eq!(offset_of!(PhysicalMemProp, location.id), 12);
        assert_eq!(offset_of!(PhysicalMemProp, location.kind), 16);
        assert_eq!(offset_of!(PhysicalMemProp, reserve), 24);
        assert_eq!(size_of::<MemLocation>(), 8);
    }

    #[test]
    fn cann_package_version_matches_the_header() {
        assert_eq!(size_of::<CannPackageVersion>(), 512);
        assert_eq!(offset_of!(CannPackageVersion, major), 128);
        assert_eq!(offset_of!(CannPackageVersion, patch), 320);
        assert_eq!(offset_of!(CannPackageVersion, reserved), 384);
        assert_eq!(size_of::<CannPackage>(), 4);
        assert_eq!((CannPackage::CANN.0, CannPackage::DRIVER.0), (0, 7));
        let mut v = CannPackageVersion::default();
        v.version[..7].copy_from_slice(b"8.1.RC1");
        assert_eq!(v.version(), "8.1.RC1");
        v.version = [b'9'; PKG_VERSION_MAX_SIZE];
        assert_eq!(v.version().len(), PKG_VERSION_MAX_SIZE);
    }

    #[test]
    fn enums_are_four_bytes() {
        assert_eq!(size_of::<MemMallocPolicy>(), 4);
        assert_eq!(size_of::<MemAttr>(), 4);
        assert_eq!(size_of::<EventStatus>(), 4);
        assert_eq!(size_of::<EventRecordedStatus>(), 4);
        assert_eq!(size_of::<MemGranularityOptions>(), 4);
        assert_eq!(size_of::<EventFlags>(), 4);
    }

    #[test]
    fn enum_values_match_headers() {
        assert_eq!(MemMallocPolicy::HUGE_FIRST.0, 0);
        assert_eq!(MemMallocPolicy::HUGE1G_ONLY.0, 6);
        assert_eq!(MemMallocPolicy::HUGE1G_ONLY_P2P.0, 7);
        assert_eq!(
            (MemMallocPolicy::HUGE_ONLY | MemPolicyBits::TYPE_HIGH_BAND_WIDTH).0,
            0x1001
        );
        assert_eq!(MemAttr::HBM_MEM.0, 1);
        assert_eq!(MemAttr::HBM_MEM_HUGE.0, 4);
        assert_eq!(MemAttr::HBM_MEM_HUGE1G.0, 10);
        assert_eq!(MemAttr::MEM_P2P_HUGE1G.0, 17);
        // The two event status enums have opposite polarity.
        assert_eq!(EventStatus::COMPLETE.0, 0);
        assert_eq!(EventRecordedStatus::COMPLETE.0, 1);
        assert_eq!(EventRecordedStatus::NOT_READY.0, 0);
        assert_eq!(EventFlags::CAPTURE_STREAM_PROGRESS.bits(), 0x2);
        assert_eq!(EventFlags::TORCH_DEFAULT.bits(), 0x0E);
        assert!(EventFlags::TORCH_DEFAULT.contains(EventFlags::TIME_LINE));
        assert_eq!(MemGranularityOptions::UNDEF.0, 0xFFFF);
        assert_eq!(MemLocationType::DEVICE.0, 1);
        assert_eq!(MemcpyKind::DEVICE_TO_HOST.0, 2);
    }

    #[test]
    fn names_and_debug() {
        assert_eq!(MemAttr::HBM_MEM.name(), Some("HBM_MEM"));
        assert_eq!(MemAttr(99).name(), None);
        assert_eq!(format!("{:?}", MemAttr::HBM_MEM), "MemAttr::HBM_MEM");
        assert_eq!(format!("{:?}", MemAttr(99)), "MemAttr(0x63)");
    }

    #[test]
    fn device_ptr_roundtrip() {
        assert_eq!(DevicePtr::from_addr(0), None);
        assert_eq!(DevicePtr::new(ptr::null_mut()), None);
        let p = DevicePtr::from_addr(0x1240_0000_0000).unwrap();
        assert_eq!(p.addr(), 0x1240_0000_0000);
        assert_eq!(p.as_ptr() as usize, 0x1240_0000_0000);
        assert_eq!(p.offset(0x200).unwrap().addr(), 0x1240_0000_0200);
        assert_eq!(DevicePtr::from_addr(u64::MAX).unwrap().offset(1), None);
        assert_eq!(format!("{p:?}"), "DevicePtr(0x124000000000)");
        assert!(p < p.offset(1).unwrap());
    }

    #[test]
    fn device_prop_is_torch_npus() {
        let p = PhysicalMemProp::device(3, MemAttr::HBM_MEM_HUGE);
        assert_eq!(p.handle_type, MemHandleType::NONE);
        assert_eq!(p.allocation_type, MemAllocationType::PINNED);
        assert_eq!(p.location.kind, MemLocationType::DEVICE);
        assert_eq!(p.location.id, 3);
        assert_eq!(p.reserve, 0);
    }
}
