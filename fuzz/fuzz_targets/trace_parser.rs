//! The `.trace` parser on arbitrary bytes: it never panics, errors render as `file:line:`, and a
//! trace it accepts replays on the simulated device without a panic, and stops, if at all, only
//! at an operation the script itself makes impossible: an id in the wrong state (the executor
//! checks liveness: an `alloc` may fail, a `free` may hit an injected fault), a pool or region
//! line without its scope, or a `pause` / `resume` of a tag in the wrong state (docs/trace-format.md).
#![no_main]

use libfuzzer_sys::fuzz_target;
use alloc_core::SaverError;
use alloc_trace::{ExecError, Setup, parse_bytes, replay};

fuzz_target!(|data: &[u8]| {
    match parse_bytes("fuzz.trace", data) {
        Err(e) => assert!(e.to_string().starts_with("fuzz.trace:"), "{e}"),
        Ok(trace) => {
            let conf = alloc_conf::parse(trace.conf.as_deref().unwrap_or("")).conf;
            let mut setup = Setup::from_trace(&trace, conf, None, None);
            // torch's stats are i64, so are ours: a device of more than 8 EiB (or 8 EiB of
            // allocations in total) overflows them. That limit is known; 1 TiB keeps the fuzzer
            // on everything else.
            setup.capacity = setup.capacity.min(1 << 40);
            if let Err(f) = replay(&trace, &setup) {
                assert!(
                    matches!(
                        f.error,
                        ExecError::Id(_)
                            | ExecError::Scope(_)
                            | ExecError::Saver(
                                SaverError::UnknownTag(_)
                                    | SaverError::AlreadyPaused(_)
                                    | SaverError::NotPaused(_)
                            )
                    ),
                    "an accepted trace failed to replay: {f}"
                );
                assert!(f.to_string().starts_with("fuzz.trace:"), "{f}");
            }
        }
    }
});
