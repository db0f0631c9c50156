//! Private pools: torch's `MemPool` (`PrivatePool` in `CUDACachingAllocator.cpp`).
//!
//! A private pool is a second pair of small and large block pools on the same device. A request
//! routed to it (torch's `use_mem_pool` scope, `beginAllocateToPool`) is served only from its own
//! cached blocks and segments, and a freed block always returns to the pool that allocated it,
//! whatever is routed at free time. There is no fallback between a private pool and the default
//! pools. A pool's use count counts its holders (the pool object and each active scope); at 0
//! the pool becomes freeable: `empty_cache` then gives its whole free segments back, and once it
//! holds no segment it is forgotten. Its memory counts in the device's stats like any other.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;
use core::ops::{Index, IndexMut};
use core::sync::atomic::{AtomicU64, Ordering};

use crate::pool::BlockPool;
use crate::size::PoolKind;

/// torch's `MempoolId_t`: `(0, 0)` names the device's default pools; a pool made by
/// [`crate::Allocator::create_pool`] is `(0, n)` with n counting from 1, as torch numbers
/// user-created pools (across the devices that share their count,
/// [`crate::Allocator::share_pool_ids`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PoolId(pub u64, pub u64);

impl PoolId {
    /// The device's default pools.
    pub const DEFAULT: PoolId = PoolId(0, 0);

    /// Whether this names the default pools.
    pub fn is_default(self) -> bool {
        self == PoolId::DEFAULT
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.0, self.1)
    }
}

/// A misuse of a private pool; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// No pool with this id exists on the device (never created, or already forgotten).
    Unknown(PoolId),
    /// The pool's use count reached 0: it can no longer be entered or retained (torch asserts).
    Released(PoolId),
    /// `release_pool` of a pool whose use count is already 0 (torch asserts).
    OverReleased(PoolId),
    /// The default pools cannot be created, retained or released.
    Default,
    /// More private pools than the allocator can index are alive at once (65,535).
    TooMany,
    /// A memory-saver pool needs virtual memory, which the device does not have.
    NoVirtualMemory,
    /// A scope is already allocating to this pool on this device (torch's "already recording
    /// to mempool_id").
    AlreadyEntered(PoolId),
    /// No scope is allocating to this pool on this device.
    NotEntered(PoolId),
    /// The pool is a memory-saver tag's: only its regions allocate to it and hold it (a block
    /// routed there otherwise would be unmapped with the tag at its next pause).
    SaverPool(PoolId),
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Unknown(id) => write!(f, "no private pool {id} on this device"),
            PoolError::Released(id) => {
                write!(f, "private pool {id} was released (its use count is 0)")
            }
            PoolError::OverReleased(id) => {
                write!(
                    f,
                    "private pool {id} was released more often than it was held"
                )
            }
            PoolError::Default => f.write_str("the default pool (0, 0) is not a private pool"),
            PoolError::TooMany => f.write_str("too many private pools alive on this device"),
            PoolError::AlreadyEntered(id) => write!(
                f,
                "a scope is already allocating to private pool {id} on this device \
                 (torch: beginAllocateToPool: already recording to mempool_id)"
            ),
            PoolError::NotEntered(id) => {
                write!(
                    f,
                    "no scope is allocating to private pool {id} on this device"
                )
            }
            PoolError::SaverPool(id) => write!(
                f,
                "private pool {id} is a memory-saver tag's: use its regions, not the pool calls"
            ),
            PoolError::NoVirtualMemory => f.write_str(
                "the memory saver needs virtual memory (aclrtReserveMemAddress and friends), \
                 which the device does not have",
            ),
        }
    }
}

impl core::error::Error for PoolError {}

/// What makes a private pool a memory-saver pool: its tag and whether pauses keep a CPU copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SaverTag {
    pub(crate) tag: String,
    pub(crate) cpu_backup: bool,
    /// Set by `pause`, cleared by a `resume` that mapped every segment again.
    pub(crate) paused: bool,
}

/// One private pool.
#[derive(Debug)]
pub(crate) struct PrivatePool<S> {
    pub(crate) id: PoolId,
    /// Small, large.
    pub(crate) pools: [BlockPool<S>; 2],
    /// Holders: the pool object and each active scope (torch's `use_count`).
    pub(crate) use_count: u32,
    /// Segments (device segments and expandable ranges) it holds (torch's `npuMalloc_count`).
    pub(crate) segments: u32,
    /// Whether a scope allocates to it ([`crate::Allocator::enter_pool`]).
    pub(crate) entered: bool,
    /// Set for a memory-saver pool.
    pub(crate) saver: Option<SaverTag>,
    /// torch's `use_on_oom`: a default-pool malloc that got no first segment searches this
    /// pool's cached blocks before it releases anything (`try_mempool_fallback`).
    pub(crate) use_on_oom: bool,
    /// torch_npu's `no_split`: this pool's blocks are handed out whole, never split.
    pub(crate) no_split: bool,
    /// When it was added, among this device's pools: the `use_on_oom` fallback searches pools
    /// in this order (a forgotten pool's slot is reused, so slot order is not it).
    created: u64,
}

impl<S> PrivatePool<S> {
    /// This pool for a call of a user's pool (`use_on_oom`, `no_split`, entering a scope): a
    /// memory-saver tag's pool is refused, only its regions allocate to it.
    fn for_user(&mut self) -> Result<&mut Self, PoolError> {
        if self.saver.is_some() {
            return Err(PoolError::SaverPool(self.id));
        }
        Ok(self)
    }
}

/// A pool set index: 0 the default pools, `i` the private pool in slot `i - 1`.
pub(crate) type PoolSet = u16;

/// Every block pool of the allocator: the default pair, kept first for the hot path, and the
/// private pools by slot.
#[derive(Debug)]
pub(crate) struct Pools<S> {
    default: [BlockPool<S>; 2],
    pub(crate) private: Vec<Option<PrivatePool<S>>>,
    /// The next user pool number, unless `shared_ids` numbers them.
    pub(crate) next_user: u64,
    /// The pool numbers shared with other devices' allocators.
    shared_ids: Option<Arc<AtomicU64>>,
    /// Whether any live pool is `use_on_oom`: a miss of the default pools asks only then.
    pub(crate) use_on_oom: bool,
    /// Pools added so far: the next one's `created`.
    added: u64,
}

impl<S> Default for Pools<S> {
    fn default() -> Self {
        Pools {
            default: [BlockPool::default(), BlockPool::default()],
            private: Vec::new(),
            next_user: 1,
            shared_ids: None,
            use_on_oom: false,
            added: 0,
        }
    }
}

impl<S> Pools<S> {
    /// The private pool of set `set` (not the default).
    pub(crate) fn private(&self, set: PoolSet) -> Option<&PrivatePool<S>> {
        let slot = usize::from(set).checked_sub(1)?;
        self.private.get(slot)?.as_ref()
    }

    /// Whether pool set `set` splits no block (torch_npu's `no_split_pools`).
    #[inline(never)]
    pub(crate) fn no_split(&self, set: PoolSet) -> bool {
        self.private(set).is_some_and(|p| p.no_split)
    }

    /// The private pool of set `set`, mutably.
    pub(crate) fn private_mut(&mut self, set: PoolSet) -> Option<&mut PrivatePool<S>> {
        let slot = usize::from(set).checked_sub(1)?;
        self.private.get_mut(slot)?.as_mut()
    }

    /// The private pool of a live set; panics for any other (an index out of range).
    #[inline(never)]
    fn live_private(&self, set: PoolSet) -> &PrivatePool<S> {
        self.private(set).expect("a live pool set")
    }

    /// [`Pools::live_private`], mutably.
    #[inline(never)]
    fn live_private_mut(&mut self, set: PoolSet) -> &mut PrivatePool<S> {
        self.private_mut(set).expect("a live pool set")
    }

    /// The set of the live pool `id` (0 for the default).
    pub(crate) fn set_of(&self, id: PoolId) -> Option<PoolSet> {
        if id.is_default() {
            return Some(0);
        }
        let slot = self
            .private
            .iter()
            .position(|p| p.as_ref().is_some_and(|p| p.id == id))?;
        PoolSet::try_from(slot + 1).ok()
    }

    /// The id of set `set`.
    pub(crate) fn id_of(&self, set: PoolSet) -> PoolId {
        self.private(set).map_or(PoolId::DEFAULT, |p| p.id)
    }

    /// Stores a new private pool and returns its set.
    pub(crate) fn add(&mut self, mut pool: PrivatePool<S>) -> Result<PoolSet, PoolError> {
        let slot = match self.private.iter().position(Option::is_none) {
            Some(slot) => slot,
            None => {
                self.private.push(None);
                self.private.len() - 1
            }
        };
        let Ok(set) = PoolSet::try_from(slot + 1) else {
            self.private.truncate(slot);
            return Err(PoolError::TooMany);
        };
        pool.created = self.added;
        self.added += 1;
        self.private[slot] = Some(pool);
        Ok(set)
    }

    /// Forgets the private pool of set `set`.
    pub(crate) fn remove(&mut self, set: PoolSet) {
        if let Some(slot) = usize::from(set).checked_sub(1)
            && let Some(p) = self.private.get_mut(slot)
        {
            *p = None;
        }
        while matches!(self.private.last(), Some(None)) {
            self.private.pop();
        }
        self.count_use_on_oom();
    }

    /// Sets `use_on_oom` from the live pools (after one is marked, unmarked or forgotten).
    fn count_use_on_oom(&mut self) {
        self.use_on_oom = self.private.iter().flatten().any(|p| p.use_on_oom);
    }

    /// Every live set, the default first.
    pub(crate) fn sets(&self) -> impl Iterator<Item = PoolSet> + '_ {
        let private = self
            .private
            .iter()
            .enumerate()
            .filter(|(_, p)| p.is_some())
            .map(|(slot, _)| (slot + 1) as PoolSet);
        core::iter::once(0).chain(private)
    }

    /// Every block pool.
    pub(crate) fn all(&self) -> impl Iterator<Item = &BlockPool<S>> + '_ {
        self.default
            .iter()
            .chain(self.private.iter().flatten().flat_map(|p| p.pools.iter()))
    }
}

impl<S> Index<(PoolSet, PoolKind)> for Pools<S> {
    type Output = BlockPool<S>;

    // Always inlined, with the private pools' search out of line: every malloc and free
    // indexes the default pools.
    #[inline(always)]
    fn index(&self, (set, kind): (PoolSet, PoolKind)) -> &BlockPool<S> {
        if set == 0 {
            &self.default[kind.index()]
        } else {
            &self.live_private(set).pools[kind.index()]
        }
    }
}

impl<S> IndexMut<(PoolSet, PoolKind)> for Pools<S> {
    #[inline(always)]
    fn index_mut(&mut self, (set, kind): (PoolSet, PoolKind)) -> &mut BlockPool<S> {
        if set == 0 {
            &mut self.default[kind.index()]
        } else {
            &mut self.live_private_mut(set).pools[kind.index()]
        }
    }
}

impl<D: crate::Device> crate::Allocator<D> {
    /// torch's `MemPool()` (`createOrIncrefPool` of a new id): a new private pool with use count
    /// 1, held by the caller until [`Allocator::release_pool`](crate::Allocator::release_pool).
    pub fn create_pool(&mut self) -> Result<PoolId, PoolError> {
        self.add_pool(None)
    }

    /// Numbers this allocator's new pools from `ids`, which other devices' allocators share, so
    /// that a pool id names one pool in the process, as torch's `MemPool` ids do (one counter
    /// per process). Without it each allocator counts from 1.
    pub fn share_pool_ids(&mut self, ids: Arc<AtomicU64>) {
        self.pools.shared_ids = Some(ids);
    }

    /// Adds a private pool (a memory-saver one with `saver`) with use count 1.
    pub(crate) fn add_pool(&mut self, saver: Option<SaverTag>) -> Result<PoolId, PoolError> {
        let id = loop {
            let n = match &self.pools.shared_ids {
                Some(ids) => ids.fetch_add(1, Ordering::Relaxed),
                None => {
                    self.pools.next_user += 1;
                    self.pools.next_user - 1
                }
            };
            // An id a scope made a pool for ([`Allocator::enter_pool`]) is not handed out again.
            let id = PoolId(0, n);
            if self.pools.set_of(id).is_none() {
                break id;
            }
        };
        self.add_pool_as(id, saver)?;
        Ok(id)
    }

    /// Adds private pool `id` with use count 1.
    fn add_pool_as(&mut self, id: PoolId, saver: Option<SaverTag>) -> Result<PoolSet, PoolError> {
        self.pools.add(PrivatePool {
            id,
            pools: [BlockPool::default(), BlockPool::default()],
            use_count: 1,
            segments: 0,
            entered: false,
            saver,
            use_on_oom: false,
            no_split: false,
            created: 0,
        })
    }

    /// torch's `setUseOnOOM` (`MemPool(use_on_oom=True)`): while `on`, a malloc of the default
    /// pools that got no segment at its first attempt takes a cached block of pool `id` that
    /// fits, before the retry chain releases anything (torch's `try_mempool_fallback`). A pool
    /// a scope allocates to, one released to use count 0, or a paused memory-saver tag's is
    /// passed over.
    pub fn set_use_on_oom(&mut self, id: PoolId, on: bool) -> Result<(), PoolError> {
        self.user_pool_mut(id)?.use_on_oom = on;
        self.pools.count_use_on_oom();
        Ok(())
    }

    /// torch_npu's `setNoSplit` (`MemPool(no_split=True)`): from now on pool `id` hands its
    /// blocks out whole (a request takes a whole cached block or segment, as a block of
    /// `max_split_size` or more is taken). There is no way back, as in torch_npu.
    pub fn set_no_split(&mut self, id: PoolId) -> Result<(), PoolError> {
        self.user_pool_mut(id)?.no_split = true;
        Ok(())
    }

    /// torch's `try_mempool_fallback`, after the first segment request of a default-pool malloc
    /// failed: the first `use_on_oom` pool, in creation order, with a cached block that fits
    /// serves the request (its block stays that pool's). torch walks the slots of a hash set
    /// instead, and raises "already recording" out of the malloc where a pool a scope allocates
    /// to is passed over here (docs/deviations.md).
    // Out of line, as the search and hand-out it inlines are large (see `reap_and_search`).
    #[inline(never)]
    pub(crate) fn use_on_oom_fallback(
        &mut self,
        req: &crate::allocator::Request<D::Stream>,
    ) -> Option<u64> {
        if req.set != 0 {
            return None;
        }
        let mut sets: Vec<(u64, PoolSet)> = self
            .pools
            .sets()
            .filter_map(|set| {
                let pool = self.pools.private(set)?;
                (pool.use_on_oom && !pool.entered && self.set_refusal::<D::Error>(set).is_none())
                    .then_some((pool.created, set))
            })
            .collect();
        sets.sort_unstable();
        for (_, set) in sets {
            let fallback = crate::allocator::Request { set, ..*req };
            if let Some(id) = self.get_free_block(&fallback) {
                return Some(self.alloc_found_block(id, &fallback));
            }
        }
        None
    }

    /// torch's `beginAllocateToPool` (`create_or_incref_pool` and its check): a scope starts
    /// allocating to pool `id`, holding it. A pool this device does not know is made for the
    /// scope (use count 1, so freeable once the scope ends), as torch makes one for a pool
    /// created on another device or an id from `graph_pool_handle`. A pool a scope already
    /// allocates to is refused ([`PoolError::AlreadyEntered`]; torch refuses too, after taking
    /// a hold it never gives back), and so is a pool whose use count reached 0.
    pub fn enter_pool(&mut self, id: PoolId) -> Result<(), PoolError> {
        if id.is_default() {
            return Err(PoolError::Default);
        }
        let Some(set) = self.pools.set_of(id) else {
            let set = self.add_pool_as(id, None)?;
            self.pools.private_mut(set).expect("just added").entered = true;
            // Numbers from now on pass it, on every device sharing them.
            if let (Some(ids), PoolId(0, n)) = (&self.pools.shared_ids, id) {
                ids.fetch_max(n.saturating_add(1), Ordering::Relaxed);
            }
            return Ok(());
        };
        let pool = self
            .pools
            .private_mut(set)
            .expect("a live set")
            .for_user()?;
        if pool.use_count == 0 {
            return Err(PoolError::Released(id));
        }
        if pool.entered {
            return Err(PoolError::AlreadyEntered(id));
        }
        pool.entered = true;
        pool.use_count += 1;
        Ok(())
    }

    /// torch's `endAllocateToPool` and `releasePool`: the scope of [`Allocator::enter_pool`]
    /// ends and drops its hold.
    pub fn leave_pool(&mut self, id: PoolId) -> Result<(), PoolError> {
        let pool = self.private_pool_mut(id)?;
        if !pool.entered {
            return Err(PoolError::NotEntered(id));
        }
        // `release_pool` never takes the hold of an open scope, so it is there.
        pool.entered = false;
        pool.use_count -= 1;
        Ok(())
    }

    /// The live private pool `id`, mutably.
    fn private_pool_mut(&mut self, id: PoolId) -> Result<&mut PrivatePool<D::Stream>, PoolError> {
        if id.is_default() {
            return Err(PoolError::Default);
        }
        let set = self.pools.set_of(id).ok_or(PoolError::Unknown(id))?;
        Ok(self.pools.private_mut(set).expect("a live set"))
    }

    /// Pool `id` for the calls of a user's pool (`use_on_oom`, `no_split`): a memory-saver
    /// tag's pool is refused.
    fn user_pool_mut(&mut self, id: PoolId) -> Result<&mut PrivatePool<D::Stream>, PoolError> {
        self.private_pool_mut(id)?.for_user()
    }

    /// torch's `beginAllocateToPool` reference (a `use_mem_pool` scope entering): one more
    /// holder. A pool whose use count reached 0 cannot be held again.
    pub fn retain_pool(&mut self, id: PoolId) -> Result<(), PoolError> {
        let pool = self.private_pool_mut(id)?;
        if pool.use_count == 0 {
            return Err(PoolError::Released(id));
        }
        pool.use_count += 1;
        Ok(())
    }

    /// torch's `releasePool`: one holder fewer. At 0 the pool is freeable: nothing is freed now
    /// (its live blocks stay valid and return to it when freed); `empty_cache` gives its whole
    /// free segments back and forgets it once it holds none.
    pub fn release_pool(&mut self, id: PoolId) -> Result<(), PoolError> {
        let pool = self.private_pool_mut(id)?;
        // The last hold of a pool a scope allocates to is the scope's: only `leave_pool` ends it.
        if pool.use_count <= u32::from(pool.entered) {
            return Err(PoolError::OverReleased(id));
        }
        pool.use_count -= 1;
        Ok(())
    }

    /// torch's `MemPool.use_count()`.
    pub fn pool_use_count(&self, id: PoolId) -> Result<u32, PoolError> {
        if id.is_default() {
            return Err(PoolError::Default);
        }
        let set = self.pools.set_of(id).ok_or(PoolError::Unknown(id))?;
        Ok(self.pools.private(set).expect("a live set").use_count)
    }

    /// The private pools alive on this device, in creation order of their slots.
    pub fn private_pools(&self) -> Vec<PoolId> {
        self.pools.private.iter().flatten().map(|p| p.id).collect()
    }

    /// The set requests for `pool` are served from, or why there is none.
    pub(crate) fn routable_set<E>(&self, pool: PoolId) -> Result<PoolSet, crate::AllocError<E>> {
        let set = self.pools.set_of(pool).ok_or(PoolError::Unknown(pool))?;
        match self.set_refusal(set) {
            Some(e) => Err(e),
            None => Ok(set),
        }
    }

    /// Why set `set` takes no allocation now: its pool was released, or its memory-saver tag
    /// is paused. Checked when a malloc starts, and again when it goes on after the lock was
    /// dropped for the host's queue (another thread may have paused the tag meanwhile).
    pub(crate) fn set_refusal<E>(&self, set: PoolSet) -> Option<crate::AllocError<E>> {
        let p = self.pools.private(set)?;
        if p.use_count == 0 {
            return Some(PoolError::Released(p.id).into());
        }
        p.saver
            .as_ref()
            .filter(|s| s.paused)
            .map(|saver| crate::AllocError::Paused {
                tag: saver.tag.clone(),
            })
    }

    /// Counts a segment (device segment or expandable range) in or out of a private pool.
    pub(crate) fn count_pool_segment(&mut self, set: PoolSet, delta: i32) {
        if let Some(p) = self.pools.private_mut(set) {
            p.segments = p.segments.saturating_add_signed(delta);
        }
    }

    /// The private pools `release_cached_blocks` empties: every freeable one, or only `only`.
    pub(crate) fn freeable_sets(&self, only: Option<PoolId>) -> Vec<PoolSet> {
        self.pools
            .sets()
            .filter(|&set| {
                self.pools
                    .private(set)
                    .is_some_and(|p| p.use_count == 0 && only.is_none_or(|id| id == p.id))
            })
            .collect()
    }

    /// Forgets the freeable pools of `sets` that hold no segment any more.
    pub(crate) fn forget_empty_pools(&mut self, sets: &[PoolSet]) {
        for &set in sets {
            if self.pools.private(set).is_some_and(|p| p.segments == 0) {
                // Its slot may serve another pool: no page stays cached for it.
                self.release_cached_pages(set, None);
                self.pools.remove(set);
            }
        }
    }
}
