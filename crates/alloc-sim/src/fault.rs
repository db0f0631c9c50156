//! Fault injection in front of any [`Device`], in the spirit of smoltcp's `FaultInjector`.
//!
//! Tests of the policy's error paths need a device that fails on cue: the n-th `malloc` runs out
//! of memory, the next `synchronize` returns a driver error, and so on. [`FaultInjector`] wraps a
//! device (the simulated one, the ACL device, a loom model's) and consults its schedule on every
//! call: a call due to fail does not reach the wrapped device at all. Counting is relative to the
//! moment a fault is scheduled: `n = 1` is the very next call of that kind.

use core::fmt;
use core::ops::{Deref, DerefMut};

use alloc_core::{Device, DeviceError, MemInfo, VmmError};

use crate::sim_device::SimDevice;

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
    /// [`Device::mem_info`](alloc_core::Device::mem_info).
    MemInfo,
    /// [`Device::reserve_address`](alloc_core::Device::reserve_address).
    ReserveAddress,
    /// [`Device::release_address`](alloc_core::Device::release_address).
    ReleaseAddress,
    /// [`Device::create_page`](alloc_core::Device::create_page).
    CreatePage,
    /// [`Device::release_page`](alloc_core::Device::release_page).
    ReleasePage,
    /// [`Device::map`](alloc_core::Device::map).
    Map,
    /// [`Device::unmap`](alloc_core::Device::unmap).
    Unmap,
    /// [`Device::alloc_host`](alloc_core::Device::alloc_host).
    AllocHost,
    /// [`Device::free_host`](alloc_core::Device::free_host).
    FreeHost,
    /// [`Device::copy_to_host`](alloc_core::Device::copy_to_host).
    CopyToHost,
    /// [`Device::copy_to_device`](alloc_core::Device::copy_to_device).
    CopyToDevice,
}

impl DeviceCall {
    /// Every call kind, in declaration order.
    pub const ALL: [DeviceCall; 16] = [
        DeviceCall::Malloc,
        DeviceCall::Free,
        DeviceCall::RecordEvent,
        DeviceCall::EventDone,
        DeviceCall::Synchronize,
        DeviceCall::MemInfo,
        DeviceCall::ReserveAddress,
        DeviceCall::ReleaseAddress,
        DeviceCall::CreatePage,
        DeviceCall::ReleasePage,
        DeviceCall::Map,
        DeviceCall::Unmap,
        DeviceCall::AllocHost,
        DeviceCall::FreeHost,
        DeviceCall::CopyToHost,
        DeviceCall::CopyToDevice,
    ];

    /// The host-memory calls of the memory saver's CPU backup, in declaration order.
    pub const HOST: [DeviceCall; 4] = [
        DeviceCall::AllocHost,
        DeviceCall::FreeHost,
        DeviceCall::CopyToHost,
        DeviceCall::CopyToDevice,
    ];

    /// The virtual-memory calls (expandable segments), in declaration order.
    pub const VMM: [DeviceCall; 6] = [
        DeviceCall::ReserveAddress,
        DeviceCall::ReleaseAddress,
        DeviceCall::CreatePage,
        DeviceCall::ReleasePage,
        DeviceCall::Map,
        DeviceCall::Unmap,
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
            DeviceCall::ReserveAddress => "reserve_address",
            DeviceCall::ReleaseAddress => "release_address",
            DeviceCall::CreatePage => "create_page",
            DeviceCall::ReleasePage => "release_page",
            DeviceCall::Map => "map",
            DeviceCall::Unmap => "unmap",
            DeviceCall::AllocHost => "alloc_host",
            DeviceCall::FreeHost => "free_host",
            DeviceCall::CopyToHost => "copy_to_host",
            DeviceCall::CopyToDevice => "copy_to_device",
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
    /// `DeviceError::OutOfMemory` from `malloc` and `VmmError::OutOfMemory` from `create_page`
    /// and `alloc_host` (the calls where it means something); other calls report it as an error
    /// with code [`Fault::OOM_CODE`].
    OutOfMemory,
    /// A device error carrying this code (`SimError::Injected`).
    Error(i32),
}

impl Fault {
    /// The code a non-malloc call reports for an injected [`Fault::OutOfMemory`] (ACL's
    /// `ACL_ERROR_RT_MEMORY_ALLOCATION`).
    pub const OOM_CODE: i32 = 207_001;

    /// The code the failed call reports.
    pub const fn code(self) -> i32 {
        match self {
            Fault::OutOfMemory => Fault::OOM_CODE,
            Fault::Error(code) => code,
        }
    }
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
    /// A fault on a call that already has one due is not scheduled: only one could fire.
    pub(crate) fn schedule(&mut self, call: DeviceCall, n: u64, fault: Fault, sticky: bool) {
        let at = self.calls(call).saturating_add(n.max(1));
        if self.scheduled.iter().any(|s| s.call == call && s.at == at) {
            return;
        }
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

/// A failure injected by a [`FaultInjector`], or the wrapped device's own error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultError<E> {
    /// A failure scheduled with [`FaultInjector::fail_nth`] or [`FaultInjector::fail_from`].
    Injected {
        /// The call that failed.
        call: DeviceCall,
        /// The code it reports.
        code: i32,
    },
    /// The wrapped device failed by itself.
    Device(E),
}

impl<E: fmt::Display> fmt::Display for FaultError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultError::Injected { call, code } => {
                write!(f, "injected {call} failure (code {code})")
            }
            FaultError::Device(e) => e.fmt(f),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for FaultError<E> {}

/// A [`Device`] that fails on cue: wraps `D` and fails the calls scheduled with
/// [`FaultInjector::fail_nth`] / [`FaultInjector::fail_from`], passing every other call through.
/// A failed call changes nothing in the wrapped device (it never reaches it).
///
/// It dereferences to the wrapped device, so its own controls (completing events, reading
/// counters) stay one call away.
#[derive(Debug, Clone, Default)]
pub struct FaultInjector<D> {
    inner: D,
    plan: FaultPlan,
}

impl<D> FaultInjector<D> {
    /// Wraps `inner` with no fault scheduled.
    pub fn new(inner: D) -> Self {
        FaultInjector {
            inner,
            plan: FaultPlan::default(),
        }
    }

    /// Builder: schedules a fault, as [`FaultInjector::fail_nth`] does.
    pub fn with_fault(mut self, call: DeviceCall, n: u64, fault: Fault) -> Self {
        self.fail_nth(call, n, fault);
        self
    }

    /// Makes the `n`-th call of `call` counted from now fail with `fault` (`n = 1`, or 0: the next
    /// call); nothing if a fault is already due on that call. [`Fault::OutOfMemory`] on a call other than `malloc` is reported as
    /// [`FaultError::Injected`] with [`Fault::OOM_CODE`].
    pub fn fail_nth(&mut self, call: DeviceCall, n: u64, fault: Fault) {
        self.plan.schedule(call, n, fault, false);
    }

    /// Like [`FaultInjector::fail_nth`], but that call and every later call of `call` fail until
    /// [`FaultInjector::clear_faults`].
    pub fn fail_from(&mut self, call: DeviceCall, n: u64, fault: Fault) {
        self.plan.schedule(call, n, fault, true);
    }

    /// Cancels every pending fault of `call`.
    pub fn clear_faults(&mut self, call: DeviceCall) {
        self.plan.clear(call);
    }

    /// Cancels every pending fault.
    pub fn clear_all_faults(&mut self) {
        self.plan.clear_all();
    }

    /// How many scheduled faults have not fired yet (a `fail_from` fault stays pending).
    pub fn pending_faults(&self) -> usize {
        self.plan.pending()
    }

    /// Calls of `call` made through the injector so far, injected failures included.
    pub fn calls(&self, call: DeviceCall) -> u64 {
        self.plan.calls(call)
    }

    /// The wrapped device.
    pub fn get_ref(&self) -> &D {
        &self.inner
    }

    /// The wrapped device, mutably.
    pub fn get_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    /// Unwraps the device.
    pub fn into_inner(self) -> D {
        self.inner
    }

    /// The injected error for `fault` on `call`, if one is due.
    fn check<E>(&mut self, call: DeviceCall) -> Result<(), FaultError<E>> {
        match self.plan.on_call(call) {
            None => Ok(()),
            Some(fault) => Err(FaultError::Injected {
                call,
                code: fault.code(),
            }),
        }
    }

    /// The injected failure of a virtual-memory call, if one is due: out-of-memory where `call`
    /// can report it (`create_page`), else the fault's code.
    fn check_vmm<E>(&mut self, call: DeviceCall) -> Result<(), VmmError<FaultError<E>>> {
        match self.plan.on_call(call) {
            None => Ok(()),
            Some(Fault::OutOfMemory)
                if matches!(call, DeviceCall::CreatePage | DeviceCall::AllocHost) =>
            {
                Err(VmmError::OutOfMemory)
            }
            Some(fault) => Err(VmmError::Other(FaultError::Injected {
                call,
                code: fault.code(),
            })),
        }
    }
}

impl<D> Deref for FaultInjector<D> {
    type Target = D;
    fn deref(&self) -> &D {
        &self.inner
    }
}

impl<D> DerefMut for FaultInjector<D> {
    fn deref_mut(&mut self) -> &mut D {
        &mut self.inner
    }
}

impl<D: AsRef<SimDevice>> AsRef<SimDevice> for FaultInjector<D> {
    fn as_ref(&self) -> &SimDevice {
        self.inner.as_ref()
    }
}

impl<D: Device> Device for FaultInjector<D> {
    type Stream = D::Stream;
    type Event = D::Event;
    type Error = FaultError<D::Error>;
    type Page = D::Page;
    type HostBuffer = D::HostBuffer;

    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError<Self::Error>> {
        match self.plan.on_call(DeviceCall::Malloc) {
            None => {}
            Some(Fault::OutOfMemory) => return Err(DeviceError::OutOfMemory),
            Some(Fault::Error(code)) => {
                return Err(DeviceError::Other(FaultError::Injected {
                    call: DeviceCall::Malloc,
                    code,
                }));
            }
        }
        self.inner.malloc(bytes).map_err(|e| match e {
            DeviceError::OutOfMemory => DeviceError::OutOfMemory,
            DeviceError::Other(e) => DeviceError::Other(FaultError::Device(e)),
        })
    }

    fn free(&mut self, addr: u64, bytes: u64) -> Result<(), Self::Error> {
        self.check(DeviceCall::Free)?;
        self.inner.free(addr, bytes).map_err(FaultError::Device)
    }

    fn mem_info(&mut self) -> Result<MemInfo, Self::Error> {
        self.check(DeviceCall::MemInfo)?;
        self.inner.mem_info().map_err(FaultError::Device)
    }

    fn record_event(&mut self, stream: D::Stream) -> Result<D::Event, Self::Error> {
        self.check(DeviceCall::RecordEvent)?;
        self.inner.record_event(stream).map_err(FaultError::Device)
    }

    fn event_done(&mut self, event: &D::Event) -> Result<bool, Self::Error> {
        self.check(DeviceCall::EventDone)?;
        self.inner.event_done(event).map_err(FaultError::Device)
    }

    fn release_event(&mut self, event: D::Event) {
        self.inner.release_event(event);
    }

    fn synchronize(&mut self) -> Result<(), Self::Error> {
        self.check(DeviceCall::Synchronize)?;
        self.inner.synchronize().map_err(FaultError::Device)
    }

    fn reserve_address(&mut self, bytes: u64) -> Result<u64, VmmError<Self::Error>> {
        self.check_vmm(DeviceCall::ReserveAddress)?;
        self.inner.reserve_address(bytes).map_err(wrap_vmm)
    }

    fn release_address(&mut self, addr: u64, bytes: u64) -> Result<(), VmmError<Self::Error>> {
        self.check_vmm(DeviceCall::ReleaseAddress)?;
        self.inner.release_address(addr, bytes).map_err(wrap_vmm)
    }

    fn create_page(&mut self, bytes: u64) -> Result<D::Page, VmmError<Self::Error>> {
        self.check_vmm(DeviceCall::CreatePage)?;
        self.inner.create_page(bytes).map_err(wrap_vmm)
    }

    fn release_page(&mut self, page: D::Page) -> Result<(), (D::Page, VmmError<Self::Error>)> {
        if let Err(e) = self.check_vmm(DeviceCall::ReleasePage) {
            return Err((page, e));
        }
        self.inner
            .release_page(page)
            .map_err(|(page, e)| (page, wrap_vmm(e)))
    }

    fn map(&mut self, addr: u64, bytes: u64, page: &D::Page) -> Result<(), VmmError<Self::Error>> {
        self.check_vmm(DeviceCall::Map)?;
        self.inner.map(addr, bytes, page).map_err(wrap_vmm)
    }

    fn unmap(&mut self, addr: u64, bytes: u64) -> Result<(), VmmError<Self::Error>> {
        self.check_vmm(DeviceCall::Unmap)?;
        self.inner.unmap(addr, bytes).map_err(wrap_vmm)
    }

    fn alloc_host(&mut self, bytes: u64) -> Result<D::HostBuffer, VmmError<Self::Error>> {
        self.check_vmm(DeviceCall::AllocHost)?;
        self.inner.alloc_host(bytes).map_err(wrap_vmm)
    }

    fn free_host(
        &mut self,
        buffer: D::HostBuffer,
    ) -> Result<(), (D::HostBuffer, VmmError<Self::Error>)> {
        if let Err(e) = self.check_vmm(DeviceCall::FreeHost) {
            return Err((buffer, e));
        }
        self.inner
            .free_host(buffer)
            .map_err(|(buffer, e)| (buffer, wrap_vmm(e)))
    }

    fn copy_to_host(
        &mut self,
        dst: &mut D::HostBuffer,
        src: u64,
        bytes: u64,
    ) -> Result<(), VmmError<Self::Error>> {
        self.check_vmm(DeviceCall::CopyToHost)?;
        self.inner.copy_to_host(dst, src, bytes).map_err(wrap_vmm)
    }

    fn copy_to_device(
        &mut self,
        dst: u64,
        src: &D::HostBuffer,
        bytes: u64,
    ) -> Result<(), VmmError<Self::Error>> {
        self.check_vmm(DeviceCall::CopyToDevice)?;
        self.inner.copy_to_device(dst, src, bytes).map_err(wrap_vmm)
    }
}

/// The wrapped device's own virtual-memory error, as the injector reports it.
fn wrap_vmm<E>(e: VmmError<E>) -> VmmError<FaultError<E>> {
    match e {
        VmmError::Unsupported => VmmError::Unsupported,
        VmmError::OutOfMemory => VmmError::OutOfMemory,
        VmmError::Other(e) => VmmError::Other(FaultError::Device(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim_device::{SimError, SimStream};

    const MIB: u64 = 1 << 20;

    #[test]
    fn injected_mem_info_failure_fails_once() {
        let mut d = FaultInjector::new(SimDevice::new(MIB)).with_fault(
            DeviceCall::MemInfo,
            1,
            Fault::Error(1),
        );
        assert_eq!(
            d.mem_info(),
            Err(FaultError::Injected {
                call: DeviceCall::MemInfo,
                code: 1
            })
        );
        assert!(d.mem_info().is_ok());
        assert_eq!(d.calls(DeviceCall::MemInfo), 2);
    }

    #[test]
    fn injected_malloc_oom_and_error() {
        let mut d = FaultInjector::new(SimDevice::new(100 * MIB)).with_fault(
            DeviceCall::Malloc,
            2,
            Fault::OutOfMemory,
        );
        assert!(d.malloc(MIB).is_ok());
        assert_eq!(d.malloc(MIB), Err(DeviceError::OutOfMemory));
        assert!(d.malloc(MIB).is_ok());
        d.fail_nth(DeviceCall::Malloc, 1, Fault::Error(507_899));
        assert_eq!(
            d.malloc(MIB),
            Err(DeviceError::Other(FaultError::Injected {
                call: DeviceCall::Malloc,
                code: 507_899
            }))
        );
        assert_eq!(d.calls(DeviceCall::Malloc), 4);
        assert_eq!(d.successful_mallocs(), 2);
        assert_eq!(d.outstanding_bytes(), 2 * MIB);
        assert_eq!(d.pending_faults(), 0);
    }

    #[test]
    fn injected_free_leaves_segment_live() {
        let mut d = FaultInjector::new(SimDevice::new(100 * MIB));
        let a = d.malloc(MIB).unwrap();
        d.fail_nth(DeviceCall::Free, 1, Fault::Error(5));
        assert_eq!(
            d.free(a, MIB),
            Err(FaultError::Injected {
                call: DeviceCall::Free,
                code: 5
            })
        );
        assert_eq!(d.outstanding_segments(), 1);
        assert_eq!(d.free(a, MIB), Ok(()));
    }

    #[test]
    fn injected_event_and_sync_failures() {
        let mut d = FaultInjector::new(SimDevice::new(MIB));
        d.fail_nth(DeviceCall::RecordEvent, 1, Fault::Error(1));
        assert_eq!(
            d.record_event(SimStream(0)),
            Err(FaultError::Injected {
                call: DeviceCall::RecordEvent,
                code: 1
            })
        );
        assert_eq!(d.events_recorded(), 0);
        assert_eq!(d.outstanding_events(), 0);
        let e = d.record_event(SimStream(0)).unwrap();

        d.fail_nth(DeviceCall::EventDone, 1, Fault::OutOfMemory);
        assert_eq!(
            d.event_done(&e),
            Err(FaultError::Injected {
                call: DeviceCall::EventDone,
                code: Fault::OOM_CODE
            })
        );
        assert_eq!(d.event_done(&e), Ok(false));

        d.fail_nth(DeviceCall::Synchronize, 1, Fault::Error(3));
        assert_eq!(
            d.synchronize(),
            Err(FaultError::Injected {
                call: DeviceCall::Synchronize,
                code: 3
            })
        );
        assert_eq!(
            d.event_done(&e),
            Ok(false),
            "a failed synchronize completes nothing"
        );
        assert_eq!(d.synchronize(), Ok(()));
        assert_eq!(d.event_done(&e), Ok(true));
        assert_eq!(d.calls(DeviceCall::Synchronize), 2);
        d.release_event(e);
    }

    #[test]
    fn sticky_faults_until_cleared() {
        let mut d = FaultInjector::new(SimDevice::new(100 * MIB));
        d.fail_from(DeviceCall::Malloc, 1, Fault::OutOfMemory);
        for _ in 0..3 {
            assert_eq!(d.malloc(MIB), Err(DeviceError::OutOfMemory));
        }
        d.fail_nth(DeviceCall::Synchronize, 1, Fault::Error(2));
        d.clear_faults(DeviceCall::Malloc);
        assert!(d.malloc(MIB).is_ok());
        assert_eq!(d.pending_faults(), 1);
        d.clear_all_faults();
        assert_eq!(d.synchronize(), Ok(()));
    }

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
    fn injected_virtual_memory_failures() {
        let mut d = FaultInjector::new(SimDevice::new(100 * MIB));
        d.fail_nth(DeviceCall::CreatePage, 1, Fault::OutOfMemory);
        assert_eq!(d.create_page(2 * MIB), Err(VmmError::OutOfMemory));
        let page = d.create_page(2 * MIB).unwrap();
        d.fail_nth(DeviceCall::ReleasePage, 1, Fault::Error(7));
        // The page comes back with the error and the device still counts it.
        let (page, e) = d.release_page(page).unwrap_err();
        assert_eq!(
            e,
            VmmError::Other(FaultError::Injected {
                call: DeviceCall::ReleasePage,
                code: 7
            })
        );
        assert_eq!(d.live_pages(), 1);
        d.fail_nth(DeviceCall::ReserveAddress, 1, Fault::OutOfMemory);
        assert_eq!(
            d.reserve_address(512),
            Err(VmmError::Other(FaultError::Injected {
                call: DeviceCall::ReserveAddress,
                code: Fault::OOM_CODE
            }))
        );
        assert_eq!(d.release_page(page), Ok(()));
        assert_eq!(d.live_pages(), 0);
        assert_eq!(d.calls(DeviceCall::CreatePage), 2);
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
                "mem_info",
                "reserve_address",
                "release_address",
                "create_page",
                "release_page",
                "map",
                "unmap",
                "alloc_host",
                "free_host",
                "copy_to_host",
                "copy_to_device"
            ]
        );
    }

    #[test]
    fn injected_error_message() {
        let e: FaultError<SimError> = FaultError::Injected {
            call: DeviceCall::Free,
            code: 9,
        };
        assert_eq!(e.to_string(), "injected free failure (code 9)");
        let e: FaultError<SimError> = FaultError::Device(SimError::ZeroSize);
        assert_eq!(e.to_string(), "malloc of 0 bytes");
    }
}
