//! Size classes: the free blocks of one stream of a pool, spread over TLSF-style classes (8 per
//! power of two of 512-byte units) with a bitmap of non-empty classes. Each class is a
//! [`SortedBin`] keyed by (size, address) packed into one `u128`. Classes are monotone in size, so
//! walking the classes in order and each bin in order is exactly torch's (size, address) order;
//! but each bin stays small, so a best-fit lookup is a bitmap scan plus a search in a node or two
//! instead of a walk down one deep tree.

use alloc::boxed::Box;

use crate::block::BlockId;
use crate::sorted_bin::{Found, SortedBin};

/// (size, address) packed so that integer order is (size, address) order.
#[inline]
pub(crate) fn key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

#[inline]
pub(crate) fn size_of(key: u128) -> u64 {
    (key >> 64) as u64
}

/// Number of size classes: 8 below 4 KiB, then 8 per power of two up to 2^64 bytes.
const CLASSES: usize = 8 + 52 * 8;
const WORDS: usize = CLASSES.div_ceil(64);

/// The size class of a block size: monotone, so class order agrees with size order.
///
/// With `units` = size / 512 and `exp` its highest set bit: below 8 units the class is `units`;
/// from there `8 + 8 (exp − 3) + mantissa`, the mantissa being the 3 bits below the highest,
/// which is `8 (exp − 3) + (units >> (exp − 3))` since that shift keeps the highest bit (8)
/// with them. Taking `exp` of `units | 8` (at least 3) makes the one formula cover both
/// ranges: no branch, one bit scan and one shift.
#[inline(always)]
fn class(size: u64) -> usize {
    let units = size >> 9;
    let shift = 60 - (units | 8).leading_zeros();
    (8 * shift as usize) + (units >> shift) as usize
}

/// The free blocks of one stream of one pool, binned by size class. The bins are a fixed-size
/// array, so a class indexes them without a bounds check; it is built on the heap, as 424 bins
/// (about 20 KiB) would be a large temporary on a small stack (a loom model's threads).
#[derive(Debug)]
pub(crate) struct SizeClasses {
    occupied: [u64; WORDS],
    bins: Box<[SortedBin; CLASSES]>,
}

impl Default for SizeClasses {
    fn default() -> Self {
        let bins: Box<[SortedBin]> = (0..CLASSES).map(|_| SortedBin::default()).collect();
        SizeClasses {
            occupied: [0; WORDS],
            bins: bins.try_into().expect("CLASSES bins"),
        }
    }
}

impl SizeClasses {
    #[inline(always)]
    pub(crate) fn insert(&mut self, k: u128, id: BlockId) {
        let c = class(size_of(k));
        self.bins[c].insert(k, id);
        self.occupied[c / 64] |= 1 << (c % 64);
    }

    /// Clears class `c`'s bit in the occupancy bitmap if its bin is now empty: after any
    /// removal.
    #[inline(always)]
    fn clear_if_empty(&mut self, c: usize) {
        if self.bins[c].is_empty() {
            self.occupied[c / 64] &= !(1 << (c % 64));
        }
    }

    #[inline]
    pub(crate) fn remove(&mut self, k: u128) -> bool {
        let c = class(size_of(k));
        let removed = self.bins[c].remove(k);
        self.clear_if_empty(c);
        removed
    }

    /// The first non-empty class at or after `from`.
    #[inline(always)]
    fn next_class(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        if word >= WORDS {
            return None;
        }
        let mut bits = self.occupied[word] & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            if word == WORDS {
                return None;
            }
            bits = self.occupied[word];
        }
    }

    /// Non-empty classes in ascending order within `range`.
    fn classes(
        &self,
        range: core::ops::Range<usize>,
    ) -> impl DoubleEndedIterator<Item = usize> + '_ {
        range.filter(|&c| self.occupied[c / 64] & (1 << (c % 64)) != 0)
    }

    /// Takes the first entry with key ≥ `k` if `accept` agrees to its key. Best fit's common
    /// cases are a bin's lowest entry (of `k`'s class, or of the next non-empty one) and take
    /// it with a `pop`; a search inside `k`'s class goes through `find_from`.
    #[inline(always)]
    pub(crate) fn take_from(
        &mut self,
        k: u128,
        accept: impl FnOnce(u128) -> bool,
    ) -> Option<BlockId> {
        let mut c = class(size_of(k));
        let (key, id) = match self.bins[c].lowest() {
            Some(lowest) if lowest.0 >= k => lowest,
            Some(_) => return self.take_searched(k, accept),
            None => {
                c = self.next_class(c + 1)?;
                self.bins[c].lowest()?
            }
        };
        if !accept(key) {
            return None;
        }
        self.bins[c].pop_lowest();
        self.clear_if_empty(c);
        Some(id)
    }

    /// [`SizeClasses::take_from`] when `k`'s class holds keys below `k`: a search in the bin.
    #[inline]
    fn take_searched(&mut self, k: u128, accept: impl FnOnce(u128) -> bool) -> Option<BlockId> {
        let (c, found) = self.find_from(k)?;
        if !accept(found.key) {
            return None;
        }
        self.remove_found(c, found);
        Some(found.id)
    }

    /// The first entry with key ≥ `k` and its class.
    #[inline]
    fn find_from(&self, k: u128) -> Option<(usize, Found)> {
        let c = class(size_of(k));
        if let Some(found) = self.bins[c].find_from(k) {
            return Some((c, found));
        }
        let next = self.next_class(c + 1)?;
        Some((next, self.bins[next].find_from(0)?))
    }

    /// Removes an entry just found by [`SizeClasses::find_from`].
    #[inline]
    fn remove_found(&mut self, c: usize, found: Found) {
        self.bins[c].remove_at(found);
        self.clear_if_empty(c);
    }

    /// Entries with key ≥ `k`, ascending.
    pub(crate) fn from(&self, k: u128) -> impl Iterator<Item = (u128, BlockId)> + '_ {
        let c = class(size_of(k));
        self.bins[c].range(k..).chain(
            self.classes(c + 1..CLASSES)
                .flat_map(|c| self.bins[c].range(..)),
        )
    }

    /// Entries with key < `k`, descending.
    pub(crate) fn below_desc(&self, k: u128) -> impl Iterator<Item = (u128, BlockId)> + '_ {
        let c = class(size_of(k));
        self.bins[c].range(..k).rev().chain(
            self.classes(0..c)
                .rev()
                .flat_map(|c| self.bins[c].range(..).rev()),
        )
    }

    /// All entries, ascending.
    pub(crate) fn values(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.classes(0..CLASSES)
            .flat_map(|c| self.bins[c].range(..).map(|(_, id)| id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn classes_are_monotone_and_in_range() {
        let mut sizes: Vec<u64> = (0..1u64 << 16)
            .map(|i| i * 512)
            .chain((9..64).flat_map(|e| [(1u64 << e) - 512, 1u64 << e, (1u64 << e) + 512]))
            .chain([u64::MAX])
            .collect();
        sizes.sort_unstable();
        for w in sizes.windows(2) {
            assert!(class(w[0]) <= class(w[1]), "{} {}", w[0], w[1]);
            assert!(class(w[1]) < CLASSES);
        }
        for w in [
            512u64,
            1024,
            4096,
            4608,
            1 << 20,
            (1 << 20) + 512,
            20 << 20,
            1 << 40,
        ]
        .windows(2)
        {
            assert!(class(w[0]) <= class(w[1]));
        }
        assert_eq!(class(512), 1);
        assert_eq!(class(4096), 8);
        assert_eq!(class(4096 + 512), 9);
        assert_eq!(class(8192), 16);
        assert_eq!(class(u64::MAX), CLASSES - 1);
        // 8 classes per power of two of units from 8 units (4 KiB) on; one per unit below.
        for units in 0..8u64 {
            assert_eq!(class(units * 512), units as usize);
        }
        for exp in 3..55usize {
            let low = 1u64 << exp;
            for mantissa in 0..8u64 {
                let units = low + mantissa * (low >> 3);
                let c = 8 + 8 * (exp - 3) + mantissa as usize;
                assert_eq!(class(units * 512), c, "{units} units");
                assert_eq!(class(units * 512 + 511), c, "{units} units + 511 bytes");
            }
        }
    }

    #[test]
    fn take_from_takes_the_first_key_at_or_above_as_an_ordered_map_does() {
        use crate::block::{Block, Blocks};
        use crate::size::PoolKind;
        use alloc::collections::BTreeMap;

        let mut blocks = Blocks::<u64>::default();
        let id = blocks.insert(Block::segment(0, 0, 0, PoolKind::Small, 0));
        let mut classes = SizeClasses::default();
        let mut model = BTreeMap::new();
        // Sizes 8 KiB - 16 KiB share classes two sizes wide, so a request can find its class's
        // lowest below it (the search), its class empty (the next class) or its lowest fitting.
        let mut next = crate::test_rng::xorshift(0x2545_F491_4F6C_DD1D);
        let mut refused = 0;
        for step in 0..20_000 {
            let size = 8192 + 512 * (next() % 16);
            let k = key(size, next() % 64 * 0x10_0000);
            if next().is_multiple_of(2) {
                if let alloc::collections::btree_map::Entry::Vacant(e) = model.entry(k) {
                    e.insert(id);
                    classes.insert(k, id);
                }
                continue;
            }
            let probe = key(size, 0);
            let want = model.range(probe..).next().map(|(&k, _)| k);
            // Refuse a fit more than 1 KiB larger now and then: nothing may change.
            let limit = if step % 5 == 0 { size + 1024 } else { u64::MAX };
            let mut offered = None;
            let took = classes.take_from(probe, |k| {
                offered = Some(k);
                size_of(k) < limit
            });
            assert_eq!(offered, want, "step {step}");
            match want {
                Some(k) if size_of(k) < limit => {
                    assert_eq!(took, Some(id));
                    model.remove(&k);
                }
                _ => {
                    assert_eq!(took, None);
                    refused += usize::from(want.is_some());
                }
            }
            let all: Vec<u128> = model.keys().copied().collect();
            let held: Vec<u128> = classes.from(0).map(|(k, _)| k).collect();
            assert_eq!(held, all, "step {step}");
        }
        assert!(refused > 0, "some fits were refused");
    }
}
