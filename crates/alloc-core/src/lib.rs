//! The policy core of npu-alloc: PyTorch's caching-allocator behaviour, with no FFI, threads,
//! clocks or `unsafe`, driven through the [`Device`] trait.
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;
#[cfg(test)]
extern crate std;

mod device;

pub use alloc_conf::AllocConf;
pub use device::{Device, DeviceError, MemInfo, StreamId};
