//! torch_npu's `throw_on_npumalloc_oom:True`: a segment that would take every segment's bytes
//! past the configured `per_process_memory_fraction` of the device's total (asked of the device
//! each time) is refused before the device is asked for it. The malloc fails at once: no
//! release of cached blocks, no retry, no `num_ooms`, one `num_oom_rejections`.

mod common;

use alloc_core::{AllocConf, AllocError, Notice, Rejection};
use alloc_sim::{DeviceCall, Fault, FaultError};
use common::*;

#[test]
fn a_rejected_segment_fails_the_malloc_without_releasing_the_cache() {
    for throw in [true, false] {
        let text = if throw {
            "throw_on_npumalloc_oom:True"
        } else {
            ""
        };
        let mut a = npu(100 * MIB, &conf(text));
        // A 62 MiB segment in use, and a 22 MiB one cached on another stream.
        let _x = a.malloc(60 * MIB, S0).unwrap();
        let c = a.malloc(20 * MIB, S1).unwrap();
        a.free(c).unwrap();
        assert_eq!(stat(&a, "reserved_bytes.all.current"), (84 * MIB) as i64);
        let (mallocs, infos) = (a.device().malloc_calls(), a.device().mem_info_calls());
        let result = a.malloc(20 * MIB, S0);
        if !throw {
            // torch's chain frees the cached segment and the retry fits.
            assert!(result.is_ok());
            assert_eq!(stat(&a, "num_alloc_retries"), 1);
            assert_eq!(stat(&a, "reserved_bytes.all.current"), (84 * MIB) as i64);
            continue;
        }
        // 84 + 22 MiB is past 100% of the device: refused before the device is asked.
        let rejection = Rejection {
            device: 0,
            requested: 20 * MIB,
            alloc_size: 22 * MIB,
            total_allocated: 84 * MIB,
            limit: 100 * MIB,
            device_total: 100 * MIB,
        };
        assert_eq!(result, Err(AllocError::Rejected(Box::new(rejection))));
        assert_eq!(
            result.unwrap_err().to_string(),
            "NPU out of memory. Allocation was preemptively rejected because it would exceed \
             per_process_memory_fraction limit. Requested size: 20.00 MiB"
        );
        assert_eq!(a.device().malloc_calls(), mallocs);
        assert_eq!(a.device().mem_info_calls(), infos + 1);
        assert_eq!(stat(&a, "num_oom_rejections"), 1);
        assert_eq!(stat(&a, "num_ooms"), 0);
        assert_eq!(stat(&a, "num_alloc_retries"), 0);
        assert_eq!(stat(&a, "num_sync_all_streams"), 0);
        assert_eq!(stat(&a, "reserved_bytes.all.current"), (84 * MIB) as i64);
        assert_eq!(a.notices(), &[Notice::OomRejection(rejection)]);
        // torch_npu's TORCH_NPU_WARN_ONCE text, with the segment's size (not the request's).
        assert_eq!(
            a.notices()[0].to_string(),
            "Preemptively rejecting allocation of 22.00 MiB on NPU 0: total_allocated_memory \
             (84.00 MiB) + requested size would exceed memory limit (100.00 MiB = 100% of \
             100.00 MiB). Set throw_on_npumalloc_oom:False to disable this behavior."
        );
        // Noticed once, with the first rejection's numbers; counted each time; reset with the
        // accumulated stats.
        assert!(a.malloc(30 * MIB, S0).is_err());
        assert_eq!(stat(&a, "num_oom_rejections"), 2);
        assert_eq!(a.notices(), &[Notice::OomRejection(rejection)]);
        a.reset_accumulated_stats();
        assert_eq!(stat(&a, "num_oom_rejections"), 0);
        check_consistency(&a);
    }
}

/// The bound is the configuration's fraction: `set_per_process_memory_fraction` moves the
/// limit checked before it (torch's `allowed_memory_maximum`), not this one. With the two equal,
/// the limit refuses first and the malloc runs out of memory through the whole chain.
#[test]
fn the_bound_is_the_configured_fraction_and_the_limit_comes_first() {
    let text = "throw_on_npumalloc_oom:True,per_process_memory_fraction:0.5";
    let mut a = npu(100 * MIB, &conf(text));
    let _x = a.malloc(30 * MIB, S0).unwrap();
    let err = a.malloc(20 * MIB, S0).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err:?}");
    assert_eq!(stat(&a, "num_ooms"), 1);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_oom_rejections"), 0);

    a.set_memory_fraction(0.9).unwrap();
    assert_eq!(a.allowed_memory(), Some(90 * MIB));
    assert_eq!(a.conf().per_process_memory_fraction, 0.5);
    let Err(AllocError::Rejected(r)) = a.malloc(20 * MIB, S0) else {
        panic!("not rejected")
    };
    assert_eq!((r.total_allocated, r.alloc_size), (32 * MIB, 22 * MIB));
    assert_eq!(r.limit, 50 * MIB);
    assert_eq!(stat(&a, "num_ooms"), 1);
    assert_eq!(stat(&a, "num_oom_rejections"), 1);
    // Within the bound it allocates.
    a.malloc(10 * MIB, S0).unwrap();
    check_consistency(&a);
}

#[test]
fn the_check_asks_the_device_and_its_failure_fails_the_malloc() {
    let mut a = npu(100 * MIB, &conf("throw_on_npumalloc_oom:True"));
    a.device_mut()
        .fail_nth(DeviceCall::MemInfo, 1, Fault::Error(9));
    let before = a.stats();
    assert_eq!(
        a.malloc(MIB, S0),
        Err(AllocError::Device(FaultError::Injected {
            call: DeviceCall::MemInfo,
            code: 9
        }))
    );
    assert_eq!(a.stats(), before);
    assert_eq!(a.device().malloc_calls(), 0);
    // A hit asks nothing.
    let x = a.malloc(MIB, S0).unwrap();
    a.free(x).unwrap();
    let infos = a.device().mem_info_calls();
    assert_eq!(a.malloc(MIB, S0), Ok(x));
    assert_eq!(a.device().mem_info_calls(), infos);
    // Off by default.
    assert!(!AllocConf::default().throw_on_npumalloc_oom);
    check_consistency(&a);
}
