/* npu-alloc's C API. Generated from crates/npu-alloc-capi by cbindgen: do not edit.
 * `aclrtStream` arguments are `void *`, as in ACL's headers. See docs/c-abi.md. */

#ifndef NPU_ALLOC_H
#define NPU_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/**
 * What a direct entry point returns: 0 for success, a negative code otherwise, with the text
 * in `npu_alloc_last_error`.
 */
typedef enum NpuAllocStatus {
  /**
   * Success.
   */
  NpuAllocStatus_Ok = 0,
  /**
   * A null pointer where one is required, a device out of range, a fraction outside
   * [0, 1] (NaN included), a string that is not UTF-8.
   */
  NpuAllocStatus_InvalidArgument = -1,
  /**
   * Out of memory after torch's whole retry chain (torch_npu's message in the last error),
   * a memory-saver resume (device) or pause (host, for a CPU backup) that found none, or an
   * ACL call outside the chain that ran out of memory (torch_npu's `isCannOOM`).
   */
  NpuAllocStatus_OutOfMemory = -2,
  /**
   * A pointer this library did not return, or one already freed.
   */
  NpuAllocStatus_UnknownPointer = -3,
  /**
   * An ACL call failed (its code and name in the last error), or the device does not report
   * its total memory for a fraction below 1.
   */
  NpuAllocStatus_DeviceError = -4,
  /**
   * The caller's buffer is too small; the needed length was written.
   */
  NpuAllocStatus_BufferTooSmall = -5,
  /**
   * The library could not start: `libascendcl.so` was not found or `aclInit` failed.
   */
  NpuAllocStatus_NotInitialized = -6,
  /**
   * A private-pool or memory-saver call was refused (unknown or released pool, paused tag,
   * a scope that is not open, ...), or a snapshot holds a value its pickle cannot.
   */
  NpuAllocStatus_Refused = -7,
  /**
   * A file could not be written.
   */
  NpuAllocStatus_IoError = -8,
  /**
   * npu-alloc panicked; nothing crossed the boundary, and the state is as the lock left it.
   */
  NpuAllocStatus_Panic = -9,
} NpuAllocStatus;

/**
 * torch_npu's `c10_npu::NPUStream`, as its record/erase hooks receive it (by invisible
 * reference): `c10::Stream`'s device type, device index and stream id.
 */
typedef struct NpuAllocStreamRepr {
  /**
   * `c10::DeviceType` (PrivateUse1 for NPU).
   */
  int8_t device_type;
  /**
   * The device index.
   */
  int8_t device_index;
  /**
   * torch_npu's stream id: not an `aclrtStream`.
   */
  int64_t stream_id;
} NpuAllocStreamRepr;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * torch_npu's pluggable `alloc`: `size` bytes on `device` for use on `stream`. NULL for a
 * zero-size request (no error) and on failure (the reason in the last error; for out of
 * memory, torch_npu's message).
 *
 * # Safety
 * `stream` is NULL (the default stream) or a live `aclrtStream` of `device`.
 */
void *npu_alloc_malloc(uintptr_t size, int device, void *stream);

/**
 * [`npu_alloc_malloc`] with a status: `*ptr` gets the address (NULL for size 0) on success and
 * is left as it was on failure; [`NpuAllocStatus::OutOfMemory`] with torch_npu's message,
 * [`NpuAllocStatus::Refused`] in a paused memory-saver region, and so on.
 *
 * # Safety
 * `stream` is NULL (the default stream) or a live `aclrtStream` of `device`; `ptr` is a
 * writable `void *`.
 */
enum NpuAllocStatus npu_alloc_malloc_checked(uintptr_t size, int device, void *stream, void **ptr);

/**
 * torch_npu's pluggable `free`. `size`, `device` and `stream` are what torch_npu recorded at
 * allocation; the block is found by its address. NULL does nothing; a pointer this library did
 * not return, or a double free, changes nothing and sets the last error (and warns on stderr
 * once per thread).
 */
void npu_alloc_free(void *ptr, uintptr_t _size, int _device, void *_stream);

/**
 * `free(ptr)` with a status: [`NpuAllocStatus::UnknownPointer`] for a pointer this library did
 * not return or a double free (nothing changes). NULL does nothing, and does not start the
 * library.
 */
enum NpuAllocStatus npu_alloc_free_checked(void *ptr);

/**
 * torch_npu's `init_fn(device_count)`: starts the runtime (loads ACL); nothing else to do.
 */
void npu_alloc_init(int _device_count);

/**
 * torch_npu's `reset_fn(check_error)`, called by `torch.npu.empty_cache()`: the synchronize
 * hook, then `empty_cache`. Errors go to the last error (and stderr with `check_error`).
 */
void npu_alloc_reset(bool check_error);

/**
 * torch_npu's `memory_fraction_fn(fraction, device)`. The hook returns nothing, so an error
 * (a fraction outside 0 to 1, an unknown device) goes to stderr as well as the last error.
 */
void npu_alloc_set_memory_fraction(double fraction, int device);

/**
 * torch_npu's `base_alloc_fn(ptr, size)`: for a live allocation `ptr` (an address
 * `npu_alloc_malloc` returned and not freed, as torch's `get_allocated_block` finds it), the
 * start of its segment, and the segment's size in `*size` (when `size` is not NULL); `ptr`
 * itself, `*size` untouched, for any other address.
 *
 * # Safety
 * `size` is null or points at a writable `size_t`.
 */
void *npu_alloc_base_alloc(void *ptr, uintptr_t *size);

/**
 * torch_npu's `record_stream_fn(ptr, stream)`. torch_npu hands an `NPUStream` whose id is not
 * an `aclrtStream` handle, and npu-alloc records events on handles, so this hook only checks
 * its arguments: call [`npu_alloc_record_stream_handle`] with the stream's handle (the Python
 * package does, from `stream.npu_stream`).
 */
void npu_alloc_record_stream(void *ptr, const struct NpuAllocStreamRepr *stream);

/**
 * torch_npu's `erase_stream_fn(ptr, stream)`: a no-op, as [`npu_alloc_record_stream`] records
 * nothing (it cannot read the stream's handle from its arguments), so there is nothing to
 * undo. With handles, [`npu_alloc_erase_stream_handle`] undoes
 * [`npu_alloc_record_stream_handle`].
 */
void npu_alloc_erase_stream(void *_ptr, const struct NpuAllocStreamRepr *_stream);

/**
 * torch_npu's `eraseStream(ptr, stream)` with the stream's `aclrtStream` handle: undoes
 * [`npu_alloc_record_stream_handle`], so that freeing `ptr` waits for no work on `stream`. As
 * in torch_npu, call it only for an allocation made on its device's current stream (npu-alloc
 * does not know which stream is current). A NULL `ptr` is [`NpuAllocStatus::InvalidArgument`];
 * a pointer that is not a live allocation, [`NpuAllocStatus::UnknownPointer`].
 *
 * # Safety
 * `stream` is NULL (the default stream) or a live `aclrtStream` of the block's device.
 */
enum NpuAllocStatus npu_alloc_erase_stream_handle(void *ptr, void *stream);

/**
 * `record_stream(ptr, stream)` with the stream's `aclrtStream` handle: the block's memory is
 * reused only after the work queued on `stream` when it is freed has completed. A NULL `ptr`
 * is [`NpuAllocStatus::InvalidArgument`].
 *
 * # Safety
 * `stream` is NULL (the default stream) or a live `aclrtStream` of the block's device.
 */
enum NpuAllocStatus npu_alloc_record_stream_handle(void *ptr, void *stream);

/**
 * torch_npu's `reset_peak_status_fn(device)`: `reset_peak_memory_stats`. The device is an
 * `int8_t`, torch's `DeviceIndex`, as torch_npu calls the hook: read as an `int`, the bits
 * above the first byte would be whatever the caller's register held.
 */
void npu_alloc_reset_peak_stats(int8_t device);

/**
 * torch's `reset_peak_memory_stats(device)`: every peak becomes its current value.
 */
enum NpuAllocStatus npu_alloc_reset_peak_memory_stats(int device);

/**
 * `torch.npu.empty_cache()`: the synchronize hook (if set), then every whole free segment of
 * every device goes back.
 */
enum NpuAllocStatus npu_alloc_empty_cache(void);

/**
 * torch_npu's `empty_virt_addr_cache()`: as `npu_alloc_empty_cache`, but the pages unmapped
 * from expandable segments are kept for later maps instead of freed (`npu_alloc_empty_cache`
 * frees them). `Refused` without `expandable_segments:True`, with torch_npu's message.
 */
enum NpuAllocStatus npu_alloc_empty_virt_addr_cache(void);

/**
 * `memory_stats(device)` as a JSON object of torch's flat keys, NUL-terminated, into `buf`
 * (`len` bytes). `*needed` (when not NULL) gets the length with the NUL; a buffer too small
 * gets nothing and the status says so.
 *
 * # Safety
 * `buf` is null or writable for `len` bytes; `needed` is null or writable.
 */
enum NpuAllocStatus npu_alloc_memory_stats(int device, char *buf, uintptr_t len, uintptr_t *needed);

/**
 * torch's `memory_summary(device, abbreviated)`: torch_npu's table, NUL-terminated, into `buf`
 * (`len` bytes), as [`npu_alloc_memory_stats`].
 *
 * # Safety
 * `buf` is null or writable for `len` bytes; `needed` is null or writable.
 */
enum NpuAllocStatus npu_alloc_memory_summary(int device,
                                             bool abbreviated,
                                             char *buf,
                                             uintptr_t len,
                                             uintptr_t *needed);

/**
 * torch's `reset_accumulated_memory_stats(device)`: the allocated and freed totals and the
 * `num_*` counters go back to 0.
 */
enum NpuAllocStatus npu_alloc_reset_accumulated_stats(int device);

/**
 * This thread's last error as text, NUL-terminated, into `buf` (`len` bytes, truncated to fit;
 * NULL only asks). Returns the length the whole text needs, with the NUL (0 only if npu-alloc
 * panicked, which it catches).
 *
 * # Safety
 * `buf` is null or writable for `len` bytes.
 */
uintptr_t npu_alloc_last_error(char *buf, uintptr_t len);

/**
 * `torch.npu.mem_get_info(device)`: free and total device memory.
 *
 * # Safety
 * `free` and `total` are writable `size_t`s.
 */
enum NpuAllocStatus npu_alloc_mem_get_info(int device, uintptr_t *free, uintptr_t *total);

/**
 * `torch.npu.set_per_process_memory_fraction(fraction, device)`; NaN or outside [0, 1] is
 * refused and changes nothing.
 */
enum NpuAllocStatus npu_alloc_set_per_process_memory_fraction(double fraction, int device);

/**
 * `torch.npu.get_per_process_memory_fraction(device)` into `*fraction`: the fraction set for
 * the device, 1.0 when unlimited.
 *
 * # Safety
 * `fraction` is a writable `double`.
 */
enum NpuAllocStatus npu_alloc_get_per_process_memory_fraction(int device, double *fraction);

/**
 * `torch.npu.memory._set_allocator_settings(settings)` on every device. A key torch_npu does
 * not take there (known or not) refuses the whole string, as torch_npu raises: `Refused`, and
 * nothing changes. Each other warning about the string (a bad value, an unsupported key: the
 * rest of the string still applies) is written to stderr.
 *
 * # Safety
 * `settings` is a NUL-terminated string.
 */
enum NpuAllocStatus npu_alloc_set_allocator_settings(const char *settings);

/**
 * `torch.npu.memory._dump_snapshot(path)`: a pickle PyTorch's memory_viz reads.
 *
 * # Safety
 * `path` is a NUL-terminated string.
 */
enum NpuAllocStatus npu_alloc_dump_snapshot(const char *path);

/**
 * `torch.npu.MemPool()` on `device`: a private pool with use count 1; `*id` gets its number
 * (torch's `MempoolId_t` is `(0, id)`).
 *
 * # Safety
 * `id` is a writable `uint64_t`.
 */
enum NpuAllocStatus npu_alloc_mem_pool_create(int device, uint64_t *id);

/**
 * torch's `setUseOnOOM` (`MemPool(use_on_oom=True)`): while `on`, a malloc of `device`'s
 * default pools that gets no segment at its first attempt takes a cached block of pool `id`
 * that fits, before it releases anything. An unknown pool is `Refused`;
 * [`npu_alloc_mem_pool_release`] turns it off.
 */
enum NpuAllocStatus npu_alloc_mem_pool_set_use_on_oom(int device, uint64_t id, bool on);

/**
 * torch_npu's `setNoSplit` (`MemPool(no_split=True)`): pool `id` hands its blocks out whole
 * from now on. An unknown pool is `Refused`.
 */
enum NpuAllocStatus npu_alloc_mem_pool_set_no_split(int device, uint64_t id);

/**
 * `use_mem_pool(pool).__enter__()`: this thread's allocations on `device` come from pool `id`.
 * A pool id `device` does not know gets a pool of its own there, freeable once the scope ends
 * (torch's `beginAllocateToPool`); a pool a scope already allocates to is `Refused`.
 */
enum NpuAllocStatus npu_alloc_mem_pool_begin(int device, uint64_t id);

/**
 * `MemPool.use_count()`: `*count` gets the holders of pool `id` on `device` (the pool object and
 * each scope allocating to it); an unknown pool is `Refused`.
 *
 * # Safety
 * `count` is a writable `uint32_t`.
 */
enum NpuAllocStatus npu_alloc_mem_pool_use_count(int device, uint64_t id, uint32_t *count);

/**
 * `use_mem_pool(pool).__exit__()`.
 */
enum NpuAllocStatus npu_alloc_mem_pool_end(int device, uint64_t id);

/**
 * `del pool`: drops the hold of [`npu_alloc_mem_pool_create`] and empties the pool's cache
 * (after the synchronize hook).
 */
enum NpuAllocStatus npu_alloc_mem_pool_release(int device, uint64_t id);

/**
 * torch_memory_saver's `region(tag, enable_cpu_backup)` entered on this thread for `device`.
 *
 * # Safety
 * `tag` is a NUL-terminated string.
 */
enum NpuAllocStatus npu_alloc_region_begin(int device, const char *tag, bool cpu_backup);

/**
 * Leaves this thread's innermost region on `device`.
 */
enum NpuAllocStatus npu_alloc_region_end(int device);

/**
 * torch_memory_saver's `pause(tag)` (NULL or `""`: every tag) on every device, after the
 * synchronize hook.
 *
 * # Safety
 * `tag` is null or a NUL-terminated string.
 */
enum NpuAllocStatus npu_alloc_pause(const char *tag);

/**
 * torch_memory_saver's `resume(tag)` (NULL or `""`: every paused tag) on every device.
 *
 * # Safety
 * `tag` is null or a NUL-terminated string.
 */
enum NpuAllocStatus npu_alloc_resume(const char *tag);

/**
 * Whether any device opened so far knows memory-saver tag `tag` (a region of it was entered):
 * `*known` is set. `npu_alloc_pause` and `npu_alloc_resume` of a tag no device knows are
 * `Refused`; torch_memory_saver does nothing for one, and a stand-in for it asks here first.
 *
 * # Safety
 * `tag` is a NUL-terminated string; `known` is writable.
 */
enum NpuAllocStatus npu_alloc_memory_saver_has_tag(const char *tag, bool *known);

/**
 * The memory saver's figures on `device` as a JSON object, NUL-terminated, into `buf` (`len`
 * bytes), as [`npu_alloc_memory_stats`]: `paused_bytes` and `held_bytes` (each `current` and
 * `peak`) and `tags`, one object per tag in tag order (`tag`, `paused`, `segments`, `bytes`,
 * `paused_bytes`). torch's own stats do not move on a pause; these do. A device not opened yet
 * has no tags.
 *
 * # Safety
 * `buf` is null or writable for `len` bytes; `needed` is null or writable.
 */
enum NpuAllocStatus npu_alloc_memory_saver_stats(int device,
                                                 char *buf,
                                                 uintptr_t len,
                                                 uintptr_t *needed);

/**
 * Sets the device-synchronize hook (NULL: none). Called, with no npu-alloc lock held, before
 * `npu_alloc_empty_cache`, `npu_alloc_reset`, `npu_alloc_pause` and `npu_alloc_mem_pool_release`
 * give memory back (the first three call it once for each device the library has opened),
 * and before a malloc's out-of-memory retry releases cached memory (for the malloc's device).
 * Without a hook, a malloc never releases cached memory (it runs out of memory instead, with
 * a warning once).
 *
 * The hook must return, not throw: a C++ exception or any unwinding out of it is undefined
 * behaviour (catch it and return non-zero). A call into npu-alloc from inside the hook that
 * would need the hook again on the same thread goes on as if the hook had failed (the
 * releasing exports answer `Refused`).
 *
 * Setting it does not start the library: torch_npu's own `aclInit` (with its configuration
 * file) must come first, and `install()` sets the hook before torch_npu initializes.
 */
void npu_alloc_set_synchronize_hook(int (*hook)(int));

/**
 * Sets the drain hook (NULL: none): drains the host's queued work for a device without
 * waiting for the device. With a synchronize hook set, the free of an allocation used on
 * other streams (`npu_alloc_record_stream_handle`) calls it, with no npu-alloc lock held,
 * before it records the events the block waits for: work still in the host's queue would
 * otherwise reach those streams after the events, which would complete while it still reads
 * the block. Without a drain hook the synchronize hook serves, waiting for the device too.
 * Setting it does not start the library. It must return, not throw, as the synchronize hook.
 */
void npu_alloc_set_drain_hook(int (*hook)(int));

/**
 * A synchronize hook for programs without a host task queue: `aclrtSynchronizeDevice` on
 * `device` (-1: every device the library has opened), then the calling thread's device is
 * current again. Returns an [`NpuAllocStatus`] as an int.
 */
int npu_alloc_acl_synchronize(int device);

/**
 * torch_npu's `attachOutOfMemoryObserver` (`torch.npu.memory._attach_out_of_memory_observer`):
 * `observer(device, alloc_size, device_total, device_free)` is called after each out-of-memory
 * error of the retry chain (not for a `throw_on_npumalloc_oom` rejection, nor for one raised
 * inside an observer), with no npu-alloc lock held, on the thread that ran out: the segment size the
 * allocator tried to get, the memory it may use (the fraction's limit, else the device's
 * total) and the device's free memory (0 where the device did not report them). It must
 * return, not throw. Observers cannot be detached. NULL is `InvalidArgument`. Does not start
 * the library.
 */
enum NpuAllocStatus npu_alloc_attach_out_of_memory_observer(void (*observer)(int64_t,
                                                                             int64_t,
                                                                             int64_t,
                                                                             int64_t));

/**
 * `_record_memory_history`: with `enabled`, every device keeps its last `max_entries` trace
 * entries (at least 1); without, recording stops and what was recorded is forgotten. Does not
 * start the library: set before, it applies from the start.
 */
enum NpuAllocStatus npu_alloc_record_memory_history(bool enabled, uintptr_t max_entries);

/**
 * torch_npu's `_npu_isHistoryEnabled()` into `*enabled`: whether
 * [`npu_alloc_record_memory_history`] turned recording on. Does not start the library.
 *
 * # Safety
 * `enabled` is a writable `bool`.
 */
enum NpuAllocStatus npu_alloc_is_history_enabled(bool *enabled);

/**
 * torch_memory_saver's `memory_margin_bytes = bytes`: a new segment of a memory-saver region
 * (an allocation no cached block of its tag serves) runs out of memory, through the retry
 * chain, unless the device would keep `bytes` free beside it (asked with `aclrtGetMemInfo`
 * before each such segment). 0, the default, turns the check off. Other pools and resumes are
 * not checked, as upstream. Does not start the library.
 */
enum NpuAllocStatus npu_alloc_set_memory_margin_bytes(uint64_t bytes);

/**
 * torch_memory_saver's `retain_cpu_backup = retain`: with it, a resume keeps each segment's
 * CPU backup (its bytes at the pause, not updated while the memory is in use) for
 * [`npu_alloc_copy_cpu_backup`] to read, and the next pause copies into it instead of
 * allocating host memory again (so, for those segments, it cannot run out of host memory).
 * Read at each resume: turning it off frees nothing at once; the next resume of a tag frees
 * its backups. Until it is called, `TMS_RETAIN_CPU_BACKUP` decides, as upstream (`1`, `true`,
 * `TRUE`, `yes`, `YES`; another word than those and their five negatives is a warning, and
 * false). Does not start the library.
 */
enum NpuAllocStatus npu_alloc_set_retain_cpu_backup(bool retain);

/**
 * Whether resumes keep CPU backups ([`npu_alloc_set_retain_cpu_backup`]) into `*retain`.
 * Does not start the library.
 *
 * # Safety
 * `retain` is a writable `bool`.
 */
enum NpuAllocStatus npu_alloc_get_retain_cpu_backup(bool *retain);

/**
 * torch_memory_saver's `get_cpu_backup(x)`: copies the CPU backup of the `nbytes` bytes at
 * device address `ptr` into `dst` and sets `*found`. Paused memory of a region with CPU
 * backup has one (its bytes at the pause); memory in use has one while
 * [`npu_alloc_set_retain_cpu_backup`] kept it (its bytes at the last pause); otherwise
 * `*found` is false and `dst` untouched (upstream's `None`). Paused memory of a region
 * without backup is `Refused`; bytes outside every region's memory, or across two of its
 * segments, are `UnknownPointer`.
 *
 * # Safety
 * `dst` is writable for `nbytes` bytes and does not overlap a CPU backup (memory
 * [`npu_alloc_cpu_backup_pointer`] hands out); `found` is a writable `bool`.
 */
enum NpuAllocStatus npu_alloc_copy_cpu_backup(const void *ptr,
                                              uintptr_t nbytes,
                                              void *dst,
                                              bool *found);

/**
 * torch_memory_saver's `get_cpu_backup(x, zero_copy=True)`: the host address of the CPU
 * backup of the `nbytes` bytes at device address `ptr` into `*host`, NULL where
 * [`npu_alloc_copy_cpu_backup`] finds none (same errors). Rely on the memory only until the
 * next pause or resume of its tag: a resume without retention frees it (as upstream's, valid
 * only while the memory is paused unless retained), and so may a pause that fails. Read it, do
 * not write it.
 *
 * # Safety
 * `host` is a writable pointer.
 */
enum NpuAllocStatus npu_alloc_cpu_backup_pointer(const void *ptr, uintptr_t nbytes, void **host);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* NPU_ALLOC_H */
