//! End-to-end: `AclDevice`'s virtual-memory calls (expandable segments) over the fake
//! `libascendcl` loaded through `acl-sys`'s real loading path, with the exact ACL calls and their
//! arguments, the fake's accounting of ranges, pages and mappings, out-of-memory, injected
//! failures, 207000, a library without the symbols, and the 1 GiB page fallback.
#![cfg(not(loom))]
#![warn(clippy::undocumented_unsafe_blocks)]

use acl_sys::{
    AclError, DevicePtr, MemAllocationType, MemAttr, MemGranularityOptions, MemHandleType,
    MemLocationType, MemMallocPolicy, PhysicalMem, PhysicalMemProp, VMM_SYMBOLS,
};
use alloc_core::{Device, DeviceError, VmmError};
use npu_runtime::AclPlatform;
use testkit::fake_acl::{FakeAcl, Variant};

mod acl_e2e;
use acl_e2e::{GIB, INJECTED, MIB, VA_STRIDE, VA0, assert_injected, code, open, other};

/// `aclrtMallocPhysical`'s detailed log entry for a page of `size` bytes on `device`.
fn malloc_physical(size: u64, mem_attr: u32, device: u32) -> String {
    format!(
        "aclrtMallocPhysical(size={size}, prop={{handleType=0, allocationType=0, \
         memAttr={mem_attr}, location={{id={device}, type=1}}, reserve=0}}, flags=0)"
    )
}

/// Nothing of the VMM is left on `device`: no range, page or mapping, and no bytes charged.
#[track_caller]
fn assert_clean(fake: &FakeAcl, device: u32) {
    assert_eq!(
        [
            fake.reserved_ranges(device),
            fake.reserved_bytes(device),
            fake.live_pages(device),
            fake.page_bytes(device),
            fake.mappings(device),
            fake.mapped_bytes(device),
            fake.used(device),
        ],
        [0; 7],
        "ranges, reserved bytes, pages, page bytes, mappings, mapped bytes, used"
    );
}

#[test]
fn the_lifecycle_calls_acl_in_order_with_torch_npus_arguments() {
    let fake = FakeAcl::new(Variant::Full, GIB, 2);
    let (_platform, device) = open(&fake, 1);
    fake.clear_log();
    // A fresh thread: the first call binds device 1 there, as malloc does.
    let fake_ref = &fake;
    let device = std::thread::scope(|scope| {
        scope
            .spawn(move || {
                let fake = fake_ref;
                let mut device = device;
                let va = device.reserve_address(64 * MIB).unwrap();
                assert_eq!(va, VA0 + VA_STRIDE);
                let page = device.create_page(2 * MIB).unwrap();
                assert_eq!(page.as_raw() as usize, 0x9000_0010);
                device.map(va + 2 * MIB, 2 * MIB, &page).unwrap();

                assert_eq!(fake.reserved_ranges(1), 1);
                assert_eq!(fake.reserved_bytes(1), 64 * MIB);
                assert_eq!(fake.live_pages(1), 1);
                assert_eq!(fake.page_bytes(1), 2 * MIB);
                assert_eq!(fake.mappings(1), 1);
                assert_eq!(fake.mapped_bytes(1), 2 * MIB);
                // The page is charged to device 1 like a segment; the range is not charged.
                assert_eq!(fake.used(1), 2 * MIB);
                assert_eq!(fake.live_allocations(1), 0);
                assert_clean(fake, 0);
                let info = device.mem_info().unwrap();
                assert_eq!((info.free, info.total), (GIB - 2 * MIB, GIB));

                device.unmap(va + 2 * MIB, 2 * MIB).unwrap();
                device.release_page(page).unwrap();
                device.release_address(va, 64 * MIB).unwrap();
                device
            })
            .join()
            .unwrap()
    });
    assert_eq!(
        fake.call_details(),
        [
            "aclrtSetDevice(deviceId=1)".to_owned(),
            "aclrtReserveMemAddress(size=67108864, alignment=0, expectPtr=0x0, flags=1)".into(),
            malloc_physical(2 * MIB, 4, 1),
            "aclrtMapMem(virPtr=0x810000200000, size=2097152, offset=0, handle=0x90000010, \
             flags=0)"
                .into(),
            "aclrtGetMemInfo".into(),
            "aclrtUnmapMem(virPtr=0x810000200000)".into(),
            "aclrtFreePhysical(handle=0x90000010)".into(),
            "aclrtReleaseMemAddress(virPtr=0x810000000000)".into(),
        ]
    );
    assert_eq!(
        fake.log(),
        [
            "aclrtSetDevice",
            "aclrtReserveMemAddress",
            "aclrtMallocPhysical",
            "aclrtMapMem",
            "aclrtGetMemInfo",
            "aclrtUnmapMem",
            "aclrtFreePhysical",
            "aclrtReleaseMemAddress",
        ]
    );
    assert_clean(&fake, 1);
    drop(device);
}

#[test]
fn out_of_memory_from_malloc_physical_leaves_nothing_behind() {
    let fake = FakeAcl::new(Variant::Full, 8 * MIB, 1);
    let (_platform, mut device) = open(&fake, 0);
    // Pages and segments share the capacity.
    let segment = device.malloc(2 * MIB).unwrap();
    // A range is address space only: more than the capacity is fine.
    let va = device.reserve_address(64 * MIB).unwrap();
    let mut pages: Vec<PhysicalMem> = (0..3)
        .map(|_| device.create_page(2 * MIB).unwrap())
        .collect();
    assert_eq!(fake.used(0), 8 * MIB);
    assert_eq!(device.mem_info().unwrap().free, 0);

    fake.clear_log();
    assert_eq!(
        device.create_page(2 * MIB).unwrap_err(),
        VmmError::OutOfMemory
    );
    assert_eq!(
        fake.log(),
        ["aclrtMallocPhysical"],
        "a 2 MiB page is not retried"
    );
    // A 1 GiB page asks for 1 GiB pages, then 2 MiB pages, and is out of memory.
    fake.clear_log();
    assert_eq!(device.create_page(GIB).unwrap_err(), VmmError::OutOfMemory);
    assert_eq!(
        fake.call_details(),
        [malloc_physical(GIB, 10, 0), malloc_physical(GIB, 4, 0)]
    );
    // And a segment finds no room either.
    assert_eq!(device.malloc(2 * MIB), Err(DeviceError::OutOfMemory));
    assert_eq!(fake.live_pages(0), 3);
    assert_eq!(fake.page_bytes(0), 6 * MIB);
    assert_eq!(fake.used(0), 8 * MIB);

    // One page freed makes room for one page.
    device.release_page(pages.pop().unwrap()).unwrap();
    pages.push(device.create_page(2 * MIB).unwrap());
    for page in pages {
        device.release_page(page).unwrap();
    }
    device.release_address(va, 64 * MIB).unwrap();
    assert_eq!(fake.used(0), 2 * MIB);
    device.free(segment, 2 * MIB).unwrap();
    assert_clean(&fake, 0);
}

#[test]
fn injected_failures_are_other_errors_with_the_code_and_leak_nothing() {
    let fake = FakeAcl::new(Variant::Full, GIB, 1);
    let (_platform, mut device) = open(&fake, 0);
    let fail = |name: &str| fake.fail_next(name, INJECTED, 1);
    let check = assert_injected;

    fail("aclrtReserveMemAddress");
    check(
        device.reserve_address(64 * MIB).unwrap_err(),
        "aclrtReserveMemAddress",
    );
    assert_clean(&fake, 0);
    let va = device.reserve_address(64 * MIB).unwrap();

    fail("aclrtMallocPhysical");
    check(
        device.create_page(2 * MIB).unwrap_err(),
        "aclrtMallocPhysical",
    );
    assert_eq!((fake.live_pages(0), fake.used(0)), (0, 0));
    let page = device.create_page(2 * MIB).unwrap();

    fail("aclrtMapMem");
    check(device.map(va, 2 * MIB, &page).unwrap_err(), "aclrtMapMem");
    assert_eq!((fake.mappings(0), fake.mapped_bytes(0)), (0, 0));
    device.map(va, 2 * MIB, &page).unwrap();

    fail("aclrtUnmapMem");
    check(device.unmap(va, 2 * MIB).unwrap_err(), "aclrtUnmapMem");
    assert_eq!(fake.mapped_bytes(0), 2 * MIB, "still mapped");
    device.unmap(va, 2 * MIB).unwrap();

    fail("aclrtFreePhysical");
    let raw = page.as_raw();
    let (page, e) = device.release_page(page).unwrap_err();
    check(e, "aclrtFreePhysical");
    assert_eq!(page.as_raw(), raw, "the page comes back");
    assert_eq!(fake.live_pages(0), 1);
    device.release_page(page).unwrap();

    fail("aclrtReleaseMemAddress");
    check(
        device.release_address(va, 64 * MIB).unwrap_err(),
        "aclrtReleaseMemAddress",
    );
    assert_eq!(fake.reserved_ranges(0), 1);
    device.release_address(va, 64 * MIB).unwrap();

    assert_clean(&fake, 0);
    // Every call was tried once more after its failure.
    for name in VMM_SYMBOLS {
        assert_eq!(fake.calls(name), 2, "{name}");
    }
}

#[test]
fn status_207000_is_unsupported_on_every_call() {
    let fake = FakeAcl::new(Variant::Full, 4 * GIB, 1);
    let (_platform, mut device) = open(&fake, 0);
    let refuse = |name: &str, count| fake.fail_next(name, 207_000, count);

    refuse("aclrtReserveMemAddress", 1);
    assert_eq!(
        device.reserve_address(64 * MIB).unwrap_err(),
        VmmError::Unsupported
    );
    refuse("aclrtMallocPhysical", 1);
    assert_eq!(
        device.create_page(2 * MIB).unwrap_err(),
        VmmError::Unsupported
    );
    // A 1 GiB page is retried with 2 MiB pages on any failed status, as torch_npu does.
    refuse("aclrtMallocPhysical", 1);
    let big = device.create_page(GIB).unwrap();
    refuse("aclrtMallocPhysical", 2);
    assert_eq!(device.create_page(GIB).unwrap_err(), VmmError::Unsupported);

    let va = device.reserve_address(2 * GIB).unwrap();
    refuse("aclrtMapMem", 1);
    assert_eq!(
        device.map(va, GIB, &big).unwrap_err(),
        VmmError::Unsupported
    );
    device.map(va, GIB, &big).unwrap();
    refuse("aclrtUnmapMem", 1);
    assert_eq!(device.unmap(va, GIB).unwrap_err(), VmmError::Unsupported);
    device.unmap(va, GIB).unwrap();
    refuse("aclrtFreePhysical", 1);
    let (big, e) = device.release_page(big).unwrap_err();
    assert_eq!(e, VmmError::Unsupported);
    device.release_page(big).unwrap();
    refuse("aclrtReleaseMemAddress", 1);
    assert_eq!(
        device.release_address(va, 2 * GIB).unwrap_err(),
        VmmError::Unsupported
    );
    device.release_address(va, 2 * GIB).unwrap();
    assert_clean(&fake, 0);
}

#[test]
fn a_library_without_vmm_symbols_is_unsupported_on_every_call() {
    let fake = FakeAcl::new(Variant::NoVmm, GIB, 1);
    // The symbols are really absent: dlsym fails, as on a CANN older than them.
    {
        // SAFETY: the fake libascendcl built from this workspace (already loaded by `fake`).
        let lib = unsafe { libloading::Library::new(fake.path()) }.unwrap();
        for name in VMM_SYMBOLS
            .iter()
            .chain(&["aclrtMemGetAllocationGranularity"])
        {
            // SAFETY: only looked up, never called.
            let symbol = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) };
            assert!(symbol.is_err(), "{name} is exported");
        }
        // SAFETY: as above.
        assert!(unsafe { lib.get::<unsafe extern "C" fn()>(b"aclrtMalloc") }.is_ok());
    }
    let (platform, mut device) = open(&fake, 0);
    let lib = platform.lib();
    assert!(!lib.has_vmm());
    let missing = lib.missing_optional();
    for name in VMM_SYMBOLS {
        assert!(missing.contains(name), "{name}");
    }
    assert!(missing.contains(&"aclrtMemGetAllocationGranularity"));

    // A page from a library that has them, to hand to the calls that take one.
    let full = FakeAcl::new(Variant::Full, GIB, 1);
    let (_full_platform, mut full_device) = open(&full, 0);
    let page = full_device.create_page(2 * MIB).unwrap();

    fake.clear_log();
    assert_eq!(
        device.reserve_address(64 * MIB).unwrap_err(),
        VmmError::Unsupported
    );
    assert_eq!(
        device.create_page(2 * MIB).unwrap_err(),
        VmmError::Unsupported
    );
    assert_eq!(device.create_page(GIB).unwrap_err(), VmmError::Unsupported);
    assert_eq!(
        device.map(VA0, 2 * MIB, &page).unwrap_err(),
        VmmError::Unsupported
    );
    assert_eq!(
        device.unmap(VA0, 2 * MIB).unwrap_err(),
        VmmError::Unsupported
    );
    assert_eq!(
        device.release_address(VA0, 64 * MIB).unwrap_err(),
        VmmError::Unsupported
    );
    let (page, e) = device.release_page(page).unwrap_err();
    assert_eq!(e, VmmError::Unsupported);
    // No VMM function reached the library: only the binding, made again because this thread
    // last bound the other library's device.
    assert_eq!(fake.log(), ["aclrtSetDevice"]);

    // acl-sys's wrappers name the missing symbol; a failed free hands the handle back.
    assert_eq!(
        lib.reserve_mem_address(2 * MIB as usize, 0, 1),
        Err(AclError::Unsupported {
            symbol: "aclrtReserveMemAddress"
        })
    );
    let prop = PhysicalMemProp::device(0, MemAttr::HBM_MEM_HUGE);
    assert_eq!(
        lib.mem_get_allocation_granularity(&prop, MemGranularityOptions::MINIMUM),
        Err(AclError::Unsupported {
            symbol: "aclrtMemGetAllocationGranularity"
        })
    );
    let raw = page.as_raw();
    let (page, e) = lib.free_physical(page).unwrap_err();
    assert_eq!(
        e,
        AclError::Unsupported {
            symbol: "aclrtFreePhysical"
        }
    );
    assert_eq!(page.as_raw(), raw);
    full_device.release_page(page).unwrap();
    assert_clean(&full, 0);
}

#[test]
fn a_1g_page_asks_for_huge1g_and_falls_back_to_huge_once() {
    let fake = FakeAcl::new(Variant::Full, 3 * GIB, 1);
    // torch_npu decides by the page size alone (`segment_size_ == kExtraLargeBuffer`), so a
    // 1 GiB page asks for 1 GiB pages with or without `page_size:1g`.
    let (_platform, mut device) = open(&fake, 0);
    fake.clear_log();
    let first = device.create_page(GIB).unwrap();
    assert_eq!(fake.call_details(), [malloc_physical(GIB, 10, 0)]);

    // 1 GiB pages run out: one retry with 2 MiB pages, same size.
    fake.clear_log();
    fake.fail_next("aclrtMallocPhysical", 207_001, 1);
    let second = device.create_page(GIB).unwrap();
    assert_eq!(
        fake.call_details(),
        [malloc_physical(GIB, 10, 0), malloc_physical(GIB, 4, 0)]
    );
    assert_eq!((fake.live_pages(0), fake.page_bytes(0)), (2, 2 * GIB));

    // Both fail: the retry's error is the answer.
    fake.clear_log();
    fake.fail_next("aclrtMallocPhysical", 507_899, 1);
    fake.fail_next("aclrtMallocPhysical", 207_018, 1);
    let e = other(device.create_page(GIB).unwrap_err());
    assert_eq!(e.code(), Some(207_018));
    assert_eq!(fake.log(), ["aclrtMallocPhysical", "aclrtMallocPhysical"]);
    fake.fail_next("aclrtMallocPhysical", 507_899, 1);
    fake.fail_next("aclrtMallocPhysical", 207_001, 1);
    assert_eq!(device.create_page(GIB).unwrap_err(), VmmError::OutOfMemory);

    // Only a page of exactly 1 GiB asks for 1 GiB pages.
    fake.clear_log();
    let double = device.create_page(2 * GIB).unwrap_err();
    assert_eq!(
        double,
        VmmError::OutOfMemory,
        "2 GiB more does not fit in 3 GiB"
    );
    assert_eq!(fake.call_details(), [malloc_physical(2 * GIB, 4, 0)]);

    // Both map into a 2 GiB range (1 GiB aligned).
    let va = device.reserve_address(2 * GIB).unwrap();
    assert_eq!(va, VA0);
    device.map(va, GIB, &first).unwrap();
    device.map(va + GIB, GIB, &second).unwrap();
    assert_eq!(fake.mapped_bytes(0), 2 * GIB);
    device.unmap(va, GIB).unwrap();
    device.unmap(va + GIB, GIB).unwrap();
    device.release_page(first).unwrap();
    device.release_page(second).unwrap();
    device.release_address(va, 2 * GIB).unwrap();
    assert_clean(&fake, 0);
}

#[test]
fn the_fake_checks_every_vmm_argument() {
    let fake = FakeAcl::new(Variant::Full, 64 * MIB, 2);
    let (platform, _device) = open(&fake, 0);
    let lib = platform.lib();
    const M2: usize = 2 << 20;

    // Reservations: size > 0, alignment 0, flags 0 or 1; a range past the device's region
    // (1 TiB) is 207001, never an overflow.
    assert_eq!(code(lib.reserve_mem_address(0, 0, 1)), 100_000);
    assert_eq!(code(lib.reserve_mem_address(M2, 4096, 1)), 100_000);
    assert_eq!(code(lib.reserve_mem_address(M2, 0, 2)), 100_000);
    assert_eq!(code(lib.reserve_mem_address(usize::MAX, 0, 1)), 207_001);
    let whole = lib.reserve_mem_address(1 << 40, 0, 0).unwrap();
    assert_eq!(whole.addr(), VA0);
    assert_eq!(code(lib.reserve_mem_address(M2, 0, 1)), 207_001);
    lib.release_mem_address(whole).unwrap();
    assert_clean(&fake, 0);

    // Pages: pinned device memory of a known kind, no exportable handle, an existing device,
    // reserve 0, a size that is a whole number of the kind's pages.
    let good = PhysicalMemProp::device(0, MemAttr::HBM_MEM_HUGE);
    let bad_props = [
        PhysicalMemProp {
            handle_type: MemHandleType::POSIX,
            ..good
        },
        PhysicalMemProp {
            allocation_type: MemAllocationType(1),
            ..good
        },
        PhysicalMemProp {
            mem_attr: MemAttr::DDR_MEM_HUGE,
            ..good
        },
        PhysicalMemProp {
            mem_attr: MemAttr::HBM_MEM_P2P_HUGE,
            ..good
        },
        PhysicalMemProp {
            mem_attr: MemAttr(99),
            ..good
        },
        PhysicalMemProp::device(2, MemAttr::HBM_MEM_HUGE),
        PhysicalMemProp {
            location: acl_sys::MemLocation {
                id: 0,
                kind: MemLocationType::HOST,
            },
            ..good
        },
        PhysicalMemProp { reserve: 1, ..good },
    ];
    for prop in bad_props {
        assert_eq!(code(lib.malloc_physical(M2, &prop)), 100_000, "{prop:?}");
        assert_eq!(
            code(lib.mem_get_allocation_granularity(&prop, MemGranularityOptions::MINIMUM)),
            100_000,
            "{prop:?}"
        );
    }
    assert_eq!(code(lib.malloc_physical(0, &good)), 100_000);
    assert_eq!(code(lib.malloc_physical(1 << 20, &good)), 100_000);
    let huge1g = PhysicalMemProp::device(0, MemAttr::HBM_MEM_HUGE1G);
    assert_eq!(code(lib.malloc_physical(M2, &huge1g)), 100_000);
    // A size past every limit is out of memory, not an overflow.
    assert_eq!(
        code(lib.malloc_physical(usize::MAX & !(M2 - 1), &good)),
        207_001
    );
    assert_eq!(code(lib.malloc_physical(128 << 20, &good)), 207_001);
    assert_eq!(
        lib.recent_err_msg().as_deref(),
        Some(
            "EL0004: Failed to allocate memory. Possible Cause: Available memory is insufficient."
        )
    );
    assert_clean(&fake, 0);

    // Granularity: 2 MiB, or 1 GiB for 1 GiB pages.
    for option in [
        MemGranularityOptions::MINIMUM,
        MemGranularityOptions::RECOMMENDED,
    ] {
        assert_eq!(lib.mem_get_allocation_granularity(&good, option), Ok(M2));
        assert_eq!(
            lib.mem_get_allocation_granularity(&huge1g, option),
            Ok(1 << 30)
        );
    }
    assert_eq!(
        code(lib.mem_get_allocation_granularity(&good, MemGranularityOptions::UNDEF)),
        100_000
    );

    // Mappings.
    let va = lib.reserve_mem_address(4 * M2, 0, 1).unwrap(); // 8 MiB
    let at = |offset: u64| va.offset(offset).unwrap();
    let p = lib.malloc_physical(M2, &good).unwrap();
    let p2 = lib.malloc_physical(M2, &good).unwrap();
    let p4 = lib.malloc_physical(2 * M2, &good).unwrap();
    assert_eq!(code(lib.map_mem(va, M2, 1, &p)), 100_000, "offset");
    assert_eq!(code(lib.map_mem(at(4096), M2, 0, &p)), 100_000, "unaligned");
    assert_eq!(
        code(lib.map_mem(va, 2 * M2, 0, &p)),
        100_000,
        "not the page's size"
    );
    assert_eq!(
        code(lib.map_mem(at(8 * MIB), M2, 0, &p)),
        107_000,
        "past the range"
    );
    assert_eq!(
        code(lib.map_mem(at(6 * MIB), 2 * M2, 0, &p4)),
        107_000,
        "across its end"
    );
    let top = DevicePtr::from_addr(!(2 * MIB - 1)).unwrap();
    assert_eq!(
        code(lib.map_mem(top, M2, 0, &p)),
        107_000,
        "end past u64::MAX"
    );
    let segment = lib.malloc_align32(M2, MemMallocPolicy::HUGE_FIRST).unwrap();
    assert_eq!(code(lib.map_mem(segment, M2, 0, &p)), 107_000, "a segment");
    assert_eq!(code(lib.free(va)), 107_000, "aclrtFree of a range");
    lib.free(segment).unwrap();
    // SAFETY: not a live handle, but the fake only looks handles up in its table (never
    // dereferences them), which is what this checks; the value is never freed.
    let unknown = unsafe { PhysicalMem::from_raw(0xdead_0000 as *mut core::ffi::c_void) };
    assert_eq!(code(lib.map_mem(va, M2, 0, &unknown)), 107_017);
    let _ = unknown.into_raw();

    lib.map_mem(va, M2, 0, &p).unwrap();
    assert_eq!(
        code(lib.map_mem(at(2 * MIB), M2, 0, &p)),
        107_000,
        "mapped twice"
    );
    lib.map_mem(at(4 * MIB), 2 * M2, 0, &p4).unwrap();
    assert_eq!(
        code(lib.map_mem(at(6 * MIB), M2, 0, &p2)),
        107_000,
        "over a mapping"
    );
    assert_eq!(
        code(lib.map_mem(at(2 * MIB), 2 * M2, 0, &p4)),
        107_000,
        "mapped twice"
    );
    assert_eq!((fake.mappings(0), fake.mapped_bytes(0)), (2, 6 * MIB));

    // A mapped page cannot be freed (and comes back), nor a range with mappings released.
    let raw = p.as_raw();
    let (p, e) = lib.free_physical(p).unwrap_err();
    assert_eq!((e.code(), p.as_raw()), (Some(107_000), raw));
    assert_eq!(code(lib.release_mem_address(va)), 107_000);
    assert_eq!(
        code(lib.unmap_mem(at(2 * MIB))),
        107_000,
        "not a mapping's start"
    );
    lib.unmap_mem(va).unwrap();
    assert_eq!(code(lib.unmap_mem(va)), 107_000, "unmapped twice");
    lib.unmap_mem(at(4 * MIB)).unwrap();
    for page in [p, p2, p4] {
        lib.free_physical(page).unwrap();
    }
    lib.release_mem_address(va).unwrap();
    assert_eq!(code(lib.release_mem_address(va)), 107_000, "released twice");
    assert_clean(&fake, 0);

    // A range of device 1 takes no page of device 0.
    lib.set_device(1).unwrap();
    let va1 = lib.reserve_mem_address(M2, 0, 1).unwrap();
    assert_eq!(va1.addr(), VA0 + VA_STRIDE);
    let p0 = lib.malloc_physical(M2, &good).unwrap();
    assert_eq!(code(lib.map_mem(va1, M2, 0, &p0)), 107_000);
    assert_eq!((fake.live_pages(0), fake.live_pages(1)), (1, 0));
    lib.free_physical(p0).unwrap();
    lib.release_mem_address(va1).unwrap();
    assert_clean(&fake, 0);
    assert_clean(&fake, 1);

    // Like every memory call, the VMM calls need a device set on the calling thread.
    let platform2 = platform.clone();
    std::thread::spawn(move || {
        let lib = platform2.lib();
        assert_eq!(code(lib.reserve_mem_address(M2, 0, 1)), 107_002);
        let good = PhysicalMemProp::device(0, MemAttr::HBM_MEM_HUGE);
        assert_eq!(code(lib.malloc_physical(M2, &good)), 107_002);
    })
    .join()
    .unwrap();
}

// ----- the runtime with expandable segments over the fake -----

fn expandable_runtime(fake: &FakeAcl) -> npu_runtime::NpuAllocator {
    let config = npu_runtime::Config {
        alloc: alloc_conf::parse("expandable_segments:True").conf,
        ..npu_runtime::Config::default()
    };
    // SAFETY: the fake libascendcl built from this workspace.
    let platform =
        unsafe { AclPlatform::load(fake.path()) }.expect("load the fake through acl-sys");
    platform.runtime(config)
}

/// `aclrtMapMem` of the 20 MiB page `i` of the fake's first range on device 0.
fn map_mem(i: u64, handle: u64) -> String {
    format!(
        "aclrtMapMem(virPtr={:#x}, size=20971520, offset=0, handle={handle:#x}, flags=0)",
        VA0 + i * 20 * MIB
    )
}

#[test]
fn expandable_segments_over_acl_probe_reserve_map_and_unmap_as_torch_npu() {
    let fake = FakeAcl::new(Variant::Full, GIB, 1);
    let rt = expandable_runtime(&fake);
    let s = npu_runtime::Stream::DEFAULT;
    fake.clear_log();
    // 30 MiB (+ the 32-byte pad) needs two 20 MiB pages: both are created, then both mapped.
    let p = rt.malloc(30 * MIB, 0, s).unwrap();
    assert_eq!(p, VA0);
    assert_eq!(
        fake.call_details(),
        [
            "aclrtSetDevice(deviceId=0)".to_string(),
            // The allocator learns the total, then probes (torch_npu's 512-byte reservation).
            "aclrtGetMemInfo".into(),
            "aclrtReserveMemAddress(size=512, alignment=0, expectPtr=0x0, flags=1)".into(),
            format!("aclrtReleaseMemAddress(virPtr={VA0:#x})"),
            // The range: ceil(1.125 GiB / 20 MiB) = 58 pages, the total asked anew.
            "aclrtGetMemInfo".into(),
            "aclrtReserveMemAddress(size=1216348160, alignment=0, expectPtr=0x0, flags=1)".into(),
            malloc_physical(20 * MIB, 4, 0),
            malloc_physical(20 * MIB, 4, 0),
            map_mem(0, 0x9000_0010),
            map_mem(1, 0x9000_0020),
        ]
    );
    assert_eq!((fake.live_pages(0), fake.mapped_bytes(0)), (2, 40 * MIB));
    assert_eq!(rt.memory_reserved(0).unwrap(), 40 * MIB);
    let snapshot = rt.memory_snapshot(0).unwrap();
    assert_eq!(snapshot.len(), 1);
    assert!(snapshot[0].is_expandable);

    // A cache hit calls nothing.
    let q = rt.malloc(4 * MIB, 0, s).unwrap();
    rt.free(q).unwrap();
    rt.free(p).unwrap();
    fake.clear_log();
    rt.empty_cache().unwrap();
    // empty_cache synchronizes (its events), then unmapping synchronizes the device again and
    // unmaps and frees each page; the emptied range is released.
    assert_eq!(
        fake.call_details(),
        [
            "aclrtSynchronizeDevice".to_string(),
            "aclrtSynchronizeDevice".into(),
            format!("aclrtUnmapMem(virPtr={VA0:#x})"),
            "aclrtFreePhysical(handle=0x90000010)".into(),
            format!("aclrtUnmapMem(virPtr={:#x})", VA0 + 20 * MIB),
            "aclrtFreePhysical(handle=0x90000020)".into(),
            format!("aclrtReleaseMemAddress(virPtr={VA0:#x})"),
        ]
    );
    assert_eq!(rt.memory_reserved(0).unwrap(), 0);
    let stats = rt.device_stats(0).unwrap();
    assert_eq!((stats.num_device_alloc, stats.num_device_free), (1, 1));
    assert_clean(&fake, 0);
}

/// torch_npu's `empty_virt_addr_cache`: the pages are unmapped but not freed
/// (`free_physical_handles_`), the next map takes them back without `aclrtMallocPhysical`, and
/// `empty_cache` frees them. Without expandable segments it is refused with torch_npu's message
/// before any ACL call.
#[test]
fn empty_virt_addr_cache_unmaps_and_keeps_the_pages_for_the_next_map() {
    let fake = FakeAcl::new(Variant::Full, GIB, 1);
    let rt = expandable_runtime(&fake);
    let s = npu_runtime::Stream::DEFAULT;
    let p = rt.malloc(30 * MIB, 0, s).unwrap();
    rt.free(p).unwrap();
    fake.clear_log();
    rt.empty_virt_addr_cache().unwrap();
    assert_eq!(
        fake.call_details(),
        [
            "aclrtSynchronizeDevice".to_string(),
            "aclrtSynchronizeDevice".into(),
            format!("aclrtUnmapMem(virPtr={VA0:#x})"),
            format!("aclrtUnmapMem(virPtr={:#x})", VA0 + 20 * MIB),
            format!("aclrtReleaseMemAddress(virPtr={VA0:#x})"),
        ]
    );
    assert_eq!(rt.memory_reserved(0).unwrap(), 0);
    assert_eq!((fake.live_pages(0), fake.mapped_bytes(0)), (2, 0));

    // The next range is mapped with the two kept pages, the last kept first (torch_npu takes
    // its list's back).
    fake.clear_log();
    let q = rt.malloc(30 * MIB, 0, s).unwrap();
    let log = fake.call_details();
    assert!(
        !log.iter().any(|c| c.starts_with("aclrtMallocPhysical")),
        "{log:?}"
    );
    let va1 = q;
    assert_eq!(
        log[log.len() - 2..],
        [
            format!(
                "aclrtMapMem(virPtr={va1:#x}, size=20971520, offset=0, handle=0x90000020, flags=0)"
            ),
            format!(
                "aclrtMapMem(virPtr={:#x}, size=20971520, offset=0, handle=0x90000010, flags=0)",
                va1 + 20 * MIB
            ),
        ]
    );
    assert_eq!(rt.memory_reserved(0).unwrap(), 40 * MIB);
    rt.free(q).unwrap();
    rt.empty_virt_addr_cache().unwrap();
    assert_eq!(fake.live_pages(0), 2);
    rt.empty_cache().unwrap();
    assert_eq!(fake.calls("aclrtFreePhysical"), 2);
    let stats = rt.device_stats(0).unwrap();
    assert_eq!((stats.num_device_alloc, stats.num_device_free), (2, 2));
    assert_clean(&fake, 0);

    // Off: refused before anything reaches the library.
    rt.set_allocator_settings("expandable_segments:False");
    fake.clear_log();
    let e = rt.empty_virt_addr_cache().unwrap_err();
    assert_eq!(
        e.to_string(),
        "Unsupported config for empty_virt_addr_cache, please enable expandable_segments."
    );
    assert!(fake.call_details().is_empty());
}

#[test]
fn without_the_vmm_symbols_the_probe_falls_back_to_plain_segments() {
    let fake = FakeAcl::new(Variant::NoVmm, GIB, 1);
    let rt = expandable_runtime(&fake);
    fake.clear_log();
    let p = rt.malloc(8 * MIB, 0, npu_runtime::Stream::DEFAULT).unwrap();
    // The probe needs aclrtReserveMemAddress, which is absent: no VMM call reaches the library,
    // and the request gets a 20 MiB segment from aclrtMallocAlign32.
    assert_eq!(
        fake.log(),
        ["aclrtSetDevice", "aclrtGetMemInfo", "aclrtMallocAlign32"]
    );
    assert!(!rt.allocator_settings(0).unwrap().expandable_segments);
    assert!(!rt.memory_snapshot(0).unwrap()[0].is_expandable);
    assert_eq!(rt.memory_reserved(0).unwrap(), 20 * MIB);
    rt.free(p).unwrap();
    // Asking for them again at run time probes again, and they stay off.
    rt.set_allocator_settings("expandable_segments:True");
    assert!(!rt.allocator_settings(0).unwrap().expandable_segments);
}

#[test]
fn a_driver_answering_207000_to_the_probe_falls_back_too() {
    let fake = FakeAcl::new(Variant::Full, GIB, 1);
    fake.fail_next("aclrtReserveMemAddress", 207_000, 1);
    let rt = expandable_runtime(&fake);
    fake.clear_log();
    rt.malloc(8 * MIB, 0, npu_runtime::Stream::DEFAULT).unwrap();
    assert_eq!(
        fake.log(),
        [
            "aclrtSetDevice",
            "aclrtGetMemInfo",
            "aclrtReserveMemAddress",
            "aclrtMallocAlign32"
        ]
    );
    assert!(!rt.allocator_settings(0).unwrap().expandable_segments);
    assert_eq!(fake.reserved_ranges(0), 0);
}

#[test]
fn the_memory_saver_over_acl_backs_up_unmaps_and_restores_at_the_same_address() {
    let fake = FakeAcl::new(Variant::Full, GIB, 1);
    // SAFETY: the fake libascendcl built from this workspace.
    let platform =
        unsafe { AclPlatform::load(fake.path()) }.expect("load the fake through acl-sys");
    let rt = platform.runtime(npu_runtime::Config::default());
    let s = npu_runtime::Stream::DEFAULT;
    // Open the device first, so the log below holds only the memory saver's calls.
    let first = rt.malloc(1000, 0, s).unwrap();
    fake.clear_log();
    let w = {
        let _region = rt.region(0, "weights", true).unwrap();
        rt.malloc(8 * MIB, 0, s).unwrap()
    };
    // The tag's pool probes once; its segment is its own range with one page mapped.
    assert_eq!(
        fake.call_details(),
        [
            "aclrtReserveMemAddress(size=512, alignment=0, expectPtr=0x0, flags=1)".to_string(),
            format!("aclrtReleaseMemAddress(virPtr={VA0:#x})"),
            "aclrtReserveMemAddress(size=20971520, alignment=0, expectPtr=0x0, flags=1)".into(),
            malloc_physical(20 * MIB, 4, 0),
            map_mem(0, 0x9000_0010),
        ]
    );
    assert_eq!(w, VA0);
    fake.write_device(w, b"weights").unwrap();
    let used = fake.used(0);
    fake.clear_log();
    assert_eq!(rt.pause(Some("weights")).unwrap(), 20 * MIB);
    let pause = fake.call_details();
    // The host buffer's address is the fake's; read it from the copy.
    let host = pause[2]
        .split("dst=")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap()
        .to_owned();
    assert_eq!(
        pause,
        [
            "aclrtSynchronizeDevice".to_string(),
            "aclrtMallocHost(size=20971520)".into(),
            format!(
                "aclrtMemcpy(dst={host}, destMax=20971520, src={VA0:#x}, count=20971520, kind=2)"
            ),
            format!("aclrtUnmapMem(virPtr={VA0:#x})"),
            "aclrtFreePhysical(handle=0x90000010)".into(),
        ]
    );
    assert_eq!(fake.used(0), used - 20 * MIB);
    assert_eq!((fake.live_pages(0), fake.reserved_ranges(0)), (0, 1));
    fake.clear_log();
    assert_eq!(rt.resume(None).unwrap(), 20 * MIB);
    assert_eq!(
        fake.call_details(),
        [
            malloc_physical(20 * MIB, 4, 0),
            map_mem(0, 0x9000_0020),
            format!(
                "aclrtMemcpy(dst={VA0:#x}, destMax=20971520, src={host}, count=20971520, kind=1)"
            ),
            format!("aclrtFreeHost(hostPtr={host})"),
        ]
    );
    assert_eq!(fake.read_device(w, 7).unwrap(), b"weights");
    assert_eq!(fake.live_host_buffers(), 0);
    rt.free(w).unwrap();
    rt.free(first).unwrap();
}
