//! The one module that names `std::sync` or `loom::sync` (tokio's `loom` shim): everything else
//! in the crate imports its locks and shared pointers from here, so `--cfg loom` swaps them all
//! for loom's model-checked versions.
//!
//! [`Mutex::lock`] ignores poisoning (tokio's `loom/std/mutex.rs`): a panic while a device's
//! allocator was locked cannot leave it half-updated in a way poisoning would catch better,
//! since `alloc-core` only changes its state after each device call succeeds.
//!
//! [`global`] holds the process-wide pieces at the API edge (the environment's configuration,
//! the warn-once registry, backend ids). Loom never models them: no model reaches them.

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

#[cfg(loom)]
use loom::sync as inner;
#[cfg(not(loom))]
use std::sync as inner;

/// A guard of [`Mutex`].
pub(crate) type MutexGuard<'a, T> = inner::MutexGuard<'a, T>;

/// A mutex whose `lock` never fails: a poisoned lock is entered anyway.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(inner::Mutex<T>);

impl<T> Mutex<T> {
    /// A new unlocked mutex holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Mutex(inner::Mutex::new(value))
    }

    /// Locks, waiting as long as needed; poisoning is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Process-global synchronization at the API edge, always `std` (never inside a loom model).
pub(crate) mod global {
    pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
    pub(crate) use std::sync::{Mutex, OnceLock};
}
