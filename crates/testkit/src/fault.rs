//! Fault injection for [`SimDevice`](crate::SimDevice), in the spirit of smoltcp's `FaultInjector`.
//!
//! Tests of the policy's error paths need a device that fails on cue: the n-th `malloc` runs out
//! of memory, the next `synchronize` returns a driver error, and so on. This module holds the
//! vocabulary ([`DeviceCall`], [`Fault`]) and the per-device schedule that `SimDevice` consults on
//! every call. Counting is relative to the moment a fault is scheduled: `n = 1` is the very next
//! call of that kind.

use core::fmt;

/// One kind of call on the simulated device, for counting calls and scheduling faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceCall {
    /// [`Device::malloc`](alloc_core::Device::malloc).
    Malloc,
    /// [`Device::free`](alloc_core::Device::free).
    Free,
    /// [`Device::record_event`](alloc_core::Device::record_event).
    RecordEvent,
    /// [`Device::event_done`](alloc_core::Device::event_done).
    EventDone,
    /// [`Device::synchronize`](alloc_core::Device::synchronize).
    Synchronize,
    /// [`Device::mem_info`](alloc_core::Device::mem_info): a fault makes it report `None`.
    MemInfo,
}

impl DeviceCall {
    /// Every call kind, in declaration order.
    pub const ALL: [DeviceCall; 6] = [
        DeviceCall::Malloc,
        DeviceCall::Free,
        DeviceCall::RecordEvent,
        DeviceCall::EventDone,
        DeviceCall::Synchronize,
        DeviceCall::MemInfo,
    ];

    /// The trait method's name, as used in error messages.
    pub const fn name(self) -> &'static str {
        match self {
            DeviceCall::Malloc => "malloc",
            DeviceCall::Free => "free",
            DeviceCall::RecordEvent => "record_event",
            DeviceCall::EventDone => "event_done",
            DeviceCall::Synchronize => "synchronize",
            DeviceCall::MemInfo => "mem_info",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for DeviceCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an injected failure shows itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `DeviceError::OutOfMemory` (only meaningful for `malloc`; other calls report it as an
    /// error with code [`Fault::OOM_CODE`]).
    OutOfMemory,
    /// A device error carrying this code (`SimError::Injected`).
    Error(i32),
}

impl Fault {
    /// The code a non-malloc call reports for an injected [`Fault::OutOfMemory`] (ACL's
    /// `ACL_ERROR_RT_MEMORY_ALLOCATION`).
    pub const OOM_CODE: i32 = 207_001;
}

/// One scheduled failure: the call kind, the absolute call number it fires on, and whether it
/// keeps firing on every later call.
#[derive(Debug, Clone, Copy)]
struct Scheduled {
    call: DeviceCall,
    at: u64,
    fault: Fault,
    sticky: bool,
}

/// The per-device call counters and failure schedule.
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultPlan {
    calls: [u64; DeviceCall::ALL.len()],
    scheduled: Vec<Scheduled>,
}

impl FaultPlan {
    /// Counts one call of `call` and returns the fault to inject into it, if any.
    pub(crate) fn on_call(&mut self, call: DeviceCall) -> Option<Fault> {
        let count = &mut self.calls[call.index()];
        *count += 1;
        if self.scheduled.is_empty() {
            return None;
        }
        let now = *count;
        let pos = self
            .scheduled
            .iter()
            .position(|s| s.call == call && (s.at == now || (s.sticky && s.at <= now)))?;
        let s = self.scheduled[pos];
        if !s.sticky {
            self.scheduled.remove(pos);
        }
        Some(s.fault)
    }

    /// How many calls of `call` were made so far (failed ones included).
    pub(crate) fn calls(&self, call: DeviceCall) -> u64 {
        self.calls[call.index()]
    }

    /// Schedules `fault` for the `n`-th call of `call` from now (`n = 1`: the next one); with
    /// `sticky`, that call and every later one fail.
    pub(crate) fn schedule(&mut self, call: DeviceCall, n: u64, fault: Fault, sticky: bool) {
        let at = self.calls(call).saturating_add(n.max(1));
        self.scheduled.push(Scheduled {
            call,
            at,
            fault,
            sticky,
        });
    }

    /// Drops every pending fault of `call`.
    pub(crate) fn clear(&mut self, call: DeviceCall) {
        self.scheduled.retain(|s| s.call != call);
    }

    /// Drops every pending fault.
    pub(crate) fn clear_all(&mut self) {
        self.scheduled.clear();
    }

    /// How many faults are still waiting to fire (sticky ones count once).
    pub(crate) fn pending(&self) -> usize {
        self.scheduled.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_call_fires_once() {
        let mut p = FaultPlan::default();
        p.schedule(DeviceCall::Malloc, 2, Fault::OutOfMemory, false);
        assert_eq!(p.on_call(DeviceCall::Malloc), None);
        assert_eq!(
            p.on_call(DeviceCall::Free),
            None,
            "other calls are counted apart"
        );
        assert_eq!(p.on_call(DeviceCall::Malloc), Some(Fault::OutOfMemory));
        assert_eq!(p.on_call(DeviceCall::Malloc), None);
        assert_eq!(p.calls(DeviceCall::Malloc), 3);
        assert_eq!(p.calls(DeviceCall::Free), 1);
        assert_eq!(p.pending(), 0);
    }

    #[test]
    fn counting_is_relative_to_now() {
        let mut p = FaultPlan::default();
        for _ in 0..5 {
            p.on_call(DeviceCall::Synchronize);
        }
        p.schedule(DeviceCall::Synchronize, 1, Fault::Error(7), false);
        assert_eq!(p.on_call(DeviceCall::Synchronize), Some(Fault::Error(7)));
    }

    #[test]
    fn n_zero_means_next() {
        let mut p = FaultPlan::default();
        p.schedule(DeviceCall::Free, 0, Fault::Error(1), false);
        assert_eq!(p.on_call(DeviceCall::Free), Some(Fault::Error(1)));
    }

    #[test]
    fn sticky_keeps_firing_and_clears() {
        let mut p = FaultPlan::default();
        p.schedule(DeviceCall::EventDone, 2, Fault::Error(3), true);
        assert_eq!(p.on_call(DeviceCall::EventDone), None);
        assert_eq!(p.on_call(DeviceCall::EventDone), Some(Fault::Error(3)));
        assert_eq!(p.on_call(DeviceCall::EventDone), Some(Fault::Error(3)));
        assert_eq!(p.pending(), 1);
        p.clear(DeviceCall::EventDone);
        assert_eq!(p.on_call(DeviceCall::EventDone), None);
    }

    #[test]
    fn two_faults_on_one_kind() {
        let mut p = FaultPlan::default();
        p.schedule(DeviceCall::Malloc, 1, Fault::OutOfMemory, false);
        p.schedule(DeviceCall::Malloc, 3, Fault::Error(9), false);
        assert_eq!(p.on_call(DeviceCall::Malloc), Some(Fault::OutOfMemory));
        assert_eq!(p.on_call(DeviceCall::Malloc), None);
        assert_eq!(p.on_call(DeviceCall::Malloc), Some(Fault::Error(9)));
        p.schedule(DeviceCall::Malloc, 1, Fault::Error(1), false);
        p.clear_all();
        assert_eq!(p.on_call(DeviceCall::Malloc), None);
    }

    #[test]
    fn names() {
        let names: Vec<String> = DeviceCall::ALL.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            names,
            [
                "malloc",
                "free",
                "record_event",
                "event_done",
                "synchronize",
                "mem_info"
            ]
        );
    }
}
