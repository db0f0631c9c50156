//! Parsing a config string into an [`AllocConf`]: each item is read and applied in order, with a
//! typed [`Warning`] instead of an abort for anything wrong, then the checks between keys run
//! (`constraints`).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::conf::{AllocConf, Backend, MIB};
use crate::constraints;
use crate::keys::{KEY_COUNT, Key, UNSUPPORTED_KEYS};
use crate::lex::{self, Item, NumError};
use crate::roundup;
use crate::state::State;
use crate::warning::{StrictError, Warning, WarningKind};

/// `page_size:1g`, in bytes.
const GIB: u64 = 1 << 30;

/// The result of parsing: the configuration, every warning, and which keys the string set.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The configuration: defaults, overridden by every valid item, then by the checks between keys.
    pub conf: AllocConf,
    /// Every warning, in the order found (items first, then the checks between keys).
    pub warnings: Vec<Warning>,
    given: [bool; KEY_COUNT],
}

impl Parsed {
    /// Whether the string set `key` to a valid value (one the checks between keys rejected as
    /// `invalid_value` does not count).
    pub fn given(&self, key: Key) -> bool {
        self.given[key.index()]
    }

    /// Strict mode: the configuration if there was no warning, else every warning as an error.
    pub fn strict(self) -> Result<AllocConf, StrictError> {
        if self.warnings.is_empty() {
            Ok(self.conf)
        } else {
            Err(StrictError {
                warnings: self.warnings,
            })
        }
    }
}

/// Parses a config string (`key:value` or `key=value` items, comma-separated). Never fails and
/// never panics: problems become warnings and leave the defaults in place.
pub fn parse(s: &str) -> Parsed {
    let mut st = State::default();
    for item in lex::items(s) {
        st.item(item);
    }
    constraints::check(&mut st);
    Parsed {
        conf: st.conf,
        warnings: st.warnings,
        given: st.given,
    }
}

/// The keys torch_npu's `_set_allocator_settings` accepts once the allocator runs (the others
/// it refuses: pool geometry and host-allocator settings are fixed at start).
pub const RUN_TIME_KEYS: [Key; 6] = [
    Key::ExpandableSegments,
    Key::MaxSplitSizeMb,
    Key::MaxNonSplitRoundingMb,
    Key::ReleaseLockOnNpumalloc,
    Key::ThrowOnNpumallocOom,
    Key::PerProcessMemoryFraction,
];

/// Keys torch_npu's `_set_allocator_settings` takes that npu-alloc does not support: they pass
/// its first check (and warn as unsupported here), where every other key refuses the string.
const RUN_TIME_UNSUPPORTED: [&str; 2] =
    ["pinned_max_round_threshold_mb", "pinned_max_cached_size_mb"];

/// Parses a string given at run time (torch's `torch.npu.memory._set_allocator_settings`) on top
/// of the configuration in force, `current`. As in torch_npu, which runs the same c10 parser
/// again, `max_split_size_mb`, `roundup_power2_divisions` and `garbage_collection_threshold`
/// first go back to their defaults whether or not the string names them, and
/// `max_non_split_rounding_mb` to the large segment size; the checks between keys run as in
/// [`parse`] (so `max_split_size_mb` here turns expandable segments off, with a warning). A
/// string naming a key (with a value) other than [`RUN_TIME_KEYS`], known or not, changes
/// nothing, with a [`WarningKind::NotAtRunTime`] warning for each such key: torch_npu checks
/// every key first and raises before it resets or applies any. The exceptions are torch_npu's
/// two pinned run-time keys, unsupported here: they warn as in [`parse`] and the rest applies.
/// The empty string changes nothing either: torch_npu's parser returns before it resets
/// anything.
///
/// ```
/// use alloc_conf::{parse, parse_settings};
///
/// let start = parse("expandable_segments:True,roundup_power2_divisions:4").conf;
/// let p = parse_settings(&start, "expandable_segments:False");
/// assert!(!p.conf.expandable_segments);
/// assert_eq!(p.conf.roundup_power2_divisions, [0; 16]); // reset, as in torch_npu
/// assert_eq!(parse_settings(&start, "").conf, start);
/// ```
pub fn parse_settings(current: &AllocConf, s: &str) -> Parsed {
    // torch_npu's parseArgs returns before it parses (and resets) anything for "".
    if s.is_empty() {
        return Parsed {
            conf: current.clone(),
            warnings: Vec::new(),
            given: [false; KEY_COUNT],
        };
    }
    if let Some(warnings) = refused_at_run_time(s) {
        return Parsed {
            conf: current.clone(),
            warnings,
            given: [false; KEY_COUNT],
        };
    }
    // What torch_npu's run-time parse puts back to the default before it reads the string.
    let defaults = AllocConf::default();
    let mut st = State {
        conf: AllocConf {
            max_split_size: defaults.max_split_size,
            roundup_power2_divisions: defaults.roundup_power2_divisions,
            garbage_collection_threshold: defaults.garbage_collection_threshold,
            ..current.clone()
        },
        ..State::default()
    };
    // `max_non_split_rounding_mb` is not marked given: c10's parser sets it to the large
    // segment size at every parse before it reads the keys, so a run-time call that does not
    // name it resets it (the checks between keys apply that default).
    for item in lex::items(s) {
        st.item(item);
    }
    constraints::check(&mut st);
    Parsed {
        conf: st.conf,
        warnings: st.warnings,
        given: st.given,
    }
}

/// A warning for each key of `s` that torch_npu's `_set_allocator_settings` refuses (its first
/// loop raises for them, before anything is reset or applied); `None` when it takes them all.
fn refused_at_run_time(s: &str) -> Option<Vec<Warning>> {
    let mut st = State::default();
    for item in lex::items(s) {
        let Item::Pair { key, .. } = item else {
            continue;
        };
        let taken = match Key::from_name(key) {
            Some(k) => RUN_TIME_KEYS.contains(&k),
            None => RUN_TIME_UNSUPPORTED.contains(&key),
        };
        if !taken {
            st.warn(
                WarningKind::NotAtRunTime,
                key,
                format!(
                    "torch_npu's _set_allocator_settings does not take {key}; the whole string \
                     is ignored, as torch_npu raises before it applies any key"
                ),
            );
        }
    }
    (!st.warnings.is_empty()).then_some(st.warnings)
}

/// Parses in strict mode: [`parse`] followed by [`Parsed::strict`].
pub fn parse_strict(s: &str) -> Result<AllocConf, StrictError> {
    parse(s).strict()
}

impl State {
    /// Reads and applies one item.
    fn item(&mut self, item: Item<'_>) {
        let (key, value) = match item {
            Item::Pair { key, value } => (key, value),
            Item::Bare(word) => {
                self.note_seen(word);
                self.warn(
                    WarningKind::MissingValue,
                    word,
                    format!("Error, expecting a value for {word} (write {word}:<value>)"),
                );
                return;
            }
        };
        self.note_seen(key);
        if value.is_empty() {
            self.warn(
                WarningKind::MissingValue,
                key,
                format!("Error, expecting {key} value"),
            );
            return;
        }
        let Some(k) = Key::from_name(key) else {
            if UNSUPPORTED_KEYS.contains(&key) {
                self.warn(
                    WarningKind::UnsupportedKey,
                    key,
                    format!("Allocator option {key} is not supported by npu-alloc; ignored"),
                );
            } else {
                self.warn(
                    WarningKind::UnknownKey,
                    key,
                    format!("Unrecognized CachingAllocator option: {key}"),
                );
            }
            return;
        };
        match self.value(k, key, value) {
            Ok(()) => self.given[k.index()] = true,
            Err((kind, message)) => self.warn(kind, key, message),
        }
    }

    /// Flags a supported key that already appeared in an earlier item.
    fn note_seen(&mut self, name: &str) {
        if let Some(k) = Key::from_name(name) {
            if self.seen[k.index()] {
                self.warn(
                    WarningKind::DuplicateKey,
                    name,
                    format!("{name} is given more than once; the later valid value wins"),
                );
            }
            self.seen[k.index()] = true;
        }
    }

    /// Reads `value` for `k` (written `name`) and stores it in the configuration.
    fn value(&mut self, k: Key, name: &str, value: &str) -> Result<(), (WarningKind, String)> {
        let c = &mut self.conf;
        match k {
            Key::MaxSplitSizeMb => {
                let mb = int(name, value)?;
                if mb <= 20 {
                    return Err(invalid(format!(
                        "CachingAllocator option max_split_size_mb too small, must be > 20, got {mb}"
                    )));
                }
                c.max_split_size = Some(mib(name, mb)?);
            }
            Key::MaxNonSplitRoundingMb => c.max_non_split_rounding = mib(name, int(name, value)?)?,
            Key::LargeSegmentSizeMb => {
                let mb = int(name, value)?;
                if mb <= 10 {
                    return Err(invalid(format!(
                        "CachingAllocator option large_segment_size_mb must be > 10 MB, got {mb}"
                    )));
                }
                c.large_segment_size = mib(name, mb)?;
            }
            Key::GarbageCollectionThreshold => {
                let v = float(name, value)?;
                if !(v > 0.0 && v < 1.0) {
                    return Err(invalid(format!(
                        "garbage_collect_threshold is invalid, set it in (0.0, 1.0), got {value}{}",
                        read_as(value, v)
                    )));
                }
                c.garbage_collection_threshold = Some(v);
            }
            Key::ExpandableSegments => c.expandable_segments = boolean(name, value)?,
            Key::BaseAddrAlignedKb => {
                let kb = int(name, value)
                    .ok()
                    .filter(|&kb| kb <= 16)
                    .ok_or_else(|| {
                        invalid(format!(
                            "CachingAllocator option base_addr_aligned_kb error, must be [0~16], \
                         dtype is int, got '{value}'"
                        ))
                    })?;
                c.base_addr_aligned = if kb == 0 { 512 } else { kb * 1024 };
            }
            Key::PageSize => {
                if !matches!(value, "1g" | "1G" | "1gb" | "1GB") {
                    return Err(invalid(format!(
                        "Unsupported page_size value: {value} (only 1g is supported)"
                    )));
                }
                c.page_size = Some(GIB);
            }
            Key::SegmentSizeMb => {
                let mb = int(name, value).ok().filter(|mb| (20..=512).contains(mb));
                let mb = mb.ok_or_else(|| {
                    invalid(format!(
                        "CachingAllocator option segment_size_mb error, must be [20, 512], \
                         dtype is int, got '{value}'"
                    ))
                })?;
                c.segment_size = mb * MIB;
            }
            Key::RoundupPower2Divisions => {
                c.roundup_power2_divisions = roundup::parse(value).map_err(invalid)?;
            }
            Key::PerProcessMemoryFraction => {
                let v = float(name, value)?;
                if !(0.0..=1.0).contains(&v) {
                    return Err(invalid(format!(
                        "per_process_memory_fraction is invalid, set it in [0.0, 1.0], got {value}{}",
                        read_as(value, v)
                    )));
                }
                c.per_process_memory_fraction = v;
            }
            Key::ReleaseLockOnNpumalloc => c.release_lock_on_npumalloc = boolean(name, value)?,
            Key::MultiStreamLazyReclaim => c.multi_stream_lazy_reclaim = boolean(name, value)?,
            Key::ThrowOnNpumallocOom => c.throw_on_npumalloc_oom = boolean(name, value)?,
            Key::PinnedUseBackgroundThreads => {
                c.pinned_use_background_threads = boolean(name, value)?;
            }
            Key::PinMemoryExpandableSegments => {
                c.pin_memory_expandable_segments = boolean(name, value)?;
            }
            Key::PinnedMemRegister => c.pinned_mem_register = boolean(name, value)?,
            Key::PinnedNumRegisterThreads => {
                let n = int(name, value)?;
                if !n.is_power_of_two() {
                    return Err(invalid(format!(
                        "Number of register threads has to be power of 2, got {n}"
                    )));
                }
                if n > 128 {
                    return Err(invalid(format!(
                        "Number of register threads should be less than or equal to 128, got {n}"
                    )));
                }
                c.pinned_num_register_threads = n as u32;
            }
            Key::Backend => {
                if value != "native" {
                    return Err((
                        WarningKind::UnsupportedValue,
                        format!(
                            "Unknown allocator backend {value}, the only option here is native"
                        ),
                    ));
                }
                c.backend = Backend::Native;
            }
        }
        Ok(())
    }
}

/// `" (read as 1)"` when the text of a float is not what it parsed to (a number with more digits
/// than an `f64` holds), so a user sees why `0.99999999999999999999` is out of (0, 1). A value
/// far from 1 is written in exponent form, which is also taken as its shortest text, so that
/// `1e300` is not echoed with 300 digits.
fn read_as(text: &str, v: f64) -> String {
    let exponent = v != 0.0 && !(1e-4..1e16).contains(&v.abs());
    let shortest = if exponent {
        format!("{v:e}")
    } else {
        format!("{v}")
    };
    if text == shortest || text == format!("{v}") {
        String::new()
    } else {
        format!(" (read as {shortest})")
    }
}

/// An `invalid_value` warning's kind and message.
fn invalid(message: String) -> (WarningKind, String) {
    (WarningKind::InvalidValue, message)
}

/// A decimal integer value of key `name`.
fn int(name: &str, value: &str) -> Result<u64, (WarningKind, String)> {
    lex::integer(value).map_err(|e| {
        invalid(match e {
            NumError::Syntax => format!(
                "CachingAllocator option {name} is invalid: expected a decimal integer, got '{value}'"
            ),
            NumError::Overflow => {
                format!("CachingAllocator option {name} is invalid: {value} is too large")
            }
        })
    })
}

/// `mb` MiB in bytes, an `invalid_value` if that does not fit in 64 bits.
fn mib(name: &str, mb: u64) -> Result<u64, (WarningKind, String)> {
    mb.checked_mul(MIB).ok_or_else(|| {
        invalid(format!(
            "CachingAllocator option {name} is invalid: {mb} MiB does not fit in 64 bits"
        ))
    })
}

/// A plain decimal float value of key `name`.
fn float(name: &str, value: &str) -> Result<f64, (WarningKind, String)> {
    lex::float(value).map_err(|e| {
        invalid(match e {
            NumError::Syntax => format!(
                "CachingAllocator option {name} is invalid: expected a decimal number, got '{value}'"
            ),
            NumError::Overflow => {
                format!("CachingAllocator option {name} is invalid: {value} is out of range")
            }
        })
    })
}

/// A boolean value of key `name`.
fn boolean(name: &str, value: &str) -> Result<bool, (WarningKind, String)> {
    lex::boolean(value).ok_or_else(|| {
        invalid(format!(
            "Expected a single True/False argument for {name}, got '{value}'"
        ))
    })
}

#[cfg(test)]
mod tests;
