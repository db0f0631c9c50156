//! Property test: random alloc / free / record_stream / complete / empty_cache sequences on the
//! simulated device, checking after every step that no two blocks overlap, every stat equals a
//! recount from the block table, reserved equals the device's outstanding bytes, and that after
//! freeing everything and `empty_cache` nothing is left on the device.

mod common;

use alloc_core::{AllocConf, AllocError, BlockState, StreamId};
use common::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: u64, stream: u64 },
    Free { pick: usize },
    Record { pick: usize, stream: u64 },
    Complete { stream: Option<u64> },
    EmptyCache,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..=8192,
        2 => (MIB - 4096)..=(MIB + 4096),
        2 => (MIB + 1)..(10 * MIB),
        1 => prop::sample::select(vec![0, 1, 511, 512, MIB - 1, MIB, MIB + 1, 10 * MIB - 512, 10 * MIB + 512]),
        1 => (10 * MIB)..(70 * MIB),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (size(), 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        6 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0u64..3).prop_map(|(pick, stream)| Op::Record { pick, stream }),
        2 => prop::option::of(0u64..3).prop_map(|stream| Op::Complete { stream }),
        1 => Just(Op::EmptyCache),
    ]
}

fn confs() -> Vec<AllocConf> {
    vec![
        AllocConf::default(),
        conf("max_split_size_mb:40"),
        conf("roundup_power2_divisions:4"),
        conf("garbage_collection_threshold:0.6"),
        conf("garbage_collection_threshold:0.6,per_process_memory_fraction:0.7"),
    ]
}

fn run(conf: &AllocConf, pad: bool, ops: &[Op]) {
    let capacity = 200 * MIB;
    let mut a = if pad {
        npu(capacity, conf)
    } else {
        cuda(capacity, conf)
    };
    let mut live: Vec<(u64, u64)> = Vec::new();
    for op in ops {
        match *op {
            Op::Alloc { size, stream } => match a.malloc(size, StreamId(stream)) {
                Ok(0) => assert_eq!(size, 0),
                Ok(addr) => {
                    assert!(
                        live.iter().all(|&(p, _)| p != addr),
                        "address {addr:#x} handed out twice"
                    );
                    live.push((addr, size));
                }
                Err(AllocError::OutOfMemory(oom)) => {
                    assert!(oom.alloc_size > 0);
                }
                Err(e) => panic!("unexpected error {e:?}"),
            },
            Op::Free { pick } if !live.is_empty() => {
                let (addr, _) = live.swap_remove(pick % live.len());
                a.free(addr).unwrap();
            }
            Op::Record { pick, stream } if !live.is_empty() => {
                let (addr, _) = live[pick % live.len()];
                a.record_stream(addr, StreamId(stream)).unwrap();
            }
            Op::Complete { stream: Some(s) } => a.device_mut().complete_stream(StreamId(s)),
            Op::Complete { stream: None } => a.device_mut().complete_all(),
            Op::EmptyCache => a.empty_cache().unwrap(),
            _ => {}
        }
        check_consistency(&a);
        // Every live allocation is an allocated block at least as large as the request.
        let snap = a.snapshot();
        for &(addr, size) in &live {
            let block = snap
                .iter()
                .flat_map(|s| s.blocks.iter())
                .find(|b| b.address == addr)
                .expect("live address is a block");
            assert_eq!(block.state, BlockState::ActiveAllocated);
            assert!(block.size >= size);
        }
    }
    for (addr, _) in live.drain(..) {
        a.free(addr).unwrap();
    }
    a.empty_cache().unwrap();
    check_consistency(&a);
    assert_eq!(a.device().outstanding_bytes(), 0, "device memory leaked");
    assert_eq!(a.device().outstanding_events(), 0, "events leaked");
    assert_eq!(a.stats().segment.all.current, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_invariant(
        which in 0usize..5,
        pad in any::<bool>(),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        run(&confs()[which], pad, &ops);
    }
}
