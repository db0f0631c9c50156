//! Garbage collection of cached segments: torch's `garbage_collect_cached_blocks`.
//!
//! When the bytes of all segments exceed `garbage_collection_threshold` × the memory limit, whole
//! free large-pool segments are released, oldest first: a pass frees every such segment whose
//! age (pool lookups since it became free) is at least the average age, and passes repeat until
//! enough is reclaimed. Torch only has a limit when a fraction is set; here the device's total
//! memory serves when no fraction is set (a deliberate deviation, docs/deviations.md), and GC is
//! off when neither is known.

use alloc::vec::Vec;

use crate::allocator::Allocator;
use crate::device::Device;
use crate::size::PoolKind;

/// Whether and how garbage collection runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GcStatus {
    /// No `garbage_collection_threshold` is set.
    Off,
    /// A threshold is set but there is no memory limit to apply it to (no fraction and no total).
    Unavailable,
    /// GC runs on a cache miss once segments exceed `limit` bytes.
    On {
        /// threshold × (fraction-limited or total) memory.
        limit: u64,
    },
}

impl<D: Device> Allocator<D> {
    /// The memory GC measures against: the fraction limit, else the device total.
    fn gc_memory(&self) -> Option<u64> {
        self.allowed.or(self.total_memory)
    }

    /// Whether garbage collection runs, and its limit.
    pub fn gc_status(&self) -> GcStatus {
        // torch requires a threshold > 0; the parser rejects 0, but fields are public.
        let threshold = self.conf.garbage_collection_threshold.filter(|&t| t > 0.0);
        match (threshold, self.gc_memory()) {
            (None, _) => GcStatus::Off,
            (Some(_), None) => GcStatus::Unavailable,
            (Some(t), Some(memory)) => GcStatus::On {
                limit: (t * memory as f64) as u64,
            },
        }
    }

    /// Whether lookups tick the GC clock and misses run GC.
    pub(crate) fn gc_enabled(&self) -> bool {
        self.gc_limit.is_some()
    }

    /// Whether GC would free something now: reserved above its limit and a candidate to free
    /// (a pass then frees at least the oldest). Under a host queue, whether a miss must drain it
    /// first: torch_npu synchronizes only once it has a candidate.
    pub(crate) fn gc_due(&self) -> bool {
        self.gc_limit
            .is_some_and(|limit| self.total_allocated > limit)
            && self.has_gc_candidate()
    }

    /// Whether the default large pool holds a whole free segment, what GC releases. Cold and out
    /// of line: sharing an iterator of the candidates with `garbage_collect_cached_blocks` moved
    /// the whole-program build's code and cost the hit pair 4 instructions.
    #[cold]
    #[inline(never)]
    fn has_gc_candidate(&self) -> bool {
        let pool = &self.pools[(0, PoolKind::Large)];
        pool.iter().any(|id| self.is_whole_segment(id))
    }

    /// Recomputes the cached GC limit after the fraction changed.
    pub(crate) fn update_gc_limit(&mut self) {
        self.gc_limit = match self.gc_status() {
            GcStatus::On { limit } => Some(limit),
            GcStatus::Off | GcStatus::Unavailable => None,
        };
    }

    /// torch's `garbage_collect_cached_blocks`.
    pub(crate) fn garbage_collect_cached_blocks(&mut self) -> Result<(), D::Error> {
        let Some(limit) = self.gc_limit else {
            return Ok(());
        };
        if self.total_allocated <= limit {
            return Ok(());
        }
        let target = self.total_allocated - limit;
        // torch looks at the default large pool only.
        let pool = &self.pools[(0, PoolKind::Large)];
        let mut total_age = 0.0f64;
        let mut candidates = 0u64;
        // Blocks of expandable segments are never released here (as in CUDA; docs/deviations.md).
        for id in pool.iter() {
            if self.is_whole_segment(id) {
                total_age += pool.age(&self.blocks, id) as f64;
                candidates += 1;
            }
        }
        if candidates == 0 {
            return Ok(());
        }
        let mut synchronized = false;
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && candidates > 0 {
            let threshold = total_age / candidates as f64;
            freed_any = false;
            // A whole pass in pool order; it is not cut short once the target is met.
            let pool = &self.pools[(0, PoolKind::Large)];
            let old: Vec<_> = pool
                .iter()
                .filter(|&id| self.is_whole_segment(id))
                .map(|id| (id, pool.age(&self.blocks, id)))
                .filter(|&(_, age)| age as f64 >= threshold)
                .collect();
            for (id, age) in old {
                if !synchronized {
                    self.device.synchronize()?;
                    synchronized = true;
                }
                let size = self.blocks[id].size;
                self.release_block(id)?;
                freed_any = true;
                reclaimed += size;
                total_age -= age as f64;
                candidates -= 1;
            }
        }
        Ok(())
    }
}
