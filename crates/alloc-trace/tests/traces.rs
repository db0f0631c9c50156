//! Every shipped trace parses, and the real GPT-2 step has the shape its header describes.

use std::path::Path;

use alloc_trace::{self as trace, OpKind, Trace};

fn traces_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/traces"))
}

fn load(name: &str) -> Trace {
    trace::load(traces_dir().join(name)).unwrap_or_else(|e| panic!("{e}"))
}

fn count(t: &Trace, keyword: &str) -> usize {
    t.ops
        .iter()
        .filter(|op| op.kind.keyword() == keyword)
        .count()
}

#[test]
fn every_shipped_trace_parses() {
    let mut names: Vec<_> = std::fs::read_dir(traces_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    names.sort();
    assert!(names.len() >= 5, "{names:?}");
    for path in names {
        let t = trace::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(!t.ops.is_empty(), "{}", path.display());
    }
}

#[test]
fn gpt2_step_counts() {
    let t = load("gpt2_step.trace");
    assert_eq!(count(&t, "alloc"), 229 + 1721);
    assert_eq!(count(&t, "free"), 1721);
    assert_eq!(count(&t, "reset_peak"), 1);
    assert_eq!(count(&t, "stats"), 2);
    assert_eq!(t.ops.len(), 1950 + 1721 + 1 + 2);
    assert_eq!((t.capacity, t.conf.as_deref(), t.pad), (None, None, None));
    // Ids are interned densely; the prologue's first id is p0.
    assert!(t.id_count() <= 1950);
    let OpKind::Alloc { id, size, stream } = t.ops[0].kind else {
        panic!("first op is not an alloc");
    };
    assert_eq!((t.id_name(id), size, stream), ("p0", 8_519_680, 0));
    assert_eq!(id.index(), 0);
    assert_eq!(t.ops[0].line, 11);
    // Every free names an id allocated earlier; all streams are the default one.
    assert!(t.ops.iter().all(|op| match op.kind {
        OpKind::Alloc { stream, .. } => stream == 0,
        _ => true,
    }));
}

#[test]
fn teaching_traces_use_their_directives() {
    let t = load("split_merge.trace");
    assert_eq!(t.pad, Some(0));
    assert_eq!(count(&t, "alloc"), count(&t, "free"));

    let t = load("oversize.trace");
    assert_eq!(t.conf.as_deref(), Some("max_split_size_mb:32"));

    let t = load("record_stream.trace");
    assert_eq!(count(&t, "record"), 1);
    assert!(
        t.ops
            .iter()
            .any(|op| op.kind == OpKind::Complete { stream: Some(1) })
    );

    let t = load("oom_retry.trace");
    assert_eq!(t.capacity, Some(64 << 20));
}
