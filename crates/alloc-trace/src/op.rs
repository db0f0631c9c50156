//! The one operation type of npu-alloc's tools: what a `.trace` line says, what the stress engine
//! generates, what the property tests and fuzz targets draw, and what the executor runs.

use alloc_core::Flavour;
use alloc_sim::{DeviceCall, Fault};

/// A dense index naming one allocation id of a [`Trace`]; see [`Trace::id_name`].
///
/// The same id text always maps to the same index, also when it is allocated again after a free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IdRef(pub(crate) u32);

impl IdRef {
    /// The index, in `0..trace.id_count()`: use it to index a `Vec` of per-id state.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One operation of a trace and the line it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    /// The 1-based line number in the trace file (0 for an operation not read from a file).
    pub line: usize,
    /// What to do.
    pub kind: OpKind,
}

/// A deliberate misuse of the API: each must fail with a typed error and change nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misuse {
    /// `double_free <id>`: `free` of the address `id` had when it was last freed.
    DoubleFree {
        /// The allocation's name.
        id: IdRef,
    },
    /// `record_freed <id> <stream>`: `record_stream` of the address `id` had when it was freed.
    RecordFreed {
        /// The allocation's name.
        id: IdRef,
        /// The stream.
        stream: u64,
    },
    /// `free_foreign <address>`: `free` of an address that no allocation returned.
    ForeignPointer {
        /// The address.
        addr: u64,
    },
    /// `free_interior <id>`: `free` of a live allocation's address plus one byte.
    InteriorPointer {
        /// The allocation's name.
        id: IdRef,
    },
}

impl Misuse {
    /// The keyword of the misuse's line.
    pub fn keyword(&self) -> &'static str {
        match self {
            Misuse::DoubleFree { .. } => "double_free",
            Misuse::RecordFreed { .. } => "record_freed",
            Misuse::ForeignPointer { .. } => "free_foreign",
            Misuse::InteriorPointer { .. } => "free_interior",
        }
    }

    /// The allocation the misuse names, if any.
    pub fn id(&self) -> Option<IdRef> {
        match *self {
            Misuse::DoubleFree { id }
            | Misuse::RecordFreed { id, .. }
            | Misuse::InteriorPointer { id } => Some(id),
            Misuse::ForeignPointer { .. } => None,
        }
    }
}

/// The operations of the `.trace` format.
#[derive(Debug, Clone, PartialEq)]
pub enum OpKind {
    /// `alloc <id> <size> [<stream>]`: allocate `size` bytes on `stream` (default 0).
    Alloc {
        /// The allocation's name.
        id: IdRef,
        /// Requested bytes (0 is a null allocation).
        size: u64,
        /// The stream, 0 for the default stream.
        stream: u64,
    },
    /// `free <id>`: free the allocation named `id`.
    Free {
        /// The allocation's name.
        id: IdRef,
    },
    /// `record <id> <stream>`: `record_stream`, the block was used on `stream` too.
    Record {
        /// The allocation's name.
        id: IdRef,
        /// The stream it was used on.
        stream: u64,
    },
    /// `complete [<stream>]`: work queued so far on `stream` (every stream if `None`) finishes.
    Complete {
        /// The stream, or `None` for all streams.
        stream: Option<u64>,
    },
    /// `empty_cache`, or `empty_virt_addr_cache` (torch_npu's lighter one, which keeps the
    /// physical pages it unmaps for later maps) when `free_physical` is false.
    EmptyCache {
        /// `empty_cache` (true) or `empty_virt_addr_cache` (false), torch_npu's flag.
        free_physical: bool,
    },
    /// `fraction <f>`: `set_per_process_memory_fraction(f)`, `f` in `[0, 1]`.
    Fraction(f64),
    /// `reset_peak`: `reset_peak_memory_stats()`.
    ResetPeak,
    /// `reset_accumulated`: `reset_accumulated_memory_stats()`.
    ResetAccumulated,
    /// `stats [<label>]`: print one stats record.
    Stats {
        /// The label, if one was given.
        label: Option<String>,
    },
    /// `fault <call> <nth> oom|error <code>`: the device fails its `nth` next call of `call`.
    Fault {
        /// The device call that fails.
        call: DeviceCall,
        /// Which call from now (1: the next one).
        nth: u64,
        /// How it fails.
        fault: Fault,
    },
    /// A misuse of the API (`double_free`, `record_freed`, `free_foreign`, `free_interior`).
    Misuse(Misuse),
    /// `drain`: clear pending faults, free every live allocation, `empty_cache`; with checks,
    /// nothing may be left on the device.
    Drain,
    /// `set_allocator_settings <string>`: torch's `_set_allocator_settings` at run time (the
    /// string without blanks), read by `alloc_conf::parse_settings` on top of the configuration
    /// in force.
    Settings(String),
    /// Private pools (torch's `MemPool`): `pool <name>`, `use_pool <name>`, `end_pool`,
    /// `release_pool <name>`.
    Pool(PoolOp),
    /// `region <tag> [cpu_backup]`: allocations until the matching `end_region` come from the
    /// memory saver's pool of `tag` (torch_memory_saver's `region`).
    Region {
        /// The tag.
        tag: String,
        /// Whether a pause copies the tag's memory to the host first.
        cpu_backup: bool,
    },
    /// `end_region`: leaves the innermost region.
    EndRegion,
    /// `pause [<tag>]`: the memory saver's pause of `tag` (every tag without one).
    Pause(Option<String>),
    /// `resume [<tag>]`: the memory saver's resume of `tag` (every paused tag without one).
    Resume(Option<String>),
    /// `retain_cpu_backup on|off`: torch_memory_saver's `retain_cpu_backup`, read at each
    /// later resume: with it, a resume keeps the CPU backups, which the next pause reuses.
    RetainCpuBackup(bool),
    /// `memory_margin <size>`: torch_memory_saver's `memory_margin_bytes`: a new segment of a
    /// region runs out of memory unless the device keeps `size` bytes free beside it (0: off).
    MemoryMargin(u64),
    /// `fill <id> <byte>`: writes `byte` into the first and last 8 bytes of allocation `id`.
    Fill {
        /// The allocation's name.
        id: IdRef,
        /// The byte written.
        byte: u8,
    },
    /// `expect <id> <byte>`: with checks, the first and last 8 bytes of allocation `id` must
    /// hold `byte` (as after a `fill`, and a pause and resume with CPU backup). Skipped when
    /// no `fill` wrote into this allocation.
    Expect {
        /// The allocation's name.
        id: IdRef,
        /// The byte expected.
        byte: u8,
    },
}

/// An operation on a private pool, by the name the trace gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolOp {
    /// `pool <name> [use_on_oom] [no_split]`: creates a pool (torch's `MemPool(use_on_oom=...,
    /// no_split=...)`), held by the trace.
    Create {
        /// The pool's name in the trace.
        name: String,
        /// torch's `use_on_oom`: default-pool mallocs may take its cached blocks before the
        /// retry chain releases anything.
        use_on_oom: bool,
        /// torch_npu's `no_split`: its blocks are handed out whole.
        no_split: bool,
    },
    /// `use_pool <name>`: allocations until the matching `end_pool` come from the pool (torch's
    /// `use_mem_pool`).
    Use(String),
    /// `end_pool`: leaves the innermost `use_pool`.
    End,
    /// `release_pool <name>`: drops the trace's hold on the pool (a `MemPool` deleted: release,
    /// then empty its cache).
    Release(String),
}

impl OpKind {
    /// The keyword that starts this operation's line.
    pub fn keyword(&self) -> &'static str {
        match self {
            OpKind::Alloc { .. } => "alloc",
            OpKind::Free { .. } => "free",
            OpKind::Record { .. } => "record",
            OpKind::Complete { .. } => "complete",
            OpKind::EmptyCache {
                free_physical: true,
            } => "empty_cache",
            OpKind::EmptyCache {
                free_physical: false,
            } => "empty_virt_addr_cache",
            OpKind::Fraction(_) => "fraction",
            OpKind::ResetPeak => "reset_peak",
            OpKind::ResetAccumulated => "reset_accumulated",
            OpKind::Stats { .. } => "stats",
            OpKind::Fault { .. } => "fault",
            OpKind::Misuse(m) => m.keyword(),
            OpKind::Drain => "drain",
            OpKind::Settings(_) => "set_allocator_settings",
            OpKind::Pool(PoolOp::Create { .. }) => "pool",
            OpKind::Pool(PoolOp::Use(_)) => "use_pool",
            OpKind::Pool(PoolOp::End) => "end_pool",
            OpKind::Pool(PoolOp::Release(_)) => "release_pool",
            OpKind::Region { .. } => "region",
            OpKind::EndRegion => "end_region",
            OpKind::Pause(_) => "pause",
            OpKind::Resume(_) => "resume",
            OpKind::RetainCpuBackup(_) => "retain_cpu_backup",
            OpKind::MemoryMargin(_) => "memory_margin",
            OpKind::Fill { .. } => "fill",
            OpKind::Expect { .. } => "expect",
        }
    }
}

/// A trace: the directives (each `None` when absent), the operations in order, and the names of
/// the allocation ids they use.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Trace {
    /// The file name used in messages (as given to the parser).
    pub file: String,
    /// `capacity <size>`: total memory of the simulated device.
    pub capacity: Option<u64>,
    /// `conf <string>`: the alloc-conf string, the rest of the line with outer blanks trimmed.
    pub conf: Option<String>,
    /// `device_overhead <size>`: memory reported as used by others.
    pub device_overhead: Option<u64>,
    /// `pad <size>`: bytes added to every request before rounding.
    pub pad: Option<u64>,
    /// `flavour torch_npu|cuda`: whose retry chain the allocator follows.
    pub flavour: Option<Flavour>,
    /// The operations, in file order.
    pub ops: Vec<Op>,
    pub(crate) ids: Vec<Box<str>>,
}

impl Trace {
    /// An empty trace named `file`.
    pub fn new(file: &str) -> Trace {
        Trace {
            file: file.to_owned(),
            ..Trace::default()
        }
    }

    /// The text of an interned id (`"?"` for an index this trace did not hand out).
    pub fn id_name(&self, id: IdRef) -> &str {
        self.ids.get(id.index()).map_or("?", |s| s)
    }

    /// How many distinct ids the trace names; every [`IdRef`] index is below this.
    pub fn id_count(&self) -> usize {
        self.ids.len()
    }

    /// Every id of the trace, in the order they were added.
    pub fn ids(&self) -> impl Iterator<Item = IdRef> + use<> {
        (0..self.ids.len() as u32).map(IdRef)
    }

    /// Adds a new id named `name` (the caller keeps names distinct) and returns it.
    ///
    /// # Panics
    /// With more than 2^32 ids.
    pub fn add_id(&mut self, name: impl Into<Box<str>>) -> IdRef {
        let i = u32::try_from(self.ids.len()).expect("fewer than 2^32 ids");
        self.ids.push(name.into());
        IdRef(i)
    }

    /// Appends an operation (line 0: not read from a file).
    pub fn push(&mut self, kind: OpKind) {
        self.ops.push(Op { line: 0, kind });
    }
}

/// The name of a flavour as the `flavour` directive and `--flavour` write it.
pub fn flavour_name(flavour: Flavour) -> &'static str {
    match flavour {
        Flavour::TorchNpu => "torch_npu",
        Flavour::Cuda => "cuda",
    }
}

/// The operations a trace can hold in this order, judged statically: drops an `alloc` of an id
/// that is live, a `free`, `record` or `free_interior` of an id that is not, and a `double_free`
/// or `record_freed` of an id that was never freed. Liveness is what the script says; the
/// allocator may still refuse an `alloc` (out of memory) or a `free` (an injected device error),
/// which the executor handles when it runs.
///
/// Shrinking a failing sequence and drawing random ones both make scripts that name ids out of
/// order; this keeps what a trace file could say.
pub fn well_formed(ops: impl IntoIterator<Item = OpKind>, id_count: usize) -> Vec<OpKind> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Never,
        Live,
        Freed,
    }
    #[derive(Clone, PartialEq)]
    enum Scope {
        Pool(String),
        Region,
    }
    let mut state = vec![State::Never; id_count];
    // Pool names created, with whether the trace still holds them.
    let mut pools: Vec<(String, bool)> = Vec::new();
    let mut scopes: Vec<Scope> = Vec::new();
    let mut out = Vec::new();
    for op in ops {
        let held =
            |pools: &[(String, bool)], name: &str| pools.iter().any(|(n, h)| n == name && *h);
        let keep = match &op {
            OpKind::Alloc { id, .. } => {
                let s = &mut state[id.index()];
                (*s != State::Live).then(|| *s = State::Live).is_some()
            }
            OpKind::Free { id } => {
                let s = &mut state[id.index()];
                (*s == State::Live).then(|| *s = State::Freed).is_some()
            }
            OpKind::Record { id, .. }
            | OpKind::Misuse(Misuse::InteriorPointer { id })
            | OpKind::Fill { id, .. }
            | OpKind::Expect { id, .. } => state[id.index()] == State::Live,
            OpKind::Misuse(Misuse::DoubleFree { id } | Misuse::RecordFreed { id, .. }) => {
                state[id.index()] == State::Freed
            }
            OpKind::Pool(PoolOp::Create { name, .. }) => {
                let new = !pools.iter().any(|(n, _)| n == name);
                if new {
                    pools.push((name.clone(), true));
                }
                new
            }
            OpKind::Pool(PoolOp::Use(name)) => {
                // A pool a scope already allocates to cannot be entered again (torch refuses).
                let ok =
                    held(&pools, name) && !scopes.iter().any(|s| *s == Scope::Pool(name.clone()));
                if ok {
                    scopes.push(Scope::Pool(name.clone()));
                }
                ok
            }
            OpKind::Pool(PoolOp::Release(name)) => {
                let ok = held(&pools, name);
                if let Some(p) = pools.iter_mut().find(|(n, _)| n == name) {
                    p.1 = false;
                }
                ok
            }
            OpKind::Pool(PoolOp::End) => {
                let ok = matches!(scopes.last(), Some(Scope::Pool(_)));
                if ok {
                    scopes.pop();
                }
                ok
            }
            OpKind::Region { .. } => {
                scopes.push(Scope::Region);
                true
            }
            OpKind::EndRegion => {
                let ok = scopes.last() == Some(&Scope::Region);
                if ok {
                    scopes.pop();
                }
                ok
            }
            OpKind::Drain => {
                for s in &mut state {
                    if *s == State::Live {
                        *s = State::Freed;
                    }
                }
                scopes.clear();
                for p in &mut pools {
                    p.1 = false;
                }
                true
            }
            _ => true,
        };
        if keep {
            out.push(op);
        }
    }
    out
}
