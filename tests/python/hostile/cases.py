"""The hostile suite's cases (issue 23): what a careless or hostile user does
with the `mapping` package. run.py runs each in its own process.

A case is a function registered with @case(name, ...) and one expected outcome:
  raises=X           it must raise X (a class or a tuple of classes)
  ok=True            it must return (it checks its own result with assert)
  ok_or=X            either: returns (result checked), or raises X
msg=("a", "b") also requires those words in the exception's message.
Never acceptable: a crash, a hang, a SystemError, an AssertionError (wrong
data), or an exception outside the expected set. backends=("host",) limits a
case to the back ends named (run.py --backend picks one per run).
"""
import array
import copy
import gc
import os
import pickle
import sys
import threading
import traceback
import weakref

import numpy as np

import mapping

try:
    import pyopencl as cl
except Exception:  # pragma: no cover - pyopencl missing
    cl = None

# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------

CASES = {}

# Sets of acceptable exceptions where the issue does not name one class.
BAD = (TypeError, ValueError, mapping.Error)            # refused input
TYPE = (TypeError,)                                      # a Python object of the wrong type
BIG = (OverflowError, ValueError, MemoryError, mapping.Error)  # too big for the C types / memory
CLOSED = (mapping.InvalidHandleError, ValueError)       # use of a closed object
OOR = (IndexError, ValueError, mapping.Error)           # out of range
NOCOPY = (TypeError, copy.Error, pickle.PicklingError)  # copy / pickle refused
EXPORT = (BufferError, TypeError, ValueError, RuntimeError, NotImplementedError, mapping.Error)


class Case:
    __slots__ = ("name", "fn", "raises", "ok", "ok_or", "backends", "msg")

    def __init__(self, name, fn, raises=None, ok=False, ok_or=None, backends=None, msg=()):
        self.name, self.fn, self.raises, self.ok, self.ok_or = name, fn, raises, ok, ok_or
        self.backends, self.msg = backends, tuple(msg)

    def accepted(self):
        x = self.raises if self.raises is not None else self.ok_or
        if x is None:
            return ()
        out = []
        for c in (x if isinstance(x, tuple) else (x,)):
            out.extend(c if isinstance(c, tuple) else (c,))
        return tuple(out)

    def describe(self):
        names = ", ".join(dict.fromkeys(("mapping." if c.__module__ == "mapping" else "") + c.__name__
                                        for c in self.accepted()))
        if self.raises is not None:
            return "raises " + names
        if self.ok_or is not None:
            return "ok (checked) or raises " + names
        return "ok (checked)"


def case(name, raises=None, ok=False, ok_or=None, backends=None, msg=()):
    if sum(x is not None and x is not False for x in (raises, ok or None, ok_or)) != 1:
        raise ValueError("case %s: give exactly one of raises=, ok=True, ok_or=" % name)
    if isinstance(backends, str):
        backends = (backends,)

    def reg(fn):
        if name in CASES:
            raise ValueError("case %s is registered twice" % name)
        CASES[name] = Case(name, fn, raises, ok, ok_or, backends, msg)
        return fn
    return reg


def bad(name, fn, raises=BAD, backends=None, msg=()):
    """A one-line case that must raise."""
    if name in CASES:
        raise ValueError("case %s is registered twice" % name)
    CASES[name] = Case(name, fn, raises=raises, backends=backends, msg=msg)


class Skip(Exception):
    """The case cannot run here (e.g. pyopencl missing): reported as a pass with the reason."""


def judge(c):
    """Runs case c in this process and returns 'pass ...' or 'fail ...'."""
    try:
        try:
            c.fn()
        finally:
            ungate_all()  # a case that failed before opening its gate must not wait for it
    except Skip as e:
        return "pass skipped: %s" % e
    except BaseException as e:  # noqa: B902 - KeyboardInterrupt is a possible expected outcome
        traceback.print_exc()
        desc = "%s: %s" % (type(e).__name__, str(e)[:300])
        if isinstance(e, SystemError):
            return "fail SystemError (an unchecked CPython return): " + desc
        if isinstance(e, AssertionError):
            return "fail wrong result: " + desc
        acc = c.accepted()
        if acc and isinstance(e, acc):
            missing = [w for w in c.msg if w not in str(e)]
            if missing:
                return "fail the message lacks %s: %s" % (missing, desc)
            return "pass raised " + desc
        return "fail raised %s, expected %s" % (desc, "ok" if not acc else c.describe())
    gc.collect()
    if c.raises is not None:
        return "fail returned normally, expected " + c.describe()
    return "pass ok"


def expect(excs, fn, *args, **kw):
    """Inside a case: fn(*args) must raise one of excs; returns the exception."""
    try:
        fn(*args, **kw)
    except excs as e:
        if isinstance(e, SystemError):
            raise AssertionError("SystemError: %s" % e)
        return e
    raise AssertionError("%s did not raise %s" % (getattr(fn, "__name__", fn), excs))


def attempt(excs, fn, *args, **kw):
    """Inside a case: fn(*args) may raise one of excs (then None) or return its value."""
    try:
        return fn(*args, **kw)
    except excs as e:
        if isinstance(e, SystemError):
            raise AssertionError("SystemError: %s" % e)
        return None


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def dev():
    return mapping.default_device()


def backend():
    return dev().backend


def host_only():
    if backend() != "host":
        raise Skip("host back end only")


def buf(n=64, dtype=None, fill=None):
    b = mapping.allocate_gpu(n) if dtype is None else mapping.allocate_gpu((n,), dtype)
    if fill is not None:
        b.fill(fill)
    return b


def f32(n=16):
    return np.arange(n, dtype=np.float32)


def mir(shape=(16,), dtype=np.float32):
    """A mirror with both sides valid (a new mirror's device side starts stale)."""
    m = mapping.mirror(shape, dtype)
    m.sync_to_gpu()
    return m


def gpu_rows(m):
    """The device side of a float32 mirror, in its shape."""
    b = m.buffer
    return b.view((b.nbytes // 4,), np.float32).get()[m.gpu_offset // 4:][:m.nbytes // 4].reshape(m.shape)


def closed(obj):
    obj.close()
    return obj


_BIG = {}
_GATES = {}


def gated_stream(hold=False):
    """A stream whose next work waits, so the copies a case queues are still pending when it
    closes or resizes things under them: a launch_host callable waiting for a gate (opened by
    ungate(s), by the case's end, or after 0.2 s unless hold=True), or where the package has no
    launch_host, a 32 MiB copy queued first (a few milliseconds)."""
    s = mapping.stream()
    launch = getattr(mapping, "launch_host", None)
    if launch is None:
        if "src" not in _BIG:
            _BIG["src"], _BIG["dst"] = np.ones(32 * MiB, np.uint8), mapping.allocate_gpu(32 * MiB)
        mapping.sync_to_gpu(_BIG["src"], _BIG["dst"], stream=s)
        return s
    gate = threading.Event()
    _GATES[id(s)] = gate
    launch(s, lambda: gate.wait(30))
    if not hold:
        t = threading.Timer(0.2, gate.set)
        t.daemon = True
        t.start()
    return s


def ungate(s):
    g = _GATES.get(id(s))
    if g is not None:
        g.set()


def ungate_all():
    for g in list(_GATES.values()):
        g.set()


def objarr(n=8):
    a = np.empty(n, dtype=object)
    for i in range(n):
        a[i] = object()
    return a


def cl_context():
    if cl is None:
        raise Skip("pyopencl is not installed")
    for p in cl.get_platforms():
        try:
            devs = p.get_devices()
        except Exception:
            continue
        if devs:
            ctx = cl.Context(devs[:1])
            return ctx, cl.CommandQueue(ctx)
    raise Skip("no OpenCL device for pyopencl")


def run_threads(fns):
    """Runs each fn in its own thread; re-raises the first exception."""
    errors = []

    def wrap(fn):
        def go():
            try:
                fn()
            except BaseException as e:  # noqa: B902
                errors.append(e)
                traceback.print_exc()
        return go
    ts = [threading.Thread(target=wrap(f)) for f in fns]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


MiB = 1 << 20


class in_c_call:
    """An Event set when the thread inside `with` starts the C function
    named `name` (a profile hook): the other thread then acts while that
    call runs with the GIL released."""

    def __init__(self, name):
        self.name, self.event = name, threading.Event()

    def _hook(self, frame, what, arg):
        if what == "c_call" and getattr(arg, "__name__", "") == self.name:
            self.event.set()

    def __enter__(self):
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        self.event.set()  # never leave the other thread waiting
        return False

    def wait(self, timeout=10):
        return self.event.wait(timeout)

# ===========================================================================
# types: wrong types for every argument of every public function
# ===========================================================================

bad("types.open.backend_int", lambda: mapping.open(backend=1), TYPE)
bad("types.open.backend_bytes", lambda: mapping.open(backend=b"host"), TYPE)
bad("types.open.backend_unknown", lambda: mapping.open(backend="nosuch"), (ValueError, mapping.Error))
bad("types.open.device_str", lambda: mapping.open("host", device="0"), TYPE)
bad("types.open.device_float", lambda: mapping.open("host", device=0.0), TYPE)
bad("types.open.device_negative", lambda: mapping.open("host", device=-1), (ValueError, IndexError, mapping.Error))
bad("types.open.device_2_64", lambda: mapping.open("host", device=2 ** 64), BIG + TYPE)
bad("types.open.device_absent", lambda: mapping.open("host", device=10 ** 6), (ValueError, IndexError, mapping.Error))
bad("types.open.context_str", lambda: mapping.open(context="ctx"), TYPE)
bad("types.open_opencl.none", lambda: mapping.open_opencl(None), TYPE)
bad("types.allocate_gpu.str", lambda: mapping.allocate_gpu("abc"), TYPE)
bad("types.allocate_gpu.none", lambda: mapping.allocate_gpu(None), TYPE)
bad("types.allocate_gpu.float", lambda: mapping.allocate_gpu(16.0), TYPE)
bad("types.allocate_gpu.object", lambda: mapping.allocate_gpu(object()), TYPE)
bad("types.allocate_gpu.tuple_with_str", lambda: mapping.allocate_gpu((2, "a"), np.float32), TYPE)
bad("types.allocate_gpu.dtype_nonsense", lambda: mapping.allocate_gpu((4,), "nonsense"), TYPE)
bad("types.allocate_gpu.dtype_int", lambda: mapping.allocate_gpu((4,), 12345), TYPE)
bad("types.allocate_gpu.device_str", lambda: mapping.allocate_gpu(16, device="host"), TYPE)
bad("types.allocate_gpu.device_int", lambda: mapping.allocate_gpu(16, device=0), TYPE)
bad("types.allocate_cpu.str", lambda: mapping.allocate_cpu("abc"), TYPE)
bad("types.allocate_cpu.float", lambda: mapping.allocate_cpu(16.5), TYPE)
bad("types.allocate_cpu.device_object", lambda: mapping.allocate_cpu(16, device=object()), TYPE)
bad("types.sync_to_gpu.cpu_none", lambda: mapping.sync_to_gpu(None, buf()), TYPE)
bad("types.sync_to_gpu.cpu_int", lambda: mapping.sync_to_gpu(42, buf()), TYPE)
bad("types.sync_to_gpu.cpu_str", lambda: mapping.sync_to_gpu("abcd", buf()), TYPE)
bad("types.sync_to_gpu.cpu_list", lambda: mapping.sync_to_gpu([1, 2, 3], buf()), TYPE)
bad("types.sync_to_gpu.cpu_noncontiguous", lambda: mapping.sync_to_gpu(np.arange(16)[::2], buf()), BAD)
bad("types.sync_to_gpu.gpu_none", lambda: mapping.sync_to_gpu(f32(), None), TYPE)
bad("types.sync_to_gpu.gpu_int", lambda: mapping.sync_to_gpu(f32(), 12345), TYPE)
bad("types.sync_to_gpu.gpu_str", lambda: mapping.sync_to_gpu(f32(), "gpu"), TYPE)
bad("types.sync_to_gpu.offset_str", lambda: mapping.sync_to_gpu(f32(4), buf(), offset="0"), TYPE)
bad("types.sync_to_gpu.offset_float", lambda: mapping.sync_to_gpu(f32(4), buf(), offset=4.0), TYPE)
bad("types.sync_to_gpu.offset_negative", lambda: mapping.sync_to_gpu(f32(4), buf(), offset=-1), OOR)
bad("types.sync_to_gpu.offset_2_64", lambda: mapping.sync_to_gpu(f32(4), buf(), offset=2 ** 64), BIG + OOR)
bad("types.sync_to_gpu.offset_past_end", lambda: mapping.sync_to_gpu(f32(4), buf(64), offset=60), OOR)
bad("types.sync_to_gpu.data_too_big", lambda: mapping.sync_to_gpu(f32(32), buf(64)), OOR)
bad("types.sync_to_gpu.stream_int", lambda: mapping.sync_to_gpu(f32(4), buf(), stream=1), TYPE)
bad("types.sync_to_gpu.stream_str", lambda: mapping.sync_to_gpu(f32(4), buf(), stream="s"), TYPE)
bad("types.sync_to_gpu.stream_device", lambda: mapping.sync_to_gpu(f32(4), buf(), stream=dev()), TYPE)
bad("types.sync_to_cpu.dest_bytes", lambda: mapping.sync_to_cpu(buf(16), bytes(16)), BAD)
bad("types.sync_to_cpu.dest_readonly_array",
    lambda: mapping.sync_to_cpu(buf(16), np.frombuffer(bytes(16), np.uint8)), BAD)
bad("types.sync_to_cpu.dest_none", lambda: mapping.sync_to_cpu(buf(16), None), TYPE)
bad("types.sync_to_cpu.dest_noncontiguous", lambda: mapping.sync_to_cpu(buf(16), np.zeros(8, np.uint32)[::2]), BAD)
bad("types.sync_to_cpu.gpu_none", lambda: mapping.sync_to_cpu(None, np.zeros(4)), TYPE)
bad("types.sync_to_cpu.gpu_list", lambda: mapping.sync_to_cpu([1, 2], np.zeros(4)), TYPE)
bad("types.sync_to_cpu.offset_str", lambda: mapping.sync_to_cpu(buf(64), np.zeros(4, np.uint8), offset="1"), TYPE)
bad("types.sync_to_cpu.stream_float", lambda: mapping.sync_to_cpu(buf(16), np.zeros(4, np.uint8), stream=1.0), TYPE)
bad("types.copy_gpu.src_none", lambda: mapping.copy_gpu(None, buf()), TYPE)
bad("types.copy_gpu.dst_str", lambda: mapping.copy_gpu(buf(), "dst"), TYPE)
bad("types.copy_gpu.nbytes_negative", lambda: mapping.copy_gpu(buf(), buf(), nbytes=-1), OOR)
bad("types.copy_gpu.nbytes_str", lambda: mapping.copy_gpu(buf(), buf(), nbytes="8"), TYPE)
bad("types.copy_gpu.nbytes_too_big", lambda: mapping.copy_gpu(buf(64), buf(64), nbytes=65), OOR)
bad("types.copy_gpu.src_offset_negative", lambda: mapping.copy_gpu(buf(), buf(), 8, src_offset=-8), OOR)
bad("types.copy_gpu.dst_offset_2_63", lambda: mapping.copy_gpu(buf(), buf(), 8, dst_offset=2 ** 63), BIG + OOR)
bad("types.copy_gpu.stream_str", lambda: mapping.copy_gpu(buf(), buf(), stream="s"), TYPE)
bad("types.fill.value_256", lambda: buf().fill(256), (ValueError, OverflowError, mapping.Error))
bad("types.fill.value_negative", lambda: buf().fill(-1), (ValueError, OverflowError, mapping.Error))
bad("types.fill.value_float", lambda: buf().fill(1.5), (TypeError, ValueError))
bad("types.fill.value_str", lambda: buf().fill("a"), (TypeError, ValueError))
bad("types.fill.offset_past_end", lambda: buf(64).fill(0, offset=65), OOR)
bad("types.fill.nbytes_negative", lambda: buf(64).fill(0, nbytes=-5), OOR)
bad("types.fill_gpu.gpu_none", lambda: mapping.fill_gpu(None, 0), TYPE)
bad("types.view.size_mismatch", lambda: buf(64).view((3,), np.float32), BAD)
bad("types.view.shape_float", lambda: buf(64).view((16.0,), np.float32), TYPE)
bad("types.view.shape_str", lambda: buf(64).view("ab"), TYPE)
bad("types.view.shape_negative", lambda: buf(64).view((-1, -64), np.uint8), BAD)
bad("types.get.stream_str", lambda: buf(16).get(stream="s"), TYPE)
bad("types.stream.wait_str", lambda: mapping.stream().wait("event"), TYPE)
bad("types.stream.wait_none", lambda: mapping.stream().wait(None), TYPE)
bad("types.stream.wait_stream", lambda: mapping.stream().wait(mapping.stream()), TYPE)
bad("types.stream.device_str", lambda: mapping.stream(device="host"), TYPE)
bad("types.event.elapsed_str", lambda: mapping.stream().record().elapsed("end"), TYPE)
bad("types.event.elapsed_none", lambda: mapping.stream().record().elapsed(None), TYPE)
bad("types.mirror.shape_str", lambda: mapping.mirror("abc"), TYPE)
bad("types.mirror.shape_float", lambda: mapping.mirror(64.0), TYPE)
bad("types.mirror.shape_negative", lambda: mapping.mirror((-2,), np.float32), BAD)
bad("types.mirror_wrap.list", lambda: mapping.mirror_wrap([1.0, 2.0, 3.0]), TYPE + BAD)
bad("types.mirror_wrap.noncontiguous", lambda: mapping.mirror_wrap(np.zeros(16)[::2]), BAD)
bad("types.mirror_wrap.readonly", lambda: mapping.mirror_wrap(np.frombuffer(bytes(64), np.uint8)), BAD)
bad("types.mirror_wrap.bytes", lambda: mapping.mirror_wrap(bytes(64)), BAD)
bad("types.mirror_adopt.gpu_too_small", lambda: mapping.mirror_adopt(np.zeros(64, np.uint8), buf(32)), OOR)
bad("types.mirror_adopt.offset_negative",
    lambda: mapping.mirror_adopt(np.zeros(16, np.uint8), buf(64), gpu_offset=-1), OOR)
bad("types.mirror_adopt.offset_str",
    lambda: mapping.mirror_adopt(np.zeros(16, np.uint8), buf(64), gpu_offset="0"), TYPE)
bad("types.mirror_adopt.gpu_none", lambda: mapping.mirror_adopt(np.zeros(16, np.uint8), None), TYPE)
bad("types.mirror.mark_str", lambda: mir().mark_cpu_modified("a"), TYPE)
bad("types.mirror.mark_float", lambda: mir().mark_cpu_modified(1.5), TYPE)
bad("types.mirror.mark_step", lambda: mir().mark_cpu_modified(slice(0, 8, 2)), BAD)
bad("types.mirror.mark_out_of_range", lambda: mir((16,)).mark_gpu_modified(100), OOR)
bad("types.mirror.stale_side_str", lambda: mir().stale_bytes("both"), BAD)
bad("types.mirror.stale_side_list", lambda: mir().stale_bytes([]), BAD)
bad("types.mirror.cpu_access", lambda: mir().cpu("x").__enter__(), BAD)
bad("types.mirror.gpu_access", lambda: mir().gpu("read").__enter__(), BAD)
bad("types.mirror.gpu_stream_str", lambda: mir().gpu("rw", stream="s").__enter__(), TYPE)
bad("types.mirror.getitem_str", lambda: mir()["a"], TYPE + (IndexError,))
bad("types.mirror.sync_stream_int", lambda: mir().sync_to_gpu(stream=3), TYPE)
bad("types.batch.cpu_none", lambda: mapping.batch().sync_to_gpu(None, buf()), TYPE)
bad("types.batch.gpu_none", lambda: mapping.batch().sync_to_gpu(f32(4), None), TYPE)
bad("types.batch.dest_bytes", lambda: mapping.batch().sync_to_cpu(buf(16), bytes(16)), BAD)
bad("types.batch.flush_stream_str", lambda: mapping.batch().flush(stream="s"), TYPE)
bad("types.batch.device_str", lambda: mapping.batch(device="host"), TYPE)
bad("types.pipeline.chunk_negative", lambda: mapping.pipeline(chunk_bytes=-1), BIG + OOR)
bad("types.pipeline.depth_wraps", lambda: mapping.pipeline(depth=2 ** 32 + 1), BIG)
bad("types.pipeline.element_str", lambda: mapping.pipeline(element_bytes="a"), TYPE)
bad("types.pipeline.step_none", lambda: mapping.pipeline().run(np.zeros(64, np.uint8), None, None), TYPE)
bad("types.pipeline.step_int", lambda: mapping.pipeline().run(np.zeros(64, np.uint8), None, 42), TYPE)
bad("types.pipeline.src_none", lambda: mapping.pipeline().run(None, None, lambda s, c: None), TYPE)
bad("types.pipeline.dst_bytes",
    lambda: mapping.pipeline().run(np.zeros(64, np.uint8), bytes(64), lambda s, c: None), BAD)
bad("types.device.set_link_str", lambda: dev().set_link("fast"), (TypeError, ValueError))
bad("types.set_default_device.none", lambda: mapping.set_default_device(None), TYPE)
bad("types.stats.device_str", lambda: mapping.stats(device="host"), TYPE)
bad("types.reset_stats.device_int", lambda: mapping.reset_stats(device=1), TYPE)
bad("types.import_gpu.native_str", lambda: mapping.import_gpu("ptr", 4), (TypeError, ValueError))
bad("types.import_gpu.nbytes_negative", lambda: mapping.import_gpu(0, -1), BAD + (OverflowError,))
bad("types.import_stream.str", lambda: mapping.import_stream("queue"), BAD)
bad("types.from_dlpack.int", lambda: mapping.from_dlpack(42), TYPE)
bad("types.from_dlpack.none", lambda: mapping.from_dlpack(None), TYPE)
bad("types.as_buffer.int", lambda: mapping.as_buffer(42), TYPE)
bad("types.as_buffer.bytes", lambda: mapping.as_buffer(b"abcd"), TYPE)
# Issue 23 item 8: host memory as `gpu` only on the host back end.
bad("types.as_buffer.numpy_on_opencl", lambda: mapping.as_buffer(np.zeros(4)), TYPE, backends="opencl")
bad("types.sync_to_gpu.numpy_as_gpu_on_opencl", lambda: mapping.sync_to_gpu(f32(4), np.zeros(4, np.float32)),
    TYPE, backends="opencl")
bad("types.sync_to_cpu.numpy_as_gpu_on_opencl", lambda: mapping.sync_to_cpu(np.zeros(4, np.float32), f32(4)),
    TYPE, backends="opencl")
bad("types.copy_gpu.numpy_on_opencl", lambda: mapping.copy_gpu(np.zeros(4), buf(32)), TYPE, backends="opencl")


@case("types.sync_to_gpu.numpy_as_gpu_on_opencl_moves_nothing", raises=TYPE, backends="opencl")
def _():
    # The silent variant: whatever happens, stats must not claim a copy that did not reach the device.
    mapping.reset_stats()
    mapping.sync_to_gpu(f32(4), np.zeros(4, np.float32))


# ===========================================================================
# dtypes: object, structured, non-native byte order, odd kinds
# ===========================================================================

bad("dtype.object.allocate_gpu", lambda: mapping.allocate_gpu((4,), object), TYPE)
bad("dtype.object.allocate_cpu", lambda: mapping.allocate_cpu((4,), object), TYPE)
bad("dtype.object.mirror", lambda: mapping.mirror((4,), object), TYPE)
bad("dtype.object.view", lambda: buf(64).view((8,), object), TYPE)
bad("dtype.object.sync_to_gpu", lambda: mapping.sync_to_gpu(objarr(8), buf(64)), TYPE)
bad("dtype.object.sync_to_cpu", lambda: mapping.sync_to_cpu(buf(64, fill=0x41), objarr(8)), TYPE)
bad("dtype.object.memoryview", lambda: mapping.sync_to_gpu(memoryview(objarr(8)), buf(64)), TYPE)
bad("dtype.object.mirror_wrap", lambda: mapping.mirror_wrap(objarr(8)), TYPE)
bad("dtype.object.mirror_adopt", lambda: mapping.mirror_adopt(objarr(8), buf(64)), TYPE)
bad("dtype.object.batch_to_gpu", lambda: mapping.batch().sync_to_gpu(objarr(8), buf(64)), TYPE)
bad("dtype.object.batch_to_cpu", lambda: mapping.batch().sync_to_cpu(buf(64), objarr(8)), TYPE)
bad("dtype.object.pipeline_src", lambda: mapping.pipeline().run(objarr(8), None, lambda s, c: None), TYPE)
bad("dtype.object.in_struct", lambda: mapping.allocate_gpu((2,), [("a", "<i4"), ("o", "O")]), TYPE)
bad("dtype.object.struct_host_data",
    lambda: mapping.sync_to_gpu(np.zeros(2, [("a", "<i8"), ("o", "O")]), buf(32)), TYPE)


@case("dtype.object.get_after_set_dtype", raises=TYPE + (AttributeError,))
def _():
    b = buf(64, fill=0x41)
    b.dtype, b.shape = np.dtype(object), (8,)  # a careless user edits the attributes
    b.get()


@case("dtype.mismatch.sync_to_gpu_names_both", raises=BAD, msg=("float32", "float64"))
def _():
    b = mapping.allocate_gpu((8,), np.float32)
    mapping.sync_to_gpu(np.zeros(4, np.float64), b)  # same byte count, another dtype


@case("dtype.mismatch.sync_to_cpu_names_both", raises=BAD, msg=("int32", "float32"))
def _():
    b = mapping.allocate_gpu((4,), np.int32)
    mapping.sync_to_cpu(b, np.zeros(4, np.float32))


@case("dtype.mismatch.byte_order_into_typed_buffer", raises=BAD)
def _():
    b = mapping.allocate_gpu((4,), np.float32)
    mapping.sync_to_gpu(np.arange(4, dtype=">f4"), b)


@case("dtype.untyped_buffer_takes_any", ok=True)
def _():
    x = np.arange(5, dtype=np.float32)
    b = mapping.allocate_gpu(x.nbytes)  # the seed: bytes, then any host data
    mapping.sync_to_gpu(x, b)
    out = np.zeros(5, np.float32)
    mapping.sync_to_cpu(b, out)
    assert (out == x).all()


@case("dtype.big_endian.allocate_and_dlpack", ok_or=BAD + (BufferError,))
def _():
    b = mapping.allocate_gpu((4,), ">f4")  # may be refused here...
    mapping.sync_to_gpu(np.arange(4, dtype=">f4"), b)
    assert (b.get() == np.arange(4)).all(), b.get()
    if backend() == "host":
        a = attempt(EXPORT, np.from_dlpack, b)  # ...or at export, but never byte-swapped
        assert a is None or (a == np.arange(4)).all(), a


@case("dtype.big_endian.view_dlpack", ok_or=BAD + (BufferError,), backends="host")
def _():
    b = mapping.allocate_gpu((4,), np.float32)
    mapping.sync_to_gpu(np.arange(4, dtype=np.float32), b)
    v = b.view((4,), ">f4")
    raw = v.get()
    assert (raw.view(np.uint8) == np.arange(4, dtype=np.float32).view(np.uint8)).all()
    a = np.from_dlpack(v)
    assert (a == raw).all(), (a, raw)  # the same numbers numpy reads from the same bytes


@case("dtype.structured.roundtrip", ok_or=BAD)
def _():
    dt = np.dtype([("a", "<i4"), ("b", "<f8")])
    x = np.zeros(3, dt)
    x["a"], x["b"] = [1, 2, 3], [0.5, 1.5, 2.5]
    b = mapping.allocate_gpu((3,), dt)
    mapping.sync_to_gpu(x, b)
    assert (b.get() == x).all()


@case("dtype.structured.dlpack", raises=EXPORT, backends="host")
def _():
    b = mapping.allocate_gpu((3,), [("a", "<i4"), ("b", "<f4")])
    np.from_dlpack(b)


@case("dtype.datetime.roundtrip", ok_or=BAD)
def _():
    x = np.array(["2020-01-01", "2021-06-30"], dtype="M8[s]")
    b = mapping.allocate_gpu(x.shape, x.dtype)
    mapping.sync_to_gpu(x, b)
    assert (b.get() == x).all()


@case("dtype.unicode.roundtrip", ok_or=BAD)
def _():
    x = np.array(["ab", "cde"], dtype="U4")
    b = mapping.allocate_gpu(x.shape, x.dtype)
    mapping.sync_to_gpu(x, b)
    assert (b.get() == x).all()


@case("dtype.float16_complex_bool.roundtrip", ok=True)
def _():
    for x in (np.linspace(0, 1, 7).astype(np.float16), (np.arange(5) + 1j).astype(np.complex128),
              np.array([True, False, True])):
        b = mapping.allocate_gpu(x.shape, x.dtype)
        mapping.sync_to_gpu(x, b)
        y = b.get()
        assert y.dtype == x.dtype and (y == x).all(), (x, y)


@case("dtype.array_array.roundtrip", ok=True)
def _():
    x = array.array("d", [1.5, 2.5, 3.5])
    b = mapping.allocate_gpu((3,), np.float64)
    mapping.sync_to_gpu(x, b)
    y = array.array("d", [0.0] * 3)
    mapping.sync_to_cpu(b, y)
    assert y == x


@case("dtype.void.roundtrip", ok_or=BAD)
def _():
    x = np.frombuffer(bytes(range(16)), dtype="V8")
    b = mapping.allocate_gpu(x.shape, x.dtype)
    mapping.sync_to_gpu(x, b)
    assert b.get().tobytes() == bytes(range(16))


# ===========================================================================
# shapes: floats, negatives, huge, odd containers
# ===========================================================================

bad("shape.float_list", lambda: mapping.allocate_gpu([1.0, 2.0, 3.0]), TYPE)
bad("shape.float_list_with_dtype", lambda: mapping.allocate_gpu([2.0, 3.0], np.float32), TYPE)
bad("shape.numpy_float", lambda: mapping.allocate_gpu(np.float64(16)), TYPE)
bad("shape.negative", lambda: mapping.allocate_gpu(-1), BAD)
bad("shape.negative_dim", lambda: mapping.allocate_gpu((-1, 2), np.float32), BAD)
bad("shape.two_negatives", lambda: mapping.allocate_gpu((-2, -2), np.float32), BAD)  # product 16: still refused
bad("shape.huge_product", lambda: mapping.allocate_gpu((2 ** 40, 2 ** 40), np.float32), BIG)
bad("shape.huge_2_64", lambda: mapping.allocate_gpu(2 ** 64), BIG)
bad("shape.huge_cpu", lambda: mapping.allocate_cpu((2 ** 62,), np.float64), BIG)
bad("shape.huge_mirror", lambda: mapping.mirror((2 ** 61,), np.float64), BIG)
bad("shape.nested_list", lambda: mapping.allocate_gpu([[1, 2]], np.float32), TYPE + (ValueError,))
bad("shape.none_in_tuple", lambda: mapping.allocate_gpu((None, 2), np.float32), TYPE)
bad("shape.negative_cpu", lambda: mapping.allocate_cpu((4, -1), np.float32), BAD)
bad("shape.negative_mirror_dim", lambda: mapping.mirror((4, -4), np.float32), BAD)
bad("shape.view_huge", lambda: buf(64).view((2 ** 62, 2 ** 62), np.uint8), BIG)


@case("shape.zero_dim", ok_or=BAD)
def _():
    b = mapping.allocate_gpu((), np.float64)  # numpy: one element
    assert b.nbytes == 8, b.nbytes
    mapping.sync_to_gpu(np.array(2.5), b)
    assert b.get() == 2.5


@case("shape.empty_rows", ok=True)
def _():
    b = mapping.allocate_gpu((0, 3), np.float32)
    assert b.nbytes == 0
    out = b.get()
    assert out.shape == (0, 3)
    mapping.sync_to_gpu(np.zeros((0, 3), np.float32), b)
    a = mapping.allocate_cpu((0, 3), np.float32)
    assert a.shape == (0, 3)


@case("shape.without_dtype_is_float64", ok_or=TYPE)
def _():
    b = mapping.allocate_gpu((4,))  # numpy's default dtype is float64
    assert b.dtype == np.float64 and b.nbytes == 32, (b.dtype, b.nbytes)


@case("shape.without_dtype_cpu_is_float64", ok_or=TYPE)
def _():
    a = mapping.allocate_cpu((4,))
    assert a.dtype == np.float64, a.dtype


@case("shape.numpy_array_as_shape", ok_or=TYPE)
def _():
    b = mapping.allocate_gpu(np.array([2, 3]), np.float32)
    assert b.shape == (2, 3) and b.nbytes == 24


# ===========================================================================
# numpy integer scalars wherever an int goes
# ===========================================================================

@case("npint.allocate_gpu_nbytes", ok=True)
def _():
    b = mapping.allocate_gpu(np.int64(16))
    assert b.nbytes == 16


@case("npint.shape_tuple", ok=True)
def _():
    b = mapping.allocate_gpu((np.int32(2), np.uint64(3)), np.float32)
    assert b.shape == (2, 3) and b.nbytes == 24


@case("npint.allocate_cpu", ok=True)
def _():
    a = mapping.allocate_cpu(np.uint16(8), np.float32)
    assert a.shape == (8,)


@case("npint.sync_offset", ok=True)
def _():
    b = buf(16, fill=0)
    mapping.sync_to_gpu(np.full(4, 7, np.uint8), b, offset=np.int64(8))
    assert list(b.get()) == [0] * 8 + [7] * 4 + [0] * 4


@case("npint.copy_nbytes", ok=True)
def _():
    a, b = buf(16, fill=3), buf(16, fill=0)
    mapping.copy_gpu(a, b, nbytes=np.uint32(8), src_offset=np.int8(0), dst_offset=np.int16(8))
    assert list(b.get()) == [0] * 8 + [3] * 8


@case("npint.fill_value", ok=True)
def _():
    b = buf(16, fill=0)
    b.fill(np.uint8(9), offset=np.int64(4), nbytes=np.int32(4))
    assert list(b.get()) == [0] * 4 + [9] * 4 + [0] * 8


@case("npint.mirror_index", ok=True)
def _():
    m = mir((16,))
    m.mark_cpu_modified(np.int64(3))
    assert m.stale_bytes("gpu") == 4


@case("npint.mirror_slice_bounds", ok=True)
def _():
    m = mir((16,))
    m.mark_cpu_modified(slice(np.int64(2), np.int32(6)))
    assert m.stale_bytes("gpu") == 16
    v = m[np.int64(1):np.int64(3)]
    assert v.nbytes == 8


@case("npint.open_device", ok=True)
def _():
    d = mapping.open("host", np.int64(0))
    assert d.backend == "host"


@case("npint.pipeline_args", ok=True)
def _():
    p = mapping.pipeline(chunk_bytes=np.int64(4096), depth=np.int32(2), element_bytes=np.uint8(4))
    assert p.chunk_bytes == 4096 and p.depth == 2


@case("npint.view_shape", ok=True)
def _():
    v = buf(64).view((np.int64(4), np.int32(4)), np.float32)
    assert v.shape == (4, 4)


@case("npint.mirror_shape", ok=True)
def _():
    m = mapping.mirror((np.int64(4), np.int64(2)), np.float64)
    assert m.shape == (4, 2) and m.nbytes == 64


@case("npint.fill_gpu_module", ok=True)
def _():
    b = buf(8, fill=0)
    mapping.fill_gpu(b, np.int64(5), nbytes=np.int64(8))
    assert list(b.get()) == [5] * 8


# ===========================================================================
# bool where an int goes: refused, or taken as the int it is (never a mask)
# ===========================================================================

@case("bool.allocate_gpu", ok_or=BAD)
def _():
    b = mapping.allocate_gpu(True)
    assert b.nbytes == 1


@case("bool.offset", ok_or=BAD)
def _():
    b = buf(4, fill=0)
    mapping.sync_to_gpu(np.full(1, 5, np.uint8), b, offset=True)
    assert list(b.get()) == [0, 5, 0, 0]


@case("bool.fill_value", ok_or=BAD)
def _():
    b = buf(4, fill=0)
    b.fill(True)
    assert list(b.get()) == [1] * 4


@case("bool.open_device", ok_or=BAD)
def _():
    d = mapping.open("host", False)
    assert d.index == 0


@case("bool.copy_nbytes", ok_or=BAD)
def _():
    a, b = buf(4, fill=2), buf(4, fill=0)
    mapping.copy_gpu(a, b, nbytes=True)
    assert list(b.get()) == [2, 0, 0, 0]


@case("bool.mirror_index", ok_or=BAD + (IndexError,))
def _():
    m = mir((16,))
    m.mark_cpu_modified(True)
    assert m.stale_bytes("gpu") in (4, 64)  # element 1, or numpy's a[True] (all of it)


@case("bool.pipeline_depth", ok_or=BAD)
def _():
    p = mapping.pipeline(depth=True)
    assert p.depth == 1


# ===========================================================================
# life: every use of a closed object raises; memory never dangles
# ===========================================================================

_closed_uses = {
    "buffer.get": lambda: closed(buf()).get(),
    "buffer.fill": lambda: closed(buf()).fill(0),
    "buffer.view": lambda: closed(buf()).view(),
    "buffer.native": lambda: closed(buf()).native,
    "buffer.sync_to_gpu": lambda: mapping.sync_to_gpu(f32(4), closed(buf())),
    "buffer.sync_to_cpu": lambda: mapping.sync_to_cpu(closed(buf()), np.zeros(4, np.float32)),
    "buffer.sync_to_gpu_stream": lambda: mapping.sync_to_gpu(f32(4), closed(buf()), stream=mapping.stream()),
    "buffer.copy_src": lambda: mapping.copy_gpu(closed(buf()), buf()),
    "buffer.copy_dst": lambda: mapping.copy_gpu(buf(), closed(buf())),
    "buffer.dlpack": lambda: closed(buf()).__dlpack__(),
    "buffer.mirror_adopt": lambda: mapping.mirror_adopt(np.zeros(16, np.uint8), closed(buf())),
    "buffer.batch": lambda: mapping.batch().sync_to_gpu(f32(4), closed(buf())),
    "buffer.empty_get": lambda: closed(mapping.allocate_gpu(0)).get(),
    "stream.synchronize": lambda: closed(mapping.stream()).synchronize(),
    "stream.record": lambda: closed(mapping.stream()).record(),
    "stream.wait": lambda: closed(mapping.stream()).wait(mapping.stream().record()),
    "stream.as_argument": lambda: mapping.sync_to_gpu(f32(4), buf(), stream=closed(mapping.stream())),
    "stream.native": lambda: closed(mapping.stream()).native,
    "event.query": lambda: closed(mapping.stream().record()).query(),
    "event.synchronize": lambda: closed(mapping.stream().record()).synchronize(),
    "event.elapsed_end": lambda: mapping.stream().record().elapsed(closed(mapping.stream().record())),
    "event.wait_on": lambda: mapping.stream().wait(closed(mapping.stream().record())),
    "mirror.array": lambda: closed(mir()).array,
    "mirror.buffer": lambda: closed(mir()).buffer,
    "mirror.sync_to_gpu": lambda: closed(mir()).sync_to_gpu(),
    "mirror.sync_to_cpu": lambda: closed(mir()).sync_to_cpu(),
    "mirror.mark": lambda: closed(mir()).mark_cpu_modified(),
    "mirror.stale": lambda: closed(mir()).stale_bytes(),
    "mirror.getitem": lambda: closed(mir())[0:2],
    "mirror.cpu": lambda: closed(mir()).cpu("r").__enter__(),
    "mirror.gpu": lambda: closed(mir()).gpu("r").__enter__(),
    "mirror.view_of_closed_parent": lambda: (lambda m: (m.close(), m[0:2]))(mir()),
    "batch.add": lambda: closed(mapping.batch()).sync_to_gpu(f32(4), buf()),
    "batch.flush": lambda: closed(mapping.batch()).flush(),
    "batch.len": lambda: len(closed(mapping.batch())),
    "batch.clear": lambda: closed(mapping.batch()).clear(),
    "pipeline.run": lambda: closed(mapping.pipeline()).run(np.zeros(64, np.uint8), None, lambda s, c: None),
    "device.allocate_gpu": lambda: closed(mapping.open("host", 0)).allocate_gpu(16),
    "device.allocate_cpu": lambda: closed(mapping.open("host", 0)).allocate_cpu(16),
    "device.stream": lambda: closed(mapping.open("host", 0)).stream(),
    "device.info": lambda: closed(mapping.open("host", 0)).info(),
    "device.stats": lambda: closed(mapping.open("host", 0)).stats(),
    "device.mirror": lambda: mapping.mirror(16, device=closed(mapping.open("host", 0))),
    "device.set_link": lambda: closed(mapping.open("host", 0)).set_link(1e-6, 1e9),
}

for _n, _fn in _closed_uses.items():
    bad("life.closed." + _n, _fn, CLOSED)


@case("life.closed.device_children_raise", ok=True)
def _():
    d = mapping.open("host", 0)
    b, s, m = d.allocate_gpu(16), d.stream(), mapping.mirror(16, device=d)
    d.close()
    expect(CLOSED, b.get)
    expect(CLOSED, s.synchronize)
    expect(CLOSED, m.sync_to_gpu)
    assert b.closed and s.closed and m.closed


@case("life.closed.twice_is_fine", ok=True)
def _():
    for o in (buf(), mapping.stream(), mir(), mapping.batch(), mapping.pipeline(), mapping.open("host", 0)):
        o.close()
        o.close()
        assert o.closed
        repr(o)


@case("life.closed.with_block", ok=True)
def _():
    with buf(16) as b:
        b.fill(1)
    expect(CLOSED, b.fill, 2)
    with mapping.open("host", 0) as d:
        c = d.allocate_gpu(8)
    expect(CLOSED, c.get)


@case("life.dlpack.buffer_close", ok=True, backends="host")
def _():
    b = mapping.allocate_gpu((MiB,), np.float32)
    mapping.sync_to_gpu(np.full(MiB, 7, np.float32), b)
    a = np.from_dlpack(b)
    b.close()
    for _ in range(8):
        buf(4 * MiB, fill=0xAB)  # reuse the freed memory, if it was freed
    assert (a == 7).all()


@case("life.dlpack.device_close", ok=True, backends="host")
def _():
    d = mapping.open("host", 0)
    b = mapping.allocate_gpu((MiB,), np.float32, device=d)
    mapping.sync_to_gpu(np.full(MiB, 3, np.float32), b)
    a = np.from_dlpack(b)
    d.close()
    for _ in range(8):
        buf(4 * MiB, fill=0xCD)
    assert (a == 3).all()


@case("life.dlpack.buffer_collected", ok=True, backends="host")
def _():
    b = mapping.allocate_gpu((MiB,), np.int32)
    mapping.sync_to_gpu(np.arange(MiB, dtype=np.int32), b)
    a = np.from_dlpack(b)
    del b
    gc.collect()
    for _ in range(8):
        buf(4 * MiB, fill=0xEF)
    assert (a == np.arange(MiB)).all()


@case("life.allocate_cpu.device_close", ok=True)
def _():
    d = mapping.open("host", 0)
    a = d.allocate_cpu((MiB,), np.float32)
    d.close()
    a[:] = 4
    assert a.sum() == 4 * MiB
    sl = a[10:20]
    del a
    gc.collect()
    assert (sl == 4).all()


@case("life.mirror_array.mirror_close", ok=True)
def _():
    m = mapping.mirror((MiB,), np.float32)
    a = m.array
    a[:] = 2
    m.close()
    for _ in range(4):
        mapping.mirror((MiB,), np.float32).array[:] = 9
    assert (a == 2).all()


@case("life.mirror_array.device_close", ok=True)
def _():
    d = mapping.open("host", 0)
    m = mapping.mirror((MiB,), np.float32, device=d)
    a = m.array
    d.close()
    a[:] = 5
    assert (a == 5).all()


@case("life.view.parent_closed_never_scribbles", ok=True)
def _():
    b = buf(MiB)
    v = b.view()
    b.close()
    c = buf(MiB, fill=0)
    attempt(CLOSED, v.fill, 9)  # refused, or the view kept its memory alive
    attempt(CLOSED, mapping.sync_to_gpu, np.full(MiB, 9, np.uint8), v)
    assert (c.get() == 0).all()


@case("life.view.get_after_parent_close", ok_or=CLOSED)
def _():
    b = buf(64, fill=6)
    v = b.view((16,), np.float32)
    b.close()
    r = v.get()
    assert (r.view(np.uint8) == 6).all()


@case("life.queued.buffer_close_then_sync", ok=True)
def _():
    s = gated_stream()
    b = buf(16 * MiB)
    mapping.sync_to_gpu(np.ones(16 * MiB, np.uint8), b, stream=s)
    b.close()  # waits, or frees once the copy is done
    s.synchronize()
    c = buf(16 * MiB, fill=0)
    assert c.get().sum() == 0


@case("life.queued.buffer_close_read", ok=True)
def _():
    s = gated_stream()
    b = buf(8 * MiB, fill=7)
    out = np.zeros(8 * MiB, np.uint8)
    mapping.sync_to_cpu(b, out, stream=s)
    b.close()
    for _ in range(4):
        buf(8 * MiB, fill=1)
    s.synchronize()
    assert (out == 7).all()


@case("life.queued.with_block_exit", ok=True)
def _():
    s = gated_stream()
    x = np.full(8 * MiB, 3, np.uint8)
    with buf(8 * MiB) as b:
        mapping.sync_to_gpu(x, b, stream=s)
    s.synchronize()
    expect(CLOSED, b.get)


@case("life.queued.stream_close", ok=True)
def _():
    s = gated_stream()
    b = buf(8 * MiB)
    mapping.sync_to_gpu(np.full(8 * MiB, 4, np.uint8), b, stream=s)
    s.close()
    gc.collect()
    assert (b.get() == 4).all()


@case("life.queued.device_close", ok=True)
def _():
    d = mapping.open(backend(), 0)
    s = d.stream()
    b = d.allocate_gpu(8 * MiB)
    mapping.sync_to_gpu(np.ones(8 * MiB, np.uint8), b, stream=s)
    d.close()
    expect(CLOSED, s.synchronize)
    expect(CLOSED, b.get)


@case("life.queued.host_array_dropped", ok=True)
def _():
    s = gated_stream()
    b = buf(8 * MiB)
    mapping.sync_to_gpu(np.full(8 * MiB, 5, np.uint8), b, stream=s)  # the temporary is the only reference
    gc.collect()
    for _ in range(4):
        np.full(8 * MiB, 0xEE, np.uint8)
    s.synchronize()
    assert (b.get() == 5).all()


@case("life.mirror_adopt.buffer_close", ok=True)
def _():
    b = buf(64, fill=0)
    a = np.arange(64, dtype=np.uint8)
    m = mapping.mirror_adopt(a, b)
    b.close()
    attempt(CLOSED, m.mark_cpu_modified)
    attempt(CLOSED, m.sync_to_gpu)  # the mirror holds its buffer, or refuses
    for _ in range(4):
        buf(64, fill=0xFF)
    attempt(CLOSED, m.sync_to_cpu)
    assert (a == np.arange(64)).all()


@case("life.event_after_stream_close", ok_or=CLOSED)
def _():
    s = mapping.stream()
    e = s.record()
    s.close()
    e.synchronize()
    assert e.query() is True


@case("life.buffer_keeps_unnamed_device", ok=True)
def _():
    b = mapping.open("host", 0).allocate_gpu(64)
    gc.collect()
    b.fill(3)
    assert (b.get() == 3).all()


@case("life.default_device_closed_reopens", ok_or=CLOSED)
def _():
    mapping.default_device().close()
    b = mapping.allocate_gpu(16)
    b.fill(1)
    assert (b.get() == 1).all()


@case("life.set_default_closed_device", ok_or=CLOSED + TYPE)
def _():
    d = mapping.open("host", 0)
    d.close()
    mapping.set_default_device(d)
    b = mapping.allocate_gpu(16)
    b.fill(1)
    assert (b.get() == 1).all()


@case("life.batch_close_pending", ok=True)
def _():
    b = buf(16, fill=0)
    bt = mapping.batch()
    bt.sync_to_gpu(np.full(16, 1, np.uint8), b)
    bt.close()
    expect(CLOSED, bt.flush)
    assert (b.get() == 0).all()  # nothing was flushed


@case("life.pipeline_close_in_step", ok=True)
def _():
    p = mapping.pipeline(chunk_bytes=4096)
    src = np.arange(3 * 4096, dtype=np.uint8)
    dst = np.zeros_like(src)
    seen = []

    def step(s, c):
        if not seen:
            seen.append(attempt((mapping.Error, RuntimeError), p.close) is None)
        mapping.copy_gpu(c.input, c.output, c.nbytes, c.input_offset, c.output_offset, stream=s)
    attempt((mapping.Error, RuntimeError), p.run, src, dst, step)
    # Consistent afterwards: open and usable, or closed and refusing.
    if p.closed:
        expect(CLOSED, p.run, src, dst, step)
    else:
        p.run(src, dst, step)
        assert (dst == src).all()
        p.close()
        assert p.closed


@case("life.pipeline_reentrant_run", ok=True)
def _():
    p = mapping.pipeline(chunk_bytes=4096)
    src = np.zeros(8192, np.uint8)
    errs = []

    def step(s, c):
        if not errs:
            errs.append(expect((mapping.Error, RuntimeError), p.run, src, None, lambda s2, c2: None))
    p.run(src, None, step)
    assert errs


@case("life.pipeline_step_raises", raises=ZeroDivisionError)
def _():
    p = mapping.pipeline(chunk_bytes=4096)
    p.run(np.zeros(8192, np.uint8), None, lambda s, c: 1 / 0)


@case("life.pipeline_step_keyboard_interrupt", raises=KeyboardInterrupt)
def _():
    def step(s, c):
        raise KeyboardInterrupt
    mapping.pipeline(chunk_bytes=4096).run(np.zeros(8192, np.uint8), None, step)


@case("life.pipeline_usable_after_step_error", ok=True)
def _():
    p = mapping.pipeline(chunk_bytes=4096)
    src = np.arange(8192, dtype=np.uint8)
    expect(ZeroDivisionError, p.run, src, None, lambda s, c: 1 / 0)
    dst = np.zeros_like(src)
    p.run(src, dst, lambda s, c: mapping.copy_gpu(c.input, c.output, c.nbytes, c.input_offset, c.output_offset,
                                                 stream=s))
    assert (dst == src).all()


# copy / pickle: refused (issue 23 item 5)
for _kind, _make in {"buffer": lambda: buf(16), "device": lambda: mapping.open("host", 0),
                     "stream": mapping.stream, "mirror": lambda: mir(), "batch": mapping.batch,
                     "event": lambda: mapping.stream().record(), "pipeline": mapping.pipeline}.items():
    bad("life.deepcopy." + _kind, (lambda mk: lambda: copy.deepcopy(mk()))(_make), NOCOPY)
    bad("life.pickle." + _kind, (lambda mk: lambda: pickle.dumps(mk()))(_make), NOCOPY)
bad("life.copy.buffer", lambda: copy.copy(buf(16)), NOCOPY)
bad("life.copy.mirror", lambda: copy.copy(mir()), NOCOPY)


@case("life.pickle_roundtrip_then_free", raises=NOCOPY)
def _():
    b = buf(64)
    c = pickle.loads(pickle.dumps(b))  # if this works, two objects own one handle
    del b
    gc.collect()
    c.fill(1)
    del c
    gc.collect()


# ===========================================================================
# gc: reference cycles, odd collection points, interpreter exit
# ===========================================================================

class _Bag:
    pass


@case("gc.cycle_device_and_children", ok=True)
def _():
    for _ in range(20):
        h = _Bag()
        h.me = h
        h.dev = mapping.open(backend(), 0)
        h.buf = h.dev.allocate_gpu(4096)
        h.s = h.dev.stream()
        h.m = mapping.mirror(4096, device=h.dev)
        h.v = h.m[0:16]
        h.a = h.dev.allocate_cpu(4096)
        h.e = h.s.record()
        h.bt = h.dev.batch()
        h.bt.sync_to_gpu(np.zeros(16, np.uint8), h.buf)
        del h
    gc.collect()
    assert (buf(16, fill=2).get() == 2).all()


@case("gc.cycle_with_queued_copy", ok=True)
def _():
    h = _Bag()
    h.me = h
    h.s = gated_stream()
    h.b = buf(8 * MiB)
    h.x = np.full(8 * MiB, 6, np.uint8)
    mapping.sync_to_gpu(h.x, h.b, stream=h.s)
    keep = h.b.view()
    del h
    gc.collect()
    r = attempt(CLOSED, keep.get)
    assert r is None or (r == 6).all()


@case("gc.cycle_mirror_and_array", ok=True)
def _():
    m = mapping.mirror((MiB,), np.float32)
    a = m.array
    a.flags  # touch
    h = _Bag()
    h.me, h.m, h.a = h, m, a
    del m
    del h
    gc.collect()
    a[:] = 1
    assert a.sum() == MiB


@case("gc.del_device_first", ok=True)
def _():
    d = mapping.open(backend(), 0)
    b, s, m = d.allocate_gpu(64), d.stream(), mapping.mirror(64, device=d)
    del d
    gc.collect()
    b.fill(1)
    mapping.sync_to_gpu(np.zeros(8, np.uint8), b, stream=s)
    s.synchronize()
    m.sync_to_gpu()
    assert (b.get()[:8] == 0).all() and (b.get()[8:] == 1).all()


for _order in ("dev buf stream mirror event", "event mirror stream buf dev", "mirror dev event buf stream"):
    def _make(order=_order):
        def fn():
            d = mapping.open(backend(), 0)
            ns = {"dev": d, "buf": d.allocate_gpu(64), "stream": d.stream(), "mirror": mapping.mirror(64, device=d)}
            ns["event"] = ns["stream"].record()
            ns["view"] = ns["mirror"][0:8]
            for k in order.split():
                del ns[k]
                gc.collect()
            ns["view"].mark_cpu_modified()
            ns["view"].sync_to_gpu()
            del ns
            gc.collect()
        return fn
    CASES["gc.del_order." + _order.replace(" ", "_")] = Case("gc.del_order." + _order.replace(" ", "_"), _make(),
                                                              ok=True)


@case("gc.collect_in_pipeline_step", ok=True)
def _():
    src = np.arange(4 * 4096, dtype=np.uint8)
    dst = np.zeros_like(src)

    def step(s, c):
        gc.collect()
        mapping.copy_gpu(c.input, c.output, c.nbytes, c.input_offset, c.output_offset, stream=s)
        gc.collect()
    mapping.pipeline(chunk_bytes=4096).run(src, dst, step)
    assert (dst == src).all()


@case("gc.finalizer_closes_device", ok=True)
def _():
    d = mapping.open(backend(), 0)
    b = d.allocate_gpu(64)
    s = d.stream()
    weakref.finalize(b, d.close)
    mapping.sync_to_gpu(np.zeros(64, np.uint8), b)
    del b
    gc.collect()
    expect(CLOSED, s.synchronize)


@case("gc.user_del_closes_device_in_cycle", ok=True)
def _():
    class Owner:
        def __del__(self):
            self.dev.close()
    for _ in range(10):
        o = Owner()
        o.me = o
        o.dev = mapping.open(backend(), 0)
        o.bufs = [o.dev.allocate_gpu(256) for _ in range(4)]
        o.m = mapping.mirror(256, device=o.dev)
        o.a = o.m.array
        del o
    gc.collect()


@case("gc.exit_with_live_objects", ok=True)
def _():
    # Left for interpreter shutdown: queued copies, views, exports, cycles.
    g = sys.modules[__name__].__dict__
    g["_left_dev"] = d = mapping.open(backend(), 0)
    g["_left_s"] = s = d.stream()
    g["_left_b"] = b = d.allocate_gpu(4 * MiB)
    mapping.sync_to_gpu(np.ones(4 * MiB, np.uint8), b, stream=s)
    g["_left_m"] = m = mapping.mirror((1024,), np.float32, device=d)
    g["_left_v"] = m[0:16]
    g["_left_a"] = d.allocate_cpu(1024)
    h = _Bag()
    h.me, h.b, h.s = h, b, s
    g["_left_h"] = h
    if d.backend == "host":
        g["_left_np"] = np.from_dlpack(b.view())


@case("gc.exit_with_gc_disabled", ok=True)
def _():
    gc.disable()
    g = sys.modules[__name__].__dict__
    for i in range(5):
        h = _Bag()
        h.me = h
        h.d = mapping.open(backend(), 0)
        h.b = h.d.allocate_gpu(1024)
        h.m = mapping.mirror(1024, device=h.d)
        g["_cyc%d" % i] = weakref.ref(h)


@case("gc.dlpack_capsule_unconsumed", ok=True, backends="host")
def _():
    b = buf(64)
    caps = [b.__dlpack__() for _ in range(3)]
    del b
    gc.collect()
    del caps
    gc.collect()
    assert (buf(8, fill=1).get() == 1).all()


@case("gc.buffer_freed_before_producer", ok=True, backends="host")
def _():
    x = np.arange(MiB, dtype=np.uint8)
    b = mapping.from_dlpack(x)
    b.close()
    del b
    gc.collect()
    assert (x == np.arange(MiB, dtype=np.uint8)).all()  # mapping never frees the producer's memory


@case("gc.producer_dropped_import_alive", ok=True, backends="host")
def _():
    b = mapping.from_dlpack(np.full(MiB, 8, np.uint8))
    gc.collect()
    for _ in range(4):
        np.full(MiB, 1, np.uint8)
    assert (b.get() == 8).all()


# ===========================================================================
# resize: a bytearray / array.array resized while mapping uses it
# ===========================================================================

def _grow(x):
    x.extend(b"\0" * MiB if isinstance(x, bytearray) else array.array(x.typecode, [0]) * (MiB // x.itemsize))


@case("resize.bytearray.queued_h2d", ok=True)
def _():
    s, b = gated_stream(hold=True), buf(4 * MiB)
    ba = bytearray(b"\x05" * (4 * MiB))
    mapping.sync_to_gpu(ba, b, stream=s)
    e = attempt(BufferError, _grow, ba)
    ungate(s)
    s.synchronize()
    assert e is None and len(ba) == 4 * MiB, "resizing a bytearray under a queued copy must raise BufferError"
    assert (b.get() == 5).all()


@case("resize.bytearray.queued_d2h", ok=True)
def _():
    s, b = gated_stream(hold=True), buf(4 * MiB, fill=6)
    ba = bytearray(4 * MiB)
    mapping.sync_to_cpu(b, ba, stream=s)
    expect(BufferError, ba.clear)
    ungate(s)
    s.synchronize()
    assert ba == b"\x06" * (4 * MiB)


@case("resize.array.queued_h2d", ok=True)
def _():
    s, b = gated_stream(hold=True), buf(4 * MiB)
    aa = array.array("i", [7]) * MiB
    mapping.sync_to_gpu(aa, b, stream=s)
    expect(BufferError, _grow, aa)
    ungate(s)
    s.synchronize()
    assert (b.get().view(np.int32) == 7).all()


@case("resize.array.queued_d2h", ok=True)
def _():
    s, b = gated_stream(hold=True), buf(4 * MiB, fill=1)
    aa = array.array("B", bytes(4 * MiB))
    mapping.sync_to_cpu(b, aa, stream=s)
    expect(BufferError, aa.pop)
    ungate(s)
    s.synchronize()
    assert aa.count(1) == 4 * MiB


@case("resize.allowed_after_synchronize", ok=True)
def _():
    s, b = gated_stream(hold=True), buf(MiB)
    ba = bytearray(MiB)
    aa = array.array("B", bytes(MiB))
    mapping.sync_to_gpu(ba, b, stream=s)
    mapping.sync_to_cpu(b, aa, stream=s)
    ungate(s)
    s.synchronize()
    _grow(ba)
    _grow(aa)  # released once the stream passed them


@case("resize.allowed_after_blocking", ok=True)
def _():
    b = buf(MiB)
    ba = bytearray(MiB)
    mapping.sync_to_gpu(ba, b)
    mapping.sync_to_cpu(b, ba)
    _grow(ba)


@case("resize.bytearray.batch_before_flush", ok=True)
def _():
    b = buf(MiB, fill=0)
    bt = mapping.batch()
    ba = bytearray(b"\x03" * MiB)
    bt.sync_to_gpu(ba, b)
    expect(BufferError, ba.clear)
    bt.flush()
    assert (b.get() == 3).all()
    _grow(ba)  # allowed after the flush


@case("resize.array.batch_d2h_before_flush", ok=True)
def _():
    b = buf(MiB, fill=4)
    bt = mapping.batch()
    aa = array.array("B", bytes(MiB))
    bt.sync_to_cpu(b, aa)
    expect(BufferError, _grow, aa)
    bt.flush()
    assert aa.count(4) == MiB


@case("resize.bytearray.batch_after_failed_flush", ok=True, backends="host")
def _():
    # A flush refused (a stream of another device) leaves the copy queued in the C batch: its
    # host buffer stays held until a flush succeeds (the old package let go of it, and the
    # next flush wrote 64 KiB into freed memory).
    d1, d2 = mapping.open("host", 0), mapping.open("host", 0)
    g = d1.allocate_gpu(1 << 16)
    g.fill(0x41)
    b = d1.batch()
    data = bytearray(1 << 16)
    b.add_to_cpu(g, data)
    s2 = d2.stream()
    expect((mapping.DeviceMismatchError,), b.flush, s2)
    s2.synchronize()
    expect((BufferError,), data.extend, b"x")
    del data
    gc.collect()
    b.flush()
    assert len(b) == 0


@case("resize.batch_clear_releases", ok=True)
def _():
    bt = mapping.batch()
    ba = bytearray(MiB)
    bt.sync_to_gpu(ba, buf(MiB))
    bt.clear()
    _grow(ba)


@case("resize.bytearray.mirror_wrap", ok_or=TYPE)
def _():
    ba = bytearray(MiB)
    m = mapping.mirror_wrap(ba)
    expect(BufferError, ba.clear)
    m.mark_cpu_modified()
    m.sync_to_gpu()
    m.close()
    del m
    gc.collect()
    _grow(ba)


@case("resize.bytearray.mirror_adopt", ok_or=TYPE)
def _():
    ba = bytearray(MiB)
    m = mapping.mirror_adopt(ba, buf(MiB))
    expect(BufferError, _grow, ba)
    m.sync_to_gpu()


@case("resize.memoryview_release_queued", ok=True)
def _():
    s, b = gated_stream(hold=True), buf(4 * MiB)
    ba = bytearray(b"\x09" * (4 * MiB))
    mv = memoryview(ba)
    mapping.sync_to_gpu(mv, b, stream=s)
    attempt(BufferError, mv.release)
    expect(BufferError, ba.clear)
    ungate(s)
    s.synchronize()
    assert (b.get() == 9).all()


@case("resize.pipeline_src_in_step", ok=True)
def _():
    ba = bytearray(4 * 4096)
    errs = []

    def step(s, c):
        if not errs:
            errs.append(expect(BufferError, ba.clear))
    mapping.pipeline(chunk_bytes=4096).run(ba, None, step)
    assert errs and len(ba) == 4 * 4096


@case("resize.queued_twice_same_bytearray", ok=True)
def _():
    s = mapping.stream()
    b1, b2 = buf(MiB), buf(MiB)
    ba = bytearray(b"\x02" * MiB)
    mapping.sync_to_gpu(ba, b1, stream=s)
    mapping.sync_to_gpu(ba, b2, stream=s)
    s.synchronize()
    _grow(ba)
    assert (b1.get() == 2).all() and (b2.get() == 2).all()


# ===========================================================================
# thread: shared streams, closing under another thread
# ===========================================================================

@case("thread.same_stream_submit_and_sync", ok=True)
def _():
    s = mapping.stream()
    bufs = [buf(64 * 1024) for _ in range(4)]

    def worker(i):
        def go():
            for k in range(30):
                mapping.sync_to_gpu(bytes([(i * 31 + k) & 255]) * (64 * 1024), bufs[i], stream=s)
                s.synchronize()
        return go
    run_threads([worker(i) for i in range(4)])
    s.synchronize()
    for i in range(4):
        assert (bufs[i].get() == ((i * 31 + 29) & 255)).all(), i


@case("thread.sync_does_not_drop_other_threads_objects", ok=True)
def _():
    # Issue 23 item 3: a synchronize() in one thread must not release what another thread just queued.
    # Each copy from a temporary waits behind a larger one; a temporary released too early is freed
    # and overwritten (by the scribbler thread) before the stream reaches it. Three rounds: the race
    # shows in most rounds on the old package.
    import time
    s = mapping.stream()
    n, small = 200, 64 * 1024
    big_src, big_dst = np.ones(MiB, np.uint8), buf(MiB)
    for _round in range(3):
        bufs = [buf(small) for _ in range(n)]
        done = threading.Event()

        def producer():
            for i in range(n):
                mapping.sync_to_gpu(big_src, big_dst, stream=s)
                mapping.sync_to_gpu(bytearray([i % 250 + 1]) * small, bufs[i], stream=s)  # a temporary
                time.sleep(0.0002)  # lets the stream drain now and then, so synchronize() returns
            done.set()

        def syncer():
            while not done.is_set():
                s.synchronize()

        def scribbler():
            junk = []
            while not done.is_set():
                junk.append(bytearray(b"\xEE") * small)
                if len(junk) > 16:
                    junk.clear()
        run_threads([producer, syncer, scribbler])
        s.synchronize()
        wrong = [i for i in range(n) if not (bufs[i].get() == i % 250 + 1).all()]
        assert not wrong, "round %d: %d copies read released temporaries" % (_round, len(wrong))


@case("thread.close_stream_while_copying", ok=True)
def _():
    s, b = mapping.stream(), buf(MiB)
    started = threading.Event()
    x = np.ones(MiB, np.uint8)

    def copier():
        for _ in range(200):
            started.set()
            if attempt(CLOSED, mapping.sync_to_gpu, x, b, stream=s) is None and s.closed:
                return

    def closer():
        started.wait()
        s.close()
    run_threads([copier, closer])
    assert s.closed


@case("thread.close_buffer_while_copying", ok=True)
def _():
    b = buf(4 * MiB)
    started = threading.Event()
    x = np.ones(4 * MiB, np.uint8)

    def copier():
        for _ in range(100):
            started.set()
            attempt(CLOSED, mapping.sync_to_gpu, x, b)
            attempt(CLOSED, mapping.sync_to_cpu, b, x)

    def closer():
        started.wait()
        b.close()
    run_threads([copier, closer])
    expect(CLOSED, b.get)


@case("thread.close_device_while_copying", ok=True)
def _():
    d = mapping.open(backend(), 0)
    b, s = d.allocate_gpu(MiB), d.stream()
    started = threading.Event()
    x = np.ones(MiB, np.uint8)

    def copier():
        for _ in range(100):
            started.set()
            attempt(CLOSED, mapping.sync_to_gpu, x, b, stream=s)
            attempt(CLOSED, s.synchronize)

    def closer():
        started.wait()
        d.close()
    run_threads([copier, closer])
    expect(CLOSED, s.synchronize)


@case("thread.mirror_views_in_parallel", ok=True)
def _():
    # One family from several threads: the C contract is one thread at a time per family,
    # so the package serializes the calls (one lock per family): every call succeeds.
    flat = mir((4 * 4096,), np.float32)
    views = [flat[i * 4096:(i + 1) * 4096] for i in range(4)]

    def worker(i):
        def go():
            for k in range(20):
                views[i].array[:] = i * 100 + k
                views[i].mark_cpu_modified()
                views[i].sync_to_gpu()
        return go
    run_threads([worker(i) for i in range(4)])
    for v in views:
        v.mark_cpu_modified()
        v.sync_to_gpu()
    got = gpu_rows(flat)
    for i in range(4):
        assert (got[i * 4096:(i + 1) * 4096] == i * 100 + 19).all(), i


@case("thread.one_mirror_marks_and_syncs", ok=True)
def _():
    # The audit's reproducer: two threads mark, two sync one mirror (the GIL is released in the
    # C calls): the old package corrupted the heap. No BusyError, and the device gets the data.
    n = MiB
    m = mapping.mirror((n,), np.uint8)
    stop = threading.Event()

    def loop(fn):
        def go():
            i = 0
            while not stop.is_set():
                fn(i)
                i += 1
        return go

    def writer(step):
        def fn(i):
            off = (i * step * 64) % n
            m.array[off:off + 32] = i & 255
            m.mark_cpu_modified(byte_range=(off, 32))
        return fn
    threading.Timer(1.0, stop.set).start()
    run_threads([loop(writer(1)), loop(writer(8191)), loop(lambda i: m.sync_to_gpu()),
                 loop(lambda i: m.stale_bytes("gpu"))])
    m.sync_to_gpu()
    assert (m.buffer.get()[m.gpu_offset:][:n] == m.array).all()


@case("thread.mirror_close_while_syncing", ok=True)
def _():
    # close() on one thread while another syncs: close waits for the sync (the old package's
    # destroy was refused as busy and the mirror leaked; a view's could free under the sync).
    for _round in range(5):
        m = mapping.mirror((16 * MiB,), np.uint8)
        v = m[:4096]
        ptrs = (m._h.ptr, v._h.ptr)
        m.mark_cpu_modified()
        started = in_c_call("mirror_sync")

        def syncer():
            with started:
                attempt(CLOSED, m.sync_to_gpu)

        def closer():
            started.wait()
            v.close()
            m.close()
        run_threads([syncer, closer])
        expect(CLOSED, m.sync_to_gpu)
        # both C handles are gone (mapping_mirror_size of a dead handle is 0)
        assert [mapping._core.mirror_parts(p)[1] for p in ptrs] == [0, 0], "the mirror leaked"


@case("thread.multimirror_close_while_syncing", ok=True)
def _():
    # The old package destroyed the C multimirror under the other thread's copy (a use after free).
    d0, d1 = mapping.open(backend(), 0), mapping.open(backend(), 0)
    for _round in range(10):
        mm = mapping.multimirror([d0, d1], (8 * MiB,), np.uint8)
        mm.mark_modified("cpu")
        started = in_c_call("multimirror_sync")

        def syncer():
            with started:
                attempt(CLOSED, mm.sync, 1)

        def closer():
            started.wait()
            mm.close()
        run_threads([syncer, closer])
        expect(CLOSED, mm.sync, 1)


@case("thread.separate_mirrors_in_parallel", ok=True)
def _():
    ms = [mir((64 * 1024,), np.float32) for _ in range(4)]

    def worker(i):
        def go():
            for k in range(20):
                with ms[i].cpu("w") as a:
                    a[:] = i * 100 + k
                ms[i].sync_to_gpu()
        return go
    run_threads([worker(i) for i in range(4)])
    for i, m in enumerate(ms):
        assert (gpu_rows(m) == i * 100 + 19).all(), i


@case("thread.close_buffer_while_queued_elsewhere", ok=True)
def _():
    s = gated_stream()
    b = buf(8 * MiB)
    x = np.full(8 * MiB, 2, np.uint8)
    queued = threading.Event()

    def submit():
        mapping.sync_to_gpu(x, b, stream=s)
        queued.set()

    def closer():
        queued.wait()
        b.close()
    run_threads([submit, closer])
    s.synchronize()
    c = buf(8 * MiB, fill=0)
    assert (c.get() == 0).all()


@case("thread.allocate_free_storm", ok=True)
def _():
    def worker():
        for k in range(100):
            b = buf(4096, fill=k & 255)
            assert (b.get() == (k & 255)).all()
            b.close()
            if k % 25 == 0:
                gc.collect()
    run_threads([worker for _ in range(4)])


@case("thread.shared_batch", ok=True)
def _():
    bt = mapping.batch()
    b = buf(64 * 256, fill=0)
    errs = []

    def adder(base):
        def go():
            for k in range(64):
                try:
                    bt.sync_to_gpu(np.full(64, 1, np.uint8), b, offset=(base + k) * 64)
                except mapping.Error as e:
                    errs.append(e)
        return go

    def flusher():
        for _ in range(20):
            attempt(mapping.Error, bt.flush)
    run_threads([adder(0), adder(64), flusher])
    bt.flush()
    got = b.get()
    assert (got[:128 * 64] == 1).all() or errs


@case("thread.event_query_while_recording", ok=True)
def _():
    s = mapping.stream()
    b = buf(MiB)
    evs = []

    def rec():
        for _ in range(50):
            mapping.sync_to_gpu(np.ones(MiB, np.uint8), b, stream=s)
            evs.append(s.record())

    def query():
        for _ in range(200):
            for e in list(evs):
                e.query()
    run_threads([rec, query])
    s.synchronize()
    assert all(e.query() for e in evs)


# ===========================================================================
# mirror2d: mirrors with ndim > 1 indexed in the array's own shape
# ===========================================================================

def m2():
    return mir((4, 8), np.float32)


@case("mirror2d.mark_row_slice", ok=True)
def _():
    m = m2()
    m.array[0] = 9
    m.array[1] = 5
    m.mark_cpu_modified(slice(1, 2))  # row 1, as m.array[1:2]
    assert m.stale_bytes("gpu") == 32, m.stale_bytes("gpu")
    m.sync_to_gpu()
    g = gpu_rows(m)
    assert (g[1] == 5).all() and (g[0] == 0).all(), g


@case("mirror2d.mark_row_index", ok=True)
def _():
    m = m2()
    m.mark_cpu_modified(2)
    assert m.stale_bytes("gpu") == 32


@case("mirror2d.mark_tuple", ok=True)
def _():
    m = m2()
    m.mark_cpu_modified((slice(1, 3), slice(None)))
    assert m.stale_bytes("gpu") == 64


@case("mirror2d.mark_byte_range_keyword", ok=True)
def _():
    m = m2()
    m.mark_cpu_modified(byte_range=(4, 8))
    assert m.stale_bytes("gpu") == 8


@case("mirror2d.getitem_rows", ok=True)
def _():
    v = m2()[1:3]
    assert v.shape == (2, 8) and v.nbytes == 64, (v.shape, v.nbytes)


@case("mirror2d.getitem_row", ok=True)
def _():
    m = m2()
    v = m[1]
    assert v.shape == (8,) and v.nbytes == 32 and v.gpu_offset == m.gpu_offset + 32, (v.shape, v.gpu_offset)


@case("mirror2d.getitem_negative_row", ok=True)
def _():
    m = m2()
    v = m[-1]
    assert v.shape == (8,) and v.gpu_offset == m.gpu_offset + 96


@case("mirror2d.getitem_full_rows_tuple", ok=True)
def _():
    v = m2()[1:2, :]
    assert v.shape == (1, 8)


@case("mirror2d.getitem_ellipsis", ok=True)
def _():
    v = m2()[...]
    assert v.shape == (4, 8) and v.nbytes == 128


bad("mirror2d.getitem_columns_refused", lambda: m2()[:, 0:4], BAD + (IndexError,))
bad("mirror2d.getitem_row_out_of_range", lambda: m2()[4], (IndexError,))
bad("mirror2d.getitem_too_many_indices", lambda: m2()[1, 2, 3], (IndexError, TypeError, ValueError))
bad("mirror2d.wrap_fortran_refused", lambda: mapping.mirror_wrap(np.asfortranarray(np.zeros((3, 5)))), BAD)


@case("mirror2d.view_shares_array", ok=True)
def _():
    m = m2()
    v = m[2]
    v.array[:] = 4
    assert (m.array[2] == 4).all() and np.shares_memory(v.array, m.array)


@case("mirror2d.view_sync_roundtrip", ok=True)
def _():
    m = m2()
    m.array[3] = 7
    v = m[3]
    v.mark_cpu_modified()
    v.sync_to_gpu()
    g = gpu_rows(m)
    assert (g[3] == 7).all() and (g[:3] == 0).all(), g


@case("mirror2d.mark_step_rows", ok_or=BAD)
def _():
    m = m2()
    m.mark_cpu_modified(slice(0, 4, 2))
    assert m.stale_bytes("gpu") == 64


@case("mirror2d.npint_row", ok=True)
def _():
    v = m2()[np.int64(1)]
    assert v.shape == (8,)


@case("mirror2d.three_dims", ok=True)
def _():
    m = mir((2, 3, 4), np.float64)
    v = m[1]
    assert v.shape == (3, 4) and v.nbytes == 96
    m.mark_gpu_modified(slice(0, 1))
    assert m.stale_bytes("cpu") == 96


@case("mirror2d.cpu_access_shape", ok=True)
def _():
    m = m2()
    with m.cpu("rw") as a:
        assert a.shape == (4, 8)
        a[2] = 1
    m.sync_to_gpu()
    assert (gpu_rows(m)[2] == 1).all()


@case("mirror2d.wrap_shape", ok=True)
def _():
    x = np.zeros((3, 5), np.int16)
    m = mapping.mirror_wrap(x)
    assert m.shape == (3, 5) and m[1:2].shape == (1, 5)


# ===========================================================================
# dlpack: export / import round trips and broken producers
# ===========================================================================

@case("dlpack.export_values", ok=True, backends="host")
def _():
    b = mapping.allocate_gpu((3, 4), np.float32)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    mapping.sync_to_gpu(x, b)
    a = np.from_dlpack(b)
    assert a.shape == (3, 4) and (a == x).all()


@case("dlpack.export_writable", ok=True, backends="host")
def _():
    b = buf(16, np.int32, fill=0)
    a = np.from_dlpack(b)
    a[0] = 42  # python.md: writable on the host back end
    assert b.get()[0] == 42


@case("dlpack.import_zero_copy", ok=True, backends="host")
def _():
    x = np.arange(16, dtype=np.float32)
    b = mapping.from_dlpack(x)
    b.fill(0)
    assert (x == 0).all() and b.dtype == np.float32 and b.shape == (16,)


@case("dlpack.roundtrip_same_memory", ok=True, backends="host")
def _():
    b = buf(64, np.float32, fill=0)
    c = mapping.from_dlpack(np.from_dlpack(b))
    assert c.native == b.native and c.nbytes == b.nbytes


@case("dlpack.export_views_and_kinds", ok=True, backends="host")
def _():
    b = mapping.allocate_gpu((16,), np.float32)
    mapping.sync_to_gpu(np.arange(16, dtype=np.float32), b)
    assert (np.from_dlpack(b.view((4, 4), np.float32)) == np.arange(16).reshape(4, 4)).all()
    for dt in (np.bool_, np.complex64, np.float16, np.int8, np.uint64):
        x = np.ones(4, dt)
        c = mapping.allocate_gpu(x.shape, x.dtype)
        mapping.sync_to_gpu(x, c)
        y = np.from_dlpack(c)
        assert y.dtype == x.dtype and (y == x).all(), dt


@case("dlpack.export_empty", ok=True, backends="host")
def _():
    a = np.from_dlpack(mapping.allocate_gpu((0,), np.float32))
    assert a.shape == (0,)


bad("dlpack.import_noncontiguous", lambda: mapping.from_dlpack(np.arange(16)[::2]),
    EXPORT, backends="host")
bad("dlpack.export_copy_true", lambda: buf(16).__dlpack__(copy=True), EXPORT)
bad("dlpack.export_dl_device_other", lambda: buf(16).__dlpack__(dl_device=(2, 0)), EXPORT, backends="host")
bad("dlpack.opencl_np_from_dlpack", lambda: np.from_dlpack(buf(16)), EXPORT, backends="opencl")
bad("dlpack.import_cpu_tensor_on_opencl", lambda: mapping.from_dlpack(np.zeros(4)), EXPORT, backends="opencl")


@case("dlpack.export_max_version", ok=True, backends="host")
def _():
    b = buf(16, fill=1)
    cap = b.__dlpack__(max_version=(1, 0))
    assert type(cap).__name__ == "PyCapsule"


@case("dlpack.export_bad_stream", ok_or=EXPORT, backends="host")
def _():
    buf(16).__dlpack__(stream="x")


@case("dlpack.import_readonly", ok_or=EXPORT, backends="host")
def _():
    x = np.arange(8, dtype=np.uint8)
    x.flags.writeable = False
    b = mapping.from_dlpack(x)
    assert (b.get() == np.arange(8)).all()
    expect(EXPORT, b.fill, 0)  # mapping must not write into read-only memory
    assert (x == np.arange(8)).all()


class _Producer:
    def __init__(self, ret, device=(1, 0)):
        self.ret, self.dev = ret, device

    def __dlpack__(self, stream=None, **kw):
        return self.ret() if callable(self.ret) else self.ret

    def __dlpack_device__(self):
        return self.dev


def _foreign_capsule():
    import ctypes
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    _foreign_capsule.name = ctypes.create_string_buffer(b"not_a_dltensor")
    return new(ctypes.addressof(_foreign_capsule.name), ctypes.cast(_foreign_capsule.name, ctypes.c_char_p), None)


bad("dlpack.producer_returns_int", lambda: mapping.from_dlpack(_Producer(42)), EXPORT, backends="host")
bad("dlpack.producer_returns_none", lambda: mapping.from_dlpack(_Producer(None)), EXPORT, backends="host")
bad("dlpack.producer_wrong_capsule", lambda: mapping.from_dlpack(_Producer(_foreign_capsule)), EXPORT,
    backends="host")
bad("dlpack.producer_device_garbage", lambda: mapping.from_dlpack(_Producer(None, device="x")), EXPORT + TYPE)
bad("dlpack.producer_device_unknown", lambda: mapping.from_dlpack(_Producer(None, device=(99, 0))), EXPORT)
bad("dlpack.producer_raises", lambda: mapping.from_dlpack(_Producer(lambda: 1 / 0)), ZeroDivisionError,
    backends="host")


@case("dlpack.capsule_used_twice", raises=EXPORT, backends="host")
def _():
    cap = np.arange(8, dtype=np.uint8).__dlpack__()
    mapping.from_dlpack(_Producer(cap))
    mapping.from_dlpack(_Producer(cap))


@case("dlpack.import_bool_and_complex", ok=True, backends="host")
def _():
    for x in (np.array([True, False, True]), np.arange(3) * (1 + 1j), np.arange(4, dtype=np.float16)):
        b = mapping.from_dlpack(x)
        assert b.dtype == x.dtype and (b.get() == x).all(), (x.dtype, b.dtype)


# ===========================================================================
# pyopencl: PyOpenCL objects where mapping takes device memory or streams
# ===========================================================================

@case("pyopencl.buffer_roundtrip", ok=True)
def _():
    ctx, q = cl_context()
    cb = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64)
    x = np.arange(16, dtype=np.float32)
    mapping.sync_to_gpu(x, cb)
    out = np.zeros_like(x)
    cl.enqueue_copy(q, out, cb).wait()
    assert (out == x).all()
    back = np.zeros_like(x)
    mapping.sync_to_cpu(cb, back)
    assert (back == x).all()


@case("pyopencl.open_context_queue_user_stream", ok=True)
def _():
    ctx, q = cl_context()
    d = mapping.open(context=ctx, queue=q)
    s = d.stream()
    cb = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64)
    x = np.arange(16, dtype=np.float32)
    mapping.sync_to_gpu(x, cb, stream=s)  # issue 23 item 12: not a second hidden device
    s.synchronize()
    assert mapping.as_buffer(cb).device is d
    out = np.zeros_like(x)
    cl.enqueue_copy(q, out, cb).wait()
    assert (out == x).all()


@case("pyopencl.as_buffer_device_keyword", ok=True)
def _():
    ctx, q = cl_context()
    d = mapping.open(context=ctx)
    b = mapping.as_buffer(cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64), device=d)
    assert b.device is d


@case("pyopencl.queue_as_stream", ok=True)
def _():
    ctx, q = cl_context()
    cb = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * MiB)
    x = np.full(4 * MiB, 3, np.uint8)
    mapping.sync_to_gpu(x, cb, stream=q)
    q.finish()
    out = np.zeros_like(x)
    mapping.sync_to_cpu(cb, out, stream=q)
    q.finish()
    assert (out == 3).all()


@case("pyopencl.short_lived_contexts_released", ok=True)
def _():
    if cl is None:
        raise Skip("pyopencl is not installed")
    refs = []
    for _ in range(8):
        ctx, q = cl_context()
        cb = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64)
        mapping.sync_to_gpu(np.zeros(64, np.uint8), cb)
        refs.append(weakref.ref(ctx))
        del ctx, q, cb
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive <= 1, "%d of 8 PyOpenCL contexts are still held" % alive


bad("pyopencl.buffer_too_small",
    lambda: (lambda ctx: mapping.sync_to_gpu(np.zeros(64, np.uint8), cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 16)))(
        cl_context()[0]), OOR)
bad("pyopencl.open_queue_str", lambda: mapping.open(context=cl_context()[0], queue="q"), TYPE)
bad("pyopencl.context_as_gpu", lambda: mapping.sync_to_gpu(np.zeros(4), cl_context()[0]), TYPE)
bad("pyopencl.queue_as_gpu", lambda: mapping.sync_to_gpu(np.zeros(4), cl_context()[1]), TYPE)
bad("pyopencl.buffer_as_stream", lambda: (lambda ctx: mapping.sync_to_gpu(
    np.zeros(4), buf(64), stream=cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64)))(cl_context()[0]), TYPE)


@case("pyopencl.foreign_queue_for_mapping_buffer", ok_or=BAD)
def _():
    ctx, q = cl_context()  # another context than the default device's
    b = buf(64, fill=0)
    mapping.sync_to_gpu(np.full(64, 2, np.uint8), b, stream=q)
    q.finish()
    assert (b.get() == 2).all()


@case("pyopencl.released_buffer", ok_or=BAD + CLOSED + (RuntimeError,))
def _():
    ctx, q = cl_context()
    cb = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1024)
    b = mapping.as_buffer(cb)
    cb.release()  # the user frees it under mapping's feet
    del cb
    gc.collect()
    mapping.sync_to_gpu(np.ones(1024, np.uint8), b)
    assert (b.get() == 1).all()


@case("pyopencl.kernel_on_mapping_buffer", ok=True, backends="opencl")
def _():
    if cl is None:
        raise Skip("pyopencl is not installed")
    d = mapping.default_device()
    ctx_ptr, dev_ptr, _plat, q_ptr = d.native
    ctx = cl.Context.from_int_ptr(ctx_ptr)
    q = cl.CommandQueue.from_int_ptr(q_ptr) if q_ptr else cl.CommandQueue(ctx)
    b = mapping.allocate_gpu((16,), np.int32)
    mapping.sync_to_gpu(np.arange(16, dtype=np.int32), b)
    prg = cl.Program(ctx, "__kernel void inc(__global int *a) { a[get_global_id(0)] += 1; }").build()
    prg.inc(q, (16,), None, cl.Buffer.from_int_ptr(b.cl_mem))
    q.finish()
    assert (b.get() == np.arange(16) + 1).all()


@case("pyopencl.mirror_adopt_clbuffer", ok=True)
def _():
    ctx, q = cl_context()
    cb = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 256)
    a = np.arange(64, dtype=np.float32)
    m = mapping.mirror_adopt(a, cb)
    m.mark_cpu_modified()
    m.sync_to_gpu()
    out = np.zeros_like(a)
    cl.enqueue_copy(q, out, cb).wait()
    assert (out == a).all()


bad("misc.cl_mem_on_host_buffer", lambda: buf(16).cl_mem, (AttributeError,), backends="host")


# ===========================================================================
# env: $MAPPING_BACKEND / $MAPPING_DEVICE set badly (read when the default device opens)
# ===========================================================================

def _env_case(backend_value=None, device_value=None):
    def fn():
        if backend_value is not None:
            os.environ["MAPPING_BACKEND"] = backend_value
        if device_value is not None:
            os.environ["MAPPING_DEVICE"] = device_value
        b = mapping.allocate_gpu(16)
        b.fill(1)
        assert (b.get() == 1).all()
    return fn


CASES["env.backend_unknown"] = Case("env.backend_unknown", _env_case("nosuch"), raises=(ValueError, mapping.Error))
CASES["env.device_absent"] = Case("env.device_absent", _env_case(None, "99"),
                                  raises=(ValueError, IndexError, mapping.Error))
CASES["env.device_garbage"] = Case("env.device_garbage", _env_case(None, "abc"), raises=(ValueError, mapping.Error))
CASES["env.device_negative"] = Case("env.device_negative", _env_case(None, "-1"),
                                    raises=(ValueError, IndexError, mapping.Error))
CASES["env.backend_empty"] = Case("env.backend_empty", _env_case(""), ok_or=(ValueError, mapping.Error))
CASES["env.backend_upper"] = Case("env.backend_upper", _env_case("HOST"), ok_or=(ValueError, mapping.Error))


@case("env.info_is_plain_data", ok=True)
def _():
    i = mapping.info()
    assert isinstance(i["version"], str) and i["version"] == mapping.version()
    for b in i["backends"]:
        assert isinstance(b["name"], str)
    d = mapping.default_device()
    assert d.backend == os.environ.get("MAPPING_BACKEND", d.backend)


# ===========================================================================
# misc: messages, attribute tampering, batches, devices mixed
# ===========================================================================

@case("misc.error_is_builtin_too", ok=True)
def _():
    e = expect(mapping.Error, mapping.sync_to_gpu, np.zeros(8, np.uint8), buf(64), offset=60)
    assert isinstance(e, IndexError) and e.status < 0 and e.status_name.startswith("ERR_")


@case("misc.message_names_python_call", raises=OOR, msg=("sync_to_gpu",))
def _():
    mapping.sync_to_gpu(bytes(100), buf(16))


@case("misc.message_leads_with_python_call", ok=True)
def _():
    e = expect(OOR, mapping.sync_to_cpu, buf(16), bytearray(100))
    assert str(e).startswith("sync_to_cpu"), str(e)  # the Python call first; the C detail may follow


@case("misc.tamper_shape_then_get", raises=BAD + (AttributeError, MemoryError))
def _():
    b = buf(64, fill=1)
    b.shape = (1 << 20,)
    b.nbytes = 1 << 20
    r = b.get()
    assert False, "read %d bytes from a 64-byte buffer" % r.nbytes


@case("misc.tamper_mirror_dtype", raises=BAD + (AttributeError,))
def _():
    m = mir()
    m.dtype = np.dtype(object)
    m._cpu = None
    a = m.array
    repr(a)


@case("misc.batch_exception_in_with", ok=True)
def _():
    b = buf(16, fill=0)
    try:
        with mapping.batch() as bt:
            bt.sync_to_gpu(np.full(16, 1, np.uint8), b)
            raise KeyError("boom")
    except KeyError:
        pass
    assert bt.closed and (b.get() == 0).all()


@case("misc.batch_flush_twice_and_empty", ok=True)
def _():
    b = buf(16, fill=0)
    bt = mapping.batch()
    bt.flush()
    bt.sync_to_gpu(np.full(16, 2, np.uint8), b)
    assert len(bt) == 1
    bt.flush()
    bt.flush()
    assert (b.get() == 2).all()


@case("misc.batch_offset_out_of_range", raises=OOR)
def _():
    bt = mapping.batch()
    bt.sync_to_gpu(np.zeros(16, np.uint8), buf(16), offset=8)
    bt.flush()


@case("misc.two_devices_copy", ok_or=(mapping.Error,))
def _():
    d1, d2 = mapping.open(backend(), 0), mapping.open(backend(), 0)
    a, b = d1.allocate_gpu(16), d2.allocate_gpu(16)
    a.fill(3)
    b.fill(0)
    mapping.copy_gpu(a, b)
    assert (b.get() == 3).all()


@case("misc.foreign_stream_for_buffer", ok_or=(mapping.Error,))
def _():
    d1, d2 = mapping.open(backend(), 0), mapping.open(backend(), 0)
    b = d1.allocate_gpu(16)
    s = d2.stream()
    mapping.sync_to_gpu(np.full(16, 4, np.uint8), b, stream=s)
    s.synchronize()
    assert (b.get() == 4).all()


@case("misc.foreign_event_wait", ok_or=(mapping.Error,))
def _():
    d1, d2 = mapping.open(backend(), 0), mapping.open(backend(), 0)
    d1.stream().wait(d2.stream().record())


@case("misc.copy_overlapping_same_buffer", ok_or=(mapping.Error,))
def _():
    b = mapping.allocate_gpu(64)
    mapping.sync_to_gpu(np.arange(64, dtype=np.uint8), b)
    mapping.copy_gpu(b, b, 32, 0, 16)
    exp = np.arange(64, dtype=np.uint8)
    exp[16:48] = np.arange(32)
    assert (b.get() == exp).all(), b.get()


@case("misc.empty_everything_is_noop", ok=True)
def _():
    b = buf(16, fill=5)
    mapping.sync_to_gpu(b"", b, offset=16)
    mapping.sync_to_cpu(b, bytearray(), offset=16)
    b.fill(0, offset=16)
    mapping.copy_gpu(b, b, 0)
    e = mapping.allocate_gpu(0)
    mapping.sync_to_gpu(np.zeros(0), e)
    assert (b.get() == 5).all()


@case("misc.stats_count_bytes", ok=True)
def _():
    d = mapping.open(backend(), 0)
    b = d.allocate_gpu(4096)
    d.reset_stats()
    mapping.sync_to_gpu(np.zeros(4096, np.uint8), b)
    mapping.sync_to_cpu(b, np.zeros(1000, np.uint8))
    st = d.stats()
    assert st["h2d_bytes"] == 4096 and st["d2h_bytes"] == 1000, st


@case("misc.set_link_nonsense", ok_or=BAD)
def _():
    d = mapping.open(backend(), 0)
    d.set_link(float("nan"), -5.0)
    lat, bw = d.link
    assert lat == lat and bw > 0, (lat, bw)  # never a NaN / negative model


@case("misc.len_and_size", ok=True)
def _():
    b = mapping.allocate_gpu((3, 4), np.float32)
    assert len(b) == 3 and b.size == 12 and b.nbytes == 48


@case("misc.fill_huge_nbytes", raises=BIG + OOR)
def _():
    buf(16).fill(0, nbytes=2 ** 70)


@case("misc.mirror_cpu_r_is_readonly", ok=True)
def _():
    m = mir()
    with m.cpu("r") as a:
        expect(ValueError, a.__setitem__, 0, 1.0)
    assert m.stale_bytes("gpu") == 0


@case("misc.pipeline_dst_smaller", raises=OOR)
def _():
    mapping.pipeline(chunk_bytes=4096).run(np.zeros(8192, np.uint8), np.zeros(4096, np.uint8), lambda s, c: None)


@case("misc.pipeline_roundtrip", ok=True)
def _():
    src = np.random.default_rng(1).integers(0, 255, 5 * 4096 + 100, dtype=np.uint8)
    dst = np.zeros_like(src)
    mapping.pipeline(chunk_bytes=4096).run(src, dst, lambda s, c: mapping.copy_gpu(
        c.input, c.output, c.nbytes, c.input_offset, c.output_offset, stream=s))
    assert (dst == src).all()


# ===========================================================================
# launch_host (issue 23 item 16): a Python callable in stream order, used badly (host back end)
# ===========================================================================

@case("host_fn.runs_in_stream_order", ok=True, backends="host")
def _():
    s, b = gated_stream(), buf(MiB)
    seen = []
    mapping.sync_to_gpu(np.full(MiB, 7, np.uint8), b, stream=s)
    mapping.launch_host(s, lambda: seen.append(int(np.from_dlpack(b)[0]) if b.device.backend == "host" else 7))
    s.synchronize()
    assert seen == [7], seen


bad("host_fn.not_callable", lambda: mapping.launch_host(mapping.stream(), "fn"), TYPE, backends="host")


@case("host_fn.stream_none", ok_or=TYPE + BAD, backends="host")
def _():
    ran = []
    mapping.launch_host(None, lambda: ran.append(1))  # refused, or run now (None is blocking everywhere)
    assert ran == [1], ran


bad("host_fn.closed_stream", lambda: mapping.launch_host(closed(mapping.stream()), lambda: None), CLOSED,
    backends="host")


@case("host_fn.raises", ok_or=(ZeroDivisionError, mapping.Error), backends="host")
def _():
    s = mapping.stream()
    mapping.launch_host(s, lambda: 1 / 0)
    s.synchronize()  # reports the error, or the callable's exception was reported and dropped
    s.synchronize()  # the stream stays usable


@case("host_fn.closes_its_stream", ok_or=(mapping.Error, RuntimeError), backends="host")
def _():
    s = mapping.stream()
    mapping.launch_host(s, s.close)  # must not deadlock
    attempt(CLOSED + (mapping.Error,), s.synchronize)


@case("host_fn.synchronizes_its_stream", ok_or=(mapping.Error, RuntimeError), backends="host")
def _():
    s = mapping.stream()
    errs = []

    def fn():
        try:
            s.synchronize()  # waiting for itself: refused, never a hang
        except Exception as e:  # noqa: BLE001
            errs.append(e)
    mapping.launch_host(s, fn)
    s.synchronize()
    assert errs and isinstance(errs[0], (mapping.Error, RuntimeError)), errs


@case("dlpack.self_roundtrip", ok_or=EXPORT)
def _():
    b = mapping.allocate_gpu((16,), np.int32)
    mapping.sync_to_gpu(np.arange(16, dtype=np.int32), b)
    c = mapping.from_dlpack(b)
    assert c.device.backend == b.device.backend and (c.get() == np.arange(16)).all()
    c.fill(0)
    assert (b.get() == 0).all()  # the same memory


# ---- round 3 (tests/python/test_hostile_round3.py has the tests) ----

@case("life.host_memory_init_again", raises=TYPE)
def _():
    a = mapping.allocate_cpu((1 << 16,), np.uint8)
    a[:] = 3
    try:
        a.base.base.obj.__init__(0, 0, None)  # used to drop the owner: the memory was freed under `a`
    finally:
        gc.collect()
        assert (a == 3).all()


@case("host_fn.waits_for_a_later_event_of_its_stream", ok_or=(mapping.Error, RuntimeError), backends="host")
def _():
    s = mapping.stream()
    errs = []

    def fn():
        try:
            s.record().synchronize()  # behind this function: refused, never a hang
        except Exception as e:  # noqa: BLE001
            errs.append(e)
    mapping.launch_host(s, fn)
    s.synchronize()
    assert errs and isinstance(errs[0], mapping.BusyError), errs


@case("dlpack.device_lies", raises=(mapping.DeviceMismatchError, TypeError))
def _():
    b = mapping.allocate_gpu((16,), np.int32)

    class Liar:
        def __dlpack__(self, stream=None, **kw):
            return b.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            kind, index = b.__dlpack_device__()
            return (4, 0) if kind == 1 else (1, 0)  # the capsule is elsewhere
    mapping.from_dlpack(Liar(), device=mapping.open("host") if b.device.backend != "host" else None)


@case("life.fork_child_exits_with_open_streams", ok=True)
def _():
    s = mapping.stream()
    mapping.sync_to_gpu(np.zeros(1 << 16, np.uint8), mapping.allocate_gpu(1 << 16), stream=s)
    s.synchronize()
    pid = os.fork()
    if pid == 0:
        try:
            s.close()
            gc.collect()  # destroying the parent's stream hung the child
        finally:
            os._exit(0)
    for _ in range(3000):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert status == 0, status
            return
        threading.Event().wait(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child hung")


# ===========================================================================
# round 4 (tests/python/test_hostile_round4.py runs these through run.py)
# ===========================================================================

@case("gc.exit_with_a_queued_host_function", ok=True, backends="host")
def _():
    # Left for interpreter exit: a launch_host function queued behind a copy. At
    # finalization the stream's destroy waited for it, and its thread could no
    # longer take the GIL: the exit hung (HANG after the case returned).
    import functools
    g = sys.modules[__name__].__dict__
    g["_q_s"] = s = mapping.stream()
    g["_q_b"] = b = mapping.allocate_gpu(64 * MiB)
    mapping.sync_to_gpu(np.ones(64 * MiB, np.uint8), b, stream=s)
    mapping.launch_host(s, functools.partial(os.write, 2, b"queued function ran\n"))


@case("misc.family_lock_without_init", ok=True)
def _():
    # FamilyLock.__new__ alone (type(m._lock).__new__) left its lock NULL: SIGSEGV at `with`
    m = mapping.mirror(64)
    for cls in (type(m._lock), mapping._core.FamilyLock):
        lock = cls.__new__(cls)
        with lock:
            assert lock.locked()
        lock.pending = 1
        attempt((AttributeError,), lock.reap)


@case("life.fork_child_with_a_family_lock_a_parent_thread_held", ok=True, backends="host")
def _():
    # the child's next call on the family waited for a thread it does not have
    m = mir()
    held, release = threading.Event(), threading.Event()

    def holder():
        with m._lock:
            held.set()
            release.wait(30)
    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                m.mark_cpu_modified()
                m.sync_to_gpu()
                code = 0
            finally:
                os._exit(code)
    finally:
        release.set()
        t.join()
    for _ in range(3000):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert status == 0, status
            return
        threading.Event().wait(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child hung")


@case("host_fn.drops_its_own_stream_and_device", ok=True, backends="host")
def _():
    # a stream (or its device) whose last reference goes inside a function on
    # that stream: the library refuses the destroy there, so it leaked (a thread each)
    before = len(os.listdir("/proc/self/task"))
    for _ in range(20):
        d = mapping.open("host")
        s = d.stream()
        holder = [s, d, d.allocate_gpu(4096)]
        ran = threading.Event()

        def fn(holder=holder, ran=ran):
            holder.clear()
            ran.set()
        mapping.launch_host(s, fn)
        del s, d
        assert ran.wait(10)
        mapping._core.drain()
    assert len(os.listdir("/proc/self/task")) <= before + 2


@case("misc.pipeline_dst_overlapping_src", raises=mapping.InvalidArgumentError, msg=("overlaps",))
def _():
    # the chunks' output overwrote input not read yet: silently wrong data
    a = (np.arange(16 * 4096) // 4096).astype(np.uint8)

    def step(s, c):
        mapping.copy_gpu(c.input, c.output, c.nbytes, c.input_offset, c.output_offset, stream=s)
    mapping.pipeline(chunk_bytes=4096, depth=2).run(a[:-4096], a[4096:], step)
