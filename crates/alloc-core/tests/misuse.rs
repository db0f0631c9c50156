//! Misuse through the API: each is refused with a typed error, changes no stat and makes no
//! device call (double free, interior and foreign pointers are also in `policy.rs`).

mod common;

use alloc_core::{AllocConf, Allocator, FractionError, FreeError};
use alloc_sim::{DeviceCall, FaultError, SimError, TestDevice};
use common::*;

/// Runs `misuse` and checks that it changed no stat and called nothing on the device.
fn changes_nothing<T>(
    a: &mut Allocator<TestDevice>,
    misuse: impl FnOnce(&mut Allocator<TestDevice>) -> T,
) -> T {
    let stats = a.stats();
    let calls = DeviceCall::ALL.map(|c| a.device().calls(c));
    let snapshot = a.snapshot();
    let result = misuse(a);
    assert_eq!(a.stats(), stats);
    assert_eq!(DeviceCall::ALL.map(|c| a.device().calls(c)), calls);
    assert_eq!(a.snapshot(), snapshot);
    check_consistency(a);
    result
}

#[test]
fn free_of_a_block_whose_free_is_pending_is_a_double_free() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(4096, S0).unwrap();
    a.record_stream(x, S1).unwrap();
    a.free(x).unwrap();
    assert_eq!(a.pending_events(), 1);
    let err = changes_nothing(&mut a, |a| a.free(x));
    assert_eq!(err, Err(FreeError::NotAllocated { addr: x }));
    assert_eq!(
        err.unwrap_err().to_string(),
        format!("invalid device pointer: {x:#x} is not a live allocation (double free?)")
    );
    let err = changes_nothing(&mut a, |a| a.record_stream(x, S2));
    assert_eq!(err, Err(FreeError::NotAllocated { addr: x }));
}

#[test]
fn record_stream_of_freed_interior_or_foreign_addresses() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(4096, S0).unwrap();
    let y = a.malloc(4096, S0).unwrap();
    a.free(x).unwrap();
    assert_eq!(
        changes_nothing(&mut a, |a| a.record_stream(x, S1)),
        Err(FreeError::NotAllocated { addr: x })
    );
    assert_eq!(
        changes_nothing(&mut a, |a| a.record_stream(y + 1, S1)),
        Err(FreeError::NotAllocated { addr: y + 1 })
    );
    assert_eq!(
        changes_nothing(&mut a, |a| a.record_stream(0xdead_0000, S1)),
        Err(FreeError::ForeignPointer { addr: 0xdead_0000 })
    );
    assert_eq!(
        FreeError::<FaultError<SimError>>::ForeignPointer { addr: 0xdead_0000 }.to_string(),
        "invalid device pointer: 0xdead0000"
    );
    // The refused record added no stream use: freeing y needs no event.
    a.free(y).unwrap();
    assert_eq!(a.pending_events(), 0);
}

#[test]
fn free_after_the_segment_went_back_to_the_device_is_foreign() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(30 * MIB, S0).unwrap();
    a.free(x).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(
        changes_nothing(&mut a, |a| a.free(x)),
        Err(FreeError::ForeignPointer { addr: x })
    );
    assert_eq!(
        changes_nothing(&mut a, |a| a.free(u64::MAX)),
        Err(FreeError::ForeignPointer { addr: u64::MAX })
    );
}

#[test]
fn null_free_and_record_do_nothing() {
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(4096, S0).unwrap();
    assert_eq!(changes_nothing(&mut a, |a| a.free(0)), Ok(()));
    assert_eq!(changes_nothing(&mut a, |a| a.record_stream(0, S1)), Ok(()));
    a.free(x).unwrap();
}

#[test]
fn a_fraction_outside_zero_to_one_is_refused() {
    let mut a = cuda(GIB, &AllocConf::default());
    a.set_memory_fraction(0.5).unwrap();
    for bad in [-0.1, 1.000_001, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let err = changes_nothing(&mut a, |a| a.set_memory_fraction(bad));
        assert!(
            matches!(err, Err(FractionError::OutOfRange(v)) if v.is_nan() == bad.is_nan()),
            "{bad}: {err:?}"
        );
        assert_eq!(
            a.allowed_memory(),
            Some(GIB / 2),
            "{bad} kept the old limit"
        );
    }
}

#[test]
fn addresses_of_merged_or_released_blocks_are_not_live_and_reusable() {
    // The address index keeps a freed block's entry while its record lives: a merge or a
    // released segment must take the entry with it, and a block split off later at the same
    // address must be found as the new block.
    let mut a = cuda(GIB, &AllocConf::default());
    let x = a.malloc(4096, S0).unwrap();
    let y = a.malloc(4096, S0).unwrap();
    assert_eq!(y, x + 4096);
    a.free(y).unwrap();
    a.free(x).unwrap(); // merges y's block into x's
    // A new segment on another stream takes the record slot y's block had.
    let w = a.malloc(4096, S1).unwrap();
    for addr in [x, y] {
        assert_eq!(
            changes_nothing(&mut a, |a| a.free(addr)),
            Err(FreeError::NotAllocated { addr })
        );
    }
    a.free(w).unwrap();
    // Reused: x's block again, then a new block split off at y's old address.
    assert_eq!(a.malloc(4096, S0), Ok(x));
    assert_eq!(a.malloc(8192, S0), Ok(y));
    a.record_stream(y, S1).unwrap();
    a.free(y).unwrap();
    a.free(x).unwrap();
    assert_eq!(a.pending_events(), 1);
    a.device_mut().complete_all();
    a.empty_cache().unwrap();
    assert_eq!(a.device().outstanding_bytes(), 0);
    // The segment is gone: both addresses are foreign now.
    for addr in [x, y] {
        assert_eq!(
            changes_nothing(&mut a, |a| a.free(addr)),
            Err(FreeError::ForeignPointer { addr })
        );
    }
    let z = a.malloc(4096, S0).unwrap();
    a.free(z).unwrap();
    assert_eq!(
        changes_nothing(&mut a, |a| a.free(z)),
        Err(FreeError::NotAllocated { addr: z })
    );
}
