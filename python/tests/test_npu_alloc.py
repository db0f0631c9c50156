"""The Python package over the fake libascendcl (started by crates/npu-alloc-capi/tests/python.rs
with NPU_ALLOC_LIB, NPU_ALLOC_ACL_LIB, FAKE_ACL_DEVICES=2, FAKE_ACL_CAPACITY=1 GiB and
EXPECTED_STATS, the stats of the same sequence run through the Rust API)."""

import ctypes
import json
import math
import os
import sys
import threading
import unittest

import npu_alloc

MIB = 1 << 20
# The fake's test-only controls: the same library file the runtime loaded, so the same instance.
# On an Ascend box (`cargo xtask test-hw`) the real library has none: those tests are skipped.
try:
    FAKE = ctypes.CDLL(os.environ["NPU_ALLOC_ACL_LIB"])
    FAKE.fake_acl_calls.argtypes = [ctypes.c_char_p]
    FAKE.fake_acl_calls.restype = ctypes.c_uint64
    FAKE.fake_acl_write_device.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
    FAKE.fake_acl_write_device.restype = ctypes.c_int32
    FAKE.fake_acl_read_device.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
    FAKE.fake_acl_read_device.restype = ctypes.c_int32
    HAVE_FAKE = True
except (KeyError, OSError, AttributeError):
    FAKE, HAVE_FAKE = None, False
needs_fake = unittest.skipUnless(HAVE_FAKE, "needs the fake libascendcl's test controls")


def sequence(device):
    """The sequence crates/npu-alloc-capi/tests/python.rs also runs through the Rust API."""
    ptrs = [npu_alloc.malloc(size, device) for size in (1000, 3 * MIB, 25 * MIB, 512, 2 * MIB)]
    npu_alloc.free(ptrs[1])
    npu_alloc.free(ptrs[3])
    return ptrs


@unittest.skipUnless("EXPECTED_STATS" in os.environ, "needs the Rust API's numbers")
class Stats(unittest.TestCase):
    def test_memory_stats_equal_the_rust_api_for_the_same_sequence(self):
        sequence(1)  # device 1 is this test's alone
        expected = json.loads(os.environ["EXPECTED_STATS"])
        self.assertEqual(npu_alloc.memory_stats(1), expected)
        # 1000 + 32 rounds to 1536; 25 MiB + 32 takes its whole 26 MiB segment (the remainder,
        # under 1 MiB, is not split off); 2 MiB + 32 rounds to 2 MiB + 512.
        self.assertEqual(expected["allocated_bytes.all.current"], 1536 + 26 * MIB + 2 * MIB + 512)


class Threads(unittest.TestCase):
    def test_four_threads_allocate_and_free(self):
        # Without a synchronize hook a malloc releases no cached memory: start from none.
        npu_alloc.empty_cache()
        before = npu_alloc.memory_stats(0)["allocation.all.current"]
        errors = []

        def work(seed):
            try:
                live = []
                for i in range(300):
                    live.append(npu_alloc.malloc((seed * 7919 + i * 104729) % (4 * MIB) + 1))
                    if len(live) > 16:
                        npu_alloc.free(live.pop(0))
                for p in live:
                    npu_alloc.free(p)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        stats = npu_alloc.memory_stats(0)
        self.assertEqual(stats["allocation.all.current"], before)
        self.assertGreaterEqual(stats["allocation.all.allocated"], 1200)


class Errors(unittest.TestCase):
    def test_bad_pointers_and_arguments_are_refused(self):
        with self.assertRaises(npu_alloc.NpuAllocError) as e:
            npu_alloc.free(0x1234)
        self.assertEqual(e.exception.status, -3)
        self.assertIn("0x1234", str(e.exception))
        p = npu_alloc.malloc(4096)
        npu_alloc.free(p)
        with self.assertRaises(npu_alloc.NpuAllocError) as e:
            npu_alloc.free(p)
        self.assertEqual(e.exception.status, -3)
        # record_stream and erase_stream of a freed pointer: not a live allocation.
        for call in (npu_alloc.record_stream, npu_alloc.erase_stream):
            with self.assertRaises(npu_alloc.NpuAllocError) as e:
                call(p, 0)
            self.assertEqual(e.exception.status, -3)
        q = npu_alloc.malloc(4096)
        npu_alloc.record_stream(q, 0)
        npu_alloc.erase_stream(q, 0)
        npu_alloc.free(q)
        self.assertEqual(npu_alloc.malloc(0), 0)
        npu_alloc.free(0)
        with self.assertRaises(npu_alloc.NpuAllocError) as e:
            npu_alloc.malloc(1000, device=9)
        self.assertIn("Invalid device argument 9", str(e.exception))
        with self.assertRaises(npu_alloc.NpuAllocError) as e:
            npu_alloc.set_per_process_memory_fraction(math.nan)
        self.assertEqual(e.exception.status, -1)
        with self.assertRaises(TypeError):
            npu_alloc.set_per_process_memory_fraction("half")
        with self.assertRaises(npu_alloc.NpuAllocError) as e:
            with npu_alloc.region("bad\udc80tag"):
                pass
        self.assertEqual(e.exception.status, -1)
        self.assertIn("not UTF-8", str(e.exception))
        with self.assertRaises(npu_alloc.NpuAllocError) as e:
            npu_alloc.pause("never-used")
        self.assertEqual(e.exception.status, -7)
        # Values ctypes would wrap or cut short are refused before C sees them.
        for call in (
            lambda: npu_alloc.malloc(2**64 + 4096),
            lambda: npu_alloc.malloc(4096, device=2**32 + 1),
            lambda: npu_alloc.free(-1),
            lambda: npu_alloc.record_memory_history(True, 2**64),
            lambda: npu_alloc.pause("kv\0junk"),
            lambda: npu_alloc.dump_snapshot("snap.pickle\0.ignored"),
        ):
            with self.assertRaises(ValueError):
                call()
        with self.assertRaises(TypeError):
            npu_alloc.malloc(4096.0)
        pool = npu_alloc.MemPool()
        with npu_alloc.use_mem_pool(pool):
            q = npu_alloc.malloc(1000)
        npu_alloc.free(q)
        pool.release()
        # torch_npu's MemPool(use_on_oom=..., no_split=...): a no_split pool's 1000-byte
        # allocation holds its whole 2 MiB segment.
        whole = npu_alloc.MemPool(use_on_oom=True, no_split=True)
        before = npu_alloc.memory_stats()["allocated_bytes.all.current"]
        with npu_alloc.use_mem_pool(whole):
            q = npu_alloc.malloc(1000)
        self.assertEqual(npu_alloc.memory_stats()["allocated_bytes.all.current"] - before,
                         2 << 20)
        npu_alloc.free(q)
        whole.release()
        with self.assertRaises(npu_alloc.NpuAllocError):
            with npu_alloc.use_mem_pool(pool):
                pass

    def test_out_of_memory_returns_null_with_torch_npus_message(self):
        lib = npu_alloc._load()
        big = 2 * npu_alloc.mem_get_info()[1]
        self.assertIsNone(lib.npu_alloc_malloc(big, 0, None))
        self.assertIn("NPU out of memory. Tried to allocate", npu_alloc._last_error())
        with self.assertRaises(npu_alloc.OutOfMemoryError) as e:
            npu_alloc.malloc(big)
        self.assertIn("NPU out of memory", str(e.exception))
        # torch_npu's throw_on_npumalloc_oom, a run-time setting: refused before the device is
        # asked, with its own message and counter.
        rejected = npu_alloc.memory_stats()["num_oom_rejections"]
        npu_alloc.set_allocator_settings("throw_on_npumalloc_oom:True")
        try:
            with self.assertRaises(npu_alloc.OutOfMemoryError) as e:
                npu_alloc.malloc(big)
            self.assertIn("Allocation was preemptively rejected", str(e.exception))
            self.assertEqual(npu_alloc.memory_stats()["num_oom_rejections"], rejected + 1)
        finally:
            npu_alloc.set_allocator_settings("throw_on_npumalloc_oom:False")


@needs_fake
class MemorySaver(unittest.TestCase):
    def test_an_allocation_in_a_paused_region_is_refused_with_its_status(self):
        with npu_alloc.region("paused-tag"):
            p = npu_alloc.malloc(1000)
        npu_alloc.pause("paused-tag")
        try:
            with npu_alloc.region("paused-tag"):
                with self.assertRaises(npu_alloc.NpuAllocError) as e:
                    npu_alloc.malloc(1000)
            self.assertEqual(e.exception.status, -7)
            self.assertNotIsInstance(e.exception, npu_alloc.OutOfMemoryError)
            self.assertIn("paused", str(e.exception))
        finally:
            npu_alloc.resume("paused-tag")
        npu_alloc.free(p)

    def test_an_empty_tag_is_every_tag_and_regions_leave_in_order(self):
        with npu_alloc.region("order_a", device=0):
            p = npu_alloc.malloc(4096, 0)
        # As torch_memory_saver reads a falsy tag: "" pauses and resumes every tag.
        npu_alloc.pause("")
        with self.assertRaises(npu_alloc.NpuAllocError) as e:
            npu_alloc.pause("order_a")
        self.assertIn("already paused", str(e.exception))
        npu_alloc.resume("")
        npu_alloc.free(p)
        # Left out of order (a generator, asyncio): order_a stays open under order_b, which still
        # takes the allocations, and both end when order_b is left.
        a = npu_alloc.region("order_a", device=0)
        b = npu_alloc.region("order_b", device=0)
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        q = npu_alloc.malloc(4096, 0)
        b.__exit__(None, None, None)
        # No region is open any more: the C library refuses to end one.
        self.assertEqual(npu_alloc._load().npu_alloc_region_end(0), -7)
        # q is order_b's: pausing it gives its segment back to the device.
        free_before = npu_alloc.mem_get_info(0)[0]
        npu_alloc.pause("order_b")
        self.assertGreater(npu_alloc.mem_get_info(0)[0], free_before)
        npu_alloc.resume("order_b")
        npu_alloc.free(q)

    @needs_fake
    def test_disable_leaves_allocations_out_of_the_region_and_releases_its_pool(self):
        # torch_memory_saver's disable(): inside a region, allocations its pause must not touch.
        with self.assertRaises(npu_alloc.NpuAllocError) as e:
            with npu_alloc.disable(device=0):
                pass
        self.assertIn("outside a region", str(e.exception))
        with npu_alloc.region("disable_tag", device=0):
            kept = npu_alloc.malloc(4096, 0)
            with npu_alloc.disable(device=0):
                outside = npu_alloc.malloc(4096, 0)
            back_in = npu_alloc.malloc(4096, 0)
        # 4096 + 32 bytes round to 4608: both region blocks share the tag's 2 MiB segment.
        self.assertEqual(back_in - kept, 4608)
        tags = {t["tag"]: t for t in npu_alloc.memory_saver_stats(0)["tags"]}
        self.assertEqual((tags["disable_tag"]["segments"], tags["disable_tag"]["bytes"]),
                         (1, 2 * MIB))
        npu_alloc.pause("disable_tag")
        try:
            saver = npu_alloc.memory_saver_stats(0)
            self.assertEqual(saver["paused_bytes"]["current"], 2 * MIB)
            self.assertEqual(saver["held_bytes"]["current"] + 2 * MIB,
                             npu_alloc.memory_stats(0)["reserved_bytes.all.current"])
            self.assertTrue({t["tag"]: t for t in saver["tags"]}["disable_tag"]["paused"])
            # The disabled block is still mapped; the region's are not.
            self.assertEqual(FAKE.fake_acl_write_device(outside, b"x", 1), 0)
            self.assertNotEqual(FAKE.fake_acl_write_device(kept, b"x", 1), 0)
        finally:
            npu_alloc.resume("disable_tag")
        resumed = npu_alloc.memory_saver_stats(0)["paused_bytes"]
        self.assertEqual(resumed["current"], 0)
        self.assertGreaterEqual(resumed["peak"], 2 * MIB)
        # The block's pool was released at the block's end: its segment goes back with the free.
        npu_alloc.empty_cache()
        reserved = npu_alloc.memory_stats(0)["reserved_bytes.all.current"]
        npu_alloc.free(outside)
        npu_alloc.empty_cache()
        self.assertEqual(npu_alloc.memory_stats(0)["reserved_bytes.all.current"], reserved - 2 * MIB)
        npu_alloc.free(kept)
        npu_alloc.free(back_in)

    def test_the_torch_memory_saver_singleton_stands_in(self):
        tms = npu_alloc.memory_saver
        self.assertTrue(tms.enabled)
        tms.hook_mode = "torch"
        with self.assertRaises(ValueError):
            tms.hook_mode = "cuda"
        # A margin no device keeps free: a region's new segment runs out of memory.
        with self.assertRaises(NotImplementedError):
            tms.memory_margin_bytes
        tms.memory_margin_bytes = 1 << 50
        try:
            with tms.region("margin_tag"):
                with self.assertRaises(npu_alloc.OutOfMemoryError):
                    npu_alloc.malloc(64 * MIB)
            outside = npu_alloc.malloc(64 * MIB)
            npu_alloc.free(outside)
        finally:
            tms.memory_margin_bytes = 0
        with self.assertRaises(ValueError):
            tms.memory_margin_bytes = -1
        with tms.region("margin_tag"):
            npu_alloc.free(npu_alloc.malloc(64 * MIB))
        with self.assertRaises(NotImplementedError):
            tms.cuda_graph(None)
        with self.assertRaises(NotImplementedError):
            tms.region("singleton_tag", enable_disk_backup=True)
        with tms.configure_subprocess():
            pass
        with self.assertRaises(NotImplementedError):
            tms.region("singleton_tag", cpu_backup_backend="mooncake")
        with self.assertRaises(NotImplementedError):
            tms.set_disk_backup_dir("/tmp")
        # Code written against the package: `import torch_memory_saver` after the alias.
        saved = sys.modules.get("torch_memory_saver")
        try:
            npu_alloc.alias_torch_memory_saver()
            import torch_memory_saver
            self.assertIs(torch_memory_saver.torch_memory_saver, tms)
            self.assertIsInstance(torch_memory_saver.TorchMemorySaver(), npu_alloc.TorchMemorySaver)
            with torch_memory_saver.configure_subprocess():
                pass
        finally:
            if saved is None:
                sys.modules.pop("torch_memory_saver", None)
            else:
                sys.modules["torch_memory_saver"] = saved
        # The C library reads an empty tag as every tag, as tms_pause("") does.
        lib = ctypes.CDLL(os.environ["NPU_ALLOC_LIB"])
        self.assertEqual(lib.npu_alloc_resume(b""), 0)
        # A tag without a region: nothing happens, as upstream (SGLang's "cuda_graph" tag);
        # npu-alloc's own pause refuses it.
        tms.pause("cuda_graph")
        tms.resume("cuda_graph")
        with self.assertRaises(npu_alloc.NpuAllocError) as e:
            npu_alloc.pause("cuda_graph")
        self.assertIn("has no region", str(e.exception))
        with tms.region("singleton_tag"):
            p = npu_alloc.malloc(MIB)
            with tms.disable():
                q = npu_alloc.malloc(MIB)
        tms.pause("singleton_tag")
        try:
            self.assertNotEqual(FAKE.fake_acl_write_device(p, b"x", 1), 0)
            self.assertEqual(FAKE.fake_acl_write_device(q, b"x", 1), 0)
        finally:
            tms.resume("singleton_tag")
        self.assertEqual(FAKE.fake_acl_write_device(p, b"x", 1), 0)
        npu_alloc.free(p)
        npu_alloc.free(q)

    def test_cpu_backups_are_read_back_and_kept_when_retained(self):
        with npu_alloc.region("backed", enable_cpu_backup=True):
            p = npu_alloc.malloc(MIB)
        with npu_alloc.region("unbacked"):
            q = npu_alloc.malloc(MIB)
        data = b"weights!" * 8
        self.assertEqual(FAKE.fake_acl_write_device(p, data, len(data)), 0)
        # In use, never paused: no backup (upstream's None).
        self.assertIsNone(npu_alloc.cpu_backup(p, len(data)))
        tms = npu_alloc.memory_saver
        self.assertFalse(tms.retain_cpu_backup)
        tms.retain_cpu_backup = True
        try:
            npu_alloc.pause("backed")
            npu_alloc.pause("unbacked")
            self.assertEqual(npu_alloc.cpu_backup(p + 8, 16), data[8:24])
            with self.assertRaises(npu_alloc.NpuAllocError) as e:
                npu_alloc.cpu_backup(q, 8)
            self.assertIn("without a CPU backup", str(e.exception))
            npu_alloc.resume("unbacked")
            npu_alloc.resume("backed")
            # Kept by the resume: the pause's bytes, also after the memory changed.
            self.assertEqual(FAKE.fake_acl_write_device(p, b"W", 1), 0)
            self.assertEqual(npu_alloc.cpu_backup(p, 8), data[:8])
            # The stand-in's get_cpu_backup, over a stand-in torch: a copy, or the host memory.
            x = _Namespace(device=_Namespace(type="npu"), is_contiguous=lambda: True,
                           numel=lambda: 4, element_size=lambda: 4, data_ptr=lambda: p,
                           dtype="float32", shape=(2, 2))
            saved = sys.modules.get("torch")
            sys.modules["torch"] = _HostTorch
            try:
                copy = tms.get_cpu_backup(x)
                self.assertEqual(bytes(copy.memory), data[:16])
                self.assertEqual(copy.views, ["float32", (2, 2)])
                view = tms.get_cpu_backup(x, zero_copy=True)
                self.assertEqual(bytes(view.memory), data[:16])
                outside = npu_alloc.malloc(MIB)
                x.data_ptr = lambda: outside
                with self.assertRaises(npu_alloc.NpuAllocError) as e:
                    tms.get_cpu_backup(x)
                self.assertIn("no memory-saver segment holds", str(e.exception))
                npu_alloc.free(outside)
            finally:
                if saved is None:
                    sys.modules.pop("torch", None)
                else:
                    sys.modules["torch"] = saved
        finally:
            tms.retain_cpu_backup = False
        npu_alloc.pause("backed")
        npu_alloc.resume("backed")
        # Not retained any more: the resume freed it.
        self.assertIsNone(npu_alloc.cpu_backup(p, 8))
        npu_alloc.free(p)
        npu_alloc.free(q)

    def test_pause_and_resume_with_cpu_backup_keep_the_bytes(self):
        with npu_alloc.region("weights", enable_cpu_backup=True):
            p = npu_alloc.malloc(MIB)
        data = bytes(range(256)) * 16
        self.assertEqual(FAKE.fake_acl_write_device(p, data, len(data)), 0)
        free_before, _ = npu_alloc.mem_get_info()
        npu_alloc.pause("weights")
        free_paused, _ = npu_alloc.mem_get_info()
        # 1 MiB + 32 is a large-pool request: the tag's segment is 20 MiB, all of it given back.
        self.assertEqual(free_paused - free_before, 20 * MIB)
        npu_alloc.resume("weights")
        back = ctypes.create_string_buffer(len(data))
        self.assertEqual(FAKE.fake_acl_read_device(p, back, len(data)), 0)
        self.assertEqual(back.raw, data)
        self.assertEqual(npu_alloc.mem_get_info()[0], free_before)
        npu_alloc.free(p)


@needs_fake  # two devices
class Pools(unittest.TestCase):
    def test_pools_are_numbered_per_process_and_entered_once(self):
        # torch numbers MemPools with one counter per process, whatever their device.
        a, b = npu_alloc.MemPool(0), npu_alloc.MemPool(1)
        self.assertEqual(b.id[1], a.id[1] + 1)
        self.assertEqual(a.use_count(), 1)
        with npu_alloc.use_mem_pool(a):
            self.assertEqual(a.use_count(), 2)
            # torch: "beginAllocateToPool: already recording to mempool_id".
            with self.assertRaises(npu_alloc.NpuAllocError) as e:
                with npu_alloc.use_mem_pool(a):
                    pass
            self.assertIn("already allocating", str(e.exception))
            self.assertEqual(a.use_count(), 2)
            # Another pool nests.
            with npu_alloc.use_mem_pool(b):
                self.assertEqual(b.use_count(), 2)
        self.assertEqual((a.use_count(), b.use_count()), (1, 1))
        a.release()
        with self.assertRaises(npu_alloc.NpuAllocError):
            a.use_count()
        # Kept to the end: releasing it would empty its cache, a synchronization that device
        # 1's stats, compared with the Rust API's in Stats, do not expect.
        _KEPT.append(b)


# Objects kept alive until the process exits.
_KEPT = []


class Summary(unittest.TestCase):
    def test_the_summary_helpers_and_resets_read_torchs_stats(self):
        p = npu_alloc.malloc(3 * MIB, 0)
        s = npu_alloc.memory_stats(0)
        self.assertEqual(
            [npu_alloc.memory_allocated(0), npu_alloc.max_memory_allocated(0),
             npu_alloc.memory_reserved(0), npu_alloc.max_memory_reserved(0)],
            [s["allocated_bytes.all.current"], s["allocated_bytes.all.peak"],
             s["reserved_bytes.all.current"], s["reserved_bytes.all.peak"]])
        text = npu_alloc.memory_summary(0)
        self.assertIn("PyTorch NPU memory summary, device ID 0 ", text)
        full, short = text.count("\n"), npu_alloc.memory_summary(0, abbreviated=True).count("\n")
        self.assertLess(short, full)
        npu_alloc.free(p)
        # Peaks fall to the current values; accumulated totals and counters to 0.
        npu_alloc.reset_peak_memory_stats(0)
        self.assertEqual(npu_alloc.max_memory_allocated(0), npu_alloc.memory_allocated(0))
        npu_alloc.reset_accumulated_memory_stats(0)
        s = npu_alloc.memory_stats(0)
        self.assertEqual((s["allocated_bytes.all.allocated"], s["num_device_alloc"]), (0, 0))
        with self.assertRaises(npu_alloc.NpuAllocError):
            npu_alloc.reset_peak_memory_stats(7)


@needs_fake
class Streams(unittest.TestCase):
    def test_erase_stream_undoes_record_stream(self):
        pending = FAKE.fake_acl_pending_events
        pending.restype = ctypes.c_uint64
        p = npu_alloc.malloc(4096)  # binds device 0 to this thread, as ACL's stream calls need
        stream = ctypes.c_void_p()
        self.assertEqual(FAKE.aclrtCreateStream(ctypes.byref(stream)), 0)
        before = pending()
        # Used on another stream: the free waits for an event recorded there.
        npu_alloc.record_stream(p, stream.value)
        npu_alloc.free(p)
        self.assertEqual(pending(), before + 1)
        # Erased again: the free records nothing.
        q = npu_alloc.malloc(4096)
        npu_alloc.record_stream(q, stream.value)
        npu_alloc.erase_stream(q, stream.value)
        npu_alloc.free(q)
        self.assertEqual(pending(), before + 1)
        FAKE.fake_acl_complete_all_events()
        npu_alloc.empty_cache()
        self.assertEqual(FAKE.aclrtDestroyStream(stream), 0)

    def test_a_free_that_records_events_on_another_device_keeps_the_callers_device(self):
        # torch_npu caches its thread's device: a free must leave the binding as it found it.
        device = ctypes.c_int(-1)
        p = npu_alloc.malloc(4096, 1)
        self.assertEqual(FAKE.aclrtSetDevice(1), 0)
        stream = ctypes.c_void_p()
        self.assertEqual(FAKE.aclrtCreateStream(ctypes.byref(stream)), 0)
        npu_alloc.record_stream(p, stream.value)
        self.assertEqual(FAKE.aclrtSetDevice(0), 0)
        q = npu_alloc.malloc(4096, 0)  # the library's last binding is device 0 too
        recorded = FAKE.fake_acl_calls(b"aclrtRecordEvent")
        npu_alloc.free(p)  # binds device 1 to record its event on device 1's stream
        self.assertEqual(FAKE.fake_acl_calls(b"aclrtRecordEvent"), recorded + 1)
        self.assertEqual(FAKE.aclrtGetDevice(ctypes.byref(device)), 0)
        self.assertEqual(device.value, 0)
        npu_alloc.free(q)
        # A free that makes no ACL call binds nothing, and costs the next malloc no bind.
        sets = FAKE.fake_acl_calls(b"aclrtSetDevice")
        for _ in range(3):
            npu_alloc.free(npu_alloc.malloc(4096, 0))
        self.assertEqual(FAKE.fake_acl_calls(b"aclrtSetDevice"), sets)
        FAKE.fake_acl_complete_all_events()
        npu_alloc.empty_cache()
        self.assertEqual(FAKE.aclrtSetDevice(1), 0)
        self.assertEqual(FAKE.aclrtDestroyStream(stream), 0)
        self.assertEqual(FAKE.aclrtSetDevice(0), 0)

    def test_a_malloc_naming_another_device_allocates_there_and_keeps_the_callers(self):
        # The library bound device 1 last; torch then moved the thread to device 0 behind its
        # back. A miss on device 1 must still allocate on device 1, and leave device 0 bound.
        device = ctypes.c_int(-1)
        npu_alloc.free(npu_alloc.malloc(1000, 1))
        self.assertEqual(FAKE.aclrtSetDevice(0), 0)
        p = npu_alloc.malloc(30 * MIB, 1)
        self.assertEqual(FAKE.aclrtGetDevice(ctypes.byref(device)), 0)
        self.assertEqual(device.value, 0)
        # The fake's device 1 addresses start at 0x110000000000 (device 0's at 0x100000000000).
        self.assertGreaterEqual(p, 0x110000000000)
        npu_alloc.free(p)
        npu_alloc.empty_cache()

    def test_with_a_synchronize_hook_a_free_drains_before_it_records_events(self):
        recorded = lambda: FAKE.fake_acl_calls(b"aclrtRecordEvent")
        seen = []
        p = npu_alloc.malloc(4096)
        stream = ctypes.c_void_p()
        self.assertEqual(FAKE.aclrtCreateStream(ctypes.byref(stream)), 0)
        npu_alloc.set_synchronize_hook(lambda device: seen.append(("synchronize", recorded())))
        npu_alloc.set_drain_hook(lambda device: seen.append(("drain", device, recorded())))
        try:
            before = recorded()
            npu_alloc.record_stream(p, stream.value)
            npu_alloc.free(p)
            # Drained once, before the event of the free was recorded.
            self.assertEqual(seen, [("drain", 0, before)])
            self.assertEqual(recorded(), before + 1)
            # A plain free drains nothing.
            npu_alloc.free(npu_alloc.malloc(4096))
            self.assertEqual(len(seen), 1)
        finally:
            npu_alloc.set_drain_hook(None)
            npu_alloc.set_synchronize_hook(None)
        FAKE.fake_acl_complete_all_events()
        npu_alloc.empty_cache()
        self.assertEqual(FAKE.aclrtDestroyStream(stream), 0)


@needs_fake
class Hook(unittest.TestCase):
    def test_a_hook_that_calls_back_in_is_not_called_again(self):
        seen = []

        def hook(device):
            try:
                npu_alloc.empty_cache()  # would need this hook again: refused
            except npu_alloc.NpuAllocError as e:
                seen.append(str(e))

        npu_alloc.set_synchronize_hook(hook)
        try:
            npu_alloc.empty_cache()
        finally:
            npu_alloc.set_synchronize_hook(None)
        self.assertTrue(seen, "the inner call was refused")
        self.assertIn("called back into npu-alloc", seen[0])

    def test_the_synchronize_hook_runs_before_memory_goes_back(self):
        seen = []
        npu_alloc.set_synchronize_hook(lambda device: seen.append((device, FAKE.fake_acl_calls(b"aclrtFree"))))
        try:
            p = npu_alloc.malloc(30 * MIB)
            npu_alloc.free(p)
            frees = FAKE.fake_acl_calls(b"aclrtFree")
            npu_alloc.empty_cache()
            # Once for each device the library has opened (device 0 here, and device 1 if an
            # earlier test used it), each before any aclrtFree.
            devices = [d for d, _ in seen]
            self.assertIn(0, devices)
            self.assertEqual(sorted(devices), sorted(set(devices)))
            self.assertTrue(all(0 <= d < 2 for d in devices), devices)
            self.assertEqual([f for _, f in seen], [frees] * len(seen), "before any aclrtFree")
            self.assertGreater(FAKE.fake_acl_calls(b"aclrtFree"), frees)
        finally:
            npu_alloc.set_synchronize_hook(None)

    def test_a_failing_hook_gives_nothing_back(self):
        def fail(device):
            raise RuntimeError("queue not drained")

        npu_alloc.set_synchronize_hook(fail)
        try:
            npu_alloc.free(npu_alloc.malloc(40 * MIB))
            frees = FAKE.fake_acl_calls(b"aclrtFree")
            with self.assertRaises(npu_alloc.NpuAllocError) as e:
                npu_alloc.empty_cache()
            self.assertIn("synchronize hook failed", str(e.exception))
            self.assertIsInstance(e.exception.__cause__, RuntimeError)
            self.assertEqual(str(e.exception.__cause__), "queue not drained")
            self.assertEqual(FAKE.fake_acl_calls(b"aclrtFree"), frees)
            # A pool whose release failed can be released again.
            pool = npu_alloc.MemPool()
            with self.assertRaises(npu_alloc.NpuAllocError):
                pool.release()
            with npu_alloc.use_mem_pool(pool):
                pass
            npu_alloc.set_synchronize_hook(None)
            pool.release()
            with self.assertRaises(npu_alloc.NpuAllocError):
                with npu_alloc.use_mem_pool(pool):
                    pass
        finally:
            npu_alloc.set_synchronize_hook(None)


    def test_a_hook_failure_in_a_call_torch_made_is_not_a_later_errors_cause(self):
        def fail(device):
            raise RuntimeError("queue not drained")

        npu_alloc.set_synchronize_hook(fail)
        try:
            # torch_npu's empty_cache calls the reset hook, whose failure Python never sees.
            npu_alloc._load().npu_alloc_reset(False)
            with self.assertRaises(npu_alloc.NpuAllocError) as e:
                npu_alloc.set_per_process_memory_fraction(0.5, 99)
            self.assertIsNone(e.exception.__cause__)
        finally:
            npu_alloc.set_synchronize_hook(None)


class CurrentDevice(unittest.TestCase):
    def test_no_device_means_torchs_current_device_once_torch_npu_is_imported(self):
        import types

        self.assertEqual(npu_alloc._current_device(), 0)
        torch = types.ModuleType("torch")
        # A device the fake does not have (it has 2): every call names it, and nothing changes.
        torch.npu = types.SimpleNamespace(current_device=lambda: 7)
        saved = {name: sys.modules.get(name) for name in ("torch", "torch_npu")}
        sys.modules["torch"] = torch
        try:
            # torch alone (torch_npu not imported) has no NPU device.
            self.assertEqual(npu_alloc._current_device(), 0)
            sys.modules["torch_npu"] = types.ModuleType("torch_npu")
            self.assertEqual(npu_alloc._current_device(), 7)
            for call in (lambda: npu_alloc.malloc(1000), npu_alloc.memory_stats,
                         npu_alloc.mem_get_info, npu_alloc.MemPool,
                         lambda: npu_alloc.set_per_process_memory_fraction(0.5)):
                with self.assertRaises(npu_alloc.NpuAllocError) as e:
                    call()
                self.assertIn("device argument 7", str(e.exception))
                self.assertEqual(e.exception.status, -1)  # InvalidArgument
        finally:
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module


@needs_fake
class OomPath(unittest.TestCase):
    def test_without_a_hook_out_of_memory_keeps_the_cache_and_with_one_releases_it(self):
        npu_alloc.set_synchronize_hook(None)
        npu_alloc.free(npu_alloc.malloc(600 * MIB))
        reserved = npu_alloc.memory_stats(0)["reserved_bytes.all.current"]
        frees = FAKE.fake_acl_calls(b"aclrtFree")
        # Queued host work might still use the cached 600 MiB: nothing is given back.
        with self.assertRaises(npu_alloc.OutOfMemoryError):
            npu_alloc.malloc(700 * MIB)
        self.assertEqual(npu_alloc.memory_stats(0)["reserved_bytes.all.current"], reserved)
        self.assertEqual(FAKE.fake_acl_calls(b"aclrtFree"), frees)
        seen = []
        npu_alloc.set_synchronize_hook(lambda device: seen.append((device, FAKE.fake_acl_calls(b"aclrtFree"))))
        try:
            p = npu_alloc.malloc(700 * MIB)
            self.assertEqual(seen[0], (0, frees), "the hook ran before the cache went back")
            self.assertGreater(FAKE.fake_acl_calls(b"aclrtFree"), frees)
            npu_alloc.free(p)
        finally:
            npu_alloc.set_synchronize_hook(None)
            npu_alloc.empty_cache()


class Selftest(unittest.TestCase):
    def test_selftest_prints_a_summary(self):
        import subprocess

        # A process of its own: its own runtime and its own instance of the fake.
        out = subprocess.run([sys.executable, "-m", "npu_alloc", "--selftest"],
                             capture_output=True, text=True, check=True).stdout
        self.assertIn("pause        gave back 20971520 bytes", out)
        self.assertIn("allocation.all.current       0", out)
        self.assertIn("num_ooms                     0", out)
        self.assertIn("allocated_bytes.all.peak     26216960", out)

    def test_a_library_that_cannot_load_fails_with_its_message_and_no_traceback(self):
        import os
        import subprocess

        env = dict(os.environ, NPU_ALLOC_ACL_LIB="/nonexistent/libascendcl.so")
        done = subprocess.run([sys.executable, "-m", "npu_alloc", "--selftest"],
                              capture_output=True, text=True, env=env)
        self.assertEqual(done.returncode, 1)
        self.assertIn("selftest failed: ", done.stderr)
        self.assertIn("libascendcl.so", done.stderr)
        self.assertNotIn("Traceback", done.stderr)


@needs_fake
class VirtAddrCache(unittest.TestCase):
    def test_the_pages_are_unmapped_kept_and_mapped_again(self):
        with self.assertRaisesRegex(npu_alloc.NpuAllocError, "please enable expandable_segments"):
            npu_alloc.empty_virt_addr_cache()
        npu_alloc.set_allocator_settings("expandable_segments:True")
        try:
            npu_alloc.empty_cache()  # what earlier tests left cached goes first
            npu_alloc.free(npu_alloc.malloc(30 * MIB))
            reserved = npu_alloc.memory_reserved(0)
            created = FAKE.fake_acl_calls(b"aclrtMallocPhysical")
            freed = FAKE.fake_acl_calls(b"aclrtFreePhysical")
            npu_alloc.empty_virt_addr_cache()
            self.assertEqual(npu_alloc.memory_reserved(0), reserved - 40 * MIB)
            self.assertEqual(FAKE.fake_acl_calls(b"aclrtFreePhysical"), freed)
            p = npu_alloc.malloc(30 * MIB)
            self.assertEqual(FAKE.fake_acl_calls(b"aclrtMallocPhysical"), created)
            npu_alloc.free(p)
            npu_alloc.empty_cache()
            self.assertEqual(FAKE.fake_acl_calls(b"aclrtFreePhysical"), freed + 2)
        finally:
            npu_alloc.set_allocator_settings("expandable_segments:False")
            npu_alloc.empty_cache()


class _Namespace:
    """A bare attribute bag for the mock modules."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)


class _HostTensor:
    """A stand-in torch's CPU tensor: host memory (a ctypes array) and the views asked of it."""

    def __init__(self, memory):
        self.memory, self.views = memory, []

    def data_ptr(self):
        return ctypes.addressof(self.memory)

    def view(self, what):
        self.views.append(what)
        return self


# A stand-in torch for get_cpu_backup: the two ways it makes a CPU tensor.
_HostTorch = _Namespace(
    uint8="uint8",
    empty=lambda n, dtype: _HostTensor((ctypes.c_uint8 * n)()),
    frombuffer=lambda memory, dtype: _HostTensor(memory),
)


class _MockNpuAllocator:
    """torch_npu's ``_npu_NPUAllocator``: records the hook addresses it is given."""

    def __init__(self):
        self.hooks = {}

    def __getattr__(self, name):
        if name.startswith("set_"):
            return lambda address: self.hooks.__setitem__(name, address)
        raise AttributeError(name)


class _MockPluggable:
    def __init__(self, path, alloc_fn, free_fn):
        self.args = (path, alloc_fn, free_fn)
        self._allocator = _MockNpuAllocator()

    def allocator(self):
        return self._allocator


class Install(unittest.TestCase):
    """``install()`` against a stand-in torch and torch_npu that call what it hands over as
    torch_npu does (the Python side; the hooks' C types are the C test's)."""

    def setUp(self):
        self.calls = {"lazy_init": 0, "swaps": [], "synchronize": []}
        calls = self.calls

        class NPUGraph:
            def capture_begin(self, pool=None, capture_error_mode="global"):
                return "captured"

        def lazy_init():
            calls["lazy_init"] += 1

        def swap(alloc):
            if calls.get("refuse_swap"):
                raise RuntimeError("Can't swap an already initialized allocator")
            calls["swaps"].append(alloc)

        self.torch = _Namespace(npu=_Namespace(
            current_device=lambda: calls.get("current_device", 0),
            synchronize=lambda device: calls["synchronize"].append(device)))
        self.torch_npu = _Namespace(
            npu=_Namespace(
                memory=_Namespace(NPUPluggableAllocator=_MockPluggable,
                                  change_current_allocator=swap),
                graphs=_Namespace(NPUGraph=NPUGraph),
                _lazy_init=lazy_init),
            _C=_Namespace(_npu_getCurrentRawStream=lambda device: 0))
        self.saved_env = os.environ.get("MULTI_STREAM_MEMORY_REUSE")
        os.environ.pop("MULTI_STREAM_MEMORY_REUSE", None)
        self.sys = sys
        sys.modules["torch"], sys.modules["torch_npu"] = self.torch, self.torch_npu

    def tearDown(self):
        self.sys.modules.pop("torch", None)
        self.sys.modules.pop("torch_npu", None)
        npu_alloc._installed = None
        npu_alloc._torch_npu_to_start = None
        npu_alloc.set_synchronize_hook(None)
        npu_alloc.set_drain_hook(None)
        npu_alloc.record_memory_history(False)
        if self.saved_env is None:
            os.environ.pop("MULTI_STREAM_MEMORY_REUSE", None)
        else:
            os.environ["MULTI_STREAM_MEMORY_REUSE"] = self.saved_env

    def test_install_hands_over_the_hooks_and_answers_torch_npus_memory_calls(self):
        alloc = npu_alloc.install()
        self.assertEqual(alloc.args, (npu_alloc.library_path(), "npu_alloc_malloc", "npu_alloc_free"))
        lib = npu_alloc._load(start=False)
        address = lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        self.assertEqual(alloc.allocator().hooks, {
            "set_init_fn": address("npu_alloc_init"),
            "set_reset_fn": address("npu_alloc_reset"),
            "set_memory_fraction_fn": address("npu_alloc_set_memory_fraction"),
            "set_base_alloc_fn": address("npu_alloc_base_alloc"),
            "set_reset_peak_status_fn": address("npu_alloc_reset_peak_stats"),
        })
        self.assertEqual(self.calls["swaps"], [alloc])
        # Once only; torch_npu is not started by install() itself.
        self.assertIs(npu_alloc.install(), alloc)
        self.assertEqual(self.calls["swaps"], [alloc])
        self.assertEqual(self.calls["lazy_init"], 0)
        self.assertEqual(os.environ["MULTI_STREAM_MEMORY_REUSE"], "2")

        # The first call that may start the library starts torch_npu first, and only that one.
        c = self.torch_npu._C
        p = npu_alloc.malloc(3 * MIB, 0)
        self.assertEqual(self.calls["lazy_init"], 1)
        nested = c._npu_memoryStats(0)
        self.assertEqual(self.calls["lazy_init"], 1)
        flat = npu_alloc.memory_stats(0)
        self.assertEqual(nested["allocated_bytes"]["all"]["current"],
                         flat["allocated_bytes.all.current"])
        self.assertEqual(nested["num_ooms"], flat["num_ooms"])
        self.assertEqual(nested["oversize_allocations"]["peak"], flat["oversize_allocations.peak"])
        flattened = {}

        def add(prefix, obj):  # torch_npu's _recurse_add_to_result
            for k, v in obj.items():
                if isinstance(v, dict):
                    add(prefix + k + ".", v)
                else:
                    flattened[prefix + k] = v
        add("", nested)
        self.assertEqual(flattened, flat)

        c._npu_resetPeakMemoryStats(0)
        c._npu_resetAccumulatedMemoryStats(0)
        self.assertEqual(npu_alloc.memory_stats(0)["allocation.all.allocated"], 0)

        self.assertFalse(c._npu_isHistoryEnabled())
        # "state" keeps one entry, as torch_npu's binding does; "all" the last max_entries.
        c._npu_record_memory_history("state", "all", "all", 2**63 - 1)
        self.assertTrue(c._npu_isHistoryEnabled())
        npu_alloc.free(npu_alloc.malloc(1000, 0))
        self.assertEqual(len(c._npu_memorySnapshot(None)["device_traces"][0]), 1)
        with self.assertRaisesRegex(npu_alloc.NpuAllocError, "expected state"):
            c._npu_record_memory_history("some", "all", "all", 10)
        c._npu_record_memory_history("all", "all", "all", 2**63 - 1)
        npu_alloc.free(p)
        snap = c._npu_memorySnapshot(None)
        self.assertIn("segments", snap)
        actions = [e["action"] for e in snap["device_traces"][0]]
        self.assertEqual(actions[-2:], ["free_requested", "free_completed"])
        pool = npu_alloc.MemPool(0)
        with npu_alloc.use_mem_pool(pool):
            q = npu_alloc.malloc(1000, 0)
        pooled = c._npu_memorySnapshot(pool.id)["segments"]
        self.assertEqual([s["segment_pool_id"] for s in pooled], [pool.id])
        npu_alloc.free(q)
        pool.release()
        c._npu_record_memory_history(None, None, "all", 0)
        self.assertFalse(c._npu_isHistoryEnabled())
        c._npu_memorySnapshot(None)
        npu_alloc.set_per_process_memory_fraction(0.75, 0)
        self.assertEqual(c._npu_getMemoryFraction(0), 0.75)
        npu_alloc.set_per_process_memory_fraction(1.0, 0)
        with self.assertRaisesRegex(npu_alloc.NpuAllocError, "expandable_segments"):
            c._npu_emptyVirtAddrCache()
        # torch_npu's _set_allocator_settings: a key it does not take there raises ValueError,
        # as torch_npu's TORCH_CHECK_VALUE, and nothing applies.
        with self.assertRaisesRegex(ValueError, "does not take page_size"):
            c._npu_npuCachingAllocator_set_allocator_settings("max_split_size_mb:64,page_size:1g")
        c._npu_npuCachingAllocator_set_allocator_settings("max_split_size_mb:64")
        self.assertEqual(npu_alloc.memory_stats(0)["max_split_size"], -1)  # the start's, as torch_npu
        # Every run-time call resets max_split_size_mb: this one puts the defaults back.
        c._npu_npuCachingAllocator_set_allocator_settings("max_non_split_rounding_mb:20")

        # Graph capture would hand the capture's memory to other tensors: refused.
        with self.assertRaisesRegex(npu_alloc.NpuAllocError, "NPU graph capture"):
            self.torch_npu.npu.graphs.NPUGraph().capture_begin()

    def test_a_refused_swap_installs_nothing(self):
        self.calls["refuse_swap"] = True
        with self.assertRaisesRegex(RuntimeError, "already initialized"):
            npu_alloc.install()
        self.assertIsNone(npu_alloc._installed)
        self.assertFalse(hasattr(self.torch_npu._C, "_npu_memoryStats"))
        self.assertNotIn("MULTI_STREAM_MEMORY_REUSE", os.environ)
        self.assertEqual(self.torch_npu.npu.graphs.NPUGraph().capture_begin(), "captured")

    def test_an_unsafe_stream_reuse_mode_is_warned_about(self):
        os.environ["MULTI_STREAM_MEMORY_REUSE"] = "1"
        with self.assertWarnsRegex(RuntimeWarning, "MULTI_STREAM_MEMORY_REUSE=1"):
            npu_alloc.install()
        self.assertEqual(os.environ["MULTI_STREAM_MEMORY_REUSE"], "1")

    def test_oom_snapshot_enable_dumps_a_snapshot_at_out_of_memory(self):
        import glob
        import pickle
        import tempfile
        saved = {k: os.environ.get(k) for k in ("OOM_SNAPSHOT_ENABLE", "OOM_SNAPSHOT_PATH")}
        seen = []
        with tempfile.TemporaryDirectory() as tmp:
            os.environ.update(OOM_SNAPSHOT_ENABLE="1", OOM_SNAPSHOT_PATH=tmp)
            try:
                npu_alloc.install()
                self.assertTrue(self.torch_npu._C._npu_isHistoryEnabled())
                self.torch_npu._C._npu_attach_out_of_memory_observer(
                    lambda *args: seen.append(args))
                with self.assertRaises(npu_alloc.OutOfMemoryError):
                    npu_alloc.malloc(8 << 30, 0)
                (path,) = glob.glob(os.path.join(tmp, "oom_snapshot_%d_*.pickle" % os.getpid()))
                with open(path, "rb") as f:
                    snap = pickle.load(f)
                self.assertIn("oom", [e["action"] for e in snap["device_traces"][0]])
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        # The observer torch_npu's binding attached: (device, segment size, total, free).
        self.assertEqual(len(seen), 1)
        self.assertEqual(seen[0][:3], (0, (8 << 30) + (2 << 20), 1 << 30))

    def test_a_stream_reuse_mode_torch_npu_reads_as_2_is_not_warned_about(self):
        import warnings
        os.environ["MULTI_STREAM_MEMORY_REUSE"] = " 02"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            npu_alloc.install()

    def test_a_saver_region_without_install_warns_once(self):
        del npu_alloc._warned_not_installed[:]
        with self.assertWarnsRegex(RuntimeWarning, "without npu_alloc.install"):
            with npu_alloc.memory_saver.region("not_installed"):
                pass
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with npu_alloc.memory_saver.region("not_installed"):
                pass

    def test_devices_are_read_as_torch_reads_them(self):
        self.assertEqual(npu_alloc._device("npu:1"), 1)
        self.calls["current_device"] = 1
        self.assertEqual(npu_alloc._device("npu"), 1)  # the current device
        self.assertEqual(npu_alloc._device(_Namespace(type="npu", index=1)), 1)
        self.assertEqual(npu_alloc._device(_Namespace(type="npu", index=None)), 1)
        for bad in ("cuda:0", "npu:x", _Namespace(type="cpu", index=None)):
            with self.assertRaises(ValueError):
                npu_alloc._device(bad)


if __name__ == "__main__":
    unittest.main()
