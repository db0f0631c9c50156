//! Executing stress operations against the allocator and checking each result.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

use alloc_core::size::MAX_REQUEST;
use alloc_core::{
    AllocError, Allocator, BlockState, DeviceStats, FreeError, STAT_ARRAY_NAMES, StreamId,
};

use super::generate::{Generator, View};
use super::{Misuse, Rule, StressError, StressOp, StressParams, StressReport};
use crate::check::check_allocations;
use crate::fault::{DeviceCall, Fault};
use crate::sim_device::{SimDevice, SimError};

/// How many freed addresses are remembered for double-free misuse.
const DEAD_ADDRESSES: usize = 16;

/// A live allocation as the caller sees it.
#[derive(Debug, Clone, Copy)]
struct Live {
    addr: u64,
    requested: u64,
}

/// The allocator under test and the caller's view of it.
struct Exec<'p> {
    params: &'p StressParams,
    alloc: Allocator<SimDevice>,
    /// Live allocations by id (ordered, so draining is deterministic).
    live: BTreeMap<u64, Live>,
    /// Live non-null allocations by address: the requested size.
    by_addr: BTreeMap<u64, u64>,
    /// Live ids, for the generator to pick from, and each one's position.
    ids: Vec<u64>,
    pos: HashMap<u64, usize>,
    /// Recently freed addresses, newest first.
    dead: VecDeque<u64>,
    /// The stats right after the last accumulated reset, and the device counters then.
    base: DeviceStats,
    base_mallocs: u64,
    base_frees: u64,
    ooms_since_reset: u64,
    /// Faults scheduled and not fired yet.
    faults: Vec<Scheduled>,
    report: StressReport,
}

/// What an operation's result is judged against: the state just before it.
struct Before {
    stats: DeviceStats,
    calls: [u64; DeviceCall::ALL.len()],
}

/// A fault scheduled on the device, as the runner models it: it fires on call number `at` of
/// `call` (the device's own plan is checked against this model after every operation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scheduled {
    call: DeviceCall,
    at: u64,
    fault: Fault,
}

impl Scheduled {
    /// The error an operation returns when this fault surfaces.
    fn error(&self) -> SimError {
        let code = match self.fault {
            Fault::OutOfMemory => Fault::OOM_CODE,
            Fault::Error(code) => code,
        };
        SimError::Injected {
            call: self.call,
            code,
        }
    }

    /// Whether the fault aborts the call's operation (every fault but an out-of-memory of
    /// `malloc`, which enters the retry chain, and a failed `mem_info`, which only loses numbers).
    fn aborts(&self) -> bool {
        !matches!(
            (self.call, self.fault),
            (DeviceCall::Malloc, Fault::OutOfMemory) | (DeviceCall::MemInfo, _)
        )
    }
}

/// The one device error an operation must return given the faults that fired in it, or `None`
/// when it must succeed (or run out of memory). More than one aborting fault cannot fire in one
/// operation, since the first one ends it.
fn surfacing(fired: &[Scheduled], what: &str) -> Result<Option<SimError>, StressError> {
    let mut aborting = fired.iter().filter(|f| f.aborts());
    match (aborting.next(), aborting.next()) {
        (None, _) => Ok(None),
        (Some(f), None) => Ok(Some(f.error())),
        (Some(_), Some(_)) => Err(broken(
            Rule::UnexpectedResult,
            format!("{what}: the device failed again after a failure: {fired:?}"),
        )),
    }
}

fn broken(rule: Rule, detail: String) -> StressError {
    StressError::Broken { rule, detail }
}

impl<'p> Exec<'p> {
    fn new(params: &'p StressParams) -> Self {
        Exec {
            params,
            alloc: params.allocator(),
            live: BTreeMap::new(),
            by_addr: BTreeMap::new(),
            ids: Vec::new(),
            pos: HashMap::new(),
            dead: VecDeque::new(),
            base: DeviceStats::default(),
            base_mallocs: 0,
            base_frees: 0,
            ooms_since_reset: 0,
            faults: Vec::new(),
            report: StressReport::default(),
        }
    }

    fn view(&self) -> View<'_> {
        View {
            live: &self.ids,
            dead: self.dead.len(),
        }
    }

    fn device(&self) -> &SimDevice {
        self.alloc.device()
    }

    fn calls(&self) -> [u64; DeviceCall::ALL.len()] {
        DeviceCall::ALL.map(|c| self.device().calls(c))
    }

    fn add_live(&mut self, id: u64, live: Live) {
        self.live.insert(id, live);
        if live.addr != 0 {
            self.by_addr.insert(live.addr, live.requested);
        }
        self.pos.insert(id, self.ids.len());
        self.ids.push(id);
        self.report.peak_live = self.report.peak_live.max(self.ids.len());
    }

    fn remove_live(&mut self, id: u64) {
        let Some(live) = self.live.remove(&id) else {
            return;
        };
        if live.addr != 0 {
            self.by_addr.remove(&live.addr);
            self.dead.push_front(live.addr);
            self.dead.truncate(DEAD_ADDRESSES);
        }
        let i = self.pos.remove(&id).expect("every live id has a position");
        self.ids.swap_remove(i);
        if let Some(&moved) = self.ids.get(i) {
            self.pos.insert(moved, i);
        }
    }

    /// Fails unless the stats equal `expected`.
    fn stats_are(&self, expected: &DeviceStats, what: &str) -> Result<(), StressError> {
        let now = self.alloc.stats();
        if now == expected {
            return Ok(());
        }
        let changed: Vec<String> = now
            .flat()
            .into_iter()
            .zip(expected.flat())
            .filter(|(a, b)| a.1 != b.1)
            .map(|((key, got), (_, want))| format!("{key} {want} -> {got}"))
            .collect();
        Err(broken(
            Rule::StatsChanged,
            format!("{what}: {}", changed.join(", ")),
        ))
    }

    fn no_device_calls(
        &self,
        before: [u64; DeviceCall::ALL.len()],
        what: &str,
    ) -> Result<(), StressError> {
        let now = self.calls();
        match DeviceCall::ALL
            .iter()
            .zip(before.iter().zip(now))
            .find(|(_, (b, n))| **b != *n)
        {
            None => Ok(()),
            Some((call, _)) => Err(broken(Rule::DeviceCalled, format!("{what} called {call}"))),
        }
    }

    fn allocation_count_is(&self, expected: i64, what: &str) -> Result<(), StressError> {
        let now = self.alloc.stats().allocation.all.current;
        if now == expected {
            Ok(())
        } else {
            Err(broken(
                Rule::Counter,
                format!("{what}: allocation.all.current is {now}, expected {expected}"),
            ))
        }
    }

    /// Executes one operation and checks its result and then every invariant.
    fn step(&mut self, op: &StressOp) -> Result<(), StressError> {
        self.report.ops += 1;
        let before = Before {
            stats: self.alloc.stats().clone(),
            calls: self.calls(),
        };
        match *op {
            StressOp::Alloc { id, size, stream } => self.malloc(id, size, stream, &before)?,
            StressOp::Free { id } => self.free(id, &before)?,
            StressOp::Record { id, stream } => {
                if let Some(live) = self.live.get(&id).copied() {
                    self.report.records += 1;
                    self.alloc
                        .record_stream(live.addr, StreamId(stream))
                        .map_err(|e| {
                            broken(Rule::UnexpectedResult, format!("record_stream: {e}"))
                        })?;
                    self.stats_are(&before.stats, "record_stream")?;
                    self.no_device_calls(before.calls, "record_stream")?;
                }
            }
            StressOp::Complete { stream } => {
                match stream {
                    Some(s) => self.alloc.device_mut().complete_stream(StreamId(s)),
                    None => self.alloc.device_mut().complete_all(),
                }
                self.stats_are(&before.stats, "complete")?;
            }
            StressOp::EmptyCache => self.empty_cache(&before)?,
            StressOp::Fraction(f) => self.fraction(f, &before)?,
            StressOp::ResetPeak => {
                self.alloc.reset_peak_stats();
                let mut expected = before.stats.clone();
                expected.reset_peak();
                self.stats_are(&expected, "reset_peak")?;
            }
            StressOp::ResetAccumulated => {
                self.alloc.reset_accumulated_stats();
                let mut expected = before.stats.clone();
                expected.reset_accumulated();
                self.stats_are(&expected, "reset_accumulated")?;
                self.base = expected;
                self.base_mallocs = self.device().successful_mallocs();
                self.base_frees = self.device().frees();
                self.ooms_since_reset = 0;
            }
            StressOp::Misuse(m) => self.misuse(m, &before)?,
            StressOp::Fault { call, nth, fault } => self.schedule(call, nth, fault),
            StressOp::Drain => self.drain()?,
        }
        // Operations that make no fallible device call must not have fired a fault.
        let stray = self.take_fired();
        if !stray.is_empty() {
            return Err(broken(
                Rule::UnexpectedResult,
                format!("{op:?} fired faults {stray:?}"),
            ));
        }
        if self.device().pending_faults() != self.faults.len() {
            return Err(broken(
                Rule::Counter,
                format!(
                    "the device has {} faults pending, the runner {:?}",
                    self.device().pending_faults(),
                    self.faults
                ),
            ));
        }
        self.check()
    }

    /// Schedules a fault, unless one is already due on the same call (it would never fire).
    fn schedule(&mut self, call: DeviceCall, nth: u64, fault: Fault) {
        let at = self.device().calls(call) + nth.max(1);
        if self.faults.iter().any(|f| f.call == call && f.at == at) {
            return;
        }
        self.alloc.device_mut().fail_nth(call, nth, fault);
        self.faults.push(Scheduled { call, at, fault });
        self.report.faults_scheduled += 1;
    }

    /// The scheduled faults whose call has come, in call order; they are no longer pending.
    fn take_fired(&mut self) -> Vec<Scheduled> {
        let calls = self.calls();
        let index = |c: DeviceCall| DeviceCall::ALL.iter().position(|&x| x == c).unwrap();
        let (fired, pending): (Vec<_>, Vec<_>) = self
            .faults
            .iter()
            .partition(|f| calls[index(f.call)] >= f.at);
        self.faults = pending;
        self.report.faults_fired += fired.len() as u64;
        fired
    }

    fn malloc(
        &mut self,
        id: u64,
        size: u64,
        stream: u64,
        before: &Before,
    ) -> Result<(), StressError> {
        if self.live.contains_key(&id) {
            return Ok(());
        }
        self.report.allocs += 1;
        let result = self.alloc.malloc(size, StreamId(stream));
        let fired = self.take_fired();
        let what = format!("malloc({size}, stream {stream})");
        let count = before.stats.allocation.all.current;
        let must_fail = surfacing(&fired, &what)?;
        let fired_oom = fired
            .iter()
            .any(|f| f.call == DeviceCall::Malloc && !f.aborts());
        let fired_mem_info = fired.iter().any(|f| f.call == DeviceCall::MemInfo);
        match (&result, &must_fail) {
            (Err(AllocError::Device(got)), Some(want)) if got == want => {}
            (_, Some(want)) => {
                return Err(broken(
                    Rule::UnexpectedResult,
                    format!("{what} returned {result:?} although a fault fired: {want}"),
                ));
            }
            (Err(AllocError::OutOfMemory(_)), None) => {}
            (_, None) if fired_mem_info => {
                return Err(broken(
                    Rule::UnexpectedResult,
                    format!("{what} asked mem_info without running out of memory: {result:?}"),
                ));
            }
            _ => {}
        }
        if !fired.is_empty() && must_fail.is_none() {
            self.report.absorbed_faults += 1;
        }
        match result {
            Err(AllocError::TooLarge { size: s }) if size >= MAX_REQUEST && s == size => {
                self.report.refused += 1;
                self.stats_are(&before.stats, &what)?;
                self.no_device_calls(before.calls, &what)?;
            }
            Ok(0) if size == 0 => {
                self.stats_are(&before.stats, &what)?;
                self.no_device_calls(before.calls, &what)?;
                self.add_live(
                    id,
                    Live {
                        addr: 0,
                        requested: 0,
                    },
                );
            }
            Ok(addr) if size > 0 && size < MAX_REQUEST => {
                self.check_new_range(addr, size, &what)?;
                self.allocation_count_is(count + 1, &what)?;
                self.add_live(
                    id,
                    Live {
                        addr,
                        requested: size,
                    },
                );
            }
            Err(AllocError::OutOfMemory(oom)) if size > 0 && size < MAX_REQUEST => {
                self.report.ooms += 1;
                self.ooms_since_reset += 1;
                self.allocation_count_is(count, &what)?;
                if oom.requested != size || oom.alloc_size < size {
                    return Err(broken(
                        Rule::UnexpectedResult,
                        format!(
                            "{what}: out-of-memory reports request {} and segment {}",
                            oom.requested, oom.alloc_size
                        ),
                    ));
                }
                let capacity = self.params.capacity;
                let reserved = self.device().outstanding_bytes();
                let free = (!fired_mem_info).then_some(capacity - reserved);
                if oom.free != free || oom.total != Some(capacity) {
                    return Err(broken(
                        Rule::UnexpectedResult,
                        format!(
                            "{what}: out-of-memory reports free {:?} of {:?}, expected {free:?} \
                             of {capacity}",
                            oom.free, oom.total,
                        ),
                    ));
                }
                if !fired_oom {
                    // Legitimate only if the last device malloc really could not fit, or the
                    // fraction limit refused it.
                    let need = reserved.saturating_add(oom.alloc_size);
                    let full = need > capacity;
                    let limited = self.alloc.allowed_memory().is_some_and(|a| need > a);
                    if !full && !limited {
                        return Err(broken(
                            Rule::SpuriousOutOfMemory,
                            format!(
                                "{what}: segment of {} bytes with {reserved} of {capacity} reserved, \
                                 limit {:?}",
                                oom.alloc_size,
                                self.alloc.allowed_memory()
                            ),
                        ));
                    }
                }
            }
            Err(AllocError::Device(_)) if must_fail.is_some() => {
                self.report.device_errors += 1;
                self.allocation_count_is(count, &what)?;
                if self.alloc.stats().num_ooms != before.stats.num_ooms {
                    return Err(broken(
                        Rule::Counter,
                        format!("{what}: a device error counted as out-of-memory"),
                    ));
                }
            }
            other => {
                return Err(broken(
                    Rule::UnexpectedResult,
                    format!("{what} returned {other:?} (faults fired: {fired:?})"),
                ));
            }
        }
        Ok(())
    }

    /// A new allocation `[addr, addr + size)`: aligned, inside one device segment, overlapping
    /// no live allocation.
    fn check_new_range(&self, addr: u64, size: u64, what: &str) -> Result<(), StressError> {
        if addr == 0 || addr % 512 != 0 {
            return Err(broken(
                Rule::BadAddress,
                format!("{what} returned {addr:#x}"),
            ));
        }
        let end = addr + size;
        if let Some((&a, &n)) = self.by_addr.range(..=addr).next_back() {
            if a + n.max(1) > addr {
                return Err(broken(
                    Rule::Overlap,
                    format!("{what} returned {addr:#x}, inside the live {a:#x} of {n} bytes"),
                ));
            }
        }
        if let Some((&a, &n)) = self.by_addr.range(addr..).next() {
            if a < end {
                return Err(broken(
                    Rule::Overlap,
                    format!("{what} returned {addr:#x}, overlapping the live {a:#x} of {n} bytes"),
                ));
            }
        }
        match self.device().segment_containing(addr) {
            Some((start, bytes)) if end <= start + bytes => Ok(()),
            seg => Err(broken(
                Rule::OutsideSegment,
                format!("{what} returned {addr:#x}..{end:#x}; device segment {seg:x?}"),
            )),
        }
    }

    fn free(&mut self, id: u64, before: &Before) -> Result<(), StressError> {
        let Some(live) = self.live.get(&id).copied() else {
            return Ok(());
        };
        let result = self.alloc.free(live.addr);
        let fired = self.take_fired();
        let what = format!("free({:#x})", live.addr);
        // A failed event record falls back to a synchronization; only if that fails too does
        // the free fail, with the record's error.
        let record = fired.iter().find(|f| f.call == DeviceCall::RecordEvent);
        let sync = fired.iter().any(|f| f.call == DeviceCall::Synchronize);
        let expected = match (record, sync) {
            (Some(r), true) if fired.len() == 2 => Err(FreeError::Device(r.error())),
            (Some(_), false) if fired.len() == 1 => Ok(()),
            (None, false) if fired.is_empty() => Ok(()),
            _ => {
                return Err(broken(
                    Rule::UnexpectedResult,
                    format!("{what} fired {fired:?}"),
                ));
            }
        };
        if result != expected {
            return Err(broken(
                Rule::UnexpectedResult,
                format!("{what} returned {result:?}, expected {expected:?} (fired {fired:?})"),
            ));
        }
        match result {
            Ok(()) => {
                self.report.frees += 1;
                if !fired.is_empty() {
                    self.report.absorbed_faults += 1;
                }
                if live.addr == 0 {
                    self.stats_are(&before.stats, &what)?;
                } else {
                    self.allocation_count_is(before.stats.allocation.all.current - 1, &what)?;
                }
                self.remove_live(id);
            }
            // Recording the stream events failed and so did the synchronization fallback: the
            // allocation stays the caller's, unchanged.
            Err(_) => {
                self.report.device_errors += 1;
                self.stats_are(&before.stats, &what)?;
            }
        }
        Ok(())
    }

    fn empty_cache(&mut self, before: &Before) -> Result<(), StressError> {
        self.report.empty_caches += 1;
        let result = self.alloc.empty_cache();
        let fired = self.take_fired();
        match (result, surfacing(&fired, "empty_cache")?) {
            (Ok(()), None) => self.check_emptied(&before.stats),
            (Err(got), Some(want)) if got == want => {
                self.report.device_errors += 1;
                Ok(())
            }
            (result, want) => Err(broken(
                Rule::UnexpectedResult,
                format!("empty_cache returned {result:?}, expected error {want:?}"),
            )),
        }
    }

    /// After a successful `empty_cache`: no pending event, no whole free segment.
    fn check_emptied(&self, before: &DeviceStats) -> Result<(), StressError> {
        if self.alloc.pending_events() != 0 {
            return Err(broken(
                Rule::CacheNotEmptied,
                format!("{} events still pending", self.alloc.pending_events()),
            ));
        }
        let whole_free = self
            .alloc
            .snapshot()
            .into_iter()
            .find(|s| s.blocks.len() == 1 && s.blocks[0].state == BlockState::Inactive);
        if let Some(seg) = whole_free {
            return Err(broken(
                Rule::CacheNotEmptied,
                format!(
                    "segment {:#x} of {} bytes is free and still cached",
                    seg.address, seg.total_size
                ),
            ));
        }
        let syncs = self.alloc.stats().num_sync_all_streams;
        if syncs != before.num_sync_all_streams + 1 {
            return Err(broken(
                Rule::Counter,
                format!(
                    "empty_cache: num_sync_all_streams {} -> {syncs}",
                    before.num_sync_all_streams
                ),
            ));
        }
        Ok(())
    }

    fn fraction(&mut self, f: f64, before: &Before) -> Result<(), StressError> {
        self.alloc
            .set_memory_fraction(f)
            .map_err(|e| broken(Rule::UnexpectedResult, format!("fraction {f}: {e}")))?;
        let expected = (f < 1.0).then_some((f * self.params.capacity as f64) as u64);
        if self.alloc.allowed_memory() != expected {
            return Err(broken(
                Rule::Fraction,
                format!(
                    "fraction {f}: limit {:?}, expected {expected:?}",
                    self.alloc.allowed_memory()
                ),
            ));
        }
        self.stats_are(&before.stats, "set_memory_fraction")
    }

    fn misuse(&mut self, m: Misuse, before: &Before) -> Result<(), StressError> {
        let dead = |pick: u64| -> Option<u64> {
            let addr = *self.dead.get(pick as usize % self.dead.len().max(1))?;
            // A freed address handed out again is live, not a misuse.
            (!self.by_addr.contains_key(&addr)).then_some(addr)
        };
        let (addr, record) = match m {
            Misuse::DoubleFree { pick } => (dead(pick), false),
            Misuse::RecordFreed { pick } => (dead(pick), true),
            Misuse::ForeignPointer { addr } => (Some(addr), false),
            Misuse::InteriorPointer { id } => (
                self.live
                    .get(&id)
                    .filter(|l| l.addr != 0)
                    .map(|l| l.addr + 1),
                false,
            ),
        };
        let Some(addr) = addr else {
            return Ok(());
        };
        self.report.misuses += 1;
        let expected = if self.device().segment_containing(addr).is_some() {
            FreeError::NotAllocated { addr }
        } else {
            FreeError::ForeignPointer { addr }
        };
        let (what, result) = if record {
            let what = format!("record_stream({addr:#x}) after its free");
            (what, self.alloc.record_stream(addr, StreamId(1)))
        } else {
            (format!("{m:?}: free({addr:#x})"), self.alloc.free(addr))
        };
        if result != Err(expected.clone()) {
            return Err(broken(
                Rule::UnexpectedResult,
                format!("{what} returned {result:?}, expected Err({expected:?})"),
            ));
        }
        self.stats_are(&before.stats, &what)?;
        self.no_device_calls(before.calls, &what)
    }

    /// Clears the faults, frees everything, `empty_cache`, and checks nothing is left.
    fn drain(&mut self) -> Result<(), StressError> {
        self.report.drains += 1;
        self.alloc.device_mut().clear_all_faults();
        self.faults.clear();
        let ids: Vec<u64> = self.live.keys().copied().collect();
        for id in ids {
            let addr = self.live[&id].addr;
            self.alloc.free(addr).map_err(|e| {
                broken(
                    Rule::UnexpectedResult,
                    format!("drain: free({addr:#x}): {e}"),
                )
            })?;
            self.report.frees += 1;
            self.remove_live(id);
        }
        self.report.empty_caches += 1;
        self.alloc
            .empty_cache()
            .map_err(|e| broken(Rule::UnexpectedResult, format!("drain: empty_cache: {e}")))?;
        let d = self.device();
        let s = self.alloc.stats();
        let left = [
            ("device bytes", d.outstanding_bytes() as i64),
            ("device segments", d.outstanding_segments() as i64),
            ("device events", d.outstanding_events() as i64),
            ("pending events", self.alloc.pending_events() as i64),
            ("allocation", s.allocation.all.current),
            ("active", s.active.all.current),
            ("segment", s.segment.all.current),
            ("requested_bytes", s.requested_bytes.all.current),
        ];
        match left.iter().find(|(_, n)| *n != 0) {
            None => Ok(()),
            Some((what, n)) => Err(broken(
                Rule::Leak,
                format!("after freeing everything and empty_cache, {what} is {n}"),
            )),
        }
    }

    /// Every invariant, the caller's view, and the counters the runner can recount.
    fn check(&mut self) -> Result<(), StressError> {
        check_allocations(
            &self.alloc,
            self.by_addr
                .iter()
                .map(|(&addr, &requested)| (addr, requested)),
        )
        .map_err(StressError::Inconsistent)?;
        let s = self.alloc.stats();
        let d = self.alloc.device();
        for (name, got, want) in [
            (
                "num_device_alloc",
                s.num_device_alloc,
                d.successful_mallocs() - self.base_mallocs,
            ),
            (
                "num_device_free",
                s.num_device_free,
                d.frees() - self.base_frees,
            ),
            ("num_ooms", s.num_ooms, self.ooms_since_reset),
        ] {
            if got != want {
                return Err(broken(
                    Rule::Counter,
                    format!("{name} is {got}, the runner counted {want}"),
                ));
            }
        }
        // current = current at the last reset + allocated - freed, for every stat.
        for name in STAT_ARRAY_NAMES {
            let (now, base) = (s.array(name).unwrap(), self.base.array(name).unwrap());
            for (pool, n, b) in [
                ("all", now.all, base.all),
                ("small_pool", now.small_pool, base.small_pool),
                ("large_pool", now.large_pool, base.large_pool),
            ] {
                if n.current != b.current + n.allocated - n.freed {
                    return Err(broken(
                        Rule::Counter,
                        format!(
                            "{name}.{pool}: current {} but {} at the last reset + allocated {} - freed {}",
                            n.current, b.current, n.allocated, n.freed
                        ),
                    ));
                }
            }
        }
        self.report.peak_reserved = self.report.peak_reserved.max(d.outstanding_bytes());
        Ok(())
    }

    fn finish(mut self) -> StressReport {
        self.report.device_mallocs = self.device().successful_mallocs();
        self.report.device_frees = self.device().frees();
        self.report
    }
}

thread_local! {
    /// Whether a panic on this thread is caught by a stress run (and so not printed).
    static CATCHING: Cell<bool> = const { Cell::new(false) };
    /// The message and location of the last panic caught on this thread.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `f`, turning a panic into its message; while it runs, panics on this thread are not
/// printed (a shrink may panic thousands of times). Other threads' panics print as usual.
fn catch_panics<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if CATCHING.with(Cell::get) {
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(info.to_string()));
            } else {
                previous(info);
            }
        }));
    });
    let was = CATCHING.with(|c| c.replace(true));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(was));
    result.map_err(|_| {
        LAST_PANIC
            .with(|p| p.borrow_mut().take())
            .unwrap_or_else(|| "panic without a message".into())
    })
}

/// A run's outcome: the report, or the failing operation's index and the failure.
pub(crate) type Outcome = Result<StressReport, (usize, StressError)>;

/// Generates `params.ops` operations, executing and checking each, then the final drain.
/// Returns the operations generated (up to the failing one) and the outcome.
pub(crate) fn generate_and_run(params: &StressParams) -> (Vec<StressOp>, Outcome) {
    let mut ops = Vec::with_capacity(usize::try_from(params.ops).unwrap_or(0).min(1 << 24));
    let mut index = 0;
    let outcome = catch_panics(|| {
        let mut exec = Exec::new(params);
        let mut generator = Generator::new(params);
        for i in 0..params.ops {
            let op = generator.next(i, &exec.view());
            ops.push(op);
            index = ops.len() - 1;
            exec.step(&ops[index]).map_err(|e| (index, e))?;
        }
        index = ops.len();
        exec.step(&StressOp::Drain).map_err(|e| (index, e))?;
        Ok(exec.finish())
    });
    let outcome = outcome.unwrap_or_else(|msg| Err((index, StressError::Panic(msg))));
    (ops, outcome)
}

/// Executes `ops` and then the final drain, checking every step.
pub(crate) fn run_ops(params: &StressParams, ops: &[StressOp]) -> Outcome {
    let mut index = 0;
    let outcome = catch_panics(|| {
        let mut exec = Exec::new(params);
        for (i, op) in ops.iter().enumerate() {
            index = i;
            exec.step(op).map_err(|e| (i, e))?;
        }
        index = ops.len();
        exec.step(&StressOp::Drain).map_err(|e| (index, e))?;
        Ok(exec.finish())
    });
    outcome.unwrap_or_else(|msg| Err((index, StressError::Panic(msg))))
}
