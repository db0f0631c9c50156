//! Why a snapshot could not be read, and what was read with a caveat.

use std::fmt;

/// Why a snapshot could not be read. Offsets are byte offsets into the pickle, at the opcode
/// concerned.
#[derive(Debug)]
pub enum ReadError {
    /// The file could not be read.
    Io(std::io::Error),
    /// The data ends before the opcode at `offset` is complete (or, at the input's length,
    /// before a `STOP`).
    Truncated {
        /// Where the opcode that could not be read begins.
        offset: u64,
    },
    /// Bytes follow the `STOP` that ends the pickle.
    TrailingBytes {
        /// The first byte after `STOP`.
        offset: u64,
    },
    /// An opcode that imports or calls something (`GLOBAL`, `REDUCE`, `BUILD`, …): refused,
    /// never run.
    Forbidden {
        /// The opcode byte.
        opcode: u8,
        /// Its name in Python's `pickletools`.
        name: &'static str,
        /// Where it stands.
        offset: u64,
    },
    /// A valid opcode for data a snapshot never holds: bytes, sets, out-of-band buffers, and
    /// the text forms of protocols 0 and 1.
    Unsupported {
        /// The opcode byte.
        opcode: u8,
        /// Its name in Python's `pickletools`.
        name: &'static str,
        /// Where it stands.
        offset: u64,
    },
    /// A byte that is no pickle opcode.
    UnknownOpcode {
        /// The byte.
        opcode: u8,
        /// Where it stands.
        offset: u64,
    },
    /// A `PROTO` naming a protocol other than 2 to 5.
    UnsupportedProtocol {
        /// The protocol named.
        version: u8,
        /// Where the `PROTO` stands.
        offset: u64,
    },
    /// Opcodes that do not make a value: a stack underflow, a missing `MARK`, a memo entry
    /// never set, invalid UTF-8, …
    Malformed {
        /// Where the opcode stands.
        offset: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// One of the reader's [`Limits`](super::Limits) was exceeded.
    TooLarge {
        /// What was counted.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// Valid pickle data that is not a snapshot.
    Shape {
        /// Where, as `segments[3].blocks[0].size` (empty for the top level).
        path: String,
        /// What a snapshot has there.
        expected: &'static str,
        /// What the file has.
        found: &'static str,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "cannot read the snapshot: {e}"),
            ReadError::Truncated { offset } => write!(
                f,
                "byte {offset}: the pickle is truncated here (an opcode cut short, or no STOP)"
            ),
            ReadError::TrailingBytes { offset } => {
                write!(f, "byte {offset}: data after the pickle's STOP")
            }
            ReadError::Forbidden {
                opcode,
                name,
                offset,
            } => write!(
                f,
                "byte {offset}: opcode {name} ({opcode:#04x}) could run code; a snapshot holds \
                 only plain data"
            ),
            ReadError::Unsupported {
                opcode,
                name,
                offset,
            } => write!(
                f,
                "byte {offset}: opcode {name} ({opcode:#04x}) is not snapshot data (no bytes, \
                 sets or protocol 0/1 text forms)"
            ),
            ReadError::UnknownOpcode { opcode, offset } => {
                write!(f, "byte {offset}: {opcode:#04x} is not a pickle opcode")
            }
            ReadError::UnsupportedProtocol { version, offset } => write!(
                f,
                "byte {offset}: pickle protocol {version}; snapshots are read in protocols 2 to 5"
            ),
            ReadError::Malformed { offset, reason } => {
                write!(f, "byte {offset}: malformed pickle: {reason}")
            }
            ReadError::TooLarge { what, limit } => {
                write!(f, "the snapshot is too large: more than {limit} {what}")
            }
            ReadError::Shape {
                path,
                expected,
                found,
            } => {
                let path = if path.is_empty() { "top level" } else { path };
                write!(f, "{path}: expected {expected}, found {found}")
            }
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// Something the reader accepted with a caveat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadWarning {
    /// Trace entries whose action this version does not know, kept as
    /// [`Action::Other`](crate::Action::Other): one warning per action name.
    UnknownAction {
        /// The device of the first such entry.
        device: usize,
        /// The first such entry's index in that device's trace.
        index: usize,
        /// The action's name.
        action: String,
        /// How many entries, over every device, have it.
        count: usize,
    },
    /// Segments whose blocks do not tile them: torch writes each block right after the one
    /// before it, from the segment's address to its `total_size`, and memory_viz's `stats`
    /// asserts that they add up. One warning for all such segments, naming the first.
    Untiled {
        /// The first such segment's index in `segments`.
        segment: usize,
        /// What is wrong with it.
        how: Untiled,
        /// How many segments do not tile.
        count: usize,
    },
}

/// How a segment's blocks fail to tile it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untiled {
    /// Block `block` does not start where the one before it ends (or, for the first, at the
    /// segment's address).
    Misplaced {
        /// The block's index in the segment.
        block: usize,
        /// Where it starts.
        address: i64,
        /// Where it should start.
        expected: i64,
    },
    /// Block `block` has a negative size, or ends past the largest address.
    BadSize {
        /// The block's index in the segment.
        block: usize,
    },
    /// The blocks end elsewhere than at the segment's end.
    Total {
        /// The sum of the blocks' sizes.
        blocks: i64,
        /// The segment's `total_size`.
        total_size: i64,
    },
}

impl fmt::Display for Untiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Untiled::Misplaced {
                block,
                address,
                expected,
            } => write!(
                f,
                "blocks[{block}] starts at {address:#x}, not at {expected:#x} where the blocks \
                 before it end"
            ),
            Untiled::BadSize { block } => write!(
                f,
                "blocks[{block}] has a negative size or ends past the largest address"
            ),
            Untiled::Total { blocks, total_size } => write!(
                f,
                "the blocks' sizes add up to {blocks}, not to the segment's total_size \
                 {total_size}"
            ),
        }
    }
}

impl fmt::Display for ReadWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadWarning::UnknownAction {
                device,
                index,
                action,
                count,
            } => {
                let s = if *count == 1 { "y" } else { "ies" };
                write!(
                    f,
                    "device_traces[{device}][{index}].action: unknown action {action:?} kept as \
                     is ({count} entr{s})"
                )
            }
            ReadWarning::Untiled {
                segment,
                how,
                count,
            } => {
                let s = if *count == 1 { "" } else { "s" };
                write!(
                    f,
                    "segments[{segment}]: {how}; read as is, but memory_viz would refuse it \
                     ({count} segment{s} so)"
                )
            }
        }
    }
}
