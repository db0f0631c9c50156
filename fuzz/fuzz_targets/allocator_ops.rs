//! Operation sequences decoded from arbitrary bytes, run through the stress checker
//! (`testkit::stress`): every allocator invariant and API contract after every operation,
//! with injected device faults, then free everything and `empty_cache` with nothing left over.
#![no_main]

use libfuzzer_sys::fuzz_target;
use testkit::stress::{self, Misuse, StressOp, StressParams, VARIANTS};
use testkit::{DeviceCall, Fault};

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

/// One operation from four bytes; `i` is its position (allocations are named by position).
fn op(i: u64, [k, a, b, c]: [u8; 4]) -> StressOp {
    let (a64, b64, c64) = (u64::from(a), u64::from(b), u64::from(c));
    // An earlier position, for frees and records (skipped unless it is a live allocation).
    let earlier = i.saturating_sub(1 + a64 % 64);
    match k % 13 {
        0..=2 => StressOp::Alloc {
            id: i,
            size: if a & 1 == 0 {
                SIZES[usize::from(b % 16)]
            } else {
                ((b64 << 8) | c64) << ((a64 >> 1) % 16)
            },
            stream: a64 >> 5 & 3,
        },
        3 | 4 => StressOp::Free { id: earlier },
        5 => StressOp::Record {
            id: earlier,
            stream: b64 % 4,
        },
        6 => StressOp::Complete {
            stream: (b & 1 == 0).then_some(c64 % 4),
        },
        7 => StressOp::EmptyCache,
        8 => StressOp::Fraction([1.0, 0.9, 0.5, 0.25, 0.0][usize::from(a % 5)]),
        9 if a & 1 == 0 => StressOp::ResetPeak,
        9 => StressOp::ResetAccumulated,
        10 => StressOp::Misuse(match a % 4 {
            0 => Misuse::DoubleFree { pick: b64 },
            1 => Misuse::RecordFreed { pick: b64 },
            2 => Misuse::ForeignPointer {
                addr: [0x10, 0xdead_0000, u64::MAX - 511][usize::from(b % 3)],
            },
            _ => Misuse::InteriorPointer { id: earlier },
        }),
        11 => StressOp::Fault {
            call: DeviceCall::ALL[usize::from(a) % DeviceCall::ALL.len()],
            nth: 1 + b64 % 3,
            fault: if c & 1 == 0 {
                Fault::OutOfMemory
            } else {
                Fault::Error(i32::from(c))
            },
        },
        _ => StressOp::Drain,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&variant, body)) = data.split_first() else {
        return;
    };
    let (_, conf) = VARIANTS[usize::from(variant) % VARIANTS.len()];
    let mut params = StressParams::new(0, 0, conf);
    params.capacity = 1 << 30;
    let ops: Vec<StressOp> = body
        .chunks_exact(4)
        .enumerate()
        .map(|(i, c)| op(i as u64, [c[0], c[1], c[2], c[3]]))
        .collect();
    if let Err((index, e)) = stress::run_ops(&params, &ops) {
        panic!(
            "operation {index}: {e}\n{}",
            stress::to_trace(&params, &ops[..(index + 1).min(ops.len())])
        );
    }
});
