//! Writing stress operations as `.trace` text, for reading a failure and replaying it with
//! `cargo xtask replay`.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::{StressOp, StressParams};
use crate::fault::Fault;

/// The operations as a `.trace` v1 script with the run's capacity, pad and configuration, ending
/// with the final drain. Injected faults and misuse have no `.trace` form and are written as
/// comments, so the replay of a sequence that contains them runs without them. Frees and records
/// of ids the script has not allocated (their `alloc` was shrunk away, or freed already) are left
/// out, as the format calls them malformed.
pub fn to_trace(params: &StressParams, ops: &[StressOp]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# cargo xtask stress, seed {}: {} operations; faults and misuse are comments",
        params.seed,
        ops.len()
    );
    let _ = writeln!(out, "capacity {}", params.capacity);
    let _ = writeln!(out, "pad {}", params.pad);
    if !params.conf_text.trim().is_empty() {
        let _ = writeln!(out, "conf {}", params.conf_text.trim());
    }
    let mut live = BTreeSet::new();
    let drain = |out: &mut String, live: &mut BTreeSet<u64>| {
        for id in std::mem::take(live) {
            let _ = writeln!(out, "free a{id}");
        }
        out.push_str("empty_cache\n");
    };
    for op in ops {
        let _ = match *op {
            StressOp::Alloc { id, size, stream } => {
                if !live.insert(id) {
                    continue;
                }
                writeln!(out, "alloc a{id} {size} {stream}")
            }
            StressOp::Free { id } => {
                if !live.remove(&id) {
                    continue;
                }
                writeln!(out, "free a{id}")
            }
            StressOp::Record { id, stream } => {
                if !live.contains(&id) {
                    continue;
                }
                writeln!(out, "record a{id} {stream}")
            }
            StressOp::Complete { stream: Some(s) } => writeln!(out, "complete {s}"),
            StressOp::Complete { stream: None } => writeln!(out, "complete"),
            StressOp::EmptyCache => writeln!(out, "empty_cache"),
            StressOp::Fraction(f) => writeln!(out, "fraction {f}"),
            StressOp::ResetPeak => writeln!(out, "reset_peak"),
            StressOp::ResetAccumulated => writeln!(out, "reset_accumulated"),
            StressOp::Misuse(m) => writeln!(out, "# misuse: {m:?}"),
            StressOp::Fault { call, nth, fault } => match fault {
                Fault::OutOfMemory => writeln!(out, "# fault: call {nth} of {call} out of memory"),
                Fault::Error(code) => writeln!(out, "# fault: call {nth} of {call} error {code}"),
            },
            StressOp::Drain => {
                out.push_str("# drain: free everything, empty_cache, nothing left on the device\n");
                drain(&mut out, &mut live);
                Ok(())
            }
        };
    }
    out.push_str("# end of run: free everything, empty_cache, nothing left on the device\n");
    drain(&mut out, &mut live);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::DeviceCall;
    use crate::stress::Misuse;
    use crate::trace::parse_str;

    #[test]
    fn every_operation_writes_a_parsable_line() {
        let params = StressParams::new(7, 0, "max_split_size_mb:40");
        let ops = [
            StressOp::Alloc {
                id: 0,
                size: 4096,
                stream: 0,
            },
            StressOp::Alloc {
                id: 1,
                size: 0,
                stream: 2,
            },
            StressOp::Record { id: 0, stream: 1 },
            StressOp::Record { id: 9, stream: 1 },
            StressOp::Free { id: 9 },
            StressOp::Complete { stream: Some(1) },
            StressOp::Complete { stream: None },
            StressOp::EmptyCache,
            StressOp::Fraction(1.0),
            StressOp::Fraction(0.25),
            StressOp::ResetPeak,
            StressOp::ResetAccumulated,
            StressOp::Misuse(Misuse::DoubleFree { pick: 0 }),
            StressOp::Fault {
                call: DeviceCall::Malloc,
                nth: 2,
                fault: Fault::OutOfMemory,
            },
            StressOp::Fault {
                call: DeviceCall::Free,
                nth: 1,
                fault: Fault::Error(5),
            },
            StressOp::Free { id: 0 },
            StressOp::Free { id: 0 },
            StressOp::Alloc {
                id: 20,
                size: u64::MAX,
                stream: 0,
            },
            StressOp::Drain,
            StressOp::Alloc {
                id: 21,
                size: 1 << 20,
                stream: 3,
            },
        ];
        let text = to_trace(&params, &ops);
        let trace = parse_str("stress.trace", &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(trace.capacity, Some(params.capacity));
        assert_eq!(trace.pad, Some(32));
        assert_eq!(trace.conf.as_deref(), Some("max_split_size_mb:40"));
        assert!(text.contains("# fault: call 2 of malloc out of memory\n"));
        assert!(text.contains("free a1\nfree a20\nempty_cache\n"), "{text}");
        assert!(text.ends_with("free a21\nempty_cache\n"), "{text}");
        assert!(
            !text.contains("a9"),
            "ops on never-allocated ids are left out"
        );
        let keywords: Vec<_> = trace.ops.iter().map(|op| op.kind.keyword()).collect();
        assert_eq!(keywords.iter().filter(|k| **k == "free").count(), 4);
    }
}
