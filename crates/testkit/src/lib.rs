//! What only tests need: proptest strategies that draw `.trace` operations ([`strategy`]) and the
//! interleaved timing of the ratio benches ([`paired`]). The fake `libascendcl` lives beside it,
//! in `testkit/fake-ascendcl`.
//!
//! Nothing here is needed by a program at run time.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod paired;
pub mod strategy;

pub use paired::{Paired, PairedResult};
