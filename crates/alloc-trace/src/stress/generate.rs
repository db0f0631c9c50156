//! The operation generator: what to do next, given what is live.
//!
//! Request sizes come from the real GPT-2 training step shipped in `traces/gpt2_step.trace`
//! (every `alloc` size of it, drawn uniformly), mixed with synthetic ranges around torch's
//! thresholds and with extremes: 0, 1, 511, 512, 1 MiB ± 1, 10 MiB ± 512, sizes near and above
//! the device's capacity, and 1 EiB and more.

use std::collections::{HashMap, VecDeque};
use std::sync::OnceLock;

use alloc_core::size::MAX_REQUEST;
use alloc_sim::{DeviceCall, Fault};

use super::StressParams;
use super::rng::SplitMix64;
use crate::exec::Executor;
use crate::op::{IdRef, Misuse, OpKind, PoolOp, Trace};
use crate::parse;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Every allocation size of the shipped GPT-2 step, in trace order.
fn real_sizes() -> &'static [u64] {
    static SIZES: OnceLock<Vec<u64>> = OnceLock::new();
    SIZES.get_or_init(|| {
        let text = include_str!("../../traces/gpt2_step.trace");
        let trace = parse::parse_str("gpt2_step.trace", text).expect("the shipped trace parses");
        trace
            .ops
            .iter()
            .filter_map(|op| match op.kind {
                OpKind::Alloc { size, .. } if size > 0 => Some(size),
                _ => None,
            })
            .collect()
    })
}

/// The extremes every run must exercise (besides the capacity-relative ones).
const EXTREMES: [u64; 16] = [
    0,
    1,
    511,
    512,
    513,
    MIB - 1,
    MIB,
    MIB + 1,
    10 * MIB - 512,
    10 * MIB - 1,
    10 * MIB,
    10 * MIB + 512,
    20 * MIB,
    MAX_REQUEST - 1,
    MAX_REQUEST,
    u64::MAX,
];

/// How many freed allocations are remembered for double-free misuse.
const FREED: usize = 16;

/// Draws operations for one run, keeping track of which allocations are live and which were
/// freed recently (from the executor's answers, so an allocation that ran out of memory is not
/// picked again).
pub(crate) struct Generator {
    rng: SplitMix64,
    params: StressParams,
    /// An operation decided earlier, returned next.
    queued: Option<OpKind>,
    /// Live allocations, and each one's position in `live`.
    live: Vec<IdRef>,
    pos: HashMap<IdRef, usize>,
    /// Recently freed allocations, newest first.
    freed: VecDeque<IdRef>,
    /// Open scopes, innermost last: `None` for a memory-saver region, a pool's name for a pool
    /// scope (a pool in scope is not entered again: torch refuses that).
    scopes: Vec<Option<String>>,
    /// Pools created, by name, with whether the run still holds them.
    pools: Vec<(String, bool)>,
    /// `empty_cache` lines drawn: every third is `empty_virt_addr_cache` (counted, not drawn,
    /// so that every seed's other operations stay what they were).
    empty_caches: u64,
    /// `resume` lines drawn: every second is followed by `retain_cpu_backup`, on and off in
    /// turn (counted, not drawn, as `empty_caches`).
    resumes: u64,
    /// `pause` lines drawn: every third is followed by `memory_margin`, a quarter of the
    /// device's capacity and 0 in turn (counted, not drawn, as `empty_caches`).
    pauses: u64,
}

/// The memory-saver tags drawn: weights kept through pauses by a CPU backup, a KV cache not.
const TAGS: [(&str, bool); 2] = [("weights", true), ("kv", false)];

/// The deepest nesting of scopes drawn.
const MAX_DEPTH: usize = 3;

impl Generator {
    /// A generator for `params`, seeded with `params.seed`.
    pub(crate) fn new(params: &StressParams) -> Self {
        Generator {
            rng: SplitMix64::new(params.seed),
            params: params.clone(),
            queued: None,
            live: Vec::new(),
            pos: HashMap::new(),
            freed: VecDeque::new(),
            scopes: Vec::new(),
            pools: Vec::new(),
            resumes: 0,
            pauses: 0,
            empty_caches: 0,
        }
    }

    /// Updates the live and freed sets after `exec` ran `op`.
    pub(crate) fn observe(&mut self, op: &OpKind, exec: &Executor) {
        match *op {
            OpKind::Alloc { id, .. } if exec.is_live(id) => {
                self.pos.insert(id, self.live.len());
                self.live.push(id);
            }
            OpKind::Free { id } if exec.is_freed(id) => self.remove_live(id),
            OpKind::Drain => {
                for id in std::mem::take(&mut self.live) {
                    self.freed.push_front(id);
                }
                self.pos.clear();
                self.freed.truncate(FREED);
                self.scopes.clear();
                for p in &mut self.pools {
                    p.1 = false;
                }
            }
            OpKind::Region { .. } => self.scopes.push(None),
            OpKind::Pool(PoolOp::Use(ref name)) => self.scopes.push(Some(name.clone())),
            OpKind::EndRegion | OpKind::Pool(PoolOp::End) => {
                self.scopes.pop();
            }
            OpKind::Pool(PoolOp::Create { ref name, .. }) => self.pools.push((name.clone(), true)),
            OpKind::Pool(PoolOp::Release(ref name)) => {
                if let Some(p) = self.pools.iter_mut().find(|p| p.0 == *name) {
                    p.1 = false;
                }
            }
            _ => {}
        }
    }

    /// A private-pool or memory-saver operation, or `None` when none applies now.
    fn scope_op(&mut self, exec: &Executor) -> Option<OpKind> {
        let r = &mut self.rng;
        let held: Vec<&str> = self
            .pools
            .iter()
            .filter(|p| p.1)
            .map(|p| p.0.as_str())
            .collect();
        let enterable: Vec<&str> = held
            .iter()
            .copied()
            .filter(|&p| !self.scopes.iter().any(|s| s.as_deref() == Some(p)))
            .collect();
        let shallow = self.scopes.len() < MAX_DEPTH;
        Some(match r.below(10) {
            0 | 1 if shallow => {
                let (tag, cpu_backup) = r.pick(&TAGS);
                OpKind::Region {
                    tag: tag.to_owned(),
                    cpu_backup,
                }
            }
            2 | 3 if matches!(self.scopes.last(), Some(None)) => OpKind::EndRegion,
            2 | 3 if matches!(self.scopes.last(), Some(Some(_))) => OpKind::Pool(PoolOp::End),
            4 if held.len() < 4 => {
                // The options follow the pool's number, not the generator's stream, so that
                // every seed draws what it drew before they existed.
                let n = self.pools.len();
                OpKind::Pool(PoolOp::Create {
                    name: format!("p{n}"),
                    use_on_oom: n % 3 == 1,
                    no_split: n % 4 == 3,
                })
            }
            5 if shallow && !enterable.is_empty() => {
                OpKind::Pool(PoolOp::Use(r.pick(&enterable).to_owned()))
            }
            6 if !held.is_empty() => OpKind::Pool(PoolOp::Release(r.pick(&held).to_owned())),
            7 => {
                let tag = r.chance(0.7).then(|| r.pick(&TAGS).0.to_owned());
                self.pauses += 1;
                if self.pauses.is_multiple_of(3) {
                    let on = self.pauses % 6 == 3;
                    let margin = if on { self.params.capacity / 4 } else { 0 };
                    self.queued = Some(OpKind::MemoryMargin(margin));
                }
                OpKind::Pause(tag)
            }
            8 => {
                let tag = r.chance(0.7).then(|| r.pick(&TAGS).0.to_owned());
                self.resumes += 1;
                if self.resumes.is_multiple_of(2) {
                    self.queued = Some(OpKind::RetainCpuBackup(self.resumes % 4 == 2));
                }
                OpKind::Resume(tag)
            }
            _ if !self.live.is_empty() => {
                let id = r.pick(&self.live);
                match exec.filled(id) {
                    Some(byte) if r.chance(0.5) => OpKind::Expect { id, byte },
                    _ => OpKind::Fill {
                        id,
                        byte: r.below(256) as u8,
                    },
                }
            }
            _ => return None,
        })
    }

    fn remove_live(&mut self, id: IdRef) {
        let Some(i) = self.pos.remove(&id) else {
            return;
        };
        self.live.swap_remove(i);
        if let Some(&moved) = self.live.get(i) {
            self.pos.insert(moved, i);
        }
        self.freed.push_front(id);
        self.freed.truncate(FREED);
    }

    /// A request size.
    fn size(&mut self) -> u64 {
        let r = &mut self.rng;
        match r.below(100) {
            0..=34 => r.pick(real_sizes()),
            35..=59 => r.range(1, 8 * KIB),
            60..=69 => r.range(8 * KIB, MIB),
            70..=79 => {
                let centre = r.pick(&[MIB, 2 * MIB, 10 * MIB, 20 * MIB]);
                r.range(centre - 4 * KIB, centre + 4 * KIB)
            }
            80..=91 => r.range(MIB, 70 * MIB),
            92..=95 => r.pick(&EXTREMES),
            96..=97 => r.range(100 * MIB, 600 * MIB),
            // Around the device's capacity: fits only in an empty device, or never.
            _ => {
                let cap = self.params.capacity;
                r.range(cap / 2, cap.saturating_mul(2))
            }
        }
    }

    /// A stream in `0..streams`, the default stream more often.
    fn stream(&mut self) -> u64 {
        if self.rng.chance(0.5) {
            0
        } else {
            self.rng.below(self.params.streams.max(1))
        }
    }

    /// A device fault to inject. One in nine is a failed event record together with a failed
    /// synchronization, the pair that makes `free` itself fail (its fallback fails too). With
    /// expandable segments or the memory saver's pools, six in fifteen fail a virtual-memory
    /// call instead (with the saver's pools, half of the sixth a host-memory call).
    fn fault(&mut self) -> OpKind {
        let r = &mut self.rng;
        let code = r.pick(&[1, 100_000, 107_002, 507_899]);
        let kinds = if self.params.expandable_ops || self.params.pool_ops {
            15
        } else {
            9
        };
        let (call, fault) = match r.below(kinds) {
            8 => {
                self.queued = Some(OpKind::Fault {
                    call: DeviceCall::Synchronize,
                    nth: 1,
                    fault: Fault::Error(code),
                });
                (DeviceCall::RecordEvent, Fault::Error(code))
            }
            0 | 1 => (DeviceCall::Malloc, Fault::OutOfMemory),
            2 => (DeviceCall::Malloc, Fault::Error(code)),
            3 => (DeviceCall::Free, Fault::Error(code)),
            4 => (DeviceCall::RecordEvent, Fault::Error(code)),
            5 => (DeviceCall::EventDone, Fault::Error(code)),
            6 => (DeviceCall::Synchronize, Fault::Error(code)),
            7 => (DeviceCall::MemInfo, Fault::Error(code)),
            9 => (DeviceCall::CreatePage, Fault::OutOfMemory),
            10 => (DeviceCall::CreatePage, Fault::Error(code)),
            11 => (DeviceCall::Map, Fault::Error(code)),
            12 => (DeviceCall::Unmap, Fault::Error(code)),
            13 => (DeviceCall::ReleasePage, Fault::Error(code)),
            14 if self.params.pool_ops && r.chance(0.5) => (
                r.pick(&DeviceCall::HOST),
                if r.chance(0.2) {
                    Fault::OutOfMemory
                } else {
                    Fault::Error(code)
                },
            ),
            _ => (
                r.pick(&[DeviceCall::ReserveAddress, DeviceCall::ReleaseAddress]),
                Fault::Error(code),
            ),
        };
        OpKind::Fault {
            call,
            nth: r.range(1, 3),
            fault,
        }
    }

    /// A misuse of the API.
    fn misuse(&mut self) -> OpKind {
        let r = &mut self.rng;
        let freed = self.freed.len() as u64;
        let misuse = match r.below(4) {
            0 if freed > 0 => Misuse::DoubleFree {
                id: self.freed[r.below(freed) as usize],
            },
            1 if freed > 0 => Misuse::RecordFreed {
                id: self.freed[r.below(freed) as usize],
                stream: 1,
            },
            2 if !self.live.is_empty() => Misuse::InteriorPointer {
                id: r.pick(&self.live),
            },
            _ => Misuse::ForeignPointer {
                addr: r.pick(&[0x10, 0xdead_0000, u64::MAX - 511, 1 << 62]),
            },
        };
        OpKind::Misuse(misuse)
    }

    /// The next operation of the run; a new allocation gets a new id in `trace`, named `a<n>`.
    pub(crate) fn next(&mut self, trace: &mut Trace, exec: &Executor) -> OpKind {
        if let Some(op) = self.queued.take() {
            return op;
        }
        if self.rng.chance(self.params.fault_rate) {
            return self.fault();
        }
        let live = self.live.len();
        let crowded = live >= self.params.max_live;
        // Weights in parts per thousand; those that do not apply are 0.
        let any = |w: u64| if live > 0 { w } else { 0 };
        let weights = [
            if crowded { 40 } else { 400 },                 // alloc
            any(if crowded { 600 } else { 300 }),           // free
            any(80),                                        // record
            80,                                             // complete
            8,                                              // empty_cache
            if self.params.fraction_ops { 5 } else { 0 },   // fraction
            5,                                              // reset_peak
            3,                                              // reset_accumulated
            10,                                             // misuse
            1,                                              // drain
            if self.params.expandable_ops { 4 } else { 0 }, // set_allocator_settings
            if self.params.pool_ops { 40 } else { 0 },      // pools and the memory saver
        ];
        let mut x = self.rng.below(weights.iter().sum());
        let mut choice = 0;
        while x >= weights[choice] {
            x -= weights[choice];
            choice += 1;
        }
        match choice {
            0 => {
                let id = trace.add_id(format!("a{}", trace.id_count()));
                OpKind::Alloc {
                    id,
                    size: self.size(),
                    stream: self.stream(),
                }
            }
            1 => OpKind::Free {
                id: self.rng.pick(&self.live),
            },
            2 => OpKind::Record {
                id: self.rng.pick(&self.live),
                stream: self.rng.below(self.params.streams.max(1)),
            },
            3 => OpKind::Complete {
                stream: (!self.rng.chance(0.25))
                    .then(|| self.rng.below(self.params.streams.max(1))),
            },
            4 => {
                self.empty_caches += 1;
                OpKind::EmptyCache {
                    free_physical: !self.empty_caches.is_multiple_of(3),
                }
            }
            5 => OpKind::Fraction(self.rng.pick(&[1.0, 1.0, 0.9, 0.75, 0.5, 0.25, 0.0])),
            6 => OpKind::ResetPeak,
            7 => OpKind::ResetAccumulated,
            8 => self.misuse(),
            9 => OpKind::Drain,
            11 => self.scope_op(exec).unwrap_or(OpKind::ResetPeak),
            _ => OpKind::Settings(
                self.rng
                    .pick(&["expandable_segments:False", "expandable_segments:True"])
                    .to_string(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_sizes_come_from_the_trace() {
        let sizes = real_sizes();
        assert!(sizes.len() > 1000);
        assert!(sizes.contains(&327_680_000), "the logits of the GPT-2 step");
        assert!(sizes.contains(&4));
    }

    /// `n` operations of a generator for `params`, with ids 0 and 1 live and id 2 freed.
    fn draw(params: &StressParams, n: usize) -> Vec<OpKind> {
        let mut g = Generator::new(params);
        let mut trace = Trace::new("t");
        for _ in 0..3 {
            trace.add_id("x");
        }
        g.live = vec![IdRef(0), IdRef(1)];
        g.pos = [(IdRef(0), 0), (IdRef(1), 1)].into();
        g.freed = [IdRef(2)].into();
        let exec = Executor::new(&trace, &params.setup());
        (0..n).map(|_| g.next(&mut trace, &exec)).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_operations() {
        let params = StressParams::new(42, 100, "");
        let a = draw(&params, 200);
        assert_eq!(a, draw(&params, 200));
        assert_ne!(a, draw(&StressParams::new(43, 100, ""), 200));
    }

    #[test]
    fn every_kind_of_operation_is_drawn() {
        let mut params = StressParams::new(1, 0, "expandable_segments:True");
        params.fault_rate = 0.05;
        let ops = draw(&params, 20_000);
        let has = |f: fn(&OpKind) -> bool| ops.iter().any(f);
        assert!(has(|o| matches!(o, OpKind::Alloc { size: 0, .. })));
        assert!(has(
            |o| matches!(o, OpKind::Alloc { size, .. } if *size >= MAX_REQUEST)
        ));
        assert!(has(|o| matches!(o, OpKind::Free { .. })));
        assert!(has(|o| matches!(o, OpKind::Record { .. })));
        assert!(has(|o| matches!(o, OpKind::Complete { stream: None })));
        assert!(has(|o| matches!(o, OpKind::Complete { stream: Some(_) })));
        assert!(has(|o| matches!(
            o,
            OpKind::EmptyCache {
                free_physical: true
            }
        )));
        assert!(has(|o| matches!(
            o,
            OpKind::EmptyCache {
                free_physical: false
            }
        )));
        assert!(has(|o| matches!(o, OpKind::Fraction(_))));
        assert!(has(|o| matches!(o, OpKind::ResetPeak)));
        assert!(has(|o| matches!(o, OpKind::ResetAccumulated)));
        assert!(has(|o| matches!(
            o,
            OpKind::Misuse(Misuse::DoubleFree { .. })
        )));
        assert!(has(|o| matches!(
            o,
            OpKind::Misuse(Misuse::RecordFreed { .. })
        )));
        assert!(has(|o| matches!(
            o,
            OpKind::Misuse(Misuse::ForeignPointer { .. })
        )));
        assert!(has(|o| matches!(
            o,
            OpKind::Misuse(Misuse::InteriorPointer { .. })
        )));
        assert!(has(|o| matches!(o, OpKind::Drain)));
        assert!(has(
            |o| matches!(o, OpKind::Settings(s) if s.ends_with("False"))
        ));
        assert!(has(
            |o| matches!(o, OpKind::Settings(s) if s.ends_with("True"))
        ));
        // Host copies only happen in memory-saver regions, which this generator does not draw.
        for call in DeviceCall::ALL
            .into_iter()
            .filter(|c| !DeviceCall::HOST.contains(c))
        {
            assert!(
                ops.iter()
                    .any(|o| matches!(o, OpKind::Fault { call: c, .. } if *c == call)),
                "no fault on {call} in 20,000 operations"
            );
        }
    }
}
