//! torch_npu's task queue: work the host queued but the device has not seen may still use
//! memory the cache holds. [`Runtime::set_host_queue`] says what a malloc does before it gives
//! cached memory back (alloc-core's [`HostQueue`]) and which hook drains the queue.

use alloc_core::{Device, HostQueue};

use crate::api::{Entry, Runtime};
use crate::device_allocator::{HostHooks, SyncHook};

impl<D> Runtime<D>
where
    D: Device<Stream: Send + Sync, Event: Send, Error: Send> + Send + 'static,
{
    /// On every device (those opened later too): what a malloc does before it releases cached
    /// memory in its retry chain or GC, and the hook that drains the host's queue and
    /// synchronizes a device (called without any npu-alloc lock held, as torch_npu's
    /// `UnlockGuard` does). With [`HostQueue::SyncFirst`] and no hook, or a hook that fails,
    /// nothing is released and the malloc runs out of memory (with a warning once). Without
    /// caching (`PYTORCH_NO_NPU_MEMORY_CACHING`), each free calls the hook before it
    /// synchronizes the device, as torch_npu's `uncached_delete` drains its queue.
    ///
    /// With [`HostQueue::SyncFirst`], a free of an allocation used on other streams
    /// (`record_stream`) first drains the host's queue, without the lock, with the
    /// [`Runtime::set_drain_hook`] hook or else this one: its events must be recorded behind the
    /// work the host queued on those streams.
    pub fn set_host_queue(&self, host_queue: HostQueue, hook: Option<SyncHook>) {
        let mut host = self.host.lock();
        host.0 = host_queue;
        host.1.synchronize = hook;
        self.apply_host(&host);
    }

    /// On every device (those opened later too): the hook that drains the host's queued work
    /// for a device without waiting for the device (torch_npu's `MakeSureQueueEmpty`), which a
    /// free of an allocation used on other streams calls under [`HostQueue::SyncFirst`] before
    /// it records its events. Without one, the synchronize hook of
    /// [`Runtime::set_host_queue`] serves.
    pub fn set_drain_hook(&self, hook: Option<SyncHook>) {
        let mut host = self.host.lock();
        host.1.drain = hook;
        self.apply_host(&host);
    }

    /// Gives every opened device the host-queue mode and hooks.
    fn apply_host(&self, host: &(HostQueue, HostHooks)) {
        for entry in self.opened_all() {
            entry.set_host(host);
        }
    }
}

impl<D: Device> Entry<D> {
    /// Gives this device the host-queue mode and hooks (without caching, the synchronize hook
    /// alone: every free synchronizes).
    pub(crate) fn set_host(&self, host: &(HostQueue, HostHooks)) {
        match self {
            Entry::Caching(a) => a.set_host_queue(host.0, host.1.clone()),
            Entry::Uncached(u) => u.set_sync_hook(host.1.synchronize.clone()),
        }
    }
}
