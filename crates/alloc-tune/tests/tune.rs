//! `tune` on the shipped fragmenting trace: it finds a configuration with a lower peak than the
//! defaults, one that fits where the defaults run out of memory, only strings alloc-conf accepts
//! without a warning, the same answer on 1 and 4 threads, and torch_npu-only answers for
//! `--target torch_npu`.

use alloc_trace::{Setup, Trace, load, replay};
use alloc_tune::{Eval, Key, Options, Outcome, Target, tune};

const FRAGMENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../alloc-trace/traces/fragment.trace"
);
const MIB: u64 = 1 << 20;

fn fragment() -> Trace {
    load(FRAGMENT).unwrap()
}

/// A bounded search, on `threads` threads.
fn run(trace: &Trace, options: Options<'_>, threads: usize) -> Outcome {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(|| tune(trace, &options).unwrap())
}

fn options() -> Options<'static> {
    Options {
        evals: 2000,
        ..Options::default()
    }
}

/// The replayed figures of `conf`, as `replay` reports them.
fn replayed(trace: &Trace, conf: &str, capacity: Option<u64>) -> Eval {
    let setup = Setup::from_trace(
        trace,
        alloc_conf::parse_strict(conf).unwrap(),
        capacity,
        None,
    );
    let fraction = setup.conf.per_process_memory_fraction;
    let report = replay(trace, &setup).unwrap();
    let s = &report.end.stats;
    Eval {
        conf: conf.to_owned(),
        fraction_millionths: (fraction * 1e6).round() as u64,
        peak_reserved: s.reserved_bytes.all.peak as u64,
        peak_requested: s.requested_bytes.all.peak as u64,
        ooms: s.num_ooms,
        device_mallocs: report.device_mallocs,
        device_frees: report.device_frees,
    }
}

#[test]
fn the_recommendation_beats_the_fragmenting_defaults_and_replays_to_what_tune_printed() {
    let trace = fragment();
    let o = run(&trace, options(), 2);
    // The trace's comment gives the defaults' figures.
    assert_eq!(o.default.peak_reserved, 774 * MIB);
    assert_eq!((o.capacity, o.pad), (8 << 30, 32));
    let best = o.best();
    assert!(best.fits());
    assert_eq!(best.peak_reserved, 298 * MIB, "{best:?}");
    assert!(best.conf.contains("max_split_size_mb:"), "{}", best.conf);
    // Replaying the recommended string gives exactly the numbers tune ranked it by.
    assert_eq!(&replayed(&trace, &best.conf, None), best);
    assert_eq!(o.evals, 2000);
    assert!(!o.stopped_early);
}

#[test]
fn at_a_capacity_the_defaults_overrun_the_recommendation_fits() {
    let trace = fragment();
    let o = run(
        &trace,
        Options {
            capacity: Some(500 * MIB),
            ..options()
        },
        2,
    );
    assert!(!o.default.fits());
    assert_eq!(o.default.ooms, 11);
    assert!(o.best().fits());
    assert_eq!(replayed(&trace, &o.best().conf, Some(500 * MIB)).ooms, 0);
    // Below what any configuration needs, none fits and the ranking says so.
    let o = run(
        &trace,
        Options {
            capacity: Some(100 * MIB),
            evals: 300,
            ..options()
        },
        2,
    );
    assert!(o.ranked.iter().all(|e| !e.fits()));
}

#[test]
fn every_configuration_tried_parses_strictly_without_a_warning() {
    let o = run(&fragment(), options(), 2);
    for e in &o.ranked {
        let parsed = alloc_conf::parse(&e.conf);
        assert!(
            parsed.warnings.is_empty(),
            "{}: {:?}",
            e.conf,
            parsed.warnings
        );
        assert!(alloc_conf::parse_strict(&e.conf).is_ok(), "{}", e.conf);
        // Canonical: parsing and writing back gives the same string (`True`, not `true`).
        assert_eq!(parsed.conf.to_string(), e.conf);
    }
}

#[test]
fn the_answer_is_the_same_on_one_and_on_four_threads() {
    let trace = fragment();
    let one = run(&trace, options(), 1);
    let four = run(&trace, options(), 4);
    assert_eq!(one.ranked, four.ranked);
}

#[test]
fn for_torch_npu_gc_comes_with_a_fraction_and_page_size_never_with_a_split_cap() {
    let o = run(
        &fragment(),
        Options {
            target: Target::TorchNpu,
            ..options()
        },
        2,
    );
    let mut with_gc = 0;
    for e in &o.ranked {
        let gc = e.conf.contains("garbage_collection_threshold:");
        with_gc += usize::from(gc);
        assert_eq!(
            gc,
            e.conf.contains("per_process_memory_fraction:"),
            "{}",
            e.conf
        );
        assert!(
            !(e.conf.contains("page_size:") && e.conf.contains("max_split_size_mb:")),
            "{}",
            e.conf
        );
    }
    assert!(with_gc > 0, "GC was searched, with its fraction");
}

/// torch_npu warns that `segment_size_mb` is deprecated at every parse: for it, the page of
/// expandable segments comes from `large_segment_size_mb`, up to 512 MiB.
#[test]
fn for_torch_npu_the_expandable_page_is_large_segment_size_never_segment_size() {
    // Eight 63 MiB tensors: one 512 MiB page holds them all (8 × 64 MiB), where 20 MiB pages
    // take eight maps.
    let text: String = core::iter::once("capacity 8G\n".to_owned())
        .chain((0..8).map(|i| format!("alloc a{i} 63M\n")))
        .collect();
    let trace = alloc_trace::parse_str("pages.trace", &text).unwrap();
    let keys = vec![
        Key::ExpandableSegments,
        Key::LargeSegmentSize,
        Key::SegmentSize,
    ];
    let search = |target| {
        run(
            &trace,
            Options {
                keys: keys.clone(),
                target,
                ..options()
            },
            2,
        )
    };
    let o = search(Target::TorchNpu);
    assert!(
        o.ranked
            .iter()
            .all(|e| !e.conf.contains(",segment_size_mb:")
                && !e.conf.starts_with("segment_size_mb:"))
    );
    assert_eq!(
        o.best().conf,
        "large_segment_size_mb:512,expandable_segments:True"
    );
    assert_eq!(
        (o.best().peak_reserved, o.best().device_mallocs),
        (512 * MIB, 1)
    );
    // npu-alloc takes either key; the shorter string wins the tie.
    let o = search(Target::NpuAlloc);
    assert_eq!(
        o.best().conf,
        "expandable_segments:True,segment_size_mb:512"
    );
    assert_eq!(
        alloc_tune::inert_keys(&keys, Target::TorchNpu),
        [(
            Key::SegmentSize,
            "torch_npu deprecates it (large_segment_size_mb sets the same page)"
        )]
    );
    assert_eq!(
        alloc_tune::inert_keys(
            &[
                Key::SegmentSize,
                Key::BaseAddrAligned,
                Key::MaxNonSplitRounding
            ],
            Target::NpuAlloc
        ),
        [
            (Key::SegmentSize, "it acts only with expandable_segments"),
            (
                Key::BaseAddrAligned,
                "it acts only with expandable_segments"
            ),
            (
                Key::MaxNonSplitRounding,
                "it acts only with max_split_size_mb"
            ),
        ]
    );
    assert!(alloc_tune::inert_keys(&Key::ALL, Target::NpuAlloc).is_empty());
}

#[test]
fn only_the_keys_asked_for_are_searched() {
    let o = run(
        &fragment(),
        Options {
            keys: vec![Key::ExpandableSegments, Key::PageSize],
            ..options()
        },
        2,
    );
    let mut confs: Vec<&str> = o.ranked.iter().map(|e| e.conf.as_str()).collect();
    confs.sort_unstable();
    assert_eq!(
        confs,
        [
            "",
            "expandable_segments:True",
            "expandable_segments:True,page_size:1g",
            "page_size:1g"
        ]
    );
}
