//! Replays every shipped trace and checks the numbers its comments promise, and the GPT-2 step
//! against what PyTorch itself reserved for it.

use alloc_trace::{Report as ReplayReport, Setup, replay};

const MIB: i64 = 1 << 20;

fn run(name: &str, pad: Option<u64>) -> ReplayReport {
    run_with(name, pad, "")
}

/// Replays with `extra` config items after the trace's own.
fn run_with(name: &str, pad: Option<u64>, extra: &str) -> ReplayReport {
    let path = format!("{}/traces/{name}.trace", env!("CARGO_MANIFEST_DIR"));
    let trace = alloc_trace::load(&path).unwrap();
    let text = [trace.conf.as_deref().unwrap_or(""), extra]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(",");
    let parsed = alloc_conf::parse(&text);
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    replay(&trace, &Setup::from_trace(&trace, parsed.conf, None, pad)).unwrap()
}

fn get(r: &ReplayReport, label: &str, key: &str) -> i64 {
    let record = r
        .records
        .iter()
        .chain([&r.end])
        .find(|s| s.label == label)
        .unwrap();
    record
        .stats
        .flat()
        .into_iter()
        .find(|(k, _)| k == key)
        .unwrap()
        .1
}

#[test]
fn split_merge() {
    let r = run("split_merge", None);
    assert_eq!(get(&r, "packed", "allocated_bytes.all.current"), 528_384);
    assert_eq!(get(&r, "packed", "reserved_bytes.all.current"), 2 * MIB);
    assert_eq!(get(&r, "packed", "segment.all.current"), 1);
    assert_eq!(get(&r, "packed", "inactive_split.all.current"), 1);
    assert_eq!(get(&r, "hole_reused", "inactive_split.all.current"), 2);
    assert_eq!(get(&r, "merged", "allocated_bytes.all.current"), 0);
    assert_eq!(get(&r, "merged", "reserved_bytes.all.current"), 2 * MIB);
    assert_eq!(get(&r, "merged", "inactive_split.all.current"), 0);
    assert_eq!(get(&r, "emptied", "num_device_alloc"), 1);
    assert_eq!(get(&r, "emptied", "num_device_free"), 1);
    assert_eq!(get(&r, "emptied", "reserved_bytes.all.current"), 0);
}

#[test]
fn oversize() {
    let r = run("oversize", None);
    assert_eq!(get(&r, "reuse", "allocated_bytes.all.current"), 64 * MIB);
    assert_eq!(get(&r, "reuse", "requested_bytes.all.current"), 50 * MIB);
    assert_eq!(get(&r, "reuse", "reserved_bytes.all.current"), 64 * MIB);
    assert_eq!(get(&r, "reuse", "num_device_alloc"), 1);
    assert_eq!(get(&r, "no_reuse", "reserved_bytes.all.current"), 124 * MIB);
    assert_eq!(get(&r, "no_reuse", "allocated_bytes.all.current"), 48 * MIB);
    assert_eq!(get(&r, "no_reuse", "oversize_segments.current"), 2);
    assert_eq!(get(&r, "no_reuse", "oversize_allocations.current"), 1);
    assert_eq!(get(&r, "no_reuse", "num_device_alloc"), 3);
    assert_eq!(get(&r, "emptied", "num_device_free"), 3);
    assert_eq!(get(&r, "emptied", "max_split_size"), 32 * MIB);
}

#[test]
fn record_stream() {
    let r = run("record_stream", None);
    assert_eq!(get(&r, "pending", "allocated_bytes.all.current"), 4 * MIB);
    assert_eq!(get(&r, "pending", "active_bytes.all.current"), 8 * MIB);
    assert_eq!(get(&r, "completed", "active_bytes.all.current"), 8 * MIB);
    assert_eq!(get(&r, "reused", "allocated_bytes.all.current"), 8 * MIB);
    assert_eq!(get(&r, "reused", "active_bytes.all.current"), 8 * MIB);
    assert_eq!(get(&r, "reused", "num_device_alloc"), 1);
    assert_eq!(get(&r, "end", "num_device_alloc"), 2);
    assert_eq!(get(&r, "end", "active_bytes.all.current"), 0);
}

#[test]
fn oom_retry() {
    let r = run("oom_retry", None);
    assert_eq!(
        get(&r, "after_retry", "reserved_bytes.all.current"),
        40 * MIB
    );
    assert_eq!(get(&r, "after_retry", "num_alloc_retries"), 1);
    assert_eq!(get(&r, "after_retry", "num_sync_all_streams"), 1);
    assert_eq!(get(&r, "after_retry", "num_device_free"), 2);
    assert_eq!(get(&r, "after_retry", "num_ooms"), 0);
    assert_eq!(get(&r, "after_oom", "num_alloc_retries"), 2);
    assert_eq!(get(&r, "after_oom", "num_sync_all_streams"), 2);
    assert_eq!(get(&r, "after_oom", "num_ooms"), 1);
    assert_eq!((r.counts.ooms, r.counts.skipped), (1, 1));
}

#[test]
fn gpt2_step_reserves_no_more_than_pytorch() {
    // PyTorch reserved 14,180,941,824 bytes (216 segments, 13.21 GiB) for this step.
    let r = run("gpt2_step", Some(0));
    let peak = get(&r, "end", "reserved_bytes.all.peak");
    assert!(peak <= 14_180_941_824, "{peak}");
    // Our exact figure, pinned so a policy change shows up here.
    assert_eq!(peak, 14_088_667_136);
    assert_eq!(get(&r, "end", "segment.all.current"), 240);
    assert_eq!(get(&r, "end", "num_ooms"), 0);
    assert_eq!((r.counts.allocs, r.counts.frees), (1950, 1721));
    // Whole-run peaks (the trace resets peaks once): requested 12.97 GiB as torch measured.
    assert_eq!(r.device_peak_bytes as i64, peak);
    assert_eq!(r.peak_requested_bytes, 13_923_997_700);
    assert_eq!(
        alloc_core::FormatSize(r.peak_requested_bytes).to_string(),
        "12.97 GiB"
    );
    // With torch_npu's 32-byte pad every request takes up to 512 bytes more.
    let padded = run("gpt2_step", None);
    assert_eq!(
        get(&padded, "end", "reserved_bytes.all.peak"),
        14_457_765_888
    );
}

#[test]
fn gpt2_step_with_expandable_segments() {
    // Numbers of an independent model of torch_npu's policy, matched exactly: at pad 0, 664
    // large pages of 20 MiB and 8 small ones of 2 MiB, one range per pool.
    let r = run_with("gpt2_step", Some(0), "expandable_segments:True");
    assert_eq!(get(&r, "end", "reserved_bytes.all.peak"), 13_941_866_496);
    assert_eq!(get(&r, "end", "num_device_alloc"), 247);
    assert_eq!(get(&r, "end", "segment.all.peak"), 0);
    assert_eq!(r.device_peak_bytes, 13_941_866_496);
    // With the 32-byte pad a freed 96 MiB + 512 block holds three 24 MiB + 512 tensors, not
    // four, and the 16 KiB alignment takes 15,872 bytes before most of them: 28 pages more
    // (docs/expandable-segments.md).
    let r = run_with("gpt2_step", None, "expandable_segments:True");
    assert_eq!(get(&r, "end", "reserved_bytes.all.peak"), 14_529_069_056);
    assert_eq!(get(&r, "end", "num_device_alloc"), 226);
    // Without the alignment the same peak, three map calls fewer.
    let r = run_with(
        "gpt2_step",
        None,
        "expandable_segments:True,base_addr_aligned_kb:0",
    );
    assert_eq!(get(&r, "end", "reserved_bytes.all.peak"), 14_529_069_056);
    assert_eq!(get(&r, "end", "num_device_alloc"), 223);
}

#[test]
fn expandable_pad() {
    // The numbers the trace's comments promise.
    let peak = |r: &ReplayReport| get(r, "end", "reserved_bytes.all.peak");
    assert_eq!(peak(&run("expandable_pad", Some(0))), 120 * MIB);
    assert_eq!(peak(&run("expandable_pad", None)), 160 * MIB);
    let path = format!("{}/traces/expandable_pad.trace", env!("CARGO_MANIFEST_DIR"));
    let trace = alloc_trace::load(&path).unwrap();
    let plain = replay(
        &trace,
        &Setup::from_trace(&trace, Default::default(), None, None),
    )
    .unwrap();
    assert_eq!(peak(&plain), 124 * MIB);
}

#[test]
fn rl_memory_saver() {
    // The numbers the trace's comments promise: pausing the rollout engine's 24 GiB keeps the
    // physical peak that much below the peak without pauses (torch's peak reserved).
    let r = run("rl_memory_saver", None);
    let reserved_peak = get(&r, "end", "reserved_bytes.all.peak");
    assert_eq!(reserved_peak, 77_353_451_520);
    assert_eq!(r.saver.held_bytes.peak, 51_564_773_376);
    assert_eq!(r.saver.paused_bytes.peak, 25_788_678_144);
    assert!(r.saver.held_bytes.peak <= reserved_peak - r.saver.paused_bytes.peak);
    assert_eq!((r.counts.pauses, r.counts.resumes), (2, 2));
    // The weights come back byte for byte (the trace's `expect` lines, checked).
    let path = format!(
        "{}/traces/rl_memory_saver.trace",
        env!("CARGO_MANIFEST_DIR")
    );
    let trace = alloc_trace::load(&path).unwrap();
    let setup = Setup::from_trace(&trace, Default::default(), None, None);
    alloc_trace::replay_checked(&trace, &setup, alloc_trace::Checks::default()).unwrap();
}

#[test]
fn a_reserve_past_8_eib_is_out_of_memory() {
    // A legal trace on an absurd simulated device: nine allocations just under 1 EiB (each a
    // 1 EiB segment). torch's int64 stats cannot count a reserve past i64::MAX bytes, so the
    // eighth and ninth are out of memory and every stat stays exact.
    let mut text = String::from("capacity 18446744073709551615\npad 0\n");
    for i in 0..9 {
        text.push_str(&format!("alloc a{i} 1152921504606846975\n"));
    }
    let trace = alloc_trace::parse_str("huge.trace", &text).unwrap();
    let setup = Setup::from_trace(&trace, alloc_conf::AllocConf::default(), None, None);
    let r = replay(&trace, &setup).unwrap();
    assert_eq!(r.counts.ooms, 2);
    assert_eq!(get(&r, "end", "reserved_bytes.all.current"), 7 << 60);
    assert_eq!(get(&r, "end", "allocated_bytes.large_pool.peak"), 7 << 60);
    assert_eq!(get(&r, "end", "allocation.all.current"), 7);
    assert_eq!(get(&r, "end", "num_ooms"), 2);
}

#[test]
fn expandable_ranges_past_the_address_space_are_out_of_memory_under_check() {
    // Each expandable range is 9/8 of the device: on a 4 EiB device the simulator's 64-bit
    // address space (never reused) holds three such ranges, so the fourth reservation (after
    // three rounds of reserve, then give back) is refused. `--check` judges that out-of-memory
    // as legitimate; on a 2^64-byte device the first range cannot be reserved at all.
    let mut text = String::from(
        "capacity 4611686018427387904
pad 0
",
    );
    text.push_str(
        "set_allocator_settings expandable_segments:True
",
    );
    for i in 0..4 {
        text.push_str(&format!(
            "alloc a{i} 1048576
free a{i}
empty_cache
"
        ));
    }
    let trace = alloc_trace::parse_str("ranges.trace", &text).unwrap();
    let setup = Setup::from_trace(&trace, alloc_conf::AllocConf::default(), None, None);
    let r = alloc_trace::replay_checked(&trace, &setup, alloc_trace::Checks::default()).unwrap();
    assert_eq!(r.counts.ooms, 1);
    let text = text.replace("4611686018427387904", "18446744073709551615");
    let trace = alloc_trace::parse_str("ranges.trace", &text).unwrap();
    let setup = Setup::from_trace(&trace, alloc_conf::AllocConf::default(), None, None);
    let r = alloc_trace::replay_checked(&trace, &setup, alloc_trace::Checks::default()).unwrap();
    assert_eq!(r.counts.ooms, 4);
}

#[test]
fn two_map_calls_of_one_malloc_with_kept_pages_count_twice() {
    // After empty_virt_addr_cache, d's malloc maps a's range and then c's with kept pages and no
    // other device call between the two map calls: torch counts each (num_device_alloc +2),
    // and `--check`'s count of the simulator's map runs must too.
    let text = "capacity 4G\npad 0\nconf expandable_segments:True\nalloc a 20M\nalloc b 20M\n\
                alloc c 20M\nfree a\nfree c\nempty_virt_addr_cache\nfree b\nalloc d 60M\n";
    let trace = alloc_trace::parse_str("kept.trace", text).unwrap();
    let setup = Setup::from_trace(
        &trace,
        alloc_conf::parse(trace.conf.as_deref().unwrap()).conf,
        None,
        None,
    );
    let r = alloc_trace::replay_checked(&trace, &setup, alloc_trace::Checks::default()).unwrap();
    assert_eq!(r.end.stats.num_device_alloc, 5);
    assert_eq!(r.device_mallocs, 5);
}

#[test]
fn a_double_free_in_a_parked_range_is_not_allocated() {
    // The device refuses to release an expandable segment's reserved range at `empty_cache`, so
    // the allocator parks the range for the next try and forgets the segment. A second free of
    // the block that was in it is still inside memory the allocator holds: torch's "not
    // allocated", not "invalid device pointer". The checker asserts the exact error.
    let text = "capacity 1073741824\npad 32\nset_allocator_settings expandable_segments:True\n\
                fault release_address 1 oom\nalloc a4 1 0\nfree a4\nempty_cache\n\
                record_freed a4 0\ndrain\n";
    let trace = alloc_trace::parse_str("parked.trace", text).unwrap();
    let setup = Setup::from_trace(&trace, alloc_conf::AllocConf::default(), None, None);
    let r = alloc_trace::replay_checked(&trace, &setup, alloc_trace::Checks::default()).unwrap();
    assert_eq!((r.counts.faults_fired, r.counts.misuses), (1, 1));
}
