//! Parser tests: one per key, each bound, each warning kind, each constraint between keys, and
//! every example of torch_npu's "配置示例".

use super::*;
use alloc::vec;

/// `(kind, key)` of every warning.
fn warnings(p: &Parsed) -> Vec<(WarningKind, &str)> {
    p.warnings
        .iter()
        .map(|w| (w.kind, w.key.as_str()))
        .collect()
}

/// Parses `s` and asserts it produced no warning.
fn clean(s: &str) -> AllocConf {
    let p = parse(s);
    assert!(p.warnings.is_empty(), "{s}: {:?}", p.warnings);
    p.conf
}

/// Parses `s` and asserts exactly one warning, of `kind` on `key`; returns the parse.
fn one(s: &str, kind: WarningKind, key: &str) -> Parsed {
    let p = parse(s);
    assert_eq!(warnings(&p), [(kind, key)], "{s}: {:?}", p.warnings);
    p
}

/// Asserts `s` is a single `invalid_value` on its key and leaves the defaults.
fn rejected(s: &str) {
    let key = s.split([':', '=']).next().unwrap().trim();
    let p = one(s, WarningKind::InvalidValue, key);
    assert_eq!(p.conf, AllocConf::default(), "{s}");
    assert!(
        Key::from_name(key).is_none_or(|k| !p.given(k)),
        "{s} counted as given"
    );
}

const GIB: u64 = 1 << 30;

// ---------------------------------------------------------------------------------------------
// Lexing

#[test]
fn empty_and_blank_strings_are_the_defaults() {
    for s in ["", " ", ",", " , ,, "] {
        assert_eq!(clean(s), AllocConf::default(), "{s:?}");
    }
}

#[test]
fn colon_and_equals_whitespace_and_trailing_commas() {
    let want = AllocConf {
        max_split_size: Some(128 * MIB),
        expandable_segments: false,
        garbage_collection_threshold: Some(0.5),
        ..AllocConf::default()
    };
    for s in [
        "max_split_size_mb:128,garbage_collection_threshold:0.5",
        "max_split_size_mb=128,garbage_collection_threshold=0.5",
        "max_split_size_mb=128,garbage_collection_threshold:0.5,",
        "  max_split_size_mb : 128 ,\tgarbage_collection_threshold = 0.5 ,, ",
        "expandable_segments:False,max_split_size_mb:128,garbage_collection_threshold:.5,",
    ] {
        assert_eq!(clean(s), want, "{s}");
    }
    // torch's own test input.
    assert_eq!(clean("expandable_segments:False,"), AllocConf::default());
}

#[test]
fn keys_are_case_sensitive() {
    let p = one(
        "Max_Split_Size_MB:64",
        WarningKind::UnknownKey,
        "Max_Split_Size_MB",
    );
    assert_eq!(p.conf, AllocConf::default());
}

#[test]
fn integers_are_digits_only() {
    for v in [
        "+64", "-64", "64abc", "64 MB", "0x40", "64.0", "6e1", "[64]",
    ] {
        rejected(&format!("max_split_size_mb:{v}"));
    }
    assert_eq!(
        clean("max_split_size_mb:0064").max_split_size,
        Some(64 * MIB)
    );
}

#[test]
fn integer_overflow_is_invalid_value() {
    // The largest MiB count whose byte value fits in 64 bits, and the next one.
    assert_eq!(
        clean("max_split_size_mb:17592186044415").max_split_size,
        Some(17592186044415 * MIB)
    );
    let p = parse("max_split_size_mb:17592186044416");
    assert_eq!(
        warnings(&p),
        [(WarningKind::InvalidValue, "max_split_size_mb")]
    );
    assert!(p.warnings[0].message.contains("does not fit in 64 bits"));
    rejected("max_split_size_mb:18446744073709551616");
    rejected("large_segment_size_mb:17592186044416");
    rejected("max_non_split_rounding_mb:99999999999999999999999");
    rejected("pinned_num_register_threads:18446744073709551616");
}

#[test]
fn floats_are_plain_decimals() {
    assert_eq!(
        clean("garbage_collection_threshold:1e-1").garbage_collection_threshold,
        Some(0.1)
    );
    assert_eq!(
        clean("garbage_collection_threshold:.6").garbage_collection_threshold,
        Some(0.6)
    );
    for v in ["nan", "inf", "0.5x", "0 5", "+0.5", "1e400", "half"] {
        rejected(&format!("garbage_collection_threshold:{v}"));
    }
}

#[test]
fn booleans_accept_both_cases_of_the_first_letter_only() {
    for (v, on) in [
        ("True", true),
        ("true", true),
        ("False", false),
        ("false", false),
    ] {
        assert_eq!(
            clean(&format!("expandable_segments:{v}")).expandable_segments,
            on
        );
    }
    for v in ["TRUE", "1", "yes", "on", "Truee"] {
        rejected(&format!("expandable_segments:{v}"));
    }
    let p = parse("expandable_segments:yes");
    assert_eq!(
        p.warnings[0].message,
        "Expected a single True/False argument for expandable_segments, got 'yes'"
    );
}

// ---------------------------------------------------------------------------------------------
// One valid value per key, and each bound (just inside, just outside)

#[test]
fn key_max_split_size_mb() {
    assert_eq!(clean("max_split_size_mb:64").max_split_size, Some(64 * MIB));
    assert_eq!(clean("max_split_size_mb:21").max_split_size, Some(21 * MIB));
    rejected("max_split_size_mb:20");
    rejected("max_split_size_mb:0");
    let p = parse("max_split_size_mb:20");
    assert_eq!(
        p.warnings[0].message,
        "CachingAllocator option max_split_size_mb too small, must be > 20, got 20"
    );
}

#[test]
fn key_max_non_split_rounding_mb() {
    let c = clean("max_non_split_rounding_mb:64");
    assert_eq!(c.max_non_split_rounding, 64 * MIB);
    assert_eq!(
        clean("max_non_split_rounding_mb:20").max_non_split_rounding,
        20 * MIB
    );
    // Below large_segment_size_mb (20 by default): the default stays.
    let p = one(
        "max_non_split_rounding_mb:19",
        WarningKind::InvalidValue,
        "max_non_split_rounding_mb",
    );
    assert_eq!(p.conf, AllocConf::default());
    // The bound follows large_segment_size_mb.
    let c = clean("large_segment_size_mb:11,max_non_split_rounding_mb:11");
    assert_eq!(c.max_non_split_rounding, 11 * MIB);
    let p = one(
        "large_segment_size_mb:11,max_non_split_rounding_mb:10",
        WarningKind::InvalidValue,
        "max_non_split_rounding_mb",
    );
    assert_eq!(p.conf.max_non_split_rounding, 11 * MIB);
    rejected("max_non_split_rounding_mb:abc");
}

#[test]
fn key_large_segment_size_mb() {
    let c = clean("large_segment_size_mb:11");
    assert_eq!(c.large_segment_size, 11 * MIB);
    // It is also the expandable page and the default non-split rounding.
    assert_eq!(c.segment_size, 11 * MIB);
    assert_eq!(c.max_non_split_rounding, 11 * MIB);
    assert_eq!(
        clean("large_segment_size_mb:64").large_segment_size,
        64 * MIB
    );
    rejected("large_segment_size_mb:10");
    let p = parse("large_segment_size_mb:10");
    assert_eq!(
        p.warnings[0].message,
        "CachingAllocator option large_segment_size_mb must be > 10 MB, got 10"
    );
}

#[test]
fn key_garbage_collection_threshold() {
    let gc = |s: &str| clean(s).garbage_collection_threshold;
    assert_eq!(gc("garbage_collection_threshold:0.6"), Some(0.6));
    assert_eq!(gc("garbage_collection_threshold:0.000001"), Some(0.000001));
    assert_eq!(gc("garbage_collection_threshold:0.999999"), Some(0.999999));
    rejected("garbage_collection_threshold:0");
    rejected("garbage_collection_threshold:0.0");
    rejected("garbage_collection_threshold:1");
    rejected("garbage_collection_threshold:1.0");
    rejected("garbage_collection_threshold:1.000001");
    rejected("garbage_collection_threshold:1e-400"); // underflows to 0
    let p = parse("garbage_collection_threshold:1.5");
    assert_eq!(
        p.warnings[0].message,
        "garbage_collect_threshold is invalid, set it in (0.0, 1.0), got 1.5"
    );
    // More digits than an f64 holds: the message says what the text was read as.
    let p = parse("garbage_collection_threshold:0.99999999999999999999");
    assert_eq!(
        p.warnings[0].message,
        "garbage_collect_threshold is invalid, set it in (0.0, 1.0), got \
         0.99999999999999999999 (read as 1)"
    );
    let p = parse("garbage_collection_threshold:1e-400");
    assert_eq!(
        p.warnings[0].message,
        "garbage_collect_threshold is invalid, set it in (0.0, 1.0), got 1e-400 (read as 0)"
    );
    // A value far from 1 is written in exponent form, not with hundreds of digits.
    let message = |s: &str| parse(s).warnings[0].message.clone();
    assert_eq!(
        message("per_process_memory_fraction:1e300"),
        "per_process_memory_fraction is invalid, set it in [0.0, 1.0], got 1e300"
    );
    assert_eq!(
        message("per_process_memory_fraction:1E300"),
        "per_process_memory_fraction is invalid, set it in [0.0, 1.0], got 1E300 (read as 1e300)"
    );
    assert_eq!(
        message("per_process_memory_fraction:100000000000000000001"),
        "per_process_memory_fraction is invalid, set it in [0.0, 1.0], got \
         100000000000000000001 (read as 1e20)"
    );
    assert_eq!(
        message("per_process_memory_fraction:12345678.25"),
        "per_process_memory_fraction is invalid, set it in [0.0, 1.0], got 12345678.25"
    );
}

#[test]
fn key_expandable_segments() {
    assert!(clean("expandable_segments:True").expandable_segments);
    assert!(!clean("expandable_segments:False").expandable_segments);
}

#[test]
fn key_base_addr_aligned_kb() {
    let align = |s: &str| clean(&format!("expandable_segments:True,{s}")).base_addr_aligned;
    assert_eq!(align("base_addr_aligned_kb:0"), 512);
    assert_eq!(align("base_addr_aligned_kb:1"), 1024);
    assert_eq!(align("base_addr_aligned_kb:8"), 8 * 1024);
    assert_eq!(align("base_addr_aligned_kb:16"), 16 * 1024);
    rejected("base_addr_aligned_kb:17");
    rejected("base_addr_aligned_kb:-1");
    let p = parse("base_addr_aligned_kb:17");
    assert!(
        p.warnings[0]
            .message
            .starts_with("CachingAllocator option base_addr_aligned_kb error, must be [0~16]")
    );
}

#[test]
fn key_page_size() {
    for v in ["1g", "1G", "1gb", "1GB"] {
        assert_eq!(clean(&format!("page_size:{v}")).page_size, Some(GIB), "{v}");
    }
    for v in ["2m", "1", "2g", "1Gb", "1gB", "1024m", "g"] {
        rejected(&format!("page_size:{v}"));
    }
}

#[test]
fn key_segment_size_mb() {
    let seg = |s: &str| clean(&format!("expandable_segments:True,{s}")).segment_size;
    assert_eq!(seg("segment_size_mb:20"), 20 * MIB);
    assert_eq!(seg("segment_size_mb:40"), 40 * MIB);
    assert_eq!(seg("segment_size_mb:512"), 512 * MIB);
    rejected("segment_size_mb:19");
    rejected("segment_size_mb:513");
    rejected("segment_size_mb:big");
}

#[test]
fn key_roundup_power2_divisions() {
    let c = clean("roundup_power2_divisions:4");
    assert_eq!(c.roundup_power2_divisions, [4; crate::ROUNDUP_BUCKETS]);
    let c = clean("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]");
    assert_eq!(c.roundup_divisions(32 * MIB), 8);
    assert_eq!(c.roundup_divisions(8192 * MIB), 1);
    assert_eq!(
        clean("roundup_power2_divisions:1").roundup_power2_divisions,
        [1; crate::ROUNDUP_BUCKETS]
    );
    rejected("roundup_power2_divisions:0");
    rejected("roundup_power2_divisions:3");
    rejected("roundup_power2_divisions:[64:8");
    rejected("roundup_power2_divisions:[63:8,>:1]");
    rejected("roundup_power2_divisions:[64:3,>:1]");
    rejected("roundup_power2_divisions:[64:8,>:x]");
    // A bad entry spoils the whole item, even after good ones, and whatever follows still parses.
    let p = one(
        "roundup_power2_divisions:[64:8,128:3],expandable_segments:True",
        WarningKind::InvalidValue,
        "roundup_power2_divisions",
    );
    assert_eq!(p.conf.roundup_power2_divisions, [0; crate::ROUNDUP_BUCKETS]);
    assert!(p.conf.expandable_segments);
}

#[test]
fn key_per_process_memory_fraction() {
    let f = |s: &str| clean(s).per_process_memory_fraction;
    assert_eq!(f("per_process_memory_fraction:0.5"), 0.5);
    assert_eq!(f("per_process_memory_fraction:0"), 0.0);
    assert_eq!(f("per_process_memory_fraction:1"), 1.0);
    assert_eq!(f("per_process_memory_fraction:1.0"), 1.0);
    rejected("per_process_memory_fraction:1.0000001");
    rejected("per_process_memory_fraction:-0.1");
    let p = parse("per_process_memory_fraction:2");
    assert_eq!(
        p.warnings[0].message,
        "per_process_memory_fraction is invalid, set it in [0.0, 1.0], got 2"
    );
}

#[test]
fn key_release_lock_on_npumalloc_and_its_alias() {
    assert!(clean("release_lock_on_npumalloc:True").release_lock_on_npumalloc);
    assert!(clean("release_lock_on_cudamalloc:True").release_lock_on_npumalloc);
    rejected("release_lock_on_npumalloc:1");
    // The alias is the same setting: a duplicate, and the warning names the alias as written.
    let p = one(
        "release_lock_on_npumalloc:True,release_lock_on_cudamalloc:False",
        WarningKind::DuplicateKey,
        "release_lock_on_cudamalloc",
    );
    assert!(!p.conf.release_lock_on_npumalloc);
}

#[test]
fn key_multi_stream_lazy_reclaim() {
    assert!(clean("multi_stream_lazy_reclaim:True").multi_stream_lazy_reclaim);
    assert!(!clean("multi_stream_lazy_reclaim:False").multi_stream_lazy_reclaim);
    rejected("multi_stream_lazy_reclaim:TRUE");
    let p = parse("multi_stream_lazy_reclaim:1");
    assert_eq!(
        p.warnings[0].message,
        "Expected a single True/False argument for multi_stream_lazy_reclaim, got '1'"
    );
    // Fixed at start, as torch_npu's `_set_allocator_settings` refuses it.
    let start = clean("multi_stream_lazy_reclaim:True");
    let p = parse_settings(&start, "multi_stream_lazy_reclaim:False");
    assert_eq!(p.warnings[0].kind, WarningKind::NotAtRunTime);
    assert!(p.conf.multi_stream_lazy_reclaim);
}

#[test]
fn key_throw_on_npumalloc_oom() {
    assert!(clean("throw_on_npumalloc_oom:True").throw_on_npumalloc_oom);
    rejected("throw_on_npumalloc_oom:yes");
    // One of the keys torch_npu's `_set_allocator_settings` takes.
    let p = parse_settings(&AllocConf::default(), "throw_on_npumalloc_oom:True");
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert!(p.conf.throw_on_npumalloc_oom);
}

#[test]
fn key_pinned_use_background_threads() {
    assert!(clean("pinned_use_background_threads:True").pinned_use_background_threads);
    rejected("pinned_use_background_threads:on");
}

#[test]
fn key_pin_memory_expandable_segments() {
    assert!(clean("pin_memory_expandable_segments:True").pin_memory_expandable_segments);
    rejected("pin_memory_expandable_segments:TRUE");
}

#[test]
fn key_pinned_mem_register() {
    assert!(clean("pinned_mem_register:True").pinned_mem_register);
    rejected("pinned_mem_register:0");
}

#[test]
fn key_pinned_num_register_threads() {
    let n = |s: &str| clean(s).pinned_num_register_threads;
    assert_eq!(n("pinned_num_register_threads:1"), 1);
    assert_eq!(n("pinned_num_register_threads:8"), 8);
    assert_eq!(n("pinned_num_register_threads:128"), 128);
    rejected("pinned_num_register_threads:256");
    rejected("pinned_num_register_threads:129");
    rejected("pinned_num_register_threads:3");
    rejected("pinned_num_register_threads:0");
    let p = parse("pinned_num_register_threads:3");
    assert_eq!(
        p.warnings[0].message,
        "Number of register threads has to be power of 2, got 3"
    );
    let p = parse("pinned_num_register_threads:256");
    assert_eq!(
        p.warnings[0].message,
        "Number of register threads should be less than or equal to 128, got 256"
    );
}

#[test]
fn key_backend() {
    assert_eq!(clean("backend:native").backend, Backend::Native);
    for v in ["cudaMallocAsync", "hipMallocAsync", "Native", "foo"] {
        let p = one(
            &format!("backend:{v}"),
            WarningKind::UnsupportedValue,
            "backend",
        );
        assert_eq!(p.conf, AllocConf::default());
        assert!(!p.given(Key::Backend));
    }
}

#[test]
fn key_table_is_the_spec_table() {
    // Guard for the per-key tests above: exactly the documented 18 keys, in their order.
    let names: Vec<&str> = Key::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(
        names,
        [
            "max_split_size_mb",
            "max_non_split_rounding_mb",
            "large_segment_size_mb",
            "garbage_collection_threshold",
            "expandable_segments",
            "base_addr_aligned_kb",
            "page_size",
            "segment_size_mb",
            "roundup_power2_divisions",
            "per_process_memory_fraction",
            "release_lock_on_npumalloc",
            "multi_stream_lazy_reclaim",
            "throw_on_npumalloc_oom",
            "pinned_use_background_threads",
            "pin_memory_expandable_segments",
            "pinned_mem_register",
            "pinned_num_register_threads",
            "backend",
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Each warning kind

#[test]
fn warning_unknown_key() {
    let p = one("foo:1", WarningKind::UnknownKey, "foo");
    assert_eq!(
        p.warnings[0].message,
        "Unrecognized CachingAllocator option: foo"
    );
    assert_eq!(p.conf, AllocConf::default());
    // An empty key is unknown, with key "".
    one(":5", WarningKind::UnknownKey, "");
    // torch's '=' inside the key does not exist here: '=' separates.
    let p = one(
        "expandable_segments=True,foo:1",
        WarningKind::UnknownKey,
        "foo",
    );
    assert!(p.conf.expandable_segments);
}

#[test]
fn warning_unsupported_key() {
    for key in UNSUPPORTED_KEYS {
        let p = one(&format!("{key}:True"), WarningKind::UnsupportedKey, key);
        assert_eq!(p.conf, AllocConf::default());
    }
    // Not merely unknown: torch's `release_lock_on_hipmalloc` alias is unsupported here.
    one(
        "release_lock_on_hipmalloc:True",
        WarningKind::UnsupportedKey,
        "release_lock_on_hipmalloc",
    );
}

#[test]
fn warning_unsupported_value() {
    one(
        "backend:cudaMallocAsync",
        WarningKind::UnsupportedValue,
        "backend",
    );
}

#[test]
fn warning_missing_value() {
    // A bare word, known or not, and an empty value.
    one(
        "max_split_size_mb",
        WarningKind::MissingValue,
        "max_split_size_mb",
    );
    one("foo", WarningKind::MissingValue, "foo");
    one(
        "expandable_segments:",
        WarningKind::MissingValue,
        "expandable_segments",
    );
    one(
        "expandable_segments =  ",
        WarningKind::MissingValue,
        "expandable_segments",
    );
    one(":", WarningKind::MissingValue, "");
    // torch's `max_split_size_mb,40` is two items here: a bare key and a bare number.
    let p = parse("max_split_size_mb,40");
    assert_eq!(
        warnings(&p),
        [
            (WarningKind::MissingValue, "max_split_size_mb"),
            (WarningKind::MissingValue, "40")
        ]
    );
    assert_eq!(p.conf, AllocConf::default());
}

#[test]
fn warning_invalid_value() {
    rejected("max_split_size_mb:abc");
}

#[test]
fn warning_duplicate_key_later_valid_value_wins() {
    let p = parse("max_split_size_mb:64,max_split_size_mb:abc");
    assert_eq!(
        warnings(&p),
        [
            (WarningKind::DuplicateKey, "max_split_size_mb"),
            (WarningKind::InvalidValue, "max_split_size_mb")
        ]
    );
    assert_eq!(p.conf.max_split_size, Some(64 * MIB));
    let p = one(
        "max_split_size_mb:64,max_split_size_mb:128",
        WarningKind::DuplicateKey,
        "max_split_size_mb",
    );
    assert_eq!(p.conf.max_split_size, Some(128 * MIB));
    let p = parse("max_split_size_mb:abc,max_split_size_mb:128");
    assert_eq!(
        warnings(&p),
        [
            (WarningKind::InvalidValue, "max_split_size_mb"),
            (WarningKind::DuplicateKey, "max_split_size_mb")
        ]
    );
    assert_eq!(p.conf.max_split_size, Some(128 * MIB));
    // Three times: two duplicates.
    let p = parse("expandable_segments:True,expandable_segments:False,expandable_segments:True");
    assert_eq!(p.warnings.len(), 2);
    assert!(p.conf.expandable_segments);
    // Unknown keys twice are two unknown keys, not duplicates.
    let p = parse("foo:1,foo:2");
    assert_eq!(
        warnings(&p),
        [
            (WarningKind::UnknownKey, "foo"),
            (WarningKind::UnknownKey, "foo")
        ]
    );
}

#[test]
fn warning_conflict() {
    one(
        "expandable_segments:True,max_split_size_mb:64",
        WarningKind::Conflict,
        "expandable_segments",
    );
}

#[test]
fn warning_ineffective() {
    one(
        "base_addr_aligned_kb:8",
        WarningKind::Ineffective,
        "base_addr_aligned_kb",
    );
}

#[test]
fn warnings_come_in_item_order_and_do_not_stop_parsing() {
    let p = parse("foo:1,max_split_size_mb:abc,bar,garbage_collection_threshold:0.6,baz:");
    assert_eq!(
        warnings(&p),
        [
            (WarningKind::UnknownKey, "foo"),
            (WarningKind::InvalidValue, "max_split_size_mb"),
            (WarningKind::MissingValue, "bar"),
            (WarningKind::MissingValue, "baz"),
        ]
    );
    assert_eq!(p.conf.garbage_collection_threshold, Some(0.6));
}

// ---------------------------------------------------------------------------------------------
// Constraints between keys (torch_npu's "使用约束"), in the order docs/alloc-conf.md gives

#[test]
fn constraint_1_max_split_below_large_segment_size() {
    for s in [
        "large_segment_size_mb:64,max_split_size_mb:32",
        "max_split_size_mb:32,large_segment_size_mb:64",
    ] {
        let p = one(s, WarningKind::InvalidValue, "max_split_size_mb");
        assert_eq!(p.conf.max_split_size, None);
        assert_eq!(p.conf.large_segment_size, 64 * MIB);
        assert!(!p.given(Key::MaxSplitSizeMb));
        assert!(p.warnings[0].message.contains("large_segment_size_mb"));
    }
    assert_eq!(
        clean("large_segment_size_mb:64,max_split_size_mb:64").max_split_size,
        Some(64 * MIB)
    );
    // A rejected split cap does not conflict with expandable segments.
    let p = one(
        "expandable_segments:True,large_segment_size_mb:64,max_split_size_mb:32",
        WarningKind::InvalidValue,
        "max_split_size_mb",
    );
    assert!(p.conf.expandable_segments);
}

#[test]
fn constraint_1_max_non_split_rounding_below_large_segment_size() {
    let p = one(
        "large_segment_size_mb:64,max_non_split_rounding_mb:32",
        WarningKind::InvalidValue,
        "max_non_split_rounding_mb",
    );
    assert_eq!(p.conf.max_non_split_rounding, 64 * MIB);
    assert!(p.warnings[0].message.contains("large_segment_size_mb"));
    assert_eq!(
        clean("max_non_split_rounding_mb:64,large_segment_size_mb:64").max_non_split_rounding,
        64 * MIB
    );
}

#[test]
fn constraint_2_expandable_with_split_cap_or_gc() {
    for s in [
        "expandable_segments:True,max_split_size_mb:64",
        "max_split_size_mb:64,expandable_segments:True",
        "expandable_segments:True,garbage_collection_threshold:0.6",
        "expandable_segments:True,max_split_size_mb:64,garbage_collection_threshold:0.6",
    ] {
        let p = one(s, WarningKind::Conflict, "expandable_segments");
        assert!(!p.conf.expandable_segments, "{s}");
        assert!(p.given(Key::ExpandableSegments));
        assert!(p.warnings[0].message.contains("max_split_size_mb"));
        assert!(
            p.warnings[0]
                .message
                .contains("garbage_collection_threshold")
        );
    }
    let p = parse("expandable_segments:True,max_split_size_mb:64");
    assert_eq!(p.conf.max_split_size, Some(64 * MIB));
    let p = parse("expandable_segments:True,garbage_collection_threshold:0.6");
    assert_eq!(p.conf.garbage_collection_threshold, Some(0.6));
    // expandable_segments:False with them is fine.
    let c =
        clean("expandable_segments:False,max_split_size_mb:64,garbage_collection_threshold:0.6");
    assert_eq!(c.max_split_size, Some(64 * MIB));
    // An invalid split cap is not given.
    let p = one(
        "expandable_segments:True,max_split_size_mb:20",
        WarningKind::InvalidValue,
        "max_split_size_mb",
    );
    assert!(p.conf.expandable_segments);
}

#[test]
fn constraint_3_pinned_mem_register_with_pinned_expandable() {
    let p = one(
        "pinned_mem_register:True,pin_memory_expandable_segments:True",
        WarningKind::Conflict,
        "pinned_mem_register",
    );
    assert!(!p.conf.pinned_mem_register);
    assert!(p.conf.pin_memory_expandable_segments);
    assert!(
        p.warnings[0]
            .message
            .contains("pin_memory_expandable_segments")
    );
    let c = clean("pinned_mem_register:True,pin_memory_expandable_segments:False");
    assert!(c.pinned_mem_register);
}

#[test]
fn constraint_4_expandable_only_keys_without_expandable_segments() {
    let p = one(
        "base_addr_aligned_kb:0",
        WarningKind::Ineffective,
        "base_addr_aligned_kb",
    );
    assert_eq!(p.conf.base_addr_aligned, 512);
    assert!(p.warnings[0].message.contains("expandable_segments"));
    let p = one(
        "expandable_segments:False,segment_size_mb:40",
        WarningKind::Ineffective,
        "segment_size_mb",
    );
    assert_eq!(p.conf.segment_size, 40 * MIB);
    // Off because of a conflict counts too.
    let p =
        parse("expandable_segments:True,garbage_collection_threshold:0.6,base_addr_aligned_kb:8");
    assert_eq!(
        warnings(&p),
        [
            (WarningKind::Conflict, "expandable_segments"),
            (WarningKind::Ineffective, "base_addr_aligned_kb")
        ]
    );
    assert_eq!(p.conf.base_addr_aligned, 8 * 1024);
}

#[test]
fn constraint_5_segment_size_and_large_segment_size() {
    for s in [
        "expandable_segments:True,segment_size_mb:40,large_segment_size_mb:64",
        "expandable_segments:True,large_segment_size_mb:64,segment_size_mb:40",
    ] {
        let p = one(s, WarningKind::Conflict, "segment_size_mb");
        assert_eq!(p.conf.segment_size, 64 * MIB);
        assert_eq!(p.conf.large_segment_size, 64 * MIB);
        assert!(p.warnings[0].message.contains("large_segment_size_mb"));
    }
    // large_segment_size_mb alone sets the segment size without a warning.
    assert_eq!(
        clean("expandable_segments:True,large_segment_size_mb:64").segment_size,
        64 * MIB
    );
    // ... and without segment_size_mb's 20..=512 range: torch_npu's
    // get_custom_expandable_segment_size returns large_segment_size whenever it is not 20 MiB.
    assert_eq!(
        clean("expandable_segments:True,large_segment_size_mb:12").segment_size,
        12 * MIB
    );
    // Without expandable segments segment_size_mb gets only its first warning (ineffective),
    // but large_segment_size_mb still wins.
    let p = one(
        "segment_size_mb:40,large_segment_size_mb:64",
        WarningKind::Ineffective,
        "segment_size_mb",
    );
    assert_eq!(p.conf.segment_size, 64 * MIB);
}

#[test]
fn constraint_6_page_size_with_segment_keys() {
    let p = one(
        "page_size:1g,large_segment_size_mb:64",
        WarningKind::Conflict,
        "large_segment_size_mb",
    );
    assert_eq!(p.conf.page_size, Some(GIB));
    assert_eq!(p.conf.large_segment_size, 64 * MIB);
    assert!(p.warnings[0].message.contains("page_size"));
    let p = one(
        "expandable_segments:True,page_size:1g,segment_size_mb:40",
        WarningKind::Conflict,
        "segment_size_mb",
    );
    assert_eq!(p.conf.segment_size, 40 * MIB);
    assert_eq!(p.conf.page_size, Some(GIB));
    assert!(p.warnings[0].message.contains("page_size"));
    // segment_size_mb without expandable segments: only the ineffective warning.
    one(
        "page_size:1g,segment_size_mb:40",
        WarningKind::Ineffective,
        "segment_size_mb",
    );
    // One warning per key: segment_size_mb's conflict with large_segment_size_mb comes first.
    let p =
        parse("expandable_segments:True,page_size:1g,segment_size_mb:40,large_segment_size_mb:64");
    assert_eq!(
        warnings(&p),
        [
            (WarningKind::Conflict, "segment_size_mb"),
            (WarningKind::Conflict, "large_segment_size_mb")
        ]
    );
    assert!(p.warnings[0].message.contains("large_segment_size_mb"));
}

#[test]
fn page_size_with_other_keys_is_accepted() {
    let c = clean(
        "page_size:1g,max_split_size_mb:64,garbage_collection_threshold:0.6,\
         roundup_power2_divisions:4",
    );
    assert_eq!(c.page_size, Some(GIB));
    assert_eq!(c.max_split_size, Some(64 * MIB));
    let c = clean("expandable_segments:True,page_size:1g,base_addr_aligned_kb:16");
    assert!(c.expandable_segments);
}

// ---------------------------------------------------------------------------------------------
// torch_npu's "配置示例" (its PYTORCH_NPU_ALLOC_CONF documentation), each as the variable's value

/// Parses an example through the precedence, as `PYTORCH_NPU_ALLOC_CONF`.
fn example(value: &str) -> AllocConf {
    let l = crate::from_env(None, |name| {
        (name == "PYTORCH_NPU_ALLOC_CONF").then(|| value.as_bytes().to_vec())
    });
    assert_eq!(l.source, Some(crate::Source::Var("PYTORCH_NPU_ALLOC_CONF")));
    assert!(
        l.parsed.warnings.is_empty(),
        "{value}: {:?}",
        l.parsed.warnings
    );
    l.parsed.conf
}

#[test]
fn seed_example_1_split_cap_and_gc() {
    let c = example("max_split_size_mb:32,garbage_collection_threshold:0.6");
    assert_eq!(
        c,
        AllocConf {
            max_split_size: Some(32 * MIB),
            garbage_collection_threshold: Some(0.6),
            ..AllocConf::default()
        }
    );
}

#[test]
fn seed_example_2_expandable_with_alignment() {
    let c = example("expandable_segments:True,base_addr_aligned_kb:16");
    assert_eq!(
        c,
        AllocConf {
            expandable_segments: true,
            base_addr_aligned: 16 * 1024,
            ..AllocConf::default()
        }
    );
}

#[test]
fn seed_example_3_page_size() {
    let c = example("page_size:1g");
    assert_eq!(
        c,
        AllocConf {
            page_size: Some(GIB),
            ..AllocConf::default()
        }
    );
}

#[test]
fn seed_example_4_expandable_with_segment_size() {
    let c = example("expandable_segments:True,segment_size_mb:40");
    assert_eq!(
        c,
        AllocConf {
            expandable_segments: true,
            segment_size: 40 * MIB,
            ..AllocConf::default()
        }
    );
}

#[test]
fn seed_example_5_roundup_single_value() {
    let c = example("roundup_power2_divisions:4");
    assert_eq!(c.roundup_power2_divisions, [4; crate::ROUNDUP_BUCKETS]);
}

#[test]
fn seed_example_5_roundup_array() {
    let c = example("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
    // Below 512 MiB 1 (512-byte rounding only), [512 MiB, 1 GiB) 2, [1, 2) GiB 4, above 8.
    assert_eq!(
        c.roundup_power2_divisions,
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8]
    );
    assert_eq!(c.roundup_divisions(1100 * MIB), 4);
}

#[test]
fn seed_example_6_pinned_background_threads() {
    let c = example("pinned_use_background_threads:True");
    assert_eq!(
        c,
        AllocConf {
            pinned_use_background_threads: true,
            ..AllocConf::default()
        }
    );
}

#[test]
fn seed_example_7_pin_memory_expandable_segments() {
    let c = example("pin_memory_expandable_segments:True");
    assert_eq!(
        c,
        AllocConf {
            pin_memory_expandable_segments: true,
            ..AllocConf::default()
        }
    );
}

#[test]
fn seed_example_8_pinned_mem_register() {
    let c = example("pinned_mem_register:True");
    assert_eq!(
        c,
        AllocConf {
            pinned_mem_register: true,
            ..AllocConf::default()
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Strict mode

#[test]
fn strict_mode() {
    assert_eq!(
        parse_strict("max_split_size_mb:32").map(|c| c.max_split_size),
        Ok(Some(32 * MIB))
    );
    let e = parse_strict("max_split_size_mb:20,foo:1").unwrap_err();
    assert_eq!(
        e.warnings.iter().map(|w| w.kind).collect::<Vec<_>>(),
        vec![WarningKind::InvalidValue, WarningKind::UnknownKey]
    );
    // Every kind is an error in strict mode, including the mild ones.
    assert!(parse_strict("base_addr_aligned_kb:8").is_err());
    assert!(parse_strict("max_split_size_mb:64,max_split_size_mb:64").is_err());
}

#[test]
fn given_tracks_valid_items_only() {
    let p = parse("max_split_size_mb:64,expandable_segments:abc,page_size:1g");
    assert!(p.given(Key::MaxSplitSizeMb));
    assert!(p.given(Key::PageSize));
    assert!(!p.given(Key::ExpandableSegments));
    assert!(!p.given(Key::SegmentSizeMb));
}

#[test]
fn an_explicit_large_segment_size_of_20_leaves_segment_size_mb_in_force() {
    // torch_npu tests `large_segment_size != 20 MiB`, so an explicit 20 is the default to it.
    let p = parse("expandable_segments:True,large_segment_size_mb:20,segment_size_mb:128");
    assert_eq!(p.conf.segment_size, 128 * MIB);
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let p = parse("expandable_segments:True,large_segment_size_mb:64,segment_size_mb:128");
    assert_eq!(p.conf.segment_size, 64 * MIB);
    assert_eq!(p.warnings.len(), 1);
    assert_eq!(p.warnings[0].kind, WarningKind::Conflict);
}

#[test]
fn run_time_settings_reset_what_torch_npu_resets_and_refuse_fixed_keys() {
    let start = parse(
        "expandable_segments:True,roundup_power2_divisions:4,per_process_memory_fraction:0.5,\
         max_non_split_rounding_mb:64,segment_size_mb:128",
    )
    .conf;
    let p = parse_settings(&start, "expandable_segments:False");
    assert!(!p.conf.expandable_segments);
    assert_eq!(p.conf.roundup_power2_divisions, [0; crate::ROUNDUP_BUCKETS]);
    assert_eq!(p.conf.per_process_memory_fraction, 0.5);
    // c10's parser sets max_non_split_rounding to the large segment size at every parse.
    assert_eq!(p.conf.max_non_split_rounding, 20 * MIB);
    let kept = parse_settings(&start, "max_non_split_rounding_mb:64");
    assert_eq!(kept.conf.max_non_split_rounding, 64 * MIB);
    assert_eq!(p.conf.segment_size, 128 * MIB);
    assert_eq!(p.conf.large_segment_size, 20 * MIB);
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);

    // A key _set_allocator_settings does not take, known or not, refuses the whole string
    // (torch_npu raises before it resets or applies anything): nothing changes, nothing resets.
    for refused in [
        "expandable_segments:False,large_segment_size_mb:64",
        "roundup_power2_divisions:8,expandable_segments:False",
        "expandable_segments:False,garbage_collection_threshold:0.5,foo:1",
    ] {
        let p = parse_settings(&start, refused);
        assert_eq!(p.conf, start, "{refused}");
        assert!(
            p.warnings
                .iter()
                .all(|w| w.kind == WarningKind::NotAtRunTime),
            "{:?}",
            p.warnings
        );
    }
    let p = parse_settings(
        &start,
        "expandable_segments:False,garbage_collection_threshold:0.5,foo:1",
    );
    let keys: Vec<&str> = p.warnings.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(keys, ["garbage_collection_threshold", "foo"]);
    assert_eq!(
        p.warnings[1].message,
        "torch_npu's _set_allocator_settings does not take foo; the whole string is ignored, as \
         torch_npu raises before it applies any key"
    );
    // The two pinned keys it takes are unsupported here: a warning, and the rest applies.
    let p = parse_settings(
        &start,
        "expandable_segments:False,pinned_max_cached_size_mb:64",
    );
    assert!(!p.conf.expandable_segments);
    assert_eq!(p.warnings[0].kind, WarningKind::UnsupportedKey);

    // A split cap given at run time turns expandable segments off, as at start.
    let p = parse_settings(&start, "max_split_size_mb:64");
    assert!(!p.conf.expandable_segments);
    assert_eq!(p.conf.max_split_size, Some(64 * MIB));
    assert_eq!(p.warnings[0].kind, WarningKind::Conflict);

    // Back on: the split cap set before is reset, so nothing conflicts.
    let p = parse_settings(&p.conf, "expandable_segments:True");
    assert!(p.conf.expandable_segments);
    assert_eq!(p.conf.max_split_size, None);
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
}
