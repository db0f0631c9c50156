//! Where the config string comes from: an explicit string, then the environment variables in order.
//!
//! A pure function over a lookup closure, so callers choose how to read the environment and tests
//! never touch the process environment. The closure returns a variable's raw bytes (what a Unix
//! environment holds: `std::env::var_os(name).map(OsString::into_encoded_bytes)`), so that every
//! caller decides the same way about a value that is not UTF-8: it is set, so it wins the
//! precedence as any set value does; its lossy text is parsed; and a `not_utf8` warning names the
//! bad bytes.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::parse::{Parsed, parse};
use crate::warning::{Warning, WarningKind};

/// The environment variables read, first one present and not blank wins.
pub const ENV_VARS: [&str; 4] = [
    "MINDTORCH_NPU_ALLOC_CONF",
    "PYTORCH_NPU_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
];

/// Which source supplied the config string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A string given by the embedding program or on the command line.
    Argument,
    /// One of [`ENV_VARS`].
    Var(&'static str),
}

impl Source {
    /// `"argument"` or the variable's name, as in the JSON `source` field.
    pub fn name(self) -> &'static str {
        match self {
            Source::Argument => "argument",
            Source::Var(name) => name,
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A configuration together with where its string came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The source that won, or `None` when every source was absent or blank.
    pub source: Option<Source>,
    /// The string that was parsed (`""` when `source` is `None`).
    pub text: String,
    /// The parse of `text`.
    pub parsed: Parsed,
}

/// A variable's value as text: itself when it is UTF-8, else its lossy text and the `not_utf8`
/// warning naming the first bad bytes.
pub fn env_text(name: &str, bytes: Vec<u8>) -> (String, Option<Warning>) {
    match String::from_utf8(bytes) {
        Ok(text) => (text, None),
        Err(e) => {
            let bytes = e.as_bytes();
            let at = e.utf8_error().valid_up_to();
            let len = e.utf8_error().error_len().unwrap_or(bytes.len() - at);
            let bad: String = bytes[at..at + len]
                .iter()
                .map(|b| format!("\\x{b:02x}"))
                .collect();
            let text = String::from_utf8_lossy(bytes).into_owned();
            let warning = Warning {
                kind: WarningKind::NotUtf8,
                key: String::from(name),
                message: format!(
                    "{name} is not valid UTF-8 (bytes {bad} at offset {at}); it is read as {text:?}"
                ),
            };
            (text, Some(warning))
        }
    }
}

/// The first source that is present and not blank (only whitespace), its string, and the
/// warning for a value that is not UTF-8.
///
/// `explicit` comes first, then [`ENV_VARS`] in order through `lookup` (which returns a
/// variable's raw bytes, `None` when unset); later sources are not looked up. A value that is
/// not UTF-8 is present (even if its lossy text is blank).
pub fn select(
    explicit: Option<&str>,
    mut lookup: impl FnMut(&str) -> Option<Vec<u8>>,
) -> Option<(Source, String, Option<Warning>)> {
    let present = |s: &str| !s.trim().is_empty();
    if let Some(s) = explicit.filter(|s| present(s)) {
        return Some((Source::Argument, String::from(s), None));
    }
    ENV_VARS.into_iter().find_map(|name| {
        let (text, warning) = env_text(name, lookup(name)?);
        (warning.is_some() || present(&text)).then_some((Source::Var(name), text, warning))
    })
}

/// Selects the source as [`select`] does and parses its string (defaults when there is none);
/// a `not_utf8` warning comes first among the warnings.
pub fn from_env(explicit: Option<&str>, lookup: impl FnMut(&str) -> Option<Vec<u8>>) -> Loaded {
    let (source, text, warning) = match select(explicit, lookup) {
        Some((source, text, warning)) => (Some(source), text, warning),
        None => (None, String::new(), None),
    };
    let mut parsed = parse(&text);
    if let Some(w) = warning {
        parsed.warnings.insert(0, w);
    }
    Loaded {
        source,
        text,
        parsed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AllocConf, MIB};
    use alloc::string::ToString;
    use alloc::vec::Vec;
    use core::cell::RefCell;

    /// A fake environment that records which variables were read.
    struct Env {
        vars: Vec<(&'static str, &'static str)>,
        read: RefCell<Vec<String>>,
    }

    impl Env {
        fn new(vars: &[(&'static str, &'static str)]) -> Env {
            Env {
                vars: vars.to_vec(),
                read: RefCell::new(Vec::new()),
            }
        }

        fn lookup(&self) -> impl FnMut(&str) -> Option<Vec<u8>> + '_ {
            |name| {
                self.read.borrow_mut().push(name.to_string());
                self.vars
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.as_bytes().to_vec())
            }
        }

        fn read(&self) -> Vec<String> {
            self.read.borrow().clone()
        }
    }

    const ALL_SET: [(&str, &str); 4] = [
        ("MINDTORCH_NPU_ALLOC_CONF", "max_split_size_mb:21"),
        ("PYTORCH_NPU_ALLOC_CONF", "max_split_size_mb:22"),
        ("PYTORCH_ALLOC_CONF", "max_split_size_mb:23"),
        ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:24"),
    ];

    #[test]
    fn argument_comes_first_and_nothing_is_read() {
        let env = Env::new(&ALL_SET);
        let l = from_env(Some("max_split_size_mb:30"), env.lookup());
        assert_eq!(l.source, Some(Source::Argument));
        assert_eq!(l.text, "max_split_size_mb:30");
        assert_eq!(l.parsed.conf.max_split_size, Some(30 * MIB));
        assert!(env.read().is_empty());
    }

    #[test]
    fn each_variable_wins_over_the_later_ones_which_are_not_read() {
        for (i, (name, _)) in ALL_SET.iter().enumerate() {
            let env = Env::new(&ALL_SET[i..]);
            let l = from_env(None, env.lookup());
            assert_eq!(l.source, Some(Source::Var(name)));
            assert_eq!(l.parsed.conf.max_split_size, Some((21 + i as u64) * MIB));
            assert_eq!(env.read(), ENV_VARS[..=i]);
        }
    }

    #[test]
    fn blank_sources_are_absent() {
        for blank in ["", " ", " \t\n "] {
            let env = Env::new(&[
                ("MINDTORCH_NPU_ALLOC_CONF", blank),
                ("PYTORCH_NPU_ALLOC_CONF", blank),
                ("PYTORCH_ALLOC_CONF", blank),
                ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"),
            ]);
            let l = from_env(Some(blank), env.lookup());
            assert_eq!(l.source, Some(Source::Var("PYTORCH_CUDA_ALLOC_CONF")));
            assert_eq!(l.parsed.conf.max_split_size, Some(64 * MIB));
        }
    }

    #[test]
    fn nothing_set_gives_defaults_and_no_source() {
        let env = Env::new(&[("PYTORCH_CUDA_ALLOC_CONF", "  ")]);
        let l = from_env(None, env.lookup());
        assert_eq!(l.source, None);
        assert_eq!(l.text, "");
        assert_eq!(l.parsed.conf, AllocConf::default());
        assert!(l.parsed.warnings.is_empty());
        assert_eq!(env.read(), ENV_VARS);
    }

    #[test]
    fn sources_are_never_merged() {
        // The acceptance case: the NPU variable wins and the CUDA one's split cap is not applied.
        let env = Env::new(&[
            ("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True"),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64"),
        ]);
        let l = from_env(None, env.lookup());
        assert_eq!(l.source, Some(Source::Var("PYTORCH_NPU_ALLOC_CONF")));
        assert!(l.parsed.conf.expandable_segments);
        assert_eq!(l.parsed.conf.max_split_size, None);
        assert!(l.parsed.warnings.is_empty());
    }

    #[test]
    fn source_names() {
        assert_eq!(Source::Argument.to_string(), "argument");
        assert_eq!(
            Source::Var("PYTORCH_ALLOC_CONF").to_string(),
            "PYTORCH_ALLOC_CONF"
        );
        let (source, text, warning) = select(Some(" x:1 "), |_| None).unwrap();
        assert_eq!(source, Source::Argument);
        assert_eq!(text, " x:1 ");
        assert_eq!(warning, None);
    }

    #[test]
    fn a_value_that_is_not_utf8_is_set_and_warned_about() {
        // The NPU variable holds a byte that is not UTF-8: it still wins over the CUDA one, its
        // lossy text is parsed (64 MiB), and the first warning names the bad byte.
        let lookup = |name: &str| match name {
            "PYTORCH_NPU_ALLOC_CONF" => Some(b"max_split_size_mb:64,\xff".to_vec()),
            "PYTORCH_CUDA_ALLOC_CONF" => Some(b"max_split_size_mb:128".to_vec()),
            _ => None,
        };
        let l = from_env(None, lookup);
        assert_eq!(l.source, Some(Source::Var("PYTORCH_NPU_ALLOC_CONF")));
        assert_eq!(l.parsed.conf.max_split_size, Some(64 * MIB));
        let w = &l.parsed.warnings[0];
        assert_eq!(
            (w.kind, w.key.as_str()),
            (WarningKind::NotUtf8, "PYTORCH_NPU_ALLOC_CONF")
        );
        assert_eq!(
            w.message,
            "PYTORCH_NPU_ALLOC_CONF is not valid UTF-8 (bytes \\xff at offset 21); it is read as \
             \"max_split_size_mb:64,\u{fffd}\""
        );
        // The replacement character is then a bare item.
        assert_eq!(l.parsed.warnings[1].kind, WarningKind::MissingValue);
        // A value of only bad bytes is still set: it wins, and parses to the defaults.
        let l = from_env(None, |name: &str| {
            (name == "MINDTORCH_NPU_ALLOC_CONF").then(|| b"\xfe".to_vec())
        });
        assert_eq!(l.source, Some(Source::Var("MINDTORCH_NPU_ALLOC_CONF")));
        assert_eq!(l.parsed.warnings[0].kind, WarningKind::NotUtf8);
    }
}
