//! The policy core of npu-alloc: PyTorch's caching-allocator behaviour, with no FFI, threads or
//! clocks (and `forbid(unsafe_code)`), driven through the [`Device`] trait.
//!
//! [`Allocator`] is one device's cache. A runtime wraps it in a lock per device, implements
//! [`Device`] over its driver, and calls [`Allocator::malloc`] / [`Allocator::free`]. Everything
//! the user can observe (rounding, pools, split and merge, the miss path, GC aging, stats) follows
//! PyTorch's `CUDACachingAllocator`; where torch_npu differs (the 32-byte pad, the OOM message, the
//! retry chain after a device error) torch_npu wins, and docs/deviations.md lists the few
//! deliberate differences.
#![no_std]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

extern crate alloc;
#[cfg(test)]
extern crate std;

mod address_index;
mod allocator;
mod block;
mod counters;
mod device;
mod error;
mod expandable;
mod free;
mod garbage_collection;
mod history;
mod malloc;
mod memory_saver;
mod oom_retry;
mod pool;
mod private_pool;
mod release;
pub mod size;
mod size_class;
mod snapshot;
mod sorted_bin;
mod split;
mod stats;
mod stream_events;
#[cfg(test)]
mod test_rng;

pub use alloc_conf::AllocConf;
pub use allocator::{Allocator, DeviceFacts, Flavour, MAX_RESERVE, Notice};
pub use device::{Device, DeviceError, MemInfo, Stream, VmmError};
pub use error::{AllocError, FormatSize, FractionError, FreeError, OutOfMemory, Rejection};
pub use expandable::{ExpandableInfo, Held};
pub use garbage_collection::GcStatus;
pub use history::{Action, Context, TraceEntry};
pub use memory_saver::{CpuBackup, SaverError, SaverStats, TagStats};
pub use oom_retry::{HostQueue, MallocStep, PendingMalloc};
pub use private_pool::{PoolError, PoolId};
pub use size::PoolKind;
pub use snapshot::{BlockInfo, BlockState, SegmentInfo};
pub use split::should_split;
pub use stats::{DeviceStats, STAT_ARRAY_NAMES, Stat, StatArray};
