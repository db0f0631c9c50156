//! A short stress run of every configuration variant in the normal test suite (the CI-sized
//! runs are `cargo xtask stress`), and the guarantees of the engine itself: runs are
//! reproducible from their seed, a recorded run re-executes to the same report, and a failure
//! prints a trace that reproduces it.

use std::time::Duration;

use alloc_trace::stress::{self, StressParams, VARIANTS};
use alloc_trace::{
    CheckError, Checks, ExecError, OpKind, Rule, parse_str, replay_checked, well_formed,
};

const OPS: u64 = 3_000;

#[test]
fn every_variant_passes_a_short_run_and_exercises_every_path() {
    // A variant's short run resumes a few times at most: retention is judged over them all.
    let (mut retained, mut margin_ooms) = (0, 0);
    for (name, conf) in VARIANTS {
        let params = StressParams::new(0x5eed, OPS, conf);
        let report = stress::run(&params, Duration::from_secs(10))
            .unwrap_or_else(|failure| panic!("{name}: {failure}"));
        let c = &report.counts;
        assert_eq!(c.ops, OPS + 1, "{name}: the final drain counts");
        assert!(c.ooms > 0, "{name}: no out-of-memory in {report:?}");
        assert!(c.refused > 0, "{name}: no request of 1 EiB or more");
        assert!(c.misuses > 0, "{name}: no misuse");
        assert!(c.faults_fired > 0, "{name}: no fault fired");
        assert!(c.device_errors > 0, "{name}: no fault surfaced as an error");
        assert!(c.absorbed_faults > 0, "{name}: no fault absorbed");
        assert!(c.drains > 0);
        assert!(c.pauses > 0 && c.resumes > 0, "{name}: no pause and resume");
        retained += c.retained_resumes;
        margin_ooms += c.margin_ooms;
        if params.expandable_ops {
            // Map calls and unmapped ranges do not pair up one to one; the drains prove that
            // nothing is left (every page, range and segment given back).
            assert!(report.device_frees > 0, "{name}: nothing was unmapped");
        } else {
            assert_eq!(report.device_mallocs, report.device_frees, "{name}");
        }
    }
    assert!(retained > 0, "no resume kept its CPU backups");
    assert!(
        margin_ooms > 0,
        "no region ran out of memory for its margin"
    );
}

#[test]
fn cudas_flavour_passes_a_short_run_too() {
    // CUDA's retry chain (a device error is returned at once) with CUDA's zero pad.
    let mut params = StressParams::new(0x5eed, OPS, "");
    params.flavour = alloc_core::Flavour::Cuda;
    params.pad = 0;
    let report = stress::run(&params, Duration::from_secs(10)).unwrap_or_else(|f| panic!("{f}"));
    assert!(report.counts.device_errors > 0);
    assert_eq!(report.device_mallocs, report.device_frees);
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let params = StressParams::new(99, 1_000, "max_split_size_mb:40");
    let a = stress::run(&params, Duration::ZERO).unwrap();
    let b = stress::run(&params, Duration::ZERO).unwrap();
    assert_eq!(a, b);
    let other = StressParams {
        seed: 100,
        ..params
    };
    assert_ne!(a, stress::run(&other, Duration::ZERO).unwrap());
}

#[test]
fn recorded_operations_replay_and_tolerate_deletions() {
    let params = StressParams::new(3, 0, "");
    let text =
        "alloc a0 3145728 0\nrecord a0 1\nfree a0\nfree a0\ncomplete 1\nempty_cache\ndrain\n";
    // As written the second free names a freed id: the script is malformed.
    let trace = parse_str("t.trace", text).unwrap();
    let setup = params.setup();
    let f = replay_checked(&trace, &setup, Checks::default()).unwrap_err();
    assert_eq!(f.index, 3);
    // Deleting the alloc leaves operations on an id the script never allocated; keeping what a
    // trace can say drops them, and the rest runs with every check.
    let kinds: Vec<OpKind> = trace.ops.iter().map(|op| op.kind.clone()).collect();
    let mut kept = trace.clone();
    kept.ops.clear();
    for kind in well_formed(kinds[1..].iter().cloned(), trace.id_count()) {
        kept.push(kind);
    }
    assert_eq!(kept.ops.len(), 3, "complete, empty_cache, drain");
    let report = replay_checked(&kept, &setup, Checks::default()).unwrap();
    assert_eq!(
        report.counts.empty_caches, 2,
        "the explicit one and the drain's"
    );
    // Keeping the first free only: one alloc, one free, one device segment in and out.
    let mut once = trace.clone();
    once.ops.clear();
    for kind in well_formed(kinds.iter().cloned(), trace.id_count()) {
        once.push(kind);
    }
    let report = replay_checked(&once, &setup, Checks::default()).unwrap();
    assert_eq!((report.counts.allocs, report.counts.frees), (1, 1));
    assert_eq!((report.device_mallocs, report.device_frees), (1, 1));
}

#[test]
fn what_a_trace_can_say_enters_a_pool_once_at_a_time() {
    // torch refuses a second scope of a pool already in scope; the shrinker's candidates must
    // not build one.
    let params = StressParams::new(3, 0, "");
    let text = "pool p\nuse_pool p\nuse_pool p\nalloc a0 4096 0\nend_pool\nuse_pool p\nend_pool\n";
    let trace = parse_str("t.trace", text).unwrap();
    let setup = params.setup();
    let f = replay_checked(&trace, &setup, Checks::default()).unwrap_err();
    assert_eq!(f.index, 2, "{f}");
    let kinds: Vec<OpKind> = trace.ops.iter().map(|op| op.kind.clone()).collect();
    let mut kept = trace.clone();
    kept.ops.clear();
    for kind in well_formed(kinds.iter().cloned(), trace.id_count()) {
        kept.push(kind);
    }
    // The second use_pool goes; once the first scope ended, the pool can be entered again.
    assert_eq!(kept.ops.len(), 6);
    let report = replay_checked(&kept, &setup, Checks::default()).unwrap();
    assert_eq!(report.counts.allocs, 1);
}

#[test]
fn a_failure_prints_a_trace_that_reproduces_it_with_faults_and_misuse() {
    // The test-only switch breaks a check at the first successful free after a fault fired and
    // a misuse was refused: the shrunk trace must keep a fault line and a misuse line.
    let mut params = StressParams::new(7, 20_000, "");
    params.sabotage = true;
    let failure = stress::run(&params, Duration::from_secs(20)).unwrap_err();
    assert!(
        matches!(
            failure.error,
            ExecError::Check(CheckError::Broken {
                rule: Rule::Sabotaged,
                ..
            })
        ),
        "{failure}"
    );
    let printed = failure.to_string();
    let text = &printed[printed.find("\n# cargo xtask stress").unwrap() + 1..];
    let trace = parse_str("printed.trace", text).unwrap();
    let kinds: Vec<&str> = trace.ops.iter().map(|op| op.kind.keyword()).collect();
    assert!(kinds.contains(&"fault"), "{text}");
    assert!(
        kinds.iter().any(|k| matches!(
            *k,
            "double_free" | "record_freed" | "free_foreign" | "free_interior"
        )),
        "{text}"
    );
    assert!(
        trace.ops.len() < 40,
        "shrunk to {} operations",
        trace.ops.len()
    );
    let replayed = replay_checked(&trace, &params.setup(), params.checks()).unwrap_err();
    assert_eq!(replayed.index, failure.shrunk_failure.index);
    assert_eq!(
        replayed.index + 1,
        trace.ops.len(),
        "it fails at its last line"
    );
    assert_eq!(replayed.error, failure.shrunk_failure.error);
    // Without the switch the same trace passes.
    replay_checked(&trace, &params.setup(), Checks::default()).unwrap();
}
