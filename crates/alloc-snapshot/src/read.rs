//! Reading a PyTorch memory snapshot: a whitelisting unpickler of our own, then a walk of the
//! result into a [`Snapshot`].
//!
//! Why not serde-pickle's reader: torch's pickler memoizes every dict, list and string and
//! writes a repeated one as a memo get (`BINGET`), so the same frame dict appears in many
//! `frames` lists; serde-pickle refuses such a shared object ("recursive structure found"), and
//! it turns `INST`/`NEWOBJ`/`BUILD` into plain dicts instead of refusing them. Python's own
//! `pickle.load` runs whatever globals the file names.
//!
//! What is accepted (stage 1, [`unpickle`]): protocols 2 to 5 (a file without `PROTO` is read
//! the same way), and only the opcodes of plain data: dicts, lists, tuples, `None`, bools,
//! 64-bit ints, floats and UTF-8 strings, with marks, the memo, `POP` and `DUP`. An opcode that
//! could run code (`GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ*`, `PERSID`, `EXT*`, …)
//! is refused where it stands, never executed; bytes, sets and the text forms of protocols 0
//! and 1 are refused as unsupported. Nothing is allocated for a length before the bytes it
//! claims are known to be there, and [`Limits`] bounds the input, marks, strings and memo.
//!
//! Stage 2 ([`shape`]) walks only the keys a snapshot has (its depth is that of the format, so
//! no input can make it recurse deeper) and counts every value it visits and every byte of text
//! it copies: a memo get repeats a whole subtree for two bytes, so without the count a small
//! file could expand to terabytes.

use std::io::Read as _;
use std::path::Path;

use crate::model::Snapshot;

mod error;
mod opcodes;
mod shape;
mod unpickle;
mod value;

pub use error::{ReadError, ReadWarning, Untiled};

/// A snapshot read from a pickle, with what the reader noticed but accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    /// The snapshot.
    pub snapshot: Snapshot,
    /// What was accepted with a caveat: one warning per unknown trace action name, and one
    /// for segments whose blocks do not tile them.
    pub warnings: Vec<ReadWarning>,
}

/// Bounds on what the reader accepts; exceeding one is [`ReadError::TooLarge`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The largest input, in bytes (default 4 GiB).
    pub max_input: u64,
    /// The deepest nesting of `MARK`s (default 100; torch's snapshots nest up to 7: frame dicts in
    /// frames lists in block dicts in blocks lists in segment dicts in the segment list in the
    /// top-level dict).
    pub max_marks: usize,
    /// The longest string, in bytes (default 1 MiB; torch's are names and paths).
    pub max_string: u64,
    /// The most memo entries; `None` is the input's length (each needs a byte).
    pub max_memo: Option<u64>,
    /// The most values stage 2 may visit, counting a container as one plus its length at each
    /// place it is referenced; `None` is the larger of 1,000,000 and 16 × the input's length.
    pub max_values: Option<u64>,
    /// The most bytes of text stage 2 may copy into the snapshot (a string the pickle shares is
    /// copied once, and shared by the frames that name it); `None` is the larger of 64 MiB and
    /// 16 × the input's length.
    pub max_text: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input: 4 << 30,
            max_marks: 100,
            max_string: 1 << 20,
            max_memo: None,
            max_values: None,
            max_text: None,
        }
    }
}

/// Reads a snapshot from pickle bytes with the default [`Limits`].
pub fn read(bytes: &[u8]) -> Result<Read, ReadError> {
    read_with(bytes, &Limits::default())
}

/// Reads a snapshot from pickle bytes within `limits`.
pub fn read_with(bytes: &[u8], limits: &Limits) -> Result<Read, ReadError> {
    let len = bytes.len() as u64;
    if len > limits.max_input {
        return Err(ReadError::TooLarge {
            what: "bytes of input",
            limit: limits.max_input,
        });
    }
    let (doc, root) = unpickle::unpickle(bytes, limits)?;
    let budget = shape::Budget {
        values: limits
            .max_values
            .unwrap_or_else(|| len.saturating_mul(16).max(1_000_000)),
        text: limits
            .max_text
            .unwrap_or_else(|| len.saturating_mul(16).max(64 << 20)),
    };
    shape::snapshot(&doc, root, budget)
}

/// Reads a snapshot from a file with the default [`Limits`] (a file over the input limit is
/// refused before it is read).
pub fn read_file(path: &Path) -> Result<Read, ReadError> {
    let limits = Limits::default();
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    if len > limits.max_input {
        return Err(ReadError::TooLarge {
            what: "bytes of input",
            limit: limits.max_input,
        });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // The file may grow while read: never take more than one byte past the limit.
    file.by_ref()
        .take(limits.max_input.saturating_add(1))
        .read_to_end(&mut bytes)?;
    read_with(&bytes, &limits)
}
