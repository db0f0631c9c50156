//! The runtime's configuration: the allocator config (`alloc-conf`, from the first of the
//! config variables that is set, see alloc-conf.md) and whether caching is on
//! (`PYTORCH_NO_NPU_MEMORY_CACHING`).
//!
//! [`Config::from_lookup`] is pure (a lookup closure stands for the environment);
//! [`Config::from_env`] reads the process environment once and logs each warning once.

use core::fmt;

use alloc_conf::AllocConf;

use crate::sync::global::OnceLock;
use crate::warn_once::warn_once;

/// `PYTORCH_NO_NPU_MEMORY_CACHING`: `1` turns the cache off, `0` (or unset) keeps it.
pub const NO_CACHING_ENV: &str = "PYTORCH_NO_NPU_MEMORY_CACHING";

/// Everything the runtime reads from its environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The caching allocator's settings.
    pub alloc: AllocConf,
    /// Whether blocks are cached (false with `PYTORCH_NO_NPU_MEMORY_CACHING=1`).
    pub caching: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            alloc: AllocConf::default(),
            caching: true,
        }
    }
}

/// Something in the environment that was ignored; the default stays.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConfigWarning {
    /// `PYTORCH_NO_NPU_MEMORY_CACHING` is neither `0` nor `1`; caching stays on.
    InvalidNoCaching {
        /// The value found.
        value: String,
    },
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigWarning::InvalidNoCaching { value } => write!(
                f,
                "{NO_CACHING_ENV}={value:?} is invalid (only 0 and 1 are allowed); caching stays on"
            ),
        }
    }
}

impl Config {
    /// The configuration an environment describes, with what it ignored. `lookup` returns a
    /// variable's value, `None` when unset.
    pub fn from_lookup<F>(lookup: F) -> (Config, Vec<ConfigWarning>)
    where
        F: Fn(&str) -> Option<String>,
    {
        let (alloc, mut warnings) = read_alloc_conf(&lookup);
        let caching = match lookup(NO_CACHING_ENV).as_deref().map(str::trim) {
            None | Some("" | "0") => true,
            Some("1") => false,
            Some(other) => {
                warnings.push(ConfigWarning::InvalidNoCaching {
                    value: other.to_owned(),
                });
                true
            }
        };
        (Config { alloc, caching }, warnings)
    }

    /// The process environment's configuration, read on the first call and kept; each warning
    /// is logged once (`log::warn!`).
    pub fn from_env() -> Config {
        static ENV: OnceLock<Config> = OnceLock::new();
        ENV.get_or_init(|| {
            let (config, warnings) = Config::from_lookup(|name| std::env::var(name).ok());
            for w in &warnings {
                warn_once(&w.to_string());
            }
            config
        })
        .clone()
    }
}

/// The allocator config from the environment's config variables, through `alloc-conf`.
fn read_alloc_conf<F>(_lookup: &F) -> (AllocConf, Vec<ConfigWarning>)
where
    F: Fn(&str) -> Option<String>,
{
    // alloc-conf's parser and env precedence have not landed yet: defaults until they do.
    (AllocConf::default(), Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn no_caching_values() {
        for (value, caching) in [("0", true), ("1", false), ("", true), (" 1 ", false)] {
            let pairs: &'static [(&str, &str)] = Box::leak(Box::new([(NO_CACHING_ENV, value)]));
            let (config, warnings) = Config::from_lookup(env(pairs));
            assert_eq!(config.caching, caching, "{value:?}");
            assert!(warnings.is_empty());
        }
        let (config, _) = Config::from_lookup(env(&[]));
        assert!(config.caching);
    }

    #[test]
    fn invalid_no_caching_warns_and_keeps_caching() {
        for value in ["2", "true", "yes", "-1"] {
            let pairs: &'static [(&str, &str)] = Box::leak(Box::new([(NO_CACHING_ENV, value)]));
            let (config, warnings) = Config::from_lookup(env(pairs));
            assert!(config.caching);
            assert_eq!(
                warnings,
                vec![ConfigWarning::InvalidNoCaching {
                    value: value.to_owned()
                }]
            );
            assert_eq!(
                warnings[0].to_string(),
                format!(
                    "PYTORCH_NO_NPU_MEMORY_CACHING={value:?} is invalid (only 0 and 1 are allowed); caching stays on"
                )
            );
        }
    }
}
