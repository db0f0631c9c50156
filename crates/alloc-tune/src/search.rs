//! The search: the default, a readable grid of coarse values, then refinement around the best
//! (each key through its fine values, then pairs of keys), bounded by a number of evaluations.
//!
//! Each batch of candidates is replayed in parallel and the results are kept in the batch's
//! order; the ranking is a total order (ties end on the configuration string), so the answer
//! does not depend on the number of threads or on timing.

use std::collections::HashMap;
use std::fmt;
use std::time::Instant;

use alloc_trace::{Failure, Op, OpKind, Setup, Trace, replay};
use rayon::prelude::*;

use crate::space::{self, Candidate, Detail, Key, Target};

/// What to search and how far.
pub struct Options<'a> {
    /// Device capacity (default: the trace's own, else the simulated device's default).
    pub capacity: Option<u64>,
    /// Bytes added to each request before rounding (default: the trace's, else torch_npu's 32).
    pub pad: Option<u64>,
    /// The keys to search; the others keep their defaults.
    pub keys: Vec<Key>,
    /// The most configurations replayed, the default included.
    pub evals: usize,
    /// Whose allocator the recommendation is for.
    pub target: Target,
    /// Stop after this many seconds (the answer then depends on the machine's speed).
    pub max_seconds: Option<f64>,
    /// Called after each batch with the evaluations done and the budget.
    pub progress: Option<&'a (dyn Fn(usize, usize) + Sync)>,
}

/// The default number of evaluations: about a minute for the GPT-2 step on 2 cores.
pub const DEFAULT_EVALS: usize = 100_000;

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            capacity: None,
            pad: None,
            keys: Key::ALL.to_vec(),
            evals: DEFAULT_EVALS,
            target: Target::NpuAlloc,
            max_seconds: None,
            progress: None,
        }
    }
}

/// One configuration replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eval {
    /// The configuration, in alloc-conf's canonical form (`""` for the defaults).
    pub conf: String,
    /// `reserved_bytes.all.peak` at the end of the trace.
    pub peak_reserved: u64,
    /// `requested_bytes.all.peak`.
    pub peak_requested: u64,
    /// Requests that ran out of memory (`num_ooms`).
    pub ooms: u64,
    /// Device mallocs (segments and map calls).
    pub device_mallocs: u64,
    /// Device frees (segments and unmapped ranges).
    pub device_frees: u64,
    /// `per_process_memory_fraction` in millionths (1,000,000 when unlimited): between two
    /// configurations alike otherwise, the one that leaves the job more of the device wins.
    pub fraction_millionths: u64,
}

impl Eval {
    /// Whether the trace ran without running out of memory.
    pub fn fits(&self) -> bool {
        self.ooms == 0
    }

    /// Peak reserved over peak requested.
    pub fn reserved_per_requested(&self) -> f64 {
        if self.peak_requested == 0 {
            0.0
        } else {
            self.peak_reserved as f64 / self.peak_requested as f64
        }
    }

    /// The ranking: configurations that fit first (the others by fewer OOMs), then lower peak
    /// reserved, then fewer device calls, then the larger memory fraction (a tighter one gives
    /// up memory for nothing), then the shorter and then the smaller string.
    fn rank(&self) -> (bool, u64, u64, u64, core::cmp::Reverse<u64>, usize, &str) {
        (
            !self.fits(),
            self.ooms,
            self.peak_reserved,
            self.device_mallocs + self.device_frees,
            core::cmp::Reverse(self.fraction_millionths),
            self.conf.len(),
            &self.conf,
        )
    }
}

/// What the search found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The defaults, replayed.
    pub default: Eval,
    /// Every configuration replayed, best first (the defaults among them).
    pub ranked: Vec<Eval>,
    /// Configurations replayed.
    pub evals: usize,
    /// Whether `max_seconds` stopped the search before its budget or convergence.
    pub stopped_early: bool,
    /// Whether the search had more configurations to try when it reached `evals`.
    pub budget_spent: bool,
    /// The capacity and pad the replays used.
    pub capacity: u64,
    /// The pad.
    pub pad: u64,
}

impl Outcome {
    /// The recommendation: the best configuration.
    pub fn best(&self) -> &Eval {
        &self.ranked[0]
    }
}

/// The trace cannot be replayed under the defaults.
#[derive(Debug)]
pub struct TuneError(pub Box<Failure>);

impl fmt::Display for TuneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failure = &self.0;
        write!(
            f,
            "{}:{}: the trace stops under the default configuration: {}",
            failure.file, failure.line, failure.error
        )
    }
}

impl std::error::Error for TuneError {}

/// Replays `trace` under `conf` (a canonical string).
fn evaluate(trace: &Trace, options: &Options<'_>, conf: &str) -> Result<Eval, Box<Failure>> {
    let parsed = alloc_conf::parse(conf);
    let fraction_millionths = (parsed.conf.per_process_memory_fraction * 1e6).round() as u64;
    let setup = Setup::from_trace(trace, parsed.conf, options.capacity, options.pad);
    let report = replay(trace, &setup)?;
    let stats = &report.end.stats;
    Ok(Eval {
        fraction_millionths,
        conf: conf.to_owned(),
        peak_reserved: stats.reserved_bytes.all.peak.max(0) as u64,
        peak_requested: stats.requested_bytes.all.peak.max(0) as u64,
        ooms: stats.num_ooms,
        device_mallocs: report.device_mallocs,
        device_frees: report.device_frees,
    })
}

struct Search<'a, 't> {
    trace: &'t Trace,
    options: &'a Options<'a>,
    /// Every configuration tried, by canonical string.
    seen: HashMap<String, Candidate>,
    evals: Vec<Eval>,
    start: Instant,
    stopped_early: bool,
    budget_spent: bool,
}

impl Search<'_, '_> {
    fn budget_left(&self) -> usize {
        self.options.evals.saturating_sub(self.seen.len())
    }

    fn out_of_time(&mut self) -> bool {
        if let Some(max) = self.options.max_seconds
            && self.start.elapsed().as_secs_f64() >= max
        {
            self.stopped_early = true;
        }
        self.stopped_early
    }

    /// Replays the candidates not seen yet (in order, up to the budget); returns how many.
    fn batch(&mut self, candidates: impl IntoIterator<Item = Candidate>) -> usize {
        if self.out_of_time() {
            return 0;
        }
        // In chunks: canonical forms in parallel (each is an alloc-conf parse), then the new
        // ones in order, until the budget is reached (the rest is never generated).
        let room = self.budget_left();
        let mut confs = Vec::new();
        let mut candidates = candidates.into_iter().peekable();
        while confs.len() < room && candidates.peek().is_some() {
            let chunk: Vec<Candidate> = candidates.by_ref().take(CHUNK).collect();
            let canonical: Vec<Option<String>> = chunk
                .par_iter()
                .map(|c| {
                    space::within(c, &self.options.keys)
                        .then(|| space::canonical(c, self.options.target))
                        .flatten()
                })
                .collect();
            for (c, conf) in chunk.into_iter().zip(canonical) {
                let Some(conf) = conf else { continue };
                if self.seen.contains_key(&conf) {
                    continue;
                }
                if confs.len() < room {
                    self.seen.insert(conf.clone(), c);
                    confs.push(conf);
                } else {
                    // A configuration not tried for want of budget.
                    self.budget_spent = true;
                }
            }
        }
        // In slices, so that progress shows and `max_seconds` is heeded within a batch; the
        // results are the same in any slicing.
        let mut done = self.evals.len();
        for slice in confs.chunks(EVAL_SLICE) {
            if self.out_of_time() {
                break;
            }
            let results: Vec<Option<Eval>> = slice
                .par_iter()
                .map(|conf| evaluate(self.trace, self.options, conf).ok())
                .collect();
            // A configuration whose replay stops (it cannot: only the trace's own errors stop
            // a replay, and the defaults ran) is left out rather than ranked.
            self.evals.extend(results.into_iter().flatten());
            done += slice.len();
            if let Some(progress) = self.options.progress {
                progress(done, self.options.evals);
            }
        }
        confs.len()
    }

    fn best(&self, n: usize) -> Vec<Candidate> {
        let mut ranked: Vec<&Eval> = self.evals.iter().collect();
        ranked.sort_by(|a, b| a.rank().cmp(&b.rank()));
        ranked
            .into_iter()
            .take(n)
            .filter_map(|e| self.candidate_of(&e.conf))
            .collect()
    }

    fn candidate_of(&self, conf: &str) -> Option<Candidate> {
        self.seen.get(conf).copied()
    }
}

/// Candidates canonicalized at a time.
const CHUNK: usize = 4096;

/// Configurations replayed between two progress reports (and checks of `max_seconds`).
const EVAL_SLICE: usize = 256;

/// Every `r`-element subset of `keys`, in order.
fn subsets(keys: &[Key], r: usize) -> Vec<Vec<Key>> {
    if r == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for (i, &k) in keys.iter().enumerate() {
        for mut rest in subsets(&keys[i + 1..], r - 1) {
            rest.insert(0, k);
            out.push(rest);
        }
    }
    out
}

/// Searches the configurations of `options.keys` for `trace`.
pub fn tune(trace: &Trace, options: &Options<'_>) -> Result<Outcome, TuneError> {
    // `stats` lines read the allocator and change nothing in it: without them, no replay of
    // the search keeps a record per line.
    let is_stats = |op: &Op| matches!(op.kind, OpKind::Stats { .. });
    let stripped;
    let trace = if trace.ops.iter().any(is_stats) {
        let mut copy = trace.clone();
        copy.ops.retain(|op| !is_stats(op));
        stripped = copy;
        &stripped
    } else {
        trace
    };
    let default = evaluate(trace, options, "").map_err(TuneError)?;
    let mut search = Search {
        trace,
        options,
        seen: HashMap::from([(String::new(), Candidate::default())]),
        evals: vec![default.clone()],
        start: Instant::now(),
        stopped_early: false,
        budget_spent: false,
    };
    let keys: Vec<Key> = Key::ALL
        .into_iter()
        .filter(|k| options.keys.contains(k))
        .collect();

    // The grid: every combination of the coarse values.
    let mut grid = vec![Candidate::default()];
    for &key in &keys {
        grid = grid
            .iter()
            .flat_map(|c| space::neighbours(c, key, Detail::Coarse, options.target))
            .collect();
    }
    search.batch(grid);

    // Refinement around the best: first every fine value of one key (around the best three),
    // then of two keys at once, then three, ...; whenever the best changes, back to one key
    // around the new best. Stops when a whole pass finds nothing new or the budget is spent.
    let mut radius = 1;
    while radius <= keys.len() && search.budget_left() > 0 && !search.out_of_time() {
        let before = search.best(1);
        let centers = search.best(if radius == 1 { 3 } else { 1 });
        let target = options.target;
        let subsets = subsets(&keys, radius);
        let around = centers.iter().flat_map(|center| {
            subsets.iter().flat_map(move |subset| {
                let mut set = vec![*center];
                for &key in subset {
                    set = set
                        .iter()
                        .flat_map(|c| space::neighbours(c, key, Detail::Fine, target))
                        .collect();
                }
                set
            })
        });
        search.batch(around);
        radius = if search.best(1) == before {
            radius + 1
        } else {
            1
        };
    }

    // A refinement not finished for want of budget (a batch may have filled it exactly).
    if radius <= keys.len() && search.budget_left() == 0 && !search.stopped_early {
        search.budget_spent = true;
    }
    let mut ranked = search.evals;
    ranked.sort_by(|a, b| a.rank().cmp(&b.rank()));
    let setup = Setup::from_trace(trace, Default::default(), options.capacity, options.pad);
    Ok(Outcome {
        default,
        evals: ranked.len(),
        ranked,
        stopped_early: search.stopped_early,
        budget_spent: search.budget_spent,
        capacity: setup.capacity,
        pad: setup.pad,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(conf: &str, fraction_millionths: u64) -> Eval {
        Eval {
            conf: conf.to_owned(),
            peak_reserved: 600 << 20,
            peak_requested: 550 << 20,
            ooms: 0,
            device_mallocs: 7,
            device_frees: 6,
            fraction_millionths,
        }
    }

    /// Alike otherwise, the larger fraction ranks first: a tighter one gives up device memory
    /// for nothing ("0.95" would win by the strings alone).
    #[test]
    fn a_tie_goes_to_the_larger_memory_fraction() {
        let tight = eval(
            "garbage_collection_threshold:0.5,per_process_memory_fraction:0.95",
            950_000,
        );
        let loose = eval(
            "garbage_collection_threshold:0.5,per_process_memory_fraction:0.99",
            990_000,
        );
        assert!(loose.rank() < tight.rank());
        assert!(tight.conf < loose.conf);
    }
}
