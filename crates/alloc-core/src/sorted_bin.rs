//! One size-class bin of a block pool: a small ordered map from packed (size, address) keys to
//! blocks. Bins are usually small (a handful of free blocks), where a sorted `Vec` with binary
//! search beats any tree; a bin that grows large (thousands of free blocks of one size) switches
//! to a `BTreeMap` so that no operation degrades to a long memmove, and back when it shrinks.

use alloc::collections::BTreeMap;
use alloc::collections::btree_map;
use alloc::vec::Vec;
use core::ops::{Bound, RangeBounds};

use crate::block::BlockId;

/// Above this many entries a bin becomes a tree.
const TO_TREE: usize = 64;
/// Below this many entries a tree bin becomes a vector again (hysteresis against flapping).
const TO_VEC: usize = 16;

/// An ordered map of u128 keys to blocks, a sorted vector while small.
#[derive(Debug)]
pub(crate) enum SortedBin {
    /// Sorted by key.
    Small(Vec<(u128, BlockId)>),
    /// For large bins.
    Large(BTreeMap<u128, BlockId>),
}

impl Default for SortedBin {
    fn default() -> Self {
        SortedBin::Small(Vec::new())
    }
}

/// An entry of a [`SortedBin`] and where it sits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found {
    /// Its index in a vector bin (unused in a tree bin).
    at: usize,
    /// Its key.
    pub(crate) key: u128,
    /// Its block.
    pub(crate) id: BlockId,
}

/// Ascending (or, reversed, descending) entries of a [`SortedBin`] within a key range.
pub(crate) enum Iter<'a> {
    Small(core::slice::Iter<'a, (u128, BlockId)>),
    Large(btree_map::Range<'a, u128, BlockId>),
}

impl Iterator for Iter<'_> {
    type Item = (u128, BlockId);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Small(it) => it.next().copied(),
            Iter::Large(it) => it.next().map(|(&k, &v)| (k, v)),
        }
    }
}

impl DoubleEndedIterator for Iter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Small(it) => it.next_back().copied(),
            Iter::Large(it) => it.next_back().map(|(&k, &v)| (k, v)),
        }
    }
}

/// Index of the first entry not below `bound` (as a range start).
fn start_index(v: &[(u128, BlockId)], bound: Bound<&u128>) -> usize {
    match bound {
        Bound::Included(&k) => v.partition_point(|e| e.0 < k),
        Bound::Excluded(&k) => v.partition_point(|e| e.0 <= k),
        Bound::Unbounded => 0,
    }
}

/// Index one past the last entry not above `bound` (as a range end).
fn end_index(v: &[(u128, BlockId)], bound: Bound<&u128>) -> usize {
    match bound {
        Bound::Included(&k) => v.partition_point(|e| e.0 <= k),
        Bound::Excluded(&k) => v.partition_point(|e| e.0 < k),
        Bound::Unbounded => v.len(),
    }
}

impl SortedBin {
    /// Whether the bin holds no block.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            SortedBin::Small(v) => v.is_empty(),
            SortedBin::Large(m) => m.is_empty(),
        }
    }

    /// Adds an entry; keys are unique (they contain the block's address).
    #[inline]
    pub(crate) fn insert(&mut self, key: u128, id: BlockId) {
        match self {
            SortedBin::Small(v) => {
                let i = v.partition_point(|e| e.0 < key);
                v.insert(i, (key, id));
                if v.len() > TO_TREE {
                    *self = SortedBin::Large(v.drain(..).collect());
                }
            }
            SortedBin::Large(m) => {
                m.insert(key, id);
            }
        }
    }

    /// Removes the entry with `key`; returns whether it was there.
    #[inline]
    pub(crate) fn remove(&mut self, key: u128) -> bool {
        match self {
            SortedBin::Small(v) => match v.binary_search_by(|e| e.0.cmp(&key)) {
                Ok(i) => {
                    v.remove(i);
                    true
                }
                Err(_) => false,
            },
            SortedBin::Large(m) => {
                let removed = m.remove(&key).is_some();
                if m.len() < TO_VEC {
                    *self = SortedBin::Small(core::mem::take(m).into_iter().collect());
                }
                removed
            }
        }
    }

    /// The first entry with a key at or above `key`, and its position for [`SortedBin::remove_at`].
    #[inline]
    pub(crate) fn find_from(&self, key: u128) -> Option<Found> {
        match self {
            SortedBin::Small(v) => {
                let at = v.partition_point(|e| e.0 < key);
                v.get(at).map(|&(key, id)| Found { at, key, id })
            }
            SortedBin::Large(m) => {
                m.range(key..)
                    .next()
                    .map(|(&key, &id)| Found { at: 0, key, id })
            }
        }
    }

    /// Removes an entry found by [`SortedBin::find_from`] with no change in between: no second
    /// search in a vector bin.
    #[inline]
    pub(crate) fn remove_at(&mut self, found: Found) {
        match self {
            SortedBin::Small(v) => {
                debug_assert_eq!(v[found.at].0, found.key);
                v.remove(found.at);
            }
            SortedBin::Large(_) => {
                self.remove(found.key);
            }
        }
    }

    /// Entries within `range`, in key order (reverse it for descending).
    #[inline]
    pub(crate) fn range(&self, range: impl RangeBounds<u128>) -> Iter<'_> {
        match self {
            SortedBin::Small(v) => {
                let start = start_index(v, range.start_bound());
                let end = end_index(v, range.end_bound()).max(start);
                Iter::Small(v[start..end].iter())
            }
            SortedBin::Large(m) => Iter::Large(m.range(range)),
        }
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
        assert!(matches!(bin, SortedBin::Large(_)));
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
        // Remove most keys: it turns back into a vector below 16.
        for i in 0..190u128 {
            let k = i * 10;
            assert_eq!(bin.remove(k), model.remove(&k).is_some());
        }
        assert!(!bin.remove(3));
        assert!(matches!(bin, SortedBin::Small(_)));
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
}
