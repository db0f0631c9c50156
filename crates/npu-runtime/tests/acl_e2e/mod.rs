//! What the end-to-end tests over the fake `libascendcl` share: opening a device through
//! `acl-sys`'s real loading path, the fake's address layout, and reading ACL errors.
#![allow(dead_code)]

use acl_sys::AclError;
use alloc_core::VmmError;
use npu_runtime::{AclDevice, AclPlatform};
use testkit::fake_acl::FakeAcl;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
/// The fake's first reserved range on device 0, and the stride between devices.
pub const VA0: u64 = 0x8000_0000_0000;
pub const VA_STRIDE: u64 = 1 << 40;

/// The fake loaded through acl-sys, and device `index` opened on it.
pub fn open(fake: &FakeAcl, index: u32) -> (AclPlatform, AclDevice) {
    // SAFETY: the fake libascendcl built from this workspace.
    let platform =
        unsafe { AclPlatform::load(fake.path()) }.expect("load the fake through acl-sys");
    let device = platform.open(index).unwrap();
    (platform, device)
}

/// The ACL error of a [`VmmError::Other`].
#[track_caller]
pub fn other(e: VmmError<AclError>) -> AclError {
    match e {
        VmmError::Other(e) => e,
        e => panic!("expected VmmError::Other, got {e:?}"),
    }
}

/// The status code of a failed `acl-sys` call.
#[track_caller]
pub fn code<T: std::fmt::Debug>(result: Result<T, AclError>) -> i32 {
    let e = result.unwrap_err();
    e.code().unwrap_or_else(|| panic!("no status code: {e:?}"))
}

/// The code the tests inject with `fail_next`.
pub const INJECTED: i32 = 507_899;

/// `e` is the injected failure of ACL function `function`: its code, and the message that
/// names the function, the code's C name and the fake's own text.
#[track_caller]
pub fn assert_injected(e: VmmError<AclError>, function: &str) {
    let e = other(e);
    assert_eq!(e.code(), Some(INJECTED));
    assert_eq!(
        e.to_string(),
        format!(
            "{function} failed with ACL error {INJECTED} (ACL_ERROR_RT_DRV_INTERNAL_ERROR): \
             fake_acl: injected error {INJECTED} in {function}"
        )
    );
}
