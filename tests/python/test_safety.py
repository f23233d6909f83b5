"""Issue 23: memory safety whatever the user does, and strictness where numpy
is strict. Each case that could crash the interpreter runs in its own process
(a segfault is a failed test, not a dead pytest)."""
import array
import copy
import gc
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import weakref

import numpy as np
import pytest

import mapping
from mapping import _core

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mapping.__file__)))


def run_isolated(code, backend="host", env=None):
    """Runs code in a fresh interpreter with this package; returns its output.
    A crash or a failed assertion fails the test with the output."""
    e = dict(os.environ)
    e["PYTHONPATH"] = PKG_ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e["MAPPING_BACKEND"] = backend
    if backend == "opencl":
        e["MAPPING_DEVICE"] = "0"
    e.update(env or {})
    prologue = "import gc, sys, weakref, array\nimport numpy as np\nimport mapping\nfrom mapping import _core\n"
    r = subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)], env=e, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, "exit status %d\n--- stdout\n%s\n--- stderr\n%s" % (r.returncode, r.stdout, r.stderr)
    return r.stdout


class Gate:
    """Holds a stream at a point (a host function waiting on an Event) until
    opened, so work queued behind it is still pending when the test acts."""

    def __init__(self, stream):
        self.event = threading.Event()
        mapping.launch_host(stream, self.event.wait)

    def open(self):
        self.event.set()


# ---- 1. a DLPack export holds its memory until the consumer's deleter runs ----

def test_dlpack_view_outlives_buffer_and_device_close():
    out = run_isolated("""
        dev = mapping.open("host")
        buf = dev.allocate_gpu((1 << 20,), np.float32)      # 4 MiB
        mapping.sync_to_gpu(np.arange(1 << 20, dtype=np.float32), buf)
        view = np.from_dlpack(buf)
        buf.close()
        dev.close()
        junk = [np.ones(1 << 20, np.float32) for _ in range(4)]  # reuse freed memory, if it were freed
        assert view[12345] == 12345.0 and view.sum() == np.arange(1 << 20, dtype=np.float64).sum()
        with __import__("pytest").raises(mapping.InvalidHandleError):
            buf.get()
        del view
        gc.collect()
        print("ok")
    """)
    assert "ok" in out


def test_dlpack_export_is_writable_on_host():
    dev = mapping.open("host")
    buf = dev.allocate_gpu((4,), np.float32)
    a = np.from_dlpack(buf)
    assert a.flags.writeable
    a[:] = 5
    np.testing.assert_array_equal(buf.get(), [5, 5, 5, 5])
    dev.close()


# ---- 2. a host buffer used by queued work cannot be resized ----

def test_resize_under_a_queued_stream_copy_raises_buffer_error():
    dev = mapping.open("host")
    g = dev.allocate_gpu(4096)
    s = dev.stream()
    gate = Gate(s)
    try:
        ba = bytearray(b"x" * 4096)
        mapping.sync_to_gpu(ba, g, stream=s)
        with pytest.raises(BufferError):
            ba.extend(b"y" * (1 << 20))  # would move the memory the stream still reads
        aa = array.array("b", bytes(4096))
        mapping.sync_to_cpu(g, aa, stream=s)
        with pytest.raises(BufferError):
            aa.extend(range(100))
    finally:
        gate.open()
    s.synchronize()
    _core.drain()
    ba.extend(b"y")  # free again once the copies are done
    aa.extend(range(100))
    assert bytes(aa[:4096]) == b"x" * 4096
    dev.close()


def test_resize_under_a_batch_add_and_mirror_wrap_raises_buffer_error(device):
    g = device.allocate_gpu(64)
    ba = bytearray(64)
    b = device.batch()
    b.add_to_gpu(ba, g)
    with pytest.raises(BufferError):
        ba.extend(bytes(1 << 16))
    b.flush()
    ba.extend(b"ok")
    wrapped = bytearray(4096)
    m = mapping.mirror_wrap(wrapped, device=device)
    with pytest.raises(BufferError):
        del wrapped[100:]
    m.close()
    del wrapped[100:]
    b.close()


# ---- 3. synchronize releases only completed work ----

def test_synchronize_on_one_thread_keeps_what_another_thread_queued():
    """Thread B synchronizes in a loop while thread A queues copies of fresh
    arrays: an array is never let go before its copy is done."""
    out = run_isolated("""
        import threading
        sys.setswitchinterval(1e-6)  # hand the GIL over as often as possible
        dev = mapping.open("host")
        s = dev.stream()
        g = dev.allocate_gpu(8 << 20)  # copies long enough to be in flight when checked
        stop = threading.Event()
        def syncer():
            while not stop.is_set():
                s.synchronize()
        t = threading.Thread(target=syncer)
        t.start()
        bad = 0
        try:
            for i in range(150):
                data = np.full(8 << 20, i % 251, np.uint8)
                mapping.sync_to_gpu(data, g, stream=s)
                ev = s.record()
                ref = weakref.ref(data)
                del data
                junk = np.full(8 << 20, 255, np.uint8)  # takes the freed memory, if it were freed early
                if ref() is None and not ev.query():
                    ev.synchronize()  # let go early: the copy must still have read the array's bytes
                    back = np.empty(16, np.uint8)
                    mapping.sync_to_cpu(g, back, offset=(8 << 20) - 16)
                    bad += int((back != i % 251).any())
                del junk
        finally:
            stop.set()
            t.join()
        s.synchronize()
        assert bad == 0, "%d arrays were let go while their copy was queued" % bad
        print("ok")
    """)
    assert "ok" in out


# ---- 4. close() defers the free to the last user; a closed object raises ----

def test_close_while_a_copy_into_it_is_queued():
    dev = mapping.open("host")
    s = dev.stream()
    g = dev.allocate_gpu(1 << 16)
    handle = weakref.ref(g._h)
    gate = Gate(s)
    try:
        mapping.sync_to_gpu(np.ones(1 << 16, np.uint8), g, stream=s)
        g.close()
        assert handle() is not None  # the queued copy still holds it
        with pytest.raises(mapping.InvalidHandleError):
            g.fill(0)
    finally:
        gate.open()
    s.synchronize()
    _core.drain()
    gc.collect()
    assert handle() is None
    dev.close()


def test_mirror_adopt_then_close_the_buffer(device):
    a = np.arange(256, dtype=np.uint16)
    g = device.allocate_gpu(a.nbytes)
    m = mapping.mirror_adopt(a, g)
    g.close()
    other = device.allocate_gpu(a.nbytes)
    other.fill(0xEE)
    m.sync_to_gpu()
    np.testing.assert_array_equal(m.buffer.get().view(np.uint16), a)
    assert (other.get() == 0xEE).all()
    m.close()


def test_a_view_keeps_the_memory_of_a_closed_buffer(device):
    g = device.allocate_gpu((16,), np.int32)
    v = g.view()
    g.close()
    with pytest.raises(mapping.InvalidHandleError):
        g.view()
    later = device.allocate_gpu((16,), np.int32)
    mapping.sync_to_gpu(np.zeros(16, np.int32), later)
    mapping.sync_to_gpu(np.arange(16, dtype=np.int32), v)
    np.testing.assert_array_equal(later.get(), np.zeros(16))  # not written through the view
    np.testing.assert_array_equal(v.get(), np.arange(16))


# ---- 5. no copies or pickles of C handles ----

def test_copy_and_pickle_are_refused():
    out = run_isolated("""
        import copy, pickle
        dev = mapping.open("host")
        buf = dev.allocate_gpu(64)
        for f in (copy.copy, copy.deepcopy, pickle.dumps):
            for obj in (buf, dev, dev.stream(), mapping.mirror(64, device=dev), dev.batch()):
                try:
                    f(obj)
                except TypeError as e:
                    assert "cannot be" in str(e), e
                else:
                    raise AssertionError("%s(%r) was accepted" % (f.__name__, obj))
        gc.collect()
        buf.fill(1)  # the device is still open
        print("ok")
    """)
    assert "ok" in out


# ---- 6. object dtypes are refused everywhere ----

def test_object_dtype_is_refused():
    out = run_isolated("""
        import pytest
        dev = mapping.open("host")
        with pytest.raises(TypeError, match="object"):
            mapping.allocate_gpu((4,), object)
        with pytest.raises(TypeError, match="object"):
            mapping.mirror((4,), object)
        with pytest.raises(TypeError):
            mapping.allocate_cpu((4,), object)
        g = dev.allocate_gpu(32)
        objs = np.array([object(), "x", 3, None], dtype=object)
        with pytest.raises(TypeError, match="Python objects"):
            mapping.sync_to_gpu(objs, g)
        with pytest.raises(TypeError, match="Python objects"):
            mapping.sync_to_cpu(g, objs)
        with pytest.raises(TypeError):
            mapping.mirror_wrap(objs)
        with pytest.raises(TypeError):
            dev.batch().add_to_gpu(objs, g)
        with pytest.raises(TypeError):
            g.view(dtype=object)
        print("ok")
    """)
    assert "ok" in out


# ---- 7. undecodable driver strings; every CPython return checked ----

def test_non_utf8_driver_strings_are_replaced_not_errors():
    assert _core._text(b"Fancy \xff\xfe GPU") == "Fancy \ufffd\ufffd GPU"
    info = mapping.info()
    for b in info["backends"]:
        assert isinstance(b["name"], str) and isinstance(b["reason"], str)
        for d in b["devices"]:
            assert isinstance(d["name"], str)


# ---- 8. host memory is device memory only on the host back end ----

def test_numpy_as_device_memory_only_on_the_host_backend(opencl_device):
    out = run_isolated("""
        import pytest
        a, b = np.ones(16, np.float32), np.zeros(16, np.float32)
        with pytest.raises(TypeError, match="host memory"):
            mapping.sync_to_gpu(a, b)
        with pytest.raises(TypeError, match="host memory"):
            mapping.sync_to_cpu(a, b)
        with pytest.raises(TypeError):
            mapping.mirror_adopt(b, a)
        assert mapping.default_device().backend == "opencl"
        assert mapping.stats()["h2d_bytes"] == 0
        print("ok")
    """, backend="opencl")
    assert "ok" in out
    host = mapping.open("host")
    a, b = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    mapping.sync_to_cpu(mapping.from_dlpack(a, device=host), b)  # on host it is device memory
    np.testing.assert_array_equal(a, b)
    host.close()


# ---- 9. mirrors index and mark in the array's own shape ----

def test_mirror_marks_and_views_follow_numpy_in_its_shape(device):
    m = mapping.mirror((4, 3), np.float32, device=device)
    m.sync_to_gpu()
    assert m.stale_bytes("gpu") == 0
    m.mark_cpu_modified(slice(1, 2))  # row 1: 12 bytes at offset 12
    assert m.stale_bytes("gpu") == 12
    m.sync_to_gpu()
    m.mark_cpu_modified(np.int64(3))  # a numpy integer: row 3
    assert m.stale_bytes("gpu") == 12
    m.sync_to_gpu()
    m.mark_cpu_modified((2, slice(0, 2)))  # two elements of row 2
    assert m.stale_bytes("gpu") == 8
    m.sync_to_gpu()
    m.mark_cpu_modified(byte_range=(0, 5))
    assert m.stale_bytes("gpu") == 5
    v = m[1:3]
    assert v.shape == (2, 3) and v.nbytes == 24 and v.gpu_offset == m.gpu_offset + 12
    v.array[...] = 9
    np.testing.assert_array_equal(m.array[1:3], v.array)
    assert m[..., :].shape == (4, 3)
    with pytest.raises(mapping.InvalidArgumentError):
        m.mark_cpu_modified((slice(None), 1))  # a column is not one range
    with pytest.raises(TypeError):
        m.mark_cpu_modified([0, 1])  # fancy indexing
    with pytest.raises(TypeError):
        m.mark_cpu_modified(1.0)
    with pytest.raises(mapping.OutOfRangeError):
        m.mark_cpu_modified(4)
    with pytest.raises(mapping.OutOfRangeError):
        m.mark_cpu_modified(byte_range=(40, 9))
    g = device.allocate_gpu(8)
    mapping.sync_to_gpu(b"abcd", g, offset=np.int32(4))
    assert bytes(g.get()[4:]) == b"abcd"
    v.close()
    m.close()


# ---- 10. shapes, dtypes and messages ----

def test_shapes_dtypes_and_indices_are_checked(device):
    with pytest.raises(TypeError, match=r"allocate_gpu: shape\[0\]"):
        mapping.allocate_gpu([1.0, 2.0, 3.0], device=device)
    with pytest.raises(ValueError, match=">= 0"):
        mapping.allocate_gpu((-1, 4), np.float32, device=device)
    with pytest.raises(TypeError):
        mapping.allocate_gpu(True, device=device)
    assert mapping.allocate_gpu((3,), device=device).dtype == np.float64  # numpy's default
    assert mapping.allocate_gpu(np.int64(8), device=device).nbytes == 8
    with pytest.raises((ValueError, OverflowError)):
        mapping.pipeline(device, depth=2 ** 32 + 1)
    with pytest.raises(ValueError, match="device=-1"):
        mapping.open("host", -1)
    g = device.allocate_gpu((4,), np.float32)
    with pytest.raises(TypeError, match="float64.*float32"):
        mapping.sync_to_gpu(np.zeros(4, np.float64), g)
    with pytest.raises(TypeError, match="int32.*float32"):
        mapping.sync_to_cpu(g, np.zeros(4, np.int32))
    with pytest.raises(mapping.OutOfRangeError, match=r"^sync_to_gpu\(cpu_data, gpu, offset=8\)"):
        mapping.sync_to_gpu(np.zeros(4, np.float32), g, offset=8)
    with pytest.raises(ValueError, match="offset"):
        mapping.sync_to_gpu(np.zeros(4, np.float32), g, offset=-1)
    raw = device.allocate_gpu(16)  # untyped bytes take any dtype
    mapping.sync_to_gpu(np.zeros(2, np.float64), raw)


# ---- 11. non-native byte order is not exported through DLPack ----

def test_big_endian_buffers_are_not_exported_through_dlpack():
    dev = mapping.open("host")
    g = dev.allocate_gpu((4,), ">f4")
    with pytest.raises(BufferError, match="byte order"):
        np.from_dlpack(g)
    dev.close()


# ---- 12. one device per native context / back end and index, released when unused ----

def test_pyopencl_context_device_is_found_again_and_released(opencl_device):
    cl = pytest.importorskip("pyopencl")
    ctx = cl.Context(dev_type=cl.device_type.ALL)
    q = cl.CommandQueue(ctx)
    dev = mapping.open(context=ctx, queue=q)
    clbuf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64)
    assert mapping.as_buffer(clbuf).device is dev  # not a second hidden device
    mapping.sync_to_gpu(np.arange(16, dtype=np.float32), clbuf, stream=q)  # the user's queue is accepted
    q.finish()
    out = np.zeros(16, np.float32)
    mapping.sync_to_cpu(clbuf, out)
    np.testing.assert_array_equal(out, np.arange(16))
    other = mapping.open("opencl", 0)
    assert mapping.as_buffer(clbuf, device=dev).device is dev
    other.close()
    ref = weakref.ref(dev)
    del dev
    gc.collect()
    _core.drain()
    gc.collect()
    assert ref() is None  # a short-lived context's device is not cached forever
    # and a context seen only through its buffers gets one device, found again while used
    ctx2 = cl.Context(dev_type=cl.device_type.ALL)
    b1, b2 = cl.Buffer(ctx2, cl.mem_flags.READ_WRITE, 8), cl.Buffer(ctx2, cl.mem_flags.READ_WRITE, 8)
    x1 = mapping.as_buffer(b1)
    assert mapping.as_buffer(b2).device is x1.device
    ref = weakref.ref(x1.device)
    del x1
    gc.collect()
    assert ref() is None


# ---- 13. Pipeline.close() inside its own step ----

def test_pipeline_closed_inside_its_step_is_destroyed_after_the_run(device):
    p = mapping.pipeline(device, chunk_bytes=4096)
    handle = weakref.ref(p._h)
    seen = []

    def step(stream, chunk):
        if chunk.index == 0:
            p.close()
            seen.append(handle() is not None)
        mapping.copy_gpu(chunk.input, chunk.output, chunk.nbytes, chunk.input_offset, chunk.output_offset,
                         stream=stream)
    src = np.arange(4 * 4096, dtype=np.uint8)
    dst = np.zeros_like(src)
    p.run(src, dst, step)
    assert seen == [True]  # still there while it runs
    np.testing.assert_array_equal(src, dst)
    assert p.closed and handle() is None  # destroyed once the run is over
    with pytest.raises(mapping.InvalidHandleError):
        p.run(src, dst, step)


# ---- 16. the kernel step on the host back end ----

def test_launch_host_runs_in_stream_order():
    dev = mapping.open("host")
    g = dev.allocate_gpu((1024,), np.float32)
    s = dev.stream()
    mapping.sync_to_gpu(np.arange(1024, dtype=np.float32), g, stream=s)

    def kernel():  # gpu_result = gpu_kernel(gpu_tensor), on the host "device"
        t = np.from_dlpack(g)
        t *= 2
    mapping.launch_host(s, kernel)
    out = np.zeros(1024, np.float32)
    mapping.sync_to_cpu(g, out, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(out, np.arange(1024) * 2)

    def boom():
        raise RuntimeError("in the kernel")
    s.launch_host(boom)
    with pytest.raises(RuntimeError, match="in the kernel"):
        s.synchronize()
    with pytest.raises(TypeError):
        mapping.launch_host(s, 3)
    dev.close()


# ---- 17. several devices ----

def test_copy_peer_between_two_devices():
    a, b = mapping.open("host"), mapping.open("host")
    src = a.allocate_gpu((64,), np.int16)
    dst = b.allocate_gpu((64,), np.int16)
    mapping.sync_to_gpu(np.arange(64, dtype=np.int16), src)
    mapping.copy_peer(src, dst)
    np.testing.assert_array_equal(dst.get(), np.arange(64))
    s = b.stream()
    mapping.copy_peer(src, dst, nbytes=8, dst_offset=8, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(dst.get()[4:8], [0, 1, 2, 3])
    a.close()
    b.close()


# ---- 18. the declared Python range is the tested one ----

def test_declared_python_range_holds():
    import re
    here = os.path.dirname(os.path.abspath(__file__))
    toml = open(os.path.join(here, "..", "..", "python", "pyproject.toml")).read()
    low = re.search(r'requires-python\s*=\s*">=\s*3\.(\d+)"', toml)
    assert low, "requires-python must state a lower bound"
    assert sys.version_info >= (3, int(low.group(1)))
    src = open(os.path.join(here, "..", "..", "python", "src", "_core.c")).read()
    # APIs newer than the lowest version claimed would not build there
    newer = {"PyObject_CallOneArg": 9, "PyObject_CallNoArgs": 9, "Py_NewRef": 10, "Py_XNewRef": 10,
             "PyModule_AddObjectRef": 10, "PyModule_Add(": 13, "PyDict_GetItemRef": 13, "PyLong_AsInt(": 13}
    for name, minor in newer.items():
        if name in src:
            assert int(low.group(1)) >= minor, "%s needs Python 3.%d, pyproject claims 3.%s" % (
                name, minor, low.group(1))


def test_multimirror_over_two_devices(device):
    other = mapping.open(device.backend, 0)
    mm = mapping.multimirror([device, other], (256,), np.int32)
    mm.array[:] = np.arange(256)
    mm.mark_modified("cpu")
    assert mm.stale_bytes(0) == 1024 and mm.stale_bytes(1) == 1024
    mm.sync(0)
    s = other.stream()
    mm.sync(1, stream=s)
    s.synchronize()
    assert mm.stale_bytes(1) == 0
    np.testing.assert_array_equal(mm.replicas[1].get(), np.arange(256))
    mm.replicas[0].fill(0)
    mm.mark_modified(0)
    assert mm.stale_bytes("cpu") == 1024
    mm.sync("cpu")
    assert (mm.array == 0).all()
    with pytest.raises(mapping.OutOfRangeError):
        mm.sync(2)
    view = mm.array
    device.close()  # the multimirror keeps both devices until it is gone
    other.close()
    with pytest.raises(mapping.InvalidHandleError):
        mm.sync(0)
    view[:] = 1
    del view, mm
    gc.collect()


def test_mirror_sharded_cuts_rows_over_devices(device):
    other = mapping.open(device.backend, 0)
    a = np.arange(5 * 4, dtype=np.float32).reshape(5, 4)
    shards = mapping.mirror_sharded(a, [device, other])
    assert [s.shape for s in shards] == [(3, 4), (2, 4)]  # rows never split; the first gets one more
    for s in shards:
        s.sync_to_gpu()
    np.testing.assert_array_equal(shards[1].buffer.get()[shards[1].gpu_offset:].view(np.float32)[:8],
                                  a[3:].ravel())
    ba = bytearray(64)
    held = mapping.mirror_sharded(ba, [device, other], granule=16)
    with pytest.raises(BufferError):
        ba.extend(b"x")
    for s in held + shards:
        s.close()
    ba.extend(b"x")
    other.close()


def test_a_buffer_does_not_keep_its_last_stream_open():
    """A stream left to the collector is destroyed (waiting for its work),
    even if a buffer it wrote lives on."""
    dev = mapping.open("host")
    g = dev.allocate_gpu(1 << 20)
    s = dev.stream()
    mapping.sync_to_gpu(np.full(1 << 20, 6, np.uint8), g, stream=s)
    ref = weakref.ref(s)
    del s
    gc.collect()
    assert ref() is None
    assert (g.get() == 6).all()
    with pytest.raises(BufferError):
        g.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError):
        g.fill(True)
    with pytest.raises(mapping.OutOfRangeError):
        g.fill(0, offset=(1 << 20) + 1)
    with pytest.raises(mapping.OutOfRangeError) as e:
        mapping.sync_to_cpu(g, bytearray((1 << 20) + 1))
    assert "mapping_sync" not in str(e.value) and str(e.value).startswith("sync_to_cpu(")
    dev.close()


def test_the_extension_compiles_against_the_lowest_python_claimed():
    """Item 18: _core.c builds with the headers of the lowest Python that
    pyproject.toml claims, where an interpreter of that version is installed."""
    import glob
    import re
    import shutil
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.join(here, "..", "..")
    toml = open(os.path.join(root, "python", "pyproject.toml")).read()
    minor = int(re.search(r'requires-python\s*=\s*">=\s*3\.(\d+)"', toml).group(1))
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    incs = [p for p in glob.glob(os.path.expanduser("~/.pyenv/versions/3.%d.*/include/python3.%d" % (minor, minor)))
            + ["/usr/include/python3.%d" % minor] if os.path.exists(os.path.join(p, "Python.h"))]
    if not cc or not incs:
        pytest.skip("no Python 3.%d headers or C compiler here" % minor)
    r = subprocess.run([cc, "-fsyntax-only", "-Wall", "-Werror=implicit-function-declaration", "-I" + incs[0],
                        "-I" + os.path.join(root, "include"), os.path.join(root, "python", "src", "_core.c")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_synchronize_returning_while_another_thread_queues_keeps_its_objects():
    """Item 3, made deterministic: thread B's synchronize() is held (by a
    profile hook) just after the C sync returns, while thread A queues a copy
    of a fresh array behind a long one; when B goes on, A's array must still
    be held until its copy is done (the old sweep dropped it: a use after free)."""
    out = run_isolated("""
        import threading
        dev = mapping.open("host")
        s = dev.stream()
        g = dev.allocate_gpu(8 << 20)
        returned, queued = threading.Event(), threading.Event()

        def hook(frame, event, arg):
            if event == "c_return" and getattr(arg, "__name__", "") == "stream_sync":
                returned.set()
                queued.wait(10)

        def syncer():
            sys.setprofile(hook)
            try:
                s.synchronize()
            finally:
                sys.setprofile(None)
        t = threading.Thread(target=syncer)
        t.start()
        assert returned.wait(10)
        big, gbig = np.ones(128 << 20, np.uint8), dev.allocate_gpu(128 << 20)
        mapping.sync_to_gpu(big, gbig, stream=s)          # keeps the stream busy a while
        data = np.full(8 << 20, 7, np.uint8)
        mapping.sync_to_gpu(data, g, stream=s)
        ev = s.record()
        ref = weakref.ref(data)
        del data
        queued.set()
        t.join()
        gc.collect()
        assert ref() is not None or ev.query(), "the array was let go while its copy was queued"
        s.synchronize()
        assert (g.get() == 7).all()
        print("ok")
    """)
    assert "ok" in out


def test_a_failed_batch_flush_keeps_the_host_buffers_of_the_copies_it_left_queued():
    """A flush refused (a stream of another device) leaves its copies queued
    in the C batch: their host buffers stay held (the old package let go of
    them, and the next flush wrote into freed memory) until a flush succeeds."""
    d1, d2 = mapping.open("host"), mapping.open("host")
    g = d1.allocate_gpu(1 << 16)
    g.fill(0x41)
    b = d1.batch()
    data = np.zeros(1 << 16, np.uint8)
    raw = bytearray(1 << 12)
    b.add_to_cpu(g, data)
    b.add_to_cpu(g, raw)
    s2 = d2.stream()
    with pytest.raises(mapping.DeviceMismatchError):
        b.flush(s2)
    s2.synchronize()
    assert len(b) == 2
    ref = weakref.ref(data)
    del data
    gc.collect()
    assert ref() is not None, "a copy still queued lost its host buffer"
    with pytest.raises(BufferError):
        raw.extend(b"x")                   # still exported to the queued copy
    b.flush()                              # into live memory (the old package: into freed memory)
    assert len(b) == 0 and raw == b"A" * (1 << 12)
    gc.collect()
    assert ref() is None                   # a successful flush lets go
    raw.extend(b"x")
    d1.close()
    d2.close()


def test_a_failed_batch_flush_then_clear_or_close_lets_go():
    d1, d2 = mapping.open("host"), mapping.open("host")
    g = d1.allocate_gpu(64)
    for end in ("clear", "close"):
        b = d1.batch()
        raw = bytearray(64)
        b.add_to_gpu(raw, g)
        with pytest.raises(mapping.DeviceMismatchError):
            b.flush(d2.stream())
        getattr(b, end)()
        raw.extend(b"x")                   # nothing holds it any more
    d1.close()
    d2.close()


def test_numpy_array_of_a_mirror_copies_when_asked(device):
    """numpy 2's __array__(dtype, copy): copy=True is a new array (numpy does
    not copy again what __array__ returns), copy=False never copies (a
    conversion raises ValueError), None copies only to convert."""
    m = mapping.mirror((4,), np.float32, device=device)
    c = np.array(m, copy=True)
    c[0] = 42.0
    assert m.array[0] == 0.0 and not np.shares_memory(c, m.array)
    assert not np.shares_memory(np.array(m), m.array)        # numpy's default is copy=True
    assert np.shares_memory(np.asarray(m), m.array)
    assert np.shares_memory(np.array(m, copy=False), m.array)
    assert np.shares_memory(np.asarray(m, dtype=np.float32, copy=False), m.array)
    with pytest.raises(ValueError):
        np.asarray(m, dtype=np.float64, copy=False)
    f = np.asarray(m, dtype=np.float64)
    assert f.dtype == np.float64 and not np.shares_memory(f, m.array)
    v = m[1:3]
    cv = np.array(v, copy=True)
    cv[:] = 7
    assert (m.array == 0).all()
