//! A fake `libascendcl.so` for end-to-end tests: the ACL symbols `npu-runtime` uses, exported
//! with their C signatures (CANN's `acl_rt.h`; see docs/acl.md) over a small simulated device.
//!
//! The simulated device, per process (or per copy of this file loaded under another path, since
//! the dynamic loader gives each copy its own statics):
//! - `FAKE_ACL_DEVICES` devices (default 1), each with `FAKE_ACL_CAPACITY` bytes (default
//!   32 GiB), read on first use; [`fake_acl_reset`] starts over with new numbers;
//! - deterministic addresses: device `d`'s segments start at `0x1000_0000_0000 + d << 40`,
//!   2 MiB aligned, lowest free address first;
//! - ACL's sizes: `aclrtMalloc` charges `align32(size) + 32` bytes (no pad with the 1 GiB-page
//!   policies, 6 and 7), `aclrtMallocAlign32` charges `align32(size)`; out of capacity is 207001 with an `EL0004` message;
//! - memory calls need `aclInit` and a device set on the calling thread (`aclrtSetDevice`),
//!   as real ACL does, else 100001 / 107002;
//! - events complete only when a test says so ([`fake_acl_complete_all_events`]) or when the
//!   host waits for them (`aclrtSynchronizeEvent`, `aclrtSynchronizeDevice`); an event never
//!   recorded is not complete (torch_npu's `aclrtQueryEventStatus` polarity, COMPLETE = 1);
//! - virtual memory (expandable segments): `aclrtReserveMemAddress` hands out ranges of device
//!   `d` from `0x8000_0000_0000 + d << 40`, apart from the segments; `aclrtMallocPhysical` pages
//!   count against the same capacity as `aclrtMalloc` (and in `aclrtGetMemInfo`); every map,
//!   unmap and release is checked against the ranges, pages and mappings alive;
//! - device bytes: the contents of segments (`aclrtMalloc*`) and physical pages
//!   (`aclrtMallocPhysical`) are kept sparsely, in 4 KiB chunks made on the first write of a
//!   non-zero byte; unwritten bytes read as zeros, so memory never written costs no host memory.
//!   The bytes belong to the segment or the page (a page mapped elsewhere carries them) and go
//!   with it when it is freed; tests reach them with [`fake_acl_write_device`] and
//!   [`fake_acl_read_device`], and [`fake_acl_content_bytes`] says what they hold;
//! - host memory (`aclrtMallocHost`, `aclrtFreeHost`) is real, zeroed host memory, tracked per
//!   allocation; `aclrtMemcpy` copies between it and device bytes in all four directions, after
//!   checking every range;
//! - injectable error codes ([`fake_acl_fail_next`]), per-symbol call counters
//!   ([`fake_acl_calls`]), an ordered call log ([`fake_acl_call_log`]) and the same log with the
//!   arguments of `aclrtSetDevice`, the mallocs (size and policy), the VMM calls and the
//!   host-memory calls
//!   ([`fake_acl_call_details`]).
//!
//! With the `legacy-cann` feature the library lacks `aclrtMallocAlign32`,
//! `aclrtQueryEventStatus`, `aclrtCreateEventExWithFlag` and `aclsysGetCANNVersion`, like an
//! old CANN, so the runtime's
//! fallbacks can be tested. `aclsysGetCANNVersion` otherwise reports CANN 8.5.0 and driver
//! 25.5.0, or what a test sets ([`fake_acl_set_versions`]). With the
//! `no-vmm` feature it lacks the VMM symbols (`aclrtReserveMemAddress`, `aclrtReleaseMemAddress`,
//! `aclrtMallocPhysical`, `aclrtFreePhysical`, `aclrtMapMem`, `aclrtUnmapMem`,
//! `aclrtMemGetAllocationGranularity`), like a CANN older than virtual memory: `dlsym` of them
//! fails, so the runtime's "unsupported" path is the real one. Host memory and `aclrtMemcpy`
//! are in every build.
//!
//! Everything is std-only and lives behind one global mutex. No function here unwinds: state is
//! recovered from a poisoned lock and nothing else panics.
#![allow(non_snake_case)]
#![warn(clippy::undocumented_unsafe_blocks)]
// Without the VMM symbols their bookkeeping has no caller.
#![cfg_attr(feature = "no-vmm", allow(dead_code))]

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// `aclError`.
type AclCode = i32;

const ACL_SUCCESS: AclCode = 0;
const ACL_ERROR_INVALID_PARAM: AclCode = 100_000;
const ACL_ERROR_UNINITIALIZE: AclCode = 100_001;
const ACL_ERROR_REPEAT_INITIALIZE: AclCode = 100_002;
const ACL_ERROR_REPEAT_FINALIZE: AclCode = 100_037;
const ACL_ERROR_RT_PARAM_INVALID: AclCode = 107_000;
const ACL_ERROR_RT_INVALID_DEVICEID: AclCode = 107_001;
const ACL_ERROR_RT_CONTEXT_NULL: AclCode = 107_002;
const ACL_ERROR_RT_INVALID_HANDLE: AclCode = 107_017;
const ACL_ERROR_RT_MEMORY_ALLOCATION: AclCode = 207_001;

/// `aclrtPhysicalMemProp` values the fake accepts: `ACL_MEM_HANDLE_TYPE_NONE`,
/// `ACL_MEM_ALLOCATION_TYPE_PINNED`, `ACL_MEM_LOCATION_TYPE_DEVICE`.
const HANDLE_TYPE_NONE: u32 = 0;
const ALLOCATION_TYPE_PINNED: u32 = 0;
const LOCATION_TYPE_DEVICE: u32 = 1;
/// `aclrtMemAttr` kinds of device memory with 2 MiB pages: `ACL_HBM_MEM_HUGE`,
/// `ACL_HBM_MEM_NORMAL` (allocated as huge pages, CANN says), `ACL_MEM_NORMAL`, `ACL_MEM_HUGE`.
const MEM_ATTRS_2M: [u32; 4] = [4, 5, 12, 13];
/// `ACL_HBM_MEM_HUGE1G`, `ACL_MEM_HUGE1G`: 1 GiB pages.
const MEM_ATTRS_1G: [u32; 2] = [10, 14];
/// `ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM` and `_RECOMMENDED`.
const GRANULARITY_OPTIONS: [u32; 2] = [0, 1];

/// `ACL_HBM_MEM`, the attribute torch_npu passes to `aclrtGetMemInfo`.
const ACL_HBM_MEM: u32 = 1;
/// `ACL_EVENT_RECORDED_STATUS_COMPLETE` / `_NOT_READY`.
#[cfg(not(feature = "legacy-cann"))]
const RECORDED_COMPLETE: u32 = 1;
#[cfg(not(feature = "legacy-cann"))]
const RECORDED_NOT_READY: u32 = 0;
/// `ACL_EVENT_STATUS_COMPLETE` / `_NOT_READY` (the deprecated query's polarity).
const STATUS_COMPLETE: u32 = 0;
const STATUS_NOT_READY: u32 = 1;

const DEFAULT_CAPACITY: u64 = 32 << 30;
const DEFAULT_DEVICES: u32 = 1;
const BASE_ADDRESS: u64 = 0x1000_0000_0000;
const DEVICE_STRIDE: u64 = 1 << 40;
const SEGMENT_ALIGNMENT: u64 = 2 << 20;
/// Device `d`'s reserved ranges lie in `[VIRTUAL_BASE + d << 40, VIRTUAL_BASE + (d + 1) << 40)`.
const VIRTUAL_BASE: u64 = 0x8000_0000_0000;
/// Ranges of 1 GiB or more start on a 1 GiB boundary, smaller ones on 2 MiB (CANN aligns a
/// range of over 1 GiB to 1 GiB).
const HUGE1G: u64 = 1 << 30;
const PAGE_BASE: usize = 0x9000_0000;
const EVENT_BASE: usize = 0xE000_0000;
const STREAM_BASE: usize = 0x5000_0000;
/// Bytes per chunk of device contents.
const CHUNK: usize = 4096;
/// Alignment of `aclrtMallocHost` memory: the allocator's own, so large buffers come from
/// `calloc` and their pages are touched only when written.
const HOST_ALIGN: usize = 16;
/// The `aclrtMemcpyKind` values the fake copies.
const MEMCPY_HOST_TO_HOST: u32 = 0;
const MEMCPY_HOST_TO_DEVICE: u32 = 1;
const MEMCPY_DEVICE_TO_HOST: u32 = 2;
const MEMCPY_DEVICE_TO_DEVICE: u32 = 3;
/// Device-to-device copies move this many bytes at a time.
const COPY_BLOCK: usize = 64 << 10;
const OOM_MESSAGE: &str =
    "EL0004: Failed to allocate memory. Possible Cause: Available memory is insufficient.";

/// One simulated device.
#[derive(Default)]
struct Dev {
    /// Bytes charged by live allocations and physical pages.
    used: u64,
    /// Live allocations: address → charged size.
    allocations: BTreeMap<u64, u64>,
    /// Reserved virtual ranges: start → size.
    ranges: BTreeMap<u64, u64>,
    /// Mappings inside this device's ranges: start → (page handle, size).
    mappings: BTreeMap<u64, (usize, u64)>,
    /// Bytes mapped in this device's ranges.
    mapped_bytes: u64,
    /// Physical pages on this device (`location.id`), and their bytes.
    live_pages: u64,
    page_bytes: u64,
    /// The written bytes of live segments: start → contents (made on the first write).
    segment_contents: BTreeMap<u64, Sparse>,
}

/// One physical page (`aclrtDrvMemHandle`).
struct Page {
    /// The device it lives on (`location.id`).
    device: usize,
    size: u64,
    /// Where it is mapped, if it is.
    mapped_at: Option<u64>,
    /// Its written bytes.
    contents: Sparse,
}

/// Written device bytes of one segment or page, kept sparsely: 4 KiB chunks exist only while
/// they hold a non-zero byte, and everything else reads as zeros.
#[derive(Default)]
struct Sparse {
    chunks: BTreeMap<u64, Box<[u8; CHUNK]>>,
}

impl Sparse {
    /// Host memory held for these bytes (whole chunks).
    fn held_bytes(&self) -> u64 {
        self.chunks.len() as u64 * CHUNK as u64
    }

    /// Calls `f(chunk index, offset in the chunk, range of the buffer)` for each chunk that
    /// `[offset, offset + len)` touches. The caller checked that the end fits in `u64`.
    fn for_chunks(offset: u64, len: usize, mut f: impl FnMut(u64, usize, std::ops::Range<usize>)) {
        let mut done = 0usize;
        while done < len {
            let at = offset + done as u64;
            let (index, within) = (at / CHUNK as u64, (at % CHUNK as u64) as usize);
            let n = (CHUNK - within).min(len - done);
            f(index, within, done..done + n);
            done += n;
        }
    }

    /// Writes `data` at `offset`. Zeros written where no chunk exists make none, and a chunk
    /// that holds only zeros afterwards is dropped.
    fn write(&mut self, offset: u64, data: &[u8]) {
        Self::for_chunks(offset, data.len(), |index, within, range| {
            let piece = &data[range];
            match self.chunks.entry(index) {
                Entry::Occupied(mut chunk) => {
                    chunk.get_mut()[within..within + piece.len()].copy_from_slice(piece);
                    if is_zero(&chunk.get()[..]) {
                        chunk.remove();
                    }
                }
                Entry::Vacant(slot) => {
                    if !is_zero(piece) {
                        let mut chunk = Box::new([0u8; CHUNK]);
                        chunk[within..within + piece.len()].copy_from_slice(piece);
                        slot.insert(chunk);
                    }
                }
            }
        });
    }

    /// Reads `out.len()` bytes at `offset` into `out`.
    fn read(&self, offset: u64, out: &mut [u8]) {
        Self::for_chunks(offset, out.len(), |index, within, range| {
            let n = range.len();
            match self.chunks.get(&index) {
                Some(chunk) => out[range].copy_from_slice(&chunk[within..within + n]),
                None => zero(&mut out[range]),
            }
        });
    }
}

/// Whether every byte is 0.
fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// Sets `bytes` to 0, writing only when one is not: unwritten device memory read into fresh
/// (zeroed, untouched) host memory touches none of its pages.
fn zero(bytes: &mut [u8]) {
    if !is_zero(bytes) {
        bytes.fill(0);
    }
}

/// What holds some device bytes: a segment (by device and start) or a physical page (by
/// handle).
#[derive(Clone, Copy)]
enum Backing {
    Segment { device: usize, start: u64 },
    Page(usize),
}

/// One piece of a device range: `len` bytes at `offset` in `backing`.
struct Piece {
    backing: Backing,
    offset: u64,
    len: usize,
}

/// One event handle.
struct Ev {
    device: i32,
    recorded: bool,
    complete: bool,
}

/// The whole simulated runtime.
struct State {
    /// Bumped by every reset, so threads forget the device they had set.
    generation: u64,
    capacity: u64,
    devices: Vec<Dev>,
    initialized: bool,
    events: HashMap<usize, Ev>,
    next_event: usize,
    streams: Vec<usize>,
    next_stream: usize,
    pages: HashMap<usize, Page>,
    next_page: usize,
    calls: HashMap<&'static str, u64>,
    log: Vec<&'static str>,
    /// The log with arguments where a call records them.
    details: Vec<String>,
    failures: HashMap<String, VecDeque<AclCode>>,
    /// What `aclrtGetDeviceCount` reports instead of the real count (a broken library).
    reported_devices: Option<u32>,
    /// What `aclsysGetCANNVersion` reports for CANN and for the driver (`None`: 207000).
    versions: [Option<String>; 2],
    /// What `aclrtGetSocName` returns (`None`: null). Leaked, so that a pointer handed out
    /// stays valid as the real library's does.
    soc_name: Option<&'static CStr>,
    /// Live `aclrtMallocHost` memory: address → size. A reset forgets it without freeing it,
    /// so host memory a test still holds stays valid.
    host: BTreeMap<u64, u64>,
}

impl State {
    fn new(capacity: u64, devices: u32, generation: u64) -> State {
        State {
            generation,
            capacity,
            devices: (0..devices).map(|_| Dev::default()).collect(),
            initialized: false,
            events: HashMap::new(),
            next_event: 0,
            streams: Vec::new(),
            next_stream: 0,
            pages: HashMap::new(),
            next_page: 0,
            calls: HashMap::new(),
            log: Vec::new(),
            details: Vec::new(),
            failures: HashMap::new(),
            reported_devices: None,
            versions: [
                Some(DEFAULT_CANN_VERSION.to_owned()),
                Some(DEFAULT_DRIVER_VERSION.to_owned()),
            ],
            soc_name: Some(DEFAULT_SOC_NAME),
            host: BTreeMap::new(),
        }
    }

    fn from_env() -> State {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let capacity = var("FAKE_ACL_CAPACITY").unwrap_or(DEFAULT_CAPACITY);
        let devices = var("FAKE_ACL_DEVICES")
            .and_then(|d| u32::try_from(d).ok())
            .unwrap_or(DEFAULT_DEVICES);
        State::new(capacity, devices, 0)
    }

    /// Counts and logs a call of `name` (with `args` in the detailed log, if any), and returns
    /// an injected failure if one is due.
    fn enter(&mut self, name: &'static str, args: Option<String>) -> Option<AclCode> {
        *self.calls.entry(name).or_insert(0) += 1;
        self.log.push(name);
        self.details.push(match args {
            Some(args) => format!("{name}({args})"),
            None => name.to_owned(),
        });
        let code = self.failures.get_mut(name)?.pop_front();
        if let Some(code) = code {
            set_error_message(Some(&format!("fake_acl: injected error {code} in {name}")));
        }
        code
    }

    /// The calling thread's device, if it set one since the last reset.
    fn current(&self) -> Result<i32, AclCode> {
        if !self.initialized {
            return Err(ACL_ERROR_UNINITIALIZE);
        }
        match CURRENT_DEVICE.with(Cell::get) {
            Some((generation, device)) if generation == self.generation => Ok(device),
            _ => Err(ACL_ERROR_RT_CONTEXT_NULL),
        }
    }

    fn device_mut(&mut self, device: i32) -> &mut Dev {
        // `current` only ever holds devices that `aclrtSetDevice` checked.
        &mut self.devices[device as usize]
    }

    /// Allocates `charged` bytes on `device` at the lowest free 2 MiB-aligned address; a size
    /// that does not fit (even one past `u64::MAX`, `None`) is out of memory.
    fn allocate(&mut self, device: i32, charged: Option<u64>) -> Result<u64, AclCode> {
        let out_of_memory = || {
            set_error_message(Some(OOM_MESSAGE));
            Err(ACL_ERROR_RT_MEMORY_ALLOCATION)
        };
        let capacity = self.capacity;
        let dev = self.device_mut(device);
        let Some(charged) =
            charged.filter(|&c| dev.used.checked_add(c).is_some_and(|u| u <= capacity))
        else {
            return out_of_memory();
        };
        let mut addr = BASE_ADDRESS + device as u64 * DEVICE_STRIDE;
        for (&start, &size) in &dev.allocations {
            if addr.checked_add(charged).is_some_and(|end| end <= start) {
                break;
            }
            addr = (start + size).next_multiple_of(SEGMENT_ALIGNMENT);
        }
        if addr.checked_add(charged).is_none() {
            return out_of_memory();
        }
        dev.allocations.insert(addr, charged);
        dev.used += charged;
        Ok(addr)
    }

    /// Reserves `size` bytes of `device`'s virtual region at the lowest free address (2 MiB
    /// aligned, 1 GiB from 1 GiB up); a range that does not fit is 207001.
    fn reserve(&mut self, device: i32, size: u64) -> Result<u64, AclCode> {
        let no_room = || {
            set_error_message(Some(&format!(
                "fake_acl: no virtual address range of {size} bytes left"
            )));
            Err(ACL_ERROR_RT_MEMORY_ALLOCATION)
        };
        let region = (device as u64)
            .checked_mul(DEVICE_STRIDE)
            .and_then(|offset| VIRTUAL_BASE.checked_add(offset));
        let Some(start) = region else {
            return no_room();
        };
        let Some(limit) = start.checked_add(DEVICE_STRIDE) else {
            return no_room();
        };
        let alignment = if size >= HUGE1G {
            HUGE1G
        } else {
            SEGMENT_ALIGNMENT
        };
        let dev = self.device_mut(device);
        let mut addr = start;
        for (&range, &len) in &dev.ranges {
            if addr.checked_add(size).is_some_and(|end| end <= range) {
                break;
            }
            match range
                .checked_add(len)
                .and_then(|end| end.checked_next_multiple_of(alignment))
            {
                Some(next) => addr = next,
                None => return no_room(),
            }
        }
        if addr.checked_add(size).is_none_or(|end| end > limit) {
            return no_room();
        }
        dev.ranges.insert(addr, size);
        Ok(addr)
    }

    /// The pieces of device memory behind `[addr, addr + len)`: inside one live segment, or
    /// across mappings that follow each other without a gap. Anything else is 107000.
    fn device_pieces(&self, addr: u64, len: usize) -> Result<Vec<Piece>, AclCode> {
        let invalid = ACL_ERROR_RT_PARAM_INVALID;
        let end = addr.checked_add(len as u64).ok_or(invalid)?;
        for (device, dev) in self.devices.iter().enumerate() {
            // Segments and mappings never pass `u64::MAX` (`allocate` and `range_holding` check
            // their ends).
            if let Some((&start, &size)) = dev.allocations.range(..=addr).next_back()
                && addr < start + size
            {
                if end > start + size {
                    return Err(invalid);
                }
                let backing = Backing::Segment { device, start };
                let offset = addr - start;
                return Ok(vec![Piece {
                    backing,
                    offset,
                    len,
                }]);
            }
            let Some((&first, &(key, size))) = dev.mappings.range(..=addr).next_back() else {
                continue;
            };
            if addr >= first + size {
                continue;
            }
            let (mut start, mut key, mut size) = (first, key, size);
            let mut pieces = Vec::new();
            let mut at = addr;
            loop {
                let n = (start + size).min(end) - at;
                pieces.push(Piece {
                    backing: Backing::Page(key),
                    offset: at - start,
                    len: n as usize,
                });
                at += n;
                if at >= end {
                    return Ok(pieces);
                }
                // The next bytes must be the start of the next mapping.
                match dev.mappings.get(&at) {
                    Some(&(next_key, next_size)) => (start, key, size) = (at, next_key, next_size),
                    None => return Err(invalid),
                }
            }
        }
        Err(invalid)
    }

    /// The written bytes of `backing`, if it has any.
    fn contents(&self, backing: Backing) -> Option<&Sparse> {
        match backing {
            Backing::Segment { device, start } => self.devices[device].segment_contents.get(&start),
            Backing::Page(key) => self.pages.get(&key).map(|p| &p.contents),
        }
    }

    /// The written bytes of `backing`, made empty if it has none yet.
    fn contents_mut(&mut self, backing: Backing) -> Option<&mut Sparse> {
        match backing {
            Backing::Segment { device, start } => Some(
                self.devices[device]
                    .segment_contents
                    .entry(start)
                    .or_default(),
            ),
            Backing::Page(key) => self.pages.get_mut(&key).map(|p| &mut p.contents),
        }
    }

    /// Reads device memory at `addr` into `out` (zeros where never written); nothing is read
    /// unless the whole range is device memory.
    fn read_device(&self, addr: u64, out: &mut [u8]) -> Result<(), AclCode> {
        let mut done = 0usize;
        for piece in self.device_pieces(addr, out.len())? {
            let part = &mut out[done..done + piece.len];
            match self.contents(piece.backing) {
                Some(contents) => contents.read(piece.offset, part),
                None => zero(part),
            }
            done += piece.len;
        }
        Ok(())
    }

    /// Writes `data` to device memory at `addr`; nothing is written unless the whole range is
    /// device memory.
    fn write_device(&mut self, addr: u64, data: &[u8]) -> Result<(), AclCode> {
        let mut done = 0usize;
        for piece in self.device_pieces(addr, data.len())? {
            let part = &data[done..done + piece.len];
            if let Some(contents) = self.contents_mut(piece.backing) {
                contents.write(piece.offset, part);
            }
            done += piece.len;
        }
        Ok(())
    }

    /// Copies `len` bytes of device memory from `src` to `dst` (both checked first), as
    /// `memmove` does when they overlap.
    fn copy_device(&mut self, dst: u64, src: u64, len: usize) -> Result<(), AclCode> {
        self.device_pieces(src, len)?;
        self.device_pieces(dst, len)?;
        let mut buffer = vec![0u8; len.min(COPY_BLOCK)];
        let blocks = len.div_ceil(COPY_BLOCK);
        // Both ranges are device memory, so `src + len` and `dst + len` fit in `u64`. With the
        // destination above an overlapping source, copy from the top down.
        let backwards = dst > src && dst < src + len as u64;
        for i in 0..blocks {
            let block = if backwards { blocks - 1 - i } else { i };
            let offset = block * COPY_BLOCK;
            let part = &mut buffer[..COPY_BLOCK.min(len - offset)];
            self.read_device(src + offset as u64, part)?;
            self.write_device(dst + offset as u64, part)?;
        }
        Ok(())
    }

    /// Whether `[addr, addr + len)` lies inside one live `aclrtMallocHost` allocation.
    fn host_holds(&self, addr: u64, len: usize) -> bool {
        let Some(end) = addr.checked_add(len as u64) else {
            return false;
        };
        self.host
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, &size)| end <= start + size)
    }

    /// Whether any byte of `[addr, addr + len)` is device memory (a segment or a mapping).
    fn touches_device(&self, addr: u64, len: usize) -> bool {
        let end = addr.saturating_add(len as u64);
        self.devices.iter().any(|dev| {
            let overlaps = |(&start, &size): (&u64, &u64)| start < end && addr < start + size;
            dev.allocations
                .range(..end)
                .next_back()
                .is_some_and(overlaps)
                || dev
                    .mappings
                    .range(..end)
                    .next_back()
                    .is_some_and(|(start, (_, size))| overlaps((start, size)))
        })
    }

    /// Host memory held for the written bytes of `device`'s segments and pages.
    fn content_bytes(&self, device: usize) -> u64 {
        let Some(dev) = self.devices.get(device) else {
            return 0;
        };
        let segments: u64 = dev.segment_contents.values().map(Sparse::held_bytes).sum();
        let pages: u64 = self
            .pages
            .values()
            .filter(|p| p.device == device)
            .map(|p| p.contents.held_bytes())
            .sum();
        segments + pages
    }

    /// The device whose reserved range holds `[addr, addr + size)`, if one does.
    fn range_holding(&self, addr: u64, size: u64) -> Option<usize> {
        let end = addr.checked_add(size)?;
        self.devices.iter().position(|dev| {
            dev.ranges
                .range(..=addr)
                .next_back()
                .is_some_and(|(&start, &len)| start.checked_add(len).is_some_and(|e| end <= e))
        })
    }
}

/// `aclrtPhysicalMemProp` (32 bytes, C layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PhysicalMemProp {
    /// `handleType`.
    pub handle_type: u32,
    /// `allocationType`.
    pub allocation_type: u32,
    /// `memAttr`.
    pub mem_attr: u32,
    /// `location.id`.
    pub location_id: u32,
    /// `location.type`.
    pub location_type: u32,
    /// `reserve`.
    pub reserve: u64,
}

impl PhysicalMemProp {
    /// Reads the caller's properties.
    ///
    /// # Safety
    /// `prop` must be null or valid for a read of an `aclrtPhysicalMemProp`.
    unsafe fn read(prop: *const PhysicalMemProp) -> Option<PhysicalMemProp> {
        if prop.is_null() {
            return None;
        }
        // SAFETY: non-null and readable per the caller's contract; every field is a plain
        // integer, so any bytes are a valid value.
        Some(unsafe { prop.read_unaligned() })
    }

    /// The properties as the detailed log shows them.
    fn describe(prop: Option<&PhysicalMemProp>) -> String {
        match prop {
            None => "prop=NULL".to_owned(),
            Some(p) => format!(
                "prop={{handleType={}, allocationType={}, memAttr={}, location={{id={}, type={}}}, \
                 reserve={}}}",
                p.handle_type,
                p.allocation_type,
                p.mem_attr,
                p.location_id,
                p.location_type,
                p.reserve
            ),
        }
    }

    /// The page granularity of valid properties for a fake with `devices` devices, else
    /// `None` (pinned device memory without an exportable handle, of a kind the fake knows, on a
    /// device that exists, with `reserve` 0).
    fn granularity(&self, devices: usize) -> Option<u64> {
        let valid = self.handle_type == HANDLE_TYPE_NONE
            && self.allocation_type == ALLOCATION_TYPE_PINNED
            && self.location_type == LOCATION_TYPE_DEVICE
            && (self.location_id as usize) < devices
            && self.reserve == 0;
        if !valid {
            None
        } else if MEM_ATTRS_2M.contains(&self.mem_attr) {
            Some(SEGMENT_ALIGNMENT)
        } else if MEM_ATTRS_1G.contains(&self.mem_attr) {
            Some(HUGE1G)
        } else {
            None
        }
    }
}

thread_local! {
    /// The device this thread set, tagged with the state's generation.
    static CURRENT_DEVICE: Cell<Option<(u64, i32)>> = const { Cell::new(None) };
    /// The thread's recent error text, as `aclGetRecentErrMsg` returns it.
    static ERROR_MESSAGE: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_error_message(text: Option<&str>) {
    let text = text.and_then(|t| CString::new(t).ok());
    ERROR_MESSAGE.with(|m| *m.borrow_mut() = text);
}

fn state() -> MutexGuard<'static, State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE
        .get_or_init(|| Mutex::new(State::from_env()))
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs one ACL call: counts it, applies an injected failure, else runs `body`.
fn call(name: &'static str, body: impl FnOnce(&mut State) -> AclCode) -> AclCode {
    call_with_args(name, None, body)
}

/// [`call`], recording `args` in the detailed log.
fn call_with_args(
    name: &'static str,
    args: Option<String>,
    body: impl FnOnce(&mut State) -> AclCode,
) -> AclCode {
    let mut s = state();
    if let Some(code) = s.enter(name, args) {
        return code;
    }
    set_error_message(None);
    body(&mut s)
}

/// Runs a call that needs the thread's current device.
fn device_call(name: &'static str, body: impl FnOnce(&mut State, i32) -> AclCode) -> AclCode {
    device_call_with_args(name, None, body)
}

/// [`device_call`], recording `args` in the detailed log.
fn device_call_with_args(
    name: &'static str,
    args: Option<String>,
    body: impl FnOnce(&mut State, i32) -> AclCode,
) -> AclCode {
    call_with_args(name, args, |s| match s.current() {
        Ok(device) => body(s, device),
        Err(code) => code,
    })
}

/// `size` rounded up to 32 bytes, `None` past `u64::MAX` (no arithmetic here may panic: a panic
/// cannot cross `extern "C"`).
fn align32(size: usize) -> Option<u64> {
    (size as u64).checked_next_multiple_of(32)
}

fn malloc_impl(
    name: &'static str,
    dev_ptr: *mut *mut c_void,
    size: usize,
    policy: u32,
    charged: Option<u64>,
) -> AclCode {
    let args = format!("size={size}, policy={policy}");
    device_call_with_args(name, Some(args), |s, device| {
        if dev_ptr.is_null() || size == 0 {
            return ACL_ERROR_INVALID_PARAM;
        }
        match s.allocate(device, charged) {
            Ok(addr) => {
                // SAFETY: `dev_ptr` is non-null and, per the C contract, points to a writable
                // `void*`.
                unsafe { dev_ptr.write(addr as usize as *mut c_void) };
                ACL_SUCCESS
            }
            Err(code) => code,
        }
    })
}

/// Writes `value` through `out` when it is non-null; `INVALID_PARAM` otherwise.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn write_out<T>(out: *mut T, value: T) -> AclCode {
    if out.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    // SAFETY: non-null, and valid for writes per the caller's contract.
    unsafe { out.write(value) };
    ACL_SUCCESS
}

// ---- ACL symbols ----------------------------------------------------------------------------

/// `aclInit(configPath)`: 0 the first time, 100002 after.
#[unsafe(no_mangle)]
pub extern "C" fn aclInit(_config_path: *const c_char) -> AclCode {
    call("aclInit", |s| {
        if s.initialized {
            ACL_ERROR_REPEAT_INITIALIZE
        } else {
            s.initialized = true;
            ACL_SUCCESS
        }
    })
}

/// `aclFinalize()`.
#[unsafe(no_mangle)]
pub extern "C" fn aclFinalize() -> AclCode {
    call("aclFinalize", |s| {
        if s.initialized {
            s.initialized = false;
            ACL_SUCCESS
        } else {
            ACL_ERROR_REPEAT_FINALIZE
        }
    })
}

/// `aclrtSetDevice(deviceId)`: binds the device to the calling thread.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtSetDevice(device_id: i32) -> AclCode {
    let args = format!("deviceId={device_id}");
    call_with_args("aclrtSetDevice", Some(args), |s| {
        if !s.initialized {
            return ACL_ERROR_UNINITIALIZE;
        }
        if device_id < 0 || device_id as usize >= s.devices.len() {
            return ACL_ERROR_RT_INVALID_DEVICEID;
        }
        let generation = s.generation;
        CURRENT_DEVICE.with(|c| c.set(Some((generation, device_id))));
        ACL_SUCCESS
    })
}

/// `aclrtResetDevice(deviceId)`.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtResetDevice(device_id: i32) -> AclCode {
    call("aclrtResetDevice", |s| {
        if device_id < 0 || device_id as usize >= s.devices.len() {
            return ACL_ERROR_RT_INVALID_DEVICEID;
        }
        CURRENT_DEVICE.with(|c| c.set(None));
        ACL_SUCCESS
    })
}

/// `aclrtGetDevice(&deviceId)`.
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtGetDevice(device_id: *mut i32) -> AclCode {
    device_call("aclrtGetDevice", |_, device| {
        // SAFETY: per the C contract `device_id` is null or a writable `int32_t`.
        unsafe { write_out(device_id, device) }
    })
}

/// `aclrtGetDeviceCount(&count)`: the number of devices, or what `fake_acl_report_devices`
/// set.
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtGetDeviceCount(count: *mut u32) -> AclCode {
    call("aclrtGetDeviceCount", |s| {
        if !s.initialized {
            return ACL_ERROR_UNINITIALIZE;
        }
        let reported = s.reported_devices.unwrap_or(s.devices.len() as u32);
        // SAFETY: per the C contract `count` is null or a writable `uint32_t`.
        unsafe { write_out(count, reported) }
    })
}

/// `aclrtMalloc(&p, size, policy)`: charges `align32(size) + 32` bytes, as ACL pads.
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtMalloc(
    dev_ptr: *mut *mut c_void,
    size: usize,
    policy: u32,
) -> AclCode {
    // The 1 GiB-page policies (HUGE1G_ONLY and its P2P form) get no pad.
    let pad = if matches!(policy, 6 | 7) { 0 } else { 32 };
    malloc_impl(
        "aclrtMalloc",
        dev_ptr,
        size,
        policy,
        align32(size).and_then(|a| a.checked_add(pad)),
    )
}

/// `aclrtMallocAlign32(&p, size, policy)`: charges `align32(size)` bytes, no padding.
#[cfg(not(feature = "legacy-cann"))]
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtMallocAlign32(
    dev_ptr: *mut *mut c_void,
    size: usize,
    policy: u32,
) -> AclCode {
    malloc_impl("aclrtMallocAlign32", dev_ptr, size, policy, align32(size))
}

/// `aclrtFree(p)`: frees at once, no synchronization; an unknown address is 107000.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtFree(dev_ptr: *mut c_void) -> AclCode {
    device_call("aclrtFree", |s, device| {
        let addr = dev_ptr as usize as u64;
        let dev = s.device_mut(device);
        match dev.allocations.remove(&addr) {
            Some(size) => {
                dev.used -= size;
                dev.segment_contents.remove(&addr);
                ACL_SUCCESS
            }
            None => ACL_ERROR_RT_PARAM_INVALID,
        }
    })
}

/// `aclrtGetMemInfo(attr, &free, &total)`: HBM reports capacity; other attributes 0/0.
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtGetMemInfo(
    attr: u32,
    free: *mut usize,
    total: *mut usize,
) -> AclCode {
    device_call("aclrtGetMemInfo", |s, device| {
        let capacity = s.capacity;
        let dev = s.device_mut(device);
        let (f, t) = if attr == ACL_HBM_MEM {
            (capacity.saturating_sub(dev.used), capacity)
        } else {
            (0, 0)
        };
        // SAFETY: per the C contract both are null or writable `size_t`s.
        let code = unsafe { write_out(free, f as usize) };
        if code != ACL_SUCCESS {
            return code;
        }
        // SAFETY: as above.
        unsafe { write_out(total, t as usize) }
    })
}

/// `aclrtSynchronizeDevice()`: completes every recorded event of the current device.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtSynchronizeDevice() -> AclCode {
    device_call("aclrtSynchronizeDevice", |s, device| {
        for ev in s.events.values_mut() {
            if ev.device == device && ev.recorded {
                ev.complete = true;
            }
        }
        ACL_SUCCESS
    })
}

fn create_event(name: &'static str, event: *mut *mut c_void) -> AclCode {
    device_call(name, |s, device| {
        s.next_event += 1;
        let handle = EVENT_BASE + s.next_event * 16;
        // SAFETY: per the C contract `event` is null or a writable `aclrtEvent`.
        let code = unsafe { write_out(event, handle as *mut c_void) };
        if code == ACL_SUCCESS {
            s.events.insert(
                handle,
                Ev {
                    device,
                    recorded: false,
                    complete: false,
                },
            );
        }
        code
    })
}

/// `aclrtCreateEventWithFlag(&event, flag)`.
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtCreateEventWithFlag(event: *mut *mut c_void, _flag: u32) -> AclCode {
    create_event("aclrtCreateEventWithFlag", event)
}

/// `aclrtCreateEventExWithFlag(&event, flag)`: newer CANN's event, which torch_npu prefers
/// when the library exports it (not in the `legacy-cann` build). The fake's events are the same
/// either way.
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[cfg(not(feature = "legacy-cann"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtCreateEventExWithFlag(
    event: *mut *mut c_void,
    _flag: u32,
) -> AclCode {
    create_event("aclrtCreateEventExWithFlag", event)
}

/// `aclrtCreateEvent(&event)`.
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtCreateEvent(event: *mut *mut c_void) -> AclCode {
    create_event("aclrtCreateEvent", event)
}

/// Runs `body` on the event behind `event`, or returns 107017 for an unknown handle.
fn with_event(
    name: &'static str,
    event: *mut c_void,
    body: impl FnOnce(&mut Ev) -> AclCode,
) -> AclCode {
    call(name, |s| match s.events.get_mut(&(event as usize)) {
        Some(ev) => body(ev),
        None => ACL_ERROR_RT_INVALID_HANDLE,
    })
}

/// `aclrtRecordEvent(event, stream)`: the event is pending until completed.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtRecordEvent(event: *mut c_void, stream: *mut c_void) -> AclCode {
    call("aclrtRecordEvent", |s| {
        if !stream.is_null() && !s.streams.contains(&(stream as usize)) {
            return ACL_ERROR_RT_PARAM_INVALID;
        }
        match s.events.get_mut(&(event as usize)) {
            Some(ev) => {
                ev.recorded = true;
                ev.complete = false;
                ACL_SUCCESS
            }
            None => ACL_ERROR_RT_INVALID_HANDLE,
        }
    })
}

/// `aclrtQueryEventStatus(event, &status)`: COMPLETE = 1 once recorded and completed.
#[cfg(not(feature = "legacy-cann"))]
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtQueryEventStatus(event: *mut c_void, status: *mut u32) -> AclCode {
    with_event("aclrtQueryEventStatus", event, |ev| {
        let value = if ev.recorded && ev.complete {
            RECORDED_COMPLETE
        } else {
            RECORDED_NOT_READY
        };
        // SAFETY: per the C contract `status` is null or a writable enum (4-byte int).
        unsafe { write_out(status, value) }
    })
}

/// `aclrtQueryEvent(event, &status)` (deprecated): COMPLETE = 0.
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtQueryEvent(event: *mut c_void, status: *mut u32) -> AclCode {
    with_event("aclrtQueryEvent", event, |ev| {
        let value = if ev.recorded && !ev.complete {
            STATUS_NOT_READY
        } else {
            STATUS_COMPLETE
        };
        // SAFETY: per the C contract `status` is null or a writable enum (4-byte int).
        unsafe { write_out(status, value) }
    })
}

/// `aclrtSynchronizeEvent(event)`: the host waits, so the event completes.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtSynchronizeEvent(event: *mut c_void) -> AclCode {
    with_event("aclrtSynchronizeEvent", event, |ev| {
        if ev.recorded {
            ev.complete = true;
        }
        ACL_SUCCESS
    })
}

/// `aclrtDestroyEvent(event)`.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtDestroyEvent(event: *mut c_void) -> AclCode {
    call("aclrtDestroyEvent", |s| {
        match s.events.remove(&(event as usize)) {
            Some(_) => ACL_SUCCESS,
            None => ACL_ERROR_RT_INVALID_HANDLE,
        }
    })
}

/// `aclrtCreateStream(&stream)`.
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtCreateStream(stream: *mut *mut c_void) -> AclCode {
    device_call("aclrtCreateStream", |s, _| {
        s.next_stream += 1;
        let handle = STREAM_BASE + s.next_stream * 16;
        // SAFETY: per the C contract `stream` is null or a writable `aclrtStream`.
        let code = unsafe { write_out(stream, handle as *mut c_void) };
        if code == ACL_SUCCESS {
            s.streams.push(handle);
        }
        code
    })
}

/// `aclrtDestroyStream(stream)`.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtDestroyStream(stream: *mut c_void) -> AclCode {
    call("aclrtDestroyStream", |s| {
        let before = s.streams.len();
        s.streams.retain(|&h| h != stream as usize);
        if s.streams.len() < before {
            ACL_SUCCESS
        } else {
            ACL_ERROR_RT_INVALID_HANDLE
        }
    })
}

/// `aclrtSynchronizeStream(stream)`: completes the current device's recorded events.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtSynchronizeStream(_stream: *mut c_void) -> AclCode {
    device_call("aclrtSynchronizeStream", |s, device| {
        for ev in s.events.values_mut() {
            if ev.device == device && ev.recorded {
                ev.complete = true;
            }
        }
        ACL_SUCCESS
    })
}

// ---- host memory and copies (in every build) -------------------------------------------------

/// `aclrtMallocHost(&hostPtr, size)`: `size` bytes of zeroed host memory (real memory, from the
/// global allocator), tracked until `aclrtFreeHost`. A null pointer or `size` 0: 100000. Memory
/// the host cannot give: 207001.
///
/// # Safety
/// `host_ptr` must be null or valid for a write of a `void*` (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtMallocHost(host_ptr: *mut *mut c_void, size: usize) -> AclCode {
    let args = format!("size={size}");
    device_call_with_args("aclrtMallocHost", Some(args), |s, _| {
        if host_ptr.is_null() || size == 0 {
            return ACL_ERROR_INVALID_PARAM;
        }
        let no_memory = || {
            set_error_message(Some(&format!("fake_acl: no host memory for {size} bytes")));
            ACL_ERROR_RT_MEMORY_ALLOCATION
        };
        let Ok(layout) = Layout::from_size_align(size, HOST_ALIGN) else {
            return no_memory();
        };
        // SAFETY: the layout has a non-zero size.
        let memory = unsafe { std::alloc::alloc_zeroed(layout) };
        if memory.is_null() {
            return no_memory();
        }
        s.host.insert(memory as usize as u64, size as u64);
        // SAFETY: `host_ptr` is non-null and, per the C contract, a writable `void*`.
        unsafe { write_out(host_ptr, memory.cast::<c_void>()) }
    })
}

/// `aclrtFreeHost(hostPtr)`: frees memory from `aclrtMallocHost`. Not the start of a live host
/// allocation: 107000.
///
/// # Safety
/// `host_ptr` must be a pointer `aclrtMallocHost` returned (or any value that is not the start
/// of a live host allocation, which is refused); the C contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtFreeHost(host_ptr: *mut c_void) -> AclCode {
    let addr = host_ptr as usize as u64;
    let args = format!("hostPtr={addr:#x}");
    device_call_with_args("aclrtFreeHost", Some(args), |s, _| {
        let Some(size) = s.host.remove(&addr) else {
            return ACL_ERROR_RT_PARAM_INVALID;
        };
        // The same layout `aclrtMallocHost` made, so it is valid.
        let Ok(layout) = Layout::from_size_align(size as usize, HOST_ALIGN) else {
            return ACL_ERROR_RT_PARAM_INVALID;
        };
        // SAFETY: `host_ptr` starts a live allocation that `aclrtMallocHost` made with this
        // layout (it was in the table, and is now out of it, so it is freed once); the pointer
        // is the one handed out, so it carries the allocation's provenance.
        unsafe { std::alloc::dealloc(host_ptr.cast::<u8>(), layout) };
        ACL_SUCCESS
    })
}

/// `aclrtMemcpy(dst, destMax, src, count, kind)`: a synchronous copy, for the four kinds
/// HOST_TO_HOST (0), HOST_TO_DEVICE (1), DEVICE_TO_HOST (2) and DEVICE_TO_DEVICE (3).
///
/// Null pointers, `count` above `destMax` or another kind: 100000. A device range must lie
/// inside one live segment or across mappings that follow each other without a gap; a host
/// range of a host-device copy inside one live `aclrtMallocHost` allocation; a host-to-host copy
/// takes any host memory but no device memory. Otherwise 107000, and nothing is copied. `count` 0
/// copies nothing. Device bytes are read and written as [`fake_acl_read_device`] and
/// [`fake_acl_write_device`] do.
///
/// # Safety
/// For HOST_TO_HOST, `src` must be valid for reads and `dst` for writes of `count` bytes (the C
/// contract); the other kinds' host ranges are checked.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtMemcpy(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: u32,
) -> AclCode {
    let (to, from) = (dst as usize as u64, src as usize as u64);
    let args =
        format!("dst={to:#x}, destMax={dest_max}, src={from:#x}, count={count}, kind={kind}");
    device_call_with_args("aclrtMemcpy", Some(args), |s, _| {
        if dst.is_null() || src.is_null() || count > dest_max || kind > MEMCPY_DEVICE_TO_DEVICE {
            return ACL_ERROR_INVALID_PARAM;
        }
        if count == 0 {
            return ACL_SUCCESS;
        }
        let result = match kind {
            MEMCPY_HOST_TO_HOST => {
                if s.touches_device(to, count) || s.touches_device(from, count) {
                    return ACL_ERROR_RT_PARAM_INVALID;
                }
                // SAFETY: per the C contract both ranges are valid host memory of `count`
                // bytes; `copy` allows them to overlap.
                unsafe { std::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), count) };
                Ok(())
            }
            MEMCPY_HOST_TO_DEVICE => {
                if !s.host_holds(from, count) {
                    return ACL_ERROR_RT_PARAM_INVALID;
                }
                // SAFETY: the range lies inside a live allocation of this fake's
                // `aclrtMallocHost`, which stays allocated while the state is locked (only
                // `aclrtFreeHost` frees it); `src` is the caller's pointer into it.
                let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), count) };
                s.write_device(to, data)
            }
            MEMCPY_DEVICE_TO_HOST => {
                if !s.host_holds(to, count) {
                    return ACL_ERROR_RT_PARAM_INVALID;
                }
                // SAFETY: as above, for writes; device bytes live in the fake's own chunks,
                // never in host allocations, so nothing else refers to these bytes here.
                let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), count) };
                s.read_device(from, out)
            }
            _ => s.copy_device(to, from, count),
        };
        result.err().unwrap_or(ACL_SUCCESS)
    })
}

/// The chip `aclrtGetSocName` names until a test sets another: one that torch_npu pads for.
const DEFAULT_SOC_NAME: &CStr = c"Ascend910B1";

/// `aclrtGetSocName()`: the chip's name ([`fake_acl_set_soc_name`]; `Ascend910B1` after a
/// reset), or null where a test set none.
#[unsafe(no_mangle)]
pub extern "C" fn aclrtGetSocName() -> *const c_char {
    let mut s = state();
    // Counted and logged; an injected failure makes it return null.
    if s.enter("aclrtGetSocName", None).is_some() {
        return std::ptr::null();
    }
    s.soc_name.map_or(std::ptr::null(), CStr::as_ptr)
}

/// `aclGetRecentErrMsg()`: the calling thread's last error text, or null.
#[unsafe(no_mangle)]
pub extern "C" fn aclGetRecentErrMsg() -> *const c_char {
    // Not counted or logged: the runtime calls it after every failure.
    ERROR_MESSAGE.with(|m| m.borrow().as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
}

// ---- virtual memory (absent with the `no-vmm` feature) ---------------------------------------

/// `aclrtReserveMemAddress(&virPtr, size, alignment, expectPtr, flags)`: a range of the current
/// device's virtual region, backed by nothing. `size` 0, `alignment` other than 0 (CANN: reserved,
/// must be 0), a non-null `expectPtr` or `flags` other than 0 and 1: 100000. No room: 207001.
///
/// # Safety
/// Pointer arguments must be null or valid for writes of their pointee (the C contract).
#[cfg(not(feature = "no-vmm"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtReserveMemAddress(
    vir_ptr: *mut *mut c_void,
    size: usize,
    alignment: usize,
    expect_ptr: *mut c_void,
    flags: u64,
) -> AclCode {
    let args =
        format!("size={size}, alignment={alignment}, expectPtr={expect_ptr:p}, flags={flags}");
    device_call_with_args("aclrtReserveMemAddress", Some(args), |s, device| {
        if vir_ptr.is_null() || size == 0 || alignment != 0 || !expect_ptr.is_null() || flags > 1 {
            return ACL_ERROR_INVALID_PARAM;
        }
        match s.reserve(device, size as u64) {
            // SAFETY: `vir_ptr` is non-null and, per the C contract, a writable `void*`.
            Ok(addr) => unsafe { write_out(vir_ptr, addr as usize as *mut c_void) },
            Err(code) => code,
        }
    })
}

/// `aclrtReleaseMemAddress(virPtr)`: gives back the range that starts at `virPtr` (on any
/// device). Not the start of a range, or a range with pages still mapped in it: 107000.
#[cfg(not(feature = "no-vmm"))]
#[unsafe(no_mangle)]
pub extern "C" fn aclrtReleaseMemAddress(vir_ptr: *mut c_void) -> AclCode {
    let addr = vir_ptr as usize as u64;
    let args = format!("virPtr={addr:#x}");
    device_call_with_args("aclrtReleaseMemAddress", Some(args), |s, _| {
        let Some(dev) = s.devices.iter_mut().find(|d| d.ranges.contains_key(&addr)) else {
            return ACL_ERROR_RT_PARAM_INVALID;
        };
        let size = dev.ranges[&addr];
        // A range never passes `u64::MAX` (`reserve` checks its end).
        if dev.mappings.range(addr..addr + size).next().is_some() {
            return ACL_ERROR_RT_PARAM_INVALID;
        }
        dev.ranges.remove(&addr);
        ACL_SUCCESS
    })
}

/// `aclrtMallocPhysical(&handle, size, prop, flags)`: a page of `size` bytes on device
/// `prop->location.id`, charged against its capacity. A null pointer, `flags` other than 0,
/// `size` 0 or not a multiple of the kind's page (2 MiB, or 1 GiB for the HUGE1G kinds), or
/// properties other than pinned device memory of a known kind with no exportable handle and
/// `reserve` 0: 100000. Out of capacity: 207001 with the `EL0004` text.
///
/// # Safety
/// `handle` must be null or valid for a write of a `void*`, `prop` null or valid for a read of an
/// `aclrtPhysicalMemProp` (the C contract).
#[cfg(not(feature = "no-vmm"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtMallocPhysical(
    handle: *mut *mut c_void,
    size: usize,
    prop: *const PhysicalMemProp,
    flags: u64,
) -> AclCode {
    // SAFETY: forwarded from the caller.
    let prop = unsafe { PhysicalMemProp::read(prop) };
    let args = format!(
        "size={size}, {}, flags={flags}",
        PhysicalMemProp::describe(prop.as_ref())
    );
    device_call_with_args("aclrtMallocPhysical", Some(args), |s, _| {
        let Some(prop) = prop else {
            return ACL_ERROR_INVALID_PARAM;
        };
        let Some(granularity) = prop.granularity(s.devices.len()) else {
            return ACL_ERROR_INVALID_PARAM;
        };
        let size = size as u64;
        if handle.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(granularity) {
            return ACL_ERROR_INVALID_PARAM;
        }
        let capacity = s.capacity;
        let device = prop.location_id as usize;
        let dev = &mut s.devices[device];
        if dev.used.checked_add(size).is_none_or(|u| u > capacity) {
            set_error_message(Some(OOM_MESSAGE));
            return ACL_ERROR_RT_MEMORY_ALLOCATION;
        }
        dev.used += size;
        dev.live_pages += 1;
        dev.page_bytes += size;
        s.next_page += 1;
        let value = PAGE_BASE + s.next_page * 16;
        s.pages.insert(
            value,
            Page {
                device,
                size,
                mapped_at: None,
                contents: Sparse::default(),
            },
        );
        // SAFETY: `handle` is non-null and, per the C contract, a writable `aclrtDrvMemHandle`.
        unsafe { write_out(handle, value as *mut c_void) }
    })
}

/// `aclrtFreePhysical(handle)`: frees a page that is not mapped. An unknown handle: 107017; a
/// mapped one: 107000.
#[cfg(not(feature = "no-vmm"))]
#[unsafe(no_mangle)]
pub extern "C" fn aclrtFreePhysical(handle: *mut c_void) -> AclCode {
    let key = handle as usize;
    let args = format!("handle={key:#x}");
    device_call_with_args("aclrtFreePhysical", Some(args), |s, _| {
        match s.pages.get(&key) {
            None => return ACL_ERROR_RT_INVALID_HANDLE,
            Some(page) if page.mapped_at.is_some() => return ACL_ERROR_RT_PARAM_INVALID,
            Some(_) => {}
        }
        let Some(page) = s.pages.remove(&key) else {
            return ACL_ERROR_RT_INVALID_HANDLE;
        };
        let dev = &mut s.devices[page.device];
        dev.used -= page.size;
        dev.live_pages -= 1;
        dev.page_bytes -= page.size;
        ACL_SUCCESS
    })
}

/// `aclrtMapMem(virPtr, size, offset, handle, flags)`: maps the whole page `handle` at `virPtr`.
/// `flags` or `offset` other than 0, `size` 0 or other than the page's, or `virPtr` not 2 MiB
/// aligned: 100000. An unknown handle: 107017. A page already mapped, bytes outside every
/// reserved range, a range of another device than the page's, or bytes already mapped: 107000.
#[cfg(not(feature = "no-vmm"))]
#[unsafe(no_mangle)]
pub extern "C" fn aclrtMapMem(
    vir_ptr: *mut c_void,
    size: usize,
    offset: usize,
    handle: *mut c_void,
    flags: u64,
) -> AclCode {
    let (addr, key, size) = (vir_ptr as usize as u64, handle as usize, size as u64);
    let args =
        format!("virPtr={addr:#x}, size={size}, offset={offset}, handle={key:#x}, flags={flags}");
    device_call_with_args("aclrtMapMem", Some(args), |s, _| {
        if flags != 0 || offset != 0 || size == 0 || addr % SEGMENT_ALIGNMENT != 0 {
            return ACL_ERROR_INVALID_PARAM;
        }
        let (page_device, page_size, mapped) = match s.pages.get(&key) {
            Some(p) => (p.device, p.size, p.mapped_at.is_some()),
            None => return ACL_ERROR_RT_INVALID_HANDLE,
        };
        if size != page_size {
            return ACL_ERROR_INVALID_PARAM;
        }
        if mapped {
            return ACL_ERROR_RT_PARAM_INVALID;
        }
        // `range_holding` checked that `addr + size` does not overflow.
        match s.range_holding(addr, size) {
            Some(device) if device == page_device => {}
            _ => return ACL_ERROR_RT_PARAM_INVALID,
        }
        let dev = &mut s.devices[page_device];
        let overlaps = dev
            .mappings
            .range(..addr + size)
            .next_back()
            .is_some_and(|(&start, &(_, len))| start + len > addr);
        if overlaps {
            return ACL_ERROR_RT_PARAM_INVALID;
        }
        dev.mappings.insert(addr, (key, size));
        dev.mapped_bytes += size;
        if let Some(page) = s.pages.get_mut(&key) {
            page.mapped_at = Some(addr);
        }
        ACL_SUCCESS
    })
}

/// `aclrtUnmapMem(virPtr)`: unmaps the mapping that starts at `virPtr`; the page stays. Not the
/// start of a mapping: 107000.
#[cfg(not(feature = "no-vmm"))]
#[unsafe(no_mangle)]
pub extern "C" fn aclrtUnmapMem(vir_ptr: *mut c_void) -> AclCode {
    let addr = vir_ptr as usize as u64;
    let args = format!("virPtr={addr:#x}");
    device_call_with_args("aclrtUnmapMem", Some(args), |s, _| {
        let Some(dev) = s
            .devices
            .iter_mut()
            .find(|d| d.mappings.contains_key(&addr))
        else {
            return ACL_ERROR_RT_PARAM_INVALID;
        };
        let Some((key, size)) = dev.mappings.remove(&addr) else {
            return ACL_ERROR_RT_PARAM_INVALID;
        };
        dev.mapped_bytes -= size;
        if let Some(page) = s.pages.get_mut(&key) {
            page.mapped_at = None;
        }
        ACL_SUCCESS
    })
}

/// `aclrtMemGetAllocationGranularity(prop, option, &granularity)`: 2 MiB, or 1 GiB for the
/// HUGE1G kinds. Null pointers, an option other than MINIMUM and RECOMMENDED, or properties
/// `aclrtMallocPhysical` refuses: 100000.
///
/// # Safety
/// `prop` must be null or valid for a read of an `aclrtPhysicalMemProp`, `granularity` null or
/// valid for a write of a `size_t` (the C contract).
#[cfg(not(feature = "no-vmm"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclrtMemGetAllocationGranularity(
    prop: *mut PhysicalMemProp,
    option: u32,
    granularity: *mut usize,
) -> AclCode {
    // SAFETY: forwarded from the caller.
    let prop = unsafe { PhysicalMemProp::read(prop) };
    let args = format!(
        "{}, option={option}",
        PhysicalMemProp::describe(prop.as_ref())
    );
    device_call_with_args("aclrtMemGetAllocationGranularity", Some(args), |s, _| {
        if !GRANULARITY_OPTIONS.contains(&option) {
            return ACL_ERROR_INVALID_PARAM;
        }
        match prop.and_then(|p| p.granularity(s.devices.len())) {
            // SAFETY: per the C contract `granularity` is null or a writable `size_t`.
            Some(g) => unsafe { write_out(granularity, g as usize) },
            None => ACL_ERROR_INVALID_PARAM,
        }
    })
}

/// The CANN version `aclsysGetCANNVersion` reports until a test sets another.
const DEFAULT_CANN_VERSION: &str = "8.5.0";
/// The driver version it reports until a test sets another.
const DEFAULT_DRIVER_VERSION: &str = "25.5.0";
/// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (only `aclsysGetCANNVersion` answers it).
#[cfg(not(feature = "legacy-cann"))]
const ACL_ERROR_RT_FEATURE_NOT_SUPPORT: AclCode = 207_000;

/// `aclsysGetCANNVersion(name, &version)`: the CANN package (0) and the driver (7) report what
/// [`fake_acl_set_versions`] set (8.5.0 and 25.5.0 after a reset), or 207000 where it set
/// none; another package or a null pointer is 100000. Only `version` is filled in (the rest of
/// the struct is zeroed). Not in the `legacy-cann` build, as in a CANN older than 8.1.
///
/// # Safety
/// `version` must be null or valid for a write of an `aclCANNPackageVersion` (512 bytes).
#[cfg(not(feature = "legacy-cann"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aclsysGetCANNVersion(name: u32, version: *mut [u8; 512]) -> AclCode {
    call_with_args("aclsysGetCANNVersion", Some(format!("name={name}")), |s| {
        let reported = match name {
            0 => &s.versions[0],
            7 => &s.versions[1],
            _ => return ACL_ERROR_INVALID_PARAM,
        };
        let Some(text) = reported else {
            return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
        };
        let mut out = [0u8; 512];
        // Kept below 128 bytes by `fake_acl_set_versions`.
        out[..text.len()].copy_from_slice(text.as_bytes());
        // SAFETY: per the C contract `version` is null or writable for 512 bytes.
        unsafe { write_out(version, out) }
    })
}

// ---- test controls --------------------------------------------------------------------------

/// Reads a symbol name passed by a test.
///
/// # Safety
/// `name` must be null or a NUL-terminated string.
unsafe fn name_arg(name: *const c_char) -> Option<String> {
    if name.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    let name = unsafe { CStr::from_ptr(name) };
    name.to_str().ok().map(str::to_owned)
}

/// Starts over: `devices` devices of `capacity` bytes, not initialised, no allocations, events,
/// counters, log or injected failures; every thread forgets its device.
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_reset(capacity: u64, devices: u32) {
    let mut s = state();
    let generation = s.generation + 1;
    *s = State::new(capacity, devices, generation);
}

/// Drops every injected failure still waiting for its call.
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_clear_failures() {
    state().failures.clear();
}

/// Makes `aclrtGetDeviceCount` report `count` devices (the real count stays), as a broken or
/// mismatched library would.
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_report_devices(count: u32) {
    state().reported_devices = Some(count);
}

/// Sets what `aclsysGetCANNVersion` reports for CANN and for the driver until the next reset;
/// a null string makes that package's query fail with 207000 (feature not supported). A string
/// of 128 bytes or more, or not UTF-8, counts as null.
///
/// # Safety
/// Each argument must be null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_acl_set_versions(cann: *const c_char, driver: *const c_char) {
    // SAFETY: forwarded from the caller.
    let read = |p| unsafe { name_arg(p) }.filter(|v| v.len() < 128);
    let versions = [read(cann), read(driver)];
    state().versions = versions;
}

/// Sets what `aclrtGetSocName` returns until the next reset; null makes it return null.
///
/// # Safety
/// `name` must be null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_acl_set_soc_name(name: *const c_char) {
    // SAFETY: forwarded from the caller.
    let name = unsafe { name_arg(name) };
    let leaked = name.map(|n| {
        &*Box::leak(
            CString::new(n)
                .expect("read up to its NUL")
                .into_boxed_c_str(),
        )
    });
    state().soc_name = leaked;
}

/// How many times the ACL function `name` was called since the last reset (0 for null).
///
/// # Safety
/// `name` must be null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_acl_calls(name: *const c_char) -> u64 {
    // SAFETY: forwarded from the caller.
    let Some(name) = (unsafe { name_arg(name) }) else {
        return 0;
    };
    state().calls.get(name.as_str()).copied().unwrap_or(0)
}

/// Makes the next `count` calls of `name` fail with `code` (and do nothing else).
///
/// # Safety
/// `name` must be null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_acl_fail_next(name: *const c_char, code: i32, count: u32) {
    // SAFETY: forwarded from the caller.
    let Some(name) = (unsafe { name_arg(name) }) else {
        return;
    };
    let mut s = state();
    let queue = s.failures.entry(name).or_default();
    queue.extend(std::iter::repeat_n(code, count as usize));
}

/// Completes every recorded event (the work before them has finished).
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_complete_all_events() {
    for ev in state().events.values_mut() {
        if ev.recorded {
            ev.complete = true;
        }
    }
}

/// Events recorded and not yet complete.
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_pending_events() -> u64 {
    let s = state();
    s.events
        .values()
        .filter(|e| e.recorded && !e.complete)
        .count() as u64
}

/// Events created and not destroyed.
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_live_events() -> u64 {
    state().events.len() as u64
}

/// Bytes charged on `device` by live allocations (0 for an unknown device).
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_used(device: u32) -> u64 {
    let s = state();
    s.devices.get(device as usize).map_or(0, |d| d.used)
}

/// Live allocations on `device` (0 for an unknown device).
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_live_allocations(device: u32) -> u64 {
    let s = state();
    s.devices
        .get(device as usize)
        .map_or(0, |d| d.allocations.len() as u64)
}

/// Physical pages alive on `device` (0 for an unknown device).
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_live_pages(device: u32) -> u64 {
    let s = state();
    s.devices.get(device as usize).map_or(0, |d| d.live_pages)
}

/// Bytes of the physical pages alive on `device` (also counted in [`fake_acl_used`]).
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_page_bytes(device: u32) -> u64 {
    let s = state();
    s.devices.get(device as usize).map_or(0, |d| d.page_bytes)
}

/// Mappings alive in `device`'s reserved ranges.
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_mappings(device: u32) -> u64 {
    let s = state();
    s.devices
        .get(device as usize)
        .map_or(0, |d| d.mappings.len() as u64)
}

/// Bytes mapped in `device`'s reserved ranges.
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_mapped_bytes(device: u32) -> u64 {
    let s = state();
    s.devices.get(device as usize).map_or(0, |d| d.mapped_bytes)
}

/// Reserved ranges alive on `device`.
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_reserved_ranges(device: u32) -> u64 {
    let s = state();
    s.devices
        .get(device as usize)
        .map_or(0, |d| d.ranges.len() as u64)
}

/// Bytes of the reserved ranges alive on `device` (address space only: not charged).
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_reserved_bytes(device: u32) -> u64 {
    let s = state();
    s.devices
        .get(device as usize)
        .map_or(0, |d| d.ranges.values().sum())
}

/// Test control: writes `len` bytes of `data` into device memory at `dev_ptr` (inside one
/// segment, or across mappings without a gap, as `aclrtMemcpy` requires). Returns 0, 107000 for
/// a range that is not device memory, or 100000 for null `data` with `len` above 0. Not an ACL
/// call: not counted, logged or failed by injection, and no device need be set.
///
/// # Safety
/// `data` must be null or valid for reads of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_acl_write_device(dev_ptr: u64, data: *const u8, len: usize) -> i32 {
    if len == 0 {
        return ACL_SUCCESS;
    }
    if data.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    // SAFETY: non-null and readable for `len` bytes per the caller's contract.
    let data = unsafe { std::slice::from_raw_parts(data, len) };
    state()
        .write_device(dev_ptr, data)
        .err()
        .unwrap_or(ACL_SUCCESS)
}

/// Test control: reads `len` bytes of device memory at `dev_ptr` into `buf` (zeros where never
/// written). Returns 0, 107000 for a range that is not device memory, or 100000 for a null
/// `buf` with `len` above 0. Not an ACL call, like [`fake_acl_write_device`].
///
/// # Safety
/// `buf` must be null or valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_acl_read_device(dev_ptr: u64, buf: *mut u8, len: usize) -> i32 {
    if len == 0 {
        return ACL_SUCCESS;
    }
    if buf.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    // SAFETY: non-null and writable for `len` bytes per the caller's contract.
    let out = unsafe { std::slice::from_raw_parts_mut(buf, len) };
    state()
        .read_device(dev_ptr, out)
        .err()
        .unwrap_or(ACL_SUCCESS)
}

/// Host allocations (`aclrtMallocHost`) alive.
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_live_host_buffers() -> u64 {
    state().host.len() as u64
}

/// Host memory the fake holds for the written bytes of `device`'s segments and pages (whole
/// 4 KiB chunks; 0 for memory never written, and for an unknown device).
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_content_bytes(device: u32) -> u64 {
    state().content_bytes(device as usize)
}

/// The ACL calls since the last reset or [`fake_acl_clear_log`], comma-separated. Writes at
/// most `len` bytes (no NUL) to `buf` and returns the full length.
///
/// # Safety
/// `buf` must be null or valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_acl_call_log(buf: *mut u8, len: usize) -> usize {
    let text = state().log.join(",");
    if !buf.is_null() {
        let n = text.len().min(len);
        // SAFETY: `buf` is valid for `len ≥ n` bytes per the caller's contract, and cannot
        // overlap `text`, a fresh allocation.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n) };
    }
    text.len()
}

/// The calls of [`fake_acl_call_log`] with their arguments where the fake records them
/// (`aclrtSetDevice`, the VMM calls and the host-memory calls, e.g.
/// `aclrtUnmapMem(virPtr=0x800000000000)`; the others are bare names), one a line. Writes at most `len` bytes (no NUL) to `buf` and returns the full
/// length.
///
/// # Safety
/// `buf` must be null or valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_acl_call_details(buf: *mut u8, len: usize) -> usize {
    let text = state().details.join("\n");
    if !buf.is_null() {
        let n = text.len().min(len);
        // SAFETY: `buf` is valid for `len ≥ n` bytes per the caller's contract, and cannot
        // overlap `text`, a fresh allocation.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n) };
    }
    text.len()
}

/// Empties the call log and its detailed form (counters are kept).
#[unsafe(no_mangle)]
pub extern "C" fn fake_acl_clear_log() {
    let mut s = state();
    s.log.clear();
    s.details.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_bytes_hold_only_non_zero_chunks() {
        let mut s = Sparse::default();
        let mut out = [9u8; 6];
        s.read(10 << 30, &mut out);
        assert_eq!(out, [0; 6]);
        // Zeros where nothing was written make no chunk.
        s.write(0, &[0; 3 * CHUNK]);
        assert_eq!(s.held_bytes(), 0);
        s.write(CHUNK as u64 - 2, &[1, 2, 3, 4]);
        assert_eq!(s.held_bytes(), 2 * CHUNK as u64);
        let mut out = [9u8; 6];
        s.read(CHUNK as u64 - 3, &mut out);
        assert_eq!(out, [0, 1, 2, 3, 4, 0]);
        // A chunk written back to zeros is dropped.
        s.write(CHUNK as u64, &[0, 0]);
        assert_eq!(s.held_bytes(), CHUNK as u64);
        let mut out = [9u8; 4];
        s.read(CHUNK as u64 - 2, &mut out);
        assert_eq!(out, [1, 2, 0, 0]);
    }

    #[test]
    fn zero_clears_any_byte_that_is_not_zero() {
        // Whether it wrote (touched a page) is not observable here; what it leaves is.
        for mut bytes in [[0u8, 7, 0], [7, 0, 0], [0, 0, 7], [255, 1, 128]] {
            assert!(!is_zero(&bytes));
            zero(&mut bytes);
            assert_eq!(bytes, [0; 3]);
        }
        assert!(is_zero(&[]));
    }
}
