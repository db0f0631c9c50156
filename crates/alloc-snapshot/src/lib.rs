//! PyTorch memory snapshots for npu-alloc.
//!
//! - [`Snapshot`] is torch's snapshot as data (`segments`, `device_traces`,
//!   `allocator_settings`), with torch's keys in torch's order.
//! - [`Snapshot::add_device`] exports an allocator's segments and history into it.
//! - [`Snapshot::to_pickle`] and [`Snapshot::write`] write the pickle PyTorch's memory_viz and
//!   `torch.cuda._memory_viz` read: protocol 3, plain data only.
//! - [`read`] reads a PyTorch snapshot back, accepting only the opcodes of plain data: a global,
//!   a reduce or anything else that could run code is an error naming its offset, never run.

mod export;
mod model;
mod read;
mod write;

pub use export::ExportError;
pub use model::{
    Action, AllocatorSettings, Block, BlockState, Divisions, Frame, Segment, SegmentType, Snapshot,
    Totals, TraceEntry,
};
pub use read::{Limits, Read, ReadError, ReadWarning, Untiled, read, read_file, read_with};
pub use write::WriteError;
