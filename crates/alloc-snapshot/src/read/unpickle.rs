//! Stage 1: pickle opcodes to [`Value`]s, executing only the whitelisted opcodes.
//!
//! The stack follows Python's unpickler: `MARK` starts a new frame of the stack, and an opcode
//! only reaches the values above the last mark (`APPENDS` and `SETITEMS` take the frame, then
//! the container just below it). Every opcode does bounded work besides moving the items of a
//! frame once, so the whole stage is linear in the input.

use std::collections::HashMap;

use super::Limits;
use super::error::ReadError;
use super::opcodes as op;
use super::value::{Doc, Value};

/// Executes the pickle in `bytes`: its value and the arenas it lives in.
pub(super) fn unpickle(bytes: &[u8], limits: &Limits) -> Result<(Doc, Value), ReadError> {
    let mut m = Machine {
        bytes,
        pos: 0,
        at: 0,
        doc: Doc::default(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        max_memo: limits.max_memo.unwrap_or(bytes.len() as u64),
        limits,
    };
    loop {
        m.at = m.pos;
        let [opcode] = m.array::<1>()?;
        if let Some(value) = m.step(opcode)? {
            return Ok((m.doc, value));
        }
    }
}

struct Machine<'a> {
    bytes: &'a [u8],
    /// The next byte to read.
    pos: usize,
    /// Where the current opcode begins: every error names it.
    at: usize,
    doc: Doc,
    stack: Vec<Value>,
    /// Stack lengths at each open `MARK`.
    marks: Vec<usize>,
    /// Keyed by the memo index as written (`BINPUT` may skip indices), never sized by one.
    memo: HashMap<u64, Value>,
    max_memo: u64,
    limits: &'a Limits,
}

impl<'a> Machine<'a> {
    /// Executes one opcode; the pickle's value once it is `STOP`.
    fn step(&mut self, opcode: u8) -> Result<Option<Value>, ReadError> {
        match opcode {
            op::PROTO => {
                let [version] = self.array::<1>()?;
                if !(2..=5).contains(&version) {
                    return Err(ReadError::UnsupportedProtocol {
                        version,
                        offset: self.at as u64,
                    });
                }
            }
            // A frame only tells a streaming reader how much to buffer: the opcodes inside read
            // the same without it.
            op::FRAME => {
                self.take(8)?;
            }
            op::STOP => return self.stop().map(Some),
            op::MARK => {
                if self.marks.len() >= self.limits.max_marks {
                    return Err(ReadError::TooLarge {
                        what: "nested MARKs",
                        limit: self.limits.max_marks as u64,
                    });
                }
                self.marks.push(self.stack.len());
            }
            // Python pops the mark itself when the frame above it is empty.
            op::POP => {
                if self.stack.len() > self.floor() {
                    self.stack.pop();
                } else if self.marks.pop().is_none() {
                    return Err(self.malformed("stack underflow"));
                }
            }
            op::POP_MARK => {
                self.pop_mark()?;
            }
            op::DUP => {
                let top = self.top()?;
                self.stack.push(top);
            }
            op::NONE => self.stack.push(Value::None),
            op::NEWTRUE => self.stack.push(Value::Bool(true)),
            op::NEWFALSE => self.stack.push(Value::Bool(false)),
            op::BININT => {
                let n = i32::from_le_bytes(self.array()?);
                self.stack.push(Value::Int(n.into()));
            }
            op::BININT1 => {
                let [n] = self.array::<1>()?;
                self.stack.push(Value::Int(n.into()));
            }
            op::BININT2 => {
                let n = u16::from_le_bytes(self.array()?);
                self.stack.push(Value::Int(n.into()));
            }
            op::LONG1 => {
                let [len] = self.array::<1>()?;
                let n = self.long(len)?;
                self.stack.push(Value::Int(n));
            }
            op::BINFLOAT => {
                let x = f64::from_be_bytes(self.array()?);
                self.stack.push(Value::Float(x));
            }
            op::SHORT_BINUNICODE => {
                let [len] = self.array::<1>()?;
                self.string(len.into())?;
            }
            op::BINUNICODE => {
                let len = u32::from_le_bytes(self.array()?);
                self.string(len.into())?;
            }
            op::BINUNICODE8 => {
                let len = u64::from_le_bytes(self.array()?);
                self.string(len)?;
            }
            op::EMPTY_LIST => {
                let v = self.doc.push_list(Vec::new());
                self.stack.push(v);
            }
            op::LIST => {
                let items = self.pop_mark()?;
                let v = self.doc.push_list(items);
                self.stack.push(v);
            }
            op::APPEND => {
                let item = self.pop()?;
                let list = self.top()?;
                self.list(list)?.push(item);
            }
            op::APPENDS => {
                let items = self.pop_mark()?;
                let list = self.top()?;
                self.list(list)?.extend(items);
            }
            op::EMPTY_TUPLE => self.tuple(0)?,
            op::TUPLE1 => self.tuple(1)?,
            op::TUPLE2 => self.tuple(2)?,
            op::TUPLE3 => self.tuple(3)?,
            op::TUPLE => {
                let items = self.pop_mark()?;
                let v = self.doc.push_tuple(&items);
                self.stack.push(v);
            }
            op::EMPTY_DICT => {
                let v = self.doc.push_dict(Vec::new());
                self.stack.push(v);
            }
            op::DICT => {
                let items = self.pop_mark()?;
                let pairs = self.pairs(&items)?;
                let v = self.doc.push_dict(pairs);
                self.stack.push(v);
            }
            op::SETITEM => {
                let value = self.pop()?;
                let key = self.pop()?;
                let dict = self.top()?;
                self.dict(dict)?.push((key, value));
            }
            op::SETITEMS => {
                let items = self.pop_mark()?;
                let pairs = self.pairs(&items)?;
                let dict = self.top()?;
                self.dict(dict)?.extend(pairs);
            }
            op::MEMOIZE => {
                let index = self.memo.len() as u64;
                self.put(index)?;
            }
            op::BINPUT => {
                let [index] = self.array::<1>()?;
                self.put(index.into())?;
            }
            op::LONG_BINPUT => {
                let index = u32::from_le_bytes(self.array()?);
                self.put(index.into())?;
            }
            op::BINGET => {
                let [index] = self.array::<1>()?;
                self.get(index.into())?;
            }
            op::LONG_BINGET => {
                let index = u32::from_le_bytes(self.array()?);
                self.get(index.into())?;
            }
            _ => return Err(op::refuse(opcode, self.at as u64)),
        }
        Ok(None)
    }

    /// The next `len` bytes, checked to be there before anything is made of them.
    fn take(&mut self, len: u64) -> Result<&'a [u8], ReadError> {
        let bytes: &'a [u8] = self.bytes;
        let rest = bytes.get(self.pos..).unwrap_or_default();
        match usize::try_from(len) {
            Ok(len) if len <= rest.len() => {
                self.pos += len;
                Ok(&rest[..len])
            }
            _ => Err(ReadError::Truncated {
                offset: self.at as u64,
            }),
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ReadError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    /// `LONG1`'s little-endian two's complement, sign-extended to an `i64`.
    fn long(&mut self, len: u8) -> Result<i64, ReadError> {
        let bytes = self.take(len.into())?;
        if bytes.len() > 8 {
            return Err(self.malformed("an integer wider than 64 bits"));
        }
        let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
        let mut wide = if negative { [0xff; 8] } else { [0; 8] };
        wide[..bytes.len()].copy_from_slice(bytes);
        Ok(i64::from_le_bytes(wide))
    }

    fn string(&mut self, len: u64) -> Result<(), ReadError> {
        let max = self.limits.max_string;
        let bytes = self.take(len)?;
        if len > max {
            return Err(ReadError::TooLarge {
                what: "bytes in one string",
                limit: max,
            });
        }
        let Ok(s) = std::str::from_utf8(bytes) else {
            return Err(self.malformed("a string that is not valid UTF-8"));
        };
        let v = self.doc.push_str(s);
        self.stack.push(v);
        Ok(())
    }

    fn stop(&mut self) -> Result<Value, ReadError> {
        if !self.marks.is_empty() {
            return Err(self.malformed("STOP with a MARK still open"));
        }
        let value = match self.stack[..] {
            [value] => value,
            [] => return Err(self.malformed("STOP with an empty stack")),
            _ => return Err(self.malformed("STOP with more than one value on the stack")),
        };
        if self.pos < self.bytes.len() {
            return Err(ReadError::TrailingBytes {
                offset: self.pos as u64,
            });
        }
        Ok(value)
    }

    /// Where the current frame of the stack begins.
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Result<Value, ReadError> {
        if self.stack.len() > self.floor()
            && let Some(v) = self.stack.pop()
        {
            return Ok(v);
        }
        Err(self.malformed("stack underflow"))
    }

    fn top(&self) -> Result<Value, ReadError> {
        match self.stack.last() {
            Some(&v) if self.stack.len() > self.floor() => Ok(v),
            _ => Err(self.malformed("stack underflow")),
        }
    }

    /// The values above the last `MARK`, which is closed.
    fn pop_mark(&mut self) -> Result<Vec<Value>, ReadError> {
        let Some(mark) = self.marks.pop() else {
            return Err(self.malformed("no MARK before this opcode"));
        };
        Ok(self.stack.split_off(mark))
    }

    fn tuple(&mut self, len: usize) -> Result<(), ReadError> {
        let Some(start) = self
            .stack
            .len()
            .checked_sub(len)
            .filter(|&s| s >= self.floor())
        else {
            return Err(self.malformed("stack underflow"));
        };
        let v = self.doc.push_tuple(&self.stack[start..]);
        self.stack.truncate(start);
        self.stack.push(v);
        Ok(())
    }

    fn pairs(&self, items: &[Value]) -> Result<Vec<(Value, Value)>, ReadError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.malformed("a dict's key without a value"));
        }
        Ok(items.chunks_exact(2).map(|kv| (kv[0], kv[1])).collect())
    }

    fn list(&mut self, v: Value) -> Result<&mut Vec<Value>, ReadError> {
        let err = self.malformed("an append to something other than a list");
        self.doc.list_mut(v).ok_or(err)
    }

    fn dict(&mut self, v: Value) -> Result<&mut Vec<(Value, Value)>, ReadError> {
        let err = self.malformed("a set item on something other than a dict");
        self.doc.dict_mut(v).ok_or(err)
    }

    fn put(&mut self, index: u64) -> Result<(), ReadError> {
        let v = self.top()?;
        if !self.memo.contains_key(&index) && self.memo.len() as u64 >= self.max_memo {
            return Err(ReadError::TooLarge {
                what: "memo entries",
                limit: self.max_memo,
            });
        }
        self.memo.insert(index, v);
        Ok(())
    }

    fn get(&mut self, index: u64) -> Result<(), ReadError> {
        match self.memo.get(&index) {
            Some(&v) => {
                self.stack.push(v);
                Ok(())
            }
            None => Err(self.malformed("a memo get of an entry never put")),
        }
    }

    fn malformed(&self, reason: &'static str) -> ReadError {
        ReadError::Malformed {
            offset: self.at as u64,
            reason,
        }
    }
}
