//! The pickle opcodes, from the definitions in Python's `pickletools`: the ones stage 1 reads,
//! and how every other byte is refused.

use super::error::ReadError;

// Plain data: what the reader executes.
pub(super) const PROTO: u8 = 0x80;
pub(super) const FRAME: u8 = 0x95;
pub(super) const STOP: u8 = b'.';
pub(super) const MARK: u8 = b'(';
pub(super) const POP: u8 = b'0';
pub(super) const POP_MARK: u8 = b'1';
pub(super) const DUP: u8 = b'2';
pub(super) const NONE: u8 = b'N';
pub(super) const NEWTRUE: u8 = 0x88;
pub(super) const NEWFALSE: u8 = 0x89;
pub(super) const BININT: u8 = b'J';
pub(super) const BININT1: u8 = b'K';
pub(super) const BININT2: u8 = b'M';
pub(super) const LONG1: u8 = 0x8a;
pub(super) const BINFLOAT: u8 = b'G';
pub(super) const SHORT_BINUNICODE: u8 = 0x8c;
pub(super) const BINUNICODE: u8 = b'X';
pub(super) const BINUNICODE8: u8 = 0x8d;
pub(super) const EMPTY_LIST: u8 = b']';
pub(super) const LIST: u8 = b'l';
pub(super) const APPEND: u8 = b'a';
pub(super) const APPENDS: u8 = b'e';
pub(super) const EMPTY_TUPLE: u8 = b')';
pub(super) const TUPLE: u8 = b't';
pub(super) const TUPLE1: u8 = 0x85;
pub(super) const TUPLE2: u8 = 0x86;
pub(super) const TUPLE3: u8 = 0x87;
pub(super) const EMPTY_DICT: u8 = b'}';
pub(super) const DICT: u8 = b'd';
pub(super) const SETITEM: u8 = b's';
pub(super) const SETITEMS: u8 = b'u';
pub(super) const MEMOIZE: u8 = 0x94;
pub(super) const BINPUT: u8 = b'q';
pub(super) const LONG_BINPUT: u8 = b'r';
pub(super) const BINGET: u8 = b'h';
pub(super) const LONG_BINGET: u8 = b'j';

/// Imports, calls and object construction: the opcodes through which a pickle runs code.
const FORBIDDEN: &[(u8, &str)] = &[
    (b'c', "GLOBAL"),
    (0x93, "STACK_GLOBAL"),
    (b'R', "REDUCE"),
    (b'b', "BUILD"),
    (b'i', "INST"),
    (b'o', "OBJ"),
    (0x81, "NEWOBJ"),
    (0x92, "NEWOBJ_EX"),
    (b'P', "PERSID"),
    (b'Q', "BINPERSID"),
    (0x82, "EXT1"),
    (0x83, "EXT2"),
    (0x84, "EXT4"),
];

/// Valid data opcodes no snapshot holds: bytes, sets, buffers and the protocol 0/1 text forms
/// (torch pickles with protocol 2 or later, which writes none of them).
const UNSUPPORTED: &[(u8, &str)] = &[
    (b'B', "BINBYTES"),
    (b'C', "SHORT_BINBYTES"),
    (0x8e, "BINBYTES8"),
    (0x96, "BYTEARRAY8"),
    (0x97, "NEXT_BUFFER"),
    (0x98, "READONLY_BUFFER"),
    (0x8f, "EMPTY_SET"),
    (0x90, "ADDITEMS"),
    (0x91, "FROZENSET"),
    (b'I', "INT"),
    (b'L', "LONG"),
    (0x8b, "LONG4"),
    (b'S', "STRING"),
    (b'T', "BINSTRING"),
    (b'U', "SHORT_BINSTRING"),
    (b'V', "UNICODE"),
    (b'F', "FLOAT"),
    (b'p', "PUT"),
    (b'g', "GET"),
];

/// The error for a byte the reader does not execute (its caller has matched every accepted
/// opcode before).
pub(super) fn refuse(opcode: u8, offset: u64) -> ReadError {
    let find = |table: &[(u8, &'static str)]| {
        table
            .iter()
            .find(|&&(op, _)| op == opcode)
            .map(|&(_, name)| name)
    };
    if let Some(name) = find(FORBIDDEN) {
        ReadError::Forbidden {
            opcode,
            name,
            offset,
        }
    } else if let Some(name) = find(UNSUPPORTED) {
        ReadError::Unsupported {
            opcode,
            name,
            offset,
        }
    } else {
        ReadError::UnknownOpcode { opcode, offset }
    }
}
