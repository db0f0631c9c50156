//! `PYTORCH_NO_NPU_MEMORY_CACHING=1`: no cache. Each `malloc` is a device malloc of the size
//! plus the pad (torch_npu's Align32 of size + 32), each `free` synchronizes the device and
//! frees. As in torch, no statistics are kept.
//!
//! torch_npu's `uncached_delete` synchronizes with `npuSynchronizeDevice`, which first drains
//! its host task queue: work queued there may still use the memory. So a free calls the host's
//! synchronize hook ([`Runtime::set_host_queue`](crate::Runtime::set_host_queue)) first when one
//! is set, without any lock held, then synchronizes the device itself.

use std::collections::HashMap;

use alloc_core::{AllocError, Device, DeviceError, FreeError, OutOfMemory, size::MAX_REQUEST};

use crate::device_allocator::{Shared, SyncHook};
use crate::error::RuntimeError;
use crate::sync::Mutex;

/// One device without a cache: the device and the live allocations (address → bytes).
pub(crate) struct Uncached<D> {
    index: u32,
    pad: u64,
    device: Shared<D>,
    live: Mutex<HashMap<u64, u64>>,
    /// The host's synchronize hook, called before each free.
    sync_hook: Mutex<Option<SyncHook>>,
}

impl<D: Device> Uncached<D> {
    /// Device `index`, nothing allocated; every request takes `pad` more bytes.
    pub(crate) fn new(device: Shared<D>, index: u32, pad: u64) -> Self {
        Uncached {
            index,
            pad,
            device,
            live: Mutex::new(HashMap::new()),
            sync_hook: Mutex::new(None),
        }
    }

    /// The hook that drains the host's queue before a free (none: the device sync only).
    pub(crate) fn set_sync_hook(&self, hook: Option<SyncHook>) {
        *self.sync_hook.lock() = hook;
    }

    /// One device malloc of `size` + pad; 0 for a zero-size request.
    pub(crate) fn malloc(&self, size: u64) -> Result<u64, RuntimeError<D::Error>> {
        if size >= MAX_REQUEST {
            return Err(AllocError::TooLarge { size }.into());
        }
        if size == 0 {
            return Ok(0);
        }
        let bytes = size + self.pad;
        let result = self.device.lock().malloc(bytes);
        match result {
            Ok(addr) => {
                self.live.lock().insert(addr, bytes);
                Ok(addr)
            }
            Err(DeviceError::Other(e)) => Err(AllocError::Device(e).into()),
            Err(DeviceError::OutOfMemory) => {
                let info = self.device.lock().mem_info().ok();
                Err(AllocError::OutOfMemory(Box::new(OutOfMemory {
                    device: self.index,
                    requested: size,
                    alloc_size: bytes,
                    total: info.map(|m| m.total),
                    free: info.map(|m| m.free),
                    allocated: 0,
                    active: 0,
                    reserved: 0,
                    allowed: None,
                }))
                .into())
            }
        }
    }

    /// Synchronizes the device and frees `addr`; on failure `addr` stays live.
    pub(crate) fn free(&self, addr: u64) -> Result<(), RuntimeError<D::Error>> {
        let bytes = self
            .live
            .lock()
            .remove(&addr)
            .ok_or(FreeError::ForeignPointer { addr })?;
        // As torch_npu's npuSynchronizeDevice(false): a failed drain is not an error; the device
        // synchronization below still runs.
        let hook = self.sync_hook.lock().clone();
        if let Some(hook) = hook {
            hook(self.index);
        }
        let result = {
            let mut device = self.device.lock();
            device.synchronize().and_then(|()| device.free(addr, bytes))
        };
        result.map_err(|e| {
            self.live.lock().insert(addr, bytes);
            FreeError::Device(e).into()
        })
    }

    /// Whether `addr` is a live allocation (`record_stream` has nothing else to do: every free
    /// synchronizes the device).
    pub(crate) fn contains(&self, addr: u64) -> bool {
        self.live.lock().contains_key(&addr)
    }
}
