//! Reading a snapshot with Python's own `pickle` module, as PyTorch's tools do, but with a
//! restricted unpickler (any global is refused, so nothing in the file can run code), and
//! checking torch's keys. python3 is required: a test that needs it fails without it.

use std::path::Path;
use std::process::Command;

/// What Python read: per device index, the totals torch's `memory_stats()` would report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyTotals {
    /// `(device, segments, Σ total_size, Σ active_allocated block size)` for each device with
    /// segments, in device order.
    pub devices: Vec<(i64, u64, u64, u64)>,
    /// The length of each device's trace, in device order.
    pub trace_lengths: Vec<u64>,
    /// Actions seen in the traces, sorted, each once.
    pub actions: Vec<String>,
    /// `segment_pool_id` values seen, sorted, each once, as `"(a, b)"` (Python's tuple repr: a
    /// list would print with brackets).
    pub pool_ids: Vec<String>,
}

const SCRIPT: &str = r#"
import pickle, sys
class Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("global %s.%s refused" % (module, name))
with open(sys.argv[1], "rb") as f:
    data = Restricted(f).load()
assert isinstance(data, dict), type(data)
for key in ("segments", "device_traces"):
    assert key in data, key
seg_keys = ["device", "address", "total_size", "allocated_size", "active_size",
            "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable",
            "frames", "blocks"]
block_keys = ["address", "size", "requested_size", "state", "frames"]
entry_keys = ["action", "addr", "size", "stream", "pool_id", "time_us", "compile_context",
              "user_metadata", "frames"]
devices = {}
pools = set()
for s in data["segments"]:
    assert list(s.keys()) == seg_keys, list(s.keys())
    assert s["segment_type"] in ("small", "large")
    assert isinstance(s["segment_pool_id"], tuple) and len(s["segment_pool_id"]) == 2
    pools.add(repr(s["segment_pool_id"]))
    total = 0
    d = devices.setdefault(s["device"], [0, 0, 0])
    d[0] += 1
    d[1] += s["total_size"]
    addr = s["address"]
    for b in s["blocks"]:
        assert list(b.keys()) == block_keys, list(b.keys())
        assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
        assert b["address"] == addr, (b["address"], addr)
        addr += b["size"]
        total += b["size"]
        if b["state"] == "active_allocated":
            d[2] += b["size"]
    assert total == s["total_size"], "blocks do not tile the segment"
actions = set()
for trace in data["device_traces"]:
    last = 0
    for e in trace:
        keys = list(e.keys())
        if e["action"] == "oom":
            keys[1] = "addr" if keys[1] == "device_free" else "missing device_free"
        assert keys == entry_keys, list(e.keys())
        assert e["time_us"] >= last, "time goes backwards"
        last = e["time_us"]
        actions.add(e["action"])
for dev in sorted(devices):
    print("device", dev, *devices[dev])
print("traces", *[len(t) for t in data["device_traces"]])
print("actions", *sorted(actions))
print("pools", *sorted(p.replace(" ", "") for p in pools))
"#;

/// Loads the snapshot at `path` with python3's `pickle` (globals refused) and checks torch's
/// keys, in torch's order, the block tiling and that time never goes backwards.
///
/// # Panics
/// When python3 cannot run or the snapshot fails a check (the message has Python's error).
pub fn read_with_python(path: &Path) -> PyTotals {
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(path)
        .output()
        .expect("python3 runs (it is required on CI)");
    assert!(
        out.status.success(),
        "python3 could not read {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("python3 prints UTF-8");
    let mut totals = PyTotals {
        devices: Vec::new(),
        trace_lengths: Vec::new(),
        actions: Vec::new(),
        pool_ids: Vec::new(),
    };
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let num = |w: &str| w.parse::<u64>().expect("a number");
        match words.next() {
            Some("device") => {
                let v: Vec<&str> = words.collect();
                totals.devices.push((
                    v[0].parse().expect("a device index"),
                    num(v[1]),
                    num(v[2]),
                    num(v[3]),
                ));
            }
            Some("traces") => totals.trace_lengths = words.map(num).collect(),
            Some("actions") => totals.actions = words.map(str::to_owned).collect(),
            Some("pools") => totals.pool_ids = words.map(str::to_owned).collect(),
            _ => panic!("unexpected line from python3: {line}"),
        }
    }
    totals
}
