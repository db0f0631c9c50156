//! End-to-end: `AclDevice`'s host-memory calls (the memory saver's CPU backup) over the fake
//! `libascendcl` loaded through `acl-sys`'s real loading path: device bytes written into a
//! segment and into mapped pages, copied to pinned host memory, the pages unmapped and freed,
//! new pages mapped (reading zeros), the bytes copied back; the exact ACL calls and their
//! arguments; injected failures of each call, 207000, out-of-memory codes, sizes and ranges
//! refused; and device memory of a 13 GiB scale that holds no host memory until written.
#![cfg(not(loom))]
#![warn(clippy::undocumented_unsafe_blocks)]

use core::ffi::c_void;

use acl_sys::{DevicePtr, HOST_COPY_SYMBOLS, HostMem, MemcpyKind};
use alloc_core::{Device, VmmError};
use testkit::fake_acl::{FakeAcl, Variant};

mod acl_e2e;
use acl_e2e::{GIB, INJECTED, MIB, VA_STRIDE, VA0, assert_injected, code, open, other};

const KIB: u64 = 1 << 10;
/// The fake's first segment on device 0.
const SEG0: u64 = 0x1000_0000_0000;
/// The fake's codes.
const INVALID_PARAM: i32 = 100_000;
const PARAM_INVALID: i32 = 107_000;

/// A host buffer's address as the fake logs it.
fn addr(host: &HostMem) -> String {
    format!("{:#x}", host.as_ptr() as usize)
}

/// `n` bytes of a pattern with no zero byte, different for each `seed`.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ seed | 1).collect()
}

/// `aclrtMallocPhysical`'s detailed log entry for a 2 MiB page on `device`.
fn malloc_physical_2m(device: u32) -> String {
    format!(
        "aclrtMallocPhysical(size=2097152, prop={{handleType=0, allocationType=0, memAttr=4, \
         location={{id={device}, type=1}}, reserve=0}}, flags=0)"
    )
}

#[test]
fn segment_bytes_go_to_host_memory_and_back_with_the_exact_calls() {
    let fake = FakeAcl::new(Variant::Full, GIB, 1);
    let (platform, mut device) = open(&fake, 0);
    assert!(platform.lib().has_host_copies());
    for name in HOST_COPY_SYMBOLS {
        assert!(platform.lib().has_symbol(name), "{name}");
    }
    let seg = device.malloc(2 * MIB).unwrap();
    assert_eq!(seg, SEG0);
    let hello = b"hello, device";
    let block = pattern(8 * KIB as usize, 0x5a);
    fake.write_device(seg + 100, hello).unwrap();
    fake.write_device(seg + MIB + 7, &block).unwrap();
    let before = fake.read_device(seg, 2 * MIB as usize).unwrap();
    assert_eq!(&before[100..100 + hello.len()], hello);
    assert!(before[..100].iter().all(|&b| b == 0));
    // One chunk for the greeting, three for 8 KiB that start 7 bytes into a chunk.
    assert_eq!(fake.content_bytes(0), 4 * 4 * KIB);

    fake.clear_log();
    let mut host = device.alloc_host(2 * MIB).unwrap();
    assert_eq!(host.len(), 2 * MIB as usize);
    assert!(host.as_slice().iter().all(|&b| b == 0), "zeroed");
    assert_eq!(fake.live_host_buffers(), 1);
    device.copy_to_host(&mut host, seg, 2 * MIB).unwrap();
    assert_eq!(host.as_slice(), &before[..]);

    // The device loses its bytes (zeros written free the chunks), then gets them back.
    fake.write_device(seg, &vec![0; 2 * MIB as usize]).unwrap();
    assert_eq!(fake.content_bytes(0), 0);
    device.copy_to_device(seg, &host, 2 * MIB).unwrap();
    assert_eq!(fake.read_device(seg, 2 * MIB as usize).unwrap(), before);
    assert_eq!(fake.content_bytes(0), 4 * 4 * KIB);
    let hp = addr(&host);
    device.free_host(host).unwrap();
    assert_eq!(fake.live_host_buffers(), 0);

    assert_eq!(
        fake.call_details(),
        [
            "aclrtMallocHost(size=2097152)".to_owned(),
            format!(
                "aclrtMemcpy(dst={hp}, destMax=2097152, src=0x100000000000, count=2097152, \
                 kind=2)"
            ),
            format!(
                "aclrtMemcpy(dst=0x100000000000, destMax=2097152, src={hp}, count=2097152, \
                 kind=1)"
            ),
            format!("aclrtFreeHost(hostPtr={hp})"),
        ]
    );
    assert_eq!(
        fake.log(),
        [
            "aclrtMallocHost",
            "aclrtMemcpy",
            "aclrtMemcpy",
            "aclrtFreeHost"
        ]
    );

    // Freeing the segment drops its bytes: the next segment at the same address reads zeros.
    device.free(seg, 2 * MIB).unwrap();
    assert_eq!(fake.content_bytes(0), 0);
    assert_eq!(device.malloc(2 * MIB).unwrap(), seg);
    assert!(
        fake.read_device(seg, 2 * MIB as usize)
            .unwrap()
            .iter()
            .all(|&b| b == 0)
    );
    device.free(seg, 2 * MIB).unwrap();
    assert_eq!(fake.used(0), 0);
}

/// torch_memory_saver's pause and resume of an expandable segment, as the sgl-kernel-npu port
/// does it: back up (`aclrtMallocHost`, `aclrtMemcpy` DEVICE_TO_HOST), unmap and free the pages;
/// later create and map new pages at the same addresses and restore (`aclrtMemcpy`
/// HOST_TO_DEVICE).
#[test]
fn mapped_pages_are_backed_up_released_and_restored_at_the_same_addresses() {
    let fake = FakeAcl::new(Variant::Full, GIB, 2);
    let (_platform, mut device) = open(&fake, 1);
    let va = device.reserve_address(8 * MIB).unwrap();
    assert_eq!(va, VA0 + VA_STRIDE);
    let pages = [
        device.create_page(2 * MIB).unwrap(),
        device.create_page(2 * MIB).unwrap(),
    ];
    device.map(va, 2 * MIB, &pages[0]).unwrap();
    device.map(va + 2 * MIB, 2 * MIB, &pages[1]).unwrap();
    // Bytes across the two pages, and a block inside the first.
    fake.write_device(va + 2 * MIB - 3, b"across").unwrap();
    let block = pattern(5000, 0x21);
    fake.write_device(va + 4 * KIB, &block).unwrap();
    let before = fake.read_device(va, 4 * MIB as usize).unwrap();
    assert_eq!(
        &before[(2 * MIB - 3) as usize..(2 * MIB + 3) as usize],
        b"across"
    );
    assert_eq!(fake.content_bytes(1), 4 * 4 * KIB);
    assert_eq!(fake.content_bytes(0), 0);

    fake.clear_log();
    let fake_ref = &fake;
    let (device, host_ptr) = std::thread::scope(|scope| {
        scope
            .spawn(move || {
                let fake = fake_ref;
                let mut device = device;
                // Pause: back up, then give the pages back.
                let mut host = device.alloc_host(4 * MIB).unwrap();
                device.copy_to_host(&mut host, va, 4 * MIB).unwrap();
                device.unmap(va, 2 * MIB).unwrap();
                device.unmap(va + 2 * MIB, 2 * MIB).unwrap();
                for page in pages {
                    device.release_page(page).unwrap();
                }
                // The bytes went with their pages; the backup holds them.
                assert_eq!((fake.live_pages(1), fake.content_bytes(1)), (0, 0));
                assert_eq!(host.as_slice(), &before[..]);
                assert_eq!(fake.read_device(va, 1), Err(PARAM_INVALID), "unmapped");

                // Resume: new pages at the same addresses read zeros until restored.
                let fresh = [
                    device.create_page(2 * MIB).unwrap(),
                    device.create_page(2 * MIB).unwrap(),
                ];
                device.map(va, 2 * MIB, &fresh[0]).unwrap();
                device.map(va + 2 * MIB, 2 * MIB, &fresh[1]).unwrap();
                let zeros = fake.read_device(va, 4 * MIB as usize).unwrap();
                assert!(zeros.iter().all(|&b| b == 0));
                device.copy_to_device(va, &host, 4 * MIB).unwrap();
                assert_eq!(fake.read_device(va, 4 * MIB as usize).unwrap(), before);
                assert_eq!(fake.content_bytes(1), 4 * 4 * KIB);
                let host_ptr = addr(&host);
                device.free_host(host).unwrap();
                assert_eq!(fake.live_host_buffers(), 0);

                device.unmap(va, 2 * MIB).unwrap();
                device.unmap(va + 2 * MIB, 2 * MIB).unwrap();
                for page in fresh {
                    device.release_page(page).unwrap();
                }
                device.release_address(va, 8 * MIB).unwrap();
                (device, host_ptr)
            })
            .join()
            .unwrap()
    });
    let hp = host_ptr;
    let map = |at: u64, handle: u64| {
        format!("aclrtMapMem(virPtr={at:#x}, size=2097152, offset=0, handle={handle:#x}, flags=0)")
    };
    assert_eq!(
        fake.call_details(),
        [
            "aclrtSetDevice(deviceId=1)".to_owned(),
            "aclrtMallocHost(size=4194304)".into(),
            format!(
                "aclrtMemcpy(dst={hp}, destMax=4194304, src=0x810000000000, count=4194304, \
                 kind=2)"
            ),
            "aclrtUnmapMem(virPtr=0x810000000000)".into(),
            "aclrtUnmapMem(virPtr=0x810000200000)".into(),
            "aclrtFreePhysical(handle=0x90000010)".into(),
            "aclrtFreePhysical(handle=0x90000020)".into(),
            malloc_physical_2m(1),
            malloc_physical_2m(1),
            map(va, 0x9000_0030),
            map(va + 2 * MIB, 0x9000_0040),
            format!(
                "aclrtMemcpy(dst=0x810000000000, destMax=4194304, src={hp}, count=4194304, \
                 kind=1)"
            ),
            format!("aclrtFreeHost(hostPtr={hp})"),
            "aclrtUnmapMem(virPtr=0x810000000000)".into(),
            "aclrtUnmapMem(virPtr=0x810000200000)".into(),
            "aclrtFreePhysical(handle=0x90000030)".into(),
            "aclrtFreePhysical(handle=0x90000040)".into(),
            "aclrtReleaseMemAddress(virPtr=0x810000000000)".into(),
        ]
    );
    assert_eq!([fake.used(1), fake.live_pages(1), fake.mappings(1)], [0; 3]);
    drop(device);
}

#[test]
fn bytes_belong_to_the_physical_page_wherever_it_is_mapped() {
    let fake = FakeAcl::new(Variant::Full, GIB, 1);
    let (_platform, mut device) = open(&fake, 0);
    let va = device.reserve_address(8 * MIB).unwrap();
    let page = device.create_page(2 * MIB).unwrap();
    device.map(va, 2 * MIB, &page).unwrap();
    fake.write_device(va + 10, b"page bytes").unwrap();
    device.unmap(va, 2 * MIB).unwrap();
    // Unmapped, the page keeps its bytes; mapped elsewhere, it shows them there.
    assert_eq!(fake.content_bytes(0), 4 * KIB);
    device.map(va + 4 * MIB, 2 * MIB, &page).unwrap();
    assert_eq!(
        fake.read_device(va + 4 * MIB + 10, 10).unwrap(),
        b"page bytes"
    );
    device.unmap(va + 4 * MIB, 2 * MIB).unwrap();
    device.release_page(page).unwrap();
    assert_eq!(fake.content_bytes(0), 0);
    device.release_address(va, 8 * MIB).unwrap();
}

#[test]
fn injected_failures_are_other_errors_with_the_code_and_leak_nothing() {
    let fake = FakeAcl::new(Variant::Full, GIB, 1);
    let (_platform, mut device) = open(&fake, 0);
    let seg = device.malloc(2 * MIB).unwrap();
    let data = pattern(4096, 0x33);
    fake.write_device(seg, &data).unwrap();
    let fail = |name: &str| fake.fail_next(name, INJECTED, 1);
    let check = assert_injected;

    fail("aclrtMallocHost");
    check(device.alloc_host(4096).unwrap_err(), "aclrtMallocHost");
    assert_eq!(fake.live_host_buffers(), 0);
    let mut host = device.alloc_host(4096).unwrap();

    // A failed copy to the host copies nothing.
    fail("aclrtMemcpy");
    check(
        device.copy_to_host(&mut host, seg, 4096).unwrap_err(),
        "aclrtMemcpy",
    );
    assert!(host.as_slice().iter().all(|&b| b == 0));
    device.copy_to_host(&mut host, seg, 4096).unwrap();
    assert_eq!(host.as_slice(), &data[..]);

    // A failed copy to the device copies nothing.
    fake.write_device(seg, &[0; 4096]).unwrap();
    fail("aclrtMemcpy");
    check(
        device.copy_to_device(seg, &host, 4096).unwrap_err(),
        "aclrtMemcpy",
    );
    assert_eq!(fake.read_device(seg, 4096).unwrap(), vec![0; 4096]);
    device.copy_to_device(seg, &host, 4096).unwrap();
    assert_eq!(fake.read_device(seg, 4096).unwrap(), data);

    // A failed free gives the buffer back, still live.
    fail("aclrtFreeHost");
    let raw = host.as_ptr();
    let (host, e) = device.free_host(host).unwrap_err();
    check(e, "aclrtFreeHost");
    assert_eq!(host.as_ptr(), raw, "the buffer comes back");
    assert_eq!(host.as_slice(), &data[..], "with its bytes");
    assert_eq!(fake.live_host_buffers(), 1);
    device.free_host(host).unwrap();
    assert_eq!(fake.live_host_buffers(), 0);

    // Every call was tried once more after its failure.
    assert_eq!(fake.calls("aclrtMallocHost"), 2);
    assert_eq!(fake.calls("aclrtMemcpy"), 4);
    assert_eq!(fake.calls("aclrtFreeHost"), 2);
    device.free(seg, 2 * MIB).unwrap();
    assert_eq!((fake.used(0), fake.content_bytes(0)), (0, 0));
}

#[test]
fn out_of_memory_and_unsupported_codes_are_classified() {
    let fake = FakeAcl::new(Variant::Full, GIB, 1);
    let (_platform, mut device) = open(&fake, 0);
    // aclrtMallocHost's out-of-memory codes (207001, and ACL_ERROR_BAD_ALLOC 200000).
    for oom in [207_001, 200_000, 207_018] {
        fake.fail_next("aclrtMallocHost", oom, 1);
        assert_eq!(device.alloc_host(4096).unwrap_err(), VmmError::OutOfMemory);
    }
    // Host memory the host cannot give is 207001 from the fake.
    assert_eq!(
        device.alloc_host(1 << 60).unwrap_err(),
        VmmError::OutOfMemory
    );
    assert_eq!(fake.calls("aclrtMallocHost"), 4);
    // More than Rust can address never reaches ACL.
    assert_eq!(
        device.alloc_host(u64::MAX).unwrap_err(),
        VmmError::OutOfMemory
    );
    assert_eq!(fake.calls("aclrtMallocHost"), 4);
    assert_eq!(fake.live_host_buffers(), 0);

    // 207000 is unsupported on every call; a free gives the buffer back.
    let seg = device.malloc(2 * MIB).unwrap();
    let refuse = |name: &str| fake.fail_next(name, 207_000, 1);
    refuse("aclrtMallocHost");
    assert_eq!(device.alloc_host(4096).unwrap_err(), VmmError::Unsupported);
    let mut host = device.alloc_host(4096).unwrap();
    refuse("aclrtMemcpy");
    assert_eq!(
        device.copy_to_host(&mut host, seg, 4096).unwrap_err(),
        VmmError::Unsupported
    );
    refuse("aclrtMemcpy");
    assert_eq!(
        device.copy_to_device(seg, &host, 4096).unwrap_err(),
        VmmError::Unsupported
    );
    refuse("aclrtFreeHost");
    let (host, e) = device.free_host(host).unwrap_err();
    assert_eq!(e, VmmError::Unsupported);
    assert_eq!(fake.live_host_buffers(), 1);
    device.free_host(host).unwrap();
    assert_eq!(fake.live_host_buffers(), 0);
    device.free(seg, 2 * MIB).unwrap();
}

#[test]
fn copies_larger_than_the_buffer_never_reach_acl() {
    let fake = FakeAcl::new(Variant::Full, GIB, 1);
    let (_platform, mut device) = open(&fake, 0);
    let seg = device.malloc(2 * MIB).unwrap();
    let mut host = device.alloc_host(4096).unwrap();
    fake.clear_log();
    let e = other(device.copy_to_host(&mut host, seg, 4097).unwrap_err());
    assert_eq!(e.code(), Some(INVALID_PARAM));
    assert_eq!(
        e.to_string(),
        "aclrtMemcpy failed with ACL error 100000 (ACL_ERROR_INVALID_PARAM): \
         npu-runtime: 4097 bytes do not fit the host buffer of 4096 bytes"
    );
    let e = other(device.copy_to_device(seg, &host, u64::MAX).unwrap_err());
    assert_eq!(e.code(), Some(INVALID_PARAM));
    // Zero bytes copy nothing and call nothing.
    device.copy_to_host(&mut host, seg, 0).unwrap();
    device.copy_to_device(seg, &host, 0).unwrap();
    assert_eq!(fake.log(), Vec::<String>::new());
    assert_eq!(fake.calls("aclrtMemcpy"), 0);

    // Address 0 is refused before ACL; other addresses that are not device memory, or a copy
    // past the segment's end, are the fake's 107000.
    let e = other(device.copy_to_host(&mut host, 0, 16).unwrap_err());
    assert_eq!(e.code(), Some(INVALID_PARAM));
    assert_eq!(fake.calls("aclrtMemcpy"), 0);
    let e = other(
        device
            .copy_to_host(&mut host, seg + 2 * MIB - 8, 16)
            .unwrap_err(),
    );
    assert_eq!(e.code(), Some(PARAM_INVALID));
    let e = other(device.copy_to_device(0x4000, &host, 16).unwrap_err());
    assert_eq!(e.code(), Some(PARAM_INVALID));
    // A buffer of 0 bytes is the fake's 100000.
    let e = other(device.alloc_host(0).unwrap_err());
    assert_eq!(e.code(), Some(INVALID_PARAM));
    assert_eq!(
        fake.call_details(),
        [
            format!(
                "aclrtMemcpy(dst={}, destMax=4096, src={:#x}, count=16, kind=2)",
                addr(&host),
                seg + 2 * MIB - 8
            ),
            format!(
                "aclrtMemcpy(dst=0x4000, destMax=16, src={}, count=16, kind=1)",
                addr(&host)
            ),
            "aclrtMallocHost(size=0)".into(),
        ]
    );
    device.free_host(host).unwrap();
    device.free(seg, 2 * MIB).unwrap();
    assert_eq!(fake.live_host_buffers(), 0);
}

#[test]
fn the_fake_checks_every_copy_argument() {
    let fake = FakeAcl::new(Variant::Full, GIB, 1);
    let (platform, mut device) = open(&fake, 0);
    let lib = platform.lib();
    let seg = DevicePtr::from_addr(device.malloc(2 * MIB).unwrap()).unwrap();
    let at = |p: DevicePtr, offset: u64| p.offset(offset).unwrap();
    let mut host = lib.malloc_host(8192).unwrap();
    host.as_mut_slice()[..5].copy_from_slice(b"hosty");

    // acl-sys refuses a count above the buffer before ACL is called.
    fake.clear_log();
    assert_eq!(
        code(lib.memcpy_to_host(&mut host, seg, 8193)),
        INVALID_PARAM
    );
    assert_eq!(code(lib.memcpy_to_device(seg, &host, 8193)), INVALID_PARAM);
    assert!(fake.log().is_empty());

    // Device ranges: inside one segment, or contiguous mappings.
    assert_eq!(
        code(lib.memcpy_to_host(&mut host, at(seg, 2 * MIB - 4096), 8192)),
        PARAM_INVALID,
        "past the segment's end"
    );
    let va = DevicePtr::from_addr(device.reserve_address(8 * MIB).unwrap()).unwrap();
    let pages: Vec<_> = (0..2)
        .map(|_| device.create_page(2 * MIB).unwrap())
        .collect();
    device.map(va.addr(), 2 * MIB, &pages[0]).unwrap();
    // A gap after the first page.
    device.map(va.addr() + 4 * MIB, 2 * MIB, &pages[1]).unwrap();
    assert_eq!(
        code(lib.memcpy_to_device(at(va, 2 * MIB - 4096), &host, 8192)),
        PARAM_INVALID,
        "into the gap"
    );
    assert_eq!(
        code(lib.memcpy_to_device(at(va, 2 * MIB), &host, 16)),
        PARAM_INVALID,
        "unmapped"
    );
    assert_eq!(
        fake.write_device(va.addr() + 2 * MIB - 1, b"xy"),
        Err(PARAM_INVALID)
    );
    assert_eq!(fake.read_device(SEG0 - 4096, 1), Err(PARAM_INVALID));
    device.unmap(va.addr() + 4 * MIB, 2 * MIB).unwrap();
    device.map(va.addr() + 2 * MIB, 2 * MIB, &pages[1]).unwrap();
    lib.memcpy_to_device(at(va, 2 * MIB - 2), &host, 5).unwrap();
    assert_eq!(
        fake.read_device(va.addr() + 2 * MIB - 2, 5).unwrap(),
        b"hosty"
    );

    // SAFETY (each `lib.memcpy` below): the host ranges are valid for the kind, or the fake
    // refuses the call before it touches them (it checks host ranges of host-device copies
    // against its own allocations and never dereferences device addresses).
    let mut plain = vec![0u8; 64];
    let plain_ptr = plain.as_mut_ptr().cast::<c_void>();
    let memcpy = |dst: *mut c_void, dst_max: usize, src: *const c_void, n: usize, kind| {
        // SAFETY: see above.
        unsafe { lib.memcpy(dst, dst_max, src, n, kind) }
    };
    // count > destMax, a kind the fake does not copy, null pointers: 100000.
    let seg_ptr = seg.as_ptr();
    let host_ptr = host.as_ptr();
    let d2h = MemcpyKind::DEVICE_TO_HOST;
    assert_eq!(code(memcpy(host_ptr, 15, seg_ptr, 16, d2h)), INVALID_PARAM);
    assert_eq!(
        code(memcpy(host_ptr, 16, seg_ptr, 16, MemcpyKind::DEFAULT)),
        INVALID_PARAM
    );
    assert_eq!(
        code(memcpy(core::ptr::null_mut(), 16, seg_ptr, 16, d2h)),
        INVALID_PARAM
    );
    // Host memory of a host-device copy must come from aclrtMallocHost, within its size.
    assert_eq!(code(memcpy(plain_ptr, 64, seg_ptr, 16, d2h)), PARAM_INVALID);
    let near_end = host_ptr.wrapping_byte_add(8192 - 8);
    assert_eq!(code(memcpy(near_end, 16, seg_ptr, 16, d2h)), PARAM_INVALID);
    memcpy(near_end, 8, seg_ptr, 8, d2h).unwrap();
    // Host to host takes any host memory, but no device memory.
    memcpy(plain_ptr, 64, host_ptr, 5, MemcpyKind::HOST_TO_HOST).unwrap();
    assert_eq!(&plain[..5], b"hosty");
    let plain_ptr = plain.as_mut_ptr().cast::<c_void>();
    assert_eq!(
        code(memcpy(plain_ptr, 64, seg_ptr, 16, MemcpyKind::HOST_TO_HOST)),
        PARAM_INVALID
    );
    // Device to device, across a segment and mappings, overlapping as memmove does.
    let d2d = MemcpyKind::DEVICE_TO_DEVICE;
    let text = b"0123456789";
    fake.write_device(seg.addr(), text).unwrap();
    memcpy(at(seg, 3).as_ptr(), 10, seg_ptr, 10, d2d).unwrap();
    assert_eq!(fake.read_device(seg.addr(), 13).unwrap(), b"0120123456789");
    memcpy(seg_ptr, 10, at(seg, 3).as_ptr(), 10, d2d).unwrap();
    assert_eq!(fake.read_device(seg.addr(), 13).unwrap(), b"0123456789789");
    memcpy(at(va, 2 * MIB - 4).as_ptr(), 8, seg_ptr, 8, d2d).unwrap();
    assert_eq!(
        fake.read_device(va.addr() + 2 * MIB - 4, 8).unwrap(),
        b"01234567"
    );
    // A big overlapping copy that takes several blocks, both ways.
    let big = pattern(300 * KIB as usize, 0x44);
    fake.write_device(seg.addr(), &big).unwrap();
    memcpy(at(seg, 1000).as_ptr(), 300 << 10, seg_ptr, 300 << 10, d2d).unwrap();
    assert_eq!(fake.read_device(seg.addr() + 1000, big.len()).unwrap(), big);
    memcpy(seg_ptr, 300 << 10, at(seg, 1000).as_ptr(), 300 << 10, d2d).unwrap();
    assert_eq!(fake.read_device(seg.addr(), big.len()).unwrap(), big);
    assert_eq!(
        code(memcpy(seg_ptr, 16, at(va, 6 * MIB).as_ptr(), 16, d2d)),
        PARAM_INVALID
    );
    // The detailed log shows each call's arguments.
    let last = fake.call_details().pop().unwrap();
    assert_eq!(
        last,
        format!(
            "aclrtMemcpy(dst={:#x}, destMax=16, src={:#x}, count=16, kind=3)",
            seg.addr(),
            va.addr() + 6 * MIB
        )
    );

    // An unknown host pointer is not freed; a freed buffer cannot be freed again.
    // SAFETY: not an aclrtMallocHost allocation, but the fake only looks the address up in its
    // table, which is what this checks; `plain` outlives the value, which comes back unfreed.
    let stranger = unsafe { HostMem::from_raw(core::ptr::NonNull::new(plain_ptr).unwrap(), 64) };
    let (stranger, e) = lib.free_host(stranger).unwrap_err();
    assert_eq!(e.code(), Some(PARAM_INVALID));
    let _ = stranger.into_raw();
    lib.free_host(host).unwrap();
    assert_eq!(fake.live_host_buffers(), 0);

    // Like every memory call, the host calls need a device set on the calling thread.
    let platform2 = platform.clone();
    std::thread::spawn(move || {
        assert_eq!(code(platform2.lib().malloc_host(4096)), 107_002);
    })
    .join()
    .unwrap();

    device.unmap(va.addr(), 2 * MIB).unwrap();
    device.unmap(va.addr() + 2 * MIB, 2 * MIB).unwrap();
    for page in pages {
        device.release_page(page).unwrap();
    }
    device.release_address(va.addr(), 8 * MIB).unwrap();
    device.free(seg.addr(), 2 * MIB).unwrap();
    assert_eq!((fake.used(0), fake.content_bytes(0)), (0, 0));
}

#[test]
fn device_memory_of_13_gib_holds_no_host_memory_until_written() {
    let fake = FakeAcl::new(Variant::Full, 16 * GIB, 1);
    let (_platform, mut device) = open(&fake, 0);
    // 6 GiB of segments and 7 GiB of 1 GiB pages mapped in one range.
    let segments: Vec<u64> = (0..6).map(|_| device.malloc(GIB).unwrap()).collect();
    let va = device.reserve_address(8 * GIB).unwrap();
    let pages: Vec<_> = (0..7).map(|_| device.create_page(GIB).unwrap()).collect();
    for (i, page) in pages.iter().enumerate() {
        device.map(va + i as u64 * GIB, GIB, page).unwrap();
    }
    assert_eq!(fake.used(0), 13 * GIB);
    assert_eq!(fake.content_bytes(0), 0);

    // A round trip of never-written memory, across two pages, makes no chunk either.
    let mut host = device.alloc_host(64 * MIB).unwrap();
    device
        .copy_to_host(&mut host, va + GIB - 32 * MIB, 64 * MIB)
        .unwrap();
    device
        .copy_to_device(va + 3 * GIB, &host, 64 * MIB)
        .unwrap();
    device.copy_to_device(segments[5], &host, 64 * MIB).unwrap();
    assert_eq!(fake.content_bytes(0), 0);

    // One byte costs one chunk, wherever it lands.
    fake.write_device(segments[3] + GIB - 1, &[1]).unwrap();
    fake.write_device(va + 7 * GIB - 1, &[2]).unwrap();
    assert_eq!(fake.content_bytes(0), 2 * 4 * KIB);
    device
        .copy_to_host(&mut host, va + 7 * GIB - 64 * MIB, 64 * MIB)
        .unwrap();
    assert_eq!(host.as_slice()[(64 * MIB - 1) as usize], 2);
    device.copy_to_device(va, &host, 64 * MIB).unwrap();
    assert_eq!(fake.content_bytes(0), 3 * 4 * KIB);

    device.free_host(host).unwrap();
    for (i, page) in pages.into_iter().enumerate() {
        device.unmap(va + i as u64 * GIB, GIB).unwrap();
        device.release_page(page).unwrap();
    }
    device.release_address(va, 8 * GIB).unwrap();
    for seg in segments {
        device.free(seg, GIB).unwrap();
    }
    assert_eq!((fake.used(0), fake.content_bytes(0)), (0, 0));
    assert_eq!(fake.live_host_buffers(), 0);
}

#[test]
fn a_library_without_the_vmm_symbols_still_copies() {
    let fake = FakeAcl::new(Variant::NoVmm, GIB, 1);
    let (platform, mut device) = open(&fake, 0);
    assert!(!platform.lib().has_vmm());
    assert!(platform.lib().has_host_copies());
    let seg = device.malloc(4096).unwrap();
    fake.write_device(seg, b"still here").unwrap();
    let mut host = device.alloc_host(4096).unwrap();
    device.copy_to_host(&mut host, seg, 4096).unwrap();
    assert_eq!(&host.as_slice()[..10], b"still here");
    device.free_host(host).unwrap();
    device.free(seg, 4096).unwrap();
    assert_eq!(fake.live_host_buffers(), 0);
}
