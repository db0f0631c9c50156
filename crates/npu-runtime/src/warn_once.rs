//! Warnings logged once per process through the `log` crate (torch's `TORCH_WARN_ONCE`).

use std::collections::HashSet;

use crate::sync::global::{Mutex, OnceLock};

/// Logs `message` at warn level unless the same text was logged before; returns whether it was
/// logged now.
pub(crate) fn warn_once(message: &str) -> bool {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let first = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(message.to_owned());
    if first {
        log::warn!("{message}");
    }
    first
}
