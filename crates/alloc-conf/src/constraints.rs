//! The checks between keys (torch_npu's "使用约束"), run after every item has been read, in the
//! documented order (docs/alloc-conf.md). Each key gets at most one warning from them; the effects always apply.

use alloc::format;
use alloc::string::String;

use crate::keys::{KEY_COUNT, Key};
use crate::state::State;
use crate::warning::WarningKind;

/// torch's `kLargeBuffer`, the default `large_segment_size_mb`.
const DEFAULT_LARGE_SEGMENT: u64 = 20 * crate::MIB;

/// Applies the checks between keys to a fully read configuration.
pub(crate) fn check(st: &mut State) {
    let mut warned = [false; KEY_COUNT];
    let mut warn = |st: &mut State, key: Key, kind: WarningKind, message: String| {
        if !warned[key.index()] {
            warned[key.index()] = true;
            st.warn(kind, key.name(), message);
        }
    };
    let given = |st: &State, key: Key| st.given[key.index()];
    let mb = |bytes: u64| bytes / crate::MIB;
    let large = st.conf.large_segment_size;

    // 1. Sizes below the large segment size; the default stays.
    if let Some(split) = st.conf.max_split_size.filter(|&s| s < large) {
        warn(
            st,
            Key::MaxSplitSizeMb,
            WarningKind::InvalidValue,
            format!(
                "CachingAllocator option max_split_size_mb too small, must be >= \
                 large_segment_size_mb ({}), got {}",
                mb(large),
                mb(split)
            ),
        );
        st.conf.max_split_size = None;
        st.given[Key::MaxSplitSizeMb.index()] = false;
    }
    if given(st, Key::MaxNonSplitRoundingMb) && st.conf.max_non_split_rounding < large {
        warn(
            st,
            Key::MaxNonSplitRoundingMb,
            WarningKind::InvalidValue,
            format!(
                "CachingAllocator option max_non_split_rounding_mb too small, must be >= \
                 large_segment_size_mb ({}), got {}",
                mb(large),
                mb(st.conf.max_non_split_rounding)
            ),
        );
        st.given[Key::MaxNonSplitRoundingMb.index()] = false;
    }
    if !given(st, Key::MaxNonSplitRoundingMb) {
        // Its default is the large segment size.
        st.conf.max_non_split_rounding = large;
    }

    // 2. Expandable segments with a split cap or a GC threshold.
    if st.conf.expandable_segments
        && (given(st, Key::MaxSplitSizeMb) || given(st, Key::GarbageCollectionThreshold))
    {
        warn(
            st,
            Key::ExpandableSegments,
            WarningKind::Conflict,
            String::from(
                "`max_split_size_mb` or `garbage_collection_threshold`, cannot be enabled with \
                 `expandable_segments`; `expandable_segments` is changed to `False`",
            ),
        );
        st.conf.expandable_segments = false;
    }

    // 3. Host register with expandable pinned memory.
    if st.conf.pinned_mem_register && st.conf.pin_memory_expandable_segments {
        warn(
            st,
            Key::PinnedMemRegister,
            WarningKind::Conflict,
            String::from(
                "`pinned_mem_register` cannot be enabled with `pin_memory_expandable_segments`; \
                 `pinned_mem_register` is changed to `False`",
            ),
        );
        st.conf.pinned_mem_register = false;
    }

    // 4. Expandable-only settings without expandable segments.
    if !st.conf.expandable_segments {
        for key in [Key::BaseAddrAlignedKb, Key::SegmentSizeMb] {
            if given(st, key) {
                warn(
                    st,
                    key,
                    WarningKind::Ineffective,
                    format!(
                        "{} only takes effect with expandable_segments:True; the value is kept \
                         but unused",
                        key.name()
                    ),
                );
            }
        }
    }

    // 5. Two names for the large-pool page: the newer one wins, unless it is 20, which
    //    torch_npu cannot tell from its default (it tests `large_segment_size != 20 MiB`), so
    //    `segment_size_mb` then decides.
    if given(st, Key::LargeSegmentSizeMb) && large != DEFAULT_LARGE_SEGMENT {
        if given(st, Key::SegmentSizeMb) {
            warn(
                st,
                Key::SegmentSizeMb,
                WarningKind::Conflict,
                format!(
                    "segment_size_mb is overridden by large_segment_size_mb ({} MiB)",
                    mb(large)
                ),
            );
        }
        st.conf.segment_size = large;
    }

    // 6. page_size wins over the segment keys for the large pool.
    if st.conf.page_size.is_some() {
        if given(st, Key::LargeSegmentSizeMb) {
            warn(
                st,
                Key::LargeSegmentSizeMb,
                WarningKind::Conflict,
                String::from(
                    "large_segment_size_mb is configured together with page_size; page_size takes \
                     priority and large-pool segments are whole GiB",
                ),
            );
        }
        if given(st, Key::SegmentSizeMb) && st.conf.expandable_segments {
            warn(
                st,
                Key::SegmentSizeMb,
                WarningKind::Conflict,
                String::from(
                    "segment_size_mb is configured together with page_size; page_size takes \
                     priority and large-pool pages are whole GiB",
                ),
            );
        }
    }
}
