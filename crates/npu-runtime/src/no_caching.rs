//! `PYTORCH_NO_NPU_MEMORY_CACHING=1`: no cache. Each `malloc` is a device malloc of the size
//! plus the pad (torch_npu's Align32 of size + 32), each `free` synchronizes the device and
//! frees. As in torch, no statistics are kept.

use std::collections::HashMap;

use alloc_core::{DeviceError, OutOfMemory, size::MAX_REQUEST};

use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::sync::{Arc, Mutex};

/// One device without a cache: the backend and the live allocations (address → bytes).
pub(crate) struct Uncached<B: Backend> {
    index: u32,
    backend: Arc<B>,
    live: Mutex<HashMap<u64, u64>>,
}

impl<B: Backend> Uncached<B> {
    /// Device `index` of `backend`, nothing allocated.
    pub(crate) fn new(backend: Arc<B>, index: u32) -> Self {
        Uncached {
            index,
            backend,
            live: Mutex::new(HashMap::new()),
        }
    }

    /// One device malloc of `size` + pad; 0 for a zero-size request.
    pub(crate) fn malloc(&self, size: u64) -> Result<u64, RuntimeError<B::Error>> {
        if size >= MAX_REQUEST {
            return Err(RuntimeError::TooLarge { size });
        }
        if size == 0 {
            return Ok(0);
        }
        let bytes = size + self.backend.pad();
        match self.backend.raw_malloc(self.index, bytes) {
            Ok(addr) => {
                self.live.lock().insert(addr, bytes);
                Ok(addr)
            }
            Err(DeviceError::Other(e)) => Err(RuntimeError::Device(e)),
            Err(DeviceError::OutOfMemory) => {
                let info = self.backend.mem_get_info(self.index).ok();
                Err(RuntimeError::OutOfMemory(OutOfMemory {
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
            }
        }
    }

    /// Synchronizes the device and frees `addr`; on failure `addr` stays live.
    pub(crate) fn free(&self, addr: u64) -> Result<(), RuntimeError<B::Error>> {
        let bytes = self
            .live
            .lock()
            .remove(&addr)
            .ok_or(RuntimeError::InvalidPointer { addr })?;
        let result = self
            .backend
            .synchronize(self.index)
            .and_then(|()| self.backend.raw_free(self.index, addr, bytes));
        result.map_err(|e| {
            self.live.lock().insert(addr, bytes);
            RuntimeError::Device(e)
        })
    }

    /// Whether `addr` is a live allocation (`record_stream` has nothing else to do: every free
    /// synchronizes the device).
    pub(crate) fn contains(&self, addr: u64) -> bool {
        self.live.lock().contains_key(&addr)
    }
}
