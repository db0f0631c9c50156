//! npu-alloc as a C library (`libnpu_alloc.so`, header `include/npu_alloc.h`).
//!
//! - The pluggable-allocator pair with the signatures torch_npu's `NPUPluggableAllocator`
//!   calls ([`npu_alloc_malloc`], [`npu_alloc_free`]) and the optional hooks of its C++ class
//!   ([`npu_alloc_init`], [`npu_alloc_reset`], [`npu_alloc_set_memory_fraction`],
//!   [`npu_alloc_base_alloc`], [`npu_alloc_record_stream`], [`npu_alloc_erase_stream`],
//!   [`npu_alloc_reset_peak_stats`]).
//! - Direct entry points, each returning an [`NpuAllocStatus`], for what torch_npu does not
//!   forward to a pluggable allocator: stats as JSON, `empty_cache`, `mem_get_info`, the memory
//!   fraction, run-time settings, history and snapshots, private pools, the memory saver and its
//!   CPU backups.
//! - [`npu_alloc_last_error`]: the last failure of this thread as text.
//!
//! The process-wide runtime is made on first use from the environment: `libascendcl.so` from
//! `NPU_ALLOC_ACL_LIB` or the CANN install search of `acl-sys`, the configuration from the
//! alloc-conf variables (`PYTORCH_NPU_ALLOC_CONF`, ...). No policy lives here. No panic crosses
//! the boundary: each export catches it and reports [`NpuAllocStatus::Panic`].
// The FFI edge: raw pointers from C are read here, each with its `SAFETY` line.
#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod error;
mod exports;
mod hook;
mod observe;
mod saver_settings;
mod stderr_log;

pub use error::NpuAllocStatus;
pub use exports::*;
pub use hook::{NpuAllocSyncHook, npu_alloc_acl_synchronize, npu_alloc_set_synchronize_hook};
pub use observe::*;
pub use saver_settings::*;
