//! The trace parser must never panic, whatever bytes it is given.

use alloc_trace::{KEYWORDS, parse_bytes};
use proptest::prelude::*;

/// Lines built from the format's own vocabulary, so the fuzzer reaches deep into the grammar.
fn plausible_line() -> impl Strategy<Value = String> {
    let keyword = prop::sample::select(
        KEYWORDS
            .iter()
            .copied()
            .chain(["ALLOC", "#"])
            .collect::<Vec<_>>(),
    );
    let token = prop::sample::select(vec![
        "a",
        "b",
        "c",
        "0",
        "1",
        "2",
        "1K",
        "1.5M",
        "0.5",
        "1.3K",
        "64GiB",
        "-1",
        "1e9",
        "inf",
        "18446744073709551616",
        "99999999999999999999G",
        "1.",
        ".5",
        "x#y",
        "\t",
        "é",
        "",
    ]);
    (keyword, prop::collection::vec(token, 0..4))
        .prop_map(|(k, ts)| format!("{k} {}", ts.join(" ")))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_bytes("fuzz.trace", &bytes);
    }

    #[test]
    fn arbitrary_text_never_panics(text in "[a-z_0-9 .#\tKMGiB\n\r-]{0,300}") {
        let _ = parse_bytes("fuzz.trace", text.as_bytes());
    }

    #[test]
    fn plausible_traces_never_panic(lines in prop::collection::vec(plausible_line(), 0..40)) {
        let text = lines.join("\n");
        match parse_bytes("fuzz.trace", text.as_bytes()) {
            Ok(t) => {
                for op in &t.ops {
                    prop_assert!(op.line >= 1 && op.line <= lines.len());
                }
            }
            Err(e) => {
                prop_assert!(e.line >= 1 && e.line <= lines.len().max(1));
                prop_assert!(e.to_string().starts_with("fuzz.trace:"));
            }
        }
    }
}
