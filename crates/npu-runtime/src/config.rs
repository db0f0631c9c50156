//! The runtime's configuration: the allocator config (`alloc-conf`, from the first of the
//! config variables that is set, see docs/alloc-conf.md) and whether caching is on
//! (`PYTORCH_NO_NPU_MEMORY_CACHING`).
//!
//! [`Config::from_lookup`] is pure (a lookup closure stands for the environment);
//! [`Config::from_env`] reads the process environment once and logs each warning once.

use core::fmt;

use alloc_conf::{AllocConf, Source, Warning};

use crate::sync::global::OnceLock;
use crate::warn_once::warn_once;

/// A variable of the process environment as raw bytes (a value need not be UTF-8), the lookup
/// [`Config::from_lookup`] and `alloc_conf::from_env` take.
pub fn env_var(name: &str) -> Option<Vec<u8>> {
    std::env::var_os(name).map(std::ffi::OsString::into_encoded_bytes)
}

/// `PYTORCH_NO_NPU_MEMORY_CACHING`: `1` turns the cache off, `0` (or unset) keeps it.
pub const NO_CACHING_ENV: &str = "PYTORCH_NO_NPU_MEMORY_CACHING";

/// Everything the runtime reads from its environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The caching allocator's settings.
    pub alloc: AllocConf,
    /// Whether blocks are cached (false with `PYTORCH_NO_NPU_MEMORY_CACHING=1`).
    pub caching: bool,
    /// Where the allocator config string came from (`None`: defaults, nothing was set).
    pub source: Option<Source>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            alloc: AllocConf::default(),
            caching: true,
            source: None,
        }
    }
}

/// Something in the environment that was ignored; the default stays.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConfigWarning {
    /// An item of the allocator config string was ignored (or overridden), per `alloc-conf`.
    AllocConf {
        /// Where the string came from.
        source: Source,
        /// What `alloc-conf` reported.
        warning: Warning,
    },
    /// `PYTORCH_NO_NPU_MEMORY_CACHING` is neither `0` nor `1`: read as torch_npu reads it, with
    /// C's `strtol` (a number other than 0 turns caching off; no number reads as 0).
    InvalidNoCaching {
        /// The value found.
        value: String,
        /// Whether caching stays on.
        caching: bool,
    },
}

/// Whether C's `strtol(bytes, NULL, 10)` is not 0: after leading white space and a sign, the
/// digits up to the first other byte, none reading as 0 (a value out of range clamps, so it is
/// not 0 either).
fn strtol_nonzero(bytes: &[u8]) -> bool {
    // C's isspace: ASCII white space and the vertical tab, which Rust's trims leave.
    let start = bytes
        .iter()
        .position(|b| !b" \t\n\x0b\x0c\r".contains(b))
        .unwrap_or(bytes.len());
    let rest = &bytes[start..];
    let rest = rest
        .strip_prefix(b"+")
        .or_else(|| rest.strip_prefix(b"-"))
        .unwrap_or(rest);
    rest.iter()
        .take_while(|b| b.is_ascii_digit())
        .any(|&b| b != b'0')
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigWarning::AllocConf { source, warning } => write!(f, "{source}: {warning}"),
            ConfigWarning::InvalidNoCaching { value, caching } => write!(
                f,
                "{NO_CACHING_ENV}={value:?} is neither 0 nor 1; read as torch_npu reads it (C's \
                 strtol): caching {}",
                if *caching { "stays on" } else { "off" }
            ),
        }
    }
}

impl Config {
    /// The configuration an environment describes, with what it ignored. The allocator config
    /// string is `explicit` if given and not blank, else the first variable of
    /// [`alloc_conf::ENV_VARS`] that is set and not blank. `lookup` returns a variable's raw bytes,
    /// `None` when unset ([`env_var`] for the process environment): a value that is not UTF-8 is
    /// set, decided exactly as `alloc_conf::from_env` decides (and as `npu-alloc conf` shows).
    pub fn from_lookup<F>(explicit: Option<&str>, lookup: F) -> (Config, Vec<ConfigWarning>)
    where
        F: Fn(&str) -> Option<Vec<u8>>,
    {
        let loaded = alloc_conf::from_env(explicit, &lookup);
        let mut warnings: Vec<ConfigWarning> = match loaded.source {
            Some(source) => loaded
                .parsed
                .warnings
                .into_iter()
                .map(|warning| ConfigWarning::AllocConf { source, warning })
                .collect(),
            None => Vec::new(),
        };
        let no_caching = lookup(NO_CACHING_ENV);
        let caching = match no_caching.as_deref() {
            None => true,
            // torch_npu's GetBoolTypeOption: `strtol(value, NULL, 10) != 0`.
            Some(bytes) => {
                let caching = !strtol_nonzero(bytes);
                let lossy = String::from_utf8_lossy(bytes);
                let value = lossy.trim();
                if !matches!(value, "" | "0" | "1") {
                    warnings.push(ConfigWarning::InvalidNoCaching {
                        value: value.to_owned(),
                        caching,
                    });
                }
                caching
            }
        };
        let config = Config {
            alloc: loaded.parsed.conf,
            caching,
            source: loaded.source,
        };
        (config, warnings)
    }

    /// The process environment's configuration, read on the first call and kept; each warning
    /// is logged once (`log::warn!`).
    pub fn from_env() -> Config {
        static ENV: OnceLock<Config> = OnceLock::new();
        ENV.get_or_init(|| {
            let (config, warnings) = Config::from_lookup(None, env_var);
            for w in &warnings {
                warn_once(&w.to_string());
            }
            config
        })
        .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<Vec<u8>> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.as_bytes().to_vec())
        }
    }

    #[test]
    fn no_caching_values() {
        for (value, caching) in [("0", true), ("1", false), ("", true), (" 1 ", false)] {
            let pairs: &'static [(&str, &str)] = Box::leak(Box::new([(NO_CACHING_ENV, value)]));
            let (config, warnings) = Config::from_lookup(None, env(pairs));
            assert_eq!(config.caching, caching, "{value:?}");
            assert!(warnings.is_empty());
        }
        let (config, _) = Config::from_lookup(None, env(&[]));
        assert!(config.caching);
    }

    #[test]
    fn alloc_conf_follows_the_precedence_and_keeps_its_warnings() {
        let pairs = &[
            ("PYTORCH_NPU_ALLOC_CONF", "max_split_size_mb:64,foo:1"),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128"),
        ];
        let (config, warnings) = Config::from_lookup(None, env(pairs));
        assert_eq!(config.alloc.max_split_size, Some(64 << 20));
        assert_eq!(config.source, Some(Source::Var("PYTORCH_NPU_ALLOC_CONF")));
        assert_eq!(warnings.len(), 1);
        let text = warnings[0].to_string();
        assert!(
            text.starts_with("PYTORCH_NPU_ALLOC_CONF: unknown_key `foo`"),
            "{text}"
        );
        // An explicit string wins over the environment.
        let (config, warnings) =
            Config::from_lookup(Some("release_lock_on_npumalloc:True"), env(pairs));
        assert!(config.alloc.release_lock_on_npumalloc);
        assert_eq!(config.alloc.max_split_size, None);
        assert_eq!(config.source, Some(Source::Argument));
        assert!(warnings.is_empty());
    }

    #[test]
    fn no_caching_is_read_as_torch_npus_strtol() {
        // torch_npu's GetBoolTypeOption: strtol(value) != 0; the "0 or 1" check after it sees
        // only 0 or 1.
        for (value, caching, warned) in [
            ("0", true, false),
            ("1", false, false),
            (" 1 ", false, false),
            ("", true, false),
            ("2", false, true),
            ("-1", false, true),
            ("01", false, true),
            ("+1", false, true),
            ("1abc", false, true),
            ("00", true, true),
            ("true", true, true),
            ("yes", true, true),
        ] {
            let pairs: &'static [(&str, &str)] = Box::leak(Box::new([(NO_CACHING_ENV, value)]));
            let (config, warnings) = Config::from_lookup(None, env(pairs));
            assert_eq!(config.caching, caching, "{value:?}");
            assert_eq!(config.source, None);
            let expected: Vec<ConfigWarning> = if warned {
                vec![ConfigWarning::InvalidNoCaching {
                    value: value.trim().to_owned(),
                    caching,
                }]
            } else {
                Vec::new()
            };
            assert_eq!(warnings, expected, "{value:?}");
        }
        let pairs: &'static [(&str, &str)] = Box::leak(Box::new([(NO_CACHING_ENV, "2")]));
        assert_eq!(
            Config::from_lookup(None, env(pairs)).1[0].to_string(),
            "PYTORCH_NO_NPU_MEMORY_CACHING=\"2\" is neither 0 nor 1; read as torch_npu reads it \
             (C's strtol): caching off"
        );
    }

    #[test]
    fn values_that_are_not_utf8_are_set_and_warned_about() {
        // The NPU variable is set to bytes that are not UTF-8: it wins over the CUDA one (as
        // `npu-alloc conf` shows), its lossy text is parsed, a warning names the bad byte.
        let lookup = |name: &str| match name {
            "PYTORCH_NPU_ALLOC_CONF" => Some(b"max_split_size_mb:64,\xff".to_vec()),
            "PYTORCH_CUDA_ALLOC_CONF" => Some(b"max_split_size_mb:128".to_vec()),
            NO_CACHING_ENV => Some(b"1\xff".to_vec()),
            _ => None,
        };
        let (config, warnings) = Config::from_lookup(None, lookup);
        assert_eq!(config.source, Some(Source::Var("PYTORCH_NPU_ALLOC_CONF")));
        assert_eq!(config.alloc.max_split_size, Some(64 << 20));
        let text = warnings[0].to_string();
        assert!(
            text.starts_with("PYTORCH_NPU_ALLOC_CONF: not_utf8 `PYTORCH_NPU_ALLOC_CONF`:"),
            "{text}"
        );
        assert!(text.contains("bytes \\xff at offset 21"), "{text}");
        // PYTORCH_NO_NPU_MEMORY_CACHING=$'1\xff' is set: strtol reads its 1 (caching off), and
        // the value, neither 0 nor 1, is warned about.
        assert!(!config.caching);
        assert_eq!(
            warnings.last(),
            Some(&ConfigWarning::InvalidNoCaching {
                value: "1\u{fffd}".into(),
                caching: false,
            })
        );
    }
}
