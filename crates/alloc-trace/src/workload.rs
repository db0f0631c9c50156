//! Benchmark workloads shared by the criterion benches and their tests: an allocator with N
//! cached blocks of mixed sizes in both pools, the same free blocks in a bare best-fit map (the
//! least a best-fit cache can do), and long synthetic traces for replay throughput.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

use alloc_conf::AllocConf;
use alloc_core::{Allocator, DeviceFacts};
use alloc_sim::{SimDevice, SimStream};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Request sizes of the hit benchmarks: already rounded (no pad), so a hit takes a cached block
/// whole; five small-pool and five large-pool sizes, some carved from 20 MiB segments.
pub const HIT_SIZES: [u64; 10] = [
    512,
    1536,
    4 * KIB,
    64 * KIB,
    512 * KIB,
    2 * MIB,
    3 * MIB,
    12 * MIB,
    24 * MIB,
    64 * MIB,
];

/// The `i`-th request size of a hit workload.
pub fn hit_size(i: usize) -> u64 {
    HIT_SIZES[i % HIT_SIZES.len()]
}

/// Call `i` of a hit benchmark: malloc + free of the `i`-th hit size on stream 0, each size
/// hidden from the optimizer. Panics if the malloc fails (the set-ups cache every hit size).
#[inline]
pub fn hit_pair(alloc: &mut Allocator<SimDevice>, i: u64) {
    let p = alloc
        .malloc(std::hint::black_box(hit_size(i as usize)), SimStream(0))
        .expect("a cache hit");
    alloc.free(std::hint::black_box(p)).expect("just allocated");
}

/// An allocator (CUDA parity, no pad) after `cached` rounds of: allocate two blocks of
/// `hit_size(j)`, keep the first, free the second. Returns the allocator and the live addresses.
///
/// Few free blocks stay cached: each freed block is the last one carved from its segment, so it
/// merges with the segment's free tail, or it is taken again by the next allocation of its size
/// (see docs/performance.md).
pub fn cached_allocator(cached: usize) -> (Allocator<SimDevice>, Vec<u64>) {
    let mut alloc = Allocator::new(
        SimDevice::new(u64::MAX / 2),
        &AllocConf::default(),
        DeviceFacts::cuda_parity(0),
    );
    let mut live = Vec::with_capacity(cached);
    for j in 0..cached {
        let keep = alloc
            .malloc(hit_size(j), SimStream(0))
            .expect("capacity is unlimited");
        let drop = alloc
            .malloc(hit_size(j), SimStream(0))
            .expect("capacity is unlimited");
        live.push(keep);
        alloc.free(drop).expect("just allocated");
    }
    (alloc, live)
}

/// An allocator (CUDA parity, no pad) that really holds `cached` free blocks of mixed sizes: for
/// each `j`, a block of `hit_size(j)` and, right after it, a live fence of the same size; then
/// every block is freed. No freed block touches another free block, so none merges, and a hit of
/// `hit_size(i)` takes one whole (the lowest-address block of its size) and puts it back.
/// Returns the allocator and what stays live (fences, and fillers). [`fenced_free_blocks`]
/// counts the cache.
pub fn fenced_allocator(cached: usize) -> (Allocator<SimDevice>, Vec<u64>) {
    let mut alloc = Allocator::new(
        SimDevice::new(u64::MAX / 2),
        &AllocConf::default(),
        DeviceFacts::cuda_parity(0),
    );
    let mut blocks = Vec::with_capacity(cached);
    let mut fences = Vec::with_capacity(cached);
    for j in 0..cached {
        let size = hit_size(j);
        // The fence must follow its block in the same segment (a block of 10 MiB or more has a
        // segment of its own). When the block took a segment's last room and the fence went to
        // another segment, both stay live as fillers and the pair is tried again.
        loop {
            let block = alloc
                .malloc(size, SimStream(0))
                .expect("capacity is unlimited");
            let fence = alloc
                .malloc(size, SimStream(0))
                .expect("capacity is unlimited");
            fences.push(fence);
            if size >= 10 * MIB || fence == block + size {
                blocks.push(block);
                break;
            }
            fences.push(block);
        }
    }
    for b in blocks {
        alloc.free(b).expect("just allocated");
    }
    (alloc, fences)
}

/// Free blocks with a live block after them, or alone in their segment: the cached blocks a hit
/// takes whole. A segment's free tail is not one of them.
pub fn fenced_free_blocks<D: alloc_core::Device>(alloc: &Allocator<D>) -> usize {
    use alloc_core::BlockState;
    alloc
        .snapshot()
        .iter()
        .map(|seg| {
            let b = &seg.blocks;
            (0..b.len())
                .filter(|&i| {
                    b[i].state == BlockState::Inactive
                        && (b.len() == 1
                            || b.get(i + 1)
                                .is_some_and(|n| n.state != BlockState::Inactive))
                })
                .count()
        })
        .sum()
}

/// offset-allocator (4 KiB units) with the population of [`fenced_allocator`]: `cached` free
/// blocks of `hit_size(j)`, each followed by a live one.
pub fn fenced_offset_allocator(cached: usize) -> offset_allocator::Allocator<u32> {
    let mut oa =
        offset_allocator::Allocator::<u32>::with_max_allocs(u32::MAX, 2 * cached as u32 + 16);
    let mut blocks = Vec::with_capacity(cached);
    for j in 0..cached {
        let units = offset_units(hit_size(j));
        blocks.push(oa.allocate(units).expect("room for every block"));
        let _fence = oa.allocate(units).expect("room for every fence");
    }
    for b in blocks {
        oa.free(b);
    }
    oa
}

/// A size in offset-allocator's 4 KiB units (u32 units keep 2N blocks of up to 64 MiB in range).
pub fn offset_units(size: u64) -> u32 {
    size.div_ceil(4096) as u32
}

/// The allocs and frees of a trace on offset-allocator (4 KiB units): the reference for replay
/// throughput (`replay_vs_offset_allocator`). offset-allocator is O(1) and follows none of
/// torch's rules: no exact best fit, no streams, no statistics, and its caller hands back the
/// allocation it got instead of an address to look up. Every other line of the trace is left
/// out.
#[derive(Debug, Clone)]
pub struct OffsetReplay {
    ops: Vec<OffsetOp>,
    /// Slots for the trace's ids: one more than the highest id index.
    slots: usize,
}

/// One operation of an [`OffsetReplay`], on the slot of its trace id.
#[derive(Debug, Clone, Copy)]
enum OffsetOp {
    Alloc { slot: u32, units: u32 },
    Free { slot: u32 },
}

impl OffsetReplay {
    /// The allocs and frees of `trace`, in order.
    pub fn new(trace: &crate::Trace) -> OffsetReplay {
        let slot = |id: crate::IdRef| u32::try_from(id.index()).expect("fewer than 2^32 ids");
        let ops: Vec<OffsetOp> = trace
            .ops
            .iter()
            .filter_map(|op| match op.kind {
                // Checked here, outside the timing (the hit pairs' `offset_units` is not): a
                // size beyond u32 units (16 TiB) saturates, and offset-allocator refuses it.
                crate::OpKind::Alloc { id, size, .. } => Some(OffsetOp::Alloc {
                    slot: slot(id),
                    units: u32::try_from(size.div_ceil(4096)).unwrap_or(u32::MAX),
                }),
                crate::OpKind::Free { id } => Some(OffsetOp::Free { slot: slot(id) }),
                _ => None,
            })
            .collect();
        let slots = ops
            .iter()
            .map(|op| match *op {
                OffsetOp::Alloc { slot, .. } | OffsetOp::Free { slot } => slot as usize + 1,
            })
            .max()
            .unwrap_or(0);
        OffsetReplay { ops, slots }
    }

    /// Replays the operations on a fresh allocator, as a replay starts from a fresh one, and
    /// returns how many allocations it refused (a later free of their id is skipped).
    pub fn run(&self) -> usize {
        // Each live allocation and each free range between them takes a node: a node per slot
        // and one more per slot are enough.
        let nodes = u32::try_from(2 * self.slots + 16).expect("fewer than 2^31 ids");
        let mut oa = offset_allocator::Allocator::<u32>::with_max_allocs(u32::MAX, nodes);
        let mut live: Vec<Option<offset_allocator::Allocation<u32>>> = vec![None; self.slots];
        let mut refused = 0;
        for op in &self.ops {
            match *op {
                OffsetOp::Alloc { slot, units } => {
                    let got = oa.allocate(units);
                    refused += usize::from(got.is_none());
                    live[slot as usize] = got;
                }
                OffsetOp::Free { slot } => {
                    if let Some(a) = live[slot as usize].take() {
                        oa.free(a);
                    }
                }
            }
        }
        refused
    }

    /// The allocs and frees replayed.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// A bare best-fit cache: an ordered set of free (size, address) and a hash map of live blocks.
/// No streams, no split, no stats. The baseline every hit figure is divided by.
#[derive(Debug, Default)]
pub struct BestFit {
    free: BTreeSet<(u64, u64)>,
    live: HashMap<u64, u64>,
}

impl BestFit {
    /// The same free-block population as [`cached_allocator`]: `cached` blocks of
    /// `hit_size(j)` at distinct addresses.
    pub fn with_cached(cached: usize) -> BestFit {
        let mut map = BestFit::default();
        let mut addr = 1 << 32;
        for j in 0..cached {
            map.free.insert((hit_size(j), addr));
            addr += 2 * hit_size(j);
        }
        map
    }

    /// Takes the smallest free block of at least `size` bytes (lowest address on ties).
    pub fn malloc(&mut self, size: u64) -> Option<u64> {
        let &(found, addr) = self.free.range((size, 0)..).next()?;
        self.free.remove(&(found, addr));
        self.live.insert(addr, found);
        Some(addr)
    }

    /// Returns a live block to the free set.
    pub fn free(&mut self, addr: u64) -> bool {
        match self.live.remove(&addr) {
            Some(size) => self.free.insert((size, addr)),
            None => false,
        }
    }
}

/// xorshift64* from `seed`: deterministic, good enough to pick the synthetic traces' sizes
/// and ids.
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut rng = seed | 1;
    move || {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// A deterministic synthetic `.trace` of `ops` operations with the GPT-2 step's size mix: up to
/// `max_live` live allocations, allocs and frees interleaved, on one stream, pad 0.
pub fn synthetic_trace(ops: usize, max_live: usize, seed: u64) -> String {
    // Sizes seen in the shipped GPT-2 step, weighted roughly as they occur there.
    const SIZES: [u64; 12] = [
        3072, 12288, 65536, 2359296, 589824, 9437184, 8519680, 25165824, 100663296, 30720000, 1024,
        37748736,
    ];
    let mut next = xorshift(seed);
    let mut out = String::with_capacity(ops * 16);
    out.push_str("# synthetic trace (alloc_trace::workload::synthetic_trace)\npad 0\n");
    let mut live: Vec<u32> = Vec::new();
    let mut dead: Vec<u32> = Vec::new();
    let mut fresh = 0u32;
    for _ in 0..ops {
        let r = next();
        let alloc = live.is_empty() || (live.len() < max_live && r.is_multiple_of(2));
        if alloc {
            let id = dead.pop().unwrap_or_else(|| {
                fresh += 1;
                fresh - 1
            });
            let size = SIZES[(r >> 8) as usize % SIZES.len()];
            writeln!(out, "alloc a{id} {size}").expect("writing to a String");
            live.push(id);
        } else {
            let id = live.swap_remove((r >> 8) as usize % live.len());
            writeln!(out, "free a{id}").expect("writing to a String");
            dead.push(id);
        }
    }
    out
}

/// [`synthetic_trace`] with streams: allocations on streams 0 to 2, a quarter of the frees
/// after a `record` on another stream, and a `complete` of a stream now and then, so the
/// replay exercises events, pending frees and per-stream pools.
pub fn synthetic_stream_trace(ops: usize, max_live: usize, seed: u64) -> String {
    const SIZES: [u64; 8] = [3072, 12288, 65536, 589824, 2359296, 8519680, 25165824, 1024];
    let mut next = xorshift(seed);
    let mut out = String::with_capacity(ops * 16);
    out.push_str(
        "# synthetic trace with streams (alloc_trace::workload::synthetic_stream_trace)\npad 0\n",
    );
    let mut live: Vec<(u32, u64)> = Vec::new();
    let mut dead: Vec<u32> = Vec::new();
    let mut fresh = 0u32;
    let mut written = 0;
    while written < ops {
        let r = next();
        if r.is_multiple_of(16) {
            writeln!(out, "complete {}", (r >> 8) % 3).expect("writing to a String");
        } else if live.is_empty() || (live.len() < max_live && r.is_multiple_of(2)) {
            let id = dead.pop().unwrap_or_else(|| {
                fresh += 1;
                fresh - 1
            });
            let size = SIZES[(r >> 8) as usize % SIZES.len()];
            let stream = (r >> 20) % 3;
            writeln!(out, "alloc a{id} {size} {stream}").expect("writing to a String");
            live.push((id, stream));
        } else {
            let (id, stream) = live.swap_remove((r >> 8) as usize % live.len());
            if (r >> 24).is_multiple_of(4) {
                writeln!(out, "record a{id} {}", (stream + 1) % 3).expect("writing to a String");
                written += 1;
                if written == ops {
                    break;
                }
            }
            writeln!(out, "free a{id}").expect("writing to a String");
            dead.push(id);
        }
        written += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_allocator_holds_the_requested_free_blocks() {
        let (mut alloc, live) = cached_allocator(40);
        assert_eq!(live.len(), 40);
        // 40 live blocks; every freed block is cached (a segment's last one may merge with its
        // free tail, so count allocations, not blocks).
        assert_eq!(alloc.stats().allocation.all.current, 40);
        alloc_sim::check_consistency(&alloc).unwrap();
        // A pair hits the cache: no device malloc.
        let before = alloc.device().successful_mallocs();
        for i in 0..20 {
            let p = alloc.malloc(hit_size(i), SimStream(0)).unwrap();
            alloc.free(p).unwrap();
        }
        assert_eq!(alloc.device().successful_mallocs(), before);
    }

    #[test]
    fn fenced_allocators_hold_exactly_the_blocks_they_name() {
        for n in [16, 256, 4096] {
            let (mut alloc, live) = fenced_allocator(n);
            assert!(live.len() >= n);
            assert_eq!(fenced_free_blocks(&alloc), n);
            alloc_sim::check_consistency(&alloc).unwrap();
            // A pair takes a whole cached block and puts it back: no split, no merge, no miss.
            let before = alloc.device().successful_mallocs();
            for i in 0..40 {
                let p = alloc.malloc(hit_size(i), SimStream(0)).unwrap();
                assert_eq!(fenced_free_blocks(&alloc), n - 1);
                alloc.free(p).unwrap();
            }
            assert_eq!(fenced_free_blocks(&alloc), n);
            assert_eq!(alloc.device().successful_mallocs(), before);
        }
        // The old set-up holds far fewer free blocks than it names (they merge or are reused).
        let (alloc, _live) = cached_allocator(4096);
        assert!(
            fenced_free_blocks(&alloc) < 64,
            "{}",
            fenced_free_blocks(&alloc)
        );
    }

    #[test]
    fn best_fit_takes_the_smallest_fitting_block() {
        let mut map = BestFit::with_cached(20);
        let a = map.malloc(4096).unwrap();
        assert_eq!(map.live[&a], 4096);
        let b = map.malloc(4097).unwrap();
        assert_eq!(map.live[&b], 64 * KIB);
        assert!(map.free(a));
        assert!(!map.free(a));
        assert_eq!(map.malloc(u64::MAX), None);
    }

    #[test]
    fn synthetic_stream_traces_parse_and_replay_with_events() {
        let text = synthetic_stream_trace(5000, 64, 7);
        let trace = crate::parse::parse_str("streams", &text).unwrap();
        assert_eq!(trace.ops.len(), 5000);
        let setup = crate::exec::Setup::from_trace(&trace, AllocConf::default(), None, None);
        let report = crate::replay::replay(&trace, &setup).unwrap();
        assert!(report.counts.records > 100, "{}", report.counts.records);
        assert_eq!(report.counts.ooms, 0);
    }

    #[test]
    fn offset_replay_runs_the_allocs_and_frees_and_counts_refusals() {
        // Three 8 TiB requests: offset-allocator's 2^32 - 1 units of 4 KiB hold one of them,
        // so two are refused and the free of `b` is skipped. `record`, `complete` and `stats`
        // are left out.
        let t8 = 8u64 << 40;
        let text = format!(
            "alloc a {t8}\nalloc b {t8}\nrecord a 1\ncomplete\nfree b\nalloc c {t8}\nfree a\n\
             alloc d 4K\nalloc e 64M\nfree d\nstats\nfree e\n"
        );
        let trace = crate::parse::parse_str("t", &text).unwrap();
        let replay = OffsetReplay::new(&trace);
        assert_eq!(replay.len(), 9);
        assert_eq!(replay.slots, 5);
        assert_eq!(replay.run(), 2);
        assert_eq!(replay.run(), 2, "each run starts from a fresh allocator");
        let units = |size: u64| {
            let trace = crate::parse::parse_str("t", &format!("alloc a {size}\n")).unwrap();
            match OffsetReplay::new(&trace).ops[0] {
                OffsetOp::Alloc { units, .. } => units,
                OffsetOp::Free { .. } => unreachable!("an alloc"),
            }
        };
        assert_eq!((units(1), units(4096), units(4097)), (1, 1, 2));
        assert_eq!(units(1 << 60), u32::MAX, "saturates");
        // The bench's trace fits.
        let text = synthetic_trace(20_000, 256, 42);
        let trace = crate::parse::parse_str("synthetic", &text).unwrap();
        let replay = OffsetReplay::new(&trace);
        assert_eq!(replay.len(), 20_000);
        assert_eq!(replay.run(), 0);
    }

    #[test]
    fn synthetic_traces_parse_and_replay() {
        let text = synthetic_trace(5000, 64, 7);
        assert_eq!(text, synthetic_trace(5000, 64, 7), "deterministic");
        let trace = crate::parse::parse_str("synthetic", &text).unwrap();
        assert_eq!(trace.ops.len(), 5000);
        let setup = crate::exec::Setup::from_trace(&trace, AllocConf::default(), None, None);
        let report = crate::replay::replay(&trace, &setup).unwrap();
        assert_eq!(report.counts.ops, 5000);
        assert_eq!(report.counts.ooms, 0);
    }
}
