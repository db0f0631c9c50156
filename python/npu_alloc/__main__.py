"""``python3 -m npu_alloc --selftest``: a small allocate / free and pause / resume sequence
through the library, then a stats summary. Over the fake libascendcl (no hardware):

    NPU_ALLOC_ACL_LIB=<path to the fake libascendcl.so> python3 -m npu_alloc --selftest
"""

import argparse
import sys

import npu_alloc


def selftest():
    print("library      %s" % npu_alloc.library_path())
    blocks = [npu_alloc.malloc(size) for size in (1 << 20, 3 << 20, 512, 20 << 20)]
    npu_alloc.free(blocks.pop(1))
    with npu_alloc.region("selftest", enable_cpu_backup=True):
        kv = npu_alloc.malloc(4 << 20)
    free_before, total = npu_alloc.mem_get_info()
    npu_alloc.pause("selftest")
    free_paused, _ = npu_alloc.mem_get_info()
    npu_alloc.resume("selftest")
    npu_alloc.free(kv)
    for b in blocks:
        npu_alloc.free(b)
    stats = npu_alloc.memory_stats()
    print("device 0     %d bytes total, %d free" % (total, free_before))
    print("pause        gave back %d bytes" % (free_paused - free_before))
    for key in ("allocated_bytes.all.peak", "reserved_bytes.all.current", "segment.all.current",
                "num_alloc_retries", "num_ooms", "allocation.all.current"):
        print("%-28s %d" % (key, stats[key]))
    npu_alloc.empty_cache()
    print("after empty_cache: reserved %d bytes" % npu_alloc.memory_stats()["reserved_bytes.all.current"])
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m npu_alloc")
    parser.add_argument("--selftest", action="store_true", help="run a small sequence and print stats")
    args = parser.parse_args(argv)
    if args.selftest:
        try:
            return selftest()
        except npu_alloc.NpuAllocError as e:
            # The library's own message says what failed; a traceback adds nothing for a user.
            print("selftest failed: %s" % e, file=sys.stderr)
            return 1
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
