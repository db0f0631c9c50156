//! The configurations `tune` may recommend: one value per policy key, the values each key may
//! take (a coarse set for the first grid, a fine set for refinement), and which combinations are
//! allowed. A combination is allowed only if alloc-conf reads it without a single warning, so no
//! documented conflict between keys is ever recommended, and, for torch_npu, only if torch_npu
//! treats it as npu-alloc does.

use core::fmt::{self, Write};

/// The policy keys `tune` searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// `expandable_segments`.
    ExpandableSegments,
    /// `max_split_size_mb`.
    MaxSplitSize,
    /// `max_non_split_rounding_mb`.
    MaxNonSplitRounding,
    /// `roundup_power2_divisions`, a single value or a per-bucket list.
    RoundupPower2Divisions,
    /// `garbage_collection_threshold` (with `per_process_memory_fraction` for torch_npu).
    GarbageCollectionThreshold,
    /// `large_segment_size_mb`.
    LargeSegmentSize,
    /// `segment_size_mb`, the large-pool page of expandable segments.
    SegmentSize,
    /// `base_addr_aligned_kb`.
    BaseAddrAligned,
    /// `page_size`.
    PageSize,
}

impl Key {
    /// Every key, in the order alloc-conf's canonical form writes them.
    pub const ALL: [Key; 9] = [
        Key::ExpandableSegments,
        Key::MaxSplitSize,
        Key::MaxNonSplitRounding,
        Key::RoundupPower2Divisions,
        Key::GarbageCollectionThreshold,
        Key::LargeSegmentSize,
        Key::SegmentSize,
        Key::BaseAddrAligned,
        Key::PageSize,
    ];

    /// The key's name in a config string.
    pub fn name(self) -> &'static str {
        match self {
            Key::ExpandableSegments => "expandable_segments",
            Key::MaxSplitSize => "max_split_size_mb",
            Key::MaxNonSplitRounding => "max_non_split_rounding_mb",
            Key::RoundupPower2Divisions => "roundup_power2_divisions",
            Key::GarbageCollectionThreshold => "garbage_collection_threshold",
            Key::LargeSegmentSize => "large_segment_size_mb",
            Key::SegmentSize => "segment_size_mb",
            Key::BaseAddrAligned => "base_addr_aligned_kb",
            Key::PageSize => "page_size",
        }
    }

    /// The key named `name` (`segment_size_mb`, …), if `tune` searches it.
    pub fn from_name(name: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The key this one acts only beside, set: `segment_size_mb` and `base_addr_aligned_kb`
    /// need expandable segments, `max_non_split_rounding_mb` a split cap.
    fn needs(self) -> Option<Key> {
        match self {
            Key::SegmentSize | Key::BaseAddrAligned => Some(Key::ExpandableSegments),
            Key::MaxNonSplitRounding => Some(Key::MaxSplitSize),
            _ => None,
        }
    }

    /// Whether the search for `target` gives this key any value but its default: not
    /// `segment_size_mb` for torch_npu, which deprecates it.
    fn searched_for(self, target: Target) -> bool {
        !(self == Key::SegmentSize && target == Target::TorchNpu)
    }
}

/// Whose allocator the recommendation is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Target {
    /// npu-alloc: every key and value it implements.
    #[default]
    NpuAlloc,
    /// torch_npu master (older releases refuse some keys: [`TORCH_NPU_RELEASES`]): only what
    /// torch_npu accepts and treats as npu-alloc does
    /// (`garbage_collection_threshold` only with a `per_process_memory_fraction`, since
    /// torch_npu runs GC only under a fraction; no `page_size:1g` with `max_split_size_mb`,
    /// where npu-alloc deliberately differs), and without `segment_size_mb`, which torch_npu
    /// deprecates with a warning at every parse: `large_segment_size_mb` sets the same page,
    /// up to 512 MiB under expandable segments.
    TorchNpu,
}

/// Keys that torch_npu releases before some version refuse ("Unrecognized CachingAllocator
/// option" at the first allocation), with the releases that accept them, read from each
/// branch's `NPUAllocatorConfig.cpp`. `--target torch_npu` is master's parser.
pub const TORCH_NPU_RELEASES: [(&str, &str); 3] = [
    ("per_process_memory_fraction", "v2.10.0-26.1.0 and later"),
    ("large_segment_size_mb", "v2.11.0-26.1.0 and later"),
    (
        "max_non_split_rounding_mb",
        "master and the v2.11.0 and v2.12.0 branches (no 26.1.0 release)",
    ),
];

/// The keys of canonical configuration `conf` that older torch_npu releases refuse, each with
/// the releases that accept it.
pub fn recent_keys(conf: &str) -> Vec<(&'static str, &'static str)> {
    TORCH_NPU_RELEASES
        .into_iter()
        .filter(|(key, _)| conf.split(',').any(|kv| kv.split(':').next() == Some(*key)))
        .collect()
}

/// `roundup_power2_divisions`: unset, one value for every bucket, or a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Roundup {
    /// Every bucket `d`.
    Uniform(u32),
    /// A list, as written in the config string.
    List(&'static str),
}

/// One configuration: a value (or the default, `None`) per key.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Candidate {
    /// `expandable_segments:True`.
    pub expandable: bool,
    /// `max_split_size_mb`.
    pub max_split_mb: Option<u64>,
    /// `max_non_split_rounding_mb`.
    pub max_non_split_mb: Option<u64>,
    /// `roundup_power2_divisions`.
    pub roundup: Option<Roundup>,
    /// `garbage_collection_threshold`.
    pub gc_threshold: Option<f64>,
    /// `per_process_memory_fraction`, paired with the GC threshold for torch_npu.
    pub fraction: Option<f64>,
    /// `large_segment_size_mb`.
    pub large_segment_mb: Option<u64>,
    /// `segment_size_mb`.
    pub segment_mb: Option<u64>,
    /// `base_addr_aligned_kb`.
    pub base_addr_aligned_kb: Option<u64>,
    /// `page_size:1g`.
    pub page_1g: bool,
}

impl Candidate {
    /// Whether `key` has a value other than its default.
    fn sets(&self, key: Key) -> bool {
        match key {
            Key::ExpandableSegments => self.expandable,
            Key::MaxSplitSize => self.max_split_mb.is_some(),
            Key::MaxNonSplitRounding => self.max_non_split_mb.is_some(),
            Key::RoundupPower2Divisions => self.roundup.is_some(),
            Key::GarbageCollectionThreshold => self.gc_threshold.is_some(),
            Key::LargeSegmentSize => self.large_segment_mb.is_some(),
            Key::SegmentSize => self.segment_mb.is_some(),
            Key::BaseAddrAligned => self.base_addr_aligned_kb.is_some(),
            Key::PageSize => self.page_1g,
        }
    }
}

impl fmt::Display for Candidate {
    /// The config string as given to alloc-conf (not yet canonical).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items = String::new();
        let mut item = |key: &str, value: &dyn fmt::Display| {
            let sep = if items.is_empty() { "" } else { "," };
            let _ = write!(items, "{sep}{key}:{value}");
        };
        if self.expandable {
            item("expandable_segments", &"True");
        }
        if let Some(v) = self.max_split_mb {
            item("max_split_size_mb", &v);
        }
        if let Some(v) = self.max_non_split_mb {
            item("max_non_split_rounding_mb", &v);
        }
        match self.roundup {
            Some(Roundup::Uniform(d)) => item("roundup_power2_divisions", &d),
            Some(Roundup::List(l)) => item("roundup_power2_divisions", &l),
            None => {}
        }
        if let Some(v) = self.gc_threshold {
            item("garbage_collection_threshold", &v);
        }
        if let Some(v) = self.fraction {
            item("per_process_memory_fraction", &v);
        }
        if let Some(v) = self.large_segment_mb {
            item("large_segment_size_mb", &v);
        }
        if let Some(v) = self.segment_mb {
            item("segment_size_mb", &v);
        }
        if let Some(v) = self.base_addr_aligned_kb {
            item("base_addr_aligned_kb", &v);
        }
        if self.page_1g {
            item("page_size", &"1g");
        }
        f.write_str(&items)
    }
}

/// A key's values (`None`: its default), coarse for the grid or fine for refinement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detail {
    Coarse,
    Fine,
}

const SPLIT_COARSE: &[u64] = &[64, 256, 1024];
const SPLIT_FINE: &[u64] = &[
    32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096,
];
const NON_SPLIT_FINE: &[u64] = &[40, 64, 128, 256, 512, 1024];
const ROUNDUP_COARSE: &[Roundup] = &[
    Roundup::Uniform(4),
    Roundup::Uniform(8),
    Roundup::List("[256:1,512:2,1024:4,>:8]"),
];
const ROUNDUP_FINE: &[Roundup] = &[
    Roundup::Uniform(2),
    Roundup::Uniform(4),
    Roundup::Uniform(8),
    Roundup::Uniform(16),
    Roundup::Uniform(32),
    Roundup::List("[256:1,512:2,1024:4,>:8]"),
    Roundup::List("[64:1,>:4]"),
    Roundup::List("[1:4,>:1]"),
    Roundup::List("[1:8,>:2]"),
];
const GC_COARSE: &[f64] = &[0.8];
const GC_FINE: &[f64] = &[0.5, 0.6, 0.7, 0.8, 0.9, 0.95];
/// The fractions torch_npu needs for GC to run at all: close to the whole device.
const FRACTIONS: &[f64] = &[0.99, 0.95];
const LARGE_SEGMENT_FINE: &[u64] = &[12, 16, 32, 40, 64, 128];
/// For torch_npu under expandable segments, `large_segment_size_mb` also takes the pages
/// `segment_size_mb` would have (torch_npu deprecates that key).
const LARGE_SEGMENT_FINE_PAGES: &[u64] = &[12, 16, 32, 40, 64, 128, 256, 512];
const SEGMENT_COARSE: &[u64] = &[64];
const SEGMENT_FINE: &[u64] = &[32, 64, 128, 256, 512];
const BASE_ALIGNED_FINE: &[u64] = &[0, 4, 8];

/// The values of `key` in `c` (other keys kept), at `detail`, the current one included.
pub(crate) fn neighbours(
    c: &Candidate,
    key: Key,
    detail: Detail,
    target: Target,
) -> Vec<Candidate> {
    fn with<T: Copy>(
        c: &Candidate,
        values: &[T],
        set: impl Fn(&mut Candidate, Option<T>),
    ) -> Vec<Candidate> {
        core::iter::once(None)
            .chain(values.iter().copied().map(Some))
            .map(|v| {
                let mut n = *c;
                set(&mut n, v);
                n
            })
            .collect()
    }
    let coarse = detail == Detail::Coarse;
    // A key that cannot apply next to the others' values (alloc-conf would warn, or the value
    // would change nothing) takes only its default: fewer candidates to generate.
    let conflicts =
        matches!(key, Key::MaxSplitSize | Key::GarbageCollectionThreshold) && c.expandable;
    let applies = key.searched_for(target) && key.needs().is_none_or(|k| c.sets(k)) && !conflicts;
    if !applies {
        let mut d = *c;
        match key {
            Key::MaxSplitSize => d.max_split_mb = None,
            Key::GarbageCollectionThreshold => (d.gc_threshold, d.fraction) = (None, None),
            Key::MaxNonSplitRounding => d.max_non_split_mb = None,
            Key::SegmentSize => d.segment_mb = None,
            _ => d.base_addr_aligned_kb = None,
        }
        return vec![d];
    }
    match key {
        Key::ExpandableSegments => [false, true]
            .into_iter()
            .map(|e| Candidate {
                expandable: e,
                ..*c
            })
            .collect(),
        Key::MaxSplitSize => with(c, if coarse { SPLIT_COARSE } else { SPLIT_FINE }, |n, v| {
            n.max_split_mb = v
        }),
        Key::MaxNonSplitRounding => with(c, if coarse { &[] } else { NON_SPLIT_FINE }, |n, v| {
            n.max_non_split_mb = v
        }),
        Key::RoundupPower2Divisions => with(
            c,
            if coarse { ROUNDUP_COARSE } else { ROUNDUP_FINE },
            |n, v| n.roundup = v,
        ),
        Key::GarbageCollectionThreshold => {
            let thresholds = if coarse { GC_COARSE } else { GC_FINE };
            let mut out = vec![Candidate {
                gc_threshold: None,
                fraction: None,
                ..*c
            }];
            for &t in thresholds {
                match target {
                    Target::NpuAlloc => out.push(Candidate {
                        gc_threshold: Some(t),
                        fraction: None,
                        ..*c
                    }),
                    Target::TorchNpu => out.extend(FRACTIONS.iter().map(|&f| Candidate {
                        gc_threshold: Some(t),
                        fraction: Some(f),
                        ..*c
                    })),
                }
            }
            out
        }
        Key::LargeSegmentSize => {
            let values = match (coarse, target) {
                (true, _) => &[][..],
                (false, Target::TorchNpu) if c.expandable => LARGE_SEGMENT_FINE_PAGES,
                (false, _) => LARGE_SEGMENT_FINE,
            };
            with(c, values, |n, v| n.large_segment_mb = v)
        }
        Key::SegmentSize => with(
            c,
            if coarse { SEGMENT_COARSE } else { SEGMENT_FINE },
            |n, v| n.segment_mb = v,
        ),
        Key::BaseAddrAligned => with(c, if coarse { &[] } else { BASE_ALIGNED_FINE }, |n, v| {
            n.base_addr_aligned_kb = v
        }),
        Key::PageSize => [false, true]
            .into_iter()
            .map(|p| Candidate { page_1g: p, ..*c })
            .collect(),
    }
}

/// The keys of `keys` that this search leaves at their default whatever the workload, and
/// why: each needs another key that is not among `keys`, or the target does not take it.
pub fn inert_keys(keys: &[Key], target: Target) -> Vec<(Key, &'static str)> {
    keys.iter()
        .filter_map(|&k| {
            let why = if !k.searched_for(target) {
                "torch_npu deprecates it (large_segment_size_mb sets the same page)"
            } else {
                match k.needs() {
                    Some(Key::ExpandableSegments) if !keys.contains(&Key::ExpandableSegments) => {
                        "it acts only with expandable_segments"
                    }
                    Some(Key::MaxSplitSize) if !keys.contains(&Key::MaxSplitSize) => {
                        "it acts only with max_split_size_mb"
                    }
                    _ => return None,
                }
            };
            Some((k, why))
        })
        .collect()
}

/// Whether `c` sets only `keys` (the default of every other key).
pub(crate) fn within(c: &Candidate, keys: &[Key]) -> bool {
    Key::ALL.iter().all(|&k| !c.sets(k) || keys.contains(&k))
}

/// Why a candidate is not offered, if it is not: alloc-conf warns about it, or the target
/// treats it differently. Otherwise its canonical string.
pub(crate) fn canonical(c: &Candidate, target: Target) -> Option<String> {
    if target == Target::TorchNpu {
        if c.gc_threshold.is_some() != c.fraction.is_some() {
            return None;
        }
        if c.page_1g && c.max_split_mb.is_some() {
            return None;
        }
    }
    // A value that changes nothing is not a different configuration: it only makes the string
    // longer (alloc-conf warns about some of these, e.g. segment_size_mb without expandable
    // segments; the rest are caught here).
    if c.max_non_split_mb.is_some() && c.max_split_mb.is_none() {
        return None;
    }
    let parsed = alloc_conf::parse(&c.to_string());
    if !parsed.warnings.is_empty() {
        return None;
    }
    Some(parsed.conf.to_string())
}
