//! torch's memory snapshot as data: what `torch.cuda.memory._snapshot()` returns and
//! `_dump_snapshot` pickles, with torch's keys in torch's order (`memory_snapshot.cpp`,
//! `_memory_snapshot_pickled`). Every integer is an `i64`, as torch writes them, so that the
//! pickle holds only opcodes PyTorch's memory_viz reads.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

/// A whole snapshot: every device's segments and trace.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Snapshot {
    /// Every segment of every device, each with its blocks.
    pub segments: Vec<Segment>,
    /// One history per device index (an empty list for a device without one).
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// The allocator's settings, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_settings: Option<AllocatorSettings>,
    /// torch's `external_annotations`; npu-alloc records none and the reader ignores them.
    #[serde(serialize_with = "empty_list")]
    pub external_annotations: (),
}

fn empty_list<S: Serializer>(_: &(), s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(core::iter::empty::<i64>())
}

/// One segment (a device allocation, or a mapped range of an expandable segment).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Segment {
    /// The device index.
    pub device: i64,
    /// Its address.
    pub address: i64,
    /// Its size in bytes.
    pub total_size: i64,
    /// Bytes of its `active_allocated` blocks.
    pub allocated_size: i64,
    /// Bytes of its active (allocated or pending-free) blocks.
    pub active_size: i64,
    /// Requested bytes of its active blocks.
    pub requested_size: i64,
    /// The stream it belongs to.
    pub stream: i64,
    /// `small` or `large`.
    pub segment_type: SegmentType,
    /// The private pool it belongs to, `(0, 0)` for the default pools (a 2-tuple, as torch
    /// writes it).
    pub segment_pool_id: (i64, i64),
    /// Whether it is a mapped range of an expandable segment.
    pub is_expandable: bool,
    /// Where it was allocated (npu-alloc records none for segments).
    pub frames: Vec<Frame>,
    /// Its blocks in address order; their sizes add up to `total_size`.
    pub blocks: Vec<Block>,
}

/// The pool a segment belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SegmentType {
    /// The small pool (2 MiB segments).
    Small,
    /// The large pool.
    Large,
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Block {
    /// Its address.
    pub address: i64,
    /// Its size in bytes.
    pub size: i64,
    /// The caller's size while active; npu-alloc writes 0 for an inactive block (torch leaves
    /// the last user's size there).
    pub requested_size: i64,
    /// Its state.
    pub state: BlockState,
    /// Where it was allocated, when recorded.
    pub frames: Vec<Frame>,
}

/// A block's state, with torch's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to a caller.
    ActiveAllocated,
    /// Freed by the caller, waiting on stream events.
    ActivePendingFree,
    /// Free in its pool.
    Inactive,
}

impl From<alloc_core::BlockState> for BlockState {
    fn from(s: alloc_core::BlockState) -> Self {
        match s {
            alloc_core::BlockState::ActiveAllocated => BlockState::ActiveAllocated,
            alloc_core::BlockState::ActivePendingFree => BlockState::ActivePendingFree,
            alloc_core::BlockState::Inactive => BlockState::Inactive,
        }
    }
}

/// One stack frame, as torch records them (`name`, `filename`, `line`). The texts are shared:
/// torch_npu's stacks repeat the same frames thousands of times, and a snapshot read holds each
/// name once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Frame {
    /// The function.
    pub name: Arc<str>,
    /// The file.
    pub filename: Arc<str>,
    /// The line.
    pub line: i64,
}

/// One history entry: torch's `TraceEntry` as a dict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceEntry {
    /// What happened.
    pub action: Action,
    /// The block's or segment's address; absent for `oom`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<i64>,
    /// For `oom` only: the device's free bytes (torch writes it instead of `addr`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<i64>,
    /// Bytes: requested for allocations and frees, the segment's otherwise.
    pub size: i64,
    /// The stream.
    pub stream: i64,
    /// torch_npu's per-entry `pool_id`: the private pool of the block or segment, `(0, 0)` for
    /// the default pools. PyTorch's snapshots have none (`None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_id: Option<(i64, i64)>,
    /// When, in microseconds (the replayer writes the operation's index).
    pub time_us: i64,
    /// torch's compile context; `"N/A"` outside `torch.compile`.
    pub compile_context: String,
    /// torch's user metadata; `""` when none.
    pub user_metadata: String,
    /// Where it happened, when recorded.
    pub frames: Vec<Frame>,
}

/// What a trace entry records, with torch's names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// A block was handed out.
    Alloc,
    /// The caller freed a block.
    FreeRequested,
    /// The block returned to its pool.
    FreeCompleted,
    /// A device segment was allocated.
    SegmentAlloc,
    /// A device segment was freed.
    SegmentFree,
    /// Pages of an expandable segment were mapped.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// A request ran out of memory.
    Oom,
    /// A snapshot was taken.
    Snapshot,
    /// torch_npu: a block of its workspace allocator (`NPUWorkspaceAllocator`, memory it takes
    /// from the device outside the caching allocator) held when the snapshot was taken. Each
    /// comes first in the device's trace, followed by a `segment_alloc` and an `alloc` of the
    /// same block made up by the snapshot, not by the history.
    WorkspaceSnapshot,
    /// A user annotation (`torch.cuda.memory._record_memory_history` annotations).
    Annotate,
    /// An action this version does not know; kept by the reader, skipped by the importer.
    Other(String),
}

impl Action {
    /// torch's string.
    pub fn name(&self) -> &str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
            Action::WorkspaceSnapshot => "workspace_snapshot",
            Action::Annotate => "annotate",
            Action::Other(s) => s,
        }
    }

    /// The action torch calls `name`; an unknown name is [`Action::Other`].
    pub fn from_name(name: &str) -> Action {
        match name {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            "snapshot" => Action::Snapshot,
            "workspace_snapshot" => Action::WorkspaceSnapshot,
            "annotate" => Action::Annotate,
            other => Action::Other(other.to_owned()),
        }
    }
}

impl From<alloc_core::Action> for Action {
    fn from(a: alloc_core::Action) -> Self {
        Action::from_name(a.name())
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Action {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The allocator's settings, as torch's snapshot reports them (`allocator_settings`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllocatorSettings {
    /// The configuration string (torch writes `PYTORCH_CUDA_ALLOC_CONF`; the reader accepts
    /// either key).
    #[serde(rename = "PYTORCH_NPU_ALLOC_CONF")]
    pub alloc_conf: String,
    /// `max_split_size` in bytes, -1 for unlimited.
    pub max_split_size: i64,
    /// The GC threshold, 0.0 when off.
    pub garbage_collection_threshold: f64,
    /// Whether expandable segments were asked for.
    pub expandable_segments: bool,
    /// torch_npu's `release_lock_on_npumalloc`.
    pub release_lock_on_npumalloc: bool,
    /// Divisions per power-of-two size bucket, keyed by the bucket's size in MiB as a string
    /// (`"1"`, `"2"`, … `"32768"`), as torch writes them.
    pub roundup_power2_divisions: Divisions,
}

/// `roundup_power2_divisions`: a dict from the bucket's size in MiB (a string) to its
/// divisions, in bucket order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Divisions(pub Vec<(String, i64)>);

impl Serialize for Divisions {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl AllocatorSettings {
    /// The settings of a configuration, as torch reports its own.
    pub fn from_conf(conf: &alloc_conf::AllocConf) -> AllocatorSettings {
        let divisions = conf
            .roundup_power2_divisions
            .iter()
            .enumerate()
            .map(|(i, &d)| ((1u64 << i).to_string(), i64::from(d)))
            .collect();
        AllocatorSettings {
            alloc_conf: conf.to_string(),
            max_split_size: conf
                .max_split_size
                .and_then(|s| i64::try_from(s).ok())
                .unwrap_or(-1),
            garbage_collection_threshold: conf.garbage_collection_threshold.unwrap_or(0.0),
            expandable_segments: conf.expandable_segments,
            release_lock_on_npumalloc: conf.release_lock_on_npumalloc,
            roundup_power2_divisions: Divisions(divisions),
        }
    }
}

/// Totals over a snapshot's segments and traces, the figures `memory_stats()` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    /// Segments.
    pub segments: u64,
    /// Σ `total_size`: torch's `reserved_bytes`.
    pub reserved: u64,
    /// Σ size of `active_allocated` blocks: torch's `allocated_bytes`.
    pub allocated: u64,
    /// Σ size of active blocks (allocated or pending free): torch's `active_bytes`.
    pub active: u64,
    /// Blocks in each state: `active_allocated`, `active_pending_free`, `inactive`.
    pub blocks: [u64; 3],
    /// Segments of the large pool.
    pub large_segments: u64,
    /// Trace entries of every device.
    pub entries: u64,
}

impl Snapshot {
    /// Totals over every device. A negative size (a malformed snapshot) counts as 0, and the
    /// sums stop at `u64::MAX`.
    pub fn totals(&self) -> Totals {
        let bytes = |size: i64| u64::try_from(size).unwrap_or(0);
        let mut t = Totals::default();
        for seg in &self.segments {
            t.segments += 1;
            t.reserved = t.reserved.saturating_add(bytes(seg.total_size));
            t.large_segments += u64::from(seg.segment_type == SegmentType::Large);
            for b in &seg.blocks {
                let size = bytes(b.size);
                match b.state {
                    BlockState::ActiveAllocated => {
                        t.blocks[0] += 1;
                        t.allocated = t.allocated.saturating_add(size);
                        t.active = t.active.saturating_add(size);
                    }
                    BlockState::ActivePendingFree => {
                        t.blocks[1] += 1;
                        t.active = t.active.saturating_add(size);
                    }
                    BlockState::Inactive => t.blocks[2] += 1,
                }
            }
        }
        t.entries = self.device_traces.iter().map(|d| d.len() as u64).sum();
        t
    }

    /// How many entries of every device have `action`.
    pub fn count(&self, action: &Action) -> usize {
        self.device_traces
            .iter()
            .flatten()
            .filter(|e| &e.action == action)
            .count()
    }
}
