//! The key table: every key the parser understands, its aliases, and the keys torch or torch_npu
//! know that mean nothing here yet (`unsupported_key` rather than `unknown_key`).

/// A supported config key (aliases such as `release_lock_on_cudamalloc` map to their key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// `max_split_size_mb`: blocks this size or larger are never split.
    MaxSplitSizeMb,
    /// `max_non_split_rounding_mb`: how far an oversize cached block may exceed the request.
    MaxNonSplitRoundingMb,
    /// `large_segment_size_mb`: torch's `kLargeBuffer`.
    LargeSegmentSizeMb,
    /// `garbage_collection_threshold`: start reclaiming cached blocks above this fraction.
    GarbageCollectionThreshold,
    /// `expandable_segments`: virtual-memory segments that grow in pages.
    ExpandableSegments,
    /// `base_addr_aligned_kb`: base address alignment of large expandable allocations.
    BaseAddrAlignedKb,
    /// `page_size`: 1 GiB large-pool granularity.
    PageSize,
    /// `segment_size_mb`: torch_npu's older name for the large-pool page of expandable segments.
    SegmentSizeMb,
    /// `roundup_power2_divisions`: power-of-two rounding divisions per size bucket.
    RoundupPower2Divisions,
    /// `per_process_memory_fraction`: memory fraction applied at start.
    PerProcessMemoryFraction,
    /// `release_lock_on_npumalloc` (alias `release_lock_on_cudamalloc`).
    ReleaseLockOnNpumalloc,
    /// `multi_stream_lazy_reclaim`: a malloc polls the events of cross-stream frees only when
    /// more than 512 are pending or its pool has no block for it.
    MultiStreamLazyReclaim,
    /// `throw_on_npumalloc_oom`: a segment that would take the device's bytes past the
    /// configured fraction of its total is refused at once, with no retry.
    ThrowOnNpumallocOom,
    /// `pinned_use_background_threads` (host allocator).
    PinnedUseBackgroundThreads,
    /// `pin_memory_expandable_segments` (host allocator).
    PinMemoryExpandableSegments,
    /// `pinned_mem_register` (host allocator).
    PinnedMemRegister,
    /// `pinned_num_register_threads` (host allocator).
    PinnedNumRegisterThreads,
    /// `backend`: only `native`.
    Backend,
}

/// Number of supported keys.
pub(crate) const KEY_COUNT: usize = 18;

impl Key {
    /// Every supported key, in the order of docs/alloc-conf.md's table (and of the canonical string).
    pub const ALL: [Key; KEY_COUNT] = [
        Key::MaxSplitSizeMb,
        Key::MaxNonSplitRoundingMb,
        Key::LargeSegmentSizeMb,
        Key::GarbageCollectionThreshold,
        Key::ExpandableSegments,
        Key::BaseAddrAlignedKb,
        Key::PageSize,
        Key::SegmentSizeMb,
        Key::RoundupPower2Divisions,
        Key::PerProcessMemoryFraction,
        Key::ReleaseLockOnNpumalloc,
        Key::MultiStreamLazyReclaim,
        Key::ThrowOnNpumallocOom,
        Key::PinnedUseBackgroundThreads,
        Key::PinMemoryExpandableSegments,
        Key::PinnedMemRegister,
        Key::PinnedNumRegisterThreads,
        Key::Backend,
    ];

    /// The key's name in a config string.
    pub fn name(self) -> &'static str {
        match self {
            Key::MaxSplitSizeMb => "max_split_size_mb",
            Key::MaxNonSplitRoundingMb => "max_non_split_rounding_mb",
            Key::LargeSegmentSizeMb => "large_segment_size_mb",
            Key::GarbageCollectionThreshold => "garbage_collection_threshold",
            Key::ExpandableSegments => "expandable_segments",
            Key::BaseAddrAlignedKb => "base_addr_aligned_kb",
            Key::PageSize => "page_size",
            Key::SegmentSizeMb => "segment_size_mb",
            Key::RoundupPower2Divisions => "roundup_power2_divisions",
            Key::PerProcessMemoryFraction => "per_process_memory_fraction",
            Key::ReleaseLockOnNpumalloc => "release_lock_on_npumalloc",
            Key::MultiStreamLazyReclaim => "multi_stream_lazy_reclaim",
            Key::ThrowOnNpumallocOom => "throw_on_npumalloc_oom",
            Key::PinnedUseBackgroundThreads => "pinned_use_background_threads",
            Key::PinMemoryExpandableSegments => "pin_memory_expandable_segments",
            Key::PinnedMemRegister => "pinned_mem_register",
            Key::PinnedNumRegisterThreads => "pinned_num_register_threads",
            Key::Backend => "backend",
        }
    }

    /// The key a (case-sensitive) name or alias denotes, if it is supported.
    pub fn from_name(name: &str) -> Option<Key> {
        if name == "release_lock_on_cudamalloc" {
            return Some(Key::ReleaseLockOnNpumalloc);
        }
        Key::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Position in [`Key::ALL`], for per-key flags.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Keys torch or torch_npu know that have no meaning here yet: an `unsupported_key` warning.
pub const UNSUPPORTED_KEYS: [&str; 7] = [
    "graph_capture_record_stream_reuse",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "release_lock_on_hipmalloc",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
    "pinned_reserve_segment_size_mb",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_index_matches_position() {
        for (i, k) in Key::ALL.into_iter().enumerate() {
            assert_eq!(Key::from_name(k.name()), Some(k));
            assert_eq!(k.index(), i);
        }
        assert_eq!(
            Key::from_name("release_lock_on_cudamalloc"),
            Some(Key::ReleaseLockOnNpumalloc)
        );
        assert_eq!(Key::from_name("Max_split_size_mb"), None);
        for name in UNSUPPORTED_KEYS {
            assert_eq!(Key::from_name(name), None);
        }
    }
}
