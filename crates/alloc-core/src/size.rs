//! Size rounding, pool choice and segment sizing: torch's `round_size`, `get_pool` and
//! `get_allocation_size`, with torch_npu's 32-byte pad and `page_size:1g`.

use alloc_conf::AllocConf;

/// Size granularity; also the smallest remainder worth splitting in the small pool (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Rounded sizes up to this go to the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Large-pool requests below this get a `large_segment_size` segment (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Larger segments are rounded up to a multiple of this (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 << 20;
/// Requests of this size (1 EiB) or more are refused before the allocator runs.
pub const MAX_REQUEST: u64 = 1 << 60;

/// Which block pool a request is served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// Rounded sizes ≤ 1 MiB, packed into 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl PoolKind {
    /// The pool for a rounded size.
    #[inline]
    pub fn for_size(rounded: u64) -> PoolKind {
        if rounded <= SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    /// The pool's slot in a per-pool array: small first, as torch's `StatType` orders them
    /// after "all".
    #[inline(always)]
    pub const fn index(self) -> usize {
        match self {
            PoolKind::Small => 0,
            PoolKind::Large => 1,
        }
    }

    /// torch's name for the pool in stats keys and snapshots (`small` / `large`).
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

/// Rounds `size` up to the next power-of-two division with `divisions` steps per power of two.
///
/// A power of two is returned unchanged. torch's source example: `(1200, 4)` gives 1280.
#[inline]
pub fn roundup_power2_next_division(size: u64, divisions: u32) -> u64 {
    if size.is_power_of_two() || divisions < 2 {
        return size;
    }
    let floor2 = 1u64 << (63 - size.leading_zeros());
    let step = floor2 >> divisions.ilog2();
    if step == 0 {
        return floor2 << 1;
    }
    let down = size & !(step - 1);
    if down == size { size } else { down + step }
}

/// torch's `round_size`: 512-byte minimum and multiples, or power-of-two divisions where the
/// `roundup_power2_divisions` bucket of the size asks for them. `size` already includes any pad.
#[inline]
pub fn round_size(size: u64, conf: &AllocConf) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = conf.roundup_divisions(size);
    if divisions > 1 && size > MIN_BLOCK_SIZE * u64::from(divisions) {
        roundup_power2_next_division(size, divisions)
    } else {
        round_512(size)
    }
}

/// [`round_size`] for a configuration without `roundup_power2_divisions` (every bucket 0 or 1):
/// 512-byte multiples, with no bucket to look up. `size` is not 0.
#[inline]
pub(crate) fn round_512(size: u64) -> u64 {
    size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
}

/// Whether any `roundup_power2_divisions` bucket of `conf` rounds to divisions; without, every
/// size rounds by [`round_512`].
pub(crate) fn divides(conf: &AllocConf) -> bool {
    conf.roundup_power2_divisions.iter().any(|&d| d > 1)
}

/// torch's `get_allocation_size`: the segment to request from the device for a rounded size.
#[inline]
pub fn allocation_size(rounded: u64, conf: &AllocConf) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if let Some(page) = conf.page_size {
        // torch_npu's page_size:1g: every large-pool segment is whole pages.
        rounded.div_ceil(page) * page
    } else if rounded < MIN_LARGE_ALLOC {
        conf.large_segment_size
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc_conf::MIB;

    fn conf_with_divisions(d: u32) -> AllocConf {
        AllocConf {
            roundup_power2_divisions: [d; alloc_conf::ROUNDUP_BUCKETS],
            ..AllocConf::default()
        }
    }

    #[test]
    fn next_division_worked_examples() {
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        assert_eq!(roundup_power2_next_division(1200 * MIB, 4), 1280 * MIB);
        assert_eq!(roundup_power2_next_division(1100 * MIB, 4), 1280 * MIB);
        assert_eq!(roundup_power2_next_division(1100 * MIB, 8), 1152 * MIB);
        assert_eq!(roundup_power2_next_division(84 * MIB, 4), 96 * MIB);
        assert_eq!(roundup_power2_next_division(84 * MIB, 8), 88 * MIB);
        assert_eq!(roundup_power2_next_division(400 * MIB, 2), 512 * MIB);
        assert_eq!(
            roundup_power2_next_division(1024, 4),
            1024,
            "powers of two stay"
        );
        // step == 0: a 3-byte size with 4 divisions rounds to the next power of two.
        assert_eq!(roundup_power2_next_division(3, 4), 4);
    }

    #[test]
    fn round_size_minimum_and_multiples() {
        let c = AllocConf::default();
        assert_eq!(round_size(1, &c), 512);
        assert_eq!(round_size(511, &c), 512);
        assert_eq!(round_size(512, &c), 512);
        assert_eq!(round_size(513, &c), 1024);
        assert_eq!(round_size(84 * MIB, &c), 84 * MIB);
        assert_eq!(round_size(1200, &c), 1536);
    }

    #[test]
    fn round_size_with_divisions() {
        assert_eq!(round_size(84 * MIB, &conf_with_divisions(4)), 96 * MIB);
        assert_eq!(round_size(84 * MIB, &conf_with_divisions(8)), 88 * MIB);
        assert_eq!(round_size(1200 * MIB, &conf_with_divisions(4)), 1280 * MIB);
        assert_eq!(round_size(400 * MIB, &conf_with_divisions(2)), 512 * MIB);
        // 1200 ≤ 512·4, so the 512-multiple path wins over the division.
        assert_eq!(round_size(1200, &conf_with_divisions(4)), 1536);
        // One division means no power-of-two rounding.
        assert_eq!(
            round_size(84 * MIB + 1, &conf_with_divisions(1)),
            84 * MIB + 512
        );
    }

    #[test]
    fn pool_choice_at_one_mib() {
        assert_eq!(PoolKind::for_size(SMALL_SIZE), PoolKind::Small);
        assert_eq!(PoolKind::for_size(SMALL_SIZE + 512), PoolKind::Large);
        let c = AllocConf::default();
        // 1 MiB + 1 rounds to 1 049 088 and goes to the large pool with a 20 MiB segment.
        let r = round_size(MIB + 1, &c);
        assert_eq!(r, 1_049_088);
        assert_eq!(PoolKind::for_size(r), PoolKind::Large);
        assert_eq!(allocation_size(r, &c), 20 * MIB);
    }

    #[test]
    fn segment_sizes() {
        let c = AllocConf::default();
        assert_eq!(allocation_size(512, &c), 2 * MIB);
        assert_eq!(allocation_size(MIB, &c), 2 * MIB);
        assert_eq!(
            allocation_size(round_size(10 * MIB - 512, &c), &c),
            20 * MIB
        );
        assert_eq!(
            allocation_size(round_size(10 * MIB + 512, &c), &c),
            12 * MIB
        );
        // 10 485 759 rounds to exactly 10 MiB, which is not < 10 MiB: a 10 MiB segment.
        assert_eq!(round_size(10_485_759, &c), 10 * MIB);
        assert_eq!(allocation_size(round_size(10_485_759, &c), &c), 10 * MIB);
        let big = AllocConf {
            large_segment_size: 50 * MIB,
            ..AllocConf::default()
        };
        assert_eq!(allocation_size(5 * MIB, &big), 50 * MIB);
        let gib = AllocConf {
            page_size: Some(1 << 30),
            ..AllocConf::default()
        };
        assert_eq!(allocation_size(5 * MIB, &gib), 1 << 30);
        assert_eq!(allocation_size(1900 * MIB, &gib), 2 << 30);
        assert_eq!(
            allocation_size(MIB, &gib),
            2 * MIB,
            "page_size leaves the small pool alone"
        );
    }

    #[test]
    fn npu_pad_examples() {
        // torch_npu adds 32 bytes before rounding: 512 B takes 1024 B, 4096 B takes 4608 B,
        // and a 160 MiB tensor takes 160 MiB + 512.
        let c = AllocConf::default();
        assert_eq!(round_size(512 + 32, &c), 1024);
        assert_eq!(round_size(4096 + 32, &c), 4608);
        assert_eq!(round_size(160 * MIB + 32, &c), 160 * MIB + 512);
    }
}
