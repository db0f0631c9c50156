//! Where the config string comes from: an explicit string, then the environment variables in order.
//!
//! A pure function over a lookup closure, so callers choose how to read the environment and tests
//! never touch the process environment.

use alloc::string::String;
use core::fmt;

use crate::parse::{Parsed, parse};

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

/// The first source that is present and not blank (only whitespace), and its string.
///
/// `explicit` comes first, then [`ENV_VARS`] in order through `lookup` (which returns a
/// variable's value, `None` when unset); later sources are not looked up.
pub fn select(
    explicit: Option<&str>,
    mut lookup: impl FnMut(&str) -> Option<String>,
) -> Option<(Source, String)> {
    let present = |s: &str| !s.trim().is_empty();
    if let Some(s) = explicit.filter(|s| present(s)) {
        return Some((Source::Argument, String::from(s)));
    }
    ENV_VARS.into_iter().find_map(|name| {
        lookup(name)
            .filter(|s| present(s))
            .map(|s| (Source::Var(name), s))
    })
}

/// Selects the source as [`select`] does and parses its string (defaults when there is none).
pub fn from_env(explicit: Option<&str>, lookup: impl FnMut(&str) -> Option<String>) -> Loaded {
    let (source, text) = match select(explicit, lookup) {
        Some((source, text)) => (Some(source), text),
        None => (None, String::new()),
    };
    let parsed = parse(&text);
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

        fn lookup(&self) -> impl FnMut(&str) -> Option<String> + '_ {
            |name| {
                self.read.borrow_mut().push(name.to_string());
                self.vars
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
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
        let (source, text) = select(Some(" x:1 "), |_| None).unwrap();
        assert_eq!(source, Source::Argument);
        assert_eq!(text, " x:1 ");
    }
}
