//! The allocator configuration: the typed [`AllocConf`] that `alloc-core` consumes, and (in
//! `parse`) the grammar of `PYTORCH_NPU_ALLOC_CONF`-style strings with typed warnings.
//!
//! `no_std` + `alloc`, no I/O and no printing: callers decide how to report warnings.
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;
#[cfg(test)]
extern crate std;

mod conf;

pub use conf::{AllocConf, Backend, MIB, ROUNDUP_BUCKETS};
