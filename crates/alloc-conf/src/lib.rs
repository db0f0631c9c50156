//! The allocator configuration: the typed [`AllocConf`] that `alloc-core` consumes, and the grammar
//! of `PYTORCH_NPU_ALLOC_CONF`-style strings (the repository's `docs/alloc-conf.md`).
//!
//! - [`parse`] reads a string into a [`Parsed`]: the configuration plus typed [`Warning`]s. Bad
//!   input never aborts; it is reported and ignored, and the default stays. [`Parsed::strict`]
//!   (or [`parse_strict`]) turns any warning into a [`StrictError`], torch's behaviour.
//! - [`from_env`] picks the string: an explicit one, else `MINDTORCH_NPU_ALLOC_CONF`,
//!   `PYTORCH_NPU_ALLOC_CONF`, `PYTORCH_ALLOC_CONF`, `PYTORCH_CUDA_ALLOC_CONF` through a lookup
//!   closure of raw bytes (a set value that is not UTF-8 wins as any set value does, with a
//!   `not_utf8` warning), and reports the [`Source`] that won.
//! - [`AllocConf`]'s `Display` writes the canonical string, which parses back to the same value.
//!
//! `no_std` + `alloc`, no I/O and no printing: callers decide how to report warnings.
//!
//! ```
//! use alloc_conf::{MIB, WarningKind, from_env, parse};
//!
//! let p = parse("max_split_size_mb:32, garbage_collection_threshold=0.6, foo:1,");
//! assert_eq!(p.conf.max_split_size, Some(32 * MIB));
//! assert_eq!(p.conf.garbage_collection_threshold, Some(0.6));
//! assert_eq!(p.warnings[0].kind, WarningKind::UnknownKey);
//! assert_eq!(p.conf.to_string(), "max_split_size_mb:32,garbage_collection_threshold:0.6");
//!
//! // The environment is a closure returning a variable's bytes: here only
//! // PYTORCH_CUDA_ALLOC_CONF is set (a program passes `std::env::var_os` and
//! // `OsString::into_encoded_bytes`).
//! let l = from_env(None, |name| {
//!     (name == "PYTORCH_CUDA_ALLOC_CONF").then(|| b"expandable_segments:True".to_vec())
//! });
//! assert_eq!(l.source.map(|s| s.name()), Some("PYTORCH_CUDA_ALLOC_CONF"));
//! assert!(l.parsed.conf.expandable_segments);
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

extern crate alloc;
#[cfg(test)]
extern crate std;

mod canonical;
mod conf;
mod constraints;
mod env;
mod keys;
mod lex;
mod parse;
mod roundup;
mod state;
mod warning;

pub use conf::{AllocConf, Backend, MIB, ROUNDUP_BUCKETS};
pub use env::{ENV_VARS, Loaded, Source, env_text, from_env, select};
pub use keys::{Key, UNSUPPORTED_KEYS};
pub use parse::{Parsed, RUN_TIME_KEYS, parse, parse_settings, parse_strict};
pub use warning::{StrictError, Warning, WarningKind};
