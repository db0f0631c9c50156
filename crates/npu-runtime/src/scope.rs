//! Private pools (torch's `MemPool`, `use_mem_pool`) and the memory saver (torch_memory_saver's
//! `region`, `pause`, `resume`) at the runtime's edge.
//!
//! The policy lives in `alloc-core`; the runtime adds what a process needs around it: a
//! thread-local stack of open scopes, so that allocations made by this thread inside a
//! `use_mem_pool` or a `region` go to that pool (torch routes only the current thread's
//! allocations, per device, innermost scope first), the per-device locking, and pause and resume
//! across every device. Scopes come as guards that end them when dropped, and as explicit
//! begin/end calls for callers without Rust lifetimes (the C ABI).

use core::cell::RefCell;

use alloc_core::{CpuBackup, Device, PoolId, SaverError, SaverStats};

use crate::api::{Entry, Runtime};
use crate::device_allocator::DeviceAllocator;
use crate::error::RuntimeError;
use crate::sync::global;
use crate::sync::thread_local;
use crate::sync::{Arc, AtomicU64, Ordering};
use crate::warn_once::warn_once;

/// One open scope of this thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scope {
    runtime: u64,
    device: u32,
    pool: PoolId,
    region: bool,
}

/// This thread's open scopes, each with its runtime's count of open scopes.
#[derive(Default)]
struct OpenScopes(Vec<(Scope, Arc<AtomicU64>)>);

/// A thread that ends with scopes open (begun through the C ABI and never ended) takes them
/// out of their runtimes' counts: no malloc can be routed by them any more, and a count left
/// above 0 would send every later malloc of the process to the thread-local lookup. The pools'
/// holds stay, as torch's `captures_underway` entry of such a thread stays.
impl Drop for OpenScopes {
    fn drop(&mut self) {
        for (_, open) in self.0.drain(..) {
            open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

thread_local! {
    // Not `const { .. }`: loom's thread_local, which stands in for std's in the models, has no
    // const form.
    #[allow(clippy::missing_const_for_thread_local)]
    static SCOPES: RefCell<OpenScopes> = RefCell::new(OpenScopes::default());
}

/// A new runtime's id, for telling its scopes apart.
pub(crate) fn next_runtime_id() -> u64 {
    static NEXT: global::AtomicU64 = global::AtomicU64::new(1);
    NEXT.fetch_add(1, global::Ordering::Relaxed)
}

/// What torch's `MemPool(...)` constructor sets beside the pool ([`Runtime::mem_pool_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemPoolOptions {
    /// torch's `use_on_oom`: default-pool mallocs that run out may take its cached blocks.
    pub use_on_oom: bool,
    /// torch_npu's `no_split`: its blocks are handed out whole.
    pub no_split: bool,
}

/// A private pool of one device, held until dropped (torch's `MemPool`): dropping it releases
/// it and gives its whole free segments back (its live blocks keep it until they are freed).
#[must_use = "dropping a MemPool releases it at once"]
pub struct MemPool<'a, D: Device> {
    runtime: &'a Runtime<D>,
    device: u32,
    id: PoolId,
}

impl<D: Device> core::fmt::Debug for MemPool<'_, D> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemPool")
            .field("device", &self.device)
            .field("id", &self.id)
            .finish()
    }
}

/// An open `use_mem_pool` or `region` scope; dropping it ends it. It stays on the thread that
/// opened it (not `Send`): the scope is that thread's, and a drop elsewhere could not end it.
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// fn scope(rt: &npu_runtime::NpuAllocator) {
///     send(rt.region(0, "kv", false).unwrap());
/// }
/// ```
#[must_use = "dropping the guard ends the scope at once"]
pub struct ScopeGuard<'a, D: Device> {
    runtime: &'a Runtime<D>,
    scope: Scope,
    _thread: core::marker::PhantomData<*const ()>,
}

impl<D: Device> core::fmt::Debug for ScopeGuard<'_, D> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ScopeGuard")
            .field("device", &self.scope.device)
            .field("pool", &self.scope.pool)
            .finish()
    }
}

impl<D> Runtime<D>
where
    D: Device<Stream: Send + Sync, Event: Send, Error: Send> + Send + 'static,
{
    /// The pool this thread's allocations on `device` go to: the innermost open scope of this
    /// runtime on that device.
    #[inline]
    pub(crate) fn routed_pool(&self, device: u32) -> Option<PoolId> {
        // This thread's own scopes were counted before this call (same-thread order), so zero
        // means none of them is open; another thread's count only sends us to the lookup.
        if self.open_scopes.load(Ordering::Relaxed) == 0 {
            return None;
        }
        // `try_with`: a malloc from another thread-local's destructor, after this one's, routes
        // nowhere rather than panicking.
        SCOPES
            .try_with(|s| {
                s.borrow()
                    .0
                    .iter()
                    .rev()
                    .find(|(x, _)| x.runtime == self.id && x.device == device)
                    .map(|(x, _)| x.pool)
            })
            .ok()
            .flatten()
    }

    /// `device`'s caching allocator; without caching (PYTORCH_NO_NPU_MEMORY_CACHING) there are
    /// no pools.
    fn caching(&self, device: u32) -> Result<&DeviceAllocator<D>, RuntimeError<D::Error>> {
        match self.entry(device)? {
            Entry::Caching(a) => Ok(a),
            Entry::Uncached(_) => Err(RuntimeError::NoCaching),
        }
    }

    /// torch's `torch.npu.MemPool()` on `device`: a private pool, held until the handle drops.
    pub fn mem_pool(&self, device: u32) -> Result<MemPool<'_, D>, RuntimeError<D::Error>> {
        self.mem_pool_with(device, MemPoolOptions::default())
    }

    /// torch's `torch.npu.MemPool(use_on_oom=..., no_split=...)` on `device`.
    pub fn mem_pool_with(
        &self,
        device: u32,
        options: MemPoolOptions,
    ) -> Result<MemPool<'_, D>, RuntimeError<D::Error>> {
        let id = self.create_pool(device)?;
        // Dropped on an error below: released as any MemPool is.
        let pool = MemPool {
            runtime: self,
            device,
            id,
        };
        if options.use_on_oom {
            self.set_use_on_oom(device, id, true)?;
        }
        if options.no_split {
            self.set_no_split(device, id)?;
        }
        Ok(pool)
    }

    /// A private pool on `device` with use count 1; give it back with
    /// [`Runtime::release_pool`] (what dropping a [`MemPool`] does).
    pub fn create_pool(&self, device: u32) -> Result<PoolId, RuntimeError<D::Error>> {
        Ok(self.caching(device)?.with(|a| a.create_pool())?)
    }

    /// torch's `MemPool(use_on_oom=True)`, once the pool exists: while `on`, a malloc of
    /// `device`'s default pools that gets no segment at its first attempt takes a cached block of
    /// `pool` that fits before it releases anything (torch's `setUseOnOOM`).
    pub fn set_use_on_oom(
        &self,
        device: u32,
        pool: PoolId,
        on: bool,
    ) -> Result<(), RuntimeError<D::Error>> {
        Ok(self.caching(device)?.with(|a| a.set_use_on_oom(pool, on))?)
    }

    /// torch_npu's `MemPool(no_split=True)`, once the pool exists: `pool` hands its blocks out
    /// whole from now on (torch_npu's `setNoSplit`).
    pub fn set_no_split(&self, device: u32, pool: PoolId) -> Result<(), RuntimeError<D::Error>> {
        Ok(self.caching(device)?.with(|a| a.set_no_split(pool))?)
    }

    /// Drops one hold on private pool `pool` of `device` and gives back its whole free segments
    /// if nothing holds it any more (torch's `~MemPool`: `setUseOnOOM(false)`, `releasePool` and
    /// `emptyCache(pool)`).
    pub fn release_pool(&self, device: u32, pool: PoolId) -> Result<(), RuntimeError<D::Error>> {
        drop_pool(self.caching(device)?, pool)
    }

    /// torch's `use_mem_pool(pool)`: until the guard drops, this thread's allocations on the
    /// pool's device come from it.
    pub fn use_mem_pool<'a>(
        &'a self,
        pool: &MemPool<'a, D>,
    ) -> Result<ScopeGuard<'a, D>, RuntimeError<D::Error>> {
        self.begin_use_pool(pool.device, pool.id)?;
        Ok(ScopeGuard {
            runtime: self,
            _thread: core::marker::PhantomData,
            scope: Scope {
                runtime: self.id,
                device: pool.device,
                pool: pool.id,
                region: false,
            },
        })
    }

    /// Starts routing this thread's allocations on `device` to `pool` (torch's
    /// `beginAllocateToPool` for the current thread), holding the pool until
    /// [`Runtime::end_use_pool`].
    pub fn begin_use_pool(&self, device: u32, pool: PoolId) -> Result<(), RuntimeError<D::Error>> {
        self.caching(device)?.with(|a| a.enter_pool(pool))?;
        push(
            &self.open_scopes,
            Scope {
                runtime: self.id,
                device,
                pool,
                region: false,
            },
        );
        Ok(())
    }

    /// Stops routing this thread's allocations to `pool` (its innermost scope on `device`) and
    /// drops that hold on it (torch's `endAllocateToPool` and `releasePool`).
    pub fn end_use_pool(&self, device: u32, pool: PoolId) -> Result<(), RuntimeError<D::Error>> {
        let found = remove(&self.open_scopes, |s| {
            s.runtime == self.id && s.device == device && s.pool == pool && !s.region
        });
        if !found {
            return Err(RuntimeError::ScopeNotOpen);
        }
        Ok(self.caching(device)?.with(|a| a.leave_pool(pool))?)
    }

    /// torch_memory_saver's `region(tag, enable_cpu_backup)` on `device`: until the guard drops,
    /// this thread's allocations there come from the tag's pool, whose memory `pause` can give
    /// back and `resume` bring back at the same addresses (with its bytes, with `cpu_backup`).
    pub fn region(
        &self,
        device: u32,
        tag: &str,
        cpu_backup: bool,
    ) -> Result<ScopeGuard<'_, D>, RuntimeError<D::Error>> {
        let pool = self.begin_region(device, tag, cpu_backup)?;
        Ok(ScopeGuard {
            runtime: self,
            _thread: core::marker::PhantomData,
            scope: Scope {
                runtime: self.id,
                device,
                pool,
                region: true,
            },
        })
    }

    /// Enters a memory-saver region of `tag` on `device` on this thread (the thread-local
    /// current tag of the C ABI) until [`Runtime::end_region`]; returns the tag's pool.
    pub fn begin_region(
        &self,
        device: u32,
        tag: &str,
        cpu_backup: bool,
    ) -> Result<PoolId, RuntimeError<D::Error>> {
        let pool = self.caching(device)?.with(|a| {
            let pool = a.saver_pool(tag, cpu_backup)?;
            a.retain_pool(pool)?;
            Ok::<_, alloc_core::PoolError>(pool)
        })?;
        push(
            &self.open_scopes,
            Scope {
                runtime: self.id,
                device,
                pool,
                region: true,
            },
        );
        Ok(pool)
    }

    /// Leaves this thread's innermost memory-saver region on `device`.
    pub fn end_region(&self, device: u32) -> Result<(), RuntimeError<D::Error>> {
        let scope = take(&self.open_scopes, |x| {
            x.runtime == self.id && x.device == device && x.region
        });
        let scope = scope.ok_or(RuntimeError::ScopeNotOpen)?;
        Ok(self.caching(device)?.with(|a| a.release_pool(scope.pool))?)
    }

    /// torch_memory_saver's `pause(tag)` (every tag for `None`) on every device used so far:
    /// returns the bytes whose physical memory went back. A tag no device knows is
    /// [`SaverError::UnknownTag`].
    pub fn pause(&self, tag: Option<&str>) -> Result<u64, RuntimeError<D::Error>> {
        self.each_device_saver(tag, |a| a.with(|a| a.pause(tag)))
    }

    /// torch_memory_saver's `resume(tag)` (every paused tag for `None`) on every device used so
    /// far: returns the bytes mapped again.
    pub fn resume(&self, tag: Option<&str>) -> Result<u64, RuntimeError<D::Error>> {
        let retain = self.retain_cpu_backup();
        self.each_device_saver(tag, |a| {
            a.with(|a| {
                a.set_retain_cpu_backup(retain);
                a.resume(tag)
            })
        })
    }

    /// torch_memory_saver's `retain_cpu_backup`: whether a resume keeps the CPU backups it
    /// copied back, for `cpu_backup` to read and the next pause to reuse
    /// ([`alloc_core::Allocator::set_retain_cpu_backup`]). Read at each resume.
    pub fn set_retain_cpu_backup(&self, retain: bool) {
        self.retain_cpu_backup
            .store(retain, core::sync::atomic::Ordering::Relaxed);
    }

    /// torch_memory_saver's `memory_margin_bytes` on every device: a new segment of a
    /// memory-saver tag runs out of memory unless the device keeps `bytes` free beside it
    /// ([`alloc_core::Allocator::set_saver_memory_margin`]); 0 turns the check off.
    pub fn set_memory_margin_bytes(&self, bytes: u64) {
        // Under the lock a device is opened with: it gets the margin either way.
        let _settings = self.settings.lock();
        self.saver_margin
            .store(bytes, core::sync::atomic::Ordering::Relaxed);
        for entry in self.opened_all() {
            if let Entry::Caching(a) = entry {
                a.with(|a| a.set_saver_memory_margin(bytes));
            }
        }
    }

    /// Whether resumes keep CPU backups ([`Runtime::set_retain_cpu_backup`]).
    pub fn retain_cpu_backup(&self) -> bool {
        self.retain_cpu_backup
            .load(core::sync::atomic::Ordering::Relaxed)
    }

    /// torch_memory_saver's `get_cpu_backup`: runs `read` on the CPU backup of the `len` bytes
    /// at `addr`, on whichever device holds them, under that device's lock: the backup buffer
    /// and the offset of `addr` in it, or `None` for memory in use whose backup was not kept
    /// ([`alloc_core::Allocator::cpu_backup`]). `read` must not call the runtime.
    pub fn cpu_backup<R>(
        &self,
        addr: u64,
        len: u64,
        read: impl FnOnce(Option<CpuBackup<'_, D::HostBuffer>>) -> R,
    ) -> Result<R, RuntimeError<D::Error>> {
        let mut read = Some(read);
        for entry in self.opened_all() {
            let Entry::Caching(a) = entry else { continue };
            let answer = a.with(|a| match a.cpu_backup(addr, len) {
                Ok(backup) => Ok(Some(read.take().expect("read once")(backup))),
                Err(SaverError::NotSaverMemory { .. }) => Ok(None),
                Err(e) => Err(e),
            })?;
            if let Some(answer) = answer {
                return Ok(answer);
            }
        }
        Err(SaverError::NotSaverMemory { addr, len }.into())
    }

    /// Runs a pause or resume on each opened device and adds up the bytes. A device that does
    /// not know the tag is passed over; a refusal is returned only if no device did anything.
    /// Another error stops the call there, named by its device once a device before it acted.
    fn each_device_saver(
        &self,
        tag: Option<&str>,
        f: impl Fn(&DeviceAllocator<D>) -> Result<u64, SaverError<D::Error>>,
    ) -> Result<u64, RuntimeError<D::Error>> {
        let mut bytes = 0;
        let mut did = false;
        let mut refusal = None;
        for entry in self.opened_all() {
            let Entry::Caching(a) = entry else { continue };
            match f(a) {
                Ok(n) => {
                    bytes += n;
                    did = true;
                }
                Err(SaverError::UnknownTag(_)) => {}
                Err(e @ (SaverError::AlreadyPaused(_) | SaverError::NotPaused(_))) => {
                    refusal.get_or_insert(e);
                }
                Err(error) if did => {
                    return Err(RuntimeError::SaverStopped {
                        device: a.index(),
                        bytes_done: bytes,
                        error,
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        match (did, refusal, tag) {
            (true, _, _) | (false, None, None) => Ok(bytes),
            (false, Some(e), _) => Err(e.into()),
            (false, None, Some(tag)) => Err(SaverError::UnknownTag(tag.to_owned()).into()),
        }
    }

    /// Whether any opened device knows memory-saver tag `tag` (a region of it was entered
    /// there): whether [`Runtime::pause`] of it can answer anything but
    /// [`SaverError::UnknownTag`].
    pub fn has_saver_tag(&self, tag: &str) -> bool {
        self.opened_all().any(|entry| match entry {
            Entry::Caching(a) => a.with(|a| a.has_saver_tag(tag)),
            Entry::Uncached(_) => false,
        })
    }

    /// The memory saver's figures on `device` (paused and held bytes, per tag and in total).
    pub fn memory_saver_stats(&self, device: u32) -> Result<SaverStats, RuntimeError<D::Error>> {
        Ok(match self.opened(device)? {
            Some(Entry::Caching(a)) => a.with(|a| a.saver_stats()),
            _ => SaverStats::default(),
        })
    }

    /// torch's `MemPool.use_count()`.
    pub fn pool_use_count(&self, device: u32, pool: PoolId) -> Result<u32, RuntimeError<D::Error>> {
        Ok(self.caching(device)?.with(|a| a.pool_use_count(pool))?)
    }
}

impl<D: Device> MemPool<'_, D> {
    /// The pool's id (torch's `MemPool.id`).
    pub fn id(&self) -> PoolId {
        self.id
    }

    /// The device the pool lives on.
    pub fn device(&self) -> u32 {
        self.device
    }
}

impl<D> MemPool<'_, D>
where
    D: Device<Stream: Send + Sync, Event: Send, Error: Send> + Send + 'static,
{
    /// torch's `MemPool.use_count()`: the pool object and each open scope.
    pub fn use_count(&self) -> Result<u32, RuntimeError<D::Error>> {
        self.runtime.pool_use_count(self.device, self.id)
    }
}

/// Opens a scope on this thread, counted in its runtime's `open`.
fn push(open: &Arc<AtomicU64>, scope: Scope) {
    SCOPES.with(|s| s.borrow_mut().0.push((scope, open.clone())));
    open.fetch_add(1, Ordering::Relaxed);
}

/// Removes this thread's innermost scope matching `is` (and its count in `open`); whether there
/// was one.
fn remove(open: &AtomicU64, is: impl Fn(&Scope) -> bool) -> bool {
    take(open, is).is_some()
}

/// [`remove`], returning the scope.
fn take(open: &AtomicU64, is: impl Fn(&Scope) -> bool) -> Option<Scope> {
    let scope = SCOPES
        .try_with(|s| {
            let mut s = s.borrow_mut();
            let i = s.0.iter().rposition(|(x, _)| is(x))?;
            Some(s.0.remove(i).0)
        })
        .ok()
        .flatten();
    if scope.is_some() {
        open.fetch_sub(1, Ordering::Relaxed);
    }
    scope
}

/// Logs an error a destructor cannot return.
fn log_drop_error(what: &str, e: &dyn core::fmt::Display) {
    warn_once(&format!("{what}: {e}"));
}

/// torch's `~MemPool` on one device: `use_on_oom` off, one hold dropped, then the pool's cache
/// emptied (given back only if nothing holds it any more). A memory-saver tag's pool is refused
/// at the first step (`PoolError::SaverPool`), before anything changes: only its regions hold
/// it.
fn drop_pool<D: Device>(a: &DeviceAllocator<D>, id: PoolId) -> Result<(), RuntimeError<D::Error>> {
    a.with(|a| {
        a.set_use_on_oom(id, false)?;
        a.release_pool(id)
    })?;
    a.with(|a| a.empty_pool_cache(id))
        .map_err(RuntimeError::Device)
}

impl<D: Device> Drop for MemPool<'_, D> {
    fn drop(&mut self) {
        if let Ok(Some(Entry::Caching(a))) = self.runtime.opened(self.device)
            && let Err(e) = drop_pool(a, self.id)
        {
            log_drop_error("MemPool drop", &e);
        }
    }
}

impl<D: Device> Drop for ScopeGuard<'_, D> {
    fn drop(&mut self) {
        let scope = self.scope;
        let found = remove(&self.runtime.open_scopes, |s| *s == scope);
        if !found {
            return;
        }
        if let Ok(Some(Entry::Caching(a))) = self.runtime.opened(scope.device) {
            // A region holds its tag's pool; a pool scope entered its pool.
            let left = a.with(|a| {
                if scope.region {
                    a.release_pool(scope.pool)
                } else {
                    a.leave_pool(scope.pool)
                }
            });
            if let Err(e) = left {
                log_drop_error("end of scope", &e);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use alloc_core::{DeviceFacts, PoolError};
    use alloc_sim::{SimDevice, SimStream, TestDevice};

    use crate::sync::Ordering;
    use crate::{Config, Runtime, RuntimeError};

    /// A pool scope begun on a thread that ends without ending it: the thread's scopes leave
    /// the runtime's count (which every malloc reads before the thread-local lookup), while the
    /// pool keeps the hold, as torch's capture entry of such a thread stays.
    #[test]
    fn a_thread_that_ends_with_a_scope_open_leaves_the_count() {
        let rt: Runtime<TestDevice> = Runtime::new(
            1,
            |i| {
                Ok((
                    TestDevice::new(SimDevice::new(1 << 30)),
                    DeviceFacts::npu(i),
                ))
            },
            Config::default(),
        );
        let pool = rt.create_pool(0).unwrap();
        // A joined thread, not a scoped one: a scope may end before the thread's thread-locals
        // are destroyed, `join` waits for the thread's exit.
        let rt = std::sync::Arc::new(rt);
        let theirs = rt.clone();
        std::thread::spawn(move || {
            theirs.begin_use_pool(0, pool).unwrap();
            theirs.begin_region(0, "kv", false).unwrap();
            assert_eq!(theirs.open_scopes.load(Ordering::Relaxed), 2);
        })
        .join()
        .unwrap();
        assert_eq!(rt.open_scopes.load(Ordering::Relaxed), 0);
        assert_eq!(rt.pool_use_count(0, pool).unwrap(), 2);
        // Still entered, as torch's `beginAllocateToPool` finds it ("already recording").
        assert!(matches!(
            rt.begin_use_pool(0, pool),
            Err(RuntimeError::Pool(PoolError::AlreadyEntered(_)))
        ));
        // This thread's allocations go to the default pool, and its own scopes still count.
        let p = rt.malloc(1000, 0, SimStream(0)).unwrap();
        let other = rt.create_pool(0).unwrap();
        rt.begin_use_pool(0, other).unwrap();
        assert_eq!(rt.open_scopes.load(Ordering::Relaxed), 1);
        let q = rt.malloc(1000, 0, SimStream(0)).unwrap();
        // Not the rest of `p`'s segment (the default pool's next block): the private pool's own.
        assert_ne!(q, p + 1536);
        rt.end_use_pool(0, other).unwrap();
        assert_eq!(rt.open_scopes.load(Ordering::Relaxed), 0);
        rt.free(p).unwrap();
        rt.free(q).unwrap();
    }
}
