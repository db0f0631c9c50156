//! What watches the allocator: out-of-memory observers and the memory history. Both may be set
//! before the library starts (torch_npu's `OOM_SNAPSHOT_ENABLE` asks for them at its own
//! start, before its first allocation), without starting it: npu-alloc's `aclInit` must not
//! come before torch_npu's.

use std::sync::Mutex;

use crate::error::{Fail, NpuAllocStatus, status};
use crate::exports::write_out;
use crate::hook::{before_start, set_setting};

/// An out-of-memory observer, torch's `OutOfMemoryObserver`: the device, the segment size the
/// allocator tried to get, the memory it may use (the fraction's limit, else the device's
/// total) and the device's free memory (0 where the device did not report them). Called after
/// the out-of-memory error, with no npu-alloc lock held, on the thread that ran out; it must
/// return, not throw.
pub type NpuAllocOomObserver =
    extern "C" fn(device: i64, alloc_size: i64, device_total: i64, device_free: i64);

/// The observers attached, given to the runtime at its start.
static OBSERVERS: Mutex<Vec<NpuAllocOomObserver>> = Mutex::new(Vec::new());

/// The history setting (`Some(max_entries)` while recording), given to the runtime at its
/// start and read by [`npu_alloc_is_history_enabled`].
static HISTORY: Mutex<Option<usize>> = Mutex::new(None);

fn attach(rt: &npu_runtime::NpuAllocator, observer: NpuAllocOomObserver) {
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    rt.attach_out_of_memory_observer(move |oom| {
        observer(
            i64::from(oom.device),
            int(oom.alloc_size),
            int(oom.allowed.or(oom.total).unwrap_or(0)),
            int(oom.free.unwrap_or(0)),
        )
    });
}

/// Gives a starting runtime the observers and the history setting.
pub(crate) fn apply_at_start(rt: &npu_runtime::NpuAllocator) {
    for &observer in OBSERVERS.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        attach(rt, observer);
    }
    if let Some(max) = *HISTORY.lock().unwrap_or_else(|p| p.into_inner()) {
        rt.record_memory_history(true, max);
    }
}

/// torch_npu's `attachOutOfMemoryObserver` (`torch.npu.memory._attach_out_of_memory_observer`):
/// `observer(device, alloc_size, device_total, device_free)` is called after each out-of-memory
/// error of the retry chain (not for a `throw_on_npumalloc_oom` rejection, nor for one raised
/// inside an observer), with no npu-alloc lock held, on the thread that ran out: the segment size the
/// allocator tried to get, the memory it may use (the fraction's limit, else the device's
/// total) and the device's free memory (0 where the device did not report them). It must
/// return, not throw. Observers cannot be detached. NULL is `InvalidArgument`. Does not start
/// the library.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_attach_out_of_memory_observer(
    observer: Option<extern "C" fn(i64, i64, i64, i64)>,
) -> NpuAllocStatus {
    status(|| {
        let observer = observer
            .ok_or_else(|| Fail::invalid("attach_out_of_memory_observer: null observer"))?;
        before_start(|rt| {
            OBSERVERS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(observer);
            if let Some(rt) = rt {
                attach(rt, observer);
            }
        });
        Ok(())
    })
}

/// `_record_memory_history`: with `enabled`, every device keeps its last `max_entries` trace
/// entries (at least 1); without, recording stops and what was recorded is forgotten. Does not
/// start the library: set before, it applies from the start.
#[unsafe(no_mangle)]
pub extern "C" fn npu_alloc_record_memory_history(
    enabled: bool,
    max_entries: usize,
) -> NpuAllocStatus {
    set_setting(
        || *HISTORY.lock().unwrap_or_else(|p| p.into_inner()) = enabled.then_some(max_entries),
        |rt| rt.record_memory_history(enabled, max_entries),
    )
}

/// torch_npu's `_npu_isHistoryEnabled()` into `*enabled`: whether
/// [`npu_alloc_record_memory_history`] turned recording on. Does not start the library.
///
/// # Safety
/// `enabled` is a writable `bool`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn npu_alloc_is_history_enabled(enabled: *mut bool) -> NpuAllocStatus {
    status(|| {
        // SAFETY: `enabled` is null or writable by the caller's contract.
        unsafe {
            write_out(enabled, "is_history_enabled: null pointer", || {
                Ok(HISTORY.lock().unwrap_or_else(|p| p.into_inner()).is_some())
            })
        }
    })
}
