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
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::thread_local;
#[cfg(not(loom))]
pub(crate) use std::thread_local;

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

/// A value created once on first use and then read without a lock (the device table: a device's
/// allocator lives as long as the runtime, and every malloc and free looks it up).
///
/// Creation is serialized by a [`Mutex`] of this module, so the `std` `OnceLock` inside is only
/// ever written by the one thread holding that lock and never waits; that keeps it correct inside
/// loom models too, where loom schedules the creation lock and the read is a plain load.
#[derive(Debug)]
pub(crate) struct OnceSlot<T> {
    value: std::sync::OnceLock<T>,
    init: Mutex<()>,
}

impl<T> OnceSlot<T> {
    /// An empty slot.
    pub(crate) fn new() -> Self {
        OnceSlot {
            value: std::sync::OnceLock::new(),
            init: Mutex::new(()),
        }
    }

    /// The value, if it was created.
    #[inline]
    pub(crate) fn get(&self) -> Option<&T> {
        self.value.get()
    }

    /// The value, if it was created, read under the creation lock: a creation that finished
    /// before any event this thread has observed is seen, whatever memory order carried the news.
    pub(crate) fn get_synchronized(&self) -> Option<&T> {
        if let Some(value) = self.value.get() {
            return Some(value);
        }
        let _created = self.init.lock();
        self.value.get()
    }

    /// The value, created by `create` if this is the first call; a failed creation leaves the
    /// slot empty for the next caller.
    #[inline]
    pub(crate) fn get_or_try_init<E>(
        &self,
        create: impl FnOnce() -> Result<T, E>,
    ) -> Result<&T, E> {
        match self.value.get() {
            Some(value) => Ok(value),
            None => self.init(create),
        }
    }

    /// The first-use path of [`OnceSlot::get_or_try_init`], out of the hot path.
    #[cold]
    fn init<E>(&self, create: impl FnOnce() -> Result<T, E>) -> Result<&T, E> {
        let _creating = self.init.lock();
        if let Some(value) = self.value.get() {
            return Ok(value);
        }
        let value = create()?;
        Ok(self.value.get_or_init(|| value))
    }
}

/// Process-global synchronization at the API edge, always `std` (never inside a loom model).
pub(crate) mod global {
    pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
    pub(crate) use std::sync::{Mutex, OnceLock};
}
