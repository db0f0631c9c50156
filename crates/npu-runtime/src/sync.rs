//! The one module that names `std::sync` or `loom::sync` (tokio's `loom` shim): everything else
//! in the crate imports its locks and shared pointers from here, so `--cfg loom` swaps them all
//! for loom's model-checked versions.
//!
//! [`Mutex`] is a compare-and-swap lock with a spin, yield and sleep wait, not `std`'s futex
//! mutex: its release is a plain store (see its doc for why and what that costs). It has no
//! poisoning (tokio's `loom/std/mutex.rs` ignores it too): a panic while a device's allocator
//! was locked cannot leave it half-updated in a way poisoning would catch better, since
//! `alloc-core` only changes its state after each device call succeeds.
//!
//! [`global`] holds the process-wide pieces at the API edge (the environment's configuration,
//! the warn-once registry, backend ids). Loom never models them: no model reaches them.

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
/// The lock's counters: only ever relaxed, as they steer who tries, never what is ordered.
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::thread_local;
#[cfg(not(loom))]
pub(crate) use std::thread_local;

/// A guard of [`Mutex`]: the lock is released when it drops.
#[cfg(loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;
/// A guard of [`Mutex`]: the lock is released when it drops (a plain store).
#[cfg(not(loom))]
pub(crate) type MutexGuard<'a, T> = spin::mutex::SpinMutexGuard<'a, T>;

/// A mutex whose `lock` never fails (no poisoning), taken by one compare-and-swap and released
/// by a plain store; a thread that finds it held spins briefly, then yields, then sleeps in
/// growing steps ([`Backoff`]); a waiter that was overtaken after it had spun and yielded
/// goes ahead of every thread that has not registered so.
///
/// Not `std::sync::Mutex`: its release is an atomic swap, because it has to learn whether a
/// waiter sleeps on the futex and wake it, and a malloc and a free each take a device's lock
/// once, so that swap was about half of the runtime's own cost per cache-hit pair. Here nobody
/// is woken: a sleeping waiter looks again when its sleep ends, up to [`Backoff::MAX_SLEEP`]
/// (plus the kernel's timer slack) after the release. A cache hit holds the lock for well
/// under a microsecond; polling events, a device's segment malloc (unless
/// `release_lock_on_npumalloc`), a synchronize (`empty_cache`, the OOM retry, every free
/// without caching) hold it for microseconds to milliseconds, and a waiter sleeping through
/// those is served up to a millisecond late. Under contention it avoids the futex's two
/// system calls per hand-over.
///
/// Fairness: with no wake-up, a thread that keeps retaking the lock would win nearly every
/// time against a sleeping waiter (a waiter taking the lock every 200 µs against such a
/// thread was overtaken 600,000 times at the 90th percentile). So the holder counts each take
/// (`taken`, a load and a store under the lock, no read-modify-write), and a waiter that has
/// spun and yielded and sees the count moved registers as `starving` and starts its backoff
/// again. While any waiter starves, no other thread keeps the lock: a fast path that takes it
/// gives it straight back, and a waiting thread does not try. The counters are relaxed, so a
/// take may slip past a registration: at most one did in the tests. This is eventual
/// fairness, in the spirit of `parking_lot`'s (which hands the lock over directly, on a
/// timer): a waiter still spinning races the holder, which keeps hand-overs cheap, and is
/// overtaken as often as the holder can retake the lock in its spin and yield time (100 –
/// 200 times in the test, a measurement, not a bound). Starving waiters race among
/// themselves, and one that slept its way up to long steps during a long hold may lose to
/// later ones. A strict rule (starving at the first overtake) made every hand-over wait for
/// the other thread's backoff: two threads on one device then took 1.7 – 2.1 µs a pair,
/// against 0.35 – 0.62 µs now and 0.55 – 0.84 µs with `std`'s mutex (several runs each).
///
/// Under loom the lock is loom's model of a mutex, so the models check the runtime's own
/// protocol within their preemption bound; the compare-and-swap and the waiting are not
/// modelled.
#[cfg(not(loom))]
#[derive(Debug, Default)]
// The counters right before `inner`, whose lock word rustc places before the data (the test
// `the_counters_precede_the_lock_word` checks it): the fast path then touches one cache line,
// the lock's, besides the data's, whatever the size of `T`.
#[repr(C)]
pub struct Mutex<T> {
    /// Waiters that another thread overtook and that have not taken the lock yet.
    starving: AtomicU32,
    /// How many times the lock was taken (modulo 2^32); written only by the holder.
    taken: AtomicU32,
    inner: spin::mutex::SpinMutex<T>,
}

/// Loom's model of a mutex, poisoning ignored.
#[cfg(loom)]
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Mutex<T> {
    /// A new unlocked mutex holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    /// Locks, waiting as long as needed; a panic while it was held does not poison it.
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(not(loom))]
impl<T> Mutex<T> {
    /// A new unlocked mutex holding `value`.
    pub fn new(value: T) -> Self {
        Mutex {
            starving: Default::default(),
            taken: Default::default(),
            inner: spin::mutex::SpinMutex::new(value),
        }
    }

    /// Locks, waiting as long as needed; a panic while it was held does not poison it.
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        // The compare-and-swap first, then the starving test: runtime_hit 1.246 - 1.251
        // against 1.256 - 1.273 the other way round (3 interleaved rounds). Taken while a
        // waiter starves, the lock is given straight back.
        if let Some(guard) = self.inner.try_lock()
            && self.starving.load(Relaxed) == 0
        {
            self.count_take();
            return guard;
        }
        self.lock_contended()
    }

    /// Counts a take; called by the new holder only, so a load and a store suffice.
    #[inline]
    fn count_take(&self) {
        self.taken
            .store(self.taken.load(Relaxed).wrapping_add(1), Relaxed);
    }

    /// [`Mutex::lock`] when the lock was held or a waiter starves: wait by [`Backoff`], trying
    /// again only when the lock reads free (so waiters do not keep taking its cache line from
    /// the holder) and, unless this thread starves itself, no waiter starves.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) -> MutexGuard<'_, T> {
        let mut backoff = Backoff::default();
        let first_seen = self.taken.load(Relaxed);
        let mut starving = false;
        loop {
            if (starving || self.starving.load(Relaxed) == 0)
                && !self.inner.is_locked()
                && let Some(guard) = self.inner.try_lock()
            {
                self.count_take();
                if starving {
                    self.starving.fetch_sub(1, Relaxed);
                }
                return guard;
            }
            if !starving && backoff.sleeps_next() && self.taken.load(Relaxed) != first_seen {
                // Overtaken, and about to sleep: served before the threads that have not
                // waited that long, and looking again soon, as the lock is about to be left
                // free for this thread.
                starving = true;
                self.starving.fetch_add(1, Relaxed);
                #[cfg(test)]
                tests::REGISTERED_AT.with(|at| at.set(Some(self.taken.load(Relaxed))));
                backoff = Backoff::default();
            }
            backoff.wait();
        }
    }

    /// Whether some thread holds the lock.
    #[cfg(test)]
    fn is_locked(&self) -> bool {
        self.inner.is_locked()
    }
}

/// How a thread waits for a held [`Mutex`]: spin (short holds: a cache hit, another thread's
/// free), then give the core away (the holder may be preempted, with more threads than
/// cores), then sleep (a hold across a device call), each sleep twice the last up to
/// [`Backoff::MAX_SLEEP`].
#[cfg(not(loom))]
#[derive(Debug, Default)]
struct Backoff {
    /// How many waits so far.
    round: u32,
}

/// One wait of a [`Backoff`].
#[cfg(not(loom))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// This many spin-loop hints.
    Spin(u32),
    /// `std::thread::yield_now`.
    Yield,
    /// `std::thread::sleep` for this long.
    Sleep(std::time::Duration),
}

#[cfg(not(loom))]
impl Backoff {
    /// Rounds of spinning: 1, 2, 4, ... 64 hints (127 in all; a hint takes from a few to
    /// about 150 cycles, depending on the CPU).
    const SPINS: u32 = 7;
    /// Rounds of yielding after the spins.
    const YIELDS: u32 = 10;
    /// The first sleep; each later one doubles.
    const FIRST_SLEEP: std::time::Duration = std::time::Duration::from_micros(16);
    /// The longest sleep: a waiter sees a release at most this late.
    const MAX_SLEEP: std::time::Duration = std::time::Duration::from_millis(1);

    /// The next wait.
    fn next(&mut self) -> Wait {
        let round = self.round;
        self.round = self.round.saturating_add(1);
        if round < Self::SPINS {
            return Wait::Spin(1 << round);
        }
        if round < Self::SPINS + Self::YIELDS {
            return Wait::Yield;
        }
        let doublings = (round - Self::SPINS - Self::YIELDS).min(16);
        Wait::Sleep((Self::FIRST_SLEEP * (1 << doublings)).min(Self::MAX_SLEEP))
    }

    /// Whether the next wait is a sleep.
    fn sleeps_next(&self) -> bool {
        self.round >= Self::SPINS + Self::YIELDS
    }

    /// Waits once.
    fn wait(&mut self) {
        match self.next() {
            Wait::Spin(hints) => (0..hints).for_each(|_| core::hint::spin_loop()),
            Wait::Yield => std::thread::yield_now(),
            Wait::Sleep(time) => std::thread::sleep(time),
        }
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

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn backoff_spins_then_yields_then_sleeps_doubling_up_to_a_millisecond() {
        let mut backoff = Backoff::default();
        let waits: Vec<Wait> = (0..26).map(|_| backoff.next()).collect();
        let spins = [1, 2, 4, 8, 16, 32, 64].map(Wait::Spin);
        assert_eq!(waits[..7], spins);
        assert!(waits[7..17].iter().all(|w| *w == Wait::Yield));
        let sleeps = [16, 32, 64, 128, 256, 512, 1000, 1000, 1000]
            .map(|us| Wait::Sleep(Duration::from_micros(us)));
        assert_eq!(waits[17..], sleeps);
        // It never overflows, however long a waiter waits.
        backoff.round = u32::MAX - 1;
        assert_eq!(backoff.next(), Wait::Sleep(Backoff::MAX_SLEEP));
        assert_eq!(backoff.next(), Wait::Sleep(Backoff::MAX_SLEEP));
    }

    #[test]
    fn contending_threads_each_see_every_other_threads_writes() {
        // A read-modify-write of plain data under the lock from four threads loses nothing.
        let counter = Arc::new(Mutex::new((0u64, 0u64)));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let counter = Arc::clone(&counter);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut c = counter.lock();
                        c.0 += 1;
                        c.1 += t;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*counter.lock(), (80_000, 20_000 * (1 + 2 + 3)));
    }

    #[test]
    fn a_sleeping_waiter_takes_the_lock_after_a_long_hold() {
        let lock = Arc::new(Mutex::new(Vec::new()));
        let mut held = lock.lock();
        let (done, finished) = std::sync::mpsc::channel();
        {
            let lock = Arc::clone(&lock);
            std::thread::spawn(move || {
                lock.lock().push("waiter");
                done.send(()).unwrap();
            });
        }
        // Long enough for the waiter to reach its sleeps.
        std::thread::sleep(Duration::from_millis(30));
        held.push("holder");
        drop(held);
        finished
            .recv_timeout(Duration::from_secs(60))
            .expect("the waiter took the lock after its release");
        assert_eq!(*lock.lock(), ["holder", "waiter"]);
        assert!(!lock.is_locked());
    }

    std::thread_local! {
        /// The count of takes when this thread last registered as starving.
        pub(super) static REGISTERED_AT: std::cell::Cell<Option<u32>> =
            const { std::cell::Cell::new(None) };
    }

    #[test]
    fn a_waiter_that_registered_as_starving_is_served_next() {
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        // One thread retakes the lock in a loop, with a short critical section like a cache
        // hit's; this thread takes it 200 times, sleeping 200 µs in between.
        let lock = Arc::new(Mutex::new(0u64));
        let stop = Arc::new(AtomicBool::new(false));
        let (busy_done, busy_finished) = std::sync::mpsc::channel();
        {
            let (lock, stop) = (Arc::clone(&lock), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    let mut n = lock.lock();
                    for _ in 0..40 {
                        *n = std::hint::black_box(*n).wrapping_add(1);
                    }
                }
                busy_done.send(()).unwrap();
            });
        }
        let (mut registered, mut worst) = (0, 0);
        for _ in 0..200 {
            std::thread::sleep(Duration::from_micros(200));
            REGISTERED_AT.with(|at| at.set(None));
            let held = lock.lock();
            let after = lock.taken.load(Relaxed);
            drop(held);
            if let Some(at) = REGISTERED_AT.with(|at| at.get()) {
                registered += 1;
                // Takes by the busy thread between registering and this take (`after`
                // counts this one): none, unless its fast path read the count of starving
                // waiters just before this thread raised it. Without the rule it went on
                // taking the lock, millions of times.
                worst = worst.max(after.wrapping_sub(at).wrapping_sub(1));
            }
        }
        stop.store(true, Relaxed);
        busy_finished
            .recv_timeout(Duration::from_secs(60))
            .expect("the busy thread stopped");
        // Against a thread that holds the lock most of the time, the waiter gets past its
        // spins and yields in some of its takes (26 – 167 of the 200 in four runs here).
        assert!(
            registered > 0,
            "the waiter never starved: the test measured nothing"
        );
        assert!(
            worst <= 2,
            "overtaken {worst} times after registering as starving"
        );
        assert_eq!(lock.starving.load(Relaxed), 0);
        assert!(!lock.is_locked());
    }

    #[test]
    fn the_counters_precede_the_lock_word() {
        // `spin`'s lock is its lock word, then its data: the data starts one alignment step
        // after the lock does, so the word sits right after the two counters.
        let lock = Mutex::new([0u64; 256]);
        let start = &raw const lock as usize;
        let inner = &raw const lock.inner as usize;
        assert_eq!(inner - start, 8);
        assert_eq!(lock.inner.as_mut_ptr() as usize - inner, align_of::<u64>());
    }

    #[test]
    fn no_thread_keeps_the_lock_while_a_waiter_starves() {
        use std::sync::atomic::Ordering::Relaxed;
        let lock = Arc::new(Mutex::new(()));
        // As if a waiter had registered: a new taker gives the lock straight back and waits.
        lock.starving.store(1, Relaxed);
        let (took, taken) = std::sync::mpsc::channel();
        {
            let lock = Arc::clone(&lock);
            std::thread::spawn(move || {
                let _held = lock.lock();
                took.send(()).unwrap();
            });
        }
        assert!(taken.recv_timeout(Duration::from_millis(50)).is_err());
        assert!(!lock.is_locked());
        // The waiter has taken the lock and left.
        lock.starving.store(0, Relaxed);
        taken
            .recv_timeout(Duration::from_secs(60))
            .expect("the taker took the lock once no waiter starved");
    }

    #[test]
    fn a_panic_while_held_does_not_poison() {
        let lock = Arc::new(Mutex::new(1));
        let panicked = {
            let lock = Arc::clone(&lock);
            std::thread::spawn(move || {
                let _held = lock.lock();
                panic!("while holding the lock");
            })
            .join()
        };
        assert!(panicked.is_err());
        // Unwinding released it.
        assert!(!lock.is_locked());
        *lock.lock() += 1;
        assert_eq!(*lock.lock(), 2);
    }
}
