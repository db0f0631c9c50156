//! Embedding `alloc-core` in another runtime: torch's caching policy over a device that is not an
//! Ascend NPU. Here the "device" hands out host memory and has host-side streams whose work
//! completes when the program says so; a real runtime would call its driver instead.
//!
//! `cargo run -p alloc-core --example host_device` prints what happens; `cargo test` runs the
//! checks at the bottom (the example is built with `test = true`).

use std::collections::BTreeMap;
use std::fmt;

use alloc_core::{AllocConf, Allocator, Device, DeviceError, DeviceFacts, MemInfo, Stream};

/// A stream of the host device: an index into its work queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostStream(pub u32);

impl Stream for HostStream {
    fn number(self) -> u64 {
        u64::from(self.0)
    }
}

/// A point on a stream: done once the stream has finished `ticket` units of work.
#[derive(Debug)]
pub struct HostEvent {
    stream: HostStream,
    ticket: u64,
}

/// What can go wrong on the host device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostError {
    /// `free` of something that is not a live segment.
    UnknownSegment(u64),
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::UnknownSegment(addr) => write!(f, "{addr:#x} is not a segment"),
        }
    }
}

/// Host memory as a device: each segment is a real heap buffer; the address handed to the
/// policy is its 512-aligned start (the policy never dereferences it).
pub struct HostDevice {
    capacity: u64,
    used: u64,
    segments: BTreeMap<u64, Vec<u8>>,
    /// Per stream: (work queued, work finished).
    queues: BTreeMap<HostStream, (u64, u64)>,
}

impl HostDevice {
    /// A device that hands out at most `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        HostDevice {
            capacity,
            used: 0,
            segments: BTreeMap::new(),
            queues: BTreeMap::new(),
        }
    }

    /// Queues one unit of work on `stream` (a kernel that uses some memory).
    pub fn launch(&mut self, stream: HostStream) {
        self.queues.entry(stream).or_default().0 += 1;
    }

    /// Everything queued on every stream so far finishes.
    pub fn finish_all(&mut self) {
        for (queued, done) in self.queues.values_mut() {
            *done = *queued;
        }
    }
}

impl Device for HostDevice {
    type Stream = HostStream;
    type Event = HostEvent;
    type Error = HostError;
    // Host memory has no virtual-memory calls here: expandable segments fall back to plain ones.
    type Page = core::convert::Infallible;
    type HostBuffer = core::convert::Infallible;

    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError<HostError>> {
        if self.used + bytes > self.capacity {
            return Err(DeviceError::OutOfMemory);
        }
        let buffer = vec![0u8; bytes as usize + 511];
        let start = buffer.as_ptr() as u64;
        let addr = start.next_multiple_of(512);
        self.segments.insert(addr, buffer);
        self.used += bytes;
        Ok(addr)
    }

    fn free(&mut self, addr: u64, bytes: u64) -> Result<(), HostError> {
        self.segments
            .remove(&addr)
            .ok_or(HostError::UnknownSegment(addr))?;
        self.used -= bytes;
        Ok(())
    }

    fn mem_info(&mut self) -> Result<MemInfo, HostError> {
        Ok(MemInfo {
            free: self.capacity - self.used,
            total: self.capacity,
        })
    }

    fn record_event(&mut self, stream: HostStream) -> Result<HostEvent, HostError> {
        let ticket = self.queues.get(&stream).map_or(0, |q| q.0);
        Ok(HostEvent { stream, ticket })
    }

    fn event_done(&mut self, event: &HostEvent) -> Result<bool, HostError> {
        Ok(self
            .queues
            .get(&event.stream)
            .is_none_or(|q| q.1 >= event.ticket))
    }

    fn release_event(&mut self, _event: HostEvent) {}

    fn synchronize(&mut self) -> Result<(), HostError> {
        self.finish_all();
        Ok(())
    }
}

const MIB: u64 = 1 << 20;
const COMPUTE: HostStream = HostStream(0);
const COPY: HostStream = HostStream(1);

/// A small session on a 64 MiB host device, returning the allocator to look at.
fn session() -> Allocator<HostDevice> {
    // CUDA parity: no pad, PyTorch's rounding; `DeviceFacts::npu` would add torch_npu's 32 bytes.
    let mut alloc = Allocator::new(
        HostDevice::new(64 * MIB),
        &AllocConf::default(),
        DeviceFacts::cuda_parity(0),
    );
    // Two activations: 3 MiB needs a 20 MiB large-pool segment, 4 KiB a 2 MiB small one.
    let x = alloc.malloc(3 * MIB, COMPUTE).unwrap();
    let y = alloc.malloc(4096, COMPUTE).unwrap();
    // `y` is also read by a copy on another stream; freeing it must wait for that work.
    alloc.device_mut().launch(COPY);
    alloc.record_stream(y, COPY).unwrap();
    alloc.free(y).unwrap();
    alloc.free(x).unwrap();
    // Same size again: a cache hit, no device malloc; `y`'s block is still pending.
    let z = alloc.malloc(3 * MIB, COMPUTE).unwrap();
    assert_eq!(z, x);
    alloc.device_mut().finish_all();
    alloc.free(z).unwrap();
    alloc
}

fn main() {
    let mut alloc = session();
    let s = alloc.stats();
    println!(
        "reserved {} bytes in {} segments, {} device mallocs, {} bytes active",
        s.reserved_bytes.all.current,
        s.segment.all.current,
        s.num_device_alloc,
        s.active_bytes.all.current
    );
    alloc.empty_cache().unwrap();
    println!(
        "after empty_cache: reserved {} bytes",
        alloc.stats().reserved_bytes.all.current
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_runs_on_a_foreign_device() {
        let mut alloc = session();
        let s = alloc.stats();
        // A 20 MiB large segment and a 2 MiB small one; the hit needed no third.
        assert_eq!(s.reserved_bytes.all.current, 22 * MIB as i64);
        assert_eq!(s.num_device_alloc, 2);
        // `y` (4096 bytes) still waits on the copy stream's event, polled at the next malloc.
        assert_eq!(s.active_bytes.all.current, 4096);
        alloc.process_events().unwrap();
        assert_eq!(alloc.stats().active_bytes.all.current, 0);
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
        assert_eq!(alloc.device().used, 0);
        assert_eq!(alloc.stats().num_device_free, 2);
    }

    #[test]
    fn out_of_memory_carries_torchs_numbers() {
        let mut alloc = Allocator::new(
            HostDevice::new(64 * MIB),
            &AllocConf::default(),
            DeviceFacts::cuda_parity(0),
        );
        let err = alloc.malloc(100 * MIB, COMPUTE).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("NPU out of memory. Tried to allocate 100.00 MiB"),
            "{err}"
        );
        assert_eq!(alloc.stats().num_ooms, 1);
    }
}
