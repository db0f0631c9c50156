"""npu-alloc from Python: PyTorch's caching allocator for Ascend NPUs, through its C library.

Standard library only (ctypes). Where the library is found:

1. ``NPU_ALLOC_LIB``: a path to ``libnpu_alloc.so``;
2. ``libnpu_alloc.so`` next to this package;
3. the repository's ``target/release`` then ``target/debug`` (a checkout).

The library finds ``libascendcl.so`` itself (``NPU_ALLOC_ACL_LIB``, else the CANN install
search; see docs/c-abi.md) and reads ``PYTORCH_NPU_ALLOC_CONF``.

With torch_npu, ``install()`` makes npu-alloc torch's allocator (call it right after
``import torch_npu``, before any NPU work). torch_npu forwards only allocations, frees and a few
hooks to a pluggable allocator; ``install()`` also points ``torch.npu.memory``'s stats, snapshot
and history calls at npu-alloc's. Pools and the memory saver are this module's
(docs/c-abi.md has the table).
"""

import contextlib
import ctypes
import json
import operator
import os
import re
import sys
import threading

__all__ = [
    "NpuAllocError", "OutOfMemoryError", "library_path", "malloc", "free", "memory_stats",
    "memory_summary", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
    "empty_cache", "empty_virt_addr_cache", "mem_get_info", "set_per_process_memory_fraction",
    "get_per_process_memory_fraction", "set_allocator_settings",
    "record_memory_history", "attach_out_of_memory_observer", "dump_snapshot", "record_stream", "erase_stream", "MemPool",
    "use_mem_pool",
    "region", "pause", "resume", "disable", "memory_saver", "memory_saver_stats",
    "set_synchronize_hook", "set_drain_hook", "install", "TorchMemorySaver",
    "alias_torch_memory_saver", "cpu_backup", "set_retain_cpu_backup", "get_retain_cpu_backup",
    "set_memory_margin_bytes",
]

# Status codes of include/npu_alloc.h (NpuAllocStatus).
_OK, _INVALID, _OOM, _UNKNOWN_POINTER, _DEVICE, _TOO_SMALL, _NOT_INIT, _REFUSED, _IO, _PANIC = (
    0, -1, -2, -3, -4, -5, -6, -7, -8, -9)


class NpuAllocError(RuntimeError):
    """A call npu-alloc refused or could not complete; ``status`` is the C status code."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


class OutOfMemoryError(NpuAllocError):
    """Out of memory after torch's whole retry chain (torch_npu's message)."""


def library_path():
    """Where ``libnpu_alloc.so`` is taken from (see the module's documentation)."""
    explicit = os.environ.get("NPU_ALLOC_LIB")
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "libnpu_alloc.so")]
    root = os.path.dirname(os.path.dirname(here))
    for profile in ("release", "debug"):
        candidates.append(os.path.join(root, "target", profile, "libnpu_alloc.so"))
    for c in candidates:
        if os.path.exists(c):
            return c
    raise NpuAllocError(
        "libnpu_alloc.so not found: set NPU_ALLOC_LIB, or build it with "
        "`cargo build --release -p npu-alloc-capi`", _NOT_INIT)


_lib = None
_lib_lock = threading.Lock()
_SYNC_HOOK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)
_OOM_OBSERVER = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_int64)
_keep_alive = []  # callbacks handed to C live as long as the process


# torch_npu, once ``install()`` made npu-alloc its allocator, until torch_npu has started.
_torch_npu_to_start = None


def _load(start=True):
    """The C library. After ``install()``, a call that may start the library (``start``) first
    starts torch_npu: npu-alloc's own ``aclInit`` would come before torch_npu's and make it
    ignore its ``acl.json``."""
    global _torch_npu_to_start
    if start and _torch_npu_to_start is not None:
        torch_npu = _torch_npu_to_start
        torch_npu.npu._lazy_init()  # thread-safe and idempotent in torch_npu
        _torch_npu_to_start = None
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        lib = ctypes.CDLL(library_path())
        c_int, c_size, c_void, c_char = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
        sig = {
            "npu_alloc_malloc": ([c_size, c_int, c_void], c_void),
            "npu_alloc_malloc_checked": ([c_size, c_int, c_void, ctypes.POINTER(c_void)], c_int),
            "npu_alloc_free": ([c_void, c_size, c_int, c_void], None),
            "npu_alloc_free_checked": ([c_void], c_int),
            "npu_alloc_record_stream_handle": ([c_void, c_void], c_int),
            "npu_alloc_erase_stream_handle": ([c_void, c_void], c_int),
            "npu_alloc_empty_cache": ([], c_int),
            "npu_alloc_empty_virt_addr_cache": ([], c_int),
            "npu_alloc_memory_stats": ([c_int, c_char, c_size, ctypes.POINTER(c_size)], c_int),
            "npu_alloc_memory_saver_stats": ([c_int, c_char, c_size, ctypes.POINTER(c_size)], c_int),
            "npu_alloc_memory_summary": ([c_int, ctypes.c_bool, c_char, c_size, ctypes.POINTER(c_size)],
                                         c_int),
            "npu_alloc_reset_accumulated_stats": ([c_int], c_int),
            "npu_alloc_reset_peak_memory_stats": ([c_int], c_int),
            "npu_alloc_memory_saver_has_tag": ([c_char, ctypes.POINTER(ctypes.c_bool)], c_int),
            "npu_alloc_mem_get_info": ([c_int, ctypes.POINTER(c_size), ctypes.POINTER(c_size)], c_int),
            "npu_alloc_set_per_process_memory_fraction": ([ctypes.c_double, c_int], c_int),
            "npu_alloc_get_per_process_memory_fraction": ([c_int, ctypes.POINTER(ctypes.c_double)],
                                                          c_int),
            "npu_alloc_set_allocator_settings": ([c_char], c_int),
            "npu_alloc_record_memory_history": ([ctypes.c_bool, c_size], c_int),
            "npu_alloc_is_history_enabled": ([ctypes.POINTER(ctypes.c_bool)], c_int),
            "npu_alloc_attach_out_of_memory_observer": ([_OOM_OBSERVER], c_int),
            "npu_alloc_dump_snapshot": ([c_char], c_int),
            "npu_alloc_mem_pool_create": ([c_int, ctypes.POINTER(ctypes.c_uint64)], c_int),
            "npu_alloc_mem_pool_begin": ([c_int, ctypes.c_uint64], c_int),
            "npu_alloc_mem_pool_end": ([c_int, ctypes.c_uint64], c_int),
            "npu_alloc_mem_pool_use_count": ([c_int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint32)],
                                             c_int),
            "npu_alloc_mem_pool_release": ([c_int, ctypes.c_uint64], c_int),
            "npu_alloc_mem_pool_set_use_on_oom": ([c_int, ctypes.c_uint64, ctypes.c_bool], c_int),
            "npu_alloc_mem_pool_set_no_split": ([c_int, ctypes.c_uint64], c_int),
            "npu_alloc_region_begin": ([c_int, c_char, ctypes.c_bool], c_int),
            "npu_alloc_region_end": ([c_int], c_int),
            "npu_alloc_pause": ([c_char], c_int),
            "npu_alloc_resume": ([c_char], c_int),
            "npu_alloc_set_retain_cpu_backup": ([ctypes.c_bool], c_int),
            "npu_alloc_set_memory_margin_bytes": ([ctypes.c_uint64], c_int),
            "npu_alloc_get_retain_cpu_backup": ([ctypes.POINTER(ctypes.c_bool)], c_int),
            "npu_alloc_copy_cpu_backup": ([c_void, c_size, c_void, ctypes.POINTER(ctypes.c_bool)],
                                          c_int),
            "npu_alloc_cpu_backup_pointer": ([c_void, c_size, ctypes.POINTER(c_void)], c_int),
            "npu_alloc_last_error": ([ctypes.c_char_p, c_size], c_size),
            "npu_alloc_set_synchronize_hook": ([_SYNC_HOOK], None),
            "npu_alloc_set_drain_hook": ([_SYNC_HOOK], None),
            "npu_alloc_acl_synchronize": ([c_int], c_int),
        }
        for name, (args, res) in sig.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = args, res
        _lib = lib
        return lib


def _last_error():
    lib = _load()
    n = lib.npu_alloc_last_error(None, 0)
    buf = ctypes.create_string_buffer(n)
    lib.npu_alloc_last_error(buf, n)
    return buf.value.decode("utf-8", "replace")


# The exception a synchronize hook raised on this thread, until the call it failed reports.
_hook_failure = threading.local()
# How the library's error for a failed hook begins.
_HOOK_FAILED = "the synchronize hook failed"


def _raise(error):
    """Raises ``error``, caused by the exception a synchronize hook raised in the call. A hook's
    exception from a call torch_npu made (its ``empty_cache``) is not this error's cause."""
    cause = getattr(_hook_failure, "exc", None)
    _hook_failure.exc = None
    if cause is not None and _HOOK_FAILED in str(error):
        raise error from cause
    raise error


def _check(status):
    if status != _OK:
        _raise((OutOfMemoryError if status == _OOM else NpuAllocError)(_last_error(), status))
    _hook_failure.exc = None


def _text(s, what):
    if not isinstance(s, str):
        raise TypeError("%s must be a str, not %s" % (what, type(s).__name__))
    if "\0" in s:
        # C would read it only up to the NUL.
        raise ValueError("%s contains a NUL character: %r" % (what, s))
    return s.encode("utf-8", "surrogatepass")


def _int(value, what, low, high):
    """``value`` as an int within [low, high]: ctypes would wrap one outside silently."""
    value = operator.index(value)
    if not low <= value <= high:
        raise ValueError("%s must be in [%d, %d], got %d" % (what, low, high, value))
    return value


def _size(value, what="size"):
    return _int(value, what, 0, (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1)


def _current_device():
    """torch's current NPU device once torch_npu is imported (this module never imports it),
    else 0."""
    torch = sys.modules.get("torch")
    if "torch_npu" in sys.modules and torch is not None:
        return torch.npu.current_device()
    return 0


def _device(device):
    """``device`` as a C int, as torch's ``_get_device_index`` reads it: an int, ``"npu:1"``,
    ``"npu"`` or a ``torch.device`` of type ``npu`` (without an index, or None: the current
    device, ``_current_device``)."""
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "npu" or (index and not index.isdigit()):
            raise ValueError("Expected an NPU device, got %r" % device)
        device = int(index) if index else None
    elif hasattr(device, "type") and hasattr(device, "index"):  # torch.device
        if device.type != "npu":
            raise ValueError("Expected an NPU device, got %r" % (device,))
        device = device.index
    if device is None:
        device = _current_device()
    # A negative index is the library's to refuse (InvalidArgument); one beyond a C int is not.
    return _int(device, "device", -(1 << 31), (1 << 31) - 1)


def _address(value, what):
    return _int(value, what, 0, (1 << (8 * ctypes.sizeof(ctypes.c_void_p))) - 1)


def malloc(size, device=None, stream=0):
    """``size`` bytes on ``device`` (None: the current device) for ``stream`` (an ``aclrtStream`` handle as an int, 0 for
    the default stream); the address, 0 for size 0. Raises OutOfMemoryError with torch_npu's
    message."""
    size, device = _size(size), _device(device)
    stream = _address(stream, "stream")
    ptr = ctypes.c_void_p()
    _check(_load().npu_alloc_malloc_checked(size, device, stream or None, ctypes.byref(ptr)))
    return ptr.value or 0


def free(ptr):
    """Gives back an allocation; an address npu-alloc did not return (or a double free)
    raises NpuAllocError and changes nothing. 0 does nothing."""
    if not ptr:
        return
    status = _load().npu_alloc_free_checked(_address(ptr, "ptr"))
    if status != _OK:
        raise NpuAllocError(_last_error(), status)


def record_stream(ptr, stream):
    """``record_stream``: ``ptr`` is also used on ``stream`` (an ``aclrtStream`` handle)."""
    ptr, stream = _address(ptr, "ptr"), _address(stream, "stream")
    _check(_load().npu_alloc_record_stream_handle(ptr, stream or None))


def erase_stream(ptr, stream):
    """torch_npu's ``erase_stream``: undoes ``record_stream(ptr, stream)``, so that freeing
    ``ptr`` waits for no work on ``stream``. As in torch_npu, call it only for an allocation made
    on its device's current stream."""
    ptr, stream = _address(ptr, "ptr"), _address(stream, "stream")
    _check(_load().npu_alloc_erase_stream_handle(ptr, stream or None))


def memory_stats(device=None):
    """torch's ``memory_stats()`` keys for ``device`` (None: the current device), as a dict."""
    return _json(_load().npu_alloc_memory_stats, _device(device))


def memory_summary(device=None, abbreviated=False):
    """torch's ``memory_summary()`` for ``device`` (None: the current device): torch_npu's
    table, with npu-alloc's lines about expandable segments."""
    return _fetch_text(_load().npu_alloc_memory_summary, _device(device), bool(abbreviated))


def memory_allocated(device=None):
    """torch's ``memory_allocated()``: bytes of live allocations."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    """torch's ``max_memory_allocated()``: the peak of ``memory_allocated()``."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    """torch's ``memory_reserved()``: bytes of all segments."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    """torch's ``max_memory_reserved()``: the peak of ``memory_reserved()``."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    """torch's ``reset_peak_memory_stats()``: every peak becomes its current value."""
    _check(_load().npu_alloc_reset_peak_memory_stats(_device(device)))


def reset_accumulated_memory_stats(device=None):
    """torch's ``reset_accumulated_memory_stats()``: the allocated and freed totals and the
    ``num_*`` counters go back to 0."""
    _check(_load().npu_alloc_reset_accumulated_stats(_device(device)))


def memory_saver_stats(device=None):
    """The memory saver's figures for ``device`` (None: the current device), as a dict:
    ``paused_bytes`` and ``held_bytes`` (each ``current`` and ``peak``) and ``tags``, a list of
    one dict per tag (``tag``, ``paused``, ``segments``, ``bytes``, ``paused_bytes``). torch's
    ``memory_stats()`` does not move on a pause; these do."""
    return _json(_load().npu_alloc_memory_saver_stats, _device(device))


def _json(fetch, device):
    """The JSON text ``fetch(device, buf, len, &needed)`` writes, parsed."""
    return json.loads(_fetch_text(fetch, device))


def _fetch_text(fetch, *args):
    """The text ``fetch(*args, buf, len, &needed)`` writes into a caller's buffer."""
    needed = ctypes.c_size_t(0)
    buf = None
    while True:
        size = needed.value
        status = fetch(*args, buf, size, ctypes.byref(needed))
        if status != _TOO_SMALL:
            break
        # Another thread may have grown the text in between: ask again with the new length.
        buf = ctypes.create_string_buffer(needed.value)
    _check(status)
    return buf.value.decode()


def empty_cache():
    """Gives every whole free segment back, after the synchronize hook."""
    _check(_load().npu_alloc_empty_cache())


def empty_virt_addr_cache():
    """torch_npu's ``empty_virt_addr_cache()``: ``empty_cache``, except that the pages of
    expandable segments are unmapped and kept for the next allocations instead of freed
    (``empty_cache`` frees them). Needs ``expandable_segments:True``."""
    _check(_load().npu_alloc_empty_virt_addr_cache())


def mem_get_info(device=None):
    """``(free, total)`` memory of ``device`` (None: the current device) in bytes."""
    free_b, total = ctypes.c_size_t(), ctypes.c_size_t()
    device = _device(device)
    _check(_load().npu_alloc_mem_get_info(device, ctypes.byref(free_b), ctypes.byref(total)))
    return free_b.value, total.value


def set_per_process_memory_fraction(fraction, device=None):
    """Limits the allocator on ``device`` (None: the current device) to ``fraction`` of its
    memory (0 to 1)."""
    if not isinstance(fraction, (int, float)):
        raise TypeError("Invalid type for fraction argument, must be float")
    _check(_load().npu_alloc_set_per_process_memory_fraction(float(fraction), _device(device)))


def get_per_process_memory_fraction(device=None):
    """The fraction of ``device``'s memory (None: the current device) the allocator may use:
    1.0 when unlimited."""
    fraction = ctypes.c_double()
    _check(_load().npu_alloc_get_per_process_memory_fraction(_device(device),
                                                             ctypes.byref(fraction)))
    return fraction.value


def set_allocator_settings(settings):
    """``torch.npu.memory._set_allocator_settings(settings)``. A key torch_npu does not take
    there raises NpuAllocError and changes nothing, as torch_npu raises; a bad value only warns
    (on stderr) and the rest applies."""
    _check(_load().npu_alloc_set_allocator_settings(_text(settings, "settings")))


def _set_allocator_settings_as_torch_npu(settings):
    """torch_npu's binding: a refused string raises ValueError, as its TORCH_CHECK_VALUE."""
    try:
        set_allocator_settings(settings)
    except NpuAllocError as e:
        if e.status == _REFUSED:
            raise ValueError(str(e)) from None
        raise


def record_memory_history(enabled=True, max_entries=100000):
    """``_record_memory_history``: keeps the last ``max_entries`` trace entries per device.
    Does not start the library (set before, it applies from its start)."""
    max_entries = _size(max_entries, "max_entries")
    _check(_load(start=False).npu_alloc_record_memory_history(bool(enabled), max_entries))


def attach_out_of_memory_observer(observer):
    """torch's ``_attach_out_of_memory_observer``: ``observer(device, alloc_size,
    device_total, device_free)`` is called after each out-of-memory error of the retry chain
    (not for a ``throw_on_npumalloc_oom`` rejection), on the thread that
    ran out (``device_total`` is the fraction's limit when one is set). An exception it raises
    is printed, not raised into the allocator. Does not start the library."""
    if not callable(observer):
        raise TypeError("observer must be callable")

    def call(device, alloc_size, device_total, device_free):
        try:
            observer(device, alloc_size, device_total, device_free)
        except BaseException:  # noqa: BLE001 - a callback must not raise into C
            import traceback
            traceback.print_exc()

    cb = _OOM_OBSERVER(call)
    _keep_alive.append(cb)
    _check(_load(start=False).npu_alloc_attach_out_of_memory_observer(cb))


def dump_snapshot(path):
    """``_dump_snapshot(path)``: a pickle PyTorch's memory_viz opens."""
    _check(_load().npu_alloc_dump_snapshot(_text(os.fspath(path), "path")))


class MemPool:
    """torch's ``MemPool`` on ``device`` (None: the current device): a private pool, given back
    by ``release()``. With ``use_on_oom``, allocations of the default pools that run out of
    memory may take its cached blocks before anything is released; with ``no_split`` (torch_npu)
    its blocks are handed out whole."""

    def __init__(self, device=None, use_on_oom=False, no_split=False):
        self.device = _device(device)
        pid = ctypes.c_uint64()
        lib = _load()
        _check(lib.npu_alloc_mem_pool_create(self.device, ctypes.byref(pid)))
        self.id = (0, pid.value)
        self._released = False
        if use_on_oom:
            _check(lib.npu_alloc_mem_pool_set_use_on_oom(self.device, self.id[1], True))
        if no_split:
            _check(lib.npu_alloc_mem_pool_set_no_split(self.device, self.id[1]))

    def release(self):
        """Drops the pool (torch's ``del pool``): its cache is emptied once nothing holds it."""
        if not self._released:
            # Released only once it worked: a failed release (a failing synchronize hook) can
            # be retried.
            _check(_load().npu_alloc_mem_pool_release(self.device, self.id[1]))
            self._released = True

    def use_count(self):
        """torch's ``MemPool.use_count()``: the pool object (until released) and each scope
        allocating to it."""
        count = ctypes.c_uint32()
        _check(_load().npu_alloc_mem_pool_use_count(self.device, self.id[1],
                                                     ctypes.byref(count)))
        return count.value

    def __del__(self):
        # torch releases a MemPool when it is collected; a failure cannot be raised from here.
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter exit, or a failing hook
            pass


@contextlib.contextmanager
def use_mem_pool(pool):
    """Allocations of this thread on the pool's device come from ``pool`` inside the block. A
    pool already in use by a scope (of any thread) cannot be entered again, as in torch, and a
    released one not at all."""
    if pool._released:
        raise NpuAllocError(f"private pool {pool.id} was released", _REFUSED)
    _check(_load().npu_alloc_mem_pool_begin(pool.device, pool.id[1]))
    try:
        yield pool
    finally:
        _check(_load().npu_alloc_mem_pool_end(pool.device, pool.id[1]))


@contextlib.contextmanager
def region(tag="default", enable_cpu_backup=False, device=None):
    """torch_memory_saver's ``region``: allocations of this thread on ``device`` (None: the
    current device) inside the block can be paused and resumed at the same addresses (their
    bytes kept with ``enable_cpu_backup``). Regions nest, the innermost open one taking the
    allocations. One left while a region entered inside it on the same device is still open
    (generators, asyncio) stays open in the library until that region is left too, since the
    library ends a thread's innermost region: meanwhile the inner region takes the
    allocations, as it should."""
    device = _device(device)
    _check(_load().npu_alloc_region_begin(device, _text(tag, "tag"), bool(enable_cpu_backup)))
    stack = _regions.__dict__.setdefault("stacks", {}).setdefault(device, [])
    me = [False]  # whether it was left
    stack.append(me)
    try:
        yield
    finally:
        me[0] = True
        # End every region at the top of the stack that was left, innermost first.
        while stack and stack[-1][0]:
            stack.pop()
            _check(_load().npu_alloc_region_end(device))


# This thread's open regions by device, innermost last.
_regions = threading.local()


def _in_region(device):
    """Whether this thread has a region open (entered and not left) on ``device``."""
    stack = getattr(_regions, "stacks", {}).get(device, [])
    return any(not left[0] for left in stack)


@contextlib.contextmanager
def disable(device=None):
    """torch_memory_saver's ``disable()``: inside a region, allocations of this thread on
    ``device`` (None: the current device) made in the block are left out of the region's tag, so
    a pause does not touch them. As upstream, they come from a private pool of their own, made
    for the block and released when it ends (its memory goes back once they are freed). Outside
    a region it raises ``NpuAllocError`` (upstream asserts)."""
    device = _device(device)
    if not _in_region(device):
        raise NpuAllocError(
            f"disable() outside a region on device {device}: it only takes allocations out of "
            "an open region", _REFUSED)
    pool = MemPool(device)
    try:
        with use_mem_pool(pool):
            yield
    finally:
        pool.release()


class _MemorySaver:
    """torch_memory_saver's singleton (``torch_memory_saver.torch_memory_saver``) over npu-alloc,
    for code written against it: ``region``, ``pause``, ``resume``, ``disable`` and ``enabled``
    behave as upstream's (on the current device). ``hook_mode`` accepts upstream's values and
    changes nothing: npu-alloc is the allocator, there is nothing to hook. What npu-alloc does
    not offer (``cuda_graph``, ``enable_disk_backup``) raises ``NotImplementedError`` rather
    than doing something else silently; ``configure_subprocess`` has nothing to configure. As
    upstream, pausing or resuming a tag no region was entered for does nothing
    (``npu_alloc.pause`` refuses it)."""

    enabled = True

    def region(self, tag="default", enable_cpu_backup=False, enable_disk_backup=False,
               cpu_backup_backend=None):
        if enable_disk_backup:
            raise NotImplementedError("npu-alloc has no disk backup (docs/memory-saver.md)")
        if cpu_backup_backend is not None:
            raise NotImplementedError("npu-alloc keeps its CPU backups in host memory only "
                                      "(docs/memory-saver.md)")
        _warn_if_not_installed()
        return region(tag, enable_cpu_backup)

    def set_disk_backup_dir(self, path):
        raise NotImplementedError("npu-alloc has no disk backup (docs/memory-saver.md)")

    @contextlib.contextmanager
    def configure_subprocess(self):
        # Upstream sets LD_PRELOAD for child processes; npu-alloc hooks nothing, so there is
        # nothing to set.
        yield

    @property
    def retain_cpu_backup(self):
        return get_retain_cpu_backup()

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value):
        set_retain_cpu_backup(value)

    # A tag no region was entered for: upstream does nothing (SGLang pauses and resumes its
    # "cuda_graph" tag whether or not it has one); npu-alloc's own pause and resume refuse it.
    def pause(self, tag=None):
        if not tag or _has_tag(tag):
            pause(tag)

    def resume(self, tag=None):
        if not tag or _has_tag(tag):
            resume(tag)

    def disable(self):
        return disable()

    @property
    def hook_mode(self):
        raise AttributeError("hook_mode can only be set, as in torch_memory_saver")

    @hook_mode.setter
    def hook_mode(self, mode):
        if mode not in ("preload", "torch"):
            raise ValueError(f"hook_mode must be 'preload' or 'torch', not {mode!r}")

    @property
    def memory_margin_bytes(self):
        raise NotImplementedError("Only setter is supported")  # as upstream

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value):
        set_memory_margin_bytes(value)

    def cuda_graph(self, *args, **kwargs):
        raise NotImplementedError("npu-alloc does not capture NPU graphs in a region "
                                  "(docs/memory-saver.md)")

    def get_cpu_backup(self, x, zero_copy=False):
        """The CPU backup of contiguous NPU tensor ``x`` as a CPU tensor of its dtype and shape
        (``cpu_backup``), None where there is none. With ``zero_copy`` the tensor is the backup's
        host memory itself, to rely on only until the next pause or resume of its tag (a resume
        without ``retain_cpu_backup`` frees it; read it, do not write it); else a copy."""
        import torch
        if x.device.type != "npu":
            raise ValueError("get_cpu_backup needs an NPU tensor, not one on %s" % (x.device,))
        if not x.is_contiguous():
            raise ValueError("get_cpu_backup needs a contiguous tensor")
        nbytes = x.numel() * x.element_size()
        if zero_copy:
            host = ctypes.c_void_p()
            _check(_load().npu_alloc_cpu_backup_pointer(_address(x.data_ptr(), "ptr"),
                                                        _size(nbytes, "nbytes"),
                                                        ctypes.byref(host)))
            if not host.value:
                return None
            if nbytes == 0:
                # torch.frombuffer refuses an empty buffer.
                out = torch.empty(0, dtype=torch.uint8)
            else:
                out = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(host.value),
                                       dtype=torch.uint8)
        else:
            out = torch.empty(nbytes, dtype=torch.uint8)
            if not _copy_cpu_backup(x.data_ptr(), nbytes, out.data_ptr()):
                return None
        return out.view(x.dtype).view(x.shape)


TorchMemorySaver = _MemorySaver

_warned_not_installed = []


def _warn_if_not_installed():
    """Once: a region of the stand-in with torch_npu imported and npu-alloc not its allocator
    routes no tensor (they come from torch_npu's own allocator), so a pause would give back
    nothing. torch_memory_saver's modes hook the allocator themselves; npu-alloc needs
    ``install()`` in every process, subprocesses included."""
    if "torch_npu" in sys.modules and _installed is None and not _warned_not_installed:
        _warned_not_installed.append(True)
        import warnings
        warnings.warn("torch_memory_saver's region without npu_alloc.install(): torch_npu's "
                      "tensors do not come from npu-alloc, so a pause gives nothing back; call "
                      "npu_alloc.install() in this process first", RuntimeWarning, stacklevel=3)


def alias_torch_memory_saver():
    """Makes ``import torch_memory_saver`` give npu-alloc's stand-in
    (``npu_alloc.torch_memory_saver``: the singleton ``torch_memory_saver``, ``TorchMemorySaver``
    and ``configure_subprocess``), for code written against torch_memory_saver. Returns it."""
    from . import torch_memory_saver as module
    sys.modules["torch_memory_saver"] = module
    return module


def _has_tag(tag):
    """Whether a device opened so far knows memory-saver tag ``tag``."""
    known = ctypes.c_bool()
    _check(_load().npu_alloc_memory_saver_has_tag(_text(tag, "tag"), ctypes.byref(known)))
    return known.value


# Stands in for ``torch_memory_saver.torch_memory_saver``.
memory_saver = _MemorySaver()


def _tags(tag):
    """A pause's or resume's tag for C: None or "" (as torch_memory_saver reads a falsy tag) is
    every tag."""
    return None if tag is None or tag == "" else _text(tag, "tag")


def pause(tag=None):
    """Gives back the physical memory of ``tag`` (every tag when None or "", as in
    torch_memory_saver), addresses kept."""
    _check(_load().npu_alloc_pause(_tags(tag)))


def resume(tag=None):
    """Maps new memory at the paused addresses of ``tag`` (every paused tag when None or "")."""
    _check(_load().npu_alloc_resume(_tags(tag)))


def set_retain_cpu_backup(retain):
    """torch_memory_saver's ``retain_cpu_backup = retain``: with it, a resume keeps each
    segment's CPU backup (its bytes at the pause, not updated while the memory is in use) for
    ``cpu_backup`` to read, and the next pause copies into it instead of allocating host memory
    again. Read at each resume; turning it off frees a tag's backups at its next resume. Until
    it is called, ``TMS_RETAIN_CPU_BACKUP`` decides, as upstream."""
    _check(_load(start=False).npu_alloc_set_retain_cpu_backup(bool(retain)))


def set_memory_margin_bytes(margin):
    """torch_memory_saver's ``memory_margin_bytes = margin``: a new segment of a region (an
    allocation no cached block of its tag serves) runs out of memory unless the device keeps
    ``margin`` bytes free beside it; 0 turns the check off. Other pools and resumes are not
    checked, as upstream."""
    margin = _int(margin, "memory_margin_bytes", 0, (1 << 64) - 1)
    _check(_load(start=False).npu_alloc_set_memory_margin_bytes(margin))


def get_retain_cpu_backup():
    """Whether resumes keep CPU backups (``set_retain_cpu_backup``)."""
    retain = ctypes.c_bool()
    _check(_load(start=False).npu_alloc_get_retain_cpu_backup(ctypes.byref(retain)))
    return retain.value


def _copy_cpu_backup(ptr, nbytes, dst):
    """Copies the CPU backup of ``nbytes`` at device address ``ptr`` to host address ``dst``;
    whether there was one."""
    found = ctypes.c_bool()
    _check(_load().npu_alloc_copy_cpu_backup(_address(ptr, "ptr"), _size(nbytes, "nbytes"),
                                             dst, ctypes.byref(found)))
    return found.value


def cpu_backup(ptr, nbytes):
    """torch_memory_saver's ``get_cpu_backup`` for raw memory: the CPU backup of the ``nbytes``
    bytes at device address ``ptr`` as ``bytes`` (paused memory of a region with
    ``enable_cpu_backup``: its bytes at the pause; memory in use: the last pause's, while
    ``set_retain_cpu_backup`` kept them), None where there is none. Paused memory of a region
    without backup raises NpuAllocError, as does memory no region allocated."""
    out = ctypes.create_string_buffer(_size(nbytes, "nbytes"))
    return out.raw if _copy_cpu_backup(ptr, nbytes, ctypes.addressof(out)) else None


def set_synchronize_hook(hook):
    """Calls ``hook(device)`` before memory of ``device`` goes back to it (for a call over every
    device, once for each device npu-alloc has opened); it must drain queued work for that
    device and synchronize it. None removes it. An exception in the hook counts as a failure:
    nothing is given back, and the NpuAllocError of the call that ran the hook has the hook's
    exception as its ``__cause__``."""
    _set_hook(_load(start=False).npu_alloc_set_synchronize_hook, hook)


def set_drain_hook(hook):
    """Calls ``hook(device)`` before the free of an allocation used on other streams
    (``record_stream``) records the events it waits for; it must drain the host's queued work
    for ``device`` without waiting for the device. Without one, the synchronize hook serves.
    None removes it."""
    _set_hook(_load(start=False).npu_alloc_set_drain_hook, hook)


def _set_hook(setter, hook):
    if hook is None:
        setter(_SYNC_HOOK())
        return

    def call(device):
        try:
            hook(device)
            return 0
        except BaseException as exc:  # a callback must not raise into C
            _hook_failure.exc = exc
            return 1

    cb = _SYNC_HOOK(call)
    _keep_alive.append(cb)
    setter(cb)


def _env_int(name):
    """Environment variable ``name`` as torch_npu's C ``strtol`` reads it (leading blanks, a
    sign and digits; anything else is 0); None when unset."""
    value = os.environ.get(name)
    if value is None:
        return None
    m = re.match(r"\s*([+-]?\d+)", value)
    return int(m.group(1)) if m else 0


def _per_stream_queue():
    """Whether torch_npu runs a task queue per stream (``PER_STREAM_QUEUE`` not 0)."""
    return (_env_int("PER_STREAM_QUEUE") or 0) != 0


_installed = None  # the NPUPluggableAllocator of a successful install()


def _nested(flat):
    """torch_npu's ``_npu_memoryStats`` dict from the flat keys: ``a.b.c`` becomes
    ``{"a": {"b": {"c": ...}}}``, the inverse of ``torch.npu.memory_stats``' flattening."""
    nested = {}
    for key, value in flat.items():
        *path, last = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def _snapshot(mempool_id=None):
    """torch_npu's ``_npu_memorySnapshot``: the snapshot dict (``segments``, ``device_traces``,
    ...), the segments of one private pool when ``mempool_id`` is given."""
    import pickle
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snapshot.pickle")
        dump_snapshot(path)
        with open(path, "rb") as f:
            snap = pickle.load(f)  # written just now by npu-alloc: plain dicts, lists and ints
    if mempool_id is not None:
        wanted = tuple(mempool_id)
        snap["segments"] = [s for s in snap["segments"] if tuple(s["segment_pool_id"]) == wanted]
    return snap


def _record_history(enabled, context=None, stacks=None, max_entries=100000, *args):
    """torch_npu's ``_npu_record_memory_history(enabled, context, stacks, max_entries)``:
    ``enabled`` None stops recording, "all" keeps the last ``max_entries`` entries, "state" one
    (torch_npu's ``max_entries = enabled == "all" ? max_entries : 1``); npu-alloc keeps no
    stacks."""
    if enabled not in (None, "state", "all"):
        raise NpuAllocError("expected state to be 'state', 'all', or None", _INVALID)
    record_memory_history(enabled is not None, max_entries if enabled == "all" else 1)


def _history_enabled():
    """torch_npu's ``_npu_isHistoryEnabled``."""
    enabled = ctypes.c_bool()
    _check(_load(start=False).npu_alloc_is_history_enabled(ctypes.byref(enabled)))
    return enabled.value


def _refuse_graph_capture(*args, **kwargs):
    raise NpuAllocError(
        "NPU graph capture needs a private pool from the allocator (torch_npu's "
        "beginAllocateToPool), which torch_npu's pluggable allocator interface cannot hand to "
        "npu-alloc: without it, memory used during capture would be handed to other tensors and "
        "replays would overwrite them. Capture graphs without npu_alloc.install().", _REFUSED)


def _oom_snapshots():
    """torch_npu's ``OOM_SNAPSHOT_ENABLE`` (1: history "all"; 2: "state"), which its own start
    would send to a pluggable allocator that ignores it: the history, and an out-of-memory
    observer that writes ``oom_snapshot_<pid>_<local time>.pickle`` into ``OOM_SNAPSHOT_PATH``
    (default ``./``), as torch_npu's ``oom_observer`` does."""
    mode = _env_int("OOM_SNAPSHOT_ENABLE") or 0
    if mode == 0:
        return
    record_memory_history(True, 1 if mode == 2 else sys.maxsize)

    def dump(device, alloc_size, device_total, device_free):
        if _installed is None:  # observers stay attached; the dumps are install()'s
            return
        # torch_npu's GetOomSnapshotDumpPath: "./" when unset; set, it must resolve (an empty
        # one does not).
        path = os.environ.get("OOM_SNAPSHOT_PATH", "./")
        directory = os.path.realpath(path) if path else ""
        if not os.path.isdir(directory):
            raise NpuAllocError("`OOM_SNAPSHOT_PATH` is invalid.", _INVALID)
        import time
        name = "oom_snapshot_%d_%s.pickle" % (os.getpid(), time.strftime("%Y%m%d%H%M%S"))
        dump_snapshot(os.path.join(directory, name))

    attach_out_of_memory_observer(dump)


def install():
    """Makes npu-alloc torch_npu's allocator: ``NPUPluggableAllocator`` with
    ``npu_alloc_malloc`` / ``npu_alloc_free``, the optional hooks torch_npu can call safely,
    and torch_npu's own synchronize as the synchronize hook. Call it right after
    ``import torch_npu``, before any NPU work (torch_npu refuses to swap an initialized
    allocator). A second call returns the first one's allocator.

    torch_npu asks a pluggable allocator for statistics only through a C++ ``DeviceStats`` hook
    (a struct whose layout changes between versions; without it, it warns and returns garbage),
    so ``torch.npu.memory_stats`` and everything built on it (``memory_allocated``,
    ``max_memory_reserved``, ``memory_summary``...), ``reset_accumulated_memory_stats``,
    ``reset_peak_memory_stats``, ``memory_snapshot``, ``_snapshot``, ``_dump_snapshot``,
    ``_record_memory_history``, ``get_per_process_memory_fraction``,
    ``_attach_out_of_memory_observer`` and ``empty_virt_addr_cache`` are pointed at npu-alloc's. NPU graph capture raises
    NpuAllocError (it needs private pools torch_npu cannot ask a pluggable allocator for).
    ``MULTI_STREAM_MEMORY_REUSE`` is set to 2 when unset: torch_npu's collectives then keep
    their tensors alive instead of calling ``record_stream``, which reaches npu-alloc without
    an ``aclrtStream`` (docs/c-abi.md)."""
    global _installed, _torch_npu_to_start
    if _installed is not None:
        return _installed
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError as exc:
        raise NpuAllocError("install() needs torch and torch_npu: %s" % exc, _NOT_INIT) from exc

    path = library_path()
    alloc = torch_npu.npu.memory.NPUPluggableAllocator(path, "npu_alloc_malloc", "npu_alloc_free")
    lib = _load(start=False)
    inner = alloc.allocator()
    for setter, symbol in (("set_init_fn", "npu_alloc_init"), ("set_reset_fn", "npu_alloc_reset"),
                           ("set_memory_fraction_fn", "npu_alloc_set_memory_fraction"),
                           ("set_base_alloc_fn", "npu_alloc_base_alloc"),
                           ("set_reset_peak_status_fn", "npu_alloc_reset_peak_stats")):
        getattr(inner, setter)(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
    # Raises if torch_npu has started: nothing below is changed then.
    torch_npu.npu.memory.change_current_allocator(alloc)
    # torch_npu reads it at its first use, after this (as read by its strtol).
    reuse = _env_int("MULTI_STREAM_MEMORY_REUSE")
    if reuse is None:
        os.environ["MULTI_STREAM_MEMORY_REUSE"] = "2"
    elif reuse != 2:
        import warnings
        warnings.warn(
            "MULTI_STREAM_MEMORY_REUSE=%s: torch_npu's collectives will call record_stream, "
            "which npu-alloc cannot act on (torch_npu passes no aclrtStream), so a tensor freed "
            "while a collective reads it may be reused at once; set it to 2."
            % os.environ["MULTI_STREAM_MEMORY_REUSE"], RuntimeWarning, stacklevel=2)
    set_synchronize_hook(lambda device: torch.npu.synchronize(device))
    # Frees of blocks used on other streams record their events behind the work torch_npu has
    # queued on the host: reading the device's current stream empties its queue
    # (`NPUStream::stream()`), without waiting for the device. With PER_STREAM_QUEUE each
    # stream has a queue of its own, and only the synchronize hook drains them all.
    if not _per_stream_queue():
        set_drain_hook(lambda device: torch_npu._C._npu_getCurrentRawStream(device))
    c = torch_npu._C
    c._npu_memoryStats = lambda device=None: _nested(memory_stats(device))
    c._npu_resetAccumulatedMemoryStats = reset_accumulated_memory_stats
    c._npu_resetPeakMemoryStats = reset_peak_memory_stats
    c._npu_memorySnapshot = _snapshot
    c._npu_record_memory_history = _record_history
    c._npu_isHistoryEnabled = _history_enabled
    c._npu_getMemoryFraction = get_per_process_memory_fraction
    c._npu_emptyVirtAddrCache = empty_virt_addr_cache
    c._npu_attach_out_of_memory_observer = attach_out_of_memory_observer
    c._npu_npuCachingAllocator_set_allocator_settings = _set_allocator_settings_as_torch_npu
    _oom_snapshots()
    graphs = getattr(torch_npu.npu, "graphs", None)
    if graphs is not None and hasattr(graphs, "NPUGraph"):
        graphs.NPUGraph.capture_begin = _refuse_graph_capture
    _keep_alive.append(alloc)
    _installed = alloc
    _torch_npu_to_start = torch_npu
    return alloc
