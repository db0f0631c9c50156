//! The std runtime of npu-alloc: one `alloc-core` caching allocator per device behind a lock,
//! the ACL device backend, and the torch-named API.
//!
//! - [`NpuAllocator`] (a [`Runtime`] over [`AclBackend`]) is what a program uses:
//!   `malloc(size, device, stream)`, `free`, `record_stream`, `empty_cache`, `memory_stats`,
//!   `memory_allocated`, `mem_get_info`, `memory_summary`, ... with torch's names and numbers.
//! - [`AclBackend`] / [`AclDevice`] drive `libascendcl` (loaded at run time by `acl-sys`):
//!   `aclrtSetDevice` per thread, `aclrtMallocAlign32` (or `aclrtMalloc`) with
//!   `ACL_MEM_MALLOC_HUGE_FIRST`, `aclrtSynchronizeDevice` before frees, pooled events polled
//!   with torch_npu's polarity, `aclrtGetMemInfo(ACL_HBM_MEM)`.
//! - [`Config`] is read once from the environment (`alloc-conf`'s variables and
//!   `PYTORCH_NO_NPU_MEMORY_CACHING`), or given explicitly; warnings go to the `log` crate once.
//! - Every lock comes from the `sync` module, which is `loom`'s under `--cfg loom`; the loom
//!   models in `tests/loom_*.rs` drive [`Runtime`] over a mock [`Backend`].
//!
//! Addresses are plain `u64` device addresses; nothing here dereferences them.

mod acl_device;
mod api;
mod backend;
mod config;
mod device_allocator;
mod error;
mod no_caching;
mod route;
mod summary;
mod sync;
mod warn_once;

pub use acl_device::{AclBackend, AclDevice};
pub use acl_sys::{AclError, Lib, Stream};
pub use alloc_core::{DeviceStats, GcStatus, OutOfMemory, SegmentInfo, StreamId};
pub use api::{NpuAllocator, OomObserver, Result, Runtime};
pub use backend::Backend;
pub use config::{Config, ConfigWarning, NO_CACHING_ENV};
pub use error::RuntimeError;
pub use summary::memory_summary;
