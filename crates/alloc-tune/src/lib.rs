//! `tune`: which allocator configuration fits a workload, found offline by replaying its trace
//! through the exact policy under candidate configurations.
//!
//! - [`space`] holds the keys that change memory, their values and which combinations are
//!   allowed (never one alloc-conf warns about; for torch_npu, only what it treats alike).
//! - [`search`] replays the default, a readable grid, then refinements around the best, in
//!   parallel with rayon, bounded by a number of evaluations and deterministic.
//!
//! The objective: the lowest peak reserved with no out-of-memory error at the capacity, ties
//! broken by fewer device mallocs and frees (each a slow driver call on real hardware).

pub mod search;
pub mod space;

pub use search::{DEFAULT_EVALS, Eval, Options, Outcome, TuneError, tune};
pub use space::{Candidate, Key, Roundup, TORCH_NPU_RELEASES, Target, inert_keys, recent_keys};
