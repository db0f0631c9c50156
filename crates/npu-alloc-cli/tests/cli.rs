//! The `npu-alloc` binary as users run it: help and exit codes of every subcommand, the README's
//! demo, and a stress failure whose printed trace `replay --check` re-runs to the same failure.

use std::path::PathBuf;
use std::process::{Command, Output};

fn npu_alloc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_npu-alloc"))
        .args(args)
        .output()
        .expect("run npu-alloc")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn shipped(name: &str) -> String {
    format!("{}/{name}", alloc_trace::TRACES_DIR)
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("npu-alloc-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn every_subcommand_has_help_and_malformed_lines_exit_2() {
    for sub in npu_alloc_cli::SUBCOMMANDS {
        let o = npu_alloc(&[sub, "--help"]);
        assert_eq!(o.status.code(), Some(0), "{sub} --help");
        assert!(stdout(&o).contains("Usage: npu-alloc"), "{}", stdout(&o));
        assert!(stdout(&o).contains("Exit codes: 0"), "{}", stdout(&o));
    }
    let o = npu_alloc(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("Exit codes"), "{}", stdout(&o));
    assert_eq!(npu_alloc(&["bogus"]).status.code(), Some(2));
    assert_eq!(npu_alloc(&["replay"]).status.code(), Some(2));
    assert_eq!(
        npu_alloc(&["replay", "x.trace", "--pad", "lots"])
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn the_readme_demo_replays() {
    // MAGMA27's snapshot, imported on the fly, is the same GPT-2 step.
    for input in ["gpt2_step.trace", "magma27_memory_snapshot.pickle"] {
        let o = npu_alloc(&["replay", &shipped(input), "--pad", "0"]);
        assert_eq!(o.status.code(), Some(0), "{input}: {}", stderr(&o));
        assert!(
            stdout(&o).contains("peak reserved       13.12 GiB (14088667136 bytes)"),
            "{input}: {}",
            stdout(&o)
        );
    }
}

#[test]
fn every_command_that_reads_a_snapshot_names_zip_and_gzip_files() {
    let out = temp_file("foreign.trace", "");
    for (name, bytes, what) in [
        ("model.pt", &b"PK\x03\x04rest"[..], "a zip archive"),
        (
            "snap.pickle.gz",
            &b"\x1f\x8b\x08\x00"[..],
            "gzip-compressed",
        ),
    ] {
        let path = temp_file(name, "");
        std::fs::write(&path, bytes).unwrap();
        let path = path.to_str().unwrap();
        for args in [
            &["replay", path][..],
            &["tune", path],
            &["import-snapshot", path, "-o", out.to_str().unwrap()],
        ] {
            let o = npu_alloc(args);
            assert_eq!(o.status.code(), Some(1), "{args:?}");
            assert!(stderr(&o).contains(what), "{args:?}: {}", stderr(&o));
        }
    }
}

#[test]
fn a_malformed_trace_exits_1_with_its_line() {
    let path = temp_file("bad.trace", "alloc a 1\nfree b\n");
    let o = npu_alloc(&["replay", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("bad.trace:2: free of `b`, which was never allocated"),
        "{}",
        stderr(&o)
    );
    let path = temp_file("bogus.trace", "alloc a 1\nbogus\n");
    let o = npu_alloc(&["replay", path.to_str().unwrap(), "--check"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("bogus.trace:2: unknown keyword `bogus`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_stress_failure_prints_a_trace_that_replay_check_reproduces() {
    // The hidden test-only switch breaks a check at the first successful free after a fault
    // fired and a misuse was refused.
    let o = npu_alloc(&[
        "stress",
        "--sabotage",
        "--conf",
        "",
        "--seed",
        "7",
        "--ops",
        "20000",
        "--shrink-secs",
        "20",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(out.contains("sabotaged check"), "{out}");
    let text = &out[out.find("\n# cargo xtask stress").expect(&out) + 1..];
    assert!(text.contains("\nfault "), "{text}");
    let path = temp_file("shrunk.trace", text);
    let path = path.to_str().unwrap();
    let reported = out
        .lines()
        .find_map(|l| l.split("failing at operation ").nth(1))
        .and_then(|rest| rest.split(':').next())
        .expect("the failing operation's index")
        .to_owned();
    let o = npu_alloc(&["replay", path, "--check", "--sabotage"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("sabotaged check"), "{err}");
    assert!(
        err.trim_end().ends_with(&format!("(operation {reported})")),
        "{err}"
    );
    // Without the switch every check passes on the same trace.
    let o = npu_alloc(&["replay", path, "--check"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn conf_and_the_runtime_agree_on_a_variable_that_is_not_utf8() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    let npu = b"max_split_size_mb:64,\xff".to_vec();
    let cuda = b"max_split_size_mb:128".to_vec();
    let o = Command::new(env!("CARGO_BIN_EXE_npu-alloc"))
        .args(["conf", "--json"])
        .env_clear()
        .env("PYTORCH_NPU_ALLOC_CONF", OsString::from_vec(npu.clone()))
        .env("PYTORCH_CUDA_ALLOC_CONF", OsString::from_vec(cuda.clone()))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["source"], "PYTORCH_NPU_ALLOC_CONF");
    assert_eq!(json["config"]["max_split_size"], 64 << 20);
    assert_eq!(json["warnings"][0]["kind"], "not_utf8");
    assert_eq!(json["warnings"][0]["key"], "PYTORCH_NPU_ALLOC_CONF");
    assert!(
        json["warnings"][0]["message"]
            .as_str()
            .unwrap()
            .contains("bytes \\xff at offset 21"),
        "{json}"
    );
    // The runtime reads the same environment the same way.
    let (config, warnings) = npu_runtime::Config::from_lookup(None, |name| match name {
        "PYTORCH_NPU_ALLOC_CONF" => Some(npu.clone()),
        "PYTORCH_CUDA_ALLOC_CONF" => Some(cuda.clone()),
        _ => None,
    });
    assert_eq!(
        config.source.map(|s| s.name()),
        Some("PYTORCH_NPU_ALLOC_CONF")
    );
    assert_eq!(config.alloc.max_split_size, Some(64 << 20));
    assert!(
        warnings[0].to_string().contains("not_utf8"),
        "{}",
        warnings[0]
    );
}

#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    use std::io::Read;
    use std::process::Stdio;

    // Thousands of JSON records, far more than a pipe holds: the writer meets a closed pipe.
    let mut text = String::from("pad 0\nalloc a 1K\n");
    for i in 0..5000 {
        text.push_str(&format!("stats s{i}\n"));
    }
    let path = temp_file("many_stats.trace", &text);
    let mut child = Command::new(env!("CARGO_BIN_EXE_npu-alloc"))
        .args(["replay", path.to_str().unwrap(), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 64];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The read end is dropped here, as `| head -c 64` would.
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    assert!(first.starts_with(b"{\"label\":\"s0\""));
}

#[test]
fn replay_plots_the_curves_of_each_config_into_an_svg() {
    let svg = temp_file("plot.svg", "");
    let o = npu_alloc(&[
        "replay",
        &shipped("split_merge.trace"),
        "--conf",
        "",
        "--conf",
        "max_split_size_mb:20",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Both summaries are printed, one after the other.
    assert_eq!(stdout(&o).matches("peak reserved").count(), 2);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..100]);
    for label in [
        "split_merge.trace: 2 configs",
        "reserved: (defaults)",
        "allocated: max_split_size_mb:20",
        "active: max_split_size_mb:20",
        "operation",
        "MiB",
    ] {
        assert!(text.contains(label), "the SVG lacks {label:?}");
    }
    // Per config, one reserved curve (the widest line) and its legend mark.
    assert_eq!(text.matches(r#"stroke-width="3""#).count(), 2 * 2);
}

#[test]
fn replay_json_with_several_configs_names_each_config() {
    let o = npu_alloc(&[
        "replay",
        &shipped("split_merge.trace"),
        "--json",
        "--conf",
        "",
        "--conf",
        "max_split_size_mb:20",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let confs: Vec<String> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["label"] == "end")
        .map(|v| v["conf"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(confs, ["", "max_split_size_mb:20"]);
    // A snapshot holds one replay's state.
    let o = npu_alloc(&[
        "replay",
        &shipped("split_merge.trace"),
        "--conf",
        "",
        "--conf",
        "max_split_size_mb:20",
        "--snapshot",
        "x.pickle",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn replay_writes_a_snapshot_python_reads_with_the_end_stats() {
    let out = temp_file("replay.pickle", "");
    let o = npu_alloc(&[
        "replay",
        &shipped("record_stream.trace"),
        "--json",
        "--snapshot",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let end: serde_json::Value = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["label"] == "end")
        .unwrap();
    let py = testkit::python_snapshot::read_with_python(&out);
    assert_eq!(
        py.devices,
        [(
            0,
            end["segment.all.current"].as_u64().unwrap(),
            end["reserved_bytes.all.current"].as_u64().unwrap(),
            end["allocated_bytes.all.current"].as_u64().unwrap()
        )]
    );
    assert!(py.actions.contains(&"free_completed".to_owned()));
    assert_eq!(py.trace_lengths.len(), 1);
}

/// memory_viz leaves stream 0 out of trace entries but not out of segments, and then cannot
/// merge an expandable segment's mapped ranges: the simulated streams are written as handles
/// that are never 0 (trace stream n as n + 1), as torch_npu's are.
#[test]
fn replay_snapshots_write_no_null_stream() {
    let trace = temp_file(
        "expandable.trace",
        "conf expandable_segments:True\nalloc a 30M\nalloc b 30M\nalloc c 30M 2\nfree b\nempty_cache\n",
    );
    let out = temp_file("expandable.pickle", "");
    let o = npu_alloc(&[
        "replay",
        trace.to_str().unwrap(),
        "--snapshot",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let read = alloc_snapshot::read_file(&out).unwrap();
    let streams: Vec<i64> = read.snapshot.device_traces[0]
        .iter()
        .map(|e| e.stream)
        .collect();
    assert!(streams.contains(&1) && streams.contains(&3), "{streams:?}");
    assert!(!streams.contains(&0), "{streams:?}");
    let segments: Vec<i64> = read.snapshot.segments.iter().map(|s| s.stream).collect();
    assert!(
        !segments.is_empty() && !segments.contains(&0),
        "{segments:?}"
    );
}

#[test]
fn a_pytorch_snapshot_imports_as_the_shipped_trace_and_replays() {
    let magma = shipped("magma27_memory_snapshot.pickle");
    let out = temp_file("magma.trace", "");
    let o = npu_alloc(&["import-snapshot", &magma, "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("229 prologue allocations, 1721 alloc, 1721 free (0 delayed)"),
        "{}",
        stderr(&o)
    );
    let o = npu_alloc(&["replay", out.to_str().unwrap(), "--pad", "0"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("peak reserved       13.12 GiB (14088667136 bytes)"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("segments now        240"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn import_refuses_a_pickle_that_would_run_code_naming_the_offset() {
    // PROTO 2, GLOBAL os.system, SHORT_BINUNICODE "echo", TUPLE1, REDUCE, STOP.
    let mut bytes = b"\x80\x02cos\nsystem\n".to_vec();
    bytes.extend_from_slice(b"\x8c\x04echo\x85R.");
    let path = temp_file("evil.pickle", "");
    std::fs::write(&path, bytes).unwrap();
    let out = temp_file("evil.trace", "");
    let o = npu_alloc(&[
        "import-snapshot",
        path.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("GLOBAL"), "{}", stderr(&o));
    assert!(stderr(&o).contains("byte 2"), "{}", stderr(&o));
    // A truncated snapshot names where it ends.
    let magma = std::fs::read(shipped("magma27_memory_snapshot.pickle")).unwrap();
    std::fs::write(&path, &magma[..1000]).unwrap();
    let o = npu_alloc(&[
        "import-snapshot",
        path.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("truncated"), "{}", stderr(&o));
    // The trace never overwrites the snapshot.
    std::fs::write(&path, &magma).unwrap();
    let o = npu_alloc(&[
        "import-snapshot",
        path.to_str().unwrap(),
        "-o",
        path.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("would overwrite the snapshot"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&path).unwrap(), magma);
}

#[test]
fn tune_prints_a_recommendation_that_replays_to_its_numbers_and_parses_strictly() {
    let fragment = shipped("fragment.trace");
    let svg = temp_file("tune.svg", "");
    let o = npu_alloc(&[
        "tune",
        &fragment,
        "--evals",
        "500",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("searched    500 configurations"), "{out}");
    assert!(
        out.contains("default   774.00 MiB      2.678     0        3      0  (defaults)"),
        "{out}"
    );
    assert!(
        out.contains("peak reserved 298.00 MiB instead of 774.00 MiB (61.5% less)"),
        "{out}"
    );
    let conf = out
        .lines()
        .find_map(|l| l.strip_prefix("export PYTORCH_NPU_ALLOC_CONF='"))
        .and_then(|l| l.strip_suffix('\''))
        .expect("the line to paste")
        .to_owned();
    let checked = npu_alloc(&["conf", &conf, "--strict"]);
    assert_eq!(checked.status.code(), Some(0), "{}", stdout(&checked));
    let replayed = npu_alloc(&["replay", &fragment, "--conf", &conf]);
    assert!(
        stdout(&replayed).contains("peak reserved       298.00 MiB (312475648 bytes)"),
        "{}",
        stdout(&replayed)
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("fragment.trace: defaults vs recommendation"));
    assert!(svg.contains(&format!("reserved: {conf}")));
    // JSON gives the same as data.
    let o = npu_alloc(&["tune", &fragment, "--evals", "500", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["best"]["conf"], conf.as_str());
    assert_eq!(v["best"]["peak_reserved"], 312_475_648);
    assert_eq!(v["default"]["peak_reserved"], 811_597_824);
    assert_eq!(
        v["export"],
        format!("PYTORCH_NPU_ALLOC_CONF={conf}").as_str()
    );
    assert_eq!(v["evals"], 500);
    // A key tune does not search is a malformed command line, and so are no evaluations, more
    // threads than `--threads` takes and a time limit that is not a positive number.
    for args in [
        ["--keys", "bogus"],
        ["--evals", "0"],
        ["--threads", "0"],
        ["--threads", "5000"],
        ["--max-seconds", "NaN"],
        ["--max-seconds", "-1"],
        ["--max-seconds", "0"],
        ["--capacity", "1M"],
    ] {
        let o = npu_alloc(&["tune", &fragment, args[0], args[1]]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    // A key that cannot act without another one is said so.
    let o = npu_alloc(&[
        "tune",
        &fragment,
        "--keys",
        "segment_size_mb",
        "--evals",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "note: segment_size_mb keeps its default: it acts only with expandable_segments"
        ),
        "{}",
        stderr(&o)
    );
    // When the defaults are best, the JSON names no assignment: the variable stays unset (an
    // empty one counts as set for torch_npu).
    let o = npu_alloc(&[
        "tune",
        &fragment,
        "--keys",
        "page_size",
        "--evals",
        "5",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["best"]["conf"], "");
    assert!(v["export"].is_null(), "{v}");
    // A search cut short by --evals says so.
    let o = npu_alloc(&["tune", &fragment, "--evals", "50", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["budget_spent"], true);
}

/// The line to paste survives a shell: a roundup list's `>` would otherwise redirect. For
/// torch_npu, keys older releases refuse are named.
#[test]
fn tune_quotes_the_export_line_and_names_keys_older_torch_npu_refuses() {
    // A random mix of sizes on a 1 GiB device, whose best roundup is a list.
    let trace = temp_file(
        "roundup.trace",
        "capacity 1G\npad 0\nalloc a0 825344\nalloc a1 295890930\nalloc a2 1055979\n\
         alloc a3 43449692\nalloc a4 39142219\nalloc a5 32668189\nalloc a6 264410076\n\
         alloc a7 4448428\nalloc a8 127096389\nalloc a9 689152\nfree a2\n\
         alloc a11 484352\nfree a8\nfree a0\nalloc a14 852992\nfree a14\nfree a7\n\
         alloc a17 803840\nalloc a18 3327453\nfree a4\nalloc a20 40554622\n\
         alloc a21 273408\nalloc a22 152213696\nfree a17\nalloc a24 979968\n\
         alloc a25 1268541\nalloc a26 883712\nfree a24\nalloc a28 4209141\n\
         alloc a29 4448299\n",
    );
    let dir = trace.parent().unwrap().to_owned();
    let trace = trace.to_str().unwrap();
    let o = npu_alloc(&["tune", trace, "--keys", "roundup_power2_divisions"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let line = stdout(&o)
        .lines()
        .find(|l| l.starts_with("export "))
        .expect("an export line")
        .to_owned();
    assert!(line.contains('['), "{line}");
    let conf = line
        .strip_prefix("export PYTORCH_NPU_ALLOC_CONF='")
        .and_then(|l| l.strip_suffix('\''))
        .expect("quoted");
    let shell = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{line}; printf %s \"$PYTORCH_NPU_ALLOC_CONF\""))
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&shell.stdout), conf);
    let fragment = shipped("fragment.trace");
    let o = npu_alloc(&[
        "tune",
        &fragment,
        "--target",
        "torch_npu",
        "--evals",
        "2000",
    ]);
    assert!(
        stdout(&o)
            .contains("note: torch_npu accepts large_segment_size_mb in v2.11.0-26.1.0 and later"),
        "{}",
        stdout(&o)
    );
    // Nothing to tune: an error.
    let empty = temp_file("empty.trace", "# nothing\n");
    let o = npu_alloc(&["tune", empty.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no allocation to replay"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn tune_reads_a_pytorch_snapshot_and_says_when_nothing_fits() {
    let magma = shipped("magma27_memory_snapshot.pickle");
    let o = npu_alloc(&["tune", &magma, "--pad", "0", "--evals", "40", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["default"]["peak_reserved"], 14_088_667_136u64);
    assert_eq!(v["evals"], 40);
    let o = npu_alloc(&[
        "tune",
        &shipped("fragment.trace"),
        "--capacity",
        "100M",
        "--evals",
        "50",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("no configuration fits in 100.00 MiB"),
        "{}",
        stdout(&o)
    );
}
