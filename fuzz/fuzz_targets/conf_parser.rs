//! The alloc-conf parser on arbitrary bytes: it never panics, every warning renders, and the
//! canonical string of whatever it parsed parses back to the same configuration.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let parsed = alloc_conf::parse(&text);
    for w in &parsed.warnings {
        let _ = w.to_string();
    }
    let canonical = parsed.conf.to_string();
    let again = alloc_conf::parse(&canonical);
    assert_eq!(again.conf, parsed.conf, "canonical string {canonical:?}");
});
