//! Finding and opening `libascendcl.so` at run time (it is never linked at build time).
//!
//! The search order is a pure function of an environment lookup, [`candidate_paths`], so it can
//! be tested without touching the process environment; the search also takes a copy the
//! process has already loaded, before any install directory ([`Lib::search_with_env`]). Loading tries the candidates in order
//! and stops at the first one `dlopen` accepts: that library is then checked for the required
//! symbols ([`crate::REQUIRED_SYMBOLS`]) and is either the result or an
//! [`AclError::MissingSymbols`]; it never falls through to a later candidate. When no candidate
//! opens, [`AclError::NotFound`] lists every one tried with the loader's error.
//!
//! Trust: loading runs the library's initialisers and calls its functions through the
//! signatures of CANN's `acl_rt.h` (docs/acl.md); a library that is not a `libascendcl` (or a
//! faithful stand-in such as testkit's fake) can do anything. So, as in `libloading` and ash:
//! - loading a path the caller chooses ([`Lib::load`], [`Lib::load_first`],
//!   [`Lib::search_with_env`]) is an `unsafe fn`, the caller's promise;
//! - [`Lib::search`] and [`Lib::global`] stay safe: they try only the places the process's
//!   operator configures for the installed driver (`NPU_ALLOC_ACL_LIB`, the CANN install
//!   variables and locations, the system loader's path), the same trust the dynamic loader
//!   gives `LD_LIBRARY_PATH` when a program links `libascendcl` directly. cudarc and wgpu treat
//!   the installed driver the same way.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

use crate::error::{AclError, LoadAttempt};
use crate::symbols::{Lib, Result};

/// File name of the ACL runtime library.
pub const LIB_NAME: &str = "libascendcl.so";

/// Environment variable naming the library to load (a file, or a directory holding
/// `libascendcl.so`); it is tried right after a path given by the caller.
pub const LIB_ENV_VAR: &str = "NPU_ALLOC_ACL_LIB";

/// Environment variables naming a CANN install directory (set by CANN's `set_env.sh`), in the
/// order they are tried.
pub const HOME_ENV_VARS: &[&str] = &["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"];

/// Library directories under a CANN install directory, in the order they are tried.
const HOME_LIB_DIRS: &[&str] = &["lib64", "runtime/lib64"];

/// Fixed install locations (directories), tried after the environment's. `$HOME/Ascend/...`
/// is inserted after the toolkit ones.
const SYSTEM_TOOLKIT_DIRS: &[&str] = &[
    "/usr/local/Ascend/ascend-toolkit/latest/lib64",
    "/usr/local/Ascend/ascend-toolkit/latest/runtime/lib64",
    "/usr/local/Ascend/ascend-toolkit/latest/acllib/lib64",
];

/// Fixed install locations tried after `$HOME/Ascend/ascend-toolkit/latest/lib64`.
const SYSTEM_OTHER_DIRS: &[&str] = &[
    "/usr/local/Ascend/nnae/latest/lib64",
    "/usr/local/Ascend/cann/lib64",
    "/usr/local/Ascend/latest/lib64",
];

/// Every place to try, in order, given `explicit` (a path from the caller) and `env` (an
/// environment lookup; empty values count as unset):
///
/// 1. `explicit`;
/// 2. `$NPU_ALLOC_ACL_LIB`;
/// 3. `lib64/` then `runtime/lib64/` then `<arch>-linux/lib64/` under `$ASCEND_HOME_PATH` and
///    `$ASCEND_TOOLKIT_HOME` (all `lib64` first);
/// 4. `/usr/local/Ascend/ascend-toolkit/latest/{lib64,runtime/lib64,acllib/lib64}`;
/// 5. `$HOME/Ascend/ascend-toolkit/latest/lib64`;
/// 6. `/usr/local/Ascend/nnae/latest/lib64`, `/usr/local/Ascend/cann/lib64`,
///    `/usr/local/Ascend/latest/lib64`;
/// 7. the bare name `libascendcl.so`, for the system loader's search (`LD_LIBRARY_PATH`,
///    `ldconfig`).
///
/// Directories are joined with `libascendcl.so`; duplicates keep their first position.
pub fn candidate_paths<F>(explicit: Option<&Path>, env: F) -> Vec<PathBuf>
where
    F: Fn(&str) -> Option<OsString>,
{
    let var = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut out: Vec<PathBuf> = Vec::new();
    let mut push = |p: PathBuf| {
        if !out.contains(&p) {
            out.push(p);
        }
    };

    if let Some(p) = explicit {
        push(p.to_path_buf());
    }
    if let Some(p) = var(LIB_ENV_VAR) {
        push(p);
    }
    let homes: Vec<PathBuf> = HOME_ENV_VARS.iter().filter_map(|v| var(v)).collect();
    let arch_dir = format!("{}-linux/lib64", std::env::consts::ARCH);
    for dir in HOME_LIB_DIRS.iter().copied().chain([arch_dir.as_str()]) {
        for home in &homes {
            push(home.join(dir).join(LIB_NAME));
        }
    }
    for dir in SYSTEM_TOOLKIT_DIRS {
        push(Path::new(dir).join(LIB_NAME));
    }
    if let Some(home) = var("HOME") {
        push(
            home.join("Ascend/ascend-toolkit/latest/lib64")
                .join(LIB_NAME),
        );
    }
    for dir in SYSTEM_OTHER_DIRS {
        push(Path::new(dir).join(LIB_NAME));
    }
    push(PathBuf::from(LIB_NAME));
    out
}

/// Opens one candidate: a directory stands for the `libascendcl.so` inside it.
///
/// # Safety
/// `candidate` must be a `libascendcl` (or a faithful stand-in): its initialisers run.
unsafe fn open(candidate: &Path) -> core::result::Result<(Library, PathBuf), LoadAttempt> {
    let path = if candidate.is_dir() {
        candidate.join(LIB_NAME)
    } else {
        candidate.to_path_buf()
    };
    // SAFETY: loading runs the library's initialisers; the caller vouches for the library.
    match unsafe { Library::new(&path) } {
        Ok(library) => Ok((library, path)),
        Err(e) => Err(LoadAttempt {
            path,
            error: e.to_string(),
        }),
    }
}

/// Opens the first of `candidates` that opens, noting each failure in `searched`; `None` when
/// none opened.
///
/// # Safety
/// Every candidate must be a `libascendcl` (or a faithful stand-in), as for [`Lib::load`].
unsafe fn try_each<I>(candidates: I, searched: &mut Vec<LoadAttempt>) -> Option<Result<Lib>>
where
    I: IntoIterator,
    I::Item: AsRef<Path>,
{
    for candidate in candidates {
        // SAFETY: the caller vouches for every candidate.
        match unsafe { open(candidate.as_ref()) } {
            // SAFETY: the opened library is a libascendcl by the caller's promise, so its
            // symbols have the signatures the table declares.
            Ok((library, path)) => return Some(unsafe { Lib::from_library(library, path) }),
            Err(attempt) => searched.push(attempt),
        }
    }
    None
}

/// What a failed probe for an already loaded library is listed as in [`AclError::NotFound`].
pub(crate) const NOT_LOADED: &str = "not loaded by this process";

/// A new handle to `name` if the process has already loaded it (`dlopen` with `RTLD_NOLOAD`):
/// nothing is loaded and no initialiser runs. glibc matches the names a library was opened
/// under (a `DT_NEEDED` entry's, as when torch_npu links `libascendcl.so`) and its soname; a
/// copy opened by a full path, without that soname, is not found.
fn open_loaded(name: &str) -> core::result::Result<Library, LoadAttempt> {
    let attempt = |error: String| LoadAttempt {
        path: PathBuf::from(format!("{name} (already loaded)")),
        error,
    };
    // SAFETY: with RTLD_NOLOAD, dlopen only returns a new reference to a library that is
    // already loaded, whose initialisers have run: no code runs.
    match unsafe {
        libloading::os::unix::Library::open(
            Some(name),
            libloading::os::unix::RTLD_NOW | libc::RTLD_NOLOAD,
        )
    } {
        Ok(library) => Ok(library.into()),
        // glibc's dlerror for a library that is not loaded is empty or the file's own error.
        Err(_) => Err(attempt(NOT_LOADED.to_owned())),
    }
}

impl Lib {
    /// Loads the library at exactly `path` (a file, or a directory holding `libascendcl.so`).
    /// A path without a `/` goes through the system loader's search.
    ///
    /// Errors: [`AclError::NotFound`] with this one attempt when it cannot be opened,
    /// [`AclError::MissingSymbols`] when it opens but lacks required symbols.
    ///
    /// ```compile_fail
    /// // Loading a caller-chosen library runs its code: not without `unsafe`.
    /// let lib = acl_sys::Lib::load("/tmp/libascendcl.so");
    /// ```
    ///
    /// # Safety
    /// `path` must be a `libascendcl` (or a faithful stand-in): loading runs its initialisers,
    /// and its exported functions are called through the signatures of CANN's `acl_rt.h`.
    pub unsafe fn load(path: impl AsRef<Path>) -> Result<Lib> {
        // SAFETY: forwarded to the caller.
        unsafe { Lib::load_first([path.as_ref()]) }
    }

    /// Loads the first of `candidates` that opens; see the module doc for the rules.
    ///
    /// # Safety
    /// Every candidate must be a `libascendcl` (or a faithful stand-in), as for [`Lib::load`].
    pub unsafe fn load_first<I>(candidates: I) -> Result<Lib>
    where
        I: IntoIterator,
        I::Item: AsRef<Path>,
    {
        let mut searched = Vec::new();
        // SAFETY: forwarded to the caller.
        match unsafe { try_each(candidates, &mut searched) } {
            Some(found) => found,
            None => Err(AclError::NotFound { searched }),
        }
    }

    /// Searches [`candidate_paths`] of the process environment: the installed driver, where the
    /// operator put it (see the module doc for why this is safe).
    pub fn search() -> Result<Lib> {
        // SAFETY: the candidates are the operator's configuration of the installed driver
        // (`NPU_ALLOC_ACL_LIB`, the CANN install variables and locations, the system loader),
        // trusted as the dynamic loader trusts `LD_LIBRARY_PATH` (module doc).
        unsafe { Lib::search_with_env(None, |name| std::env::var_os(name)) }
    }

    /// Searches [`candidate_paths`] with `explicit` first and `env` as the environment. Right
    /// after the paths the caller and the operator name (`explicit`, `$NPU_ALLOC_ACL_LIB`), a
    /// `libascendcl.so` the process has already loaded (torch_npu's, found through
    /// `LD_LIBRARY_PATH`) is taken before any install directory: a second copy from another
    /// CANN install would be a second ACL runtime in the process, with contexts of its own.
    ///
    /// # Safety
    /// Every path `explicit` and `env` lead to must be a `libascendcl` (or a faithful stand-in),
    /// as for [`Lib::load`].
    pub unsafe fn search_with_env<F>(explicit: Option<&Path>, env: F) -> Result<Lib>
    where
        F: Fn(&str) -> Option<OsString>,
    {
        // The paths named (the first one or two candidates, one if both name the same path).
        let variable = env(LIB_ENV_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let is_named = |p: &PathBuf| explicit == Some(p.as_path()) || variable.as_ref() == Some(p);
        let candidates = candidate_paths(explicit, env);
        let chosen = candidates
            .iter()
            .take(2)
            .take_while(|p| is_named(p))
            .count();
        let (named, searched_for) = candidates.split_at(chosen);
        let mut searched = Vec::new();
        // SAFETY: forwarded to the caller.
        if let Some(found) = unsafe { try_each(named, &mut searched) } {
            return found;
        }
        match open_loaded(LIB_NAME) {
            // SAFETY: a library loaded under the runtime's file name is the process's
            // libascendcl, trusted as the system loader's search is (module doc).
            Ok(library) => return unsafe { Lib::from_library(library, PathBuf::from(LIB_NAME)) },
            Err(attempt) => searched.push(attempt),
        }
        // SAFETY: forwarded to the caller.
        match unsafe { try_each(searched_for, &mut searched) } {
            Some(found) => found,
            None => Err(AclError::NotFound { searched }),
        }
    }

    /// The process-wide library, searched for once ([`Lib::search`] with no explicit path) and
    /// kept for the life of the process; a failed search is remembered and returned again.
    pub fn global() -> Result<&'static Lib> {
        static GLOBAL: OnceLock<Result<Lib>> = OnceLock::new();
        GLOBAL
            .get_or_init(Lib::search)
            .as_ref()
            .map_err(Clone::clone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OPTIONAL_SYMBOLS, REQUIRED_ONE_OF, REQUIRED_SYMBOLS};
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|&(k, v)| (k.to_owned(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn strs(paths: &[PathBuf]) -> Vec<String> {
        paths.iter().map(|p| p.display().to_string()).collect()
    }

    #[test]
    fn candidate_order_with_full_env() {
        let env = env_of(&[
            ("NPU_ALLOC_ACL_LIB", "/opt/fake/libascendcl.so"),
            ("ASCEND_HOME_PATH", "/usr/local/Ascend/cann-9.0.0"),
            ("ASCEND_TOOLKIT_HOME", "/opt/tk"),
            ("HOME", "/home/u"),
        ]);
        let got = strs(&candidate_paths(Some(Path::new("/explicit/lib.so")), env));
        let arch = std::env::consts::ARCH;
        let want = vec![
            "/explicit/lib.so".to_owned(),
            "/opt/fake/libascendcl.so".to_owned(),
            "/usr/local/Ascend/cann-9.0.0/lib64/libascendcl.so".to_owned(),
            "/opt/tk/lib64/libascendcl.so".to_owned(),
            "/usr/local/Ascend/cann-9.0.0/runtime/lib64/libascendcl.so".to_owned(),
            "/opt/tk/runtime/lib64/libascendcl.so".to_owned(),
            format!("/usr/local/Ascend/cann-9.0.0/{arch}-linux/lib64/libascendcl.so"),
            format!("/opt/tk/{arch}-linux/lib64/libascendcl.so"),
            "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so".to_owned(),
            "/usr/local/Ascend/ascend-toolkit/latest/runtime/lib64/libascendcl.so".to_owned(),
            "/usr/local/Ascend/ascend-toolkit/latest/acllib/lib64/libascendcl.so".to_owned(),
            "/home/u/Ascend/ascend-toolkit/latest/lib64/libascendcl.so".to_owned(),
            "/usr/local/Ascend/nnae/latest/lib64/libascendcl.so".to_owned(),
            "/usr/local/Ascend/cann/lib64/libascendcl.so".to_owned(),
            "/usr/local/Ascend/latest/lib64/libascendcl.so".to_owned(),
            "libascendcl.so".to_owned(),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn candidate_order_with_empty_env() {
        let got = strs(&candidate_paths(None, |_| None));
        assert_eq!(
            got,
            vec![
                "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so",
                "/usr/local/Ascend/ascend-toolkit/latest/runtime/lib64/libascendcl.so",
                "/usr/local/Ascend/ascend-toolkit/latest/acllib/lib64/libascendcl.so",
                "/usr/local/Ascend/nnae/latest/lib64/libascendcl.so",
                "/usr/local/Ascend/cann/lib64/libascendcl.so",
                "/usr/local/Ascend/latest/lib64/libascendcl.so",
                "libascendcl.so",
            ]
        );
    }

    #[test]
    fn candidates_skip_empty_values_and_duplicates() {
        // set_env.sh sets both homes to the same directory; an empty override is unset.
        let env = env_of(&[
            ("NPU_ALLOC_ACL_LIB", ""),
            (
                "ASCEND_HOME_PATH",
                "/usr/local/Ascend/ascend-toolkit/latest",
            ),
            (
                "ASCEND_TOOLKIT_HOME",
                "/usr/local/Ascend/ascend-toolkit/latest",
            ),
            ("HOME", ""),
        ]);
        let got = strs(&candidate_paths(None, env));
        let arch = std::env::consts::ARCH;
        assert_eq!(
            got,
            vec![
                "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so".to_owned(),
                "/usr/local/Ascend/ascend-toolkit/latest/runtime/lib64/libascendcl.so".to_owned(),
                format!(
                    "/usr/local/Ascend/ascend-toolkit/latest/{arch}-linux/lib64/libascendcl.so"
                ),
                "/usr/local/Ascend/ascend-toolkit/latest/acllib/lib64/libascendcl.so".to_owned(),
                "/usr/local/Ascend/nnae/latest/lib64/libascendcl.so".to_owned(),
                "/usr/local/Ascend/cann/lib64/libascendcl.so".to_owned(),
                "/usr/local/Ascend/latest/lib64/libascendcl.so".to_owned(),
                "libascendcl.so".to_owned(),
            ]
        );
    }

    #[test]
    fn env_override_comes_before_homes_but_after_explicit() {
        let env = env_of(&[("NPU_ALLOC_ACL_LIB", "/e.so"), ("ASCEND_HOME_PATH", "/h")]);
        let got = candidate_paths(Some(Path::new("/x.so")), &env);
        assert_eq!(got[0], Path::new("/x.so"));
        assert_eq!(got[1], Path::new("/e.so"));
        assert_eq!(got[2], Path::new("/h/lib64/libascendcl.so"));
        let got = candidate_paths(None, &env);
        assert_eq!(got[0], Path::new("/e.so"));
        assert_eq!(got.last().unwrap(), Path::new(LIB_NAME));
    }

    #[test]
    fn not_found_lists_every_path_tried() {
        let dir = std::env::temp_dir().join(format!("acl-sys-nf-{}", std::process::id()));
        let paths = [
            PathBuf::from("/nonexistent-acl-sys/a/libascendcl.so"),
            PathBuf::from("/nonexistent-acl-sys/b/libascendcl.so"),
            PathBuf::from("libascendcl-acl-sys-test-does-not-exist.so"),
            dir.clone(),
        ];
        std::fs::create_dir_all(&dir).unwrap();
        // SAFETY: none of the candidates exists or holds a library.
        let err = unsafe { Lib::load_first(&paths) }.unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        let AclError::NotFound { searched } = &err else {
            panic!("expected NotFound, got {err:?}");
        };
        assert_eq!(searched.len(), 4);
        for (attempt, path) in searched.iter().zip(&paths[..3]) {
            assert_eq!(&attempt.path, path);
            assert!(!attempt.error.is_empty());
        }
        // A directory stands for the libascendcl.so inside it.
        assert_eq!(searched[3].path, dir.join(LIB_NAME));
        let text = err.to_string();
        for attempt in searched {
            assert!(text.contains(&attempt.path.display().to_string()), "{text}");
            assert!(text.contains(&attempt.error), "{text}");
        }
        assert!(text.contains("tried 4 location(s)"), "{text}");
        assert!(!err.is_out_of_memory());
    }

    #[test]
    fn load_missing_file_is_not_found_with_one_attempt() {
        // SAFETY: the path does not exist.
        let err = unsafe { Lib::load("/nonexistent-acl-sys/libascendcl.so") }.unwrap_err();
        match err {
            AclError::NotFound { searched } => {
                assert_eq!(searched.len(), 1);
                assert_eq!(
                    searched[0].path,
                    Path::new("/nonexistent-acl-sys/libascendcl.so")
                );
                assert!(searched[0].error.contains("libascendcl.so"), "{searched:?}");
            }
            other => panic!("expected NotFound, got {other:?}"),
        }
    }

    fn all_required_names() -> Vec<&'static str> {
        let mut v: Vec<&'static str> = REQUIRED_SYMBOLS.to_vec();
        for group in REQUIRED_ONE_OF {
            v.extend_from_slice(group);
        }
        v
    }

    #[test]
    fn library_without_acl_symbols_is_missing_symbols() {
        for name in ["libc.so.6", "libm.so.6"] {
            // SAFETY: the C library's initialisers are already run in this process; no ACL
            // symbol is found, so nothing is called through a wrong signature.
            let err = unsafe { Lib::load(name) }.unwrap_err();
            match &err {
                AclError::MissingSymbols { library, symbols } => {
                    assert_eq!(library, Path::new(name));
                    assert_eq!(symbols, &all_required_names());
                }
                other => panic!("expected MissingSymbols for {name}, got {other:?}"),
            }
            let text = err.to_string();
            assert!(text.starts_with(name), "{text}");
            for s in REQUIRED_SYMBOLS {
                assert!(text.contains(s), "{text}");
            }
            assert!(
                text.contains("aclrtCreateEventWithFlag or aclrtCreateEvent"),
                "{text}"
            );
            // Optional symbols are never reported as missing.
            for s in OPTIONAL_SYMBOLS {
                if !REQUIRED_ONE_OF.iter().any(|g| g.contains(s)) {
                    assert!(!text.contains(s), "{s} in {text}");
                }
            }
        }
    }

    #[test]
    fn search_stops_at_first_library_that_opens() {
        // The environment override names libm: it opens, so the search ends there with
        // MissingSymbols rather than falling through to later candidates.
        let env = env_of(&[("NPU_ALLOC_ACL_LIB", "libm.so.6")]);
        // SAFETY: the explicit path does not exist and libm has no ACL symbol to call.
        let err =
            unsafe { Lib::search_with_env(Some(Path::new("/nonexistent-acl-sys/x.so")), env) }
                .unwrap_err();
        match err {
            AclError::MissingSymbols { library, .. } => assert_eq!(library, Path::new("libm.so.6")),
            other => panic!("expected MissingSymbols, got {other:?}"),
        }
    }

    #[test]
    fn explicit_path_wins_over_env() {
        let env = env_of(&[("NPU_ALLOC_ACL_LIB", "libm.so.6")]);
        // SAFETY: libc and libm have no ACL symbol to call.
        let err = unsafe { Lib::search_with_env(Some(Path::new("libc.so.6")), env) }.unwrap_err();
        match err {
            AclError::MissingSymbols { library, .. } => assert_eq!(library, Path::new("libc.so.6")),
            other => panic!("expected MissingSymbols, got {other:?}"),
        }
    }

    #[test]
    fn search_without_acl_installed_lists_all_candidates() {
        // On a machine with a real CANN install the search may succeed; only check the error.
        let env = env_of(&[("NPU_ALLOC_ACL_LIB", "/nonexistent-acl-sys/override.so")]);
        let expected = candidate_paths(None, &env);
        // SAFETY: the override does not exist; the rest are the installed driver's locations,
        // trusted as `Lib::search` trusts them.
        match unsafe { Lib::search_with_env(None, &env) } {
            Err(AclError::NotFound { searched }) => {
                // The override, then the probe for a copy already loaded, then the rest.
                let probe = searched[1].clone();
                assert_eq!(probe.path, Path::new("libascendcl.so (already loaded)"));
                assert_eq!(probe.error, NOT_LOADED);
                let tried: Vec<_> = searched.into_iter().map(|a| a.path).collect();
                let mut want = expected.clone();
                want.insert(1, probe.path);
                assert_eq!(tried, want);
            }
            Err(AclError::MissingSymbols { .. }) | Ok(_) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn the_probe_comes_right_after_the_named_paths_even_when_they_are_one() {
        let missing = "/nonexistent-acl-sys/same.so";
        let env = env_of(&[
            ("NPU_ALLOC_ACL_LIB", missing),
            ("ASCEND_HOME_PATH", "/nonexistent-acl-sys/home"),
        ]);
        // SAFETY: none of the paths exists; the rest are the installed driver's locations.
        match unsafe { Lib::search_with_env(Some(Path::new(missing)), &env) } {
            Err(AclError::NotFound { searched }) => {
                let tried: Vec<_> = searched
                    .iter()
                    .map(|a| a.path.display().to_string())
                    .collect();
                assert_eq!(
                    tried[..3],
                    [
                        missing.to_owned(),
                        "libascendcl.so (already loaded)".to_owned(),
                        "/nonexistent-acl-sys/home/lib64/libascendcl.so".to_owned(),
                    ]
                );
            }
            Err(AclError::MissingSymbols { .. }) | Ok(_) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn the_probe_finds_only_a_library_the_process_has_loaded() {
        // The test binary links the C library (`libc.so.6`); nothing here has loaded this one.
        let loaded = open_loaded("libc.so.6").expect("libc is loaded");
        drop(loaded);
        let err = open_loaded("libacl-sys-test-never-loaded.so").unwrap_err();
        assert_eq!(
            err.path,
            Path::new("libacl-sys-test-never-loaded.so (already loaded)")
        );
        assert_eq!(err.error, NOT_LOADED);
    }
}
