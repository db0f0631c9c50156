//! `libascendcl.so`, the Ascend ACL runtime, loaded at run time with `libloading`.
//!
//! Nothing here links against ACL at build time, so the crate builds and tests on any machine.
//! At run time:
//! - [`Lib::load`] opens one given path (the way tests load testkit's fake library);
//!   [`Lib::search`] walks [`candidate_paths`]: the caller's path, `$NPU_ALLOC_ACL_LIB`, the CANN
//!   install locations, then the system loader; [`Lib::global`] does that once per process.
//! - A missing library is [`AclError::NotFound`] listing every path tried; a library without
//!   the [required symbols](REQUIRED_SYMBOLS) is [`AclError::MissingSymbols`] naming all of
//!   them; a missing [optional symbol](OPTIONAL_SYMBOLS) makes only its wrapper return
//!   [`AclError::Unsupported`]. Nothing panics.
//! - [`Lib`]'s methods are safe wrappers returning `Result<_, AclError>`; a failed call carries
//!   the numeric code, its C name and the `aclGetRecentErrMsg` text, and
//!   [`AclError::is_out_of_memory`] classifies it as torch_npu does.
//!
//! Modules: `loader` (search and `dlopen`), `symbols` (the function table, handles and
//! wrappers), `types` (the C enums, flags and `aclrtPhysicalMemProp`), `error` (codes and
//! [`AclError`]). No policy and no caching live here.
#![warn(unreachable_pub)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod error;
mod loader;
mod symbols;
mod types;

pub use error::*;
pub use loader::{HOME_ENV_VARS, LIB_ENV_VAR, LIB_NAME, candidate_paths};
pub use symbols::{
    Event, HOST_COPY_SYMBOLS, HostMem, InitStatus, Lib, MAX_DEVICES, OPTIONAL_SYMBOLS, PhysicalMem,
    REQUIRED_ONE_OF, REQUIRED_SYMBOLS, Result, Stream, VMM_SYMBOLS,
};
pub use types::*;
