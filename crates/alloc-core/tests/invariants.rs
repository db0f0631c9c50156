//! Property test: random alloc / free / record_stream / complete / empty_cache sequences on the
//! simulated device, run by the checked executor: after every step no two blocks overlap, every
//! stat equals a recount from the block table, reserved equals the device's outstanding bytes,
//! every address handed out is a live block of its own, and after freeing everything and
//! `empty_cache` (the final `drain`) nothing is left on the device.

mod common;

use alloc_conf::AllocConf;
use alloc_core::Flavour;
use alloc_trace::{Checks, Setup, replay_checked};
use common::*;
use proptest::prelude::*;
use testkit::strategy;

fn confs() -> Vec<AllocConf> {
    vec![
        AllocConf::default(),
        conf("max_split_size_mb:40"),
        conf("roundup_power2_divisions:4"),
        conf("garbage_collection_threshold:0.6"),
        conf("garbage_collection_threshold:0.6,per_process_memory_fraction:0.7"),
        conf("expandable_segments:True"),
        conf("expandable_segments:True,segment_size_mb:64"),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_invariant(
        which in 0usize..7,
        pad in any::<bool>(),
        trace in strategy::trace(strategy::settings_op(), 300),
    ) {
        let setup = Setup {
            conf: confs()[which].clone(),
            capacity: 200 * MIB,
            device_overhead: 0,
            pad: if pad { 32 } else { 0 },
            flavour: if pad { Flavour::TorchNpu } else { Flavour::Cuda },
        };
        if let Err(f) = replay_checked(&trace, &setup, Checks::default()) {
            return Err(TestCaseError::fail(format!(
                "{f}\n{}",
                alloc_trace::to_text(&trace)
            )));
        }
    }
}
