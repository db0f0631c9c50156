//! The address index: device address → block record, the map every `free` looks up.
//!
//! An open-addressing table with linear probing over (address, id) pairs, hashed by one
//! multiply (Fibonacci hashing: the top bits of `addr × 2^64/φ`). Block addresses are distinct
//! multiples of the device's alignment, which the multiply spreads over the table, and the
//! table is at most half full, so a lookup nearly always reads the pair at its home slot: a
//! multiply, a shift, one load and a compare. hashbrown's SIMD group probe, with its control
//! bytes, took 30 instructions and two dependent loads for the same answer (measured in
//! docs/performance.md); it pays off for wide keys and high load, neither of which this has.
//!
//! Removal shifts the entries after the removed one back (no tombstones), so a lookup of an
//! absent address stops at the first empty slot however long the table has been in use.

use alloc::vec;
use alloc::vec::Vec;

use crate::block::BlockId;

/// The key of an empty slot. No block has it: a block's end (`addr + size`, size ≥ 1) fits in
/// a `u64`, so its address is below `u64::MAX`.
const EMPTY: u64 = u64::MAX;

/// 2^64 / φ, odd: multiplying by it spreads nearby keys over the top bits.
const FIBONACCI: u64 = 0x9e37_79b9_7f4a_7c15;

/// The slots of a new table (it grows by doubling and never shrinks, as hashbrown's map did).
const MIN_SLOTS: usize = 16;

#[derive(Debug, Clone, Copy)]
struct Slot {
    addr: u64,
    /// `None` exactly when the slot is empty, so that a lookup of [`EMPTY`] itself finds no
    /// block without a test of its own.
    id: Option<BlockId>,
}

const EMPTY_SLOT: Slot = Slot {
    addr: EMPTY,
    id: None,
};

/// Device address → block id, for every block handed out at least once (see the allocator's
/// `by_addr`).
#[derive(Debug)]
pub(crate) struct AddressIndex {
    /// A power of two in length, at least [`MIN_SLOTS`], at most half full.
    slots: Vec<Slot>,
    /// `64 − log2(slots.len())`: the multiply's top bits index the table.
    shift: u32,
    len: usize,
}

impl AddressIndex {
    /// An empty index.
    pub(crate) fn new() -> Self {
        AddressIndex {
            slots: vec![EMPTY_SLOT; MIN_SLOTS],
            shift: 64 - MIN_SLOTS.trailing_zeros(),
            len: 0,
        }
    }

    /// The number of addresses indexed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    #[inline(always)]
    fn home(&self, addr: u64) -> usize {
        (addr.wrapping_mul(FIBONACCI) >> self.shift) as usize
    }

    /// The block at `addr`, if one is indexed there.
    #[inline(always)]
    pub(crate) fn get(&self, addr: u64) -> Option<BlockId> {
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let slot = self.slots[i];
            if slot.addr == addr {
                // An empty slot answers a lookup of EMPTY itself with its `None`.
                return slot.id;
            }
            if slot.addr == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Indexes `id` at `addr`, which has no entry yet.
    pub(crate) fn insert(&mut self, addr: u64, id: BlockId) {
        assert_ne!(
            addr, EMPTY,
            "no block starts at the last byte of the address space"
        );
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        while self.slots[i].id.is_some() {
            debug_assert_ne!(self.slots[i].addr, addr, "{addr:#x} is indexed already");
            i = (i + 1) & mask;
        }
        self.slots[i] = Slot { addr, id: Some(id) };
        self.len += 1;
    }

    /// Drops the entry at `addr`, if any, and returns its id. Out of line: only a merge or a
    /// release drops an entry, and inlined it made its callers' register use worse.
    #[inline(never)]
    pub(crate) fn remove(&mut self, addr: u64) -> Option<BlockId> {
        if addr == EMPTY {
            return None;
        }
        let mask = self.mask();
        let mut hole = self.home(addr);
        loop {
            match self.slots[hole].addr {
                a if a == addr => break,
                EMPTY => return None,
                _ => hole = (hole + 1) & mask,
            }
        }
        let removed = self.slots[hole].id;
        // Backward-shift deletion: move each later entry of the run into the hole when the
        // hole lies on its probe path (between its home and where it sits), so every entry
        // stays reachable from its home without passing an empty slot.
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let slot = self.slots[j];
            if slot.addr == EMPTY {
                break;
            }
            let home = self.home(slot.addr);
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                self.slots[hole] = slot;
                hole = j;
            }
        }
        self.slots[hole] = EMPTY_SLOT;
        self.len -= 1;
        removed
    }

    /// Doubles the table and re-inserts every entry.
    #[cold]
    fn grow(&mut self) {
        let doubled = vec![EMPTY_SLOT; self.slots.len() * 2];
        let old = core::mem::replace(&mut self.slots, doubled);
        self.shift -= 1;
        self.len = 0;
        for slot in old {
            if let Some(id) = slot.id {
                self.insert(slot.addr, id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::xorshift;
    use hashbrown::HashMap;

    fn id(n: u32) -> BlockId {
        BlockId::for_test(n)
    }

    #[test]
    fn finds_what_was_inserted_and_nothing_else() {
        let mut index = AddressIndex::new();
        assert_eq!(index.get(0), None);
        assert_eq!(index.get(u64::MAX), None);
        index.insert(0, id(7));
        index.insert(0x2000, id(8));
        assert_eq!(index.get(0), Some(id(7)));
        assert_eq!(index.get(0x2000), Some(id(8)));
        assert_eq!(index.get(0x1000), None);
        assert_eq!(index.get(u64::MAX), None);
        assert_eq!(index.remove(0), Some(id(7)));
        assert_eq!(index.remove(0), None);
        assert_eq!(index.get(0), None);
        assert_eq!(index.get(0x2000), Some(id(8)));
        assert_eq!(index.len(), 1);
    }

    /// Random inserts and removes of addresses drawn from a small range (so that runs of
    /// occupied slots form, wrap around the table's end and are cut by removals) agree with a
    /// `HashMap` at every step, through several growths.
    #[test]
    fn agrees_with_a_hash_map_under_random_inserts_and_removes() {
        let mut next = xorshift(0x5eed_1234_abcd);
        let mut index = AddressIndex::new();
        let mut model: HashMap<u64, BlockId> = HashMap::new();
        for step in 0..200_000u32 {
            let addr = (next() % 3_000) * 512;
            if next() % 5 < 3 {
                if !model.contains_key(&addr) {
                    let value = id(step + 1);
                    model.insert(addr, value);
                    index.insert(addr, value);
                }
            } else {
                assert_eq!(index.remove(addr), model.remove(&addr), "step {step}");
            }
            let probe = (next() % 3_000) * 512;
            assert_eq!(index.get(probe), model.get(&probe).copied(), "step {step}");
            assert_eq!(index.len(), model.len());
        }
        for (&addr, &value) in &model {
            assert_eq!(index.get(addr), Some(value));
        }
        assert!(index.slots.len() >= 2 * model.len());
    }

    #[test]
    fn stays_at_most_half_full() {
        let mut index = AddressIndex::new();
        for n in 0..1_000u32 {
            index.insert(u64::from(n) << 21, id(n + 1));
            assert!(2 * index.len() <= index.slots.len());
        }
        assert_eq!(index.slots.len(), 2_048);
        for n in 0..1_000u32 {
            assert_eq!(index.get(u64::from(n) << 21), Some(id(n + 1)));
        }
    }
}
