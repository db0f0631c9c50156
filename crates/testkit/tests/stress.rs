//! A short stress run of every configuration variant in the normal test suite (the CI-sized
//! runs are `cargo xtask stress`), and the guarantees of the engine itself: runs are
//! reproducible from their seed, and a recorded run re-executes to the same report.

use std::time::Duration;

use testkit::stress::{self, StressOp, StressParams, VARIANTS};

const OPS: u64 = 3_000;

#[test]
fn every_variant_passes_a_short_run_and_exercises_every_path() {
    for (name, conf) in VARIANTS {
        let params = StressParams::new(0x5eed, OPS, conf);
        if stress::unsupported(&params.conf).is_some() {
            continue;
        }
        let report = stress::run(&params, Duration::from_secs(10))
            .unwrap_or_else(|failure| panic!("{name}: {failure}"));
        assert_eq!(report.ops, OPS + 1, "{name}: the final drain counts");
        assert!(report.ooms > 0, "{name}: no out-of-memory in {report:?}");
        assert!(report.refused > 0, "{name}: no request of 1 EiB or more");
        assert!(report.misuses > 0, "{name}: no misuse");
        assert!(report.faults_fired > 0, "{name}: no fault fired");
        assert!(
            report.device_errors > 0,
            "{name}: no fault surfaced as an error"
        );
        assert!(report.absorbed_faults > 0, "{name}: no fault absorbed");
        assert!(report.drains > 0);
        assert_eq!(report.device_mallocs, report.device_frees, "{name}");
    }
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
    let ops = [
        StressOp::Alloc {
            id: 0,
            size: 3 << 20,
            stream: 0,
        },
        StressOp::Record { id: 0, stream: 1 },
        // Names an allocation whose `alloc` is not in the sequence: skipped.
        StressOp::Free { id: 7 },
        StressOp::Free { id: 0 },
        StressOp::Free { id: 0 },
        StressOp::Complete { stream: Some(1) },
        StressOp::EmptyCache,
    ];
    let report = stress::run_ops(&params, &ops).unwrap();
    assert_eq!((report.allocs, report.frees), (1, 1));
    assert_eq!((report.device_mallocs, report.device_frees), (1, 1));
    assert_eq!(
        report.empty_caches, 2,
        "the explicit one and the final drain's"
    );
}
