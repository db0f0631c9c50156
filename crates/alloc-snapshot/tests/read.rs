//! The safe reader: a real PyTorch snapshot, round trips through the writer, pickles written by
//! Python in every protocol it may use, hostile and truncated inputs, and shape errors.

use std::collections::{BTreeMap, HashMap};
use std::process::Command;

use alloc_snapshot::{
    Action, AllocatorSettings, Block, BlockState, Divisions, Frame, Limits, Read, ReadError,
    ReadWarning, Segment, SegmentType, Snapshot, TraceEntry, Untiled, read, read_file, read_with,
};

const MAGMA27: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../alloc-trace/traces/magma27_memory_snapshot.pickle"
);

fn magma27() -> Vec<u8> {
    std::fs::read(MAGMA27).expect("the MAGMA27 snapshot ships with the repository")
}

/// Runs `script` with python3 and returns its stdout. python3 is required (CI has it): a
/// missing interpreter fails the test instead of skipping it.
fn python(script: &str) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .output()
        .expect("python3 is required to run these tests");
    assert!(
        out.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("python3 prints ASCII")
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn frame(name: &str, filename: &str, line: i64) -> Frame {
    Frame {
        name: name.into(),
        filename: filename.into(),
        line,
    }
}

// ---------------------------------------------------------------------------------------------
// The real snapshot.

#[test]
fn magma27_reads_with_every_fact() {
    let Read { snapshot, warnings } = read(&magma27()).expect("MAGMA27 reads");
    assert!(warnings.is_empty(), "{warnings:?}");

    let segs = &snapshot.segments;
    assert_eq!(segs.len(), 216);
    assert_eq!(
        segs.iter().map(|s| s.total_size).sum::<i64>(),
        14_180_941_824
    );
    let large = segs
        .iter()
        .filter(|s| s.segment_type == SegmentType::Large)
        .count();
    assert_eq!((large, segs.len() - large), (208, 8));
    assert!(segs.iter().all(|s| s.segment_pool_id == (0, 0)));
    assert!(segs.iter().all(|s| s.stream == 0 && s.device == 0));
    assert!(segs.iter().all(|s| !s.is_expandable));

    let t = snapshot.totals();
    assert_eq!(t.segments, 216);
    assert_eq!(t.reserved, 14_180_941_824);
    assert_eq!(t.blocks, [229, 0, 226]);
    assert_eq!(t.allocated, 1_377_753_600);
    assert_eq!(t.large_segments, 208);
    let requested: i64 = segs
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state != BlockState::Inactive)
        .map(|b| b.requested_size)
        .sum();
    assert_eq!(requested, 1_373_919_236);

    // The blocks tile their segments, each where memory_viz would place it.
    for s in segs {
        let mut at = s.address;
        for b in &s.blocks {
            assert_eq!(b.address, at);
            at += b.size;
        }
        assert_eq!(at - s.address, s.total_size);
    }

    assert_eq!(snapshot.device_traces.len(), 1);
    let trace = &snapshot.device_traces[0];
    assert_eq!(trace.len(), 5_163);
    assert_eq!(t.entries, 5_163);
    for action in [Action::Alloc, Action::FreeRequested, Action::FreeCompleted] {
        assert_eq!(snapshot.count(&action), 1_721, "{action}");
    }
    assert!(trace.iter().all(|e| e.compile_context == "N/A"));
    assert!(
        trace
            .iter()
            .all(|e| e.addr.is_some() && e.device_free.is_none())
    );
    // The frames are memo gets of shared dicts and lists in the file.
    let mut with_frames = BTreeMap::new();
    for e in trace.iter().filter(|e| !e.frames.is_empty()) {
        *with_frames.entry(e.action.name()).or_insert(0) += 1;
    }
    assert_eq!(
        with_frames,
        BTreeMap::from([
            ("alloc", 655),
            ("free_completed", 383),
            ("free_requested", 383)
        ])
    );
    let first = &trace.iter().find(|e| !e.frames.is_empty()).unwrap().frames[0];
    assert_eq!(&*first.name, "forward");
    assert!(first.filename.ends_with("model.py"), "{}", first.filename);

    let settings = snapshot
        .allocator_settings
        .expect("MAGMA27 has allocator_settings");
    assert_eq!(settings.alloc_conf, ""); // PYTORCH_CUDA_ALLOC_CONF in the file
    assert_eq!(settings.max_split_size, -1);
    assert!(!settings.expandable_segments);
    assert!(!settings.release_lock_on_npumalloc);
    assert_eq!(settings.garbage_collection_threshold, 0.0);
    let keys: Vec<&str> = settings
        .roundup_power2_divisions
        .0
        .iter()
        .map(|(k, _)| k.as_str())
        .collect();
    let expected: Vec<String> = (0..16).map(|i| (1u32 << i).to_string()).collect();
    assert_eq!(keys, expected);
    assert!(
        settings
            .roundup_power2_divisions
            .0
            .iter()
            .all(|&(_, d)| d == 0)
    );
}

#[test]
fn magma27_reads_from_the_file_and_survives_a_round_trip() {
    let read = read_file(std::path::Path::new(MAGMA27)).expect("MAGMA27 reads");
    let again = alloc_snapshot::read(&read.snapshot.to_pickle().unwrap()).unwrap();
    assert_eq!(again.snapshot, read.snapshot);
    assert!(again.warnings.is_empty());
}

/// serde-pickle's reader, the reason for ours: it refuses the shared memo objects.
#[test]
fn magma27_is_what_serde_pickle_cannot_read() {
    let err = serde_pickle::value_from_slice(&magma27(), serde_pickle::DeOptions::new())
        .expect_err("serde-pickle refuses shared memo objects");
    assert!(err.to_string().contains("recursive"), "{err}");
}

#[test]
fn magma27_truncated_names_the_opcode_cut_short() {
    let bytes = magma27();
    // Byte 998 is a BININT whose 4-byte argument runs past byte 1,000.
    let err = read(&bytes[..1_000]).unwrap_err();
    assert!(
        matches!(err, ReadError::Truncated { offset: 998 }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "byte 998: the pickle is truncated here (an opcode cut short, or no STOP)"
    );
    // Cut between two opcodes, the missing one is at the end of the data.
    assert!(matches!(
        read(&bytes[..998]),
        Err(ReadError::Truncated { offset: 998 })
    ));
    // Without its STOP.
    let n = bytes.len();
    let err = read(&bytes[..n - 1]).unwrap_err();
    assert!(matches!(err, ReadError::Truncated { offset } if offset == n as u64 - 1));
}

#[test]
fn a_missing_file_is_an_io_error() {
    let err = read_file(std::path::Path::new("/nonexistent/snapshot.pickle")).unwrap_err();
    assert!(matches!(err, ReadError::Io(_)));
    assert!(
        err.to_string().starts_with("cannot read the snapshot: "),
        "{err}"
    );
    assert!(std::error::Error::source(&err).is_some());
}

// ---------------------------------------------------------------------------------------------
// Round trips through the writer.

fn hand_built() -> Snapshot {
    let f1 = frame("forward", "model.py", 54);
    let f2 = frame("<module>", "train.py", 1);
    let blocks = vec![
        Block {
            address: 0x7f00_0000_0000,
            size: 512,
            requested_size: 500,
            state: BlockState::ActiveAllocated,
            frames: vec![f1.clone(), f2.clone()],
        },
        Block {
            address: 0x7f00_0000_0200,
            size: 1024,
            requested_size: 1000,
            state: BlockState::ActivePendingFree,
            frames: vec![],
        },
        Block {
            address: 0x7f00_0000_0600,
            size: (2 << 20) - 1536,
            requested_size: 77, // torch leaves the last user's size on a free block
            state: BlockState::Inactive,
            frames: vec![],
        },
    ];
    Snapshot {
        segments: vec![
            Segment {
                device: 0,
                address: 0x7f00_0000_0000,
                total_size: 2 << 20,
                allocated_size: 512,
                active_size: 1536,
                requested_size: 1500,
                stream: 0,
                segment_type: SegmentType::Small,
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: vec![],
                blocks,
            },
            Segment {
                device: 1,
                address: 0x7e00_0000_0000,
                total_size: 20 << 20,
                allocated_size: 20 << 20,
                active_size: 20 << 20,
                requested_size: (20 << 20) - 1,
                stream: 0x5555_aaaa_0000,
                segment_type: SegmentType::Large,
                segment_pool_id: (0, 1),
                is_expandable: true,
                frames: vec![f2.clone()],
                blocks: vec![Block {
                    address: 0x7e00_0000_0000,
                    size: 20 << 20,
                    requested_size: (20 << 20) - 1,
                    state: BlockState::ActiveAllocated,
                    frames: vec![f1.clone()],
                }],
            },
        ],
        device_traces: vec![
            vec![
                TraceEntry {
                    action: Action::Alloc,
                    addr: Some(0x7f00_0000_0000),
                    device_free: None,
                    size: 500,
                    stream: 0,
                    pool_id: None,
                    time_us: 1_700_000_000_000_000,
                    compile_context: "N/A".into(),
                    user_metadata: String::new(),
                    frames: vec![f1.clone(), f2.clone()],
                },
                TraceEntry {
                    action: Action::Oom,
                    addr: None,
                    device_free: Some(123_456),
                    size: 1 << 40,
                    stream: 0,
                    pool_id: None,
                    time_us: 2,
                    compile_context: "N/A".into(),
                    user_metadata: "step 3".into(),
                    frames: vec![f2],
                },
                TraceEntry {
                    action: Action::Snapshot,
                    addr: Some(0),
                    device_free: None,
                    size: 0,
                    stream: 0,
                    pool_id: None,
                    time_us: 3,
                    compile_context: "N/A".into(),
                    user_metadata: String::new(),
                    frames: vec![],
                },
            ],
            vec![TraceEntry {
                action: Action::SegmentMap,
                addr: Some(i64::MIN),
                device_free: None,
                size: i64::MAX,
                stream: -1,
                pool_id: None,
                time_us: 4,
                compile_context: "fwd ü ✓".into(),
                user_metadata: String::new(),
                frames: vec![f1],
            }],
        ],
        allocator_settings: Some(AllocatorSettings {
            alloc_conf: "expandable_segments:True,max_split_size_mb:64".into(),
            max_split_size: 64 << 20,
            garbage_collection_threshold: 0.8,
            expandable_segments: true,
            release_lock_on_npumalloc: true,
            roundup_power2_divisions: Divisions(vec![("1".into(), 4), ("2".into(), 0)]),
        }),
        external_annotations: (),
    }
}

#[test]
fn a_hand_built_snapshot_survives_a_round_trip() {
    let snapshot = hand_built();
    let read = read(&snapshot.to_pickle().unwrap()).unwrap();
    assert_eq!(read.snapshot, snapshot);
    assert!(read.warnings.is_empty());
}

#[test]
fn every_prefix_of_a_pickle_is_an_error() {
    let bytes = hand_built().to_pickle().unwrap();
    for n in 0..bytes.len() {
        match read(&bytes[..n]) {
            // Nothing before the STOP is a whole pickle: only truncation can be reported.
            Err(ReadError::Truncated { offset }) => assert!(offset <= n as u64),
            other => panic!("prefix of {n} bytes: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Pickles written by Python, protocols 2 to 5, with shared objects.

const PYTHON_SNAPSHOT: &str = r#"
import pickle, sys
d = {'name': 'f', 'filename': 'x.py', 'line': 1}
frames = [d, d]
entry = lambda action, **kw: dict(action=action, frames=frames, **kw)
snap = {
    'segments': [{
        'address': 2**40, 'total_size': 2**21, 'stream': 0, 'segment_type': 'small',
        'segment_pool_id': (0, 1), 'is_expandable': False, 'frames': [], 'extra': None,
        'blocks': [
            {'size': 2**20, 'state': 'active_allocated', 'frames': frames},
            {'size': 2**20, 'state': 'inactive', 'requested_size': 7},
        ],
    }],
    'device_traces': [[
        entry('alloc', addr=2**40, size=2**20, stream=0, time_us=2**63 - 1,
              compile_context='N/A', user_metadata=''),
        entry('oom', device_free=-2**40, size=5),
        entry('custom_thing', addr=0, size=0, user_metadata={'k': None}),
        entry('custom_thing', addr=1, size=0),
    ], []],
    'allocator_settings': {
        'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True', 'max_split_size': -1,
        'garbage_collection_threshold': 0.75, 'expandable_segments': True,
        'release_lock_on_cudamalloc': True, 'roundup_power2_divisions': {'1': 4, '2': 0},
        'pinned_num_register_threads': 1,
    },
    'external_annotations': [],
}
for p in (2, 3, 4, 5):
    print(pickle.dumps(snap, protocol=p).hex())
"#;

fn python_expected() -> Snapshot {
    let d = frame("f", "x.py", 1);
    let frames = vec![d.clone(), d];
    let entry = |action, addr, device_free, time_us, size| TraceEntry {
        action,
        addr,
        device_free,
        size,
        stream: 0,
        pool_id: None,
        time_us,
        compile_context: "N/A".into(),
        user_metadata: String::new(),
        frames: frames.clone(),
    };
    Snapshot {
        segments: vec![Segment {
            device: 0,
            address: 1 << 40,
            total_size: 2 << 20,
            allocated_size: 1 << 20,
            active_size: 1 << 20,
            requested_size: 1 << 20,
            stream: 0,
            segment_type: SegmentType::Small,
            segment_pool_id: (0, 1),
            is_expandable: false,
            frames: vec![],
            blocks: vec![
                Block {
                    address: 1 << 40,
                    size: 1 << 20,
                    requested_size: 1 << 20,
                    state: BlockState::ActiveAllocated,
                    frames: frames.clone(),
                },
                Block {
                    address: (1 << 40) + (1 << 20),
                    size: 1 << 20,
                    requested_size: 7,
                    state: BlockState::Inactive,
                    frames: vec![],
                },
            ],
        }],
        device_traces: vec![
            vec![
                entry(Action::Alloc, Some(1 << 40), None, i64::MAX, 1 << 20),
                entry(Action::Oom, None, Some(-(1 << 40)), 0, 5),
                entry(Action::Other("custom_thing".into()), Some(0), None, 0, 0),
                entry(Action::Other("custom_thing".into()), Some(1), None, 0, 0),
            ],
            vec![],
        ],
        allocator_settings: Some(AllocatorSettings {
            alloc_conf: "expandable_segments:True".into(),
            max_split_size: -1,
            garbage_collection_threshold: 0.75,
            expandable_segments: true,
            release_lock_on_npumalloc: true,
            roundup_power2_divisions: Divisions(vec![("1".into(), 4), ("2".into(), 0)]),
        }),
        external_annotations: (),
    }
}

#[test]
fn python_pickles_of_protocols_2_to_5_read_with_shared_objects() {
    let out = python(PYTHON_SNAPSHOT);
    let pickles: Vec<Vec<u8>> = out.lines().map(hex).collect();
    assert_eq!(pickles.len(), 4);
    let expected = python_expected();
    for (bytes, protocol) in pickles.iter().zip(2u8..) {
        assert_eq!(bytes[..2], [0x80, protocol]);
        let read = read(bytes).unwrap_or_else(|e| panic!("protocol {protocol}: {e}"));
        assert_eq!(read.snapshot, expected, "protocol {protocol}");
        assert_eq!(
            read.warnings,
            [ReadWarning::UnknownAction {
                device: 0,
                index: 2,
                action: "custom_thing".into(),
                count: 2,
            }]
        );
        assert_eq!(
            read.warnings[0].to_string(),
            "device_traces[0][2].action: unknown action \"custom_thing\" kept as is (2 entries)"
        );
    }
    // The shared frames are why serde-pickle cannot read these.
    for bytes in &pickles {
        let e = serde_pickle::value_from_slice(bytes, serde_pickle::DeOptions::new()).unwrap_err();
        assert!(e.to_string().contains("recursive"), "{e}");
    }
}

/// Every opcode Python's `pickletools` defines is read, refused as code or refused as
/// unsupported, by name; every other byte is unknown.
#[test]
fn every_opcode_of_pickletools_is_classified() {
    let out =
        python("import pickletools\nfor o in pickletools.opcodes: print(ord(o.code), o.name)");
    let defined: HashMap<u8, &str> = out
        .lines()
        .map(|l| {
            let (code, name) = l.split_once(' ').unwrap();
            (code.parse().unwrap(), name)
        })
        .collect();
    assert_eq!(defined.len(), 68);
    let code = [
        "GLOBAL",
        "STACK_GLOBAL",
        "REDUCE",
        "BUILD",
        "INST",
        "OBJ",
        "NEWOBJ",
        "NEWOBJ_EX",
        "PERSID",
        "BINPERSID",
        "EXT1",
        "EXT2",
        "EXT4",
    ];
    let unsupported = [
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "BYTEARRAY8",
        "NEXT_BUFFER",
        "READONLY_BUFFER",
        "EMPTY_SET",
        "ADDITEMS",
        "FROZENSET",
        "INT",
        "LONG",
        "LONG4",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "UNICODE",
        "FLOAT",
        "PUT",
        "GET",
    ];
    let mut read_ops = 0;
    for byte in 0..=255u8 {
        let err = read(&[byte]).unwrap_err();
        match defined.get(&byte) {
            None => assert!(
                matches!(err, ReadError::UnknownOpcode { opcode, offset: 0 } if opcode == byte),
                "{byte:#04x}: {err:?}"
            ),
            Some(name) if code.contains(name) => assert!(
                matches!(err, ReadError::Forbidden { opcode, name: n, offset: 0 }
                    if opcode == byte && n == *name),
                "{name}: {err:?}"
            ),
            Some(name) if unsupported.contains(name) => assert!(
                matches!(err, ReadError::Unsupported { opcode, name: n, offset: 0 }
                    if opcode == byte && n == *name),
                "{name}: {err:?}"
            ),
            Some(name) => {
                read_ops += 1;
                assert!(
                    matches!(
                        err,
                        ReadError::Truncated { .. } | ReadError::Malformed { .. }
                    ),
                    "{name}: {err:?}"
                );
            }
        }
    }
    assert_eq!(read_ops, 68 - code.len() - unsupported.len());
}

// ---------------------------------------------------------------------------------------------
// Hostile input: every error is the exact variant at the exact offset, and nothing runs.

fn err(bytes: &[u8]) -> ReadError {
    match read(bytes) {
        Ok(r) => panic!("{bytes:?} was read: {:?}", r.snapshot),
        Err(e) => e,
    }
}

fn forbidden(bytes: &[u8], op: u8, op_name: &str, at: u64) {
    match err(bytes) {
        ReadError::Forbidden {
            opcode,
            name,
            offset,
        } => assert_eq!((opcode, name, offset), (op, op_name, at)),
        e => panic!("{op_name}: {e:?}"),
    }
}

#[test]
fn code_is_refused_where_it_stands() {
    // PROTO 2; GLOBAL 'os system'; BINUNICODE 'ls'; TUPLE1; REDUCE; STOP.
    let os_system = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.";
    forbidden(os_system, b'c', "GLOBAL", 2);
    assert_eq!(
        err(os_system).to_string(),
        "byte 2: opcode GLOBAL (0x63) could run code; a snapshot holds only plain data"
    );
    // PROTO 4; SHORT_BINUNICODE 'os' (2..6); SHORT_BINUNICODE 'system' (6..14); STACK_GLOBAL.
    forbidden(
        b"\x80\x04\x8c\x02os\x8c\x06system\x93.",
        0x93,
        "STACK_GLOBAL",
        14,
    );
    // MARK; INST 'os system'.
    forbidden(b"(ios\nsystem\n.", b'i', "INST", 1);
    // PROTO 2; MARK; NONE; OBJ.
    forbidden(b"\x80\x02(No.", b'o', "OBJ", 4);
    // PROTO 2; NONE; EMPTY_TUPLE; NEWOBJ.
    forbidden(b"\x80\x02N)\x81.", 0x81, "NEWOBJ", 4);
    // PROTO 4; NONE; EMPTY_TUPLE; EMPTY_DICT; NEWOBJ_EX.
    forbidden(b"\x80\x04N)}\x92.", 0x92, "NEWOBJ_EX", 5);
    // PROTO 2; EMPTY_DICT; EMPTY_DICT; BUILD (serde-pickle would turn this into a dict).
    forbidden(b"\x80\x02}}b.", b'b', "BUILD", 4);
    // PROTO 2; NONE; EMPTY_TUPLE; REDUCE.
    forbidden(b"\x80\x02N)R.", b'R', "REDUCE", 4);
    // PERSID 'abc' (protocol 0, no PROTO).
    forbidden(b"Pabc\n.", b'P', "PERSID", 0);
    // PROTO 2; NONE; BINPERSID.
    forbidden(b"\x80\x02NQ.", b'Q', "BINPERSID", 3);
    // PROTO 2; EXT1 1; EXT2 1; EXT4 1.
    forbidden(b"\x80\x02\x82\x01.", 0x82, "EXT1", 2);
    forbidden(b"\x80\x02\x83\x01\x00.", 0x83, "EXT2", 2);
    forbidden(b"\x80\x02\x84\x01\x00\x00\x00.", 0x84, "EXT4", 2);
    // A refused opcode deep in a valid snapshot: the offset is where it stands.
    let mut bytes = hand_built().to_pickle().unwrap();
    let stop = bytes.len() - 1;
    bytes.splice(stop..stop, *b"cos\nsystem\n");
    forbidden(&bytes, b'c', "GLOBAL", stop as u64);
}

#[test]
fn bytes_sets_and_unknown_bytes_are_refused() {
    // PROTO 3; SHORT_BINBYTES b'abc'.
    match err(b"\x80\x03C\x03abc.") {
        ReadError::Unsupported {
            opcode: b'C',
            name: "SHORT_BINBYTES",
            offset: 2,
        } => {}
        e => panic!("{e:?}"),
    }
    // PROTO 4; EMPTY_SET.
    let e = err(b"\x80\x04\x8f.");
    assert!(
        matches!(
            e,
            ReadError::Unsupported {
                opcode: 0x8f,
                name: "EMPTY_SET",
                offset: 2
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "byte 2: opcode EMPTY_SET (0x8f) is not snapshot data (no bytes, sets or protocol 0/1 \
         text forms)"
    );
    // Protocol 0's INT (how protocol 0 writes True).
    assert!(matches!(
        err(b"I01\n."),
        ReadError::Unsupported {
            name: "INT",
            offset: 0,
            ..
        }
    ));
    // PROTO 2; 0xff.
    let e = err(b"\x80\x02\xff");
    assert!(matches!(
        e,
        ReadError::UnknownOpcode {
            opcode: 0xff,
            offset: 2
        }
    ));
    assert_eq!(e.to_string(), "byte 2: 0xff is not a pickle opcode");
    // PROTO 6 and PROTO 1.
    let e = err(b"\x80\x06N.");
    assert!(matches!(
        e,
        ReadError::UnsupportedProtocol {
            version: 6,
            offset: 0
        }
    ));
    assert_eq!(
        e.to_string(),
        "byte 0: pickle protocol 6; snapshots are read in protocols 2 to 5"
    );
    assert!(matches!(
        err(b"\x80\x01N."),
        ReadError::UnsupportedProtocol { version: 1, .. }
    ));
}

#[test]
fn malformed_and_truncated_input_is_named() {
    let malformed = |bytes: &[u8], at: u64, why: &str| match err(bytes) {
        ReadError::Malformed { offset, reason } => {
            assert_eq!((offset, reason), (at, why), "{bytes:?}")
        }
        e => panic!("{bytes:?}: {e:?}"),
    };
    // PROTO 2; LONG1 of 9 bytes (2**64 + 1).
    malformed(
        b"\x80\x02\x8a\x09\x01\x00\x00\x00\x00\x00\x00\x00\x01.",
        2,
        "an integer wider than 64 bits",
    );
    // PROTO 2; STOP.
    malformed(b"\x80\x02.", 2, "STOP with an empty stack");
    // PROTO 2; NONE; NONE; STOP.
    malformed(
        b"\x80\x02NN.",
        4,
        "STOP with more than one value on the stack",
    );
    // PROTO 2; MARK; NONE; STOP.
    malformed(b"\x80\x02(N.", 4, "STOP with a MARK still open");
    // PROTO 2; EMPTY_LIST; NONE; APPENDS (no MARK).
    malformed(b"\x80\x02]Ne.", 4, "no MARK before this opcode");
    // PROTO 2; EMPTY_LIST; MARK; APPEND: the list is below the mark, out of reach.
    malformed(b"\x80\x02](Na.", 5, "stack underflow");
    // PROTO 2; POP on an empty stack.
    malformed(b"\x80\x020", 2, "stack underflow");
    // PROTO 2; TUPLE3 of two values.
    malformed(b"\x80\x02NN\x87.", 4, "stack underflow");
    // PROTO 2; BINGET 5, never put.
    malformed(b"\x80\x02h\x05.", 2, "a memo get of an entry never put");
    // PROTO 2; EMPTY_DICT; MARK; NONE; SETITEMS: a key without its value.
    malformed(b"\x80\x02}(Nu.", 5, "a dict's key without a value");
    // PROTO 2; EMPTY_DICT; NONE; APPEND.
    malformed(
        b"\x80\x02}Na.",
        4,
        "an append to something other than a list",
    );
    // PROTO 2; EMPTY_TUPLE; NONE; NONE; SETITEM.
    malformed(
        b"\x80\x02)NNs.",
        5,
        "a set item on something other than a dict",
    );
    // PROTO 2; SHORT_BINUNICODE of a lone surrogate (Python writes it with 'surrogatepass').
    malformed(
        b"\x80\x02\x8c\x03\xed\xa0\x80.",
        2,
        "a string that is not valid UTF-8",
    );

    let truncated = |bytes: &[u8], at: u64| match err(bytes) {
        ReadError::Truncated { offset } => assert_eq!(offset, at, "{bytes:?}"),
        e => panic!("{bytes:?}: {e:?}"),
    };
    truncated(b"", 0);
    truncated(b"\x80", 0);
    truncated(b"\x80\x02N", 3);
    // BINUNICODE claiming 4 GiB - 1 with 3 bytes following: refused before any allocation.
    truncated(b"\x80\x02X\xff\xff\xff\xffabc", 2);
    // BINUNICODE8 claiming 2**64 - 1 bytes.
    truncated(b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xffabc", 2);
    // FRAME whose length is cut short.
    truncated(b"\x80\x04\x95\x01\x00", 2);

    // PROTO 2; NONE; STOP; NONE.
    let e = err(b"\x80\x02N.N");
    assert!(matches!(e, ReadError::TrailingBytes { offset: 4 }), "{e:?}");
    assert_eq!(e.to_string(), "byte 4: data after the pickle's STOP");
}

/// `] MEMOIZE POP` then, 40 times, `] MEMOIZE ( BINGET i BINGET i APPENDS POP`: list i + 1 is
/// [list i, list i], 2**40 leaves for 365 bytes; the stack is left empty.
fn memo_bomb_list() -> Vec<u8> {
    let mut b = b"\x80\x04]\x940".to_vec();
    for i in 0..40u8 {
        b.extend_from_slice(&[b']', 0x94, b'(', b'h', i, b'h', i, b'e', b'0']);
    }
    b
}

#[test]
fn a_memo_bomb_is_never_expanded() {
    // As the top level: read as a list of segments, whose first is a list, not a dict.
    let mut top = memo_bomb_list();
    top.extend_from_slice(b"h\x28.");
    let e = err(&top);
    assert!(
        matches!(&e, ReadError::Shape { path, expected: "a dict", found: "a list" }
            if path == "[0]"),
        "{e:?}"
    );
    // Under a key the reader ignores: never walked.
    let mut ignored = memo_bomb_list();
    ignored.extend_from_slice(b"}(\x8c\x08segments]\x8c\x14external_annotationsh\x28u.");
    assert_eq!(read(&ignored).unwrap().snapshot, Snapshot::default());
}

/// A bomb in the shape of a snapshot: `n` device traces, each the same list of `n` entries,
/// each with the same list of `n` frames: `n`³ frames from about 6 × `n` bytes.
fn shaped_bomb(n: usize) -> Vec<u8> {
    let gets = |memo: u8| std::iter::repeat_n([b'h', memo], n).flatten();
    let mut b = b"\x80\x04".to_vec();
    // memo 0: the frame {}; memo 1: the frames list [frame] * n; POP both.
    b.extend_from_slice(b"}\x94]\x94(");
    b.extend(gets(0));
    b.extend_from_slice(b"e00");
    // memo 2: the entry {'action': 'alloc', 'addr': 0, 'size': 0, 'frames': memo 1}; POP.
    b.extend_from_slice(b"}\x94(\x8c\x06action\x8c\x05alloc\x8c\x04addrK\x00\x8c\x04sizeK\x00");
    b.extend_from_slice(b"\x8c\x06framesh\x01u0");
    // memo 3: the trace [entry] * n; POP.
    b.extend_from_slice(b"]\x94(");
    b.extend(gets(2));
    b.extend_from_slice(b"e0");
    // The top level: {'segments': [], 'device_traces': [trace] * n}.
    b.extend_from_slice(b"}(\x8c\x08segments]\x8c\x0ddevice_traces](");
    b.extend(gets(3));
    b.extend_from_slice(b"eu.");
    b
}

#[test]
fn a_bomb_shaped_like_a_snapshot_is_too_large() {
    let bomb = shaped_bomb(1000);
    assert!(bomb.len() < 7_000);
    let e = err(&bomb);
    assert!(
        matches!(
            e,
            ReadError::TooLarge {
                limit: 1_000_000,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "the snapshot is too large: more than 1000000 values decoded (shared objects count at \
         each reference)"
    );
    // The same shape, small: every reference is its own copy.
    let r = read(&shaped_bomb(10)).unwrap();
    let traces = &r.snapshot.device_traces;
    assert_eq!(traces.len(), 10);
    assert!(traces.iter().all(|t| t.len() == 10));
    assert!(
        traces
            .iter()
            .flatten()
            .all(|e| e.frames == vec![frame("", "", 0); 10])
    );
    // Within a smaller budget, it is not.
    let limits = Limits {
        max_values: Some(1_000),
        ..Limits::default()
    };
    assert!(matches!(
        read_with(&shaped_bomb(10), &limits),
        Err(ReadError::TooLarge { limit: 1_000, .. })
    ));
}

/// torch_npu shares each frame dict across stacks (`stacks="all"` records deep C++ stacks), so a
/// shared string is copied, and counted against the text budget, once: 1,000 entries whose
/// frames repeat one 64 KiB name read within a 1 MiB budget, and hold the name once.
#[test]
fn shared_text_is_metered_once() {
    // A 64 KiB name in one frame, the frame shared by 1,000 entries' frames lists.
    let mut b = b"\x80\x04}\x94(\x8c\x04nameX\x00\x00\x01\x00".to_vec();
    b.extend(std::iter::repeat_n(b'x', 1 << 16));
    // The frame is memo 0, its list memo 1, the entry memo 2 (each popped once memoized).
    b.extend_from_slice(b"u0]\x94h\x00a0}\x94(\x8c\x06action\x8c\x05alloc\x8c\x04addrK\x00");
    b.extend_from_slice(b"\x8c\x04sizeK\x00\x8c\x06framesh\x01u0}(\x8c\x08segments]");
    b.extend_from_slice(b"\x8c\x0ddevice_traces]](");
    b.extend((0..1000).flat_map(|_| *b"h\x02"));
    b.extend_from_slice(b"eau.");
    let limits = Limits {
        max_text: Some(1 << 20),
        ..Limits::default()
    };
    let r = read_with(&b, &limits).unwrap();
    let trace = &r.snapshot.device_traces[0];
    assert_eq!(trace.len(), 1000);
    assert_eq!(trace[999].frames[0].name.len(), 1 << 16);
    assert!(std::sync::Arc::ptr_eq(
        &trace[0].frames[0].name,
        &trace[999].frames[0].name
    ));
    // The text itself still counts: a budget below one copy refuses it.
    let limits = Limits {
        max_text: Some(32 << 10),
        ..Limits::default()
    };
    let e = read_with(&b, &limits).unwrap_err();
    assert!(
        matches!(e, ReadError::TooLarge { limit, .. } if limit == 32 << 10),
        "{e:?}"
    );
}

#[test]
fn deep_nesting_neither_overflows_nor_recurses() {
    // 10,000 MARKs: the 101st is refused.
    let e = err(&[b'('; 10_000]);
    assert!(
        matches!(
            e,
            ReadError::TooLarge {
                what: "nested MARKs",
                limit: 100
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "the snapshot is too large: more than 100 nested MARKs"
    );
    // 100,000 lists nested by APPEND: built, then dropped, without recursion.
    let n = 100_000;
    let mut deep = vec![b']'; n];
    deep.extend(std::iter::repeat_n(b'a', n - 1));
    let mut ignored = b"}(\x8c\x08segments]\x8c\x14external_annotations".to_vec();
    ignored.extend_from_slice(&deep);
    ignored.extend_from_slice(b"u.");
    assert_eq!(read(&ignored).unwrap().snapshot, Snapshot::default());
    deep.push(b'.');
    let e = err(&deep);
    assert!(
        matches!(&e, ReadError::Shape { path, found: "a list", .. } if path == "[0]"),
        "{e:?}"
    );
    // A list that holds itself: EMPTY_LIST; MEMOIZE; BINGET 0; APPEND.
    let e = err(b"\x80\x04]\x94h\x00a.");
    assert!(
        matches!(&e, ReadError::Shape { path, .. } if path == "[0]"),
        "{e:?}"
    );
}

#[test]
fn limits_bound_strings_memo_and_input() {
    let limits = Limits {
        max_string: 3,
        ..Limits::default()
    };
    // SHORT_BINUNICODE of 4 bytes.
    let e = read_with(b"\x8c\x04abcd.", &limits).unwrap_err();
    assert!(matches!(
        e,
        ReadError::TooLarge {
            what: "bytes in one string",
            limit: 3
        }
    ));
    let limits = Limits {
        max_memo: Some(1),
        ..Limits::default()
    };
    // NONE; MEMOIZE; MEMOIZE; STOP.
    let e = read_with(b"N\x94\x94.", &limits).unwrap_err();
    assert!(matches!(
        e,
        ReadError::TooLarge {
            what: "memo entries",
            limit: 1
        }
    ));
    // The same index put again is no new entry: NONE; BINPUT 7; BINPUT 7.
    let e = read_with(b"Nq\x07q\x07.", &limits).unwrap_err();
    assert!(matches!(e, ReadError::Shape { .. }), "{e:?}");
    let limits = Limits {
        max_input: 10,
        ..Limits::default()
    };
    let e = read_with(&[b'N'; 11], &limits).unwrap_err();
    assert!(matches!(
        e,
        ReadError::TooLarge {
            what: "bytes of input",
            limit: 10
        }
    ));
}

// ---------------------------------------------------------------------------------------------
// Data that is pickle but not a snapshot, and what a missing key becomes.

/// A snapshot with one segment whose `key` is replaced (or removed, with `None`), pickled by
/// Python.
fn python_segment(change: &str) -> Vec<u8> {
    let script = format!(
        "import pickle\n\
         s = {{'address': 4096, 'total_size': 1024, 'stream': 0, 'blocks': [\
         {{'size': 1024, 'state': 'active_allocated'}}]}}\n\
         {change}\n\
         print(pickle.dumps({{'segments': [s]}}, protocol=4).hex())"
    );
    hex(python(&script).trim())
}

fn shape(bytes: &[u8]) -> (String, &'static str, &'static str) {
    match err(bytes) {
        ReadError::Shape {
            path,
            expected,
            found,
        } => (path, expected, found),
        e => panic!("{e:?}"),
    }
}

#[test]
fn shape_errors_name_the_path() {
    let bytes = python_segment("s['total_size'] = '1024'");
    assert_eq!(
        shape(&bytes),
        ("segments[0].total_size".into(), "an integer", "a string")
    );
    assert_eq!(
        err(&bytes).to_string(),
        "segments[0].total_size: expected an integer, found a string"
    );
    assert_eq!(
        shape(&python_segment("s['blocks'][0]['state'] = 'bogus'")),
        (
            "segments[0].blocks[0].state".into(),
            "a block state",
            "another string"
        )
    );
    assert_eq!(
        shape(&python_segment("s['blocks'][0]['size'] = 1024.0")),
        ("segments[0].blocks[0].size".into(), "an integer", "a float")
    );
    // Python's bool is an int; a size is not a bool.
    assert_eq!(
        shape(&python_segment("s['stream'] = True")),
        ("segments[0].stream".into(), "an integer", "a bool")
    );
    assert_eq!(
        shape(&python_segment("del s['address']")),
        ("segments[0].address".into(), "an integer", "nothing")
    );
    assert_eq!(
        shape(&python_segment("s['segment_type'] = 'medium'")),
        (
            "segments[0].segment_type".into(),
            "a segment type (small or large)",
            "another string"
        )
    );
    assert_eq!(
        shape(&python_segment("s['segment_pool_id'] = (1, 2, 3)")),
        (
            "segments[0].segment_pool_id".into(),
            "a pair of integers",
            "a tuple"
        )
    );
    assert_eq!(
        shape(&python_segment("s['segment_pool_id'] = [1, None]")),
        (
            "segments[0].segment_pool_id[1]".into(),
            "an integer",
            "None"
        )
    );
    assert_eq!(
        shape(&python_segment("s['blocks'][0]['frames'] = [{'name': 3}]")),
        (
            "segments[0].blocks[0].frames[0].name".into(),
            "a string",
            "an integer"
        )
    );

    // The top level.
    let top = hex(python("import pickle; print(pickle.dumps('x', protocol=4).hex())").trim());
    assert_eq!(
        shape(&top),
        (String::new(), "a dict (or a list of segments)", "a string")
    );
    assert_eq!(
        err(&top).to_string(),
        "top level: expected a dict (or a list of segments), found a string"
    );
    let no_segments =
        hex(python("import pickle; print(pickle.dumps({}, protocol=4).hex())").trim());
    assert_eq!(
        shape(&no_segments),
        ("segments".into(), "a list", "nothing")
    );

    // Trace entries and settings.
    let trace = |entry: &str| {
        hex(python(&format!(
            "import pickle; print(pickle.dumps({{'segments': [], 'device_traces': [[{entry}]]}}, \
             protocol=2).hex())"
        ))
        .trim())
    };
    assert_eq!(
        shape(&trace("{'action': 'alloc', 'size': 1}")),
        ("device_traces[0][0].addr".into(), "an integer", "nothing")
    );
    assert_eq!(
        shape(&trace("{'action': 7, 'addr': 0, 'size': 1}")),
        (
            "device_traces[0][0].action".into(),
            "a string",
            "an integer"
        )
    );
    let settings = |s: &str| {
        hex(python(&format!(
            "import pickle; print(pickle.dumps({{'segments': [], 'allocator_settings': {s}}}, \
             protocol=3).hex())"
        ))
        .trim())
    };
    assert_eq!(
        shape(&settings("{'roundup_power2_divisions': {'1': 'x'}}")),
        (
            "allocator_settings.roundup_power2_divisions[\"1\"]".into(),
            "an integer",
            "a string"
        )
    );
    assert_eq!(
        shape(&settings("{'expandable_segments': 1}")),
        (
            "allocator_settings.expandable_segments".into(),
            "a bool",
            "an integer"
        )
    );
    assert_eq!(
        shape(&settings("[]")),
        ("allocator_settings".into(), "a dict", "a list")
    );
}

#[test]
fn missing_keys_take_torch_defaults() {
    let out = python(
        "import pickle\n\
         seg = {'address': 4096, 'total_size': 3072, 'stream': 0, 'blocks': [\
           {'size': 1024, 'state': 'active_allocated'},\
           {'size': 1024, 'state': 'active_pending_free', 'requested_size': 1000},\
           {'size': 1024, 'state': 'inactive', 'address': 9999}]}\n\
         print(pickle.dumps({'segments': [seg], 'device_traces': [[\
           {'action': 'oom', 'size': 8, 'user_metadata': {'a': 1}}]],\
           'allocator_settings': {'garbage_collection_threshold': 1,\
             'roundup_power2_divisions': {'1': 1, '2': 2}}}, protocol=5).hex())\n\
         print(pickle.dumps([seg], protocol=2).hex())",
    );
    let mut lines = out.lines().map(hex);
    let read = read(&lines.next().unwrap()).unwrap();
    let seg = &read.snapshot.segments[0];
    assert_eq!(seg.device, 0);
    assert_eq!(seg.segment_type, SegmentType::Large);
    assert_eq!(seg.segment_pool_id, (0, 0));
    assert!(!seg.is_expandable);
    assert_eq!(
        (seg.allocated_size, seg.active_size, seg.requested_size),
        (1024, 2048, 2024)
    );
    let addresses: Vec<i64> = seg.blocks.iter().map(|b| b.address).collect();
    assert_eq!(addresses, [4096, 5120, 9999]);
    assert_eq!(
        read.warnings,
        [ReadWarning::Untiled {
            segment: 0,
            how: Untiled::Misplaced {
                block: 2,
                address: 9999,
                expected: 6144
            },
            count: 1
        }]
    );
    let requested: Vec<i64> = seg.blocks.iter().map(|b| b.requested_size).collect();
    assert_eq!(requested, [1024, 1000, 0]);
    let oom = &read.snapshot.device_traces[0][0];
    assert_eq!(
        *oom,
        TraceEntry {
            action: Action::Oom,
            addr: None,
            device_free: None,
            size: 8,
            stream: 0,
            pool_id: None,
            time_us: 0,
            compile_context: "N/A".into(),
            user_metadata: String::new(),
            frames: vec![],
        }
    );
    let s = read.snapshot.allocator_settings.unwrap();
    assert_eq!(
        s,
        AllocatorSettings {
            alloc_conf: String::new(),
            max_split_size: -1,
            garbage_collection_threshold: 1.0,
            expandable_segments: false,
            release_lock_on_npumalloc: false,
            roundup_power2_divisions: Divisions(vec![("1".into(), 1), ("2".into(), 2)]),
        }
    );

    // torch's older memory_snapshot(): the segment list alone.
    let old = alloc_snapshot::read(&lines.next().unwrap()).unwrap();
    assert_eq!(old.snapshot.segments, read.snapshot.segments);
    assert!(old.snapshot.device_traces.is_empty());
    assert!(old.snapshot.allocator_settings.is_none());
}

#[test]
fn segments_whose_blocks_do_not_tile_them_are_read_with_one_warning() {
    let out = python(
        "import pickle\n\
         def seg(total, *blocks): return {'address': 4096, 'total_size': total, 'stream': 0,\
           'blocks': [{'size': s, 'state': 'inactive'} for s in blocks]}\n\
         segs = [seg(3072, 1024, 2048), seg(3072, 1024, 1024), seg(3072, 1024, -1, 3072),\
           seg(512), seg(2**63 - 1, 2**63 - 1)]\n\
         print(pickle.dumps({'segments': segs}, protocol=4).hex())\n\
         print(pickle.dumps({'segments': segs[:1]}, protocol=4).hex())",
    );
    let mut lines = out.lines().map(hex);
    let r = read(&lines.next().unwrap()).unwrap();
    // The first tiles; the second is 1024 bytes short, the third has a negative block (whose
    // successor memory_viz would place before it), the fourth has no blocks, and the fifth
    // ends past i64::MAX.
    assert_eq!(
        r.warnings,
        [ReadWarning::Untiled {
            segment: 1,
            how: Untiled::Total {
                blocks: 2048,
                total_size: 3072
            },
            count: 4
        }]
    );
    assert_eq!(
        r.warnings[0].to_string(),
        "segments[1]: the blocks' sizes add up to 2048, not to the segment's total_size 3072; \
         read as is, but memory_viz would refuse it (4 segments so)"
    );
    assert_eq!(r.snapshot.segments.len(), 5);
    assert!(read(&lines.next().unwrap()).unwrap().warnings.is_empty());
    let seg = |blocks: &[(i64, i64)], total_size| Segment {
        address: 4096,
        total_size,
        blocks: blocks
            .iter()
            .map(|&(address, size)| alloc_snapshot::Block {
                address,
                size,
                requested_size: 0,
                state: BlockState::Inactive,
                frames: Vec::new(),
            })
            .collect(),
        ..r.snapshot.segments[0].clone()
    };
    // Each way, through a round trip of our own writer.
    for (segment, how) in [
        (
            seg(&[(4096, -1), (4095, 1)], 0),
            Untiled::BadSize { block: 0 },
        ),
        (
            seg(&[(4096, 10), (4100, 10)], 20),
            Untiled::Misplaced {
                block: 1,
                address: 4100,
                expected: 4106,
            },
        ),
        (
            seg(&[(i64::MAX - 1, 8)], 8),
            Untiled::Misplaced {
                block: 0,
                address: i64::MAX - 1,
                expected: 4096,
            },
        ),
        (
            seg(&[(4096, i64::MAX)], i64::MAX),
            Untiled::BadSize { block: 0 },
        ),
    ] {
        let snapshot = Snapshot {
            segments: vec![segment],
            ..Snapshot::default()
        };
        let warnings = read(&snapshot.to_pickle().unwrap()).unwrap().warnings;
        assert_eq!(
            warnings,
            [ReadWarning::Untiled {
                segment: 0,
                how,
                count: 1
            }]
        );
    }
}

#[test]
fn a_repeated_key_keeps_its_place_and_its_last_value() {
    // {'segments': [], 'allocator_settings': {'roundup_power2_divisions': d}} where d is set
    // by SETITEMS '1': 1, '2': 2, '1': 3 (as Python's dict: '1' first, with 3).
    let bytes = b"}(\x8c\x08segments]\x8c\x12allocator_settings}(\x8c\x18roundup_power2_divisions\
                  }(\x8c\x011K\x01\x8c\x012K\x02\x8c\x011K\x03uuu.";
    let s = read(bytes).unwrap().snapshot.allocator_settings.unwrap();
    assert_eq!(
        s.roundup_power2_divisions,
        Divisions(vec![("1".into(), 3), ("2".into(), 2)])
    );
}

#[test]
fn a_pickle_without_proto_reads_with_the_same_opcodes() {
    // EMPTY_DICT; MARK; SHORT_BINUNICODE 'segments'; EMPTY_LIST; SETITEMS; STOP.
    let r = read(b"}(\x8c\x08segments]u.").unwrap();
    assert_eq!(r.snapshot, Snapshot::default());
    // With a FRAME, as protocol 4 writes, and a frame length that is not checked.
    let r = read(b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00}(\x8c\x08segments]u.").unwrap();
    assert_eq!(r.snapshot, Snapshot::default());
}

#[test]
fn totals_of_a_malformed_snapshot_count_negative_sizes_as_0_and_stop_at_u64_max() {
    use alloc_snapshot::{Block, Segment, Snapshot};
    let segment = |total_size, blocks| Segment {
        device: 0,
        address: 0,
        total_size,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream: 0,
        segment_type: SegmentType::Large,
        segment_pool_id: (0, 0),
        is_expandable: false,
        frames: Vec::new(),
        blocks,
    };
    let block = |size| Block {
        address: 0,
        size,
        requested_size: 0,
        state: BlockState::ActiveAllocated,
        frames: Vec::new(),
    };
    let snapshot = Snapshot {
        segments: vec![
            segment(i64::MAX, vec![block(i64::MAX), block(-5)]),
            segment(i64::MAX, vec![block(i64::MAX)]),
            segment(i64::MAX, vec![block(i64::MAX)]),
            segment(-7, Vec::new()),
        ],
        ..Snapshot::default()
    };
    let t = snapshot.totals();
    assert_eq!((t.segments, t.blocks), (4, [4, 0, 0]));
    assert_eq!(
        (t.reserved, t.allocated, t.active),
        (u64::MAX, u64::MAX, u64::MAX)
    );
}
