//! An allocator's state and history as a torch snapshot.

use std::fmt;

use alloc_core::{PoolKind, SegmentInfo, Stream};

use crate::model::{
    Action, AllocatorSettings, Block, BlockState, Frame, Segment, SegmentType, Snapshot, TraceEntry,
};

/// A value the snapshot cannot hold: torch's fields are signed 64-bit integers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportError {
    /// The field.
    pub field: &'static str,
    /// Its value.
    pub value: u64,
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:#x} does not fit in a snapshot's signed 64-bit integer",
            self.field, self.value
        )
    }
}

impl std::error::Error for ExportError {}

fn int(field: &'static str, value: u64) -> Result<i64, ExportError> {
    i64::try_from(value).map_err(|_| ExportError { field, value })
}

/// The frames an entry's context carries: a context that is a `Vec<Frame>` (what a runtime
/// that records stacks attaches); anything else carries none.
fn frames(context: Option<&alloc_core::Context>) -> Vec<Frame> {
    context
        .and_then(|c| c.downcast_ref::<Vec<Frame>>())
        .cloned()
        .unwrap_or_default()
}

impl Snapshot {
    /// An empty snapshot with the settings of `conf`.
    pub fn new(conf: Option<&alloc_conf::AllocConf>) -> Snapshot {
        Snapshot {
            allocator_settings: conf.map(AllocatorSettings::from_conf),
            ..Snapshot::default()
        }
    }

    /// Adds one device: its segments (`Allocator::snapshot()`) and its history, oldest first
    /// (`Allocator::history()`). Streams are written as [`Stream::number`]; a device gets its
    /// own trace list at its index, with empty lists for lower indexes not added yet, since
    /// memory_viz looks a device's trace up by index.
    pub fn add_device<S: Stream>(
        &mut self,
        device: u32,
        segments: &[SegmentInfo<S>],
        history: &[alloc_core::TraceEntry<S>],
    ) -> Result<(), ExportError> {
        let dev = i64::from(device);
        for s in segments {
            self.segments.push(Segment {
                device: dev,
                address: int("segment address", s.address)?,
                total_size: int("segment size", s.total_size)?,
                allocated_size: int("allocated size", s.allocated_size)?,
                active_size: int("active size", s.active_size)?,
                requested_size: int("requested size", s.requested_size)?,
                stream: int("stream", s.stream.number())?,
                segment_type: match s.pool {
                    PoolKind::Small => SegmentType::Small,
                    PoolKind::Large => SegmentType::Large,
                },
                segment_pool_id: (int("pool id", s.pool_id.0)?, int("pool id", s.pool_id.1)?),
                is_expandable: s.is_expandable,
                frames: Vec::new(),
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| {
                        Ok(Block {
                            address: int("block address", b.address)?,
                            size: int("block size", b.size)?,
                            requested_size: int("requested size", b.requested_size)?,
                            state: BlockState::from(b.state),
                            frames: Vec::new(),
                        })
                    })
                    .collect::<Result<_, ExportError>>()?,
            });
        }
        let index = device as usize;
        if self.device_traces.len() <= index {
            self.device_traces.resize_with(index + 1, Vec::new);
        }
        let trace = &mut self.device_traces[index];
        trace.reserve(history.len());
        for e in history {
            let action = Action::from(e.action);
            let (addr, device_free) = if action == Action::Oom {
                (None, Some(int("device free", e.addr)?))
            } else {
                (Some(int("address", e.addr)?), None)
            };
            trace.push(TraceEntry {
                action,
                addr,
                device_free,
                size: int("size", e.size)?,
                stream: match e.stream {
                    Some(s) => int("stream", s.number())?,
                    None => 0,
                },
                pool_id: Some((int("pool id", e.pool_id.0)?, int("pool id", e.pool_id.1)?)),
                time_us: int("time", e.time_us)?,
                compile_context: "N/A".to_owned(),
                user_metadata: String::new(),
                frames: frames(e.context.as_ref()),
            });
        }
        Ok(())
    }
}
