//! The parser's working state: the configuration being built, which keys were given or seen, and
//! the warnings so far. Item parsing (`parse`) and the checks between keys (`constraints`) both
//! work on it; neither depends on the other's internals.

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::conf::AllocConf;
use crate::keys::KEY_COUNT;
use crate::warning::{Warning, WarningKind};

/// The parser's working state, shared with the checks between keys.
#[derive(Default)]
pub(crate) struct State {
    /// The configuration being built.
    pub(crate) conf: AllocConf,
    /// Keys set to a valid value.
    pub(crate) given: [bool; KEY_COUNT],
    /// Keys that appeared in an item (for `duplicate_key`).
    pub(crate) seen: [bool; KEY_COUNT],
    /// Warnings so far.
    pub(crate) warnings: Vec<Warning>,
}

impl State {
    /// Records a warning.
    pub(crate) fn warn(&mut self, kind: WarningKind, key: &str, message: String) {
        self.warnings.push(Warning {
            kind,
            key: key.to_string(),
            message,
        });
    }
}
