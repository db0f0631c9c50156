//! One size-class bin of a block pool: an ordered set of packed (size, address) keys with their
//! blocks.
//!
//! Best fit takes a bin's lowest key, and a block freed right after is usually the lowest again,
//! so both ends of a pair work at the low end. The lowest entries therefore sit in a vector
//! sorted in descending order, where the lowest is the last element: taking it is a `pop` and
//! putting it back a `push`, with no memmove and no tree walk, whatever the bin holds. Entries
//! above the vector's range go to a `BTreeMap`, so that no insert in a bin of thousands of
//! blocks degrades to a long memmove. Every vector key is below every tree key, and the vector
//! is refilled from the tree when it runs empty, so an empty vector means an empty bin.

use alloc::collections::BTreeMap;
use alloc::collections::btree_map;
use alloc::vec::Vec;
use core::iter::{Chain, Copied, Map, Rev};
use core::ops::{Bound, RangeBounds};

use crate::block::BlockId;

/// The vector holds at most this many entries; past it, its upper half moves to the tree.
const LOW_MAX: usize = 64;
/// Entries moved between the vector and the tree at a time (hysteresis against flapping).
const MOVE: usize = 32;

/// An ordered map of u128 keys to blocks: the lowest in a descending vector, the rest in a tree.
#[derive(Debug, Default)]
pub(crate) struct SortedBin {
    /// The lowest entries, sorted by key in descending order.
    low: Vec<(u128, BlockId)>,
    /// Entries above every key of `low`.
    high: BTreeMap<u128, BlockId>,
}

/// An entry of a [`SortedBin`] and where it sits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found {
    /// Its index in the vector, or `usize::MAX` for an entry of the tree.
    at: usize,
    /// Its key.
    pub(crate) key: u128,
    /// Its block.
    pub(crate) id: BlockId,
}

/// Ascending (or, reversed, descending) entries of a [`SortedBin`] within a key range.
pub(crate) type Iter<'a> = Chain<
    Rev<Copied<core::slice::Iter<'a, (u128, BlockId)>>>,
    Map<btree_map::Range<'a, u128, BlockId>, fn((&u128, &BlockId)) -> (u128, BlockId)>,
>;

fn entry((&k, &id): (&u128, &BlockId)) -> (u128, BlockId) {
    (k, id)
}

/// Whether `k` is within the lower bound of a range.
fn above_start(k: u128, bound: Bound<&u128>) -> bool {
    match bound {
        Bound::Included(&s) => k >= s,
        Bound::Excluded(&s) => k > s,
        Bound::Unbounded => true,
    }
}

/// Whether `k` is within the upper bound of a range.
fn below_end(k: u128, bound: Bound<&u128>) -> bool {
    match bound {
        Bound::Included(&e) => k <= e,
        Bound::Excluded(&e) => k < e,
        Bound::Unbounded => true,
    }
}

impl SortedBin {
    /// Whether the bin holds no block.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.low.is_empty()
    }

    /// Adds an entry; keys are unique (they contain the block's address).
    #[inline(always)]
    pub(crate) fn insert(&mut self, key: u128, id: BlockId) {
        match self.low.last() {
            // Below the lowest (a block put back after a hit, or an empty bin): a push.
            None => self.low.push((key, id)),
            Some(&(lowest, _)) if key < lowest => self.low.push((key, id)),
            _ => self.insert_slow(key, id),
        }
    }

    #[inline(never)]
    fn insert_slow(&mut self, key: u128, id: BlockId) {
        // The vector's range is up to its largest key, or anything while the tree is empty.
        if self.high.is_empty() || key < self.low[0].0 {
            let at = self.low.partition_point(|e| e.0 > key);
            self.low.insert(at, (key, id));
            if self.low.len() > LOW_MAX {
                // The largest entries are below every tree key: they go to the tree.
                self.high.extend(self.low.drain(..MOVE));
            }
        } else {
            self.high.insert(key, id);
        }
    }

    /// Removes the entry with `key`; returns whether it was there.
    #[inline]
    pub(crate) fn remove(&mut self, key: u128) -> bool {
        // The lowest first, with no search (a merge's free neighbour often is): as a path of its
        // own it costs fewer instructions than as a first probe before the binary search.
        if self.low.last().is_some_and(|e| e.0 == key) {
            self.low.pop();
            self.refill();
            return true;
        }
        let removed = match self.low.first() {
            Some(&(largest, _)) if key <= largest => {
                match self.low.binary_search_by(|e| key.cmp(&e.0)) {
                    Ok(at) => {
                        self.remove_index(at);
                        true
                    }
                    Err(_) => false,
                }
            }
            _ => self.high.remove(&key).is_some(),
        };
        self.refill();
        removed
    }

    /// Removes the vector's entry `at`: a `pop` for the lowest, the common case.
    #[inline]
    fn remove_index(&mut self, at: usize) {
        if at + 1 == self.low.len() {
            self.low.pop();
        } else {
            self.low.remove(at);
        }
    }

    /// Moves the tree's lowest entries to the vector once it runs empty.
    #[inline]
    fn refill(&mut self) {
        if self.low.is_empty() && !self.high.is_empty() {
            self.refill_slow();
        }
    }

    #[inline(never)]
    fn refill_slow(&mut self) {
        while self.low.len() < MOVE {
            match self.high.pop_first() {
                Some(e) => self.low.push(e),
                None => break,
            }
        }
        self.low.reverse();
    }

    /// The lowest entry.
    #[inline(always)]
    pub(crate) fn lowest(&self) -> Option<(u128, BlockId)> {
        self.low.last().copied()
    }

    /// Removes the lowest entry: a `pop`.
    #[inline(always)]
    pub(crate) fn pop_lowest(&mut self) {
        self.low.pop();
        self.refill();
    }

    /// The first entry with a key at or above `key`, and its position for [`SortedBin::remove_at`].
    #[inline]
    pub(crate) fn find_from(&self, key: u128) -> Option<Found> {
        let &(lowest, id) = self.low.last()?;
        if lowest >= key {
            return Some(Found {
                at: self.low.len() - 1,
                key: lowest,
                id,
            });
        }
        self.find_from_slow(key)
    }

    fn find_from_slow(&self, key: u128) -> Option<Found> {
        // Entries at or above `key` are a prefix of the descending vector.
        let n = self.low.partition_point(|e| e.0 >= key);
        if let Some(at) = n.checked_sub(1) {
            let (key, id) = self.low[at];
            return Some(Found { at, key, id });
        }
        self.high.range(key..).next().map(|(&key, &id)| Found {
            at: usize::MAX,
            key,
            id,
        })
    }

    /// Removes an entry found by [`SortedBin::find_from`] with no change in between: no second
    /// search in the vector.
    #[inline]
    pub(crate) fn remove_at(&mut self, found: Found) {
        if found.at == usize::MAX {
            self.high.remove(&found.key);
        } else {
            debug_assert_eq!(self.low[found.at].0, found.key);
            self.remove_index(found.at);
            self.refill();
        }
    }

    /// Entries within `range`, in key order (reverse it for descending).
    pub(crate) fn range(&self, range: impl RangeBounds<u128> + Clone) -> Iter<'_> {
        let (start, end) = (range.start_bound(), range.end_bound());
        // In the descending vector, keys past the end come first and keys before the start last.
        let first = self.low.partition_point(|e| !below_end(e.0, end));
        let last = self
            .low
            .partition_point(|e| above_start(e.0, start))
            .max(first);
        let low: fn((&u128, &BlockId)) -> (u128, BlockId) = entry;
        self.low[first..last]
            .iter()
            .copied()
            .rev()
            .chain(self.high.range(range).map(low))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{Block, Blocks};
    use crate::size::PoolKind;

    fn ids(n: usize) -> Vec<BlockId> {
        let mut blocks = Blocks::<u64>::default();
        (0..n)
            .map(|_| blocks.insert(Block::segment(0, 0, 0u64, PoolKind::Small, 0)))
            .collect()
    }

    #[test]
    fn behaves_like_an_ordered_map_through_both_representations() {
        let ids = ids(200);
        let mut bin = SortedBin::default();
        let mut model = BTreeMap::new();
        // Insert 200 keys in a scrambled order: the bin becomes a tree past 64.
        for i in 0..200u128 {
            let k = (i * 7919) % 200 * 10;
            bin.insert(k, ids[i as usize]);
            model.insert(k, ids[i as usize]);
        }
        // The vector keeps at most 64 of the lowest; the rest went to the tree.
        assert!(bin.low.len() <= LOW_MAX && bin.high.len() >= 200 - LOW_MAX);
        assert!(bin.low[0].0 < *bin.high.first_key_value().unwrap().0);
        let check = |bin: &SortedBin, model: &BTreeMap<u128, BlockId>| {
            let all: Vec<_> = bin.range(..).collect();
            let want: Vec<_> = model.iter().map(|(&k, &v)| (k, v)).collect();
            assert_eq!(all, want);
            for probe in [0u128, 5, 10, 995, 1990, 1995, 5000] {
                let want = model.range(probe..).next().map(|(&k, &v)| (k, v));
                assert_eq!(bin.find_from(probe).map(|f| (f.key, f.id)), want);
                let below: Vec<_> = bin.range(..probe).rev().collect();
                let want: Vec<_> = model.range(..probe).rev().map(|(&k, &v)| (k, v)).collect();
                assert_eq!(below, want);
            }
        };
        check(&bin, &model);
        // Remove most keys: the vector runs empty and refills from the tree.
        for i in 0..190u128 {
            let k = i * 10;
            assert_eq!(bin.remove(k), model.remove(&k).is_some());
        }
        assert!(!bin.remove(3));
        assert!(bin.high.is_empty() && bin.low.len() == 10);
        check(&bin, &model);
        // Take the first entry at or after 1905 (1910) by position, then the rest.
        let found = bin.find_from(1905).unwrap();
        assert_eq!(found.key, 1910);
        bin.remove_at(found);
        model.remove(&1910);
        check(&bin, &model);
        for i in 190..200u128 {
            assert_eq!(bin.remove(i * 10), i != 191);
        }
        assert!(bin.is_empty());
    }

    #[test]
    fn random_operations_match_an_ordered_map() {
        let ids = ids(1);
        let id = ids[0];
        let mut bin = SortedBin::default();
        let mut model = BTreeMap::new();
        // Keys from a range small enough to repeat, so removes and refills happen.
        let mut next = crate::test_rng::xorshift(0x9E37_79B9_7F4A_7C15);
        let mut saw_tree = false;
        for step in 0..20_000 {
            let k = u128::from(next() % 600) << 64 | u128::from(next() % 4);
            match next() % 4 {
                0 | 1 if !model.contains_key(&k) => {
                    bin.insert(k, id);
                    model.insert(k, id);
                }
                2 => assert_eq!(bin.remove(k), model.remove(&k).is_some(), "step {step}"),
                _ => {
                    let want = model.range(k..).next().map(|(&k, _)| k);
                    let found = bin.find_from(k);
                    assert_eq!(found.map(|f| f.key), want, "step {step}");
                    if let Some(found) = found {
                        bin.remove_at(found);
                        model.remove(&found.key);
                    }
                }
            }
            assert_eq!(bin.is_empty(), model.is_empty());
            saw_tree |= !bin.high.is_empty();
            if step % 97 == 0 {
                let all: Vec<_> = bin.range(k..).map(|e| e.0).collect();
                assert_eq!(all, model.range(k..).map(|e| *e.0).collect::<Vec<_>>());
                let below: Vec<_> = bin.range(..k).rev().map(|e| e.0).collect();
                let want: Vec<_> = model.range(..k).rev().map(|e| *e.0).collect();
                assert_eq!(below, want);
            }
        }
        assert!(saw_tree, "the bin grew past its vector");
    }
}
