//! Proptest strategies of [`OpKind`]s and whole [`Trace`]s: what the property tests of the policy
//! and of the trace format draw. Every drawn trace is well formed (see [`well_formed`]): ids are
//! allocated before they are freed, recorded or misused.

use alloc_sim::{DeviceCall, Fault};
use alloc_trace::{IdRef, Misuse, OpKind, Trace, well_formed};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// How many ids the drawn operations name (`a0` .. `a15`).
pub const IDS: usize = 16;

/// A trace with the [`IDS`] ids the strategies name, and no operation.
pub fn empty_trace() -> Trace {
    let mut t = Trace::new("proptest.trace");
    for i in 0..IDS {
        t.add_id(format!("a{i}"));
    }
    t
}

/// One of the [`IDS`] ids.
pub fn id() -> impl Strategy<Value = IdRef> {
    prop::sample::select(empty_trace().ids().collect::<Vec<_>>())
}

/// A request size: mostly small, many around torch's thresholds (1 MiB, 10 MiB), some large,
/// and the extremes.
pub fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..=8192,
        2 => (MIB - 4096)..=(MIB + 4096),
        2 => (MIB + 1)..(10 * MIB),
        1 => prop::sample::select(vec![0, 1, 511, 512, MIB - 1, MIB, MIB + 1, 10 * MIB - 512, 10 * MIB + 512]),
        1 => (10 * MIB)..(70 * MIB),
    ]
}

/// A stream of the first three.
fn stream() -> impl Strategy<Value = u64> {
    0u64..3
}

/// An operation of the allocator's API (no fault, no misuse, no drain).
pub fn api_op() -> impl Strategy<Value = OpKind> {
    prop_oneof![
        8 => (id(), size(), stream()).prop_map(|(id, size, stream)| OpKind::Alloc { id, size, stream }),
        6 => id().prop_map(|id| OpKind::Free { id }),
        2 => (id(), stream()).prop_map(|(id, stream)| OpKind::Record { id, stream }),
        2 => prop::option::of(stream()).prop_map(|stream| OpKind::Complete { stream }),
        1 => any::<bool>().prop_map(|free_physical| OpKind::EmptyCache { free_physical }),
    ]
}

/// An operation of the allocator's API or a run-time switch of expandable segments.
pub fn settings_op() -> impl Strategy<Value = OpKind> {
    prop_oneof![
        30 => api_op(),
        1 => prop::sample::select(vec!["expandable_segments:True", "expandable_segments:False"])
            .prop_map(|s| OpKind::Settings(s.to_owned())),
    ]
}

/// Any operation of the format, faults, misuse and the stats lines included.
pub fn any_op() -> impl Strategy<Value = OpKind> {
    let fault = (
        prop::sample::select(DeviceCall::ALL.to_vec()),
        1u64..3,
        prop_oneof![
            Just(Fault::OutOfMemory),
            (1i32..600_000).prop_map(Fault::Error)
        ],
    )
        .prop_map(|(call, nth, fault)| OpKind::Fault { call, nth, fault });
    let misuse = prop_oneof![
        id().prop_map(|id| Misuse::DoubleFree { id }),
        (id(), stream()).prop_map(|(id, stream)| Misuse::RecordFreed { id, stream }),
        prop::sample::select(vec![0x10u64, 0xdead_0000, 1 << 62])
            .prop_map(|addr| Misuse::ForeignPointer { addr }),
        id().prop_map(|id| Misuse::InteriorPointer { id }),
    ]
    .prop_map(OpKind::Misuse);
    prop_oneof![
        12 => api_op(),
        1 => prop::sample::select(vec![0.0, 0.25, 0.5, 1.0]).prop_map(OpKind::Fraction),
        1 => Just(OpKind::ResetPeak),
        1 => Just(OpKind::ResetAccumulated),
        1 => prop::option::of("[a-z]{1,6}").prop_map(|label| OpKind::Stats { label }),
        1 => fault,
        1 => misuse,
        1 => Just(OpKind::Drain),
        1 => prop::sample::select(vec!["expandable_segments:True", "expandable_segments:False"])
            .prop_map(|s| OpKind::Settings(s.to_owned())),
    ]
}

/// A well-formed trace of up to `max` operations drawn from `op`, then a final `drain`.
pub fn trace(op: impl Strategy<Value = OpKind>, max: usize) -> impl Strategy<Value = Trace> {
    prop::collection::vec(op, 0..max).prop_map(|ops| {
        let mut t = empty_trace();
        for kind in well_formed(ops.into_iter().chain([OpKind::Drain]), IDS) {
            t.push(kind);
        }
        t
    })
}
