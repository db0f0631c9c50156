//! The host-queue hooks: torch_npu launches work from a host task queue, so memory may go back
//! to the device only after that queue is drained and the device synchronized, and the events a
//! free records must come after the work queued before it. The Python package sets torch_npu's
//! own synchronize and drain here; a program without a host queue can set
//! [`npu_alloc_acl_synchronize`]. The hooks are called with no npu-alloc lock held.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Fail, NpuAllocStatus, status};
use crate::exports::{runtime, started_runtime};

/// A device-synchronize hook: drains queued host work for `device` and synchronizes it; returns
/// 0 on success. Before a call over every device, it is called once for each device the
/// library has opened. The drain hook has the same type, and drains without synchronizing.
pub type NpuAllocSyncHook = extern "C" fn(device: c_int) -> c_int;

/// The synchronize hook as an address (0: none); a function pointer fits in a `usize`.
static HOOK: AtomicUsize = AtomicUsize::new(0);
/// The drain hook, the same way.
static DRAIN_HOOK: AtomicUsize = AtomicUsize::new(0);

/// Whether the runtime has started (and was given the hooks), under the lock that orders a
/// start against the hooks' setters: whichever comes second gives the runtime the hooks in
/// force.
static STARTED: Mutex<bool> = Mutex::new(false);

/// Sets the device-synchronize hook (NULL: none). Called, with no npu-alloc lock held, before
/// `npu_alloc_empty_cache`, `npu_alloc_reset`, `npu_alloc_pause` and `npu_alloc_mem_pool_release`
/// give memory back (the first three call it once for each device the library has opened),
/// and before a malloc's out-of-memory retry releases cached memory (for the malloc's device).
/// Without a hook, a malloc never releases cached memory (it runs out of memory instead, with
/// a warning once).
///
/// The hook must return, not throw: a C++ exception or any unwinding out of it is undefined
/// behaviour (catch it and return non-zero). A call into npu-alloc from inside the hook that
/// would need the hook again on the same thread goes on as if the hook had failed (the
/// releasing exports answer `Refused`).
///
/// Setting it does not start the library: torch_npu's own `aclInit` (with its configuration
/// file) must come first, and `install()` sets the hook before torch_npu initializes.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_set_synchronize_hook(hook: Option<extern "C" fn(c_int) -> c_int>) {
    set(&HOOK, hook);
}

/// Sets the drain hook (NULL: none): drains the host's queued work for a device without
/// waiting for the device. With a synchronize hook set, the free of an allocation used on
/// other streams (`npu_alloc_record_stream_handle`) calls it, with no npu-alloc lock held,
/// before it records the events the block waits for: work still in the host's queue would
/// otherwise reach those streams after the events, which would complete while it still reads
/// the block. Without a drain hook the synchronize hook serves, waiting for the device too.
/// Setting it does not start the library. It must return, not throw, as the synchronize hook.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_set_drain_hook(hook: Option<extern "C" fn(c_int) -> c_int>) {
    set(&DRAIN_HOOK, hook);
}

/// Stores a hook, and gives it to the runtime if it has started.
fn set(slot: &AtomicUsize, hook: Option<NpuAllocSyncHook>) {
    // A panic (a poisoned lock) stays on this side.
    crate::error::or((), || {
        before_start(|rt| {
            slot.store(hook.map_or(0, |h| h as usize), Ordering::Release);
            if let Some(rt) = rt {
                apply(rt);
            }
        });
        Ok(())
    });
}

/// Runs `set` for a setting that does not start the library, under the lock that orders it
/// against the start: with the runtime when it has started (its start finishing, at worst),
/// which must be given the setting now; with `None` before, when the start reads it.
pub(crate) fn before_start<T>(
    set: impl FnOnce(Option<&'static npu_runtime::NpuAllocator>) -> T,
) -> T {
    let started = STARTED.lock().unwrap_or_else(|p| p.into_inner());
    set(if *started { started_runtime() } else { None })
}

/// An export's setting that does not start the library: `keep` stores it for the start, and
/// `apply` gives it to the runtime if it has started ([`before_start`]).
pub(crate) fn set_setting(
    keep: impl FnOnce(),
    apply: impl FnOnce(&'static npu_runtime::NpuAllocator),
) -> NpuAllocStatus {
    status(|| {
        before_start(|rt| {
            keep();
            if let Some(rt) = rt {
                apply(rt);
            }
        });
        Ok(())
    })
}

/// Gives a runtime that is starting the hooks, the observers and the settings in force, and
/// marks the start.
pub(crate) fn apply_at_start(rt: &npu_runtime::NpuAllocator) {
    let mut started = STARTED.lock().unwrap_or_else(|p| p.into_inner());
    apply(rt);
    crate::observe::apply_at_start(rt);
    crate::saver_settings::apply_at_start(rt);
    *started = true;
}

/// Gives the runtime the hooks: with a synchronize hook, a malloc stops before releasing
/// cached memory, calls it without the lock and goes on (torch_npu's `UnlockGuard` +
/// `npuSynchronizeDevice`), and a free of an allocation used on other streams drains first;
/// without one, a malloc releases nothing.
pub(crate) fn apply(rt: &npu_runtime::NpuAllocator) {
    let wrap = |h: NpuAllocSyncHook| -> npu_runtime::SyncHook {
        std::sync::Arc::new(move |device: u32| call(h, device) == Some(0))
    };
    match hook() {
        Some(h) => rt.set_host_queue(npu_runtime::HostQueue::SyncFirst, Some(wrap(h))),
        None => rt.set_host_queue(npu_runtime::HostQueue::NoRelease, None),
    }
    rt.set_drain_hook(load(&DRAIN_HOOK).map(wrap));
}

/// The synchronize hook, if one is set.
pub(crate) fn hook() -> Option<NpuAllocSyncHook> {
    load(&HOOK)
}

/// The hook stored in `slot`, if any.
fn load(slot: &AtomicUsize) -> Option<NpuAllocSyncHook> {
    let addr = slot.load(Ordering::Acquire);
    // SAFETY: a non-zero value was stored from a `NpuAllocSyncHook` by `set`, and function
    // pointers round-trip through `usize`.
    (addr != 0).then(|| unsafe { std::mem::transmute::<usize, NpuAllocSyncHook>(addr) })
}

thread_local! {
    /// Whether a hook is running on this thread.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Calls hook `h` for `device`, a C int; `None`, without calling it, when a hook is running
/// on this thread already (a hook that called back into npu-alloc): the inner call goes on as
/// if its hook had failed, instead of recursing without end.
fn call(h: NpuAllocSyncHook, device: u32) -> Option<c_int> {
    /// Clears the flag when the hook returns.
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            let _ = IN_HOOK.try_with(|c| c.set(false));
        }
    }
    if IN_HOOK.try_with(|c| c.replace(true)).unwrap_or(true) {
        return None;
    }
    let _leave = Leave;
    Some(h(c_int::try_from(device).unwrap_or(c_int::MAX)))
}

/// `device`, or (`None`) every device `rt` has opened: one it never used holds none of its
/// memory, and opening it would make an ACL context there.
fn devices(rt: &npu_runtime::NpuAllocator, device: Option<u32>) -> Vec<u32> {
    match device {
        Some(d) => vec![d],
        None => rt.opened_devices().collect(),
    }
}

/// Calls the hook, if one is set, for `device` or (`None`) for each device `rt` has opened; a
/// non-zero answer is a device error.
pub(crate) fn synchronize_before_release(
    rt: &npu_runtime::NpuAllocator,
    device: Option<u32>,
) -> Result<(), Fail> {
    let Some(h) = hook() else {
        return Ok(());
    };
    for d in devices(rt, device) {
        match call(h, d) {
            Some(0) => {}
            None => {
                return Err(Fail::new(
                    NpuAllocStatus::Refused,
                    format!(
                        "the synchronize hook called back into npu-alloc, which needs the hook \
                         for device {d}: nothing was given back"
                    ),
                ));
            }
            Some(code) => {
                return Err(Fail::new(
                    NpuAllocStatus::DeviceError,
                    format!(
                        "the synchronize hook failed with {code} for device {d}; nothing was \
                         given back"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A synchronize hook for programs without a host task queue: `aclrtSynchronizeDevice` on
/// `device` (-1: every device the library has opened), then the calling thread's device is
/// current again. Returns an [`NpuAllocStatus`] as an int.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_acl_synchronize(device: c_int) -> c_int {
    status(|| {
        let rt = runtime()?;
        let device = (device >= 0).then_some(device as u32);
        npu_runtime::keeping_current_device(|| {
            for d in devices(rt, device) {
                rt.with_device(d, alloc_core::Device::synchronize)?
                    .map_err(|e| Fail::new(NpuAllocStatus::DeviceError, e))?;
            }
            Ok(())
        })
    }) as c_int
}
