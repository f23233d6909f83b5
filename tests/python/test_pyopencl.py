"""PyOpenCL interop: a device opened on a pyopencl.Context, a PyOpenCL kernel
run on a mapping buffer and on a mirror's device side, pyopencl.Buffer and
pyopencl.CommandQueue accepted where mapping takes a buffer or a stream."""
import numpy as np
import pytest

import mapping

cl = pytest.importorskip("pyopencl", reason="PyOpenCL is not installed (pip install pyopencl)")

KERNEL = """
__kernel void scale(__global float *x, float a) { size_t i = get_global_id(0); x[i] = x[i] * a + 1.0f; }
"""


@pytest.fixture
def ctx():
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:  # no ICD
        pytest.skip("no OpenCL platform: %s" % e)
    devs = [d for p in platforms for d in p.get_devices()]
    if not devs:
        pytest.skip("no OpenCL device")
    return cl.Context([devs[0]])


def test_kernel_on_a_mapping_buffer(ctx):
    q = cl.CommandQueue(ctx)
    dev = mapping.open(context=ctx, queue=q)
    assert dev.backend == "opencl"
    prg = cl.Program(ctx, KERNEL).build()
    a = np.arange(4096, dtype=np.float32)
    g = dev.allocate_gpu(a.shape, a.dtype)
    mapping.sync_to_gpu(a, g)
    clbuf = cl.Buffer.from_int_ptr(g.cl_mem, retain=True)
    prg.scale(q, a.shape, None, clbuf, np.float32(2))
    out = np.empty_like(a)
    mapping.sync_to_cpu(g, out, stream=q)  # the caller's queue, imported as a stream: after the kernel
    q.finish()
    np.testing.assert_array_equal(out, a * 2 + 1)
    clbuf.release()
    dev.close()


def test_kernel_on_a_mirrors_device_side(ctx):
    q = cl.CommandQueue(ctx)
    dev = mapping.open(context=ctx, queue=q)
    scale = cl.Kernel(cl.Program(ctx, KERNEL).build(), "scale")
    for unified in (False, True):
        m = mapping.mirror((1 << 16,), np.float32, unified=unified, device=dev)
        with m.cpu("w") as a:
            a[:] = np.arange(a.size)
        expect = m.array * 3 + 1
        with m.gpu("rw") as buf:  # NULL stream: the kernel goes to the device's own queue, q
            assert m.gpu_offset == 0
            scale(q, m.shape, None, cl.Buffer.from_int_ptr(buf.cl_mem), np.float32(3))
        m.sync_to_cpu()
        np.testing.assert_array_equal(m.array, expect)
        m.close()
    dev.close()


def test_pyopencl_buffer_and_queue_are_accepted(ctx):
    q = cl.CommandQueue(ctx)
    a = np.arange(1000, dtype=np.int32)
    clbuf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, a.nbytes)
    mapping.sync_to_gpu(a, clbuf)  # a device on clbuf's context is opened for it
    back = np.empty_like(a)
    cl.enqueue_copy(q, back, clbuf)
    np.testing.assert_array_equal(back, a)
    out = np.empty_like(a)
    mapping.sync_to_cpu(clbuf, out, stream=q)
    q.finish()
    np.testing.assert_array_equal(out, a)
    # and a mirror over a numpy array and PyOpenCL's buffer
    host = np.zeros_like(a)
    m = mapping.mirror_adopt(host, clbuf, gpu_valid=True)
    m.sync_to_cpu()
    np.testing.assert_array_equal(host, a)
    m.close()
    clbuf.release()  # the library held its own reference only while it used it
