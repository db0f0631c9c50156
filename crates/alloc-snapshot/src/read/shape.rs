//! Stage 2: the pickled value to a [`Snapshot`], by the keys torch writes
//! (`_memory_snapshot_pickled` in torch's `memory_snapshot.cpp`).
//!
//! The walk descends only where the format has something (top level, segments, blocks,
//! frames; device traces, entries, frames; allocator settings), so its depth is fixed whatever
//! the input nests. A shared object is walked at each of its references, which is why the walk
//! is metered ([`Budget`]). Extra keys are ignored; a missing key takes torch's default where
//! it has one.
//!
//! Output vectors grow as items convert instead of being sized by the input's list lengths: a
//! list of a million references to one bad dict costs a few bytes of input each, and must fail
//! at the first without first reserving a million segments.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use super::Read;
use super::error::{ReadError, ReadWarning, Untiled};
use super::value::{Doc, Value};
use crate::model::{
    Action, AllocatorSettings, Block, BlockState, Divisions, Frame, Segment, SegmentType, Snapshot,
    TraceEntry,
};

/// How much stage 2 may decode (see [`Limits`](super::Limits)).
pub(super) struct Budget {
    /// Values visited: a container is one plus its length, at each reference.
    pub(super) values: u64,
    /// Bytes of text copied into the snapshot.
    pub(super) text: u64,
}

/// Reads the snapshot out of the pickle's value.
pub(super) fn snapshot(doc: &Doc, root: Value, budget: Budget) -> Result<Read, ReadError> {
    let mut w = Walk {
        doc,
        budget,
        values: 0,
        text: 0,
        warnings: Vec::new(),
        unknown: HashMap::new(),
        shared: HashMap::new(),
    };
    let top = Path::Root;
    let snapshot = match root {
        Value::Dict(_) => {
            let d = w.dict(root, &top)?;
            let segments = w.required(&d, &top, "segments", "a list")?;
            let segments = w.segments(segments, &top.field("segments"))?;
            let device_traces = match d.get("device_traces") {
                Some(v) => w.device_traces(v, &top.field("device_traces"))?,
                None => Vec::new(),
            };
            let allocator_settings = match d.get("allocator_settings") {
                Some(v) => Some(w.settings(v, &top.field("allocator_settings"))?),
                None => None,
            };
            Snapshot {
                segments,
                device_traces,
                allocator_settings,
                external_annotations: (),
            }
        }
        // torch's older `memory_snapshot()`: the segment list alone.
        Value::List(_) => Snapshot {
            segments: w.segments(root, &top)?,
            ..Snapshot::default()
        },
        _ => return Err(mismatch(&top, "a dict (or a list of segments)", Some(root))),
    };
    Ok(Read {
        snapshot,
        warnings: w.warnings,
    })
}

/// Where a value is, built on the stack as the walk descends and only formatted for an error.
#[derive(Clone, Copy)]
enum Path<'p> {
    Root,
    /// A key the format names: `.name`.
    Field(&'p Path<'p>, &'static str),
    /// A key from the data: `["key"]`.
    Key(&'p Path<'p>, &'p str),
    /// An item: `[3]`.
    Index(&'p Path<'p>, usize),
}

impl<'p> Path<'p> {
    fn field(&'p self, name: &'static str) -> Path<'p> {
        Path::Field(self, name)
    }

    fn index(&'p self, i: usize) -> Path<'p> {
        Path::Index(self, i)
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Path::Root => Ok(()),
            Path::Field(Path::Root, name) => f.write_str(name),
            Path::Field(parent, name) => write!(f, "{parent}.{name}"),
            Path::Key(parent, key) => write!(f, "{parent}[{key:?}]"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// How `segment`'s blocks fail to tile it, if they do.
fn untiled(segment: &Segment) -> Option<Untiled> {
    let mut end = segment.address;
    for (block, b) in segment.blocks.iter().enumerate() {
        if b.address != end {
            return Some(Untiled::Misplaced {
                block,
                address: b.address,
                expected: end,
            });
        }
        end = match b.address.checked_add(b.size) {
            Some(e) if b.size >= 0 => e,
            _ => return Some(Untiled::BadSize { block }),
        };
    }
    let blocks = end.saturating_sub(segment.address);
    (blocks != segment.total_size).then_some(Untiled::Total {
        blocks,
        total_size: segment.total_size,
    })
}

/// `found` is `None` for a missing key.
fn mismatch(path: &Path<'_>, expected: &'static str, found: Option<Value>) -> ReadError {
    ReadError::Shape {
        path: path.to_string(),
        expected,
        found: found.map_or("nothing", Value::kind),
    }
}

/// A dict's items, looked up by string key; the last of a repeated key wins, as in Python.
struct Dict<'d> {
    doc: &'d Doc,
    items: &'d [(Value, Value)],
}

impl Dict<'_> {
    fn get(&self, key: &str) -> Option<Value> {
        self.items
            .iter()
            .rev()
            .find(|&&(k, _)| self.doc.str(k) == Some(key))
            .map(|&(_, v)| v)
    }
}

struct Walk<'d> {
    doc: &'d Doc,
    budget: Budget,
    /// Values visited so far.
    values: u64,
    /// Bytes of text copied so far.
    text: u64,
    warnings: Vec<ReadWarning>,
    /// Unknown action name → its warning in `warnings`.
    unknown: HashMap<&'d str, usize>,
    /// Strings read as shared text, by their index in the pickle: a string the pickle shares
    /// (a memo reference) is copied, and counted against the text budget, once.
    shared: HashMap<usize, Arc<str>>,
}

/// A scalar field's conversion from a [`Value`]: `None` when it is something else.
trait Scalar: Sized {
    /// What the format has there, for an error.
    const EXPECTED: &'static str;
    fn convert(w: &mut Walk<'_>, v: Value) -> Result<Option<Self>, ReadError>;
}

impl Scalar for i64 {
    const EXPECTED: &'static str = "an integer";
    // A bool is not an integer here, though Python's `bool` is an `int`.
    fn convert(_: &mut Walk<'_>, v: Value) -> Result<Option<i64>, ReadError> {
        Ok(match v {
            Value::Int(i) => Some(i),
            _ => None,
        })
    }
}

impl Scalar for bool {
    const EXPECTED: &'static str = "a bool";
    fn convert(_: &mut Walk<'_>, v: Value) -> Result<Option<bool>, ReadError> {
        Ok(match v {
            Value::Bool(b) => Some(b),
            _ => None,
        })
    }
}

impl Scalar for f64 {
    const EXPECTED: &'static str = "a number";
    fn convert(_: &mut Walk<'_>, v: Value) -> Result<Option<f64>, ReadError> {
        Ok(match v {
            Value::Float(x) => Some(x),
            Value::Int(i) => Some(i as f64),
            _ => None,
        })
    }
}

impl Scalar for String {
    const EXPECTED: &'static str = "a string";
    fn convert(w: &mut Walk<'_>, v: Value) -> Result<Option<String>, ReadError> {
        let Some(s) = w.doc.str(v) else {
            return Ok(None);
        };
        w.copy(s.len())?;
        Ok(Some(s.to_owned()))
    }
}

impl Scalar for Arc<str> {
    const EXPECTED: &'static str = "a string";
    fn convert(w: &mut Walk<'_>, v: Value) -> Result<Option<Arc<str>>, ReadError> {
        let Value::Str(i) = v else {
            return Ok(None);
        };
        if let Some(s) = w.shared.get(&i) {
            return Ok(Some(s.clone()));
        }
        let Some(s) = w.doc.str(v) else {
            return Ok(None);
        };
        w.copy(s.len())?;
        let s: Arc<str> = s.into();
        w.shared.insert(i, s.clone());
        Ok(Some(s))
    }
}

impl<'d> Walk<'d> {
    /// Counts `n` values against the budget.
    fn visit(&mut self, n: usize) -> Result<(), ReadError> {
        self.values = self.values.saturating_add(n as u64);
        if self.values > self.budget.values {
            return Err(ReadError::TooLarge {
                what: "values decoded (shared objects count at each reference)",
                limit: self.budget.values,
            });
        }
        Ok(())
    }

    /// Counts `n` bytes of text against the budget.
    fn copy(&mut self, n: usize) -> Result<(), ReadError> {
        self.text = self.text.saturating_add(n as u64);
        if self.text > self.budget.text {
            return Err(ReadError::TooLarge {
                what: "bytes of text decoded (a shared string counts once)",
                limit: self.budget.text,
            });
        }
        Ok(())
    }

    fn dict(&mut self, v: Value, path: &Path<'_>) -> Result<Dict<'d>, ReadError> {
        let doc = self.doc;
        let items = doc
            .dict(v)
            .ok_or_else(|| mismatch(path, "a dict", Some(v)))?;
        self.visit(1 + items.len())?;
        Ok(Dict { doc, items })
    }

    /// A list's items (a tuple is accepted too).
    fn seq(&mut self, v: Value, path: &Path<'_>) -> Result<&'d [Value], ReadError> {
        let items = self
            .doc
            .seq(v)
            .ok_or_else(|| mismatch(path, "a list", Some(v)))?;
        self.visit(1 + items.len())?;
        Ok(items)
    }

    fn scalar<T: Scalar>(&mut self, v: Value, path: &Path<'_>) -> Result<T, ReadError> {
        T::convert(self, v)?.ok_or_else(|| mismatch(path, T::EXPECTED, Some(v)))
    }

    /// A key that must be there.
    fn required(
        &self,
        d: &Dict<'d>,
        path: &Path<'_>,
        key: &'static str,
        expected: &'static str,
    ) -> Result<Value, ReadError> {
        d.get(key)
            .ok_or_else(|| mismatch(&path.field(key), expected, None))
    }

    fn req<T: Scalar>(
        &mut self,
        d: &Dict<'d>,
        path: &Path<'_>,
        key: &'static str,
    ) -> Result<T, ReadError> {
        let v = self.required(d, path, key, T::EXPECTED)?;
        self.scalar(v, &path.field(key))
    }

    fn opt<T: Scalar>(
        &mut self,
        d: &Dict<'d>,
        path: &Path<'_>,
        key: &'static str,
    ) -> Result<Option<T>, ReadError> {
        d.get(key)
            .map(|v| self.scalar(v, &path.field(key)))
            .transpose()
    }

    fn segments(&mut self, v: Value, path: &Path<'_>) -> Result<Vec<Segment>, ReadError> {
        let items = self.seq(v, path)?;
        let mut segments = Vec::new();
        for (i, &s) in items.iter().enumerate() {
            let segment = self.segment(s, &path.index(i))?;
            if let Some(how) = untiled(&segment) {
                self.untiled(i, how);
            }
            segments.push(segment);
        }
        Ok(segments)
    }

    fn untiled(&mut self, segment: usize, how: Untiled) {
        for w in &mut self.warnings {
            if let ReadWarning::Untiled { count, .. } = w {
                *count += 1;
                return;
            }
        }
        self.warnings.push(ReadWarning::Untiled {
            segment,
            how,
            count: 1,
        });
    }

    fn segment(&mut self, v: Value, path: &Path<'_>) -> Result<Segment, ReadError> {
        let d = self.dict(v, path)?;
        // torch's key order, so that the first error is the first bad key in the file.
        let device = self.opt(&d, path, "device")?.unwrap_or(0);
        let address: i64 = self.req(&d, path, "address")?;
        let total_size = self.req(&d, path, "total_size")?;
        let allocated_size = self.opt(&d, path, "allocated_size")?;
        let active_size = self.opt(&d, path, "active_size")?;
        let requested_size = self.opt(&d, path, "requested_size")?;
        let stream = self.req(&d, path, "stream")?;
        let segment_type = match d.get("segment_type") {
            Some(t) => self.segment_type(t, &path.field("segment_type"))?,
            None => SegmentType::Large,
        };
        let segment_pool_id = match d.get("segment_pool_id") {
            Some(p) => self.pool_id(p, &path.field("segment_pool_id"))?,
            None => (0, 0),
        };
        let is_expandable = self.opt(&d, path, "is_expandable")?.unwrap_or(false);
        let frames = self.opt_frames(&d, path)?;

        let blocks_path = path.field("blocks");
        let items = self.seq(self.required(&d, path, "blocks", "a list")?, &blocks_path)?;
        let mut blocks: Vec<Block> = Vec::new();
        // memory_viz places a block without an address right after the previous one.
        let mut next = address;
        for (i, &b) in items.iter().enumerate() {
            let block = self.block(b, &blocks_path.index(i), next)?;
            next = next.saturating_add(block.size);
            blocks.push(block);
        }
        let sum = |keep: fn(BlockState) -> bool, size: fn(&Block) -> i64| {
            blocks
                .iter()
                .filter(|b| keep(b.state))
                .fold(0i64, |sum, b| sum.saturating_add(size(b)))
        };
        let active = |s| s != BlockState::Inactive;
        Ok(Segment {
            device,
            address,
            total_size,
            allocated_size: allocated_size
                .unwrap_or_else(|| sum(|s| s == BlockState::ActiveAllocated, |b| b.size)),
            active_size: active_size.unwrap_or_else(|| sum(active, |b| b.size)),
            requested_size: requested_size.unwrap_or_else(|| sum(active, |b| b.requested_size)),
            stream,
            segment_type,
            segment_pool_id,
            is_expandable,
            frames,
            blocks,
        })
    }

    fn segment_type(&mut self, v: Value, path: &Path<'_>) -> Result<SegmentType, ReadError> {
        match self.doc.str(v) {
            Some("large") => Ok(SegmentType::Large),
            Some("small") => Ok(SegmentType::Small),
            Some(_) => Err(mismatch_str(path, "a segment type (small or large)")),
            None => Err(mismatch(path, "a segment type (small or large)", Some(v))),
        }
    }

    /// A 2-tuple (or 2-list) of integers.
    fn pool_id(&mut self, v: Value, path: &Path<'_>) -> Result<(i64, i64), ReadError> {
        let expected = "a pair of integers";
        match *self
            .doc
            .seq(v)
            .ok_or_else(|| mismatch(path, expected, Some(v)))?
        {
            [a, b] => {
                self.visit(3)?;
                Ok((
                    self.scalar(a, &path.index(0))?,
                    self.scalar(b, &path.index(1))?,
                ))
            }
            _ => Err(mismatch(path, expected, Some(v))),
        }
    }

    fn block(&mut self, v: Value, path: &Path<'_>, at: i64) -> Result<Block, ReadError> {
        let d = self.dict(v, path)?;
        let address = self.opt(&d, path, "address")?.unwrap_or(at);
        let size = self.req(&d, path, "size")?;
        let requested_size = self.opt(&d, path, "requested_size")?;
        let state_path = path.field("state");
        let expected = "a block state";
        let state = match d.get("state") {
            Some(s) => match self.doc.str(s) {
                Some("active_allocated") => BlockState::ActiveAllocated,
                Some("active_pending_free") => BlockState::ActivePendingFree,
                Some("inactive") => BlockState::Inactive,
                Some(_) => return Err(mismatch_str(&state_path, expected)),
                None => return Err(mismatch(&state_path, expected, Some(s))),
            },
            None => return Err(mismatch(&state_path, expected, None)),
        };
        let frames = self.opt_frames(&d, path)?;
        Ok(Block {
            address,
            size,
            // torch leaves the last user's size on an inactive block: what the file says stays.
            requested_size: requested_size.unwrap_or(if state == BlockState::Inactive {
                0
            } else {
                size
            }),
            state,
            frames,
        })
    }

    /// The `frames` key of `d`, empty when missing.
    fn opt_frames(&mut self, d: &Dict<'d>, path: &Path<'_>) -> Result<Vec<Frame>, ReadError> {
        let Some(v) = d.get("frames") else {
            return Ok(Vec::new());
        };
        let path = path.field("frames");
        let items = self.seq(v, &path)?;
        let mut frames = Vec::new();
        for (i, &f) in items.iter().enumerate() {
            let path = path.index(i);
            let d = self.dict(f, &path)?;
            frames.push(Frame {
                name: self.opt(&d, &path, "name")?.unwrap_or_else(|| "".into()),
                filename: self
                    .opt(&d, &path, "filename")?
                    .unwrap_or_else(|| "".into()),
                line: self.opt(&d, &path, "line")?.unwrap_or(0),
            });
        }
        Ok(frames)
    }

    fn device_traces(
        &mut self,
        v: Value,
        path: &Path<'_>,
    ) -> Result<Vec<Vec<TraceEntry>>, ReadError> {
        let devices = self.seq(v, path)?;
        let mut traces = Vec::new();
        for (device, &t) in devices.iter().enumerate() {
            let path = path.index(device);
            let entries = self.seq(t, &path)?;
            let mut trace = Vec::new();
            for (index, &e) in entries.iter().enumerate() {
                trace.push(self.entry(e, &path.index(index), device, index)?);
            }
            traces.push(trace);
        }
        Ok(traces)
    }

    fn entry(
        &mut self,
        v: Value,
        path: &Path<'_>,
        device: usize,
        index: usize,
    ) -> Result<TraceEntry, ReadError> {
        let d = self.dict(v, path)?;
        let action_path = path.field("action");
        let name = self.required(&d, path, "action", "a string")?;
        let name = match self.doc.str(name) {
            Some(s) => s,
            None => return Err(mismatch(&action_path, "a string", Some(name))),
        };
        let action = Action::from_name(name);
        if let Action::Other(_) = action {
            self.copy(name.len())?;
            self.unknown_action(device, index, name);
        }
        // torch writes `device_free` instead of `addr` for an oom.
        let addr = self.opt(&d, path, "addr")?;
        let device_free = self.opt(&d, path, "device_free")?;
        if addr.is_none() && action != Action::Oom {
            return Err(mismatch(&path.field("addr"), "an integer", None));
        }
        let size = self.req(&d, path, "size")?;
        let stream = self.opt(&d, path, "stream")?.unwrap_or(0);
        let pool_id = match d.get("pool_id") {
            Some(p) => Some(self.pool_id(p, &path.field("pool_id"))?),
            None => None,
        };
        let time_us = self.opt(&d, path, "time_us")?.unwrap_or(0);
        let compile_context = self
            .opt(&d, path, "compile_context")?
            .unwrap_or_else(|| "N/A".to_owned());
        // Newer torch may put other objects here: only a string is kept.
        let user_metadata = match d.get("user_metadata") {
            Some(m @ Value::Str(_)) => self.scalar(m, &path.field("user_metadata"))?,
            _ => String::new(),
        };
        let frames = self.opt_frames(&d, path)?;
        Ok(TraceEntry {
            action,
            addr,
            device_free,
            size,
            stream,
            pool_id,
            time_us,
            compile_context,
            user_metadata,
            frames,
        })
    }

    fn unknown_action(&mut self, device: usize, index: usize, name: &'d str) {
        match self.unknown.get(name) {
            Some(&w) => {
                if let Some(ReadWarning::UnknownAction { count, .. }) = self.warnings.get_mut(w) {
                    *count += 1;
                }
            }
            None => {
                self.unknown.insert(name, self.warnings.len());
                self.warnings.push(ReadWarning::UnknownAction {
                    device,
                    index,
                    action: name.to_owned(),
                    count: 1,
                });
            }
        }
    }

    fn settings(&mut self, v: Value, path: &Path<'_>) -> Result<AllocatorSettings, ReadError> {
        let d = self.dict(v, path)?;
        let either = |a: &'static str, b: &'static str| if d.get(a).is_some() { a } else { b };
        let conf_key = either("PYTORCH_NPU_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF");
        let lock_key = either("release_lock_on_npumalloc", "release_lock_on_cudamalloc");
        Ok(AllocatorSettings {
            alloc_conf: self.opt(&d, path, conf_key)?.unwrap_or_default(),
            max_split_size: self.opt(&d, path, "max_split_size")?.unwrap_or(-1),
            garbage_collection_threshold: self
                .opt(&d, path, "garbage_collection_threshold")?
                .unwrap_or(0.0),
            expandable_segments: self.opt(&d, path, "expandable_segments")?.unwrap_or(false),
            release_lock_on_npumalloc: self.opt(&d, path, lock_key)?.unwrap_or(false),
            roundup_power2_divisions: match d.get("roundup_power2_divisions") {
                Some(v) => self.divisions(v, &path.field("roundup_power2_divisions"))?,
                None => Divisions::default(),
            },
        })
    }

    /// A dict of strings to integers, in the file's order (a repeated key keeps its first
    /// place and its last value, as a Python dict).
    fn divisions(&mut self, v: Value, path: &Path<'_>) -> Result<Divisions, ReadError> {
        let d = self.dict(v, path)?;
        let mut out: Vec<(String, i64)> = Vec::new();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for &(k, v) in d.items {
            let Some(key) = self.doc.str(k) else {
                return Err(mismatch(path, "a dict with string keys", Some(k)));
            };
            let n: i64 = self.scalar(v, &Path::Key(path, key))?;
            match seen.get(key) {
                Some(&i) => out[i].1 = n,
                None => {
                    self.copy(key.len())?;
                    seen.insert(key, out.len());
                    out.push((key.to_owned(), n));
                }
            }
        }
        Ok(Divisions(out))
    }
}

/// A string where the format has one of a few names.
fn mismatch_str(path: &Path<'_>, expected: &'static str) -> ReadError {
    ReadError::Shape {
        path: path.to_string(),
        expected,
        found: "another string",
    }
}
