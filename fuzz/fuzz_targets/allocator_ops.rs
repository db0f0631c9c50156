//! Operation sequences decoded from arbitrary bytes, run by the checked executor
//! (`alloc_trace::exec`): every allocator invariant and API contract after every operation, with
//! injected device faults and misuse, then free everything and `empty_cache` with nothing left
//! over.
#![no_main]

use alloc_sim::{DeviceCall, Fault};
use alloc_trace::stress::{StressParams, VARIANTS};
use alloc_trace::{Checks, IdRef, Misuse, OpKind, Trace, replay_checked, to_text, well_formed};
use libfuzzer_sys::fuzz_target;

const MIB: u64 = 1 << 20;

/// Sizes around torch's thresholds and the extremes.
const SIZES: [u64; 16] = [
    0,
    1,
    511,
    512,
    4096,
    MIB - 1,
    MIB,
    MIB + 1,
    3 * MIB,
    10 * MIB - 512,
    10 * MIB + 512,
    20 * MIB,
    100 * MIB,
    700 * MIB,
    1 << 60,
    u64::MAX,
];

/// One operation from four bytes; `ids[i]` names the allocation made at position `i`.
fn op(i: usize, ids: &[IdRef], [k, a, b, c]: [u8; 4]) -> OpKind {
    let (a64, b64, c64) = (u64::from(a), u64::from(b), u64::from(c));
    // The allocation of an earlier position (dropped by `well_formed` unless it fits).
    let earlier = ids[i.saturating_sub(1 + usize::from(a) % 64)];
    match k % 14 {
        0..=2 => OpKind::Alloc {
            id: ids[i],
            size: if a & 1 == 0 {
                SIZES[usize::from(b % 16)]
            } else {
                ((b64 << 8) | c64) << ((a64 >> 1) % 16)
            },
            stream: a64 >> 5 & 3,
        },
        3 | 4 => OpKind::Free { id: earlier },
        5 => OpKind::Record {
            id: earlier,
            stream: b64 % 4,
        },
        6 => OpKind::Complete {
            stream: (b & 1 == 0).then_some(c64 % 4),
        },
        7 => OpKind::EmptyCache {
            free_physical: a & 1 == 0,
        },
        8 => OpKind::Fraction([1.0, 0.9, 0.5, 0.25, 0.0][usize::from(a % 5)]),
        9 if a & 1 == 0 => OpKind::ResetPeak,
        9 => OpKind::ResetAccumulated,
        10 => OpKind::Misuse(match a % 4 {
            0 => Misuse::DoubleFree { id: earlier },
            1 => Misuse::RecordFreed {
                id: earlier,
                stream: b64 % 4,
            },
            2 => Misuse::ForeignPointer {
                addr: [0x10, 0xdead_0000, u64::MAX - 511][usize::from(b % 3)],
            },
            _ => Misuse::InteriorPointer { id: earlier },
        }),
        11 => OpKind::Fault {
            call: DeviceCall::ALL[usize::from(a) % DeviceCall::ALL.len()],
            nth: 1 + b64 % 3,
            fault: if c & 1 == 0 {
                Fault::OutOfMemory
            } else {
                Fault::Error(i32::from(c))
            },
        },
        12 => OpKind::Settings(
            ["expandable_segments:True", "expandable_segments:False"][usize::from(a & 1)].into(),
        ),
        _ => OpKind::Drain,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&variant, body)) = data.split_first() else {
        return;
    };
    let (_, conf) = VARIANTS[usize::from(variant) % VARIANTS.len()];
    let mut params = StressParams::new(0, 0, conf);
    params.capacity = 1 << 30;
    let mut trace: Trace = params.empty_trace();
    let chunks: Vec<[u8; 4]> = body
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect();
    let ids: Vec<IdRef> = (0..chunks.len())
        .map(|i| trace.add_id(format!("a{i}")))
        .collect();
    let ops = chunks.iter().enumerate().map(|(i, &c)| op(i, &ids, c));
    for kind in well_formed(ops.chain([OpKind::Drain]), ids.len()) {
        trace.push(kind);
    }
    if let Err(f) = replay_checked(&trace, &params.setup(), Checks::default()) {
        panic!("{f}\n{}", to_text(&trace));
    }
});
