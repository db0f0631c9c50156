//! Properties of the `.trace` and size parsers beyond "never panics" (`parser_never_panics.rs`),
//! so CI covers what the nightly fuzz targets check: a well-formed trace parses to the operations
//! it was written from and replays without an error, and sizes round-trip through their text.

use alloc_trace::stress::{StressParams, VARIANTS};
use alloc_trace::{Checks, Setup, parse_size, parse_str, replay, replay_checked, to_text};
use proptest::prelude::*;
use testkit::strategy;

const MIB: u64 = 1 << 20;

fn conf_text() -> impl Strategy<Value = &'static str> {
    prop::sample::select(VARIANTS.iter().map(|(_, c)| *c).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn written_traces_parse_back_and_replay(
        conf in conf_text(),
        capacity in prop::sample::select(vec![64 * MIB, 1 << 30, 64 << 30]),
        drawn in strategy::trace(strategy::any_op(), 120),
    ) {
        let mut params = StressParams::new(0, 0, conf);
        params.capacity = capacity;
        let header = params.empty_trace();
        let mut trace = drawn;
        trace.capacity = header.capacity;
        trace.pad = header.pad;
        trace.conf = header.conf;
        let text = to_text(&trace);
        let parsed = parse_str("prop.trace", &text).map_err(|e| {
            TestCaseError::fail(format!("{e}\n{text}"))
        })?;
        prop_assert_eq!(parsed.capacity, Some(capacity));
        // Ids are renumbered in the order the text names them; the text is the same.
        prop_assert_eq!(&to_text(&parsed), &text);
        prop_assert_eq!(parsed.ops.len(), trace.ops.len());
        let conf = alloc_conf::parse(parsed.conf.as_deref().unwrap_or("")).conf;
        let setup = Setup::from_trace(&parsed, conf, None, None);
        let report = replay(&parsed, &setup);
        prop_assert!(report.is_ok(), "{:?}\n{}", report, text);
        // The same operations pass every check of the stress engine.
        if let Err(f) = replay_checked(&parsed, &setup, Checks::default()) {
            return Err(TestCaseError::fail(format!("{f}\n{text}")));
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
