//! torch's `_record_memory_history`, `_snapshot` and `_dump_snapshot`: the policy keeps the
//! history (`alloc-core`'s `history`); the runtime gives it a clock, turns it on for every
//! device (those opened later too) and writes the snapshot file.

use core::fmt;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use alloc_core::Device;
use alloc_snapshot::{Snapshot, WriteError};

use crate::api::{Entry, Runtime};
use crate::error::RuntimeError;
use crate::sync::global::OnceLock;

/// Microseconds since the Unix epoch from a monotonic clock: the system time read once, at
/// first use, plus the time elapsed since. Entries never go backwards when the wall clock is
/// set, and memory_viz, which shows `time_us` as a date, shows the right one.
pub(crate) fn now_us() -> u64 {
    static START: OnceLock<(Instant, u64)> = OnceLock::new();
    let (start, epoch) = START.get_or_init(|| {
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        (Instant::now(), epoch)
    });
    epoch + start.elapsed().as_micros() as u64
}

/// Why `dump_snapshot` failed.
#[derive(Debug)]
pub enum DumpError<E> {
    /// Taking the snapshot failed.
    Runtime(RuntimeError<E>),
    /// Writing the file failed.
    Write(WriteError),
}

impl<E> From<RuntimeError<E>> for DumpError<E> {
    fn from(e: RuntimeError<E>) -> Self {
        DumpError::Runtime(e)
    }
}

impl<E> From<WriteError> for DumpError<E> {
    fn from(e: WriteError) -> Self {
        DumpError::Write(e)
    }
}

impl<E: fmt::Display> fmt::Display for DumpError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DumpError::Runtime(e) => e.fmt(f),
            DumpError::Write(e) => e.fmt(f),
        }
    }
}

impl<E: fmt::Debug + fmt::Display + 'static> std::error::Error for DumpError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DumpError::Runtime(e) => Some(e),
            DumpError::Write(e) => Some(e),
        }
    }
}

impl<D> Runtime<D>
where
    D: Device<Stream: Send + Sync, Event: Send, Error: Send> + Send + 'static,
{
    /// torch's `torch.npu.memory._record_memory_history(enabled, max_entries=...)` on every
    /// device, those opened later included: while enabled, each device keeps its last
    /// `max_entries` trace entries (allocations, frees requested and completed, segments
    /// allocated, freed, mapped and unmapped, out-of-memory errors, snapshots), each stamped
    /// with the time in microseconds. Every call forgets what was recorded, enabling again
    /// included, as torch_npu's `recordHistory` clears its buffer. Stack frames are not
    /// recorded: npu-alloc sees no Python stack.
    pub fn record_memory_history(&self, enabled: bool, max_entries: usize) {
        let mut history = self.history.lock();
        *history = enabled.then_some(max_entries);
        for entry in self.opened_all() {
            if let Entry::Caching(a) = entry {
                a.set_history(*history);
            }
        }
    }

    /// torch's `torch.npu.memory._snapshot()`: every opened device's segments and blocks, and
    /// its history when recording, with the allocator settings in force. Each recording device
    /// then gets a `snapshot` entry, after its history was copied (as torch_npu's `snapshot()`
    /// does), so that entry shows in the next snapshot.
    pub fn snapshot(&self) -> Result<Snapshot, RuntimeError<D::Error>> {
        let conf = self.settings.lock().0.clone();
        let mut snapshot = Snapshot::new(Some(&conf));
        for device in 0..self.device_count() {
            match self.opened(device)? {
                Some(Entry::Caching(a)) => a.add_to(&mut snapshot),
                _ => snapshot.add_device::<D::Stream>(device, &[], &[]),
            }
            .map_err(RuntimeError::Snapshot)?;
        }
        Ok(snapshot)
    }

    /// torch's `torch.npu.memory._dump_snapshot(path)`: [`Runtime::snapshot`] written as a
    /// pickle that PyTorch's memory_viz (pytorch.org/memory_viz, `torch.cuda._memory_viz`)
    /// reads.
    pub fn dump_snapshot(&self, path: &Path) -> Result<(), DumpError<D::Error>> {
        Ok(self.snapshot()?.write(path)?)
    }
}
