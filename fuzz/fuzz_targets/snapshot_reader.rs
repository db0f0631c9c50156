//! The snapshot reader on arbitrary bytes: it never panics (nor does an error's message), and a
//! snapshot it accepts survives a round trip through the writer. The pickles are compared, not
//! the snapshots: a NaN `garbage_collection_threshold` is not equal to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let read = match alloc_snapshot::read(data) {
        Ok(read) => read,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let pickle = read
        .snapshot
        .to_pickle()
        .expect("a snapshot read is one the writer writes");
    let again = alloc_snapshot::read(&pickle).expect("the writer's pickle reads back");
    assert_eq!(again.warnings, read.warnings);
    assert_eq!(again.snapshot.to_pickle().unwrap(), pickle);
});
