//! ACL error codes, their names, and [`AclError`], the one error type of this crate.
//!
//! Codes are those of `acl_base.h` and `rt_error_codes.h` (docs/acl.md). Out-of-memory is
//! classified as torch_npu does (§1.4 "Telling OOM apart", §7): see
//! [`AclError::is_out_of_memory`].

use std::fmt;
use std::path::PathBuf;

use crate::types::AclCode;

/// `ACL_SUCCESS`.
pub const ACL_SUCCESS: AclCode = 0;
/// `ACL_ERROR_INVALID_PARAM` (e.g. `aclrtMalloc` of 0 bytes).
pub const ACL_ERROR_INVALID_PARAM: AclCode = 100_000;
/// `ACL_ERROR_UNINITIALIZE`.
pub const ACL_ERROR_UNINITIALIZE: AclCode = 100_001;
/// `ACL_ERROR_REPEAT_INITIALIZE`: `aclInit` was already called (torch_npu treats it as success).
pub const ACL_ERROR_REPEAT_INITIALIZE: AclCode = 100_002;
/// `ACL_ERROR_INVALID_FILE`.
pub const ACL_ERROR_INVALID_FILE: AclCode = 100_003;
/// `ACL_ERROR_REPEAT_FINALIZE`.
pub const ACL_ERROR_REPEAT_FINALIZE: AclCode = 100_037;
/// `ACL_ERROR_BAD_ALLOC`.
pub const ACL_ERROR_BAD_ALLOC: AclCode = 200_000;
/// `ACL_ERROR_API_NOT_SUPPORT`.
pub const ACL_ERROR_API_NOT_SUPPORT: AclCode = 200_001;
/// `ACL_ERROR_INVALID_DEVICE`.
pub const ACL_ERROR_INVALID_DEVICE: AclCode = 200_002;
/// `ACL_ERROR_MEMORY_ADDRESS_UNALIGNED`.
pub const ACL_ERROR_MEMORY_ADDRESS_UNALIGNED: AclCode = 200_003;
/// `ACL_ERROR_INVALID_RESOURCE_HANDLE`.
pub const ACL_ERROR_INVALID_RESOURCE_HANDLE: AclCode = 200_005;
/// `ACL_ERROR_FEATURE_UNSUPPORTED`.
pub const ACL_ERROR_FEATURE_UNSUPPORTED: AclCode = 200_006;
/// `ACL_ERROR_STORAGE_OVER_LIMIT`.
pub const ACL_ERROR_STORAGE_OVER_LIMIT: AclCode = 300_000;
/// `ACL_ERROR_INTERNAL_ERROR`.
pub const ACL_ERROR_INTERNAL_ERROR: AclCode = 500_000;
/// `ACL_ERROR_FAILURE`.
pub const ACL_ERROR_FAILURE: AclCode = 500_001;
/// `ACL_ERROR_RT_FAILURE`.
pub const ACL_ERROR_RT_FAILURE: AclCode = 500_003;
/// `ACL_ERROR_DRV_FAILURE`.
pub const ACL_ERROR_DRV_FAILURE: AclCode = 500_004;
/// `ACL_ERROR_RT_PARAM_INVALID`.
pub const ACL_ERROR_RT_PARAM_INVALID: AclCode = 107_000;
/// `ACL_ERROR_RT_INVALID_DEVICEID`.
pub const ACL_ERROR_RT_INVALID_DEVICEID: AclCode = 107_001;
/// `ACL_ERROR_RT_CONTEXT_NULL`.
pub const ACL_ERROR_RT_CONTEXT_NULL: AclCode = 107_002;
/// `ACL_ERROR_RT_INVALID_HANDLE`.
pub const ACL_ERROR_RT_INVALID_HANDLE: AclCode = 107_017;
/// `ACL_ERROR_RT_DEVICE_TASK_ABORT`.
pub const ACL_ERROR_RT_DEVICE_TASK_ABORT: AclCode = 107_022;
/// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` (e.g. VMM on a driver without it).
pub const ACL_ERROR_RT_FEATURE_NOT_SUPPORT: AclCode = 207_000;
/// `ACL_ERROR_RT_MEMORY_ALLOCATION`: the out-of-memory code torch_npu's malloc path checks.
pub const ACL_ERROR_RT_MEMORY_ALLOCATION: AclCode = 207_001;
/// `ACL_ERROR_RT_MEMORY_FREE`.
pub const ACL_ERROR_RT_MEMORY_FREE: AclCode = 207_002;
/// `ACL_ERROR_RT_NO_DEVICE`.
pub const ACL_ERROR_RT_NO_DEVICE: AclCode = 207_004;
/// `ACL_ERROR_RT_RESOURCE_ALLOC_FAIL`.
pub const ACL_ERROR_RT_RESOURCE_ALLOC_FAIL: AclCode = 207_005;
/// `ACL_ERROR_RT_NO_EVENT_RESOURCE`.
pub const ACL_ERROR_RT_NO_EVENT_RESOURCE: AclCode = 207_007;
/// `ACL_ERROR_RT_NO_STREAM_RESOURCE`.
pub const ACL_ERROR_RT_NO_STREAM_RESOURCE: AclCode = 207_008;
/// `ACL_ERROR_RT_OVER_LIMIT`.
pub const ACL_ERROR_RT_OVER_LIMIT: AclCode = 207_012;
/// `ACL_ERROR_RT_DEVICE_OOM`: device memory exhausted.
pub const ACL_ERROR_RT_DEVICE_OOM: AclCode = 207_018;
/// `ACL_ERROR_RT_INTERNAL_ERROR`.
pub const ACL_ERROR_RT_INTERNAL_ERROR: AclCode = 507_000;
/// `ACL_ERROR_RT_EVENT_NOT_COMPLETE`: an event query found the event still pending.
pub const ACL_ERROR_RT_EVENT_NOT_COMPLETE: AclCode = 507_006;
/// `ACL_ERROR_RT_DEV_SETUP_ERROR`.
pub const ACL_ERROR_RT_DEV_SETUP_ERROR: AclCode = 507_033;
/// `ACL_ERROR_RT_DEVICE_MEM_ERROR`.
pub const ACL_ERROR_RT_DEVICE_MEM_ERROR: AclCode = 507_053;
/// `ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR`.
pub const ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR: AclCode = 507_054;
/// `ACL_ERROR_RT_DRV_INTERNAL_ERROR`.
pub const ACL_ERROR_RT_DRV_INTERNAL_ERROR: AclCode = 507_899;

/// `(CODE, "CODE")` for each constant named: a name is its constant's own spelling.
macro_rules! named {
    ($($code:ident),* $(,)?) => {
        &[$(($code, stringify!($code))),*]
    };
}

/// Every known code with its C name, sorted by code.
pub const ERROR_NAMES: &[(AclCode, &str)] = named![
    ACL_SUCCESS,
    ACL_ERROR_INVALID_PARAM,
    ACL_ERROR_UNINITIALIZE,
    ACL_ERROR_REPEAT_INITIALIZE,
    ACL_ERROR_INVALID_FILE,
    ACL_ERROR_REPEAT_FINALIZE,
    ACL_ERROR_RT_PARAM_INVALID,
    ACL_ERROR_RT_INVALID_DEVICEID,
    ACL_ERROR_RT_CONTEXT_NULL,
    ACL_ERROR_RT_INVALID_HANDLE,
    ACL_ERROR_RT_DEVICE_TASK_ABORT,
    ACL_ERROR_BAD_ALLOC,
    ACL_ERROR_API_NOT_SUPPORT,
    ACL_ERROR_INVALID_DEVICE,
    ACL_ERROR_MEMORY_ADDRESS_UNALIGNED,
    ACL_ERROR_INVALID_RESOURCE_HANDLE,
    ACL_ERROR_FEATURE_UNSUPPORTED,
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
    ACL_ERROR_RT_MEMORY_ALLOCATION,
    ACL_ERROR_RT_MEMORY_FREE,
    ACL_ERROR_RT_NO_DEVICE,
    ACL_ERROR_RT_RESOURCE_ALLOC_FAIL,
    ACL_ERROR_RT_NO_EVENT_RESOURCE,
    ACL_ERROR_RT_NO_STREAM_RESOURCE,
    ACL_ERROR_RT_OVER_LIMIT,
    ACL_ERROR_RT_DEVICE_OOM,
    ACL_ERROR_STORAGE_OVER_LIMIT,
    ACL_ERROR_INTERNAL_ERROR,
    ACL_ERROR_FAILURE,
    ACL_ERROR_RT_FAILURE,
    ACL_ERROR_DRV_FAILURE,
    ACL_ERROR_RT_INTERNAL_ERROR,
    ACL_ERROR_RT_EVENT_NOT_COMPLETE,
    ACL_ERROR_RT_DEV_SETUP_ERROR,
    ACL_ERROR_RT_DEVICE_MEM_ERROR,
    ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR,
    ACL_ERROR_RT_DRV_INTERNAL_ERROR,
];

/// Codes that mean "out of device memory": 207001 (the one torch_npu's malloc path checks),
/// 207018 (device memory exhausted) and 200000 (bad alloc), as docs/acl.md explains.
pub const OOM_CODES: &[AclCode] = &[
    ACL_ERROR_RT_MEMORY_ALLOCATION,
    ACL_ERROR_RT_DEVICE_OOM,
    ACL_ERROR_BAD_ALLOC,
];

/// Substrings of an `aclGetRecentErrMsg` text that mark an out-of-memory failure (torch_npu's
/// `isCannOOM`).
pub const OOM_MESSAGE_MARKERS: &[&str] = &["EL0004", "Failed to allocate"];

/// The C name of a known ACL error code, e.g. `ACL_ERROR_RT_MEMORY_ALLOCATION` for 207001.
pub fn error_name(code: AclCode) -> Option<&'static str> {
    ERROR_NAMES
        .iter()
        .find(|&&(c, _)| c == code)
        .map(|&(_, name)| name)
}

/// Whether `code` alone means out of memory (see [`OOM_CODES`]).
pub fn is_oom_code(code: AclCode) -> bool {
    OOM_CODES.contains(&code)
}

/// Whether an ACL error message marks out of memory (see [`OOM_MESSAGE_MARKERS`]).
pub fn is_oom_message(message: &str) -> bool {
    OOM_MESSAGE_MARKERS.iter().any(|m| message.contains(m))
}

/// One place the loader tried, with the loader's reason for rejecting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadAttempt {
    /// The path (or bare file name, for the system loader's search) passed to `dlopen`.
    pub path: PathBuf,
    /// The loader's error text (`dlerror`).
    pub error: String,
}

/// Every failure of this crate: loading the library, a missing symbol, or an ACL status code.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AclError {
    /// An ACL function returned a non-zero status.
    Code {
        /// The C function that failed, e.g. `aclrtMalloc`.
        function: &'static str,
        /// The status it returned.
        code: AclCode,
        /// The C name of the code when it is a known one.
        name: Option<&'static str>,
        /// The `aclGetRecentErrMsg` text read right after the failure, when there was one.
        message: Option<String>,
    },
    /// No candidate could be opened; lists every candidate tried, in order, with its error.
    NotFound {
        /// Each path tried and why it failed.
        searched: Vec<LoadAttempt>,
    },
    /// A library was opened but lacks symbols this crate requires.
    MissingSymbols {
        /// The library that was opened.
        library: PathBuf,
        /// Every missing required symbol. For a group of alternatives (one of which suffices,
        /// see [`crate::REQUIRED_ONE_OF`]) all members of the group are listed.
        symbols: Vec<&'static str>,
    },
    /// An optional symbol that this library does not export: the feature is unsupported.
    Unsupported {
        /// The missing symbol, e.g. `aclrtReserveMemAddress`.
        symbol: &'static str,
    },
    /// A function reported success but produced a null handle or pointer.
    NullResult {
        /// The C function that did it.
        function: &'static str,
    },
    /// A function reported success with a value no working library returns (a device count in
    /// the billions: a library that does not match the declared signature).
    ImplausibleResult {
        /// The C function that did it.
        function: &'static str,
        /// The value it reported.
        value: u64,
        /// The largest plausible value.
        limit: u64,
    },
}

impl AclError {
    /// An error for `function` returning `code`, with the recent-error text if any.
    pub fn from_code(function: &'static str, code: AclCode, message: Option<String>) -> Self {
        AclError::Code {
            function,
            code,
            name: error_name(code),
            message,
        }
    }

    /// The ACL status code, for [`AclError::Code`].
    pub fn code(&self) -> Option<AclCode> {
        match self {
            AclError::Code { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The C name of the status code, for a known code.
    pub fn name(&self) -> Option<&'static str> {
        match self {
            AclError::Code { name, .. } => *name,
            _ => None,
        }
    }

    /// The `aclGetRecentErrMsg` text captured with the error.
    pub fn message(&self) -> Option<&str> {
        match self {
            AclError::Code { message, .. } => message.as_deref(),
            _ => None,
        }
    }

    /// Whether this is an out-of-memory failure, as torch_npu decides: a code in [`OOM_CODES`]
    /// (207001, 207018, 200000), or a recent-error text containing `EL0004` or
    /// `Failed to allocate`. Load errors and unsupported features are never OOM.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            AclError::Code { code, message, .. } => {
                is_oom_code(*code) || message.as_deref().is_some_and(is_oom_message)
            }
            _ => false,
        }
    }

    /// Whether this is [`AclError::Unsupported`], or a status saying the feature is unsupported
    /// (207000, 200001, 200006).
    pub fn is_unsupported(&self) -> bool {
        match self {
            AclError::Unsupported { .. } => true,
            AclError::Code { code, .. } => matches!(
                *code,
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT
                    | ACL_ERROR_API_NOT_SUPPORT
                    | ACL_ERROR_FEATURE_UNSUPPORTED
            ),
            _ => false,
        }
    }
}

impl fmt::Display for AclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AclError::Code {
                function,
                code,
                name,
                message,
            } => {
                write!(f, "{function} failed with ACL error {code}")?;
                match name {
                    Some(name) => write!(f, " ({name})")?,
                    None => f.write_str(" (unknown code)")?,
                }
                if let Some(message) = message {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            AclError::NotFound { searched } => {
                write!(
                    f,
                    "{} not found: tried {} location(s)",
                    crate::LIB_NAME,
                    searched.len()
                )?;
                for (i, attempt) in searched.iter().enumerate() {
                    let sep = if i == 0 { ": " } else { "; " };
                    write!(f, "{sep}{} ({})", attempt.path.display(), attempt.error)?;
                }
                write!(
                    f,
                    ". Set {} to the library's path or source the CANN set_env.sh",
                    crate::LIB_ENV_VAR
                )
            }
            AclError::MissingSymbols { library, symbols } => {
                write!(f, "{} lacks required ACL symbols: ", library.display())?;
                write_missing(f, symbols)
            }
            AclError::Unsupported { symbol } => write!(
                f,
                "{symbol} is not exported by the loaded libascendcl: unsupported by this CANN version"
            ),
            AclError::NullResult { function } => {
                write!(f, "{function} reported success but returned a null result")
            }
            AclError::ImplausibleResult {
                function,
                value,
                limit,
            } => write!(
                f,
                "{function} reported {value}, more than the plausible {limit}: the loaded library \
                 does not behave like libascendcl"
            ),
        }
    }
}

impl std::error::Error for AclError {}

/// Writes missing symbols comma-separated, a fully missing group of alternatives as
/// `a or b`.
fn write_missing(f: &mut fmt::Formatter<'_>, symbols: &[&'static str]) -> fmt::Result {
    let mut first = true;
    let mut i = 0;
    while i < symbols.len() {
        let group = crate::REQUIRED_ONE_OF
            .iter()
            .find(|g| symbols[i..].starts_with(g))
            .map_or(&symbols[i..=i], |g| &symbols[i..i + g.len()]);
        if !first {
            f.write_str(", ")?;
        }
        first = false;
        f.write_str(&group.join(" or "))?;
        i += group.len();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cover_every_code_once() {
        // Sorted by code, strictly: no code twice.
        for pair in ERROR_NAMES.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{:?} before {:?}", pair[0], pair[1]);
        }
        assert_eq!(error_name(207_001), Some("ACL_ERROR_RT_MEMORY_ALLOCATION"));
        assert_eq!(error_name(507_006), Some("ACL_ERROR_RT_EVENT_NOT_COMPLETE"));
        assert_eq!(error_name(100_002), Some("ACL_ERROR_REPEAT_INITIALIZE"));
        assert_eq!(error_name(0), Some("ACL_SUCCESS"));
        assert_eq!(error_name(123), None);
        // Each name is its constant's spelling (the table is built with `stringify!`), and
        // every one is a C constant's name.
        assert!(ERROR_NAMES.iter().all(|(_, name)| name.starts_with("ACL_")));
    }

    #[test]
    fn code_error_display_and_accessors() {
        let e = AclError::from_code("aclrtMalloc", 207_001, Some("EL0004: boom".into()));
        assert_eq!(e.code(), Some(207_001));
        assert_eq!(e.name(), Some("ACL_ERROR_RT_MEMORY_ALLOCATION"));
        assert_eq!(e.message(), Some("EL0004: boom"));
        assert_eq!(
            e.to_string(),
            "aclrtMalloc failed with ACL error 207001 (ACL_ERROR_RT_MEMORY_ALLOCATION): EL0004: boom"
        );
        let e = AclError::from_code("aclrtFree", 42, None);
        assert_eq!(e.name(), None);
        assert_eq!(
            e.to_string(),
            "aclrtFree failed with ACL error 42 (unknown code)"
        );
    }

    #[test]
    fn oom_by_code() {
        for code in [207_001, 207_018, 200_000] {
            assert!(AclError::from_code("aclrtMalloc", code, None).is_out_of_memory());
        }
        for code in [207_005, 207_000, 100_000, 507_006, 507_899, 0, -1] {
            assert!(
                !AclError::from_code("aclrtMalloc", code, None).is_out_of_memory(),
                "{code}"
            );
        }
    }

    #[test]
    fn oom_by_message() {
        let real = "EL0004: [PID: 1] 2025-01-01 Failed to allocate memory.\n        \
                    Possible Cause: Available memory is insufficient.";
        assert!(
            AclError::from_code("aclrtMallocAlign32", 507_899, Some(real.into()))
                .is_out_of_memory()
        );
        assert!(AclError::from_code("x", 1, Some("code EL0004".into())).is_out_of_memory());
        assert!(
            AclError::from_code("x", 1, Some("rt: Failed to allocate 2MB".into()))
                .is_out_of_memory()
        );
        // Case matters, as in torch_npu's substring test.
        assert!(!AclError::from_code("x", 1, Some("failed to allocate".into())).is_out_of_memory());
        assert!(!AclError::from_code("x", 1, Some("EE1001: bad param".into())).is_out_of_memory());
        assert!(is_oom_message("xx EL0004"));
        assert!(!is_oom_message(""));
    }

    #[test]
    fn non_code_errors_are_not_oom() {
        let errs = [
            AclError::NotFound { searched: vec![] },
            AclError::MissingSymbols {
                library: "/x".into(),
                symbols: vec!["aclInit"],
            },
            AclError::Unsupported {
                symbol: "aclrtMapMem",
            },
            AclError::NullResult {
                function: "aclrtMalloc",
            },
            AclError::ImplausibleResult {
                function: "aclrtGetDeviceCount",
                value: 1_094_795_585,
                limit: 1024,
            },
        ];
        for e in errs {
            assert!(!e.is_out_of_memory(), "{e}");
            assert_eq!(e.code(), None);
            assert_eq!(e.name(), None);
            assert_eq!(e.message(), None);
        }
    }

    #[test]
    fn unsupported_classification() {
        assert!(
            AclError::Unsupported {
                symbol: "aclrtMapMem"
            }
            .is_unsupported()
        );
        assert!(AclError::from_code("aclrtReserveMemAddress", 207_000, None).is_unsupported());
        assert!(AclError::from_code("f", 200_001, None).is_unsupported());
        assert!(!AclError::from_code("f", 207_001, None).is_unsupported());
        assert_eq!(
            AclError::Unsupported {
                symbol: "aclrtMapMem"
            }
            .to_string(),
            "aclrtMapMem is not exported by the loaded libascendcl: unsupported by this CANN version"
        );
    }

    #[test]
    fn not_found_display_lists_every_path() {
        let e = AclError::NotFound {
            searched: vec![
                LoadAttempt {
                    path: "/a/libascendcl.so".into(),
                    error: "no such file".into(),
                },
                LoadAttempt {
                    path: "libascendcl.so".into(),
                    error: "cannot open shared object file".into(),
                },
            ],
        };
        let s = e.to_string();
        assert!(
            s.starts_with("libascendcl.so not found: tried 2 location(s): "),
            "{s}"
        );
        assert!(
            s.contains(
                "/a/libascendcl.so (no such file); libascendcl.so (cannot open shared object file)"
            ),
            "{s}"
        );
        assert!(s.contains("NPU_ALLOC_ACL_LIB"), "{s}");
    }

    #[test]
    fn missing_symbols_display() {
        let e = AclError::MissingSymbols {
            library: "/usr/lib/libc.so.6".into(),
            symbols: vec!["aclInit", "aclrtMalloc"],
        };
        assert_eq!(
            e.to_string(),
            "/usr/lib/libc.so.6 lacks required ACL symbols: aclInit, aclrtMalloc"
        );
        let e = AclError::MissingSymbols {
            library: "/x.so".into(),
            symbols: vec![
                "aclrtFree",
                "aclrtCreateEventWithFlag",
                "aclrtCreateEvent",
                "aclrtQueryEventStatus",
                "aclrtQueryEvent",
            ],
        };
        assert_eq!(
            e.to_string(),
            "/x.so lacks required ACL symbols: aclrtFree, \
             aclrtCreateEventWithFlag or aclrtCreateEvent, \
             aclrtQueryEventStatus or aclrtQueryEvent"
        );
        let e: Box<dyn std::error::Error> = Box::new(e);
        assert!(e.to_string().contains("aclrtFree"));
    }
}
