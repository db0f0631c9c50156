//! The typed configuration value shared by the parser and the policy core.

/// One mebibyte, the unit of torch's `*_mb` keys.
pub const MIB: u64 = 1 << 20;

/// Number of `roundup_power2_divisions` buckets: bucket `i` covers `[2^i MiB, 2^(i+1) MiB)`.
pub const ROUNDUP_BUCKETS: usize = 16;

/// The allocator backend; only torch's `native` caching allocator exists here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The caching allocator (torch's `native`).
    #[default]
    Native,
}

/// Every setting of the caching allocator, in bytes where torch's keys are in MiB or KiB.
///
/// `Default` is torch's default configuration (an empty config string).
#[derive(Debug, Clone, PartialEq)]
pub struct AllocConf {
    /// Blocks this size or larger are never split; `None` means unlimited (torch's `SIZE_MAX`).
    pub max_split_size: Option<u64>,
    /// How far an oversize cached block may exceed an oversize request (default 20 MiB).
    pub max_non_split_rounding: u64,
    /// Segment size for large-pool requests under 10 MiB, torch's `kLargeBuffer` (default 20 MiB).
    pub large_segment_size: u64,
    /// Fraction of the allowed memory above which cached segments are garbage collected.
    pub garbage_collection_threshold: Option<f64>,
    /// Whether expandable (virtual-memory) segments are requested.
    pub expandable_segments: bool,
    /// Base address alignment of large expandable allocations in bytes (512 for `0`).
    pub base_addr_aligned: u64,
    /// Large-pool segment granularity when `page_size:1g` is set (1 GiB), else `None`.
    pub page_size: Option<u64>,
    /// Large-pool page of expandable segments (torch_npu's `segment_size_mb`), in bytes.
    pub segment_size: u64,
    /// Power-of-two divisions per size bucket; 0 or 1 means 512-byte rounding only.
    pub roundup_power2_divisions: [u32; ROUNDUP_BUCKETS],
    /// Per-process memory fraction applied at start (1.0 means no limit).
    pub per_process_memory_fraction: f64,
    /// Release the allocator lock around the device malloc.
    pub release_lock_on_npumalloc: bool,
    /// torch_npu's lazy reclaim: a malloc polls the pending events of cross-stream frees only
    /// when more than 512 are pending, or after its pool had no block for it.
    pub multi_stream_lazy_reclaim: bool,
    /// torch_npu's pre-emptive rejection: a device segment that would take the allocator's
    /// segments past `per_process_memory_fraction` of the device's total is refused, counted in
    /// `num_oom_rejections`, and the malloc fails at once, with no retry.
    pub throw_on_npumalloc_oom: bool,
    /// Host allocator: process events on background threads.
    pub pinned_use_background_threads: bool,
    /// Host allocator: expandable segments for pinned memory.
    pub pin_memory_expandable_segments: bool,
    /// Host allocator: register pinned memory with the device.
    pub pinned_mem_register: bool,
    /// Host allocator: threads used to register pinned memory (a power of two, ≤ 128).
    pub pinned_num_register_threads: u32,
    /// The allocator backend.
    pub backend: Backend,
}

impl AllocConf {
    /// The `roundup_power2_divisions` value for a byte size: bucket
    /// `clamp(floor(log2(size)) - 20, 0, 15)`, so sizes below 1 MiB share bucket 0.
    #[inline]
    pub fn roundup_divisions(&self, size: u64) -> u32 {
        let log2 = size.max(1).ilog2() as usize;
        self.roundup_power2_divisions[log2.saturating_sub(20).min(ROUNDUP_BUCKETS - 1)]
    }
}

impl Default for AllocConf {
    fn default() -> Self {
        AllocConf {
            max_split_size: None,
            max_non_split_rounding: 20 * MIB,
            large_segment_size: 20 * MIB,
            garbage_collection_threshold: None,
            expandable_segments: false,
            base_addr_aligned: 16 * 1024,
            page_size: None,
            segment_size: 20 * MIB,
            roundup_power2_divisions: [0; ROUNDUP_BUCKETS],
            per_process_memory_fraction: 1.0,
            release_lock_on_npumalloc: false,
            multi_stream_lazy_reclaim: false,
            throw_on_npumalloc_oom: false,
            pinned_use_background_threads: false,
            pin_memory_expandable_segments: false,
            pinned_mem_register: false,
            pinned_num_register_threads: 1,
            backend: Backend::Native,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundup_bucket_of_a_size() {
        let mut c = AllocConf::default();
        for (i, d) in c.roundup_power2_divisions.iter_mut().enumerate() {
            *d = i as u32 + 100;
        }
        assert_eq!(c.roundup_divisions(0), 100);
        assert_eq!(c.roundup_divisions(512), 100);
        assert_eq!(c.roundup_divisions(2 * MIB - 1), 100);
        assert_eq!(c.roundup_divisions(2 * MIB), 101);
        assert_eq!(c.roundup_divisions(84 * MIB), 106);
        assert_eq!(c.roundup_divisions(400 * MIB), 108);
        assert_eq!(c.roundup_divisions(1200 * MIB), 110);
        assert_eq!(c.roundup_divisions(32 << 30), 115);
        assert_eq!(c.roundup_divisions(u64::MAX), 115);
    }
}
