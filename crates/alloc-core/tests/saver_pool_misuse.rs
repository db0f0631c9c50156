//! A memory-saver tag's pool is only its regions': the calls of a user's pool refuse it, since
//! a block routed there otherwise (a default-pool fallback with `use_on_oom`, a `use_mem_pool`
//! scope) would be unmapped with the tag at its next pause while still in use.

mod common;

use alloc_core::{AllocConf, AllocError, PoolError};
use common::*;

#[test]
fn a_tags_pool_refuses_the_pool_calls() {
    let mut a = cuda(100 * MIB, &AllocConf::default());
    let kv = a.saver_pool("kv", false).unwrap();
    let big = a.malloc_in(60 * MIB, S0, kv).unwrap();
    a.free(big).unwrap();
    assert_eq!(a.set_use_on_oom(kv, true), Err(PoolError::SaverPool(kv)));
    assert_eq!(a.set_no_split(kv), Err(PoolError::SaverPool(kv)));
    assert_eq!(a.enter_pool(kv), Err(PoolError::SaverPool(kv)));
    // So a default-pool request that does not fit beside the tag's cached segment runs out
    // instead of landing in it.
    assert!(matches!(
        a.malloc(50 * MIB, S0),
        Err(AllocError::OutOfMemory(_))
    ));
    assert_eq!(a.pause(Some("kv")).unwrap(), 60 * MIB);
    check_consistency(&a);
    assert_eq!(
        PoolError::SaverPool(kv).to_string(),
        "private pool (0, 1) is a memory-saver tag's: use its regions, not the pool calls"
    );
}
