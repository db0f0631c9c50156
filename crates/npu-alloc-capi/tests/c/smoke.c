/* Calls every export of include/npu_alloc.h over the fake libascendcl (2 devices of 1 GiB,
 * set by the Rust test through FAKE_ACL_*); exits non-zero, naming the check, on the first
 * failure. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "npu_alloc.h"

static int hook_calls = 0;
static unsigned hook_devices = 0; /* a bit per device the hook was called for */
static int hook(int device) {
  hook_calls++;
  if (device >= 0 && device < 32) hook_devices |= 1u << device;
  return npu_alloc_acl_synchronize(device);
}

/* A thread-exit destructor (run after the thread's Rust thread-locals are gone) whose calls
   fail: each must return its status, not abort the process. */
static pthread_key_t exit_key;
static int exit_status = 1;
static void at_thread_exit(void *arg) {
  (void)arg;
  npu_alloc_free((void *)0x5678, 8, 0, NULL);
  exit_status = npu_alloc_free_checked((void *)0x5678) == NpuAllocStatus_UnknownPointer ? 0 : 2;
}
static void *exiting_thread(void *arg) {
  (void)arg;
  /* The thread's thread-locals exist: the last error too. */
  void *p = npu_alloc_malloc(1000, 0, NULL);
  npu_alloc_free(p, 1000, 0, NULL);
  npu_alloc_free(p, 1000, 0, NULL);
  pthread_setspecific(exit_key, (void *)1);
  return NULL;
}

static int drain_calls = 0;
static int drain(int device) {
  (void)device;
  drain_calls++;
  return 0;
}

static int oom_calls = 0;
static int64_t oom_args[4];
static void oom_observer(int64_t device, int64_t alloc_size, int64_t device_total,
                         int64_t device_free) {
  oom_calls++;
  oom_args[0] = device;
  oom_args[1] = alloc_size;
  oom_args[2] = device_total;
  oom_args[3] = device_free;
}

static int (*acl_set_device)(int32_t);
static int (*acl_get_device)(int32_t *);

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      char err[512];                                                  \
      npu_alloc_last_error(err, sizeof err);                          \
      fprintf(stderr, "check failed: %s (last error: %s)\n", #cond, err); \
      return 1;                                                       \
    }                                                                 \
  } while (0)

int main(void) {
  /* The same libascendcl the library loads (one instance): the host program's own device calls. */
  void *acl = dlopen(getenv("NPU_ALLOC_ACL_LIB"), RTLD_NOW);
  if (acl == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  acl_set_device = (int (*)(int32_t))dlsym(acl, "aclrtSetDevice");
  acl_get_device = (int (*)(int32_t *))dlsym(acl, "aclrtGetDevice");
  CHECK(acl_set_device != NULL && acl_get_device != NULL);
  uint64_t (*acl_calls)(const char *) = (uint64_t (*)(const char *))dlsym(acl, "fake_acl_calls");
  CHECK(acl_calls != NULL);
  /* Setting the hook does not start the library: torch_npu's aclInit comes first. */
  npu_alloc_set_synchronize_hook(hook);
  npu_alloc_set_synchronize_hook(NULL);
  /* Nor does attaching an out-of-memory observer (torch_npu's OOM_SNAPSHOT_ENABLE does it at its
     own start). */
  CHECK(npu_alloc_attach_out_of_memory_observer(oom_observer) == NpuAllocStatus_Ok);
  CHECK(npu_alloc_attach_out_of_memory_observer(NULL) == NpuAllocStatus_InvalidArgument);
  /* Nor does turning the history on: it records from the start (c_abi.rs reads the first
     allocation's entries in the snapshot). */
  CHECK(npu_alloc_record_memory_history(true, 1000) == NpuAllocStatus_Ok);
  bool history = false;
  CHECK(npu_alloc_is_history_enabled(&history) == NpuAllocStatus_Ok);
  CHECK(history);
  /* Nor does keeping CPU backups across resumes (torch_memory_saver's retain_cpu_backup). */
  CHECK(npu_alloc_set_retain_cpu_backup(true) == NpuAllocStatus_Ok);
  bool retain = false;
  CHECK(npu_alloc_get_retain_cpu_backup(&retain) == NpuAllocStatus_Ok && retain);
  CHECK(npu_alloc_get_retain_cpu_backup(NULL) == NpuAllocStatus_InvalidArgument);
  CHECK(acl_calls("aclInit") == 0);
  npu_alloc_init(2);
  CHECK(acl_calls("aclInit") == 1);
  CHECK(npu_alloc_malloc(0, 0, NULL) == NULL);
  void *a = npu_alloc_malloc(3 << 20, 0, NULL);
  CHECK(a != NULL);
  void *b = npu_alloc_malloc(1000, 1, NULL);
  CHECK(b != NULL);

  char stats[16384];
  size_t needed = 0;
  CHECK(npu_alloc_memory_stats(0, NULL, 0, &needed) == NpuAllocStatus_BufferTooSmall);
  CHECK(needed > 100 && needed < sizeof stats);
  CHECK(npu_alloc_memory_stats(0, stats, sizeof stats, &needed) == NpuAllocStatus_Ok);
  /* 3 MiB + torch_npu's 32-byte pad, rounded to 512. */
  CHECK(strstr(stats, "\"allocated_bytes.all.current\":3146240") != NULL);
  char summary[8192];
  CHECK(npu_alloc_memory_summary(0, false, summary, sizeof summary, &needed) == NpuAllocStatus_Ok);
  CHECK(strstr(summary, "PyTorch NPU memory summary, device ID 0 ") != NULL);
  CHECK(npu_alloc_memory_summary(0, true, NULL, 0, &needed) == NpuAllocStatus_BufferTooSmall);
  CHECK(npu_alloc_reset_peak_memory_stats(0) == NpuAllocStatus_Ok);
  CHECK(npu_alloc_reset_accumulated_stats(0) == NpuAllocStatus_Ok);
  CHECK(npu_alloc_reset_accumulated_stats(9) == NpuAllocStatus_InvalidArgument);
  CHECK(npu_alloc_memory_stats(0, stats, sizeof stats, &needed) == NpuAllocStatus_Ok);
  CHECK(strstr(stats, "\"num_device_alloc\":0,") != NULL);

  size_t free_bytes = 0, total = 0;
  CHECK(npu_alloc_mem_get_info(0, &free_bytes, &total) == NpuAllocStatus_Ok);
  CHECK(total == (size_t)1 << 30);
  CHECK(npu_alloc_mem_get_info(0, NULL, &total) == NpuAllocStatus_InvalidArgument);

  size_t base_size = 0;
  CHECK(npu_alloc_base_alloc(a, &base_size) == a);
  CHECK(base_size == 20 << 20);
  /* Not an address malloc returned: itself, the size untouched. */
  char *inside = (char *)a + 512;
  base_size = 7;
  CHECK(npu_alloc_base_alloc(inside, &base_size) == inside);
  CHECK(base_size == 7);

  npu_alloc_record_stream(a, NULL); /* checked, refused: a null stream */
  CHECK(npu_alloc_record_stream_handle(a, NULL) == NpuAllocStatus_Ok);
  CHECK(npu_alloc_record_stream_handle(NULL, NULL) == NpuAllocStatus_InvalidArgument);
  npu_alloc_erase_stream(a, NULL);
  CHECK(npu_alloc_erase_stream_handle(a, NULL) == NpuAllocStatus_Ok);
  CHECK(npu_alloc_erase_stream_handle(NULL, NULL) == NpuAllocStatus_InvalidArgument);
  CHECK(npu_alloc_erase_stream_handle((void *)0x1234, NULL) == NpuAllocStatus_UnknownPointer);

  /* Errors: out of range, NaN, unknown pointer, double free, out of memory. */
  CHECK(npu_alloc_malloc(1000, 7, NULL) == NULL);
  CHECK(npu_alloc_set_per_process_memory_fraction(NAN, 0) == NpuAllocStatus_InvalidArgument);
  CHECK(npu_alloc_set_per_process_memory_fraction(0.5, 0) == NpuAllocStatus_Ok);
  double fraction = 0;
  CHECK(npu_alloc_get_per_process_memory_fraction(0, &fraction) == NpuAllocStatus_Ok);
  CHECK(fraction == 0.5);
  CHECK(npu_alloc_get_per_process_memory_fraction(0, NULL) == NpuAllocStatus_InvalidArgument);
  npu_alloc_set_memory_fraction(1.0, 0);
  /* The void hooks report a refusal on stderr (c_abi.rs reads it) and in the last error. */
  npu_alloc_set_memory_fraction(2.0, 0);
  npu_alloc_reset_peak_stats(9);
  char hook_err[512];
  CHECK(npu_alloc_last_error(hook_err, sizeof hook_err) > 1);
  CHECK(strstr(hook_err, "Invalid device argument 9") != NULL);
  npu_alloc_free((void *)0x1234, 8, 0, NULL);
  char err[512];
  CHECK(npu_alloc_last_error(err, sizeof err) > 1);
  CHECK(strstr(err, "0x1234") != NULL);
  npu_alloc_free(NULL, 0, 0, NULL);
  CHECK(npu_alloc_free_checked((void *)0x1234) == NpuAllocStatus_UnknownPointer);
  CHECK(npu_alloc_free_checked(NULL) == NpuAllocStatus_Ok);
  CHECK(npu_alloc_malloc((size_t)8 << 30, 0, NULL) == NULL);
  npu_alloc_last_error(err, sizeof err);
  CHECK(strstr(err, "NPU out of memory") != NULL);
  /* The same with a status; the out-parameter is written only on success. */
  void *c = (void *)0x1;
  CHECK(npu_alloc_malloc_checked((size_t)8 << 30, 0, NULL, &c) == NpuAllocStatus_OutOfMemory);
  CHECK(c == (void *)0x1);
  /* Each out-of-memory error reached the observer: the segment it tried to get (8 GiB + the
     pad, rounded to 2 MiB) and the device's total (no fraction below 1 is set). */
  CHECK(oom_calls == 2);
  CHECK(oom_args[0] == 0 && oom_args[1] == ((int64_t)8 << 30) + (2 << 20));
  CHECK(oom_args[2] == (int64_t)1 << 30 && oom_args[3] > 0 && oom_args[3] <= (int64_t)1 << 30);
  CHECK(npu_alloc_malloc_checked(1000, 7, NULL, &c) == NpuAllocStatus_InvalidArgument);
  CHECK(npu_alloc_malloc_checked(1000, 0, NULL, NULL) == NpuAllocStatus_InvalidArgument);
  CHECK(npu_alloc_malloc_checked(0, 0, NULL, &c) == NpuAllocStatus_Ok && c == NULL);
  CHECK(npu_alloc_malloc_checked(1000, 0, NULL, &c) == NpuAllocStatus_Ok && c != NULL);
  CHECK(npu_alloc_free_checked(c) == NpuAllocStatus_Ok);

  CHECK(npu_alloc_set_allocator_settings("max_split_size_mb:64") == NpuAllocStatus_Ok);
  /* A key torch_npu's _set_allocator_settings does not take refuses the whole string, as it
     raises there; a bad value only warns on stderr, and the rest applies. */
  CHECK(npu_alloc_set_allocator_settings("bogus_key:7,max_split_size_mb:64") == NpuAllocStatus_Refused);
  char refusal[256];
  npu_alloc_last_error(refusal, sizeof refusal);
  CHECK(strstr(refusal, "does not take bogus_key") != NULL);
  CHECK(npu_alloc_set_allocator_settings("max_split_size_mb:x,max_split_size_mb:64") == NpuAllocStatus_Ok);
  CHECK(npu_alloc_set_allocator_settings(NULL) == NpuAllocStatus_InvalidArgument);
  history = false;
  CHECK(npu_alloc_is_history_enabled(&history) == NpuAllocStatus_Ok);
  CHECK(history);
  CHECK(npu_alloc_is_history_enabled(NULL) == NpuAllocStatus_InvalidArgument);

  uint64_t pool = 0;
  CHECK(npu_alloc_mem_pool_create(0, &pool) == NpuAllocStatus_Ok);
  CHECK(pool == 1);
  CHECK(npu_alloc_mem_pool_set_use_on_oom(0, pool, true) == NpuAllocStatus_Ok);
  CHECK(npu_alloc_mem_pool_set_no_split(0, pool) == NpuAllocStatus_Ok);
  CHECK(npu_alloc_mem_pool_set_use_on_oom(0, 99, true) == NpuAllocStatus_Refused);
  CHECK(npu_alloc_mem_pool_set_no_split(0, 99) == NpuAllocStatus_Refused);
  CHECK(npu_alloc_mem_pool_begin(0, pool) == NpuAllocStatus_Ok);
  /* The pool object and the scope; a second scope of the same pool is refused, as in torch. */
  uint32_t holders = 0;
  CHECK(npu_alloc_mem_pool_use_count(0, pool, &holders) == NpuAllocStatus_Ok && holders == 2);
  CHECK(npu_alloc_mem_pool_begin(0, pool) == NpuAllocStatus_Refused);
  CHECK(npu_alloc_mem_pool_use_count(0, pool, NULL) == NpuAllocStatus_InvalidArgument);
  void *p = npu_alloc_malloc(4096, 0, NULL);
  CHECK(p != NULL);
  /* no_split: the pool's 4 KiB allocation took its whole 2 MiB segment. */
  void *whole = npu_alloc_malloc(4096, 0, NULL);
  CHECK((char *)whole - (char *)p >= (2 << 20) || (char *)p - (char *)whole >= (2 << 20));
  npu_alloc_free(whole, 4096, 0, NULL);
  CHECK(npu_alloc_mem_pool_end(0, pool) == NpuAllocStatus_Ok);
  CHECK(npu_alloc_mem_pool_end(0, pool) == NpuAllocStatus_Refused);
  npu_alloc_free(p, 4096, 0, NULL);
  CHECK(npu_alloc_mem_pool_release(0, pool) == NpuAllocStatus_Ok);

  CHECK(npu_alloc_region_begin(0, "kv", true) == NpuAllocStatus_Ok);
  void *kv = npu_alloc_malloc(2 << 20, 0, NULL);
  CHECK(kv != NULL);
  CHECK(npu_alloc_region_end(0) == NpuAllocStatus_Ok);
  int (*write_device)(uint64_t, const void *, size_t) =
      (int (*)(uint64_t, const void *, size_t))dlsym(acl, "fake_acl_write_device");
  CHECK(write_device != NULL && write_device((uint64_t)(uintptr_t)kv + 8, "kv!", 3) == 0);
  /* In use and never paused: no backup yet (upstream's None). */
  char backup[3] = {0};
  bool found = true;
  CHECK(npu_alloc_copy_cpu_backup((char *)kv + 8, 3, backup, &found) == NpuAllocStatus_Ok && !found);
  /* A margin no device keeps free: a new segment of a region runs out of memory; the default
     pool is not checked. */
  CHECK(npu_alloc_set_memory_margin_bytes((uint64_t)1 << 50) == NpuAllocStatus_Ok);
  CHECK(npu_alloc_region_begin(0, "kv", true) == NpuAllocStatus_Ok);
  void *refused = NULL;
  CHECK(npu_alloc_malloc_checked(64 << 20, 0, NULL, &refused) == NpuAllocStatus_OutOfMemory);
  CHECK(npu_alloc_region_end(0) == NpuAllocStatus_Ok);
  void *unchecked = NULL;
  CHECK(npu_alloc_malloc_checked(64 << 20, 0, NULL, &unchecked) == NpuAllocStatus_Ok);
  npu_alloc_free(unchecked, 64 << 20, 0, NULL);
  CHECK(npu_alloc_set_memory_margin_bytes(0) == NpuAllocStatus_Ok);
  npu_alloc_set_synchronize_hook(hook);
  CHECK(npu_alloc_pause("kv") == NpuAllocStatus_Ok);
  CHECK(npu_alloc_copy_cpu_backup((char *)kv + 8, 3, backup, &found) == NpuAllocStatus_Ok && found);
  CHECK(memcmp(backup, "kv!", 3) == 0);
  void *host = NULL;
  CHECK(npu_alloc_cpu_backup_pointer((char *)kv + 8, 3, &host) == NpuAllocStatus_Ok);
  CHECK(host != NULL && memcmp(host, "kv!", 3) == 0);
  /* Memory no region allocated, and a null destination. */
  void *plain = npu_alloc_malloc(4096, 0, NULL);
  found = true;
  CHECK(npu_alloc_copy_cpu_backup(plain, 3, backup, &found) == NpuAllocStatus_UnknownPointer);
  CHECK(found); /* untouched on error */
  found = false;
  CHECK(npu_alloc_copy_cpu_backup(kv, 0, NULL, &found) == NpuAllocStatus_Ok && found);
  CHECK(npu_alloc_copy_cpu_backup(kv, 3, NULL, &found) == NpuAllocStatus_InvalidArgument);
  CHECK(npu_alloc_cpu_backup_pointer(kv, 3, NULL) == NpuAllocStatus_InvalidArgument);
  npu_alloc_free(plain, 4096, 0, NULL);
  /* Once for each device the library opened (b is on device 1), never with -1. */
  CHECK(hook_calls == 2 && hook_devices == 3);
  CHECK(npu_alloc_pause("kv") == NpuAllocStatus_Refused); /* already paused */
  CHECK(hook_calls == 4); /* the hook runs before the pause is judged */
  bool known = false;
  CHECK(npu_alloc_memory_saver_has_tag("kv", &known) == NpuAllocStatus_Ok && known);
  CHECK(npu_alloc_memory_saver_has_tag("cuda_graph", &known) == NpuAllocStatus_Ok && !known);
  CHECK(npu_alloc_memory_saver_has_tag("kv", NULL) == NpuAllocStatus_InvalidArgument);
  /* The kv segment, paused: 2 MiB + 32 bytes is a large-pool request below 10 MiB, so a
     20 MiB segment. */
  char saver[512];
  CHECK(npu_alloc_memory_saver_stats(0, saver, sizeof saver, &needed) == NpuAllocStatus_Ok);
  CHECK(strstr(saver, "\"paused_bytes\":{\"current\":20971520,\"peak\":20971520}") != NULL);
  CHECK(strstr(saver, "\"tag\":\"kv\",\"paused\":true,\"segments\":1,\"bytes\":20971520,") != NULL);
  CHECK(npu_alloc_resume(NULL) == NpuAllocStatus_Ok);
  /* Retained by the resume (set before the start): still the pause's bytes, at the same host
     address. */
  CHECK(npu_alloc_copy_cpu_backup((char *)kv + 8, 3, backup, &found) == NpuAllocStatus_Ok && found);
  void *kept = NULL;
  CHECK(npu_alloc_cpu_backup_pointer((char *)kv + 8, 3, &kept) == NpuAllocStatus_Ok && kept == host);
  CHECK(npu_alloc_set_retain_cpu_backup(false) == NpuAllocStatus_Ok);
  npu_alloc_free(kv, 2 << 20, 0, NULL);

  /* With the synchronize hook set, the free of a block used on another stream drains the
     host's queue first, with the drain hook. */
  npu_alloc_set_drain_hook(drain);
  int (*create_stream)(void **) = (int (*)(void **))dlsym(acl, "aclrtCreateStream");
  void *side = NULL;
  CHECK(create_stream != NULL && create_stream(&side) == 0);
  void *q = npu_alloc_malloc(4096, 0, NULL);
  CHECK(npu_alloc_record_stream_handle(q, side) == NpuAllocStatus_Ok);
  /* Freed from a thread whose device the host made 1 behind the library's back: recording the
     event binds device 0 (the library's cache of the binding is not trusted), then 1 again. */
  CHECK(acl_set_device(1) == 0);
  uint64_t sets = acl_calls("aclrtSetDevice");
  CHECK(npu_alloc_free_checked(q) == NpuAllocStatus_Ok);
  CHECK(drain_calls == 1);
  CHECK(acl_calls("aclrtSetDevice") == sets + 2);
  int32_t bound = -1;
  CHECK(acl_get_device(&bound) == 0 && bound == 1);
  npu_alloc_set_drain_hook(NULL);

  CHECK(npu_alloc_dump_snapshot(getenv("SNAPSHOT_PATH")) == NpuAllocStatus_Ok);
  npu_alloc_free(a, 3 << 20, 0, NULL);
  npu_alloc_free(a, 3 << 20, 0, NULL); /* double free: refused, nothing changes */
  npu_alloc_free(b, 1000, 1, NULL);
  npu_alloc_reset_peak_stats(0);
  /* The host program (torch_npu) makes device 0 its thread's device; emptying the cache binds
     device 1 to free its segment, then device 0 again. */
  CHECK(acl_set_device(0) == 0);
  npu_alloc_reset(true);
  CHECK(hook_calls == 6);
  int32_t current = -1;
  CHECK(acl_get_device(&current) == 0 && current == 0);
  CHECK(npu_alloc_empty_cache() == NpuAllocStatus_Ok);
  CHECK(acl_get_device(&current) == 0 && current == 0);
  /* Without expandable segments torch_npu refuses empty_virt_addr_cache, before the hook. */
  int hooks_before = hook_calls;
  CHECK(npu_alloc_empty_virt_addr_cache() == NpuAllocStatus_Refused);
  npu_alloc_last_error(err, sizeof err);
  CHECK(strstr(err, "please enable expandable_segments") != NULL);
  CHECK(hook_calls == hooks_before);
  CHECK(acl_set_device(1) == 0);
  CHECK(npu_alloc_acl_synchronize(-1) == 0);
  CHECK(acl_get_device(&current) == 0 && current == 1);
  npu_alloc_set_synchronize_hook(NULL);
  CHECK(npu_alloc_acl_synchronize(-1) == 0);
  pthread_t t;
  CHECK(pthread_key_create(&exit_key, at_thread_exit) == 0);
  CHECK(pthread_create(&t, NULL, exiting_thread, NULL) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(exit_status == 0);
  printf("ok\n");
  return 0;
}
