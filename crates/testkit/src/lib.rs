//! What only tests need: proptest strategies that draw `.trace` operations ([`strategy`]), the
//! interleaved timing of the ratio benches ([`paired`]), and the handle on the fake
//! `libascendcl` ([`fake_acl`]; the library itself is `testkit/fake-ascendcl`), and reading a
//! snapshot with Python's own `pickle` ([`python_snapshot`]).
//!
//! Nothing here is needed by a program at run time.
// `fake_acl` is an FFI edge (it calls the fake's C controls); nothing else here is unsafe.
#![deny(unsafe_code)]
#![warn(unreachable_pub)]

pub mod fake_acl;
pub mod paired;
pub mod python_snapshot;
pub mod strategy;

pub use paired::{Paired, PairedResult};
