//! Shrinking a failing operation sequence: a light form of delta debugging (Zeller's ddmin).
//!
//! Failures of a stateful system are not monotone in the prefix length, so bisecting on the
//! prefix is not valid. Instead: delete chunks of half the sequence, then quarters, and so on down
//! to single operations, keeping every deletion after which the sequence still fails, and cutting
//! the sequence after its new failing operation each time. Single-operation passes repeat while
//! they make progress. Everything stops at the time budget; what was found so far is returned.

use std::time::{Duration, Instant};

/// Shrinks `ops`, which must fail, within `budget`. `fails` re-executes a candidate and returns
/// the sequence to keep (the candidate cut after its failing operation, perhaps tidied), or
/// `None` when the candidate passes or fails differently.
pub fn shrink<T: Clone>(
    mut ops: Vec<T>,
    budget: Duration,
    mut fails: impl FnMut(&[T]) -> Option<Vec<T>>,
) -> Vec<T> {
    let deadline = Instant::now() + budget;
    let mut chunk = ops.len().div_ceil(2).max(1);
    loop {
        let mut progress = false;
        let mut start = 0;
        while start < ops.len() {
            if Instant::now() >= deadline {
                return ops;
            }
            let end = (start + chunk).min(ops.len());
            let mut candidate = Vec::with_capacity(ops.len() - (end - start));
            candidate.extend_from_slice(&ops[..start]);
            candidate.extend_from_slice(&ops[end..]);
            match fails(&candidate) {
                Some(kept) => {
                    ops = kept;
                    progress = true;
                }
                None => start = end,
            }
        }
        if chunk > 1 {
            chunk = chunk.div_ceil(2);
        } else if !progress {
            return ops;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The callback the shrinker takes, from one that tells the index of the failing element:
    /// keeps the candidate up to that element.
    fn cut(
        mut index: impl FnMut(&[u32]) -> Option<usize>,
    ) -> impl FnMut(&[u32]) -> Option<Vec<u32>> {
        move |c| index(c).map(|i| c[..=i].to_vec())
    }

    /// Fails (at the position of the last needed element) when `needed` appear in order.
    fn fails_with(needed: &[u32]) -> impl FnMut(&[u32]) -> Option<usize> + '_ {
        move |ops| {
            let mut want = needed.iter().peekable();
            for (i, op) in ops.iter().enumerate() {
                if want.peek() == Some(&op) {
                    want.next();
                    if want.peek().is_none() {
                        return Some(i);
                    }
                }
            }
            None
        }
    }

    #[test]
    fn finds_the_minimal_subsequence() {
        let ops: Vec<u32> = (0..1000).collect();
        let shrunk = shrink(
            ops,
            Duration::from_secs(60),
            cut(fails_with(&[17, 400, 401, 999])),
        );
        assert_eq!(shrunk, [17, 400, 401, 999]);
    }

    #[test]
    fn cuts_after_the_new_failing_operation() {
        // Fails at the first 5 that follows a 3: deleting nothing but later elements is enough.
        let ops = vec![1, 3, 2, 5, 9, 9, 9];
        let shrunk = shrink(ops, Duration::from_secs(60), cut(fails_with(&[3, 5])));
        assert_eq!(shrunk, [3, 5]);
    }

    #[test]
    fn a_failure_that_needs_everything_stays() {
        let ops = vec![1, 2, 3];
        let shrunk = shrink(
            ops,
            Duration::from_secs(60),
            cut(|c| (c.len() == 3).then_some(2)),
        );
        assert_eq!(shrunk, [1, 2, 3]);
    }

    #[test]
    fn the_budget_is_respected() {
        let ops: Vec<u32> = (0..100).collect();
        let mut calls = 0;
        let shrunk = shrink(
            ops,
            Duration::ZERO,
            cut(|_| {
                calls += 1;
                Some(0)
            }),
        );
        assert_eq!(calls, 0);
        assert_eq!(shrunk.len(), 100);
    }
}
