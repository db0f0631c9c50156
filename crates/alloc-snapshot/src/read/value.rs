//! The values stage 1 builds: scalars inline, strings and containers in arenas of the
//! [`Doc`], referenced by index. A memo get copies an index (a shared object stays one object,
//! as in Python), a list memoized before its `APPENDS` is seen complete through the memo, and a
//! cycle or a deep nesting is only indices: nothing recurses over them and nothing drops them
//! recursively.

/// One pickled value.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// Index into [`Doc::strs`].
    Str(usize),
    /// Index into [`Doc::lists`].
    List(usize),
    /// Index into [`Doc::tuples`].
    Tuple(usize),
    /// Index into [`Doc::dicts`].
    Dict(usize),
}

impl Value {
    /// What it is, for [`ReadError::Shape`](super::ReadError::Shape).
    pub(super) fn kind(self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::List(_) => "a list",
            Value::Tuple(_) => "a tuple",
            Value::Dict(_) => "a dict",
        }
    }
}

/// Everything one pickle holds. Indices in a [`Value`] are only made by the `push_*` methods,
/// so they are always in range.
#[derive(Debug, Default)]
pub(super) struct Doc {
    /// Every string's text, back to back.
    text: String,
    /// Each string's range in `text`.
    strs: Vec<(usize, usize)>,
    /// Lists grow after they are made (`APPEND` to a memoized list).
    lists: Vec<Vec<Value>>,
    /// Each tuple's range in `tuple_items`: tuples never change.
    tuples: Vec<(usize, usize)>,
    tuple_items: Vec<Value>,
    /// Dicts grow after they are made; a repeated key is kept, and the last one wins on lookup,
    /// as Python's `SETITEM` replaces.
    dicts: Vec<Vec<(Value, Value)>>,
}

impl Doc {
    pub(super) fn push_str(&mut self, s: &str) -> Value {
        let start = self.text.len();
        self.text.push_str(s);
        self.strs.push((start, self.text.len()));
        Value::Str(self.strs.len() - 1)
    }

    pub(super) fn push_list(&mut self, items: Vec<Value>) -> Value {
        self.lists.push(items);
        Value::List(self.lists.len() - 1)
    }

    pub(super) fn push_tuple(&mut self, items: &[Value]) -> Value {
        let start = self.tuple_items.len();
        self.tuple_items.extend_from_slice(items);
        self.tuples.push((start, self.tuple_items.len()));
        Value::Tuple(self.tuples.len() - 1)
    }

    pub(super) fn push_dict(&mut self, pairs: Vec<(Value, Value)>) -> Value {
        self.dicts.push(pairs);
        Value::Dict(self.dicts.len() - 1)
    }

    /// The list `v` is, to append to.
    pub(super) fn list_mut(&mut self, v: Value) -> Option<&mut Vec<Value>> {
        match v {
            Value::List(i) => self.lists.get_mut(i),
            _ => None,
        }
    }

    /// The dict `v` is, to set items in.
    pub(super) fn dict_mut(&mut self, v: Value) -> Option<&mut Vec<(Value, Value)>> {
        match v {
            Value::Dict(i) => self.dicts.get_mut(i),
            _ => None,
        }
    }

    /// The text of a string.
    pub(super) fn str(&self, v: Value) -> Option<&str> {
        match v {
            Value::Str(i) => {
                let &(start, end) = self.strs.get(i)?;
                self.text.get(start..end)
            }
            _ => None,
        }
    }

    /// The items of a list or a tuple.
    pub(super) fn seq(&self, v: Value) -> Option<&[Value]> {
        match v {
            Value::List(i) => self.lists.get(i).map(Vec::as_slice),
            Value::Tuple(i) => {
                let &(start, end) = self.tuples.get(i)?;
                self.tuple_items.get(start..end)
            }
            _ => None,
        }
    }

    /// The items of a dict, in insertion order.
    pub(super) fn dict(&self, v: Value) -> Option<&[(Value, Value)]> {
        match v {
            Value::Dict(i) => self.dicts.get(i).map(Vec::as_slice),
            _ => None,
        }
    }
}
