//! `cargo xtask stress --runtime`: the runtime itself under load, over the fake `libascendcl`
//! through the real loading path. Several threads on several devices make random calls of the
//! whole API at once: malloc and free (a block freed by another thread than the one that made
//! it), record_stream on several streams, empty_cache, stats and mem_get_info, fraction changes
//! (valid and invalid), event completion, and ACL failures injected into random calls; an
//! out-of-memory observer allocates on another device. Every call must return a value or a typed
//! error (never panic or deadlock); afterwards, with everything freed and the cache emptied,
//! nothing may be allocated, reserved, charged on the fake or left as an event.

use npu_alloc_cli::say;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use alloc_core::FractionError;
use npu_runtime::{AclPlatform, Config, NpuAllocator, RuntimeError, Stream};
use testkit::fake_acl::{FakeAcl, Variant};

/// Arguments of `cargo xtask stress --runtime`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// Threads making calls at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: u32,
    /// Devices of the fake library.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    devices: u32,
    /// Calls per thread.
    #[arg(long, default_value_t = 20_000)]
    ops: u64,
    /// PRNG seed (each thread's generator is derived from it).
    #[arg(long, default_value_t = 20261123)]
    seed: u64,
    /// Inject ACL failures into random calls.
    #[arg(long)]
    faults: bool,
    /// Device memory of the fake, per device (bytes, or with a K/M/G suffix).
    #[arg(long, default_value = "256M", value_parser = |s: &str| alloc_trace::parse_size(s).map_err(|e| e.to_string()))]
    capacity: u64,
    /// Drop the allocator's lock around each device malloc (`release_lock_on_npumalloc`).
    #[arg(long)]
    release_lock: bool,
    /// Start with `expandable_segments:True`, switch it off and on from the threads, and inject
    /// failures into the virtual-memory calls too.
    #[arg(long)]
    expandable: bool,
}

/// What a run did.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    calls: AtomicU64,
    mallocs: AtomicU64,
    frees: AtomicU64,
    ooms: AtomicU64,
    errors: AtomicU64,
    faults: AtomicU64,
    observer_calls: AtomicU64,
}

/// The ACL functions failures are injected into, and codes they fail with.
const FAULTY: [&str; 6] = [
    "aclrtMallocAlign32",
    "aclrtFree",
    "aclrtSynchronizeDevice",
    "aclrtRecordEvent",
    "aclrtQueryEventStatus",
    "aclrtGetMemInfo",
];
/// The virtual-memory functions failures are also injected into with `--expandable`.
const FAULTY_VMM: [&str; 6] = [
    "aclrtReserveMemAddress",
    "aclrtReleaseMemAddress",
    "aclrtMallocPhysical",
    "aclrtFreePhysical",
    "aclrtMapMem",
    "aclrtUnmapMem",
];
const CODES: [i32; 4] = [207_001, 507_899, 107_000, 500_000];

/// SplitMix64: each thread's generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

/// A random request size: mostly small, some large, a few huge.
fn size(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..=59 => 1 + rng.below(64 << 10),
        60..=89 => (1 << 20) + rng.below(12 << 20),
        90..=97 => (12 << 20) + rng.below(60 << 20),
        _ => [0, 1 << 30, 1 << 60][rng.below(3) as usize],
    }
}

/// One run; the error says which end-of-run check failed.
pub(crate) fn stress(args: &Args) -> Result<Counts, String> {
    let fake = FakeAcl::new(Variant::Full, args.capacity, args.devices);
    // SAFETY: the fake libascendcl built from this workspace.
    let platform = unsafe { AclPlatform::load(fake.path()) }.map_err(|e| e.to_string())?;
    let mut config = Config::default();
    config.alloc.release_lock_on_npumalloc = args.release_lock;
    config.alloc.expandable_segments = args.expandable;
    let rt = Arc::new(platform.clone().runtime(config));
    // Streams of every device, made on each device in turn (a stream belongs to a device).
    let mut streams = vec![Stream::DEFAULT];
    for d in 0..args.devices {
        platform
            .lib()
            .set_device(d as i32)
            .map_err(|e| e.to_string())?;
        for _ in 0..2 {
            streams.push(
                platform
                    .lib()
                    .create_stream()
                    .map_err(|e| e.to_string())?
                    .into(),
            );
        }
    }
    let counts = Arc::new(Counts::default());
    let live: Arc<Mutex<Vec<u64>>> = Arc::default();
    {
        // The observer runs without the allocator's lock: it may allocate on another device.
        let weak = Arc::downgrade(&rt);
        let counts = counts.clone();
        let devices = args.devices;
        rt.attach_out_of_memory_observer(move |oom| {
            counts.observer_calls.fetch_add(1, Ordering::Relaxed);
            let Some(rt) = weak.upgrade() else { return };
            let other = (oom.device + 1) % devices;
            if let Ok(p) = rt.malloc(4096, other, Stream::DEFAULT) {
                let _ = rt.free(p);
            }
        });
    }
    let fake = Arc::new(fake);
    let handles: Vec<_> = (0..args.threads)
        .map(|t| {
            let (rt, fake, live, counts, streams) = (
                rt.clone(),
                fake.clone(),
                live.clone(),
                counts.clone(),
                streams.clone(),
            );
            let args = args.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(args.seed ^ (u64::from(t) << 32 | 0x5eed));
                for _ in 0..args.ops {
                    one_call(&rt, &fake, &live, &counts, &streams, &args, &mut rng);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "a thread panicked".to_owned())?;
    }
    // Settle: no more failures, everything freed, every event complete, the cache emptied.
    fake.clear_failures();
    for p in std::mem::take(&mut *live.lock().unwrap()) {
        rt.free(p)
            .map_err(|e| format!("final free of {p:#x}: {e}"))?;
    }
    fake.complete_all_events();
    rt.empty_cache()
        .map_err(|e| format!("final empty_cache: {e}"))?;
    for d in 0..args.devices {
        let allocated = rt.memory_allocated(d).unwrap();
        let reserved = rt.memory_reserved(d).unwrap();
        if allocated != 0 || reserved != fake.used(d) || reserved != 0 {
            return Err(format!(
                "device {d}: allocated {allocated}, reserved {reserved}, the fake charges {}",
                fake.used(d)
            ));
        }
        if fake.live_allocations(d) != 0 {
            return Err(format!(
                "device {d}: {} device allocations left",
                fake.live_allocations(d)
            ));
        }
        let (pages, ranges) = (fake.live_pages(d), fake.reserved_ranges(d));
        if pages != 0 || ranges != 0 {
            return Err(format!(
                "device {d}: {pages} physical pages and {ranges} reserved ranges left"
            ));
        }
    }
    if fake.pending_events() != 0 {
        return Err(format!("{} events still pending", fake.pending_events()));
    }
    // Dropping the runtime destroys its pooled events: none may be left.
    let rt = Arc::try_unwrap(rt).map_err(|_| "the runtime is still shared".to_owned())?;
    drop(rt);
    for s in streams.into_iter().skip(1) {
        // SAFETY: the stream was created above, every block recorded on it was freed and its
        // events completed, and the runtime that recorded them is gone.
        unsafe { platform.lib().destroy_stream(acl_stream(s)) }.map_err(|e| e.to_string())?;
    }
    if fake.live_events() != 0 {
        return Err(format!("{} events leaked", fake.live_events()));
    }
    Arc::try_unwrap(counts).map_err(|_| "counts still shared".to_owned())
}

/// The `acl_sys::Stream` behind a runtime stream made from one.
fn acl_stream(s: Stream) -> acl_sys::Stream {
    // SAFETY: `s` was made from a live `acl_sys::Stream` of this library.
    unsafe { acl_sys::Stream::from_raw(s.as_raw()) }
}

/// One random call of the API.
fn one_call(
    rt: &NpuAllocator,
    fake: &FakeAcl,
    live: &Mutex<Vec<u64>>,
    counts: &Counts,
    streams: &[Stream],
    args: &Args,
    rng: &mut Rng,
) {
    counts.calls.fetch_add(1, Ordering::Relaxed);
    let device = rng.below(u64::from(args.devices)) as u32;
    let stream = streams[rng.below(streams.len() as u64) as usize];
    let pick = |rng: &mut Rng| {
        let mut live = live.lock().unwrap();
        (!live.is_empty()).then(|| {
            let i = rng.below(live.len() as u64) as usize;
            live.swap_remove(i)
        })
    };
    match rng.below(1000) {
        0..=399 => match rt.malloc(size(rng), device, stream) {
            Ok(0) => {}
            Ok(p) => {
                counts.mallocs.fetch_add(1, Ordering::Relaxed);
                live.lock().unwrap().push(p);
            }
            Err(e) if e.is_out_of_memory() => {
                counts.ooms.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                counts.errors.fetch_add(1, Ordering::Relaxed);
            }
        },
        400..=749 => {
            if let Some(p) = pick(rng) {
                match rt.free(p) {
                    Ok(()) => {
                        counts.frees.fetch_add(1, Ordering::Relaxed);
                    }
                    // A failed free (its event record and the fallback synchronization both
                    // failed) leaves the allocation live: keep it.
                    Err(_) => {
                        counts.errors.fetch_add(1, Ordering::Relaxed);
                        live.lock().unwrap().push(p);
                    }
                }
            }
        }
        750..=849 => {
            if let Some(p) = pick(rng) {
                if rt.record_stream(p, stream).is_err() {
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                }
                live.lock().unwrap().push(p);
            }
        }
        850..=899 => fake.complete_all_events(),
        900..=909 if rt.empty_cache().is_err() => {
            counts.errors.fetch_add(1, Ordering::Relaxed);
        }
        900..=909 => {}
        // Without expandable segments refused, as torch_npu refuses it.
        910..=919 => match rt.empty_virt_addr_cache() {
            Ok(()) | Err(npu_runtime::RuntimeError::NotExpandable) => {}
            Err(_) => {
                counts.errors.fetch_add(1, Ordering::Relaxed);
            }
        },
        920..=959 => {
            let stats = rt.device_stats(device).unwrap();
            let (allocated, reserved) = (
                stats.allocated_bytes.all.current,
                stats.reserved_bytes.all.current,
            );
            assert!(
                0 <= allocated && allocated <= reserved,
                "device {device}: allocated {allocated} > reserved {reserved}"
            );
            let _ = rt.mem_get_info(device);
        }
        960..=979 => {
            let fraction = [1.0, 0.9, 0.5, 0.25, 1.5, -0.1, f64::NAN][rng.below(7) as usize];
            let result = rt.set_per_process_memory_fraction(fraction, device);
            if !(0.0..=1.0).contains(&fraction) {
                // NaN included: refused with the range error, never applied.
                assert!(
                    matches!(
                        result,
                        Err(RuntimeError::Fraction(FractionError::OutOfRange(_)))
                    ),
                    "fraction {fraction}: {result:?}"
                );
            } else if result.is_err() {
                counts.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        980..=984 if args.expandable => {
            let on = rng.below(2) == 0;
            let text = if on {
                "expandable_segments:True"
            } else {
                "expandable_segments:False"
            };
            let warnings = rt.set_allocator_settings(text);
            assert!(warnings.is_empty(), "{text}: {warnings:?}");
        }
        _ if args.faults => {
            let vmm = if args.expandable { FAULTY_VMM.len() } else { 0 };
            let i = rng.below((FAULTY.len() + vmm) as u64) as usize;
            let name = FAULTY
                .get(i)
                .unwrap_or_else(|| &FAULTY_VMM[i - FAULTY.len()]);
            let code = CODES[rng.below(CODES.len() as u64) as usize];
            fake.fail_next(name, code, 1);
            counts.faults.fetch_add(1, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// Runs `cargo xtask stress --runtime`.
pub(crate) fn run(args: Args) -> ExitCode {
    say!(
        "runtime stress: {} threads, {} devices, {} calls per thread, seed {}, faults {}, \
         release_lock_on_npumalloc {}, expandable_segments {}",
        args.threads,
        args.devices,
        args.ops,
        args.seed,
        args.faults,
        args.release_lock,
        args.expandable
    );
    let start = Instant::now();
    match stress(&args) {
        Ok(c) => {
            say!(
                "ok: {} calls ({} mallocs, {} frees, {} OOMs, {} typed errors), {} ACL failures \
                 injected, {} OOM observer calls, {:.1} s; nothing left allocated, reserved, \
                 charged or pending",
                c.calls.into_inner(),
                c.mallocs.into_inner(),
                c.frees.into_inner(),
                c.ooms.into_inner(),
                c.errors.into_inner(),
                c.faults.into_inner(),
                c.observer_calls.into_inner(),
                start.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            say!("FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_threaded_run_over_the_fake_library_settles() {
        let args = Args {
            threads: 4,
            devices: 2,
            ops: 1_500,
            seed: 7,
            faults: true,
            capacity: 256 << 20,
            release_lock: true,
            expandable: false,
        };
        let c = stress(&args).unwrap();
        assert_eq!(c.calls.into_inner(), 6_000);
        assert!(c.mallocs.into_inner() > 1_000);
        assert!(c.faults.into_inner() > 0);
        assert!(c.ooms.into_inner() > 0, "large requests exhaust 256 MiB");
    }

    #[test]
    fn a_short_run_with_expandable_segments_switched_from_the_threads_settles() {
        let args = Args {
            threads: 4,
            devices: 2,
            ops: 1_500,
            seed: 11,
            faults: true,
            capacity: 256 << 20,
            release_lock: false,
            expandable: true,
        };
        let c = stress(&args).unwrap();
        assert!(c.mallocs.into_inner() > 1_000);
        assert!(c.ooms.into_inner() > 0);
    }
}
