//! The std runtime of npu-alloc: one `alloc-core` caching allocator per device behind a lock,
//! the ACL device backend, and the torch-named API.
//!
//! - [`NpuAllocator`] (a [`Runtime`] over [`AclDevice`]s) is what a program uses:
//!   `malloc(size, device, stream)`, `free`, `record_stream`, `empty_cache`, `memory_stats`,
//!   `memory_allocated`, `mem_get_info`, `memory_summary`, ... with torch's names and numbers.
//! - [`Runtime`] is generic over `alloc-core`'s one [`Device`](alloc_core::Device) trait: the
//!   runtime's tests, loom models and benches run it over `alloc-sim`'s simulated device.
//! - [`AclPlatform`] / [`AclDevice`] drive `libascendcl` (loaded at run time by `acl-sys`):
//!   `aclrtSetDevice` per thread, `aclrtMallocAlign32` (or `aclrtMalloc`) with
//!   `ACL_MEM_MALLOC_HUGE_FIRST`, `aclrtSynchronizeDevice` before frees, pooled events polled
//!   with torch_npu's polarity, `aclrtGetMemInfo(ACL_HBM_MEM)`.
//! - [`Config`] is read once from the environment (`alloc-conf`'s variables and
//!   `PYTORCH_NO_NPU_MEMORY_CACHING`), or given explicitly; warnings go to the `log` crate once.
//! - Every lock comes from the `sync` module, which is `loom`'s under `--cfg loom`; the loom
//!   models in `tests/loom_*.rs` drive [`Runtime`] over the simulated device.
//!
//! Addresses are plain `u64` device addresses; nothing here dereferences them.
#![warn(unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod acl_device;
mod api;
mod cann_version;
mod config;
mod device_allocator;
mod error;
mod history;
mod host_queue;
mod no_caching;
mod route;
mod scope;
mod summary;
mod sync;
mod warn_once;

pub use acl_device::{AclDevice, AclPlatform, Stream, keeping_current_device};
pub use acl_sys::{AclError, Lib};
pub use alloc_core::{
    AllocError, CpuBackup, DeviceFacts, DeviceStats, FreeError, GcStatus, HostQueue, OutOfMemory,
    PoolError, PoolId, Rejection, SaverError, SaverStats, SegmentInfo, TagStats,
};
pub use alloc_snapshot::{ExportError, WriteError};
pub use api::{NpuAllocator, OomObserver, Opener, RejectionObserver, Result, Runtime};
pub use config::{Config, ConfigWarning, NO_CACHING_ENV, env_var};
pub use device_allocator::SyncHook;
pub use error::RuntimeError;
pub use history::DumpError;
pub use scope::{MemPool, MemPoolOptions, ScopeGuard};
pub use summary::{ExpandableSummary, memory_summary};
/// The runtime's lock, for the lock floor of `benches/runtime_hit.rs`; not part of the API.
#[doc(hidden)]
#[cfg(not(loom))]
pub use sync::Mutex as RuntimeLock;
