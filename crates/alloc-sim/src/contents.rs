//! The bytes the simulated device holds, kept sparsely: only 4 KiB chunks that were written exist,
//! and everything else reads as zeros. A replay that moves 13 GiB of tensors through the device
//! therefore costs no host memory unless a test writes into them, while the memory saver's CPU
//! backup can still be checked byte for byte.

use std::collections::BTreeMap;

/// Bytes per chunk.
const CHUNK: u64 = 4096;

/// A sparse byte array: unwritten bytes read as zeros.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Sparse {
    chunks: BTreeMap<u64, Box<[u8]>>,
}

impl Sparse {
    /// Bytes held in memory for this array (whole chunks).
    pub(crate) fn held_bytes(&self) -> u64 {
        self.chunks.len() as u64 * CHUNK
    }

    /// Writes `data` at `offset`.
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) {
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let (index, within) = (at / CHUNK, (at % CHUNK) as usize);
            let n = (CHUNK as usize - within).min(data.len() - done);
            let chunk = self
                .chunks
                .entry(index)
                .or_insert_with(|| vec![0; CHUNK as usize].into_boxed_slice());
            chunk[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Reads `len` bytes at `offset`.
    pub(crate) fn read(&self, offset: u64, len: u64) -> Vec<u8> {
        let mut out = vec![0u8; len as usize];
        for (at, bytes) in self.present(offset, len) {
            let start = (at - offset) as usize;
            out[start..start + bytes.len()].copy_from_slice(bytes);
        }
        out
    }

    /// The written pieces inside `[offset, offset + len)`, as (position, bytes), in order.
    fn present(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, &[u8])> {
        let end = offset + len;
        let first = offset / CHUNK;
        let last = end.div_ceil(CHUNK);
        self.chunks.range(first..last).map(move |(&index, chunk)| {
            let base = index * CHUNK;
            let from = offset.max(base);
            let to = end.min(base + CHUNK);
            (from, &chunk[(from - base) as usize..(to - base) as usize])
        })
    }

    /// Sets `[offset, offset + len)` back to zeros, dropping chunks that become unwritten.
    pub(crate) fn clear(&mut self, offset: u64, len: u64) {
        let end = offset + len;
        let first = offset / CHUNK;
        let last = end.div_ceil(CHUNK);
        let indices: Vec<u64> = self.chunks.range(first..last).map(|(&i, _)| i).collect();
        for index in indices {
            let base = index * CHUNK;
            if offset <= base && base + CHUNK <= end {
                self.chunks.remove(&index);
            } else if let Some(chunk) = self.chunks.get_mut(&index) {
                let from = (offset.max(base) - base) as usize;
                let to = (end.min(base + CHUNK) - base) as usize;
                chunk[from..to].fill(0);
            }
        }
    }

    /// Copies `len` bytes of `src` at `src_offset` over `self` at `dst_offset`.
    pub(crate) fn copy_from(&mut self, dst_offset: u64, src: &Sparse, src_offset: u64, len: u64) {
        self.clear(dst_offset, len);
        for (at, bytes) in src.present(src_offset, len) {
            self.write(dst_offset + (at - src_offset), bytes);
        }
    }
}

/// Where device bytes physically live: a segment from `malloc` (by its address) or a physical
/// page (by its serial number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Backing {
    Segment(u64),
    Page(u64),
}

/// The written bytes of every segment and page of one device.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeviceBytes {
    by_backing: BTreeMap<Backing, Sparse>,
}

impl DeviceBytes {
    /// The bytes of `backing`, created empty.
    pub(crate) fn of_mut(&mut self, backing: Backing) -> &mut Sparse {
        self.by_backing.entry(backing).or_default()
    }

    /// The bytes of `backing`, if any were written.
    pub(crate) fn of(&self, backing: Backing) -> Option<&Sparse> {
        self.by_backing.get(&backing)
    }

    /// Forgets the bytes of a segment freed or a page released.
    pub(crate) fn drop_backing(&mut self, backing: Backing) {
        self.by_backing.remove(&backing);
    }

    /// Host memory held for device bytes.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.by_backing.values().map(Sparse::held_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritten_bytes_read_as_zeros_and_cost_nothing() {
        let mut s = Sparse::default();
        assert_eq!(s.read(10 << 30, 8), vec![0; 8]);
        s.write(CHUNK - 2, &[1, 2, 3, 4]);
        assert_eq!(s.held_bytes(), 2 * CHUNK);
        assert_eq!(s.read(CHUNK - 3, 6), [0, 1, 2, 3, 4, 0]);
        s.clear(CHUNK - 1, 2);
        assert_eq!(s.read(CHUNK - 2, 4), [1, 0, 0, 4]);
        s.clear(0, 2 * CHUNK);
        assert_eq!(s.held_bytes(), 0);
    }

    #[test]
    fn copies_move_only_what_was_written_and_clear_the_rest() {
        let mut src = Sparse::default();
        src.write(100, b"hello");
        let mut dst = Sparse::default();
        dst.write(5000, b"old bytes");
        dst.copy_from(4900, &src, 0, 200);
        assert_eq!(dst.read(5000, 9), b"hello\0\0\0\0");
        assert_eq!(dst.read(4900, 100), vec![0; 100]);
    }
}
