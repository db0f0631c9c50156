//! Properties of the `.trace` and size parsers beyond "never panics" (`parser_never_panics.rs`),
//! so CI covers what the nightly fuzz targets check: a well-formed trace parses to the operations
//! it was written from and replays without an error, and sizes round-trip through their text.

use proptest::prelude::*;
use testkit::stress::{self, StressOp, StressParams};
use testkit::trace::parse_str;
use testkit::{Setup, parse_size, replay};

const MIB: u64 = 1 << 20;

/// Operations that have a `.trace` form, naming allocations `0..16`.
fn trace_op() -> impl Strategy<Value = StressOp> {
    let size = prop_oneof![
        0u64..=8192,
        (MIB - 4096)..=(MIB + 4096),
        MIB..(100 * MIB),
        prop::sample::select(vec![0, 1, 511, 512, 10 * MIB - 512, 1 << 60, u64::MAX]),
    ];
    prop_oneof![
        6 => (0u64..16, size, 0u64..4).prop_map(|(id, size, stream)| StressOp::Alloc { id, size, stream }),
        4 => (0u64..16).prop_map(|id| StressOp::Free { id }),
        2 => (0u64..16, 0u64..4).prop_map(|(id, stream)| StressOp::Record { id, stream }),
        2 => prop::option::of(0u64..4).prop_map(|stream| StressOp::Complete { stream }),
        1 => Just(StressOp::EmptyCache),
        1 => prop::sample::select(vec![0.0, 0.25, 0.5, 1.0]).prop_map(StressOp::Fraction),
        1 => Just(StressOp::ResetPeak),
        1 => Just(StressOp::ResetAccumulated),
        1 => Just(StressOp::Drain),
    ]
}

fn conf_text() -> impl Strategy<Value = &'static str> {
    prop::sample::select(stress::VARIANTS.iter().map(|(_, c)| *c).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn written_traces_parse_back_and_replay(
        conf in conf_text(),
        capacity in prop::sample::select(vec![64 * MIB, 1 << 30, 64 << 30]),
        ops in prop::collection::vec(trace_op(), 0..120),
    ) {
        let mut params = StressParams::new(0, 0, conf);
        params.capacity = capacity;
        let text = stress::to_trace(&params, &ops);
        let trace = parse_str("prop.trace", &text).map_err(|e| {
            TestCaseError::fail(format!("{e}\n{text}"))
        })?;
        prop_assert_eq!(trace.capacity, Some(capacity));
        let written: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(' ').next().unwrap())
            .filter(|k| !matches!(*k, "capacity" | "pad" | "conf"))
            .collect();
        let parsed: Vec<&str> = trace.ops.iter().map(|op| op.kind.keyword()).collect();
        prop_assert_eq!(written, parsed);
        let conf = alloc_conf::parse(trace.conf.as_deref().unwrap_or("")).conf;
        let report = replay(&trace, &Setup::from_trace(&trace, conf, None, None));
        prop_assert!(report.is_ok(), "{:?}\n{}", report, text);
        // The same operations pass every check of the stress engine.
        if let Err((i, e)) = stress::run_ops(&params, &ops) {
            return Err(TestCaseError::fail(format!("operation {i}: {e}\n{text}")));
        }
    }

    #[test]
    fn sizes_round_trip_through_their_text(m in 0u64..(1 << 33), shift in prop::sample::select(vec![0u32, 10, 20, 30])) {
        let suffixes: &[&str] = match shift {
            0 => &[""],
            10 => &["K", "KiB"],
            20 => &["M", "MiB"],
            _ => &["G", "GiB"],
        };
        for suffix in suffixes {
            prop_assert_eq!(parse_size(&format!("{m}{suffix}")), Ok(m << shift));
            if shift > 0 {
                prop_assert_eq!(
                    parse_size(&format!("{m}.5{suffix}")),
                    Ok((m << shift) + (1 << (shift - 1)))
                );
            }
        }
    }

    #[test]
    fn any_size_text_parses_or_errs_without_panicking(s in "[0-9.KMGiB]{0,24}|\\PC{0,8}") {
        if let Ok(n) = parse_size(&s) {
            // A size that parses is a plain number of bytes once written back.
            prop_assert_eq!(parse_size(&n.to_string()), Ok(n));
        }
    }
}
