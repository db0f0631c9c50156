//! Interleaved A/B timing for the benchmarks whose target is a ratio.
//!
//! On a shared machine the speed of the same code drifts by tens of percent between runs, and
//! two criterion benchmarks run one after the other see different machines: their ratio is
//! noise. A [`Paired`] measures the case (A) and its baseline (B) in alternating chunks inside
//! every criterion sample (A B, then B A, ...), so both see the same conditions, and keeps the
//! ratio of each sample. Criterion still reports A's time; the baseline's time and the median
//! ratio go to a small JSON file next to criterion's results, which `cargo xtask bench` reads.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Calls of A (and of B) timed between two clock reads: ~10–50 µs of work, so the clock's
/// cost is noise, and short enough that A and B alternate many times per sample.
const CHUNK: u64 = 256;

/// Runs `a` against `b` as the paired criterion benchmark `id` (its baseline named `baseline`)
/// and saves the result where `cargo xtask bench` reads it. Each closure gets a running call
/// index.
pub fn bench(
    c: &mut criterion::Criterion,
    id: &str,
    baseline: &str,
    mut a: impl FnMut(u64),
    mut b: impl FnMut(u64),
) {
    let mut pair = Paired::new(id, baseline);
    c.bench_function(id, |bench| {
        bench.iter_custom(|iters| pair.run(iters, &mut a, &mut b))
    });
    pair.save().expect("writing the paired result");
}

/// The file under `$CRITERION_HOME/paired/` that holds a paired benchmark's result.
pub fn result_path(home: &std::path::Path, id: &str) -> PathBuf {
    home.join("paired")
        .join(format!("{}.json", id.replace('/', "_")))
}

/// Interleaved timings of one benchmark and its baseline.
#[derive(Debug)]
pub struct Paired {
    id: String,
    baseline: String,
    /// Per criterion sample: (calls of each, time of A, time of B).
    samples: Vec<(u64, Duration, Duration)>,
    /// Whether the next chunk times A first (alternates across samples too).
    a_first: bool,
    /// Calls of each side timed between two clock reads.
    chunk: u64,
}

/// What a [`Paired`] found: per-call times and the median of the per-sample ratios A / B.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairedResult {
    /// Median time of one call of A, in ns.
    pub ns: f64,
    /// Median time of one call of B, in ns.
    pub baseline_ns: f64,
    /// Median over samples of (time of A) / (time of B).
    pub ratio: f64,
    /// Samples the medians were taken over.
    pub samples: usize,
}

impl Paired {
    /// A paired benchmark `id` (criterion's id of A) against the baseline named `baseline`.
    pub fn new(id: &str, baseline: &str) -> Self {
        Paired::with_chunk(id, baseline, CHUNK)
    }

    /// [`Paired::new`] timing `chunk` calls of each side at a time: 1 for calls long enough
    /// that the clock's cost is noise (a whole replay, milliseconds), so that a sample of a few
    /// calls still alternates.
    pub fn with_chunk(id: &str, baseline: &str, chunk: u64) -> Self {
        assert!(chunk > 0, "a chunk holds at least one call");
        Paired {
            id: id.to_owned(),
            baseline: baseline.to_owned(),
            samples: Vec::new(),
            a_first: true,
            chunk,
        }
    }

    /// Runs `a` and `b` `iters` times each, interleaved in chunks, and returns A's time (what
    /// criterion's `iter_custom` wants). Each closure gets a running call index.
    pub fn run(&mut self, iters: u64, mut a: impl FnMut(u64), mut b: impl FnMut(u64)) -> Duration {
        let (mut time_a, mut time_b) = (Duration::ZERO, Duration::ZERO);
        let mut done = 0;
        while done < iters {
            let calls = done..done + self.chunk.min(iters - done);
            if self.a_first {
                time_a += timed(&mut a, calls.clone());
                time_b += timed(&mut b, calls.clone());
            } else {
                time_b += timed(&mut b, calls.clone());
                time_a += timed(&mut a, calls.clone());
            }
            self.a_first = !self.a_first;
            done = calls.end;
        }
        self.record(iters, time_a, time_b);
        time_a
    }

    /// Records a sample the caller timed itself: `calls` calls of each side, A's time and B's,
    /// taken in the same run (as [`Paired::run`] takes them).
    pub fn record(&mut self, calls: u64, time_a: Duration, time_b: Duration) {
        self.samples.push((calls, time_a, time_b));
    }

    /// The medians over the measured samples; `None` before any.
    ///
    /// Criterion calls the routine first to warm up, with doubling iteration counts, then once
    /// per sample with counts that never fall (linear: d, 2d, 3d, ...; flat: the same). The
    /// measured samples are therefore those from the last fall in the count on (all of them if
    /// it never falls), and of those the ones of at least one whole chunk.
    pub fn result(&self) -> Option<PairedResult> {
        let start = (1..self.samples.len())
            .rev()
            .find(|&i| self.samples[i].0 < self.samples[i - 1].0)
            .unwrap_or(0);
        let full: Vec<_> = self.samples[start..]
            .iter()
            .filter(|(n, _, b)| *n >= self.chunk && !b.is_zero())
            .collect();
        let per_call = |t: Duration, n: u64| t.as_secs_f64() * 1e9 / n as f64;
        let ns = median(full.iter().map(|&&(n, a, _)| per_call(a, n)).collect())?;
        let baseline_ns = median(full.iter().map(|&&(n, _, b)| per_call(b, n)).collect())?;
        let ratio = median(
            full.iter()
                .map(|&&(_, a, b)| a.as_secs_f64() / b.as_secs_f64())
                .collect(),
        )?;
        Some(PairedResult {
            ns,
            baseline_ns,
            ratio,
            samples: full.len(),
        })
    }

    /// Writes the result under `$CRITERION_HOME/paired/` (set by `cargo xtask bench`); does
    /// nothing when the variable is unset or nothing was measured (a filtered-out benchmark).
    pub fn save(&self) -> std::io::Result<()> {
        let (Some(home), Some(r)) = (std::env::var_os("CRITERION_HOME"), self.result()) else {
            return Ok(());
        };
        let path = result_path(std::path::Path::new(&home), &self.id);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let json = serde_json::json!({
            "id": self.id,
            "baseline": self.baseline,
            "ns": r.ns,
            "baseline_ns": r.baseline_ns,
            "ratio": r.ratio,
            "samples": r.samples,
        });
        std::fs::write(path, format!("{json}\n"))
    }
}

/// Time of `f` called with each index of `calls` (generic, so nothing but the calls is timed).
#[inline(always)]
fn timed(f: &mut impl FnMut(u64), calls: core::ops::Range<u64>) -> Duration {
    let start = Instant::now();
    for i in calls {
        f(i);
    }
    start.elapsed()
}

/// The median of `values` (the lower middle one for an even count); `None` when empty.
fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[(values.len() - 1) / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_both_sides_the_same_number_of_times_in_alternating_order() {
        let order = std::cell::RefCell::new(Vec::new());
        let mut p = Paired::new("x/1", "y/1");
        p.run(
            2 * CHUNK + 10,
            |i| order.borrow_mut().push(('a', i)),
            |i| order.borrow_mut().push(('b', i)),
        );
        let order = order.into_inner();
        assert_eq!(order.len() as u64, 2 * (2 * CHUNK + 10));
        let firsts: Vec<char> = order.iter().map(|e| e.0).collect();
        let n = CHUNK as usize;
        // Chunk 1: A then B; chunk 2: B then A; the 10-call tail: A then B.
        assert!(firsts[..n].iter().all(|&c| c == 'a'));
        assert!(firsts[n..2 * n].iter().all(|&c| c == 'b'));
        assert!(firsts[2 * n..3 * n].iter().all(|&c| c == 'b'));
        assert!(firsts[3 * n..4 * n].iter().all(|&c| c == 'a'));
        assert!(firsts[4 * n..4 * n + 10].iter().all(|&c| c == 'a'));
        // Each side sees every call index once, in order.
        let a: Vec<u64> = order.iter().filter(|e| e.0 == 'a').map(|e| e.1).collect();
        assert_eq!(a, (0..2 * CHUNK + 10).collect::<Vec<_>>());
        // The alternation carries over into the next sample: three chunks ran, so B leads.
        let next = std::cell::RefCell::new(Vec::new());
        p.run(
            1,
            |_| next.borrow_mut().push('a'),
            |_| next.borrow_mut().push('b'),
        );
        assert_eq!(next.into_inner(), ['b', 'a']);
    }

    #[test]
    fn result_is_the_median_over_whole_chunk_samples() {
        let mut p = Paired::new("x", "y");
        assert_eq!(p.result(), None);
        let ms = Duration::from_millis;
        // Warm-up calls (doubling counts) are ignored: the measurement starts where the count
        // falls. A call below one chunk is ignored too.
        p.samples.push((1, ms(100), ms(1)));
        p.samples.push((4 * CHUNK, ms(900), ms(1)));
        p.samples.push((8 * CHUNK, ms(900), ms(1)));
        p.samples.push((1, ms(100), ms(1)));
        p.samples.push((CHUNK, ms(2), ms(1)));
        p.samples.push((CHUNK, ms(3), ms(2)));
        p.samples.push((2 * CHUNK, ms(8), ms(2)));
        let r = p.result().unwrap();
        assert_eq!(r.samples, 3);
        let close = |x: f64, want: f64| (x - want).abs() < want * 1e-9;
        assert!(close(r.ratio, 2.0), "ratios 2, 1.5, 4: {}", r.ratio);
        let per_call = |ms: f64| ms * 1e6 / CHUNK as f64;
        assert!(close(r.ns, per_call(3.0)), "per call 2, 3, 4 ms / CHUNK");
        assert!(
            close(r.baseline_ns, per_call(1.0)),
            "per call 1, 2, 1 ms / CHUNK"
        );
    }

    #[test]
    fn a_chunk_of_one_alternates_every_call_and_keeps_samples_of_one_call() {
        let order = std::cell::RefCell::new(Vec::new());
        let mut p = Paired::with_chunk("x", "y", 1);
        p.run(
            3,
            |i| order.borrow_mut().push(('a', i)),
            |i| order.borrow_mut().push(('b', i)),
        );
        assert_eq!(
            order.into_inner(),
            [('a', 0), ('b', 0), ('b', 1), ('a', 1), ('a', 2), ('b', 2)]
        );
        let ms = Duration::from_millis;
        p.samples.clear();
        p.record(1, ms(3), ms(2));
        p.record(1, ms(4), ms(2));
        p.record(1, ms(9), ms(3));
        let r = p.result().unwrap();
        assert_eq!(
            r.samples, 3,
            "samples of one call count with a chunk of one"
        );
        assert!(
            (r.ratio - 2.0).abs() < 1e-9,
            "ratios 1.5, 2, 3: {}",
            r.ratio
        );
    }

    #[test]
    fn result_files_are_named_by_id() {
        let home = std::path::Path::new("/h");
        assert_eq!(
            result_path(home, "core_hit/256"),
            PathBuf::from("/h/paired/core_hit_256.json")
        );
    }
}
