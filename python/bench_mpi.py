"""Halo exchange figures for mapping.mpi (issue 39), each against a baseline
measured in the same run, on the host back end with its link model
(MAPPING_HOST_LINK, default here 25 GB/s + 5 us, as bench/mpi/halo_exchange.c):

    mpiexec -n 4 --oversubscribe python python/bench_mpi.py [--quick] [rows cols halo]

1. DistArray.halo_exchange(s) then s.synchronize(), from Python, against the
   C add-on's mapping_mpi_halo_exchange and synchronize on the same array and
   stream, timed in C (mapping._mpi.bench_exchange): target <= 1.1;
2. the same against the exchange written by hand with mpi4py: the boundary
   rows (two mirror views) synced to the host, s.synchronize(), comm.Sendrecv
   of the numpy slices up then down, the halos marked and synced to the
   device, s.synchronize(): target <= 1.0;
3. delta halos: the bytes an exchange hands to MPI when 10 % of each boundary
   row changes per step (a window that moves; the kernel marks what it wrote),
   full against delta, and their times.

Before each sample the owned rows are marked modified on the device (a
kernel's output), so every variant has the same copies to make; the ranks
meet at a barrier, each sample is the slowest rank's time, the variants take
turns (the order turns each round), and the figures are medians.
"""
import os
import statistics
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]  # the installed package, not this folder
os.environ.setdefault("MAPPING_HOST_LINK", "25e9,5e-6")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import mapping.mpi  # noqa: E402
from mapping import _mpi  # noqa: E402

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
args = [a for a in sys.argv[1:] if not a.startswith("--")]
QUICK = "--quick" in sys.argv
ROWS, COLS, HALO = ([int(x) for x in args] + [4096, 4096, 2][len(args):])[:3]
RUNS = 7 if QUICK else 101


def slowest(seconds):
    return comm.allreduce(seconds, op=MPI.MAX)


def timed(fn):
    comm.Barrier()
    t0 = MPI.Wtime()
    fn()
    return slowest(MPI.Wtime() - t0)


class ByHand:
    """The exchange as a careful mpi4py user writes it with mapping's mirrors."""

    def __init__(self, a, stream):
        h, n = a.halo, a.local_shape[0]
        self.s, self.local, self.h, self.n = stream, a.local, h, n
        self.up = rank - 1 if rank > 0 else MPI.PROC_NULL
        self.down = rank + 1 if rank < size - 1 else MPI.PROC_NULL
        m = a.mirror
        self.send = [v for v, nb in ((m[h:2 * h], self.up), (m[n - 2 * h:n - h], self.down)) if nb != MPI.PROC_NULL]
        self.recv = [v for v, nb in ((m[:h], self.up), (m[n - h:], self.down)) if nb != MPI.PROC_NULL]

    def __call__(self):
        h, n, x = self.h, self.n, self.local
        for v in self.send:
            v.sync_to_cpu(self.s)
        self.s.synchronize()
        comm.Sendrecv(x[h:2 * h], dest=self.up, recvbuf=x[n - h:], source=self.down)
        comm.Sendrecv(x[n - 2 * h:n - h], dest=self.down, recvbuf=x[:h], source=self.up)
        for v in self.recv:
            v.mark_cpu_modified()
            v.sync_to_gpu(self.s)
        self.s.synchronize()


def exchange_figures():
    a = mapping.mpi.DistArray(comm, (ROWS, COLS), np.float32, halo=HALO, device="host")
    s = a.device.stream()
    a.mirror.sync_to_gpu()
    by_hand, ptr, sp = ByHand(a, s), a._h.ptr, s._h.ptr
    t = {"python": [], "c": [], "hand": []}

    def python():
        a.halo_exchange(s)
        s.synchronize()
    names = ("python", "c", "hand")
    for r in range(-2, RUNS):  # two warm-up rounds; the order turns each round
        samples = {}
        for name in names[r % 3:] + names[:r % 3]:
            a.owned_mirror.mark_gpu_modified()
            if name == "c":
                comm.Barrier()
                samples[name] = slowest(_mpi.bench_exchange(ptr, sp))
            else:
                samples[name] = timed(python if name == "python" else by_hand)
        if r >= 0:
            for k, v in samples.items():
                t[k].append(v)
    med = {k: statistics.median(v) for k, v in t.items()}
    a.close()
    return med


def delta_figures(steps):
    """MPI bytes and time per exchange, full and delta, when a window of 10 %
    of each boundary row changes per step on the device."""
    out = {}
    for delta in (False, True):
        a = mapping.mpi.DistArray(comm, (ROWS, COLS), np.float32, halo=1, device="host", delta=delta)
        s = a.device.stream()
        a.mirror.sync_to_gpu()
        dev = np.from_dlpack(a)  # the device side (host back end)
        row, w = COLS * 4, COLS // 10
        a.halo_exchange(s)
        s.synchronize()
        before, times = a.stats(), []
        for step in range(steps):
            lo = (step * w) % (COLS - w)
            for r in (1, a.local_shape[0] - 2):  # the first and last owned rows, on the device
                dev[r, lo:lo + w] += 1
                a.mirror.mark_gpu_modified(byte_range=(r * row + lo * 4, w * 4))
            times.append(timed(lambda: (a.halo_exchange(s), s.synchronize())))
        after = a.stats()
        sent = comm.allreduce(after["mpi_bytes_sent"] - before["mpi_bytes_sent"]) / steps
        out[delta] = (sent, statistics.median(times))
        a.close()
    return out


def main():
    if size < 2:
        print("run under mpiexec with 2 or more ranks: mpiexec -n 4 --oversubscribe python python/bench_mpi.py")
        return 2
    med = exchange_figures()
    delta = delta_figures(RUNS)
    if rank != 0:
        return 0
    link = os.environ["MAPPING_HOST_LINK"]
    print("halo exchange, %d ranks, %d x %d float32, halo %d rows, host link %s (MAPPING_HOST_LINK), median of %d, "
          "slowest rank" % (size, ROWS, COLS, HALO, link, RUNS))
    r1, r2 = med["python"] / med["c"], med["python"] / med["hand"]
    print("  Python DistArray.halo_exchange  %8.1f us" % (med["python"] * 1e6))
    print("  C mapping_mpi_halo_exchange     %8.1f us   Python / C = %.3f (target <= 1.1: %s)"
          % (med["c"] * 1e6, r1, "met" if r1 <= 1.1 else "not met"))
    print("  mpi4py Sendrecv by hand         %8.1f us   Python / by hand = %.3f (target <= 1.0: %s)"
          % (med["hand"] * 1e6, r2, "met" if r2 <= 1.0 else "not met"))
    (fs, ft), (ds, dt) = delta[False], delta[True]
    print("delta halos, halo 1, 10 % of each boundary row changed per step (on the device, marked), all ranks:")
    print("  full   %9.0f bytes to MPI per exchange  %8.1f us" % (fs, ft * 1e6))
    print("  delta  %9.0f bytes to MPI per exchange  %8.1f us   bytes delta / full = %.3f"
          % (ds, dt * 1e6, ds / fs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
