"""A 2-D heat equation (5-point Jacobi) over MPI with mapping.mpi.

The grid is two distributed arrays (rows split over the ranks, `halo` rows of
the neighbours above and below each block) whose blocks live on each rank's
device. Every `halo` steps the current grid exchanges its halos; then `halo`
sweeps run on the device without communicating (each sweep needs one row
less of the halo). The result, gathered to rank 0, must equal a serial numpy
run of the same arithmetic bit for bit.

    mpiexec -n 4 python examples/python/jacobi_mpi.py [rows cols steps halo]

The kernel runs on the back end of $MAPPING_BACKEND (default: the best one):
OpenCL, a PyOpenCL kernel on the array's stream; host, numpy in a host
function on the stream (the host back end's device memory is host memory,
seen through DLPack). No synchronize() anywhere: the exchange waits for the
kernel that wrote the boundary rows, and the gather for the last one.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

import mapping
import mapping.mpi

OPENCL_KERNEL = r"""
#pragma OPENCL FP_CONTRACT OFF
__kernel void jacobi(__global const float *u, __global float *v, int cols, int lo, int g0, int grows)
{
    int r = lo + (int)get_global_id(1), c = (int)get_global_id(0), g = g0 + r;
    if (g < 1 || g > grows - 2)
        return; /* the grid's boundary rows stay fixed */
    if (c == 0 || c == cols - 1) {
        v[r * cols + c] = u[r * cols + c]; /* the boundary columns: copied (a halo row of v has none yet) */
        return;
    }
    float s = u[(r - 1) * cols + c] + u[(r + 1) * cols + c];
    s = s + u[r * cols + c - 1];
    s = s + u[r * cols + c + 1];
    v[r * cols + c] = s * 0.25f;
}
"""


def initial(rows, cols):
    """The starting grid: a fixed boundary and a pattern inside."""
    g = (np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) % 97) / np.float32(7)
    g[0, :], g[-1, :], g[:, 0], g[:, -1] = 100, 0, 50, 25
    return g


def serial(grid, steps):
    """The same arithmetic, in the same order, in one process."""
    u, v = grid.copy(), grid.copy()
    for _ in range(steps):
        s = u[:-2, 1:-1] + u[2:, 1:-1]
        s = s + u[1:-1, :-2]
        s = s + u[1:-1, 2:]
        v[1:-1, 1:-1] = s * np.float32(0.25)
        u, v = v, u
    return u


def interior(lo, hi, g0, grows):
    """Local rows lo..hi-1, less those on or past the grid's boundary rows."""
    return max(lo, 1 - g0), min(hi, grows - 1 - g0)


class HostKernel:
    """numpy on the device memory (host back end), as a host function on the stream."""

    def __init__(self, stream, arrays):
        self.stream = stream
        self.view = {id(a): np.from_dlpack(a) for a in arrays}  # the local blocks' device side

    def __call__(self, src, dst, lo, hi, g0, grows):
        U, V = self.view[id(src)], self.view[id(dst)]
        lo, hi = interior(lo, hi, g0, grows)

        def sweep():
            if lo < hi:
                s = U[lo - 1:hi - 1, 1:-1] + U[lo + 1:hi + 1, 1:-1]
                s = s + U[lo:hi, :-2]
                s = s + U[lo:hi, 2:]
                V[lo:hi, 1:-1] = s * np.float32(0.25)
                V[lo:hi, 0], V[lo:hi, -1] = U[lo:hi, 0], U[lo:hi, -1]  # a halo row of V has no boundary yet
        self.stream.launch_host(sweep)


class OpenCLKernel:
    """The kernel above, with PyOpenCL, on the stream's queue."""

    def __init__(self, stream, arrays):
        import pyopencl as cl
        ctx = cl.Context.from_int_ptr(stream.device.native[0], retain=True)
        self.queue = cl.CommandQueue.from_int_ptr(stream.native, retain=True)
        self.jacobi = cl.Program(ctx, OPENCL_KERNEL).build().jacobi
        self.mem = {id(a): cl.Buffer.from_int_ptr(a.buffer.cl_mem, retain=True) for a in arrays}
        self.cols = np.int32(arrays[0].local_shape[1])

    def __call__(self, src, dst, lo, hi, g0, grows):
        lo, hi = interior(lo, hi, g0, grows)
        if lo < hi:
            self.jacobi(self.queue, (int(self.cols), hi - lo), None, self.mem[id(src)], self.mem[id(dst)],
                        self.cols, np.int32(lo), np.int32(g0), np.int32(grows))


def run(comm, rows, cols, steps, halo, device=None):
    """The distributed solver: the result on rank 0 (None elsewhere)."""
    grid = initial(rows, cols) if comm.rank == 0 else None
    with mapping.mpi.DistArray(comm, (rows, cols), np.float32, halo=halo, device=device) as u, \
            mapping.mpi.DistArray(comm, (rows, cols), np.float32, halo=halo, device=u.device) as v:
        u.scatter(grid, root=0)
        v.scatter(grid, root=0)  # the boundary, fixed in both grids
        stream = u.device.stream()
        kernel = (OpenCLKernel if u.device.backend == "opencl" else HostKernel)(stream, [u, v])
        local_rows, g0 = u.local_shape[0], u.first_row - halo  # g0: the global row of local row 0
        cur, nxt, done = u, v, 0
        while done < steps:
            cur.halo_exchange(stream)  # after the kernel that wrote cur: no synchronize first
            for k in range(1, halo + 1):  # sweep k is valid on local rows k .. local_rows - k - 1
                if done == steps:
                    break
                with cur.gpu("r", stream, halo=True), nxt.gpu("rw", stream, halo=True):
                    kernel(cur, nxt, k, local_rows - k, g0, rows)
                cur, nxt, done = nxt, cur, done + 1
        return cur.gather(root=0, stream=stream)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    rows, cols, steps, halo = ([int(x) for x in argv] + [96, 80, 60, 2][len(argv):])[:4]
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        print("SKIP: run under mpiexec with 2 or more ranks (mpiexec -n 4 python %s)" % __file__)
        return 77
    if os.environ.get("MAPPING_BACKEND", "") not in ("", "host", "opencl"):
        if comm.rank == 0:
            print("SKIP: this example's kernel runs on the host and OpenCL back ends")
        return 77
    result = run(comm, rows, cols, steps, halo)
    if comm.rank != 0:
        return 0
    expect = serial(initial(rows, cols), steps)
    same = np.array_equal(result.view(np.uint32), expect.view(np.uint32))
    print("%s: %d x %d grid, %d steps, halo %d, %d ranks: %s" % (
        "PASS" if same else "FAIL", rows, cols, steps, halo, comm.size,
        "bit-equal to the serial run" if same else "differs from the serial run"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
