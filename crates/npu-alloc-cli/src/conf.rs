//! `npu-alloc conf`: parse an allocator config string (or the environment) and explain the
//! result, as text or as the JSON object of `docs/alloc-conf.md`.

use crate::say;
use std::ffi::OsString;
use std::process::ExitCode;

use alloc_conf::{AllocConf, Backend, ENV_VARS, Key, Loaded, MIB, Parsed, from_env};
use serde_json::{Map, Value, json};

/// Arguments of `npu-alloc conf`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The config string; without it (or when blank) the first non-blank variable of
    /// MINDTORCH_NPU_ALLOC_CONF, PYTORCH_NPU_ALLOC_CONF, PYTORCH_ALLOC_CONF,
    /// PYTORCH_CUDA_ALLOC_CONF is read.
    #[arg(value_name = "STRING")]
    string: Option<OsString>,
    /// Print the JSON object {source, config, warnings} instead of the explanation.
    #[arg(long)]
    json: bool,
    /// Exit with status 1 when there is any warning (the output is still printed).
    #[arg(long)]
    strict: bool,
}

/// Runs `npu-alloc conf`.
pub(crate) fn run(args: Args) -> ExitCode {
    let explicit = match args.string.map(OsString::into_string) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(raw)) => {
            eprintln!(
                "error: STRING is not valid UTF-8: {}",
                raw.to_string_lossy()
            );
            return ExitCode::from(2);
        }
    };
    // Raw bytes: a variable that is not UTF-8 is still set, and alloc-conf decides about it
    // (its lossy text is parsed, with a `not_utf8` warning) exactly as the runtime's
    // `Config::from_lookup` does.
    let loaded = from_env(explicit.as_deref(), |name| {
        std::env::var_os(name).map(OsString::into_encoded_bytes)
    });
    if args.json {
        say!("{}", render(&to_json(&loaded), 0));
    } else {
        explain(&loaded);
    }
    if args.strict && !loaded.parsed.warnings.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The documented JSON object (docs/alloc-conf.md): `source`, `config` (bytes, nulls for unset) and `warnings`.
fn to_json(loaded: &Loaded) -> Value {
    let c = &loaded.parsed.conf;
    let mut config = Map::new();
    let mut put = |key: &str, value: Value| {
        config.insert(key.to_owned(), value);
    };
    put("max_split_size", json!(c.max_split_size));
    put("max_non_split_rounding", json!(c.max_non_split_rounding));
    put("large_segment_size", json!(c.large_segment_size));
    put(
        "garbage_collection_threshold",
        json!(c.garbage_collection_threshold),
    );
    put("expandable_segments", json!(c.expandable_segments));
    put("base_addr_aligned", json!(c.base_addr_aligned));
    put("page_size", json!(c.page_size));
    put("segment_size", json!(c.segment_size));
    put(
        "roundup_power2_divisions",
        json!(c.roundup_power2_divisions.to_vec()),
    );
    put(
        "per_process_memory_fraction",
        json!(c.per_process_memory_fraction),
    );
    put(
        "release_lock_on_npumalloc",
        json!(c.release_lock_on_npumalloc),
    );
    put(
        "multi_stream_lazy_reclaim",
        json!(c.multi_stream_lazy_reclaim),
    );
    put("throw_on_npumalloc_oom", json!(c.throw_on_npumalloc_oom));
    put(
        "pinned_use_background_threads",
        json!(c.pinned_use_background_threads),
    );
    put(
        "pin_memory_expandable_segments",
        json!(c.pin_memory_expandable_segments),
    );
    put("pinned_mem_register", json!(c.pinned_mem_register));
    put(
        "pinned_num_register_threads",
        json!(c.pinned_num_register_threads),
    );
    put("backend", json!(backend_name(c.backend)));

    let warnings: Vec<Value> = loaded
        .parsed
        .warnings
        .iter()
        .map(|w| json!({"kind": w.kind.name(), "key": w.key, "message": w.message}))
        .collect();
    let mut out = Map::new();
    out.insert(
        "source".into(),
        json!(loaded.source.map(|s| s.name().to_owned())),
    );
    out.insert("config".into(), Value::Object(config));
    out.insert("warnings".into(), Value::Array(warnings));
    Value::Object(out)
}

/// Pretty JSON with arrays of scalars on one line (the 16 roundup buckets stay readable).
fn render(value: &Value, indent: usize) -> String {
    let pad = " ".repeat(indent + 2);
    let close = " ".repeat(indent);
    match value {
        Value::Object(map) if !map.is_empty() => {
            let members: Vec<String> = map
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{pad}{}: {}",
                        Value::from(k.as_str()),
                        render(v, indent + 2)
                    )
                })
                .collect();
            format!("{{\n{}\n{close}}}", members.join(",\n"))
        }
        Value::Array(items) if items.iter().any(|v| v.is_object() || v.is_array()) => {
            let items: Vec<String> = items
                .iter()
                .map(|v| format!("{pad}{}", render(v, indent + 2)))
                .collect();
            format!("[\n{}\n{close}]", items.join(",\n"))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(Value::to_string).collect();
            format!("[{}]", items.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

/// The `backend` value's name.
fn backend_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Native => "native",
    }
}

/// The readable explanation: where the string came from, each key with its value and origin,
/// the canonical string, and every warning.
fn explain(loaded: &Loaded) {
    let parsed = &loaded.parsed;
    let c = &parsed.conf;
    match loaded.source {
        Some(source) => say!("source    {source} = {:?}", loaded.text),
        None => say!(
            "source    none (no argument, and {} are unset or blank): defaults",
            ENV_VARS.join(", ")
        ),
    }
    let from = loaded.source.map_or("default", |s| s.name());
    let rows: Vec<(Key, String, String)> = Key::ALL
        .into_iter()
        .map(|key| (key, value_text(key, c), origin_text(key, parsed, from)))
        .collect();
    let width = rows
        .iter()
        .map(|(_, v, _)| v.len())
        .max()
        .unwrap_or(0)
        .max(5)
        + 2;
    say!();
    say!("{:<32}{:<width$}from", "key", "value");
    for (key, value, origin) in &rows {
        say!("{:<32}{value:<width$}{origin}", key.name());
    }
    let t = &c.roundup_power2_divisions;
    if t.iter().any(|&d| d != t[0]) {
        say!("(roundup buckets: <2 MiB, [2,4) MiB, ..., [16,32) GiB, >=32 GiB)");
    }
    say!();
    let canonical = c.to_string();
    if canonical.is_empty() {
        say!("canonical (all defaults)");
    } else {
        say!("canonical {canonical}");
    }
    say!();
    match parsed.warnings.len() {
        0 => say!("no warnings"),
        n => {
            say!("{n} warning{}:", if n == 1 { "" } else { "s" });
            for w in &parsed.warnings {
                say!("  {w}");
            }
        }
    }
}

/// Where a key's value came from: the source when the string set it, else the default, with a
/// note when another key decided it or a warning concerns it.
fn origin_text(key: Key, parsed: &Parsed, from: &str) -> String {
    let mut origin = if parsed.given(key) {
        from.to_owned()
    } else {
        "default".to_owned()
    };
    match key {
        Key::MaxNonSplitRoundingMb if !parsed.given(key) => {
            origin.push_str(" (= large_segment_size_mb)");
        }
        // An explicit 20 is the default to torch_npu, so segment_size_mb then stays in force.
        Key::SegmentSizeMb
            if parsed.given(Key::LargeSegmentSizeMb)
                && parsed.conf.large_segment_size != 20 * alloc_conf::MIB =>
        {
            origin = format!("{from} (= large_segment_size_mb)");
        }
        _ => {}
    }
    let alias = (key == Key::ReleaseLockOnNpumalloc).then_some("release_lock_on_cudamalloc");
    if parsed
        .warnings
        .iter()
        .any(|w| w.key == key.name() || Some(w.key.as_str()) == alias)
    {
        origin.push_str(", see warnings");
    }
    origin
}

/// A key's value as a person reads it, in the key's unit.
fn value_text(key: Key, c: &AllocConf) -> String {
    let mib = |bytes: u64| format!("{} MiB", bytes / MIB);
    let flag = |on: bool| if on { "True" } else { "False" }.to_owned();
    match key {
        Key::MaxSplitSizeMb => c.max_split_size.map_or("unlimited".to_owned(), mib),
        Key::MaxNonSplitRoundingMb => mib(c.max_non_split_rounding),
        Key::LargeSegmentSizeMb => mib(c.large_segment_size),
        Key::GarbageCollectionThreshold => c
            .garbage_collection_threshold
            .map_or("off".to_owned(), |v| v.to_string()),
        Key::ExpandableSegments => flag(c.expandable_segments),
        Key::BaseAddrAlignedKb => match c.base_addr_aligned {
            512 => "0 (512-byte alignment)".to_owned(),
            b => format!("{} KiB", b / 1024),
        },
        Key::PageSize => match c.page_size {
            Some(_) => "1g (1 GiB large-pool granularity)".to_owned(),
            None => "unset (2 MiB pages)".to_owned(),
        },
        Key::SegmentSizeMb => mib(c.segment_size),
        Key::RoundupPower2Divisions => {
            let t = &c.roundup_power2_divisions;
            if t.iter().all(|&d| d == t[0]) {
                format!("{} in every bucket", t[0])
            } else {
                let list: Vec<String> = t.iter().map(u32::to_string).collect();
                format!("[{}]", list.join(","))
            }
        }
        Key::PerProcessMemoryFraction => c.per_process_memory_fraction.to_string(),
        Key::ReleaseLockOnNpumalloc => flag(c.release_lock_on_npumalloc),
        Key::MultiStreamLazyReclaim => flag(c.multi_stream_lazy_reclaim),
        Key::ThrowOnNpumallocOom => flag(c.throw_on_npumalloc_oom),
        Key::PinnedUseBackgroundThreads => flag(c.pinned_use_background_threads),
        Key::PinMemoryExpandableSegments => flag(c.pin_memory_expandable_segments),
        Key::PinnedMemRegister => flag(c.pinned_mem_register),
        Key::PinnedNumRegisterThreads => c.pinned_num_register_threads.to_string(),
        Key::Backend => backend_name(c.backend).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_of(explicit: Option<&str>, vars: &[(&str, &str)]) -> Value {
        let loaded = from_env(explicit, |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_bytes().to_vec())
        });
        let value = to_json(&loaded);
        // The hand-rendered text is the same JSON.
        let text = render(&value, 0);
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), value);
        value
    }

    #[test]
    fn seed_example_json() {
        let v = json_of(
            Some("max_split_size_mb:32,garbage_collection_threshold:0.6"),
            &[],
        );
        assert_eq!(v["source"], "argument");
        assert_eq!(v["config"]["max_split_size"], 33554432);
        assert_eq!(v["config"]["garbage_collection_threshold"], 0.6);
        assert_eq!(v["config"]["page_size"], Value::Null);
        assert_eq!(
            v["config"]["roundup_power2_divisions"],
            json!([0u32; 16].to_vec())
        );
        assert_eq!(v["config"]["backend"], "native");
        assert_eq!(v["warnings"], json!([]));
        assert_eq!(v["config"].as_object().unwrap().len(), 18);
        assert_eq!(v["config"]["multi_stream_lazy_reclaim"], false);
        assert_eq!(v["config"]["throw_on_npumalloc_oom"], false);
    }

    #[test]
    fn unknown_key_json() {
        let v = json_of(Some("expandable_segments=True,foo:1"), &[]);
        assert_eq!(v["config"]["expandable_segments"], true);
        let w = v["warnings"].as_array().unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0]["kind"], "unknown_key");
        assert_eq!(w[0]["key"], "foo");
    }

    #[test]
    fn environment_json() {
        let vars = [
            ("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True"),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"),
        ];
        let v = json_of(None, &vars);
        assert_eq!(v["source"], "PYTORCH_NPU_ALLOC_CONF");
        assert_eq!(v["config"]["max_split_size"], Value::Null);
        let v = json_of(Some("  "), &[]);
        assert_eq!(v["source"], Value::Null);
        let v = json_of(Some("base_addr_aligned_kb:0,page_size:1g"), &[]);
        assert_eq!(v["config"]["base_addr_aligned"], 512);
        assert_eq!(v["config"]["page_size"], 1u64 << 30);
    }
}
