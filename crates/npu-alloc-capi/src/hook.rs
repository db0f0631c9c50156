//! The device-synchronize hook: torch_npu launches work from a host task queue, so memory may
//! go back to the device only after that queue is drained and the device synchronized. The
//! Python package sets torch_npu's own synchronize here; a program without a host queue can set
//! [`npu_alloc_acl_synchronize`]. The hook is called with no npu-alloc lock held.

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Fail, NpuAllocStatus, status};
use crate::exports::runtime;

/// A device-synchronize hook: drains queued host work for `device` (-1: every device) and
/// synchronizes it; returns 0 on success.
pub type NpuAllocSyncHook = extern "C" fn(device: c_int) -> c_int;

/// The hook as an address (0: none); a function pointer fits in a `usize`.
static HOOK: AtomicUsize = AtomicUsize::new(0);

/// Sets the device-synchronize hook (NULL: none). Called, with no npu-alloc lock held, before
/// `npu_alloc_empty_cache`, `npu_alloc_reset`, `npu_alloc_pause` and `npu_alloc_mem_pool_release`
/// give memory back, and before a malloc's out-of-memory retry releases cached memory. Without
/// a hook, a malloc never releases cached memory (it runs out of memory instead, with a
/// warning once).
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_set_synchronize_hook(hook: Option<extern "C" fn(c_int) -> c_int>) {
    HOOK.store(hook.map_or(0, |h| h as usize), Ordering::Release);
    // A library that cannot start has no runtime to give it to (`runtime` applies the hook
    // when it starts); a panic stays on this side.
    crate::error::or((), || {
        if let Ok(rt) = runtime() {
            apply(rt);
        }
        Ok(())
    });
}

/// Gives the runtime the hook for the OOM path: with one, a malloc stops before releasing
/// cached memory, calls it without the lock and goes on (torch_npu's `UnlockGuard` +
/// `npuSynchronizeDevice`); without one, it releases nothing.
pub(crate) fn apply(rt: &npu_runtime::NpuAllocator) {
    match hook() {
        Some(h) => {
            let hook: npu_runtime::SyncHook = std::sync::Arc::new(move |device: u32| {
                h(c_int::try_from(device).unwrap_or(c_int::MAX)) == 0
            });
            rt.set_host_queue(npu_runtime::HostQueue::SyncFirst, Some(hook));
        }
        None => rt.set_host_queue(npu_runtime::HostQueue::NoRelease, None),
    }
}

/// The hook, if one is set.
pub(crate) fn hook() -> Option<NpuAllocSyncHook> {
    let addr = HOOK.load(Ordering::Acquire);
    // SAFETY: a non-zero value was stored from a `NpuAllocSyncHook` by
    // `npu_alloc_set_synchronize_hook`, and function pointers round-trip through `usize`.
    (addr != 0).then(|| unsafe { std::mem::transmute::<usize, NpuAllocSyncHook>(addr) })
}

/// Calls the hook for `device` (-1: all), if one is set; a non-zero answer is a device error.
pub(crate) fn synchronize_before_release(device: c_int) -> Result<(), Fail> {
    match hook() {
        Some(h) => match h(device) {
            0 => Ok(()),
            code => Err(Fail::new(
                NpuAllocStatus::DeviceError,
                format!("the synchronize hook failed with {code}; nothing was given back"),
            )),
        },
        None => Ok(()),
    }
}

/// A synchronize hook for programs without a host task queue: `aclrtSynchronizeDevice` on
/// `device` (-1: every device). Returns an [`NpuAllocStatus`] as an int.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_acl_synchronize(device: c_int) -> c_int {
    status(|| {
        let rt = runtime()?;
        let devices = if device < 0 {
            0..rt.device_count()
        } else {
            let d = u32::try_from(device).map_err(|_| Fail::invalid("negative device"))?;
            d..d + 1
        };
        for d in devices {
            rt.with_device(d, alloc_core::Device::synchronize)?
                .map_err(|e| Fail::new(NpuAllocStatus::DeviceError, e))?;
        }
        Ok(())
    }) as c_int
}
