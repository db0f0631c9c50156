//! A deterministic simulated device for tests, benches and trace replay.
//!
//! `alloc-core` only sees memory through the [`Device`] trait. To test the policy (and to replay
//! traces before anyone reaches an Ascend box) we need a device whose every observable is under
//! the test's control: addresses are predictable, capacity is exact, stream work completes only
//! when the test says so, and counters prove that nothing leaks. Failures on cue come from
//! wrapping it in a [`FaultInjector`](crate::FaultInjector).
//!
//! Addresses come from a bump pointer that starts at [`BASE_ADDRESS`] and aligns every segment to
//! [`SEGMENT_ALIGNMENT`]; freed address space is never handed out again, so the first segment of
//! a fresh device is always at `0x1_0000_0000`, the next one at the following 2 MiB boundary past
//! its end, and so on.
//!
//! Virtual memory (for expandable segments) is simulated with the same accounting: reserved
//! ranges come from the same bump pointer (so they never overlap a segment), physical pages count
//! against the capacity like segments do, and every map and unmap is checked against the ranges,
//! pages and mappings alive, so a leak or a double unmap shows in the counters or as an error.
//!
//! Capacity follows the trace format (docs/trace-format.md): a `malloc` fails with [`DeviceError::OutOfMemory`] when the
//! bytes handed out plus the device overhead plus the request exceed the capacity, and
//! [`Device::mem_info`] reports `(capacity - overhead - handed out, capacity)`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use alloc_core::{Device, DeviceError, MemInfo, Stream, VmmError};
use hashbrown::HashMap as FastMap;

use crate::contents::{Backing, DeviceBytes, Sparse};
use crate::fault::DeviceCall;

/// Where the first segment of a fresh [`SimDevice`] lives.
pub const BASE_ADDRESS: u64 = 0x1_0000_0000;
/// Every segment address is a multiple of this (2 MiB, a multiple of torch's 512-byte minimum).
pub const SEGMENT_ALIGNMENT: u64 = 2 << 20;
/// The capacity a trace gets when it names none (64 GiB).
pub const DEFAULT_CAPACITY: u64 = 64 << 30;

/// A stream of the simulated device: any number names one (0 is the default stream). The
/// simulated device never dereferences anything, so a made-up stream is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SimStream(pub u64);

impl Stream for SimStream {
    /// The stream's handle in reports and snapshots: its number plus one. torch_npu's streams
    /// are never the null handle, and memory_viz depends on that: when every trace entry is on
    /// stream 0 it leaves the stream out of the entries but not of the segments, and then its
    /// "Allocator State History" view cannot merge the mapped ranges of an expandable segment.
    #[inline]
    fn number(self) -> u64 {
        self.0.wrapping_add(1)
    }
}

/// Why a simulated device call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimError {
    /// `free` of an address that is not the start of a live segment.
    UnknownSegment {
        /// The address given.
        addr: u64,
    },
    /// `free` of a live segment with a size other than the one it was allocated with.
    SizeMismatch {
        /// The segment's address.
        addr: u64,
        /// The size it was allocated with.
        expected: u64,
        /// The size given to `free`.
        got: u64,
    },
    /// `malloc(0)`: the policy never asks for an empty segment.
    ZeroSize,
    /// `event_done` of an event this device did not record.
    UnknownEvent {
        /// The event's serial number.
        id: u64,
    },
    /// `mem_info` on a device built [`SimDevice::without_mem_info`].
    MemInfoUnsupported,
    /// `reserve_address(0)` or `create_page(0)`.
    ZeroSizeVirtual,
    /// `release_address` of an address that does not start a reserved range, or with another
    /// size.
    UnknownRange {
        /// The address given.
        addr: u64,
    },
    /// `release_address` of a range that still has pages mapped in it.
    RangeInUse {
        /// The range's address.
        addr: u64,
    },
    /// `map` of bytes outside every reserved range, or over an existing mapping.
    BadMapping {
        /// The address given.
        addr: u64,
    },
    /// `map` of a page with a size other than its own, or of a page that is already mapped.
    PageMismatch {
        /// The page's serial number.
        page: u64,
    },
    /// `release_page` of a page that is still mapped.
    PageMapped {
        /// The page's serial number.
        page: u64,
    },
    /// `unmap` of an address where no page of that size is mapped.
    NotMapped {
        /// The address given.
        addr: u64,
    },
    /// A copy or byte access of device memory that is not backed (outside every segment and
    /// mapping), or of more bytes than the host buffer holds.
    NotBacked {
        /// The first address of the access.
        addr: u64,
        /// Its length.
        len: u64,
    },
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::UnknownSegment { addr } => {
                write!(f, "free of {addr:#x}, which is not a live segment")
            }
            SimError::SizeMismatch {
                addr,
                expected,
                got,
            } => write!(
                f,
                "free of segment {addr:#x} with size {got}, but it was allocated with {expected}"
            ),
            SimError::ZeroSize => f.write_str("malloc of 0 bytes"),
            SimError::UnknownEvent { id } => {
                write!(f, "event {id} was not recorded on this device")
            }
            SimError::MemInfoUnsupported => f.write_str("mem_info is not supported"),
            SimError::ZeroSizeVirtual => f.write_str("reservation or page of 0 bytes"),
            SimError::UnknownRange { addr } => {
                write!(
                    f,
                    "release of {addr:#x}, which is not a reserved range of that size"
                )
            }
            SimError::RangeInUse { addr } => {
                write!(
                    f,
                    "release of range {addr:#x}, which still has pages mapped"
                )
            }
            SimError::BadMapping { addr } => write!(
                f,
                "map at {addr:#x}: outside every reserved range or over a mapping"
            ),
            SimError::PageMismatch { page } => {
                write!(f, "map of page {page}: already mapped, or of another size")
            }
            SimError::PageMapped { page } => {
                write!(f, "release of page {page}, which is still mapped")
            }
            SimError::NotMapped { addr } => {
                write!(
                    f,
                    "unmap at {addr:#x}, where no page of that size is mapped"
                )
            }
            SimError::NotBacked { addr, len } => write!(
                f,
                "access of {len} bytes at {addr:#x}: not device memory, or past the host buffer"
            ),
        }
    }
}

impl std::error::Error for SimError {}

/// An event recorded on a [`SimDevice`] stream; it completes when the test completes the stream.
///
/// Not `Clone`: it is given back exactly once with [`Device::release_event`].
#[derive(Debug, PartialEq, Eq)]
pub struct SimEvent {
    id: u64,
    stream: SimStream,
    seq: u64,
}

impl SimEvent {
    /// The device-wide serial number of this event (0 for the first one recorded).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The stream it was recorded on.
    pub fn stream(&self) -> SimStream {
        self.stream
    }
}

/// A physical page of a [`SimDevice`]. Not `Clone`: it is given back exactly once with
/// [`Device::release_page`].
#[derive(Debug, PartialEq, Eq)]
pub struct SimPage {
    id: u64,
    bytes: u64,
}

impl SimPage {
    /// The device-wide serial number of this page (0 for the first one created).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Host memory of a [`SimDevice`] for copies (the memory saver's CPU backup), kept sparsely like
/// device memory. Not `Clone`: it is given back exactly once with [`Device::free_host`].
#[derive(Debug, PartialEq, Eq)]
pub struct SimHostBuffer {
    id: u64,
    bytes: u64,
    data: Sparse,
}

impl SimHostBuffer {
    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Reads `len` bytes at `offset` (zeros where nothing was copied).
    pub fn read(&self, offset: u64, len: u64) -> Vec<u8> {
        self.data.read(offset, len)
    }
}

/// Per-stream event clock: events `0..recorded` exist, `0..completed` are done.
#[derive(Debug, Clone, Copy, Default)]
struct StreamClock {
    recorded: u64,
    completed: u64,
}

/// A deterministic, capacity-limited simulated device with test-controlled event completion.
#[derive(Debug, Clone)]
pub struct SimDevice {
    capacity: u64,
    overhead: u64,
    mem_info_supported: bool,
    next_addr: u64,
    segments: BTreeMap<u64, u64>,
    handed_out: u64,
    peak: u64,
    /// Polled at every `event_done`: a map with a cheap hash (the replay benches poll a lot).
    streams: FastMap<u64, StreamClock>,
    next_event_id: u64,
    outstanding_events: u64,
    successful_mallocs: u64,
    frees: u64,
    events_recorded: u64,
    events_released: u64,
    /// Calls that reached the device, per [`DeviceCall`], failed ones included.
    calls: [u64; DeviceCall::ALL.len()],
    vmm_supported: bool,
    /// Reserved virtual ranges: start → bytes.
    ranges: BTreeMap<u64, u64>,
    /// Live physical pages: id → (bytes, mapped at).
    pages: HashMap<u64, (u64, Option<u64>)>,
    next_page_id: u64,
    page_bytes: u64,
    /// Mappings: address → (page id, bytes).
    mappings: BTreeMap<u64, (u64, u64)>,
    mapped_bytes: u64,
    /// Written device bytes, sparsely.
    bytes: DeviceBytes,
    /// Live host buffers: id → bytes.
    host_buffers: HashMap<u64, u64>,
    next_host_id: u64,
    /// The call before the current one, to count runs of maps and unmaps.
    last_call: Option<DeviceCall>,
    /// While the calls since the last unmap were only unmaps and page releases: the reserved
    /// range of that unmap and the address just past it, where the run would continue.
    unmap_run: Option<(u64, u64)>,
    map_runs: u64,
    /// The address just past the last successful map: a map there, right after it, continues
    /// its run.
    map_next: u64,
    unmap_runs: u64,
    /// Requests refused because the 64-bit address space ran out (addresses are never reused).
    address_space_refusals: u64,
}

impl Default for SimDevice {
    fn default() -> Self {
        SimDevice::new(DEFAULT_CAPACITY)
    }
}

impl SimDevice {
    /// A device with `capacity` bytes, no overhead, `mem_info` supported and no faults.
    pub fn new(capacity: u64) -> Self {
        SimDevice {
            capacity,
            overhead: 0,
            mem_info_supported: true,
            next_addr: BASE_ADDRESS,
            segments: BTreeMap::new(),
            handed_out: 0,
            peak: 0,
            streams: FastMap::new(),
            next_event_id: 0,
            outstanding_events: 0,
            successful_mallocs: 0,
            frees: 0,
            events_recorded: 0,
            events_released: 0,
            calls: [0; DeviceCall::ALL.len()],
            vmm_supported: true,
            ranges: BTreeMap::new(),
            pages: HashMap::new(),
            next_page_id: 0,
            page_bytes: 0,
            mappings: BTreeMap::new(),
            mapped_bytes: 0,
            bytes: DeviceBytes::default(),
            host_buffers: HashMap::new(),
            next_host_id: 0,
            last_call: None,
            unmap_run: None,
            map_runs: 0,
            map_next: 0,
            unmap_runs: 0,
            address_space_refusals: 0,
        }
    }

    /// Mallocs and range reservations refused because the 64-bit address space ran out: on a
    /// device of several EiB, where each expandable range is 9/8 of it, a real shortage of
    /// the simulator rather than of memory.
    pub fn address_space_refusals(&self) -> u64 {
        self.address_space_refusals
    }

    /// Builder: no virtual-memory calls (every one answers `VmmError::Unsupported`), like a
    /// driver without them.
    pub fn without_vmm(mut self) -> Self {
        self.vmm_supported = false;
        self
    }

    /// Builder: the first segment goes at `base` (rounded up to [`SEGMENT_ALIGNMENT`]) instead of
    /// [`BASE_ADDRESS`], so that several simulated devices in one process hand out distinct
    /// addresses, as real devices do.
    pub fn with_base_address(mut self, base: u64) -> Self {
        self.next_addr = base;
        self
    }

    /// Builder: memory the device reports as used by others (the trace's `device_overhead`).
    pub fn with_device_overhead(mut self, bytes: u64) -> Self {
        self.overhead = bytes;
        self
    }

    /// Builder: `mem_info` fails, like a device that cannot tell.
    pub fn without_mem_info(mut self) -> Self {
        self.mem_info_supported = false;
        self
    }

    /// The device's total memory.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Changes the total memory; live segments stay live even if they no longer fit.
    pub fn set_capacity(&mut self, bytes: u64) {
        self.capacity = bytes;
    }

    /// Memory reported as used by others.
    pub fn device_overhead(&self) -> u64 {
        self.overhead
    }

    /// Changes the memory used by others (another process grabbing memory mid-test).
    pub fn set_device_overhead(&mut self, bytes: u64) {
        self.overhead = bytes;
    }

    /// Turns `mem_info` support on or off.
    pub fn set_mem_info_supported(&mut self, supported: bool) {
        self.mem_info_supported = supported;
    }

    // ----- events under test control -----

    /// Completes every event recorded on `stream` so far; later events stay pending.
    pub fn complete_stream(&mut self, stream: SimStream) {
        if let Some(clock) = self.streams.get_mut(&stream.0) {
            clock.completed = clock.recorded;
        }
    }

    /// Completes every event recorded so far on every stream.
    pub fn complete_all(&mut self) {
        for clock in self.streams.values_mut() {
            clock.completed = clock.recorded;
        }
    }

    /// Events recorded on `stream` that have not completed yet (released or not).
    pub fn pending_events(&self, stream: SimStream) -> u64 {
        self.streams
            .get(&stream.0)
            .map_or(0, |c| c.recorded - c.completed)
    }

    // ----- counters -----

    /// Calls of `call` that reached the device so far, failed ones included.
    pub fn calls(&self, call: DeviceCall) -> u64 {
        self.calls[call as usize]
    }

    /// Counts a call; returns the call before it.
    fn count(&mut self, call: DeviceCall) -> Option<DeviceCall> {
        self.calls[call as usize] += 1;
        if !matches!(call, DeviceCall::Unmap | DeviceCall::ReleasePage) {
            self.unmap_run = None;
        }
        self.last_call.replace(call)
    }

    /// Runs of successful `map` calls of consecutive pages with no other call between them: one
    /// per map call of the allocator (torch counts `num_device_alloc` per map call, however many
    /// pages it maps).
    pub fn map_runs(&self) -> u64 {
        self.map_runs
    }

    /// The next `map` or `unmap` starts a run of its own. A caller marks where its own calls
    /// begin: with pages cached by `empty_virt_addr_cache`, one malloc's maps can follow the
    /// last malloc's with no device call between them.
    #[inline]
    pub fn end_runs(&mut self) {
        self.last_call = None;
        self.unmap_run = None;
    }

    /// Runs of successful `unmap` calls of consecutive pages of one reserved range, with only
    /// `release_page` calls between them: one per unmapped range of the allocator (torch's
    /// `num_device_free` per `unmap_block`).
    pub fn unmap_runs(&self) -> u64 {
        self.unmap_runs
    }

    /// `malloc` calls so far, failed ones included.
    pub fn malloc_calls(&self) -> u64 {
        self.calls(DeviceCall::Malloc)
    }

    /// `malloc` calls that returned a segment.
    pub fn successful_mallocs(&self) -> u64 {
        self.successful_mallocs
    }

    /// `free` calls so far, failed ones included.
    pub fn free_calls(&self) -> u64 {
        self.calls(DeviceCall::Free)
    }

    /// `free` calls that returned a segment.
    pub fn frees(&self) -> u64 {
        self.frees
    }

    /// `synchronize` calls so far, failed ones included.
    pub fn synchronize_calls(&self) -> u64 {
        self.calls(DeviceCall::Synchronize)
    }

    /// `event_done` calls so far, failed ones included.
    pub fn event_done_calls(&self) -> u64 {
        self.calls(DeviceCall::EventDone)
    }

    /// `mem_info` calls so far, failed ones included.
    pub fn mem_info_calls(&self) -> u64 {
        self.calls(DeviceCall::MemInfo)
    }

    /// Events successfully recorded so far.
    pub fn events_recorded(&self) -> u64 {
        self.events_recorded
    }

    /// Events given back with `release_event` so far.
    pub fn events_released(&self) -> u64 {
        self.events_released
    }

    /// Events recorded and not yet released: non-zero at the end of a test means a leak.
    pub fn outstanding_events(&self) -> u64 {
        self.outstanding_events
    }

    /// Bytes handed out in live segments now (physical pages not included).
    pub fn outstanding_bytes(&self) -> u64 {
        self.handed_out
    }

    /// Reserved virtual ranges now, as `(address, bytes)` in address order.
    pub fn reserved_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&a, &b)| (a, b))
    }

    /// Live physical pages now, mapped or not.
    pub fn live_pages(&self) -> usize {
        self.pages.len()
    }

    /// Bytes of live physical pages now.
    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// Bytes mapped now.
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped_bytes
    }

    /// Mappings now, as `(address, bytes)` in address order.
    pub fn mappings(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.mappings.iter().map(|(&a, &(_, b))| (a, b))
    }

    /// Mappings that start in `[start, end)`, as `(address, bytes)` in address order.
    pub fn mappings_in(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.mappings.range(start..end).map(|(&a, &(_, b))| (a, b))
    }

    /// The mapping that contains `addr`, as `(address, bytes)`, if any.
    pub fn mapping_covering(&self, addr: u64) -> Option<(u64, u64)> {
        self.mappings
            .range(..=addr)
            .next_back()
            .filter(|&(&a, &(_, b))| addr - a < b)
            .map(|(&a, &(_, b))| (a, b))
    }

    /// The reserved range `(address, bytes)` that contains `addr`, if any.
    pub fn range_containing(&self, addr: u64) -> Option<(u64, u64)> {
        self.ranges
            .range(..=addr)
            .next_back()
            .filter(|&(&start, &bytes)| addr - start < bytes)
            .map(|(&start, &bytes)| (start, bytes))
    }

    /// Whether every byte of `[start, end)` is backed: inside one live segment, or covered by
    /// contiguous mappings.
    pub fn is_backed(&self, start: u64, end: u64) -> bool {
        if let Some((s, bytes)) = self.segment_containing(start) {
            return end <= s + bytes;
        }
        let Some((first, bytes)) = self.mapping_covering(start) else {
            return false;
        };
        let mut at = first + bytes;
        if at >= end {
            return true;
        }
        for (a, bytes) in self.mappings_in(at, end) {
            if a != at {
                return false;
            }
            at += bytes;
        }
        at >= end
    }

    /// Live host buffers now: non-zero at the end of a test means a leak.
    pub fn live_host_buffers(&self) -> usize {
        self.host_buffers.len()
    }

    /// Host memory held for written device bytes (whole 4 KiB chunks).
    pub fn held_content_bytes(&self) -> u64 {
        self.bytes.held_bytes()
    }

    /// The physical pieces of `[addr, addr + len)`: (backing, offset in it, length), in order;
    /// an error if any byte is not backed.
    fn pieces(&self, addr: u64, len: u64) -> Result<Vec<(Backing, u64, u64)>, SimError> {
        let not_backed = SimError::NotBacked { addr, len };
        let end = addr.checked_add(len).ok_or(not_backed.clone())?;
        if let Some((base, bytes)) = self.segment_containing(addr) {
            if end > base + bytes {
                return Err(not_backed);
            }
            return Ok(vec![(Backing::Segment(base), addr - base, len)]);
        }
        let mut out = Vec::new();
        let mut at = addr;
        while at < end {
            let (start, bytes) = self.mapping_covering(at).ok_or(not_backed.clone())?;
            let (page, _) = self.mappings[&start];
            let n = (start + bytes).min(end) - at;
            out.push((Backing::Page(page), at - start, n));
            at += n;
        }
        Ok(out)
    }

    /// Test control: writes `data` into device memory at `addr` (a segment or mapped pages).
    pub fn write_bytes(&mut self, addr: u64, data: &[u8]) -> Result<(), SimError> {
        let mut done = 0u64;
        for (backing, offset, n) in self.pieces(addr, data.len() as u64)? {
            let piece = &data[done as usize..(done + n) as usize];
            self.bytes.of_mut(backing).write(offset, piece);
            done += n;
        }
        Ok(())
    }

    /// Test control: reads `len` bytes of device memory at `addr` (zeros where never written).
    pub fn read_bytes(&self, addr: u64, len: u64) -> Result<Vec<u8>, SimError> {
        let mut out = Vec::with_capacity(len as usize);
        for (backing, offset, n) in self.pieces(addr, len)? {
            match self.bytes.of(backing) {
                Some(s) => out.extend(s.read(offset, n)),
                None => out.resize(out.len() + n as usize, 0),
            }
        }
        Ok(out)
    }

    /// Bytes of device memory in use: segments plus physical pages.
    fn used(&self) -> u64 {
        self.handed_out + self.page_bytes
    }

    /// Whether `bytes` more fit in the capacity.
    fn fits(&self, bytes: u64) -> bool {
        self.used()
            .checked_add(self.overhead)
            .and_then(|used| used.checked_add(bytes))
            .is_some_and(|needed| needed <= self.capacity)
    }

    /// Takes `bytes` of address space aligned to [`SEGMENT_ALIGNMENT`] from the bump pointer;
    /// `None` when the 64-bit address space is exhausted.
    fn take_addresses(&mut self, bytes: u64) -> Option<u64> {
        let Some(addr) = self
            .next_addr
            .checked_next_multiple_of(SEGMENT_ALIGNMENT)
            .filter(|a| a.checked_add(bytes).is_some())
        else {
            self.address_space_refusals += 1;
            return None;
        };
        self.next_addr = addr + bytes;
        Some(addr)
    }

    /// Whether `[addr, addr + bytes)` lies inside one reserved range.
    fn reserved(&self, addr: u64, bytes: u64) -> bool {
        self.ranges
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, &len)| {
                addr.checked_add(bytes)
                    .is_some_and(|end| end <= start + len)
            })
    }

    /// Whether `[addr, addr + bytes)` overlaps a mapping.
    fn overlaps_mapping(&self, addr: u64, bytes: u64) -> bool {
        let end = addr.saturating_add(bytes);
        let below = self
            .mappings
            .range(..=addr)
            .next_back()
            .is_some_and(|(&a, &(_, b))| a + b > addr);
        below || self.mappings.range(addr..end).next().is_some()
    }

    /// Live segments now.
    pub fn outstanding_segments(&self) -> usize {
        self.segments.len()
    }

    /// The most bytes ever in use at once, segments and physical pages together (since creation
    /// or [`SimDevice::reset_peak`]).
    pub fn peak_outstanding_bytes(&self) -> u64 {
        self.peak
    }

    /// Sets the peak to the bytes in use now.
    pub fn reset_peak(&mut self) {
        self.peak = self.used();
    }

    /// Live segments as `(address, bytes)`, in address order.
    pub fn segments(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.segments.iter().map(|(&a, &b)| (a, b))
    }

    /// The live segment `(address, bytes)` that contains `addr`, if any.
    pub fn segment_containing(&self, addr: u64) -> Option<(u64, u64)> {
        self.segments
            .range(..=addr)
            .next_back()
            .filter(|&(&start, &bytes)| addr - start < bytes)
            .map(|(&start, &bytes)| (start, bytes))
    }

    /// The size of the live segment starting at `addr`, if any.
    pub fn segment_size(&self, addr: u64) -> Option<u64> {
        self.segments.get(&addr).copied()
    }
}

impl AsRef<SimDevice> for SimDevice {
    fn as_ref(&self) -> &SimDevice {
        self
    }
}

impl Device for SimDevice {
    type Stream = SimStream;
    type Event = SimEvent;
    type Error = SimError;
    type Page = SimPage;
    type HostBuffer = SimHostBuffer;

    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError<SimError>> {
        self.count(DeviceCall::Malloc);
        if bytes == 0 {
            return Err(DeviceError::Other(SimError::ZeroSize));
        }
        if !self.fits(bytes) {
            return Err(DeviceError::OutOfMemory);
        }
        // Out of address space counts as out of memory too (only reachable with huge capacities).
        let addr = self.take_addresses(bytes).ok_or(DeviceError::OutOfMemory)?;
        self.segments.insert(addr, bytes);
        self.handed_out += bytes;
        self.peak = self.peak.max(self.used());
        self.successful_mallocs += 1;
        Ok(addr)
    }

    fn free(&mut self, addr: u64, bytes: u64) -> Result<(), SimError> {
        self.count(DeviceCall::Free);
        match self.segments.get(&addr) {
            None => Err(SimError::UnknownSegment { addr }),
            Some(&expected) if expected != bytes => Err(SimError::SizeMismatch {
                addr,
                expected,
                got: bytes,
            }),
            Some(_) => {
                self.segments.remove(&addr);
                self.bytes.drop_backing(Backing::Segment(addr));
                self.handed_out -= bytes;
                self.frees += 1;
                Ok(())
            }
        }
    }

    fn mem_info(&mut self) -> Result<MemInfo, SimError> {
        self.count(DeviceCall::MemInfo);
        if !self.mem_info_supported {
            return Err(SimError::MemInfoUnsupported);
        }
        Ok(MemInfo {
            free: self
                .capacity
                .saturating_sub(self.overhead)
                .saturating_sub(self.used()),
            total: self.capacity,
        })
    }

    fn record_event(&mut self, stream: SimStream) -> Result<SimEvent, SimError> {
        self.count(DeviceCall::RecordEvent);
        let clock = self.streams.entry(stream.0).or_default();
        let seq = clock.recorded;
        clock.recorded += 1;
        let id = self.next_event_id;
        self.next_event_id += 1;
        self.events_recorded += 1;
        self.outstanding_events += 1;
        Ok(SimEvent { id, stream, seq })
    }

    fn event_done(&mut self, event: &SimEvent) -> Result<bool, SimError> {
        self.count(DeviceCall::EventDone);
        match self.streams.get(&event.stream.0) {
            Some(clock) if event.seq < clock.recorded => Ok(event.seq < clock.completed),
            _ => Err(SimError::UnknownEvent { id: event.id }),
        }
    }

    fn release_event(&mut self, _event: SimEvent) {
        self.events_released += 1;
        self.outstanding_events = self.outstanding_events.saturating_sub(1);
    }

    fn synchronize(&mut self) -> Result<(), SimError> {
        self.count(DeviceCall::Synchronize);
        self.complete_all();
        Ok(())
    }

    fn reserve_address(&mut self, bytes: u64) -> Result<u64, VmmError<SimError>> {
        self.count(DeviceCall::ReserveAddress);
        if !self.vmm_supported {
            return Err(VmmError::Unsupported);
        }
        if bytes == 0 {
            return Err(VmmError::Other(SimError::ZeroSizeVirtual));
        }
        let addr = self.take_addresses(bytes).ok_or(VmmError::OutOfMemory)?;
        self.ranges.insert(addr, bytes);
        Ok(addr)
    }

    fn release_address(&mut self, addr: u64, bytes: u64) -> Result<(), VmmError<SimError>> {
        self.count(DeviceCall::ReleaseAddress);
        if !self.vmm_supported {
            return Err(VmmError::Unsupported);
        }
        if self.ranges.get(&addr) != Some(&bytes) {
            return Err(VmmError::Other(SimError::UnknownRange { addr }));
        }
        if self.mappings.range(addr..addr + bytes).next().is_some() {
            return Err(VmmError::Other(SimError::RangeInUse { addr }));
        }
        self.ranges.remove(&addr);
        Ok(())
    }

    fn create_page(&mut self, bytes: u64) -> Result<SimPage, VmmError<SimError>> {
        self.count(DeviceCall::CreatePage);
        if !self.vmm_supported {
            return Err(VmmError::Unsupported);
        }
        if bytes == 0 {
            return Err(VmmError::Other(SimError::ZeroSizeVirtual));
        }
        if !self.fits(bytes) {
            return Err(VmmError::OutOfMemory);
        }
        let id = self.next_page_id;
        self.next_page_id += 1;
        self.pages.insert(id, (bytes, None));
        self.page_bytes += bytes;
        self.peak = self.peak.max(self.used());
        Ok(SimPage { id, bytes })
    }

    fn release_page(&mut self, page: SimPage) -> Result<(), (SimPage, VmmError<SimError>)> {
        self.count(DeviceCall::ReleasePage);
        if !self.vmm_supported {
            return Err((page, VmmError::Unsupported));
        }
        match self.pages.get(&page.id) {
            Some(&(_, Some(_))) => {
                let id = page.id;
                Err((page, VmmError::Other(SimError::PageMapped { page: id })))
            }
            // A `SimPage` is only made by `create_page` and given back once, so it is live.
            _ => {
                self.pages.remove(&page.id);
                self.bytes.drop_backing(Backing::Page(page.id));
                self.page_bytes -= page.bytes;
                Ok(())
            }
        }
    }

    fn map(&mut self, addr: u64, bytes: u64, page: &SimPage) -> Result<(), VmmError<SimError>> {
        let before = self.count(DeviceCall::Map);
        if !self.vmm_supported {
            return Err(VmmError::Unsupported);
        }
        if !self.reserved(addr, bytes) || self.overlaps_mapping(addr, bytes) {
            return Err(VmmError::Other(SimError::BadMapping { addr }));
        }
        match self.pages.get_mut(&page.id) {
            Some((size, at @ None)) if *size == bytes => *at = Some(addr),
            _ => return Err(VmmError::Other(SimError::PageMismatch { page: page.id })),
        }
        self.mappings.insert(addr, (page.id, bytes));
        self.mapped_bytes += bytes;
        // One map call of the allocator maps consecutive pages with nothing between them (its
        // pages, kept or new, are all taken first); two such calls in one malloc, each with
        // pages kept by `empty_virt_addr_cache`, follow each other at other addresses.
        if before != Some(DeviceCall::Map) || addr != self.map_next {
            self.map_runs += 1;
        }
        self.map_next = addr + bytes;
        Ok(())
    }

    fn unmap(&mut self, addr: u64, bytes: u64) -> Result<(), VmmError<SimError>> {
        self.count(DeviceCall::Unmap);
        if !self.vmm_supported {
            return Err(VmmError::Unsupported);
        }
        let Some(&(id, size)) = self.mappings.get(&addr).filter(|m| m.1 == bytes) else {
            return Err(VmmError::Other(SimError::NotMapped { addr }));
        };
        self.mappings.remove(&addr);
        self.mapped_bytes -= size;
        let range = self.range_containing(addr).map_or(0, |r| r.0);
        if self.unmap_run != Some((range, addr)) {
            self.unmap_runs += 1;
        }
        self.unmap_run = Some((range, addr + size));
        if let Some((_, at)) = self.pages.get_mut(&id) {
            *at = None;
        }
        Ok(())
    }

    fn alloc_host(&mut self, bytes: u64) -> Result<SimHostBuffer, VmmError<SimError>> {
        self.count(DeviceCall::AllocHost);
        if !self.vmm_supported {
            return Err(VmmError::Unsupported);
        }
        let id = self.next_host_id;
        self.next_host_id += 1;
        self.host_buffers.insert(id, bytes);
        Ok(SimHostBuffer {
            id,
            bytes,
            data: Sparse::default(),
        })
    }

    fn free_host(
        &mut self,
        buffer: SimHostBuffer,
    ) -> Result<(), (SimHostBuffer, VmmError<SimError>)> {
        self.count(DeviceCall::FreeHost);
        if !self.vmm_supported {
            return Err((buffer, VmmError::Unsupported));
        }
        // A `SimHostBuffer` is only made by `alloc_host` and given back once, so it is live.
        self.host_buffers.remove(&buffer.id);
        Ok(())
    }

    fn copy_to_host(
        &mut self,
        dst: &mut SimHostBuffer,
        src: u64,
        bytes: u64,
    ) -> Result<(), VmmError<SimError>> {
        self.count(DeviceCall::CopyToHost);
        if !self.vmm_supported {
            return Err(VmmError::Unsupported);
        }
        if bytes > dst.bytes {
            return Err(VmmError::Other(SimError::NotBacked {
                addr: src,
                len: bytes,
            }));
        }
        let mut done = 0u64;
        for (backing, offset, n) in self.pieces(src, bytes).map_err(VmmError::Other)? {
            match self.bytes.of(backing) {
                Some(from) => dst.data.copy_from(done, from, offset, n),
                None => dst.data.clear(done, n),
            }
            done += n;
        }
        Ok(())
    }

    fn copy_to_device(
        &mut self,
        dst: u64,
        src: &SimHostBuffer,
        bytes: u64,
    ) -> Result<(), VmmError<SimError>> {
        self.count(DeviceCall::CopyToDevice);
        if !self.vmm_supported {
            return Err(VmmError::Unsupported);
        }
        if bytes > src.bytes {
            return Err(VmmError::Other(SimError::NotBacked {
                addr: dst,
                len: bytes,
            }));
        }
        let mut done = 0u64;
        for (backing, offset, n) in self.pieces(dst, bytes).map_err(VmmError::Other)? {
            self.bytes
                .of_mut(backing)
                .copy_from(offset, &src.data, done, n);
            done += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const S0: SimStream = SimStream(0);
    const S1: SimStream = SimStream(1);

    #[test]
    fn addresses_are_deterministic_and_aligned() {
        let mut d = SimDevice::new(1 << 30);
        assert_eq!(d.malloc(2 * MIB), Ok(0x1_0000_0000));
        assert_eq!(d.malloc(512), Ok(0x1_0020_0000));
        assert_eq!(d.malloc(3 * MIB), Ok(0x1_0040_0000));
        assert_eq!(d.malloc(1), Ok(0x1_0080_0000));
        let mut again = SimDevice::new(1 << 30);
        assert_eq!(again.malloc(2 * MIB), Ok(BASE_ADDRESS));
    }

    #[test]
    fn addresses_are_never_reused() {
        let mut d = SimDevice::new(1 << 30);
        let a = d.malloc(MIB).unwrap();
        d.free(a, MIB).unwrap();
        let b = d.malloc(MIB).unwrap();
        assert_ne!(a, b);
        assert_eq!(b % SEGMENT_ALIGNMENT, 0);
    }

    #[test]
    fn capacity_and_overhead_limit_malloc() {
        let mut d = SimDevice::new(10 * MIB).with_device_overhead(2 * MIB);
        assert_eq!(d.malloc(8 * MIB + 1), Err(DeviceError::OutOfMemory));
        assert!(d.malloc(6 * MIB).is_ok());
        assert_eq!(d.malloc(2 * MIB + 1), Err(DeviceError::OutOfMemory));
        assert!(d.malloc(2 * MIB).is_ok(), "exactly full is allowed");
        assert_eq!(d.malloc(1), Err(DeviceError::OutOfMemory));
        assert_eq!(d.malloc_calls(), 5);
        assert_eq!(d.successful_mallocs(), 2);
        assert_eq!(d.outstanding_bytes(), 8 * MIB);
        assert_eq!(d.outstanding_segments(), 2);
    }

    #[test]
    fn huge_requests_do_not_overflow() {
        let mut d = SimDevice::new(u64::MAX).with_device_overhead(u64::MAX);
        assert_eq!(d.malloc(u64::MAX), Err(DeviceError::OutOfMemory));
        let mut d = SimDevice::new(u64::MAX);
        assert_eq!(
            d.malloc(u64::MAX),
            Err(DeviceError::OutOfMemory),
            "no address space left"
        );
        assert_eq!(d.malloc(u64::MAX - BASE_ADDRESS), Ok(BASE_ADDRESS));
        assert_eq!(d.malloc(1), Err(DeviceError::OutOfMemory));
        assert_eq!(d.mem_info().unwrap().free, BASE_ADDRESS);
    }

    #[test]
    fn zero_size_malloc_is_an_error() {
        let mut d = SimDevice::new(MIB);
        assert_eq!(d.malloc(0), Err(DeviceError::Other(SimError::ZeroSize)));
        assert_eq!(d.outstanding_segments(), 0);
    }

    #[test]
    fn mem_info_reports_free_and_total() {
        let mut d = SimDevice::new(100 * MIB).with_device_overhead(10 * MIB);
        assert_eq!(
            d.mem_info(),
            Ok(MemInfo {
                free: 90 * MIB,
                total: 100 * MIB
            })
        );
        d.malloc(30 * MIB).unwrap();
        assert_eq!(
            d.mem_info(),
            Ok(MemInfo {
                free: 60 * MIB,
                total: 100 * MIB
            })
        );
        d.set_device_overhead(200 * MIB);
        assert_eq!(
            d.mem_info(),
            Ok(MemInfo {
                free: 0,
                total: 100 * MIB
            }),
            "saturates"
        );
        d.set_capacity(20 * MIB);
        d.set_device_overhead(0);
        assert_eq!(
            d.mem_info(),
            Ok(MemInfo {
                free: 0,
                total: 20 * MIB
            }),
            "saturates"
        );
        assert_eq!(d.mem_info_calls(), 4);
    }

    #[test]
    fn mem_info_can_be_unsupported() {
        let mut d = SimDevice::new(MIB).without_mem_info();
        assert_eq!(d.mem_info(), Err(SimError::MemInfoUnsupported));
        d.set_mem_info_supported(true);
        assert!(d.mem_info().is_ok());
    }

    #[test]
    fn segment_containing_finds_the_enclosing_segment() {
        let mut d = SimDevice::new(100 * MIB);
        let a = d.malloc(3 * MIB).unwrap();
        let b = d.malloc(MIB).unwrap();
        assert_eq!(d.segment_containing(a), Some((a, 3 * MIB)));
        assert_eq!(d.segment_containing(a + 3 * MIB - 1), Some((a, 3 * MIB)));
        assert_eq!(d.segment_containing(a + 3 * MIB), None, "the gap before b");
        assert_eq!(d.segment_containing(b + 512), Some((b, MIB)));
        assert_eq!(d.segment_containing(0), None);
        d.free(a, 3 * MIB).unwrap();
        assert_eq!(d.segment_containing(a), None);
    }

    #[test]
    fn free_checks_address_and_size() {
        let mut d = SimDevice::new(100 * MIB);
        let a = d.malloc(4 * MIB).unwrap();
        assert_eq!(
            d.free(a + 512, 4 * MIB),
            Err(SimError::UnknownSegment { addr: a + 512 })
        );
        assert_eq!(d.free(0, 0), Err(SimError::UnknownSegment { addr: 0 }));
        assert_eq!(
            d.free(a, 2 * MIB),
            Err(SimError::SizeMismatch {
                addr: a,
                expected: 4 * MIB,
                got: 2 * MIB
            })
        );
        assert_eq!(
            d.outstanding_bytes(),
            4 * MIB,
            "failed frees change nothing"
        );
        assert_eq!(d.segment_size(a), Some(4 * MIB));
        assert_eq!(d.free(a, 4 * MIB), Ok(()));
        assert_eq!(
            d.free(a, 4 * MIB),
            Err(SimError::UnknownSegment { addr: a }),
            "double free"
        );
        assert_eq!(d.free_calls(), 5);
        assert_eq!(d.frees(), 1);
        assert_eq!(d.outstanding_bytes(), 0);
        assert_eq!(d.outstanding_segments(), 0);
        assert_eq!(d.segment_size(a), None);
    }

    #[test]
    fn peak_and_segments() {
        let mut d = SimDevice::new(100 * MIB);
        let a = d.malloc(10 * MIB).unwrap();
        let b = d.malloc(20 * MIB).unwrap();
        assert_eq!(
            d.segments().collect::<Vec<_>>(),
            [(a, 10 * MIB), (b, 20 * MIB)]
        );
        d.free(b, 20 * MIB).unwrap();
        assert_eq!(d.peak_outstanding_bytes(), 30 * MIB);
        d.reset_peak();
        assert_eq!(d.peak_outstanding_bytes(), 10 * MIB);
        d.malloc(5 * MIB).unwrap();
        assert_eq!(d.peak_outstanding_bytes(), 15 * MIB);
    }

    #[test]
    fn events_complete_per_stream_under_test_control() {
        let mut d = SimDevice::new(MIB);
        let e0 = d.record_event(S0).unwrap();
        let e1 = d.record_event(S1).unwrap();
        assert_eq!((e0.id(), e0.stream()), (0, S0));
        assert_eq!((e1.id(), e1.stream()), (1, S1));
        assert_eq!(d.event_done(&e0), Ok(false));
        assert_eq!(d.event_done(&e1), Ok(false));
        assert_eq!(d.pending_events(S1), 1);
        d.complete_stream(S1);
        assert_eq!(d.event_done(&e0), Ok(false), "other streams are untouched");
        assert_eq!(d.event_done(&e1), Ok(true));
        let e1b = d.record_event(S1).unwrap();
        assert_eq!(
            d.event_done(&e1b),
            Ok(false),
            "events after the completion stay pending"
        );
        assert_eq!(d.event_done(&e1), Ok(true));
        d.complete_stream(SimStream(7)); // a stream with no events: nothing happens
        d.complete_all();
        assert_eq!(d.event_done(&e0), Ok(true));
        assert_eq!(d.event_done(&e1b), Ok(true));
        assert_eq!(d.pending_events(S1), 0);
        assert_eq!(d.events_recorded(), 3);
        assert_eq!(d.outstanding_events(), 3);
        for e in [e0, e1, e1b] {
            d.release_event(e);
        }
        assert_eq!(d.outstanding_events(), 0);
        assert_eq!(d.events_released(), 3);
        assert_eq!(d.event_done_calls(), 8);
    }

    #[test]
    fn synchronize_completes_everything_and_counts() {
        let mut d = SimDevice::new(MIB);
        let a = d.record_event(S0).unwrap();
        let b = d.record_event(SimStream(42)).unwrap();
        d.synchronize().unwrap();
        assert_eq!(d.event_done(&a), Ok(true));
        assert_eq!(d.event_done(&b), Ok(true));
        let c = d.record_event(S0).unwrap();
        assert_eq!(d.event_done(&c), Ok(false));
        d.synchronize().unwrap();
        assert_eq!(d.event_done(&c), Ok(true));
        assert_eq!(d.synchronize_calls(), 2);
    }

    #[test]
    fn foreign_event_is_an_error() {
        let mut other = SimDevice::new(MIB);
        other.record_event(S0).unwrap();
        let foreign = other.record_event(S0).unwrap();
        let mut d = SimDevice::new(MIB);
        assert_eq!(
            d.event_done(&foreign),
            Err(SimError::UnknownEvent { id: 1 })
        );
        d.release_event(foreign);
        assert_eq!(d.outstanding_events(), 0, "saturates");
    }

    #[test]
    fn error_messages() {
        let msgs = [
            SimError::UnknownSegment { addr: 0x10 }.to_string(),
            SimError::SizeMismatch {
                addr: 0x10,
                expected: 4,
                got: 2,
            }
            .to_string(),
            SimError::ZeroSize.to_string(),
            SimError::UnknownEvent { id: 3 }.to_string(),
            DeviceError::Other(SimError::ZeroSize).to_string(),
        ];
        assert_eq!(
            msgs,
            [
                "free of 0x10, which is not a live segment",
                "free of segment 0x10 with size 2, but it was allocated with 4",
                "malloc of 0 bytes",
                "event 3 was not recorded on this device",
                "device error: malloc of 0 bytes",
            ]
        );
    }

    #[test]
    fn default_is_64_gib() {
        let d = SimDevice::default();
        assert_eq!(d.capacity(), 64 << 30);
        assert_eq!(d.device_overhead(), 0);
    }

    #[test]
    fn virtual_memory_accounting() {
        let mut d = SimDevice::new(10 * MIB);
        let seg = d.malloc(2 * MIB).unwrap();
        let va = d.reserve_address(40 * MIB).unwrap();
        // Reservations share the bump pointer with segments and take no capacity.
        assert_eq!(va, seg + 2 * MIB);
        assert_eq!(d.mem_info().unwrap().free, 8 * MIB);
        let p0 = d.create_page(4 * MIB).unwrap();
        let p1 = d.create_page(4 * MIB).unwrap();
        assert_eq!(d.create_page(4 * MIB), Err(VmmError::OutOfMemory));
        assert_eq!((d.live_pages(), d.page_bytes()), (2, 8 * MIB));
        assert_eq!(d.mem_info().unwrap().free, 0);
        assert_eq!(d.map(va, 4 * MIB, &p0), Ok(()));
        assert_eq!(
            d.map(va + 2 * MIB, 4 * MIB, &p1),
            Err(VmmError::Other(SimError::BadMapping { addr: va + 2 * MIB }))
        );
        assert_eq!(
            d.map(va + 38 * MIB, 4 * MIB, &p1),
            Err(VmmError::Other(SimError::BadMapping {
                addr: va + 38 * MIB
            }))
        );
        assert_eq!(
            d.map(va + 4 * MIB, 4 * MIB, &p0),
            Err(VmmError::Other(SimError::PageMismatch { page: 0 }))
        );
        assert_eq!(d.map(va + 4 * MIB, 4 * MIB, &p1), Ok(()));
        assert_eq!(d.mapped_bytes(), 8 * MIB);
        assert_eq!(
            d.release_address(va, 40 * MIB),
            Err(VmmError::Other(SimError::RangeInUse { addr: va }))
        );
        let (p0, e) = d.release_page(p0).unwrap_err();
        assert_eq!(e, VmmError::Other(SimError::PageMapped { page: 0 }));
        assert_eq!(
            d.unmap(va, 2 * MIB),
            Err(VmmError::Other(SimError::NotMapped { addr: va }))
        );
        assert_eq!(d.unmap(va, 4 * MIB), Ok(()));
        assert_eq!(d.unmap(va + 4 * MIB, 4 * MIB), Ok(()));
        assert_eq!(d.release_page(p0), Ok(()));
        assert_eq!(d.release_page(p1), Ok(()));
        assert_eq!(
            d.release_address(va, 20 * MIB),
            Err(VmmError::Other(SimError::UnknownRange { addr: va }))
        );
        assert_eq!(d.release_address(va, 40 * MIB), Ok(()));
        assert_eq!((d.live_pages(), d.mapped_bytes()), (0, 0));
        assert_eq!(d.reserved_ranges().count(), 0);
        assert_eq!(d.peak_outstanding_bytes(), 10 * MIB);
    }

    #[test]
    fn without_vmm_every_virtual_call_is_unsupported() {
        let mut d = SimDevice::new(10 * MIB).without_vmm();
        assert_eq!(d.reserve_address(512), Err(VmmError::Unsupported));
        assert_eq!(d.create_page(2 * MIB), Err(VmmError::Unsupported));
        assert_eq!(d.unmap(0, 2 * MIB), Err(VmmError::Unsupported));
        assert_eq!(d.release_address(0, 2 * MIB), Err(VmmError::Unsupported));
        // A page this device could not have made: refused, and handed back as it came.
        let page = SimPage {
            id: 0,
            bytes: 2 * MIB,
        };
        assert_eq!(d.map(0, 2 * MIB, &page), Err(VmmError::Unsupported));
        let (back, error) = d.release_page(page).unwrap_err();
        assert_eq!(error, VmmError::Unsupported);
        assert_eq!((back.id(), back.bytes), (0, 2 * MIB));
        assert_eq!((d.live_pages(), d.mapped_bytes()), (0, 0));
        assert_eq!(d.reserved_ranges().count(), 0);
        for call in [
            DeviceCall::ReserveAddress,
            DeviceCall::CreatePage,
            DeviceCall::Unmap,
            DeviceCall::ReleaseAddress,
            DeviceCall::Map,
            DeviceCall::ReleasePage,
        ] {
            assert_eq!(d.calls(call), 1, "{call:?} counted once");
        }
    }

    #[test]
    fn device_bytes_survive_a_host_round_trip_across_pages() {
        let mut d = SimDevice::new(64 * MIB);
        let seg = d.malloc(2 * MIB).unwrap();
        d.write_bytes(seg + 10, b"segment").unwrap();
        assert_eq!(d.read_bytes(seg + 10, 7).unwrap(), b"segment");
        let va = d.reserve_address(8 * MIB).unwrap();
        let (p0, p1) = (
            d.create_page(4 * MIB).unwrap(),
            d.create_page(4 * MIB).unwrap(),
        );
        d.map(va, 4 * MIB, &p0).unwrap();
        d.map(va + 4 * MIB, 4 * MIB, &p1).unwrap();
        // A write across the two pages.
        d.write_bytes(va + 4 * MIB - 3, b"across").unwrap();
        let mut host = d.alloc_host(8 * MIB).unwrap();
        d.copy_to_host(&mut host, va, 8 * MIB).unwrap();
        assert_eq!(host.read(4 * MIB - 3, 6), b"across");
        // New pages read as zeros; the copy back restores the bytes.
        for (addr, page) in [(va, p0), (va + 4 * MIB, p1)] {
            d.unmap(addr, 4 * MIB).unwrap();
            d.release_page(page).unwrap();
        }
        let (q0, q1) = (
            d.create_page(4 * MIB).unwrap(),
            d.create_page(4 * MIB).unwrap(),
        );
        d.map(va, 4 * MIB, &q0).unwrap();
        d.map(va + 4 * MIB, 4 * MIB, &q1).unwrap();
        assert_eq!(d.read_bytes(va + 4 * MIB - 3, 6).unwrap(), vec![0; 6]);
        d.copy_to_device(va, &host, 8 * MIB).unwrap();
        assert_eq!(d.read_bytes(va + 4 * MIB - 3, 6).unwrap(), b"across");
        assert_eq!(d.free_host(host), Ok(()));
        assert_eq!(d.live_host_buffers(), 0);
        // Unbacked addresses are refused; freeing forgets the bytes.
        assert!(d.read_bytes(va + 8 * MIB, 1).is_err());
        d.free(seg, 2 * MIB).unwrap();
        assert_eq!(d.held_content_bytes(), 2 * 4096);
    }
}
