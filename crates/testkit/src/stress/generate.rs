//! The operation generator: what to do next, given what is live.
//!
//! Request sizes come from the real GPT-2 training step shipped in `traces/gpt2_step.trace`
//! (every `alloc` size of it, drawn uniformly), mixed with synthetic ranges around torch's
//! thresholds and with extremes: 0, 1, 511, 512, 1 MiB ± 1, 10 MiB ± 512, sizes near and above
//! the device's capacity, and 1 EiB and more.

use std::sync::OnceLock;

use alloc_core::size::MAX_REQUEST;

use super::rng::SplitMix64;
use super::{Misuse, StressOp, StressParams};
use crate::fault::{DeviceCall, Fault};
use crate::trace::{self, OpKind};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Every allocation size of the shipped GPT-2 step, in trace order.
fn real_sizes() -> &'static [u64] {
    static SIZES: OnceLock<Vec<u64>> = OnceLock::new();
    SIZES.get_or_init(|| {
        let text = include_str!("../../traces/gpt2_step.trace");
        let trace = trace::parse_str("gpt2_step.trace", text).expect("the shipped trace parses");
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

/// Draws operations for one run.
pub(crate) struct Generator {
    rng: SplitMix64,
    params: StressParams,
    /// An operation decided earlier, returned next.
    queued: Option<StressOp>,
}

/// What the generator may refer to: the live allocations (by id) and how many freed addresses
/// the runner remembers for misuse.
pub(crate) struct View<'a> {
    /// Ids of live allocations.
    pub(crate) live: &'a [u64],
    /// How many recently freed addresses are remembered.
    pub(crate) dead: usize,
}

impl Generator {
    /// A generator for `params`, seeded with `params.seed`.
    pub(crate) fn new(params: &StressParams) -> Self {
        Generator {
            rng: SplitMix64::new(params.seed),
            params: params.clone(),
            queued: None,
        }
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
    /// synchronization, the pair that makes `free` itself fail (its fallback fails too).
    fn fault(&mut self) -> StressOp {
        let r = &mut self.rng;
        let code = r.pick(&[1, 100_000, 107_002, 507_899]);
        let (call, fault) = match r.below(9) {
            8 => {
                self.queued = Some(StressOp::Fault {
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
            _ => (DeviceCall::MemInfo, Fault::Error(code)),
        };
        StressOp::Fault {
            call,
            nth: r.range(1, 3),
            fault,
        }
    }

    /// A misuse of the API.
    fn misuse(&mut self, view: &View<'_>) -> StressOp {
        let r = &mut self.rng;
        let misuse = match r.below(4) {
            0 if view.dead > 0 => Misuse::DoubleFree {
                pick: r.below(view.dead as u64),
            },
            1 if view.dead > 0 => Misuse::RecordFreed {
                pick: r.below(view.dead as u64),
            },
            2 if !view.live.is_empty() => Misuse::InteriorPointer {
                id: r.pick(view.live),
            },
            _ => Misuse::ForeignPointer {
                addr: r.pick(&[0x10, 0xdead_0000, u64::MAX - 511, 1 << 62]),
            },
        };
        StressOp::Misuse(misuse)
    }

    /// The operation at position `index` of the run.
    pub(crate) fn next(&mut self, index: u64, view: &View<'_>) -> StressOp {
        if let Some(op) = self.queued.take() {
            return op;
        }
        if self.rng.chance(self.params.fault_rate) {
            return self.fault();
        }
        let live = view.live.len();
        let crowded = live >= self.params.max_live;
        // Weights in parts per thousand; those that do not apply are 0.
        let any = |w: u64| if live > 0 { w } else { 0 };
        let weights = [
            if crowded { 40 } else { 400 },               // alloc
            any(if crowded { 600 } else { 300 }),         // free
            any(80),                                      // record
            80,                                           // complete
            8,                                            // empty_cache
            if self.params.fraction_ops { 5 } else { 0 }, // fraction
            5,                                            // reset_peak
            3,                                            // reset_accumulated
            10,                                           // misuse
            1,                                            // drain
        ];
        let mut x = self.rng.below(weights.iter().sum());
        let mut choice = 0;
        while x >= weights[choice] {
            x -= weights[choice];
            choice += 1;
        }
        match choice {
            0 => StressOp::Alloc {
                id: index,
                size: self.size(),
                stream: self.stream(),
            },
            1 => StressOp::Free {
                id: self.rng.pick(view.live),
            },
            2 => StressOp::Record {
                id: self.rng.pick(view.live),
                stream: self.rng.below(self.params.streams.max(1)),
            },
            3 => StressOp::Complete {
                stream: (!self.rng.chance(0.25))
                    .then(|| self.rng.below(self.params.streams.max(1))),
            },
            4 => StressOp::EmptyCache,
            5 => StressOp::Fraction(self.rng.pick(&[1.0, 1.0, 0.9, 0.75, 0.5, 0.25, 0.0])),
            6 => StressOp::ResetPeak,
            7 => StressOp::ResetAccumulated,
            8 => self.misuse(view),
            _ => StressOp::Drain,
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

    #[test]
    fn the_same_seed_gives_the_same_operations() {
        let params = StressParams::new(42, 100, "");
        let view = View {
            live: &[1, 2, 3],
            dead: 2,
        };
        let a: Vec<_> = {
            let mut g = Generator::new(&params);
            (0..200).map(|i| g.next(i, &view)).collect()
        };
        let mut g = Generator::new(&params);
        let b: Vec<_> = (0..200).map(|i| g.next(i, &view)).collect();
        assert_eq!(a, b);
        let mut g = Generator::new(&StressParams::new(43, 100, ""));
        let c: Vec<_> = (0..200).map(|i| g.next(i, &view)).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn every_kind_of_operation_is_drawn() {
        let mut params = StressParams::new(1, 0, "");
        params.fault_rate = 0.05;
        let mut g = Generator::new(&params);
        let view = View {
            live: &[5, 6],
            dead: 1,
        };
        let ops: Vec<_> = (0..20_000).map(|i| g.next(i, &view)).collect();
        let has = |f: fn(&StressOp) -> bool| ops.iter().any(f);
        assert!(has(|o| matches!(o, StressOp::Alloc { size: 0, .. })));
        assert!(has(
            |o| matches!(o, StressOp::Alloc { size, .. } if *size >= MAX_REQUEST)
        ));
        assert!(has(|o| matches!(o, StressOp::Free { .. })));
        assert!(has(|o| matches!(o, StressOp::Record { .. })));
        assert!(has(|o| matches!(o, StressOp::Complete { stream: None })));
        assert!(has(|o| matches!(o, StressOp::Complete { stream: Some(_) })));
        assert!(has(|o| matches!(o, StressOp::EmptyCache)));
        assert!(has(|o| matches!(o, StressOp::Fraction(_))));
        assert!(has(|o| matches!(o, StressOp::ResetPeak)));
        assert!(has(|o| matches!(o, StressOp::ResetAccumulated)));
        assert!(has(|o| matches!(
            o,
            StressOp::Misuse(Misuse::DoubleFree { .. })
        )));
        assert!(has(|o| matches!(
            o,
            StressOp::Misuse(Misuse::RecordFreed { .. })
        )));
        assert!(has(|o| matches!(
            o,
            StressOp::Misuse(Misuse::ForeignPointer { .. })
        )));
        assert!(has(|o| matches!(
            o,
            StressOp::Misuse(Misuse::InteriorPointer { .. })
        )));
        assert!(has(|o| matches!(o, StressOp::Drain)));
        for call in DeviceCall::ALL {
            assert!(
                has_fault(&ops, call),
                "no fault on {call} in 20,000 operations"
            );
        }
    }

    fn has_fault(ops: &[StressOp], want: DeviceCall) -> bool {
        ops.iter()
            .any(|o| matches!(o, StressOp::Fault { call, .. } if *call == want))
    }
}
