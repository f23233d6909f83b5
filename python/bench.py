"""Figures for the Python package (issue 12), each against a baseline measured
in the same run; every figure is the median of several runs.

    python3 python/bench.py [--quick]

1. host back end: per-call cost of mapping.sync_to_gpu(np_array_of_64_bytes, buf)
   against the same blocking copy made by a C loop (mapping_sync_to_gpu_range),
   and 256 MiB bandwidth against the C call's;
2. OpenCL (PoCL): a blocking 64 B copy and a 256 MiB copy through mapping
   against PyOpenCL's cl.enqueue_copy(..., is_blocking=True) on the same device;
3. a mirror of a 256 MiB numpy array with 1,000 scattered 64 B edits: bytes
   one Python-level sync moves, against the C figure (the edits' 64,000 bytes,
   at most 128 KiB).
"""
import os
import statistics
import sys
import time

# The source folder python/mapping has no built extension: use the installed
# package (or PYTHONPATH=build/python), not the folder this script lies in.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import numpy as np  # noqa: E402

import mapping  # noqa: E402
from mapping import _core  # noqa: E402

QUICK = "--quick" in sys.argv
RUNS = 5 if QUICK else 11
BIG = (64 if QUICK else 256) << 20


def per_call(fn, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def paired(a, b, runs=RUNS):
    """Medians of a() and b(), sampled alternately (after one warm-up each) so
    that a machine shared with other work loads both alike."""
    a(), b()
    xs, ys = [], []
    for r in range(runs):  # ABBA order: neither always runs first
        if r % 2:
            ys.append(b())
            xs.append(a())
        else:
            xs.append(a())
            ys.append(b())
    return statistics.median(xs), statistics.median(ys)


def host_figures():
    dev = mapping.open("host")
    small = np.arange(16, dtype=np.float32)  # 64 bytes
    buf = dev.allocate_gpu(64)
    iters = 20000 if QUICK else 100000
    c, py = paired(lambda: _core.bench_copies(buf._ptr(), small, iters, True) / iters,
                   lambda: per_call(lambda: mapping.sync_to_gpu(small, buf), iters))
    print("host   64 B sync_to_gpu       C %.3f us   Python %.3f us   Python - C = %+.3f us" % (
        c * 1e6, py * 1e6, (py - c) * 1e6))
    big = mapping.allocate_cpu(BIG, device=dev)
    big[:] = 1
    gbig = dev.allocate_gpu(BIG)
    c, py = paired(lambda: _core.bench_copies(gbig._ptr(), big, 4, True) / 4,
                   lambda: per_call(lambda: mapping.sync_to_gpu(big, gbig), 4))
    print("host   %d MiB sync_to_gpu    C %.2f GB/s   Python %.2f GB/s   Python/C %.3f" % (
        BIG >> 20, BIG / c / 1e9, BIG / py / 1e9, c / py))
    dev.close()


def opencl_figures():
    try:
        import pyopencl as cl
    except ImportError:
        print("SKIP opencl: PyOpenCL is not installed")
        return
    b = {x["name"]: x for x in mapping.info()["backends"]}["opencl"]
    if not b["available"]:
        print("SKIP opencl: %s" % b["reason"])
        return
    dev = mapping.open("opencl", 0)
    ctx = cl.Context([d for p in cl.get_platforms() for d in p.get_devices()][:1])
    q = cl.CommandQueue(ctx)
    small = np.arange(16, dtype=np.float32)
    buf = dev.allocate_gpu(64)
    clsmall = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64)
    iters = 2000 if QUICK else 10000
    pcl, py = paired(lambda: per_call(lambda: cl.enqueue_copy(q, clsmall, small, is_blocking=True), iters),
                     lambda: per_call(lambda: mapping.sync_to_gpu(small, buf), iters))
    print("opencl 64 B blocking copy     PyOpenCL %.3f us   mapping %.3f us   mapping/PyOpenCL %.3f" % (
        pcl * 1e6, py * 1e6, py / pcl))
    big = mapping.allocate_cpu(BIG, device=dev)
    big[:] = 1
    gbig = dev.allocate_gpu(BIG)
    clbig = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, BIG)
    pcl, py = paired(lambda: per_call(lambda: cl.enqueue_copy(q, clbig, big, is_blocking=True), 4),
                     lambda: per_call(lambda: mapping.sync_to_gpu(big, gbig), 4))
    print("opencl %d MiB blocking copy  PyOpenCL %.2f GB/s   mapping %.2f GB/s   mapping/PyOpenCL %.3f" % (
        BIG >> 20, BIG / pcl / 1e9, BIG / py / 1e9, pcl / py))
    dev.close()


def mirror_figure():
    dev = mapping.open("host")
    a = np.zeros(256 << 20, np.uint8)
    m = mapping.mirror_wrap(a, device=dev)
    m.sync_to_gpu()
    rng = np.random.default_rng(7)
    idx = rng.choice(a.size // 64, 1000, replace=False) * 64
    moved, times = [], []
    for r in range(RUNS):  # each run: 1,000 new edits, one sync
        for i in idx:
            a[i:i + 64] = r + 1
            m.mark_cpu_modified(byte_range=(int(i), 64))
        before = dev.stats()["h2d_bytes"]
        t0 = time.perf_counter()
        m.sync_to_gpu()
        times.append(time.perf_counter() - t0)
        moved.append(dev.stats()["h2d_bytes"] - before)
    print("mirror 256 MiB, 1000 scattered 64 B edits: one sync moves %d bytes (C figure: 64000 edited, "
          "at most 131072)   sync %.3f ms" % (statistics.median(moved), statistics.median(times) * 1e3))
    m.close()
    dev.close()


if __name__ == "__main__":
    print("mapping %s, Python %s, numpy %s, median of %d runs" % (mapping.version(), sys.version.split()[0],
                                                                  np.__version__, RUNS))
    host_figures()
    opencl_figures()
    mirror_figure()
