//! Extreme values that a valid configuration string or a trace can carry: the allocator refuses
//! or accepts them with torch's meaning, and never overflows.

mod common;

use alloc_core::{AllocConf, AllocError, Allocator, DeviceFacts};
use alloc_sim::SimDevice;
use common::*;

#[test]
fn a_pad_that_overflows_the_request_refuses_it_as_too_large() {
    let facts = DeviceFacts {
        pad: u64::MAX,
        ..DeviceFacts::cuda_parity(0)
    };
    let mut a = Allocator::new(SimDevice::new(GIB), &AllocConf::default(), facts);
    assert_eq!(a.malloc(1, S0), Err(AllocError::TooLarge { size: 1 }));
    assert_eq!(a.malloc(0, S0), Ok(0), "a zero-size request is still null");
    // A padded size of 2^63 is refused; below it the request is rounded (here up to exactly
    // 2^63) and tried, but a 2^63-byte segment is past the largest reserve an i64 statistic
    // can count: out of memory without a device call.
    let facts = DeviceFacts {
        pad: (1 << 63) - 512,
        ..facts
    };
    let mut a = Allocator::new(SimDevice::new(GIB), &AllocConf::default(), facts);
    assert_eq!(a.malloc(512, S0), Err(AllocError::TooLarge { size: 512 }));
    assert!(matches!(a.malloc(1, S0), Err(AllocError::OutOfMemory(_))));
    assert_eq!(a.stats().num_ooms, 1);
    assert_eq!(a.device().malloc_calls(), 0);
    check_consistency(&a);
}

#[test]
fn an_unbounded_non_split_rounding_reuses_any_oversize_block() {
    // The largest value the parser accepts: 2^44 - 1 MiB, just below 2^64 bytes.
    let mut a = cuda(
        GIB,
        &conf("max_split_size_mb:21,max_non_split_rounding_mb:17592186044415"),
    );
    let x = a.malloc(100 * MIB, S0).unwrap();
    a.free(x).unwrap();
    assert_eq!(
        a.malloc(30 * MIB, S0),
        Ok(x),
        "any cached oversize block fits"
    );
    assert_eq!(a.device().malloc_calls(), 1);
    check_consistency(&a);
}
