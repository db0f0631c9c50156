//! Property tests: no input makes the parser panic, and the canonical string of a configuration
//! parses back to the same configuration.

use alloc_conf::{
    AllocConf, Backend, Key, MIB, ROUNDUP_BUCKETS, UNSUPPORTED_KEYS, WarningKind, from_env, parse,
};
use proptest::prelude::*;

/// Fragments that steer random strings into the parser's deeper paths.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        // Every key the parser knows or reports as unsupported, plus separators and values.
        prop::sample::select(
            Key::ALL
                .iter()
                .map(|k| k.name())
                .chain(UNSUPPORTED_KEYS)
                .chain([
                    "release_lock_on_cudamalloc",
                    ":",
                    "=",
                    ",",
                    "[",
                    "]",
                    ">",
                    " ",
                    "True",
                    "false",
                    "1g",
                    "native",
                    "0.6",
                    "1e-1",
                    "99999999999999999999",
                    "17592186044416",
                ])
                .collect::<Vec<_>>(),
        )
        .prop_map(String::from),
        (0u64..5000).prop_map(|n| n.to_string()),
        "[ -~]{0,4}",
    ]
}

/// Configurations the parser can produce: every value in bounds and no conflicting pair left on.
fn valid_conf() -> impl Strategy<Value = AllocConf> {
    let pow2_or_zero = prop_oneof![Just(0u32), (0u32..32).prop_map(|e| 1 << e)];
    let sizes = (11u64..2048, any::<bool>()).prop_flat_map(|(large_mb, default_large)| {
        let large_mb = if default_large { 20 } else { large_mb };
        let split_min = large_mb.max(21);
        (
            Just(large_mb),
            prop::option::of(split_min..=1 << 20),
            prop::option::of(large_mb..=1 << 20),
            // segment_size_mb can differ from the large segment size only when the latter is 20.
            if large_mb == 20 {
                (20u64..=512).boxed()
            } else {
                Just(large_mb).boxed()
            },
        )
    });
    let unit_open = (1u64..(1 << 53)).prop_map(|n| n as f64 / (1u64 << 53) as f64);
    let unit_closed = prop_oneof![
        Just(0.0),
        Just(1.0),
        (0u64..=(1 << 53)).prop_map(|n| n as f64 / (1u64 << 53) as f64)
    ];
    (
        sizes,
        prop::option::of(unit_open),
        any::<bool>(),
        0u64..=16,
        any::<bool>(),
        prop::array::uniform16(pow2_or_zero),
        unit_closed,
        prop::array::uniform6(any::<bool>()),
        0u32..=7,
    )
        .prop_map(
            |(
                (large_mb, split_mb, non_split_mb, segment_mb),
                gc,
                expandable,
                align_kb,
                page,
                roundup,
                fraction,
                flags,
                threads_log2,
            )| {
                AllocConf {
                    max_split_size: split_mb.map(|mb| mb * MIB),
                    max_non_split_rounding: non_split_mb.unwrap_or(large_mb) * MIB,
                    large_segment_size: large_mb * MIB,
                    garbage_collection_threshold: gc,
                    expandable_segments: expandable && split_mb.is_none() && gc.is_none(),
                    base_addr_aligned: if align_kb == 0 { 512 } else { align_kb * 1024 },
                    page_size: page.then_some(1 << 30),
                    segment_size: segment_mb * MIB,
                    roundup_power2_divisions: roundup,
                    per_process_memory_fraction: fraction,
                    release_lock_on_npumalloc: flags[0],
                    multi_stream_lazy_reclaim: flags[4],
                    throw_on_npumalloc_oom: flags[5],
                    pinned_use_background_threads: flags[1],
                    pin_memory_expandable_segments: flags[2],
                    pinned_mem_register: flags[3] && !flags[2],
                    pinned_num_register_threads: 1 << threads_log2,
                    backend: Backend::Native,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_bytes_parse_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let s = String::from_utf8_lossy(&bytes);
        let p = parse(&s);
        for w in &p.warnings {
            // Every warning renders.
            let _ = w.to_string();
        }
        let l = from_env(None, |_| Some(s.as_bytes().to_vec()));
        prop_assert_eq!(l.parsed, p);
    }

    #[test]
    fn any_string_of_fragments_parses_without_panicking(
        parts in prop::collection::vec(fragment(), 0..24)
    ) {
        let s: String = parts.concat();
        let _ = parse(&s);
    }

    #[test]
    fn canonical_string_of_a_valid_conf_parses_back(conf in valid_conf()) {
        let text = conf.to_string();
        let p = parse(&text);
        prop_assert_eq!(&p.conf, &conf, "canonical string {:?}", text);
        // Only the "kept but overridden" kinds can appear (for example page_size with
        // large_segment_size_mb); never a rejected value.
        for w in &p.warnings {
            prop_assert!(
                matches!(w.kind, WarningKind::Ineffective | WarningKind::Conflict),
                "{:?}: {}", text, w
            );
        }
        // Writing it again gives the same string.
        prop_assert_eq!(p.conf.to_string(), text);
    }

    #[test]
    fn canonical_string_of_any_parse_result_parses_back(
        parts in prop::collection::vec(fragment(), 0..24)
    ) {
        let conf = parse(&parts.concat()).conf;
        let text = conf.to_string();
        prop_assert_eq!(&parse(&text).conf, &conf, "canonical string {:?}", text);
    }

    #[test]
    fn roundup_tables_of_zeros_and_powers_of_two_round_trip(
        table in prop::array::uniform16(prop_oneof![Just(0u32), (0u32..32).prop_map(|e| 1 << e)])
    ) {
        let conf = AllocConf { roundup_power2_divisions: table, ..AllocConf::default() };
        let p = parse(&conf.to_string());
        prop_assert!(p.warnings.is_empty());
        prop_assert_eq!(p.conf.roundup_power2_divisions, table);
        prop_assert_eq!(ROUNDUP_BUCKETS, 16);
    }
}
