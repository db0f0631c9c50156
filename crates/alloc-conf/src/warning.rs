//! Typed warnings and the strict-mode error.
//!
//! Bad input never aborts: every problem in a config string becomes a [`Warning`] and the setting
//! keeps its default. Callers that want torch's fail-fast behaviour turn the warnings into a
//! [`StrictError`] with [`crate::Parsed::strict`].

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// What kind of problem a [`Warning`] reports; [`WarningKind::name`] is the documented snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WarningKind {
    /// A key neither torch, torch_npu nor this crate knows.
    UnknownKey,
    /// A key torch or torch_npu knows but that has no meaning here yet.
    UnsupportedKey,
    /// A well-formed value this crate does not support (for example another `backend`).
    UnsupportedValue,
    /// An item without `:`/`=`, or with an empty value.
    MissingValue,
    /// A value that does not parse or is out of bounds; the setting keeps its default.
    InvalidValue,
    /// A key given more than once; the later valid value wins.
    DuplicateKey,
    /// Two settings that cannot both apply; one is overridden.
    Conflict,
    /// A setting that is kept but has no effect with the rest of the configuration.
    Ineffective,
    /// An environment variable whose value is not UTF-8; its lossy text is parsed.
    NotUtf8,
    /// A key torch_npu's `_set_allocator_settings` does not take (in [`crate::parse_settings`]):
    /// the whole string is ignored, as torch_npu raises before it applies any key.
    NotAtRunTime,
}

impl WarningKind {
    /// Every kind, in the order docs/alloc-conf.md lists them.
    pub const ALL: [WarningKind; 10] = [
        WarningKind::UnknownKey,
        WarningKind::UnsupportedKey,
        WarningKind::UnsupportedValue,
        WarningKind::MissingValue,
        WarningKind::InvalidValue,
        WarningKind::DuplicateKey,
        WarningKind::Conflict,
        WarningKind::Ineffective,
        WarningKind::NotUtf8,
        WarningKind::NotAtRunTime,
    ];

    /// The snake_case name used in JSON output (`unknown_key`, `invalid_value`, ...).
    pub fn name(self) -> &'static str {
        match self {
            WarningKind::UnknownKey => "unknown_key",
            WarningKind::UnsupportedKey => "unsupported_key",
            WarningKind::UnsupportedValue => "unsupported_value",
            WarningKind::MissingValue => "missing_value",
            WarningKind::InvalidValue => "invalid_value",
            WarningKind::DuplicateKey => "duplicate_key",
            WarningKind::Conflict => "conflict",
            WarningKind::Ineffective => "ineffective",
            WarningKind::NotUtf8 => "not_utf8",
            WarningKind::NotAtRunTime => "not_at_run_time",
        }
    }
}

impl fmt::Display for WarningKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One problem found in a config string: its kind, the key concerned and a readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// What went wrong.
    pub kind: WarningKind,
    /// The key concerned, as written in the string (`""` for an empty key).
    pub key: String,
    /// A readable explanation, in torch's or torch_npu's wording where they have one.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`: {}", self.kind, self.key, self.message)
    }
}

/// Strict mode's error: the configuration had warnings, which strict mode does not accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrictError {
    /// Every warning the configuration produced, in order (never empty).
    pub warnings: Vec<Warning>,
}

impl fmt::Display for StrictError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.warnings.len();
        write!(
            f,
            "allocator config rejected in strict mode ({n} warning{})",
            if n == 1 { "" } else { "s" }
        )?;
        for (i, w) in self.warnings.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { "; " })?;
            fmt::Display::fmt(w, f)?;
        }
        Ok(())
    }
}

impl core::error::Error for StrictError {}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    #[test]
    fn kind_names_are_the_spec_names() {
        let names: Vec<&str> = WarningKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "unknown_key",
                "unsupported_key",
                "unsupported_value",
                "missing_value",
                "invalid_value",
                "duplicate_key",
                "conflict",
                "ineffective",
                "not_utf8",
                "not_at_run_time"
            ]
        );
        assert_eq!(WarningKind::Conflict.to_string(), "conflict");
    }

    #[test]
    fn display_of_warning_and_strict_error() {
        let w = Warning {
            kind: WarningKind::UnknownKey,
            key: "foo".to_string(),
            message: "Unrecognized key 'foo'".to_string(),
        };
        assert_eq!(w.to_string(), "unknown_key `foo`: Unrecognized key 'foo'");
        let e = StrictError {
            warnings: vec![w.clone(), w],
        };
        assert_eq!(
            e.to_string(),
            "allocator config rejected in strict mode (2 warnings): \
             unknown_key `foo`: Unrecognized key 'foo'; unknown_key `foo`: Unrecognized key 'foo'"
        );
    }
}
