//! Which device a pointer belongs to, without a process-wide map.
//!
//! torch keeps every live pointer in one hash map (`allocated_blocks`, sharded under locks)
//! so that `free(ptr)` finds its device. Each device's `alloc-core` allocator already keeps its
//! own address index, so a second one costs two extra lock/hash round trips per malloc + free for
//! nothing. Instead each device records the lowest and highest address it ever returned
//! ([`Span`]); `free` asks the opened devices whose span holds the pointer first, and the first
//! that knows it answers. With one device in use that is one range check.
//!
//! The spans are a fast path, not the truth. A thread that got a pointer through a relaxed
//! handoff may still see the owner's span, or the owner itself, as it was before the malloc; so
//! when no candidate knows the pointer, `free` asks every device again, each opened slot read
//! under its creation lock and each allocator under its own lock, which are ordered after the
//! malloc that returned the pointer.

use crate::sync::{AtomicU64, Ordering};

/// The lowest and highest address a device has returned (empty at first).
#[derive(Debug)]
pub(crate) struct Span {
    lo: AtomicU64,
    hi: AtomicU64,
}

impl Span {
    /// A span that holds nothing.
    pub(crate) fn new() -> Self {
        Span {
            lo: AtomicU64::new(u64::MAX),
            hi: AtomicU64::new(0),
        }
    }

    /// Widens the span to hold `addr` (stores only when it grows).
    #[inline]
    pub(crate) fn note(&self, addr: u64) {
        if addr < self.lo.load(Ordering::Relaxed) {
            self.lo.fetch_min(addr, Ordering::Relaxed);
        }
        if addr > self.hi.load(Ordering::Relaxed) {
            self.hi.fetch_max(addr, Ordering::Relaxed);
        }
    }

    /// Whether the device may own `addr`.
    #[inline]
    pub(crate) fn may_hold(&self, addr: u64) -> bool {
        self.lo.load(Ordering::Relaxed) <= addr && addr <= self.hi.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn grows_to_hold_every_noted_address() {
        let span = Span::new();
        assert!(!span.may_hold(0));
        assert!(!span.may_hold(u64::MAX));
        span.note(0x2000);
        assert!(span.may_hold(0x2000));
        assert!(!span.may_hold(0x1fff));
        assert!(!span.may_hold(0x2001));
        span.note(0x1000);
        span.note(0x3000);
        span.note(0x2800);
        assert!(span.may_hold(0x1000) && span.may_hold(0x2abc) && span.may_hold(0x3000));
        assert!(!span.may_hold(0xfff) && !span.may_hold(0x3001));
    }
}
