"""mapping: move data between CPU and accelerator memory, and know where each byte is valid.

The seed's syntax::

    import mapping, numpy as np
    cpu_data = np.arange(3, dtype=np.float32)
    gpu_tensor = mapping.allocate_gpu(cpu_data.shape, cpu_data.dtype)
    mapping.sync_to_gpu(cpu_data, gpu_tensor)
    cpu_result = mapping.allocate_cpu(cpu_data.shape, cpu_data.dtype)   # page-locked numpy array
    mapping.sync_to_cpu(gpu_tensor, cpu_result)

The default device follows $MAPPING_BACKEND / $MAPPING_DEVICE (mapping.open()
picks one explicitly). docs/python.md has the whole API.
"""
import atexit as _atexit
import warnings as _warnings
import collections
import operator as _operator
import os as _os
import re as _re
import sys as _sys
import threading as _threading
import weakref

import numpy as _np

from . import _core
from ._errors import *  # noqa: F401,F403  (Error and one subclass per status)
from ._errors import Error, BY_NAME as _ERR

__version__ = "0.2.0"

CPU = "cpu"
GPU = "gpu"

# DLPack device types (dlpack.h)
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_OPENCL = 1, 2, 3, 4
_DL_CODE = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_DL_KIND = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}

# Bumped in a child after os.fork(): a C object made before belongs to the
# parent (a host stream's worker thread, a driver's threads are not in the
# child), so the child never destroys it (destroying a host stream there
# waits for a thread that does not exist: the child hung at exit) and
# refuses to queue work on its streams and pipelines. A list the classes
# below also hold: finalizers read it at interpreter exit, after this
# module's globals are gone.
_fork_generation = [0]


def _after_fork_in_child():
    global _registry_lock
    _fork_generation[0] += 1
    _core.after_fork_child()
    # another thread of the parent may have held it (opening a device): that thread is not in the child
    _registry_lock = _threading.RLock()


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork_in_child)


def _forked_error(kind):
    return _ERR["ERR_INVALID_HANDLE"]("this %s was made before os.fork() in the parent process: its work would run "
                                      "on the parent's threads; make a new one in the child" % kind, -5)


class _Handle:
    """The one owner of a C object: the C object is destroyed when the last
    reference to its handle goes. The Python object (Buffer, Mirror, ...) holds
    one reference; so does every export of it (a numpy view, a DLPack capsule,
    a Buffer.view(), a record of queued stream work, a pending batch copy, a
    mirror adopting a buffer). close() drops the Python object's reference (the
    object is closed: every later use raises), so the free waits for the last
    export.

    `parent` (its device's handle, or a mirror's) stays alive until then;
    `keep` holds what the C object uses (Pins of host buffers, other handles)
    until it is destroyed. A handle another one keeps counts it in `users` and
    defers its own destroy until that one has gone: the garbage collector may
    finalize handles reachable only from a reference cycle in any order. For
    the same reason a device's handle knows its children's handles and
    destroys them first (mirrors, then batches and pipelines, streams, events,
    buffers), and a child whose device is gone does nothing."""

    __slots__ = ("ptr", "destroy", "parent", "rank", "children", "keep", "users", "deferred", "family", "gen",
                 "__weakref__")

    def __init__(self, ptr, destroy, parent=None, rank=9, keep=None, family=None):
        self.ptr = ptr
        self.destroy = destroy
        self.parent = parent
        self.rank = rank
        self.children = None
        self.users = 0
        self.deferred = False
        self.keep = keep
        self.family = family  # a mirror's _Family: its destroy is one more call on the family
        self.gen = self.forks[0]  # another in a forked child: the parent's, never destroyed there
        if keep:
            for k in keep:
                if type(k) is _Handle:
                    k.users += 1
        if parent is not None and destroy is not None:
            root = parent
            while root.parent is not None:
                root = root.parent
            if root.children is None:
                root.children = weakref.WeakSet()
            root.children.add(self)

    def _ancestors_alive(self):
        p = self.parent
        while p is not None:
            if p.ptr is None:
                return False
            p = p.parent
        return True

    def _let_go(self):
        keep, self.keep = self.keep, None
        if keep:
            for k in keep:
                if type(k) is _Handle:
                    k.users -= 1
                    if k.deferred and k.users <= 0:
                        k.release()

    def release(self):
        ptr = self.ptr
        if ptr is None or self.destroy is None:
            self.ptr = None
            self._let_go()
            return
        if self.users > 0:  # a handle that uses it is finalized later (GC order)
            self.deferred = True
            return
        if self.in_host_fn():
            # Let go of on a launch_host function's thread: destroyed later on another
            # thread (the library refuses to destroy a stream, a device or a pipeline
            # from a function on its own stream, which would wait for itself: they
            # leaked, a thread each; on CUDA such a function must not call the driver).
            self.defer(self.later(self))
            return
        if self.finalizing() and self.host_fns_pending():
            # Interpreter exit with launch_host functions still queued: they can no
            # longer take the GIL (their thread exits or blocks), so a destroy that
            # waits for their stream never returned. Left to the process's end.
            self.ptr = None
            return
        if self.children:
            for child in sorted(list(self.children), key=lambda h: h.rank):
                child.users = 0
                child.release()
        if not self._ancestors_alive() or self.gen != self.forks[0]:
            self.ptr = None
            self._let_go()
            return
        self.ptr = None
        if self.family is not None:
            self.family.destroy(self, ptr)  # now, or when the thread using the family lets go of it
            return
        try:
            self.destroy(ptr)
        except Exception:  # pragma: no cover - never raise from GC
            pass
        self._let_go()

    def __del__(self):
        self.release()


class _Later:
    """A handle let go of on a launch_host function's thread, released when
    this is dropped: by the done list (_core.defer), on a Python thread that
    runs no such function (else it is handed over again)."""

    __slots__ = ("h",)

    def __init__(self, h):
        self.h = h

    def __del__(self):
        h, self.h = self.h, None
        if h is not None:
            h.release()


# Class attributes, not globals: finalizers read them at interpreter exit,
# after this module's globals are gone.
_Handle.forks = _fork_generation
_Handle.in_host_fn = _core.in_host_fn
_Handle.defer = _core.defer
_Handle.later = _Later
_Handle.finalizing = _sys.is_finalizing
_Handle.host_fns_pending = _core.host_fns_pending


def _closed_error(kind):
    return _ERR["ERR_INVALID_HANDLE"]("this %s is closed" % kind, -5)


class _Family(_core.FamilyLock):
    """One thread at a time per mirror family (a root and all its views), as
    the C library requires (its BUSY detection is only best effort): every
    call on the family holds this lock, which the root and its views share.
    Batches, pipelines and multimirrors have one each as well. A thread waits
    for another thread's call to end; the same thread may enter again. A
    thread running a launch_host function waits at most 1 s, then gets
    BusyError (the thread holding the family may be waiting for the very
    stream that function runs on). The lock is taken and given back in C
    (mapping._core.FamilyLock): no signal handler (KeyboardInterrupt) can
    run between taking it and the with statement's protection.

    A handle of the family that the garbage collector finalizes while another
    thread is in a call on the family is destroyed by that thread when it
    lets go (a finalizer never waits: it may run on any thread, anywhere)."""

    __slots__ = ("kind", "orphans")

    def __init__(self, kind):
        super().__init__(_ERR["ERR_BUSY"])
        self.kind = kind
        self.orphans = []

    def _reap_locked(self):
        self.pending = 0
        while self.orphans:
            h, ptr = self.orphans.pop(0)
            try:
                h.destroy(ptr)
            except Exception:  # pragma: no cover - never raise from GC
                pass
            h._let_go()

    def destroy(self, h, ptr):
        """Destroys handle h's C object (h.ptr already None) and lets go of
        what it keeps: now, or by the thread in a call on the family when
        that call ends."""
        self.orphans.append((h, ptr))
        self.pending = 1
        self.reap()


class _Owned:
    """Base of the objects that hold a C handle: close() / context manager; a
    closed object raises mapping.InvalidHandleError on every use. They cannot
    be copied or pickled (a copy would share the C object)."""

    _kind = "object"
    _h = None

    def _ptr(self):
        h = self._h
        if h is None or h.ptr is None:
            raise _closed_error(self._kind)
        return h.ptr

    def _hold(self):
        """The live handle, for the caller to hold in a local variable while
        it uses h.ptr: a close() meanwhile (on another thread: the call may
        release the GIL) cannot free the C object under the call."""
        h = self._h
        if h is None or h.ptr is None:
            raise _closed_error(self._kind)
        return h

    @property
    def closed(self):
        return self._h is None

    def close(self):
        """Closes it now: every later use raises. The C object is freed once
        nothing uses it any more (a numpy view, a DLPack export, queued work)."""
        self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __copy__(self):
        raise TypeError("a mapping.%s cannot be copied (it owns a C object): make a new one and copy the data"
                        % type(self).__name__)

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce_ex__(self, protocol):
        raise TypeError("a mapping.%s cannot be pickled (it owns a C object): pickle a numpy copy of its data"
                        % type(self).__name__)



def _index(v, what):
    """An int from an int or a numpy integer (never a float or a bool)."""
    if type(v) is int:
        return v
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError("%s must be an int, got %s" % (what, type(v).__name__))
    return _operator.index(v)


def _size(v, what):
    v = _index(v, what)
    if v < 0:
        raise ValueError("%s must be >= 0, got %d" % (what, v))
    return v


def _dtype(dtype, call):
    dt = _np.dtype(dtype)
    if dt.hasobject:
        raise TypeError("%s: dtype %s holds Python objects; only plain data can live in device memory" % (call, dt))
    if dt.itemsize == 0:
        raise TypeError("%s: dtype %s has no size" % (call, dt))
    return dt


def _nbytes_of(shape, dtype):
    n = _np.dtype(dtype).itemsize
    for s in shape:
        n *= s
    return n


def _shape_dtype(shape, dtype, call="allocate"):
    """(nbytes) or (shape, dtype): returns (shape tuple, numpy dtype, typed).
    A byte count alone is uint8 (untyped); a shape alone is float64, as in numpy."""
    if isinstance(shape, (tuple, list)):
        dims = tuple(_size(s, "%s: shape[%d]" % (call, i)) for i, s in enumerate(shape))
    elif hasattr(shape, "__index__") and not isinstance(shape, bool):
        dims = (_size(shape, "%s: shape" % call),)
        if dtype is None:
            return dims, _np.dtype(_np.uint8), False
    else:
        raise TypeError("%s: expected a byte count or a shape (tuple of ints), got %s" % (call, type(shape).__name__))
    dt = _dtype(_np.float64 if dtype is None else dtype, call)
    if dt.subdtype is not None:
        # as numpy: np.empty((4,), ("f4", (3,))) is a (4, 3) float32 array (the
        # sub-array dtype kept made .get() and a mirror's .array raise)
        dt, sub = dt.subdtype
        dims = dims + sub
    return dims, dt, True


_C_NAME = _re.compile(r"^mapping_\w+: ")


def _retag(e, call):
    """The same error class with the Python call named first (instead of the
    C function the library's message starts with)."""
    text = _C_NAME.sub("", str(e), count=1)
    if text.startswith(call + ":") or text.startswith(call + "("):
        if text == str(e):
            return e
        msg = text
    else:
        msg = "%s: %s" % (call, text)
    try:
        new = type(e)(msg, getattr(e, "status", None)) if isinstance(e, Error) else type(e)(msg)
    except Exception:  # pragma: no cover
        return e
    return new


# ---------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------

class Device(_Owned):
    """An open device. Everything made from it holds it open; close() closes
    its objects now and frees the device once nothing uses it (a numpy view of
    its memory, a DLPack export, queued work)."""

    _kind = "device"

    def __init__(self, ptr, keep=None):
        # keep (e.g. the pyopencl.Context it was opened on) lives as long as the C device
        self._h = _Handle(ptr, _core.close, keep=(keep,) if keep is not None else None)
        self._children = weakref.WeakSet()
        self._imported_queues = {}
        info = _core.device_info(ptr)
        # Small blocking copies keep the GIL where they are a plain memcpy
        # (host back end, no modelled link); elsewhere every copy releases it.
        self._hold_gil_below = 65536 if info["backend"] == "host" and "link-model" not in info["capabilities"] else 0
        self.backend = info["backend"]
        self.index = info["index"]
        self.name = info["name"]

    def info(self):
        """The device's description (back end, kind, name, memory, capabilities)."""
        return _core.device_info(self._ptr())

    @property
    def native(self):
        """(context, device, platform, queue) as ints (cl_context..., CUcontext...)."""
        return _core.native_device(self._ptr())

    def stats(self):
        """Statistics as a dict (h2d_bytes, d2h_bytes, sync_skipped_bytes, ...)."""
        return _core.stats(self._ptr())

    def reset_stats(self):
        _core.stats_reset(self._ptr())

    @property
    def link(self):
        """(latency seconds, bandwidth bytes/s) the library plans with (measured on first use)."""
        h = self._hold()
        return _core.device_link(h.ptr)

    def set_link(self, latency=0.0, bandwidth=0.0):
        """Sets the link model (0 fields: measure again on next use)."""
        h = self._hold()
        _core.device_set_link(h.ptr, float(latency), float(bandwidth))

    @property
    def memory_budget(self):
        """The device's memory budget in bytes (0: none; docs/mirrors.md,
        "Larger than the device"). Setting it (an int >= 0) evicts the device
        sides of mirrors, least recently used first, down to it."""
        h = self._hold()
        return _core.memory_budget(h.ptr)[0]

    @memory_budget.setter
    def memory_budget(self, nbytes):
        nbytes = _budget(nbytes, "Device.memory_budget")
        h = self._hold()
        _core.set_memory_budget(h.ptr, nbytes)

    @property
    def resident_bytes(self):
        """Device bytes counted against the budget now: mirror device sides
        that are resident and buffers from allocate_gpu."""
        h = self._hold()
        return _core.memory_budget(h.ptr)[1]

    def close(self):
        if self._h is None:
            return
        for order in (MultiMirror, Mirror, Batch, Pipeline, Stream, Event, Buffer):
            for c in list(self._children):
                if isinstance(c, order):
                    c.close()
        self._imported_queues.clear()
        self._h = None

    def _adopt(self, child):
        self._children.add(child)
        return child

    def __repr__(self):
        return "<mapping.Device %s:%d %r%s>" % (self.backend, self.index, self.name, " closed" if self.closed else "")

    # the seed's functions, bound to this device
    def allocate_gpu(self, shape, dtype=None):
        return allocate_gpu(shape, dtype, device=self)

    def allocate_cpu(self, shape, dtype=None):
        return allocate_cpu(shape, dtype, device=self)

    def stream(self):
        return Stream(self)

    def batch(self):
        return Batch(self)


_default = None
# One Device per (back end, index) opened implicitly, and one per OpenCL
# context: found again while in use, released when nothing uses it.
_implicit_devices = weakref.WeakValueDictionary()
_opencl_devices = weakref.WeakValueDictionary()
_registry_lock = _threading.RLock()


def _budget(nbytes, what):
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError("%s must be an int number of bytes, got %s" % (what, type(nbytes).__name__))
    if not 0 <= nbytes <= 2 ** 60:
        raise ValueError("%s=%d is not a memory budget (0 to 2**60 bytes; 0: none)" % (what, nbytes))
    return nbytes


def open(backend=None, device=None, context=None, queue=None, budget=None):  # noqa: A001 (the library's own name)
    """Opens a device: open(backend="host"|"opencl"|"cuda", device=N); with no
    arguments $MAPPING_BACKEND / $MAPPING_DEVICE or the best available.
    open(context=pyopencl.Context[, queue=pyopencl.CommandQueue]) opens on
    PyOpenCL's context, so its buffers and queues go to this device.
    budget=N: a device memory budget of N bytes (mirrors larger than the
    device: docs/mirrors.md; None: $MAPPING_MEMORY_BUDGET, else none)."""
    if budget is not None:
        budget = _budget(budget, "open: budget")
    if context is not None:
        dev = open_opencl(context, queue=queue)
        if budget:
            dev.memory_budget = budget
        return dev
    if backend is not None and not isinstance(backend, str):
        raise TypeError("open: backend must be a str such as 'host', 'opencl' or 'cuda'")
    if device is not None:
        device = _index(device, "open: device")
        if not 0 <= device < 2 ** 31:
            raise ValueError("open: device=%d is not a device index (0, 1, ...)" % device)
    return Device(_core.open(backend, -1 if device is None else device, budget or 0))


def _int_ptr(obj, what):
    p = getattr(obj, "int_ptr", None)
    if p is None:
        if isinstance(obj, int) and not isinstance(obj, bool):
            return obj
        raise TypeError("%s must be a pyopencl object (with .int_ptr) or an int handle" % what)
    return int(p)


def open_opencl(context, device=None, queue=None):
    """A device on an OpenCL context made elsewhere: a pyopencl.Context (or a
    cl_context int), its device (default: the context's first device), and an
    optional in-order queue that becomes the device's own queue. PyOpenCL
    buffers and queues of that context then go to this device."""
    ctx = _int_ptr(context, "context")
    if device is None:
        devs = getattr(context, "devices", None)
        if queue is not None and hasattr(queue, "device"):
            device = queue.device
        elif devs:
            device = devs[0]
        else:
            raise TypeError("pass device= with a cl_device_id int handle")
    dev = _int_ptr(device, "device")
    q = _int_ptr(queue, "queue") if queue is not None else None
    d = Device(_core.open_opencl(ctx, dev, q), keep=(context, device, queue))
    with _registry_lock:
        old = _opencl_devices.get(ctx)
        if old is None or old.closed or queue is not None:
            _opencl_devices[ctx] = d
    return d


def _device_for_opencl_context(context, device=None):
    if device is not None:
        return device
    key = int(context.int_ptr)
    with _registry_lock:
        d = _opencl_devices.get(key)
        if d is None or d.closed:
            d = open_opencl(context)
        return d


def _implicit_device(backend, index):
    """The device of another back end a foreign tensor lives on: one per
    (back end, index), found again while used."""
    with _registry_lock:
        d = _implicit_devices.get((backend, index))
        if d is None or d.closed:
            d = open(backend, index)
            _implicit_devices[(backend, index)] = d
        return d


def default_device():
    """The device the module-level functions use: opened on first use from
    $MAPPING_BACKEND / $MAPPING_DEVICE (or the best available)."""
    global _default
    d = _default
    if d is None or d.closed:
        with _registry_lock:
            if _default is None or _default.closed:
                _default = open()
            d = _default
    return d


def set_default_device(device):
    """Makes `device` the one the module-level functions use."""
    global _default
    if not isinstance(device, Device):
        raise TypeError("expected a mapping.Device")
    _default = device


def _dev(device):
    if device is None:
        return default_device()
    if type(device) is not Device:
        raise TypeError("device must be a mapping.Device or None, got %s" % type(device).__name__)
    return device


# ---------------------------------------------------------------------------
# Device memory
# ---------------------------------------------------------------------------

class Buffer(_Owned):
    """Device ("GPU") memory: a shape and dtype over nbytes bytes. Works with
    DLPack (__dlpack__), __cuda_array_interface__ (CUDA), and PyOpenCL
    (.cl_mem for pyopencl.Buffer.from_int_ptr)."""

    _kind = "buffer"

    def __init__(self, device, ptr, nbytes, shape=None, dtype=None, owned=True, keep=None, handle=None, typed=None):
        self.device = device
        if handle is None:
            handle = _Handle(ptr, _core.free_gpu if owned else None, device._h, 4,
                             keep=(keep,) if keep is not None else None)
        self._h = handle
        self.nbytes = nbytes
        self.dtype = _np.dtype(_np.uint8 if dtype is None else dtype)
        self.shape = (nbytes // self.dtype.itemsize,) if shape is None else tuple(shape)
        if self.dtype.subdtype is not None:  # as numpy: the sub-array's dimensions join the shape
            self.dtype, sub = self.dtype.subdtype
            self.shape += sub
        # typed: made with a dtype, so a copy from an array of another dtype is refused
        self._typed = dtype is not None if typed is None else typed
        self._stream = None  # weakref to the last stream that queued work on it (the CUDA array interface)
        if owned:
            device._adopt(self)

    def __repr__(self):
        return "<mapping.Buffer %d bytes %s %s on %s%s>" % (self.nbytes, self.shape, self.dtype, self.device.backend,
                                                             " closed" if self.closed else "")

    def __len__(self):
        return self.shape[0] if self.shape else 1

    def _check(self):
        if self._h is None:
            raise _closed_error("buffer")

    @property
    def size(self):
        return self.nbytes // self.dtype.itemsize

    @property
    def native(self):
        """The native handle as an int: cl_mem (OpenCL), CUdeviceptr (CUDA), address (host)."""
        self._check()
        if self.nbytes == 0:
            return 0
        return _core.buffer_native(self._ptr())

    @property
    def cl_mem(self):
        """The cl_mem as an int, for pyopencl.Buffer.from_int_ptr(buf.cl_mem)."""
        if self.device.backend != "opencl":
            raise AttributeError("cl_mem: this buffer is on the %s back end" % self.device.backend)
        return self.native

    def view(self, shape=None, dtype=None):
        """The same memory with another shape/dtype (no copy). The view keeps
        the memory: closing the buffer first leaves the view valid."""
        self._check()
        dt = self.dtype if dtype is None else _dtype(dtype, "Buffer.view")
        if shape is None:
            shape = (self.nbytes // dt.itemsize,)
        shape, dt, _ = _shape_dtype(tuple(shape) if isinstance(shape, (tuple, list)) else shape, dt, "Buffer.view")
        if _nbytes_of(shape, dt) != self.nbytes:
            raise _ERR["ERR_INVALID_ARGUMENT"]("view: %s of %s is not %d bytes" % (shape, dt, self.nbytes), -2)
        return Buffer(self.device, None, self.nbytes, shape, dt, owned=False, handle=self._h,
                      typed=self._typed or dtype is not None)

    def get(self, stream=None):
        """A new numpy array with the buffer's content."""
        self._check()
        out = _np.empty(self.shape, self.dtype)
        sync_to_cpu(self, out, stream=stream)
        if stream is not None:
            stream.synchronize()
        return out

    def fill(self, value, offset=0, nbytes=None, stream=None):
        """Sets bytes to `value` (0..255)."""
        self._check()
        offset = _size(offset, "fill: offset")
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError("fill: value must be an int byte (0..255), got %s" % type(value).__name__)
        if not 0 <= _operator.index(value) <= 255:
            raise _ERR["ERR_INVALID_ARGUMENT"]("fill: value %r is not a byte (0..255)" % (value,), -2)
        if offset > self.nbytes:
            raise _ERR["ERR_OUT_OF_RANGE"]("fill: offset %d is past the buffer's %d bytes" % (offset, self.nbytes), -4)
        n = self.nbytes - offset if nbytes is None else _size(nbytes, "fill: nbytes")
        if n == 0:
            return
        sh = _stream_hold(stream, self.device)
        h = self._hold()
        try:
            _queue(sh, (h,), _core.fill_gpu, _sp(sh), h.ptr, offset, n, _operator.index(value))
        except Error as e:
            raise _retag(e, "fill(value, offset=%d, nbytes=%d)" % (offset, n)) from None
        if sh is not None:
            self._stream = _stream_ref(stream)

    # ---- DLPack ----
    def __dlpack_device__(self):
        kind = {"host": _DL_CPU, "cuda": _DL_CUDA, "opencl": _DL_OPENCL}.get(self.device.backend, _DL_CPU)
        return (kind, 0 if self.device.backend == "host" else self.device.index)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        h = self._h  # one handle for the address and the capsule: a close() meanwhile cannot split them
        if h is None:
            raise _closed_error("buffer")
        if copy:
            raise BufferError("mapping buffers are exported without a copy")
        kind, index = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != (kind, index):
            raise BufferError("__dlpack__: this buffer is on DLPack device %s, not %s (no cross-device export)"
                              % ((kind, index), tuple(dl_device)))
        if not self.dtype.isnative:
            raise BufferError("DLPack only supports native byte order; this buffer's dtype is %s" % self.dtype)
        code = _DL_CODE.get(self.dtype.kind)
        if code is None:
            raise BufferError("dtype %s has no DLPack equivalent" % self.dtype)
        last = self._stream() if self._stream is not None else None
        if last is not None and not last.closed:
            try:
                last.synchronize()  # make queued work visible to any consumer stream
            except _ERR["ERR_BUSY"]:
                pass  # called from a host function on that stream: its earlier work is done
        addr = _core.buffer_native(h.ptr) if h.ptr is not None else 0
        # the capsule holds the handle: the memory stays until the consumer's deleter runs; the
        # shape is checked against the C buffer's size (shape, dtype and nbytes are plain attributes)
        versioned = max_version is not None and tuple(max_version)[:1] >= (1,)
        return _core.to_dlpack(addr, kind, index, tuple(self.shape), (code, self.dtype.itemsize * 8), h,
                               versioned, h.ptr)

    # ---- CUDA array interface v3 ----
    @property
    def __cuda_array_interface__(self):
        if self.device.backend != "cuda":
            raise AttributeError("__cuda_array_interface__: this buffer is on the %s back end" % self.device.backend)
        s = self._stream() if self._stream is not None else None
        stream = _core.stream_native(s._ptr()) if s is not None and not s.closed else None
        return {"shape": tuple(self.shape), "typestr": self.dtype.str, "data": (self.native, False),
                "version": 3, "strides": None, "stream": stream or None}


def allocate_gpu(shape, dtype=None, device=None):
    """Device memory: allocate_gpu(nbytes) (uint8) or allocate_gpu(shape, dtype)
    (dtype defaults to float64, as in numpy). Its content is undefined until
    written. Size 0 gives an empty buffer."""
    shape, dtype, typed = _shape_dtype(shape, dtype, "allocate_gpu")
    dev = _dev(device)
    n = _nbytes_of(shape, dtype)
    ptr = _core.allocate_gpu(dev._ptr(), n) if n else None
    return Buffer(dev, ptr, n, shape, dtype, typed=typed)


class _HostBlock:
    """Page-locked memory from mapping_allocate_cpu; freed with the last numpy view."""
    __slots__ = ("dev", "addr", "gen", "__weakref__")
    _free = staticmethod(_core.free_cpu)
    forks = _fork_generation
    in_host_fn = staticmethod(_core.in_host_fn)
    defer = staticmethod(_core.defer)

    def __init__(self, dev_handle, addr):
        self.dev = dev_handle
        self.addr = addr
        self.gen = self.forks[0]

    def __del__(self):
        if self.addr and self.in_host_fn():
            # dropped on a launch_host function's thread (on CUDA such a function must not
            # call the driver): freed later on another thread, as _Handle.release does
            later = _HostBlock(self.dev, self.addr)
            self.addr = None
            self.defer(later)
            return
        if self.addr and self.dev is not None and self.dev.ptr and self.gen == self.forks[0]:
            try:
                self._free(self.dev.ptr, self.addr)
            except Exception:  # pragma: no cover
                pass
        self.addr = None


def allocate_cpu(shape, dtype=None, device=None):
    """A numpy array in page-locked host memory (the fastest copies):
    allocate_cpu(nbytes) (uint8) or allocate_cpu(shape, dtype). Freed with the
    array; it keeps its device open until then."""
    shape, dtype, _ = _shape_dtype(shape, dtype, "allocate_cpu")
    dev = _dev(device)
    n = _nbytes_of(shape, dtype)
    if n == 0:
        return _np.empty(shape, dtype)
    addr = _core.allocate_cpu(dev._ptr(), n)
    mem = _core.HostMemory(addr, n, _HostBlock(dev._h, addr))
    return _np.frombuffer(mem, dtype=dtype).reshape(shape)


def _import_pyopencl_buffer(obj, device=None):
    dev = _device_for_opencl_context(obj.context, device)
    n = int(obj.size)
    ptr = _core.import_gpu(dev._ptr(), int(obj.int_ptr), 0, n)
    return Buffer(dev, ptr, n, keep=obj)


def _is_pyopencl(obj, name):
    mod = type(obj).__module__ or ""
    return mod.startswith("pyopencl") and any(c.__name__ == name for c in type(obj).__mro__)


_GPU_KINDS = "a mapping.Buffer, a pyopencl.Buffer or a DLPack / CUDA-array-interface device tensor"


def as_buffer(obj, device=None, call="as_buffer"):
    """A mapping.Buffer for obj: itself; a pyopencl.Buffer (on `device`, else
    the device opened on its context); an object with __dlpack__ or
    __cuda_array_interface__ (torch, CuPy) imported without a copy. Host
    memory (a numpy array) is device memory only on the host back end. The
    memory stays the owner's."""
    if type(obj) is Buffer:
        return obj
    if isinstance(obj, Buffer):
        return obj
    if _is_pyopencl(obj, "Buffer"):
        return _import_pyopencl_buffer(obj, device)
    if hasattr(obj, "__cuda_array_interface__") and not hasattr(obj, "__dlpack__"):
        return _import_cai(obj, device)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return from_dlpack(obj, device=device, call=call)
    raise TypeError("%s: expected %s; got %s" % (call, _GPU_KINDS, type(obj).__name__))


def import_gpu(native, nbytes, offset=0, device=None, shape=None, dtype=None, keep=None):
    """Device memory made elsewhere as a Buffer: a cl_mem (int) on a device
    opened on its context, a CUdeviceptr (int), or an address (host back end).
    Freeing the Buffer never frees the memory; `keep` is held until then."""
    dev = _dev(device)
    nbytes = _size(nbytes, "import_gpu: nbytes")
    offset = _size(offset, "import_gpu: offset")
    ptr = _core.import_gpu(dev._ptr(), _index(native, "import_gpu: native"), offset, nbytes)
    if dtype is not None:
        dtype = _dtype(dtype, "import_gpu")
    if shape is None and dtype is not None:
        shape = (nbytes // dtype.itemsize,)
    return Buffer(dev, ptr, nbytes, shape, dtype, keep=keep)


def _cuda_stream_sync(dev, handle):
    """Waits for a producer's CUDA stream (the "stream" key of the CUDA array
    interface): 1 is the legacy default stream, 2 the per-thread one."""
    if handle is None:
        return
    handle = _index(handle, "__cuda_array_interface__['stream']")
    if handle < 0:
        raise _ERR["ERR_INVALID_ARGUMENT"]("__cuda_array_interface__: stream %d is not a CUstream" % handle, -2)
    # 0 (torch's default stream, though v3 disallows it) is the legacy default
    # stream, CU_STREAM_LEGACY (1); 2 is CU_STREAM_PER_THREAD. Every stream of
    # the device waits for the producer's work on the device, the host does not.
    _core.device_wait_native(dev._ptr(), handle or 1)


def _import_cai(obj, device):
    cai = obj.__cuda_array_interface__
    dt = _dtype(cai["typestr"], "__cuda_array_interface__")
    shape = tuple(_size(d, "__cuda_array_interface__ shape") for d in cai["shape"])
    if cai.get("strides") not in (None, ()):
        exp = dt.itemsize
        for s, st in zip(reversed(shape), reversed(cai["strides"])):
            if s > 1 and st != exp:
                raise _ERR["ERR_INVALID_ARGUMENT"]("__cuda_array_interface__: not C-contiguous", -2)
            exp *= s
    dev = _dev(device)
    if dev.backend != "cuda":
        raise _ERR["ERR_DEVICE_MISMATCH"]("a CUDA array needs a CUDA device (this one is %s)" % dev.backend, -6)
    _cuda_stream_sync(dev, cai.get("stream"))
    n = _nbytes_of(shape, dt)
    ptr = _core.import_gpu(dev._ptr(), cai["data"][0], 0, n) if n else None
    return Buffer(dev, ptr, n, shape, dt, keep=obj)


def from_dlpack(obj, device=None, call="from_dlpack"):
    """Imports a DLPack tensor's memory (torch, CuPy; numpy on the host back
    end) as a Buffer, without a copy, on `device` or else the device of its
    back end and index (found again while in use). The producer's memory is
    released when the Buffer is freed."""
    if not hasattr(obj, "__dlpack__"):
        raise TypeError("%s: %s has no __dlpack__" % (call, type(obj).__name__))
    kind, index = obj.__dlpack_device__()
    kind, index = int(kind), int(index)
    want = {_DL_CPU: "host", _DL_CUDA: "cuda", _DL_OPENCL: "opencl"}.get(kind)
    dev = None if device is None else _dev(device)
    if want == "host":
        d = dev if dev is not None else default_device()
        if d.backend != "host":
            raise TypeError("%s: expected %s on the %s device; got %s, which is host memory (device memory only on "
                            "the host back end: copy it with sync_to_gpu)" % (call, _GPU_KINDS, d.backend,
                                                                             type(obj).__name__))
        dev = d
    elif dev is None:
        if want is None:
            raise _ERR["ERR_DEVICE_MISMATCH"]("%s: DLPack device type %d is not supported" % (call, kind), -6)
        d = default_device()
        dev = d if d.backend == want and d.index == index else _implicit_device(want, index)
    if want is None or dev.backend != want or (want != "host" and dev.index != index):
        raise _ERR["ERR_DEVICE_MISMATCH"](
            "%s: the tensor is on DLPack device (%d, %d), the device is %s:%d" % (call, kind, index, dev.backend,
                                                                                  dev.index), -6)
    if want == "cuda":
        # the consumer stream (DLPack): the device's own queue, else the legacy default stream (1)
        q = dev.native[3]
        try:
            capsule = obj.__dlpack__(stream=q if q else 1)
        except TypeError:
            capsule = obj.__dlpack__()
    else:
        try:
            capsule = obj.__dlpack__(stream=None)
        except TypeError:
            capsule = obj.__dlpack__()
    if want == "cuda":  # the producer ordered its work before the consumer stream: every stream of ours after it
        _core.device_wait_native(dev._ptr(), q if q else None)
    # the capsule's own device must be the one __dlpack_device__ named (any index on the host back end)
    ptr, _, _, shape, (code, bits), n = _core.import_dlpack(dev._ptr(), capsule, kind,
                                                            -1 if want == "host" else index)
    dt = _np.dtype("%s%d" % (_DL_KIND.get(code, "u"), bits // 8)) if code != 6 else _np.dtype(bool)
    return Buffer(dev, ptr, n, shape, dt, keep=obj)


# ---------------------------------------------------------------------------
# Copies
# ---------------------------------------------------------------------------

def _stream_hold(stream, device):
    """The stream's live handle (None: blocking), held by the caller while a
    call uses its pointer (see _Owned._hold)."""
    if stream is None:
        return None
    if type(stream) is Stream:
        return stream._hold()
    if _is_pyopencl(stream, "CommandQueue"):
        return import_stream(stream, device)._hold()
    raise TypeError("stream must be a mapping.Stream, a pyopencl.CommandQueue or None, got %s"
                    % type(stream).__name__)


def _sp(sh):
    """The pointer of a handle from _stream_hold (None: blocking)."""
    return None if sh is None else sh.ptr


def _stream_ref(stream):
    """A buffer remembers its last stream weakly: it never keeps a stream open."""
    return weakref.ref(stream) if type(stream) is Stream else None


def _queue(sh, keep, fn, *args, always=False):
    """fn(*args), a call that queues work on the stream of handle sh (None:
    blocking, nothing to hold), and the record holding `keep` until the
    stream has passed that work, made in the same C call (_core.queued): an
    exception from a signal handler (Ctrl-C) can no longer come between the
    two and leave queued work using a host buffer nothing holds. always:
    the record also when fn raises (a failed batch flush)."""
    if sh is None:
        return fn(*args)
    return _core.queued(sh.ptr, keep, always, fn, *args)


def _host_dtype_check(call, arg, host, gpu):
    dt = getattr(host, "dtype", None)
    if dt is not None and gpu._typed and dt is not gpu.dtype and dt != gpu.dtype:
        raise TypeError("%s: %s has dtype %s, gpu has dtype %s (convert with .astype or use a view)"
                        % (call, arg, dt, gpu.dtype))


def sync_to_gpu(cpu_data, gpu, offset=0, stream=None):
    """Copies cpu_data (any C-contiguous buffer of plain data: numpy, bytes,
    bytearray, array.array, memoryview) into gpu at byte `offset`. gpu: a
    Buffer, a pyopencl.Buffer, or a DLPack / CUDA-array tensor. stream None:
    blocking; else cpu_data is held (and cannot be resized) until the stream
    has done the copy. An empty cpu_data is a no-op."""
    if type(gpu) is not Buffer:
        gpu = as_buffer(gpu, call="sync_to_gpu")
    h = gpu._h
    if h is None:
        raise _closed_error("buffer")
    if type(offset) is not int or offset < 0:
        offset = _size(offset, "sync_to_gpu: offset")
    if gpu._typed:
        _host_dtype_check("sync_to_gpu", "cpu_data", cpu_data, gpu)
    if gpu.nbytes == 0:
        if memoryview(cpu_data).nbytes:
            raise _ERR["ERR_OUT_OF_RANGE"]("sync_to_gpu: the buffer is empty", -4)
        return
    try:
        if stream is None:
            _core.write(None, h.ptr, offset, cpu_data, gpu.device._hold_gil_below)
            return
        sh = _stream_hold(stream, gpu.device)
        pin = _core.pin(cpu_data, False, "cpu_data")
        _queue(sh, (pin, h), _core.write, sh.ptr, h.ptr, offset, cpu_data)
    except Error as e:
        raise _retag(e, "sync_to_gpu(cpu_data, gpu, offset=%d)" % offset) from None
    gpu._stream = _stream_ref(stream)


def sync_to_cpu(gpu, cpu_result, offset=0, stream=None):
    """Copies gpu[offset, +len(cpu_result) bytes) into cpu_result (a writable,
    C-contiguous buffer of plain data). stream None: blocking; else
    cpu_result is held until the stream has done the copy. An empty
    cpu_result is a no-op."""
    if type(gpu) is not Buffer:
        gpu = as_buffer(gpu, call="sync_to_cpu")
    h = gpu._h
    if h is None:
        raise _closed_error("buffer")
    if type(offset) is not int or offset < 0:
        offset = _size(offset, "sync_to_cpu: offset")
    if gpu._typed:
        _host_dtype_check("sync_to_cpu", "cpu_result", cpu_result, gpu)
    if gpu.nbytes == 0:
        if memoryview(cpu_result).nbytes:
            raise _ERR["ERR_OUT_OF_RANGE"]("sync_to_cpu: the buffer is empty", -4)
        return
    try:
        if stream is None:
            _core.read(None, h.ptr, offset, cpu_result, gpu.device._hold_gil_below)
            return
        sh = _stream_hold(stream, gpu.device)
        pin = _core.pin(cpu_result, True, "cpu_result")
        _queue(sh, (pin, h), _core.read, sh.ptr, h.ptr, offset, cpu_result)
    except Error as e:
        raise _retag(e, "sync_to_cpu(gpu, cpu_result, offset=%d)" % offset) from None


def copy_gpu(src, dst, nbytes=None, src_offset=0, dst_offset=0, stream=None):
    """Device-to-device copy on one device (default: all of src)."""
    src, dst = as_buffer(src, call="copy_gpu"), as_buffer(dst, call="copy_gpu")
    src_offset = _size(src_offset, "copy_gpu: src_offset")
    dst_offset = _size(dst_offset, "copy_gpu: dst_offset")
    n = src.nbytes - src_offset if nbytes is None else _size(nbytes, "copy_gpu: nbytes")
    if n == 0:
        return
    sh = _stream_hold(stream, src.device)
    hs, hd = src._hold(), dst._hold()
    try:
        _queue(sh, (hs, hd), _core.copy_gpu, _sp(sh), hs.ptr, src_offset, hd.ptr, dst_offset, n)
    except Error as e:
        raise _retag(e, "copy_gpu(src, dst, nbytes=%d, src_offset=%d, dst_offset=%d)"
                     % (n, src_offset, dst_offset)) from None
    if sh is not None:
        src._stream = dst._stream = _stream_ref(stream)


def copy_peer(src, dst, nbytes=None, src_offset=0, dst_offset=0, stream=None):
    """Copy between buffers of two devices (stream: one of the destination's)."""
    src, dst = as_buffer(src, call="copy_peer"), as_buffer(dst, call="copy_peer")
    src_offset = _size(src_offset, "copy_peer: src_offset")
    dst_offset = _size(dst_offset, "copy_peer: dst_offset")
    n = src.nbytes - src_offset if nbytes is None else _size(nbytes, "copy_peer: nbytes")
    if n == 0:
        return
    sh = _stream_hold(stream, dst.device)
    hs, hd = src._hold(), dst._hold()
    try:
        _queue(sh, (hs, hd), _core.copy_peer, _sp(sh), hs.ptr, src_offset, hd.ptr, dst_offset, n)
    except Error as e:
        raise _retag(e, "copy_peer(src, dst, nbytes=%d, src_offset=%d, dst_offset=%d)"
                     % (n, src_offset, dst_offset)) from None
    if sh is not None:
        dst._stream = _stream_ref(stream)


def fill_gpu(gpu, value, offset=0, nbytes=None, stream=None):
    """Sets bytes of gpu to value (0..255)."""
    as_buffer(gpu, call="fill_gpu").fill(value, offset, nbytes, stream)


# ---------------------------------------------------------------------------
# Streams and events
# ---------------------------------------------------------------------------

class Stream(_Owned):
    """An in-order queue (CUDA stream, OpenCL queue, a worker thread on host).
    What queued work uses (host buffers, device buffers) is held until the
    stream has passed that work."""

    _kind = "stream"

    def __init__(self, device=None, _ptr=None, _keep=None):
        dev = _dev(device)
        self.device = dev
        ptr = _core.stream_create(dev._ptr()) if _ptr is None else _ptr
        self._h = _Handle(ptr, _core.stream_destroy, dev._h, 2, keep=(_keep,) if _keep is not None else None)
        self._errors = []  # exceptions raised by launch_host functions, raised by synchronize
        dev._adopt(self)

    def _hold(self):
        h = _Owned._hold(self)
        if h.gen != h.forks[0]:
            raise _forked_error(self._kind)
        return h

    def _ptr(self):
        return self._hold().ptr

    @property
    def native(self):
        """cl_command_queue / CUstream as an int (0 on the host back end)."""
        return _core.stream_native(self._ptr()) or 0

    @property
    def capturing(self):
        """True while the stream is being captured into a CUDA graph
        (torch.cuda.graph, cudaStreamBeginCapture): work queued on it then runs
        at each replay. Always False on back ends without graphs."""
        return bool(_core.stream_capturing(self._ptr()))

    def synchronize(self):
        """Waits for the queued work; raises its first error (or the first
        exception of a launch_host function)."""
        h = self._hold()
        _core.stream_sync(h.ptr)
        if self._errors:
            e = self._errors.pop(0)
            raise e

    def record(self):
        """An Event at the current end of the stream."""
        return Event(self)

    def wait(self, event):
        """Later work on this stream waits for event."""
        if type(event) is not Event:
            raise TypeError("Stream.wait: expected a mapping.Event, got %s" % type(event).__name__)
        h, he = self._hold(), event._hold()
        _core.stream_wait_event(h.ptr, he.ptr)

    def launch_host(self, fn):
        """Runs fn() in stream order (see mapping.launch_host)."""
        launch_host(self, fn)


def stream(device=None):
    return Stream(device)


def launch_host(stream, fn):
    """Runs the Python callable fn() once the stream's earlier work is done;
    later work waits for it (the kernel step of the seed on the host back
    end). An exception in fn is raised by the
    stream's next synchronize(). fn runs on the library's thread with the GIL;
    it must not wait for its own stream, and on CUDA (a driver host function)
    must not call mapping at all."""
    if not callable(fn):
        raise TypeError("launch_host: fn must be callable, got %s" % type(fn).__name__)
    if type(stream) is not Stream:
        raise TypeError("launch_host: stream must be a mapping.Stream (with no stream, call fn() yourself), got %s"
                        % type(stream).__name__)
    errors = stream._errors
    h = stream._hold()
    ptr = h.ptr
    _host_fn_streams.add(h)

    def run():
        outer = _core.host_fn_flag(True)  # family locks wait at most 1 s on this thread
        outer_stream = getattr(_host_fn, "stream", None)
        _host_fn.stream = ptr  # Event.synchronize refuses to wait for this stream
        try:
            fn()
        except BaseException as e:  # noqa: B902 - raised by synchronize
            errors.append(e)
        finally:
            _host_fn.stream = outer_stream
            _core.host_fn_flag(outer)
    _core.launch_host(h.ptr, run)
    if _exiting[0] and h.destroy is not None and not _core.in_host_fn():
        # queued by an exit handler after the package's own (one registered
        # before `import mapping`): run it now, while the interpreter can,
        # as at finalization the stream's thread no longer calls Python
        # (fn would never run). Its exception is kept for synchronize().
        try:
            _core.stream_sync(ptr)
        except Error:
            pass  # the stream's own error: synchronize() raises it


_host_fn = _threading.local()  # .stream: the stream whose launch_host function this thread is running
_host_fn_streams = weakref.WeakSet()  # handles of the streams launch_host was given
_exiting = [False]  # the package's atexit handler has run: launch_host waits for its function
# Closes _core's exit gate when the interpreter clears this module at
# finalization: from then on no stream thread calls Python (_core.c, py_gate).
_exit_gate = _core.exit_gate()


def _finish_host_functions_at_exit():
    """atexit: waits for the streams that have launch_host functions still
    queued, so they run while the interpreter can still run them (after this,
    at its finalization, a stream's thread can no longer take the GIL: a
    destroy waiting for such a stream hung the exit). A few rounds, as a
    function may queue another; what is still queued after them is left to the
    process's end (see _Handle.release). Exit handlers that run after this
    one (registered before `import mapping`) get launch_host functions run
    at once (launch_host waits for them)."""
    _exiting[0] = True
    for _ in range(4):
        if not _core.host_fns_pending():
            return
        for h in list(_host_fn_streams):
            if h.ptr is not None and h.gen == h.forks[0]:
                try:
                    _core.stream_sync(h.ptr)
                except Exception:  # its errors are no longer anyone's to raise
                    pass


_atexit.register(_finish_host_functions_at_exit)


# A device keeps the Stream of each pyopencl.CommandQueue it was given (the
# next call on that queue finds it again, without a new import, and without
# the wait for the queue that destroying the import makes). Past this many, the
# ones whose pyopencl queue nothing else holds are let go: a program that
# made a queue per task kept every one, and its OpenCL queue, for good.
_IMPORTED_QUEUES_KEPT = 16


def _forget_abandoned_queues(cache):
    """Drops the cache's Streams whose pyopencl queue no one but that Stream
    holds (a Stream a caller still holds stays valid: only the cache lets go).
    The reference count that means "no one else" is measured the same way on
    a probe, so it holds on any Python version."""
    probe = (object(),)  # as a Stream's handle holds its queue: in its keep tuple
    p = probe[0]
    alone = _sys.getrefcount(p)
    del p
    for key, s in list(cache.items()):
        h = s._h
        q = h.keep[0] if h is not None and h.keep else None
        if q is None or _sys.getrefcount(q) <= alone:
            del cache[key]
        del q


def import_stream(queue, device=None):
    """A stream on a native queue made elsewhere: a pyopencl.CommandQueue
    (on `device`, else the device opened on its context) or a CUstream int."""
    if _is_pyopencl(queue, "CommandQueue"):
        dev = _device_for_opencl_context(queue.context, None if device is None else _dev(device))
        key = int(queue.int_ptr)
        s = dev._imported_queues.get(key)
        if s is None or s.closed:
            s = Stream(dev, _core.import_stream(dev._ptr(), key), _keep=queue)
            if len(dev._imported_queues) >= _IMPORTED_QUEUES_KEPT:
                _forget_abandoned_queues(dev._imported_queues)
            dev._imported_queues[key] = s
        return s
    dev = _dev(device)
    return Stream(dev, _core.import_stream(dev._ptr(), _index(queue, "import_stream: queue")), _keep=queue)


class Event(_Owned):
    _kind = "event"

    def __init__(self, stream):
        self.device = stream.device
        sh = stream._hold()
        self._h = _Handle(_core.event_record(sh.ptr), _core.event_destroy, stream.device._h, 3)
        self._stream_ptr = sh.ptr
        self.device._adopt(self)

    def synchronize(self):
        h = self._hold()
        if getattr(_host_fn, "stream", None) == self._stream_ptr and not _core.event_query(h.ptr):
            # a launch_host function waiting for later work of its own stream waited for itself for good
            raise _ERR["ERR_BUSY"]("Event.synchronize: called from a launch_host function running on the event's "
                                   "own stream, before the event: it would wait for itself", -18)
        _core.event_sync(h.ptr)

    def query(self):
        """True once the stream has passed the event."""
        return _core.event_query(self._ptr())

    def elapsed(self, end):
        """Seconds from this event to `end` (both completed)."""
        if type(end) is not Event:
            raise TypeError("Event.elapsed: expected a mapping.Event, got %s" % type(end).__name__)
        return _core.event_elapsed(self._ptr(), end._ptr())


# ---------------------------------------------------------------------------
# Mirrors
# ---------------------------------------------------------------------------

_ACCESS = {"r": 1, "w": 2, "rw": 3, "wr": 3}
_SIDES = {"cpu": 1, "gpu": 2, CPU: 1, GPU: 2, 1: 1, 2: 2}
_RESIDENCY = {"default": 0, "keep": 1, "evict_first": 2}


class _Access:
    def __init__(self, enter, leave=None, call="Mirror"):
        self._enter, self._leave, self._call = enter, leave, call

    def __enter__(self):
        try:
            return self._enter()
        except Error as e:
            raise _retag(e, self._call) from None

    def __exit__(self, *exc):
        if self._leave is not None:
            try:
                self._leave()
            except Error as e:
                raise _retag(e, self._call) from None
        return False


class Mirror(_Owned):
    """A host array and its device twin whose validity is tracked per byte:
    .array is a numpy view of the host side, .buffer the device Buffer (this
    mirror's bytes start at .gpu_offset). A sync moves only stale bytes.
    Indexing and marks follow numpy on the array's own shape (m[1:3] is rows
    1-2 of a 2-D mirror); byte_range=(offset, nbytes) names bytes.
    Access intents: ``with m.cpu("rw") as a:`` and ``with m.gpu("rw", stream) as buf:``."""

    _kind = "mirror"

    def __init__(self, device, ptr, shape, dtype, keep=None, family=None):
        self.device = device
        # one lock per family: a new root makes it, its views share it
        self._lock = _Family("mirror") if family is None else family
        self._h = _Handle(ptr, _core.mirror_destroy, device._h, 0, keep=keep, family=self._lock)
        self.dtype = _np.dtype(dtype)
        self.shape = tuple(shape)
        addr, size, gpu, off, unified = _core.mirror_parts(ptr)
        self.nbytes = size
        self.gpu_offset = off
        self.is_unified = unified
        self._addr = addr
        # the device side: a Buffer whose handle keeps the mirror's
        self._gpu = Buffer(device, None, off + size, owned=False, handle=_Handle(gpu, None, self._h))
        self._cpu = None
        device._adopt(self)

    def __repr__(self):
        return "<mapping.Mirror %s %s%s%s>" % (self.shape, self.dtype, " unified" if self.is_unified else "",
                                               " closed" if self.closed else "")

    @property
    def array(self):
        """The host side as a numpy array (no sync: see cpu() and sync_to_cpu)."""
        h = self._hold()
        if self._cpu is None:
            addr, size = _core.mirror_parts(h.ptr)[:2]  # the C sizes: nbytes is a plain attribute
            mem = _core.HostMemory(addr, size, h)
            self._cpu = _np.frombuffer(mem, dtype=self.dtype).reshape(self.shape)
        return self._cpu

    def __array__(self, dtype=None, copy=None):
        """numpy's protocol (numpy 2: copy=True a new array, copy=False never
        a copy; None: the host side itself where no conversion is needed)."""
        a = self.array
        if dtype is not None and _np.dtype(dtype) != a.dtype:
            if copy is False:
                raise ValueError("Mirror.__array__: a conversion from %s to %s needs a copy, and copy=False"
                                 % (a.dtype, _np.dtype(dtype)))
            return a.astype(dtype)
        return a.copy() if copy else a

    @property
    def buffer(self):
        """The family's device Buffer; this mirror's bytes start at gpu_offset.
        Under a memory budget the device side may be evicted (is_resident
        False): then this raises; m.gpu() makes it again."""
        h = self._hold()
        gpu = _core.mirror_parts(h.ptr)[2]
        if not gpu:
            raise _ERR["ERR_INVALID_ARGUMENT"]("the mirror's device side is not resident (evicted under the device's "
                                               "memory budget): acquire it with m.gpu()", -2)
        self._refresh_gpu(gpu)
        return self._gpu

    def _refresh_gpu(self, gpu):
        # an eviction freed the family's buffer and a later call made another
        if self._gpu._h is None or self._gpu._h.ptr != gpu:
            self._gpu._h = _Handle(gpu, None, self._h)

    @property
    def is_resident(self):
        """True while the family's device side is allocated (not evicted
        under the device's memory budget)."""
        h = self._hold()
        return _core.mirror_resident(h.ptr)

    def evict(self):
        """Evicts the family's device side now: waits for its queued work,
        writes back exactly the bytes stale on the CPU, frees the device
        memory. The next sync to the GPU or m.gpu() makes it again."""
        with self._lock:
            h = self._hold()
            _core.mirror_evict(h.ptr)

    def set_residency(self, hint):
        """A residency hint for the family under the memory budget:
        "default" (least recently used first), "keep" (never evicted by the
        budget) or "evict_first". Advisory: never changes results."""
        if not isinstance(hint, str) or hint not in _RESIDENCY:
            raise _ERR["ERR_INVALID_ARGUMENT"]("hint must be 'default', 'keep' or 'evict_first'", -2)
        with self._lock:
            h = self._hold()
            _core.mirror_set_residency(h.ptr, _RESIDENCY[hint])

    def _range(self, key, byte_range, call):
        """(byte offset, nbytes, the selection's shape) of key, numpy-indexed
        in the mirror's shape, or of byte_range=(offset, nbytes)."""
        if byte_range is not None:
            if key is not None:
                raise TypeError("%s: pass an index or byte_range=(offset, nbytes), not both" % call)
            try:
                off, n = byte_range
            except (TypeError, ValueError):
                raise TypeError("%s: byte_range must be (offset, nbytes)" % call) from None
            off, n = _size(off, call + ": byte_range offset"), _size(n, call + ": byte_range nbytes")
            if off + n > self.nbytes:
                raise _ERR["ERR_OUT_OF_RANGE"]("%s: byte_range (%d, %d) is past the mirror's %d bytes"
                                               % (call, off, n, self.nbytes), -4)
            return off, n, None
        if key is None:
            return 0, self.nbytes, self.shape
        parts = key if type(key) is tuple else (key,)
        for k in parts:
            if k is Ellipsis or k is None or type(k) is slice:
                continue
            if isinstance(k, bool) or not hasattr(k, "__index__"):
                raise TypeError("%s: index %r: a mirror takes ints, slices and Ellipsis (numpy basic indexing)"
                                % (call, k))
        if not any(k is Ellipsis for k in parts):
            parts = parts + (Ellipsis,)  # a 0-d view, never a scalar copy
        base = self.array
        try:
            sub = base[parts]
        except IndexError as e:
            raise _ERR["ERR_OUT_OF_RANGE"]("%s: %s" % (call, e), -4) from None
        except (TypeError, ValueError) as e:
            raise TypeError("%s: %s" % (call, e)) from None
        if sub.size and not sub.flags.c_contiguous:
            raise _ERR["ERR_INVALID_ARGUMENT"]("%s: %r is not one contiguous range of the mirror (a step or columns)"
                                               % (call, key), -2)
        off = sub.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        return (off, sub.nbytes, sub.shape) if sub.size else (0, 0, sub.shape)

    @staticmethod
    def _byte_form(key, nbytes, byte_range, call):
        """0.1.0's byte form mark(offset, nbytes): deprecated, still works (as byte_range)."""
        _warnings.warn("%s(offset, nbytes) is deprecated: use %s(byte_range=(offset, nbytes))" % (call, call),
                       DeprecationWarning, stacklevel=3)
        if byte_range is not None:
            raise TypeError("%s: pass byte_range=(offset, nbytes) or the deprecated (offset, nbytes), not both"
                            % call)
        if key is None or isinstance(key, bool) or not hasattr(key, "__index__"):
            raise TypeError("%s: the deprecated (offset, nbytes) form takes an int byte offset, got %s"
                            % (call, type(key).__name__))
        return None, (key, nbytes)

    def mark_cpu_modified(self, key=None, nbytes=None, *, byte_range=None):
        """"I wrote these on the CPU": an index or slice of the array (numpy
        semantics in its shape), byte_range=(offset, nbytes), or nothing for
        all of it. mark_cpu_modified(offset, nbytes), the byte form of 0.1.0,
        still works but is deprecated (DeprecationWarning): use byte_range=."""
        if nbytes is not None:
            key, byte_range = self._byte_form(key, nbytes, byte_range, "Mirror.mark_cpu_modified")
        off, n, _ = self._range(key, byte_range, "Mirror.mark_cpu_modified")
        if n:
            try:
                with self._lock:
                    h = self._hold()
                    _core.mirror_mark(h.ptr, 1, off, n)
            except Error as e:
                raise _retag(e, "Mirror.mark_cpu_modified") from None

    def mark_gpu_modified(self, key=None, nbytes=None, *, byte_range=None):
        """"The device wrote these": as mark_cpu_modified."""
        if nbytes is not None:
            key, byte_range = self._byte_form(key, nbytes, byte_range, "Mirror.mark_gpu_modified")
        off, n, _ = self._range(key, byte_range, "Mirror.mark_gpu_modified")
        if n:
            try:
                with self._lock:
                    h = self._hold()
                    _core.mirror_mark(h.ptr, 2, off, n)
            except Error as e:
                raise _retag(e, "Mirror.mark_gpu_modified") from None

    def _sync(self, stream, side):
        sh = _stream_hold(stream, self.device)
        with self._lock:
            h = self._hold()
            if sh is None:
                _core.mirror_sync(None, h.ptr, side)
            elif _core.stream_capturing(sh.ptr):
                # Recorded in the graph, which holds the mirror's family itself: no
                # record on the stream (a host node would run at every replay).
                _core.mirror_sync(sh.ptr, h.ptr, side)
            else:
                _core.queued(sh.ptr, (h,), False, _core.mirror_sync, sh.ptr, h.ptr, side)
        if sh is not None:
            self._gpu._stream = _stream_ref(stream)

    def sync_in_graph(self, stream, to="gpu", max_ranges=0):
        """Records in the CUDA graph being captured on `stream` a sync of this
        mirror or view to `to` ('gpu' or 'cpu'): each replay of the graph moves
        the bytes stale then, and the state follows the replay
        (mapping_mirror_sync_in_graph; sync_to_gpu(stream) on a capturing
        stream does the same with the default table). max_ranges: ranges per
        replay (0: 4096); more are joined, or stay stale for the next sync. The
        graph keeps the mirror's memory alive. The mirror must not be used
        while a replay runs."""
        if not isinstance(to, (str, int)) or isinstance(to, bool) or to not in _SIDES:
            raise _ERR["ERR_INVALID_ARGUMENT"]("Mirror.sync_in_graph: to must be 'cpu' or 'gpu'", -2)
        try:
            if type(stream) is not Stream:
                raise TypeError("Mirror.sync_in_graph: stream must be a mapping.Stream being captured, got %s"
                                % type(stream).__name__)
            max_ranges = _size(max_ranges, "Mirror.sync_in_graph: max_ranges")
            sh = stream._hold()
            with self._lock:
                h = self._hold()
                _core.mirror_sync_in_graph(sh.ptr, h.ptr, _SIDES[to], max_ranges)
        except Error as e:
            raise _retag(e, "Mirror.sync_in_graph") from None

    def sync_to_gpu(self, stream=None):
        try:
            self._sync(stream, 2)
        except Error as e:
            raise _retag(e, "Mirror.sync_to_gpu") from None

    def sync_to_cpu(self, stream=None):
        try:
            self._sync(stream, 1)
        except Error as e:
            raise _retag(e, "Mirror.sync_to_cpu") from None

    def stale_bytes(self, side="gpu"):
        """Stale bytes of side in this mirror or view; waits for queued
        copies touching it (needs_sync does not)."""
        if not isinstance(side, (str, int)) or isinstance(side, bool) or side not in _SIDES:
            raise _ERR["ERR_INVALID_ARGUMENT"]("Mirror.stale_bytes: side must be 'cpu' or 'gpu'", -2)
        try:
            with self._lock:
                h = self._hold()
                return _core.mirror_stale(h.ptr, _SIDES[side])
        except Error as e:
            raise _retag(e, "Mirror.stale_bytes") from None

    def needs_sync(self, side="gpu"):
        """True if a sync of this mirror or view to side would copy
        something now (Kokkos need_sync_device); never waits: a copy queued
        and not yet complete counts as done (mapping_mirror_needs_sync)."""
        if not isinstance(side, (str, int)) or isinstance(side, bool) or side not in _SIDES:
            raise _ERR["ERR_INVALID_ARGUMENT"]("Mirror.needs_sync: side must be 'cpu' or 'gpu'", -2)
        try:
            with self._lock:
                h = self._hold()
                return _core.mirror_needs_sync(h.ptr, _SIDES[side])
        except Error as e:
            raise _retag(e, "Mirror.needs_sync") from None

    def __getitem__(self, key):
        """A view over a selection in the array's shape (numpy basic
        indexing, one contiguous range), sharing the state."""
        off, n, shape = self._range(key, None, "Mirror[...]")
        if n == 0:
            raise _ERR["ERR_ZERO_SIZE"]("Mirror[...]: an empty mirror view", -3)
        try:
            with self._lock:
                h = self._hold()
                ptr = _core.mirror_view(h.ptr, off, n)
                return Mirror(self.device, ptr, shape, self.dtype, keep=(h,), family=self._lock)
        except Error as e:
            raise _retag(e, "Mirror[...]") from None

    def cpu(self, access="rw"):
        """with m.cpu("rw") as a: ... syncs before a read ("r"), marks after a
        write ("w"; "w" alone discards: nothing is copied), at the block's end
        too, so writes after a sync made inside the block are sent. a is the
        numpy view."""
        if not isinstance(access, str) or access not in _ACCESS:
            raise _ERR["ERR_INVALID_ARGUMENT"]("Mirror.cpu: access must be 'r', 'w' or 'rw'", -2)

        def enter():
            with self._lock:
                h = self._hold()
                _core.mirror_acquire_cpu(h.ptr, _ACCESS[access])
            arr = self.array
            if access == "r":
                arr = arr.view()
                arr.flags.writeable = False
            return arr

        def leave():
            # Marks after, as documented: the C acquire marks at the start, and a
            # sync to the GPU inside the block (a helper called there, or another
            # thread: the block holds no lock) took that mark, so the writes that
            # came after it were never sent (silently stale on the device).
            with self._lock:
                h = self._h
                if h is None or h.ptr is None:  # closed inside the block: nothing to mark
                    return
                _core.mirror_mark(h.ptr, 1, 0, _core.mirror_parts(h.ptr)[1])
        return _Access(enter, leave if _ACCESS[access] & 2 else None, "Mirror.cpu")

    def gpu(self, access="rw", stream=None):
        """with m.gpu("rw", stream) as buf: launch your work on buf at
        m.gpu_offset (on `stream`, or the device's own queue when None); on
        exit it is marked (for "w" / "rw") and released, so later calls order
        themselves after it."""
        if not isinstance(access, str) or access not in _ACCESS:
            raise _ERR["ERR_INVALID_ARGUMENT"]("Mirror.gpu: access must be 'r', 'w' or 'rw'", -2)
        sh = _stream_hold(stream, self.device)

        def enter():
            with self._lock:
                h = self._hold()
                self._refresh_gpu(_core.mirror_acquire_gpu(_sp(sh), h.ptr, _ACCESS[access]))
            if sh is not None:
                self._gpu._stream = _stream_ref(stream)
            return self._gpu

        def leave():
            with self._lock:
                h = self._hold()
                if _ACCESS[access] & 2:
                    # marks after, as cpu() does: a sync to the CPU inside the block
                    # (before the work was queued) took the mark made at the start
                    _core.mirror_mark(h.ptr, 2, 0, _core.mirror_parts(h.ptr)[1])
                _queue(sh, (h,), _core.mirror_release_gpu, _sp(sh), h.ptr)
        return _Access(enter, leave, "Mirror.gpu")

    def close(self):
        """Closes it; a call on its family in another thread finishes first
        (the C object is then freed once nothing uses it)."""
        with self._lock:
            self._h = None
            self._cpu = None
            if getattr(self, "_gpu", None) is not None:
                self._gpu._h = None


def _track_flag(track_writes, call):
    if not isinstance(track_writes, bool):
        raise TypeError("%s: track_writes must be True or False, got %s" % (call, type(track_writes).__name__))
    return _core.MIRROR_TRACK_WRITES if track_writes else 0


def _diff_flag(device_diff, call):
    if not isinstance(device_diff, bool):
        raise TypeError("%s: device_diff must be True or False, got %s" % (call, type(device_diff).__name__))
    return _core.MIRROR_DEVICE_DIFF if device_diff else 0


def write_tracking():
    """How track_writes=True mirrors see CPU writes in this process:
    {"mechanism": "uffd" | "mprotect" | "none", "granularity": bytes one
    written byte makes a sync move at most (a page), "description": why}.
    $MAPPING_TRACK (auto, uffd, mprotect, none) chooses; docs/mirrors.md."""
    mech, gran, why = _core.write_tracking()
    return {"mechanism": mech, "granularity": gran, "description": why}


def mirror(shape, dtype=None, unified=False, device=None, track_writes=False, device_diff=False):
    """A new mirror: zero-filled page-locked host memory and a device buffer.
    mirror(nbytes) or mirror(shape, dtype); unified=True uses one unified
    allocation where the device has it. track_writes=True: a sync to the GPU
    also sends every page of .array written since the last sync, with no
    mark (mapping.write_tracking() says how; UnsupportedError without a
    mechanism). device_diff=True: a sync to the CPU after the device wrote
    reads back only the 4 KiB blocks whose content changed, found by a
    comparison on the device (MAPPING_MIRROR_DEVICE_DIFF: a device-side
    shadow copy; used where it beats the link, $MAPPING_DEVICE_DIFF=on/off
    forces it; docs/mirrors.md)."""
    shape, dtype, _ = _shape_dtype(shape, dtype, "mirror")
    dev = _dev(device)
    n = _nbytes_of(shape, dtype)
    if n == 0:
        raise _ERR["ERR_ZERO_SIZE"]("a mirror of 0 bytes", -3)
    flags = ((_core.MIRROR_UNIFIED if unified else 0) | _track_flag(track_writes, "mirror") |
             _diff_flag(device_diff, "mirror"))
    dh = dev._hold()
    try:
        ptr = _core.mirror_create(dh.ptr, n, flags)
    except Error as e:
        raise _retag(e, "mirror") from None
    return Mirror(dev, ptr, shape, dtype)


def _host_array(array, call):
    arr = _np.asarray(array)
    if arr.dtype.hasobject:
        raise TypeError("%s: dtype %s holds Python objects; only plain data can be mirrored" % (call, arr.dtype))
    return arr


def mirror_wrap(array, pin=False, device=None, track_writes=False, device_diff=False):
    """A mirror over your array (C-contiguous, writable; not copied). The
    mirror holds the array's buffer export: a bytearray or array.array cannot
    be resized while the mirror lives. track_writes=True: writes to the
    array's pages are found without marks; device_diff=True: syncs to the
    CPU read only what the device changed (see mirror())."""
    flags = _track_flag(track_writes, "mirror_wrap") | _diff_flag(device_diff, "mirror_wrap")
    dev = _dev(device)
    arr = _host_array(array, "mirror_wrap")
    p = _core.pin(array, True, "array")
    if p.nbytes == 0:
        raise _ERR["ERR_ZERO_SIZE"]("a mirror of 0 bytes", -3)
    dh = dev._hold()
    try:
        ptr = _core.mirror_wrap(dh.ptr, p, (_core.MIRROR_PIN if pin else 0) | flags)
    except Error as e:
        raise _retag(e, "mirror_wrap") from None
    return Mirror(dev, ptr, arr.shape, arr.dtype, keep=(p,))


def mirror_adopt(array, gpu, gpu_offset=0, gpu_valid=False, device=None, track_writes=False, device_diff=False):
    """A mirror over both sides supplied by you: an array and device memory
    (a Buffer, pyopencl.Buffer, or DLPack tensor, on `device` if given) at
    gpu_offset bytes. gpu_valid=True: the device side holds the data (the CPU
    side starts stale). Both are held while the mirror lives."""
    buf = as_buffer(gpu, None if device is None else _dev(device), call="mirror_adopt")
    arr = _host_array(array, "mirror_adopt")
    gpu_offset = _size(gpu_offset, "mirror_adopt: gpu_offset")
    p = _core.pin(array, True, "array")
    if p.nbytes == 0:
        raise _ERR["ERR_ZERO_SIZE"]("a mirror of 0 bytes", -3)
    flags = ((_core.MIRROR_GPU_VALID if gpu_valid else 0) | _track_flag(track_writes, "mirror_adopt") |
             _diff_flag(device_diff, "mirror_adopt"))
    dh, bh = buf.device._hold(), buf._hold()
    try:
        ptr = _core.mirror_adopt(dh.ptr, p, bh.ptr, gpu_offset, flags)
    except Error as e:
        raise _retag(e, "mirror_adopt") from None
    return Mirror(buf.device, ptr, arr.shape, arr.dtype, keep=(p, bh))


def mirror_sharded(array, devices, granule=None, pin=False):
    """The data-parallel layout: your array cut into len(devices) consecutive
    slices along its first axis (never splitting a row: granule defaults to
    one row's bytes), slice i a Mirror on devices[i] (as mirror_wrap: not
    copied; the array is held, and cannot be resized, while any shard lives)."""
    devs = [_dev(d) for d in devices]
    if not devs:
        raise ValueError("mirror_sharded: at least one device")
    arr = _host_array(array, "mirror_sharded")
    if arr.ndim == 0:
        raise ValueError("mirror_sharded: a 0-d array cannot be sharded")
    row = arr.nbytes // arr.shape[0] if arr.shape[0] else 0
    granule = row if granule is None else _size(granule, "mirror_sharded: granule")
    p = _core.pin(array, True, "array")
    if p.nbytes == 0:
        raise _ERR["ERR_ZERO_SIZE"]("a mirror of 0 bytes", -3)
    dhs = [d._hold() for d in devs]
    ptrs = _core.mirror_sharded([h.ptr for h in dhs], p, granule, _core.MIRROR_PIN if pin else 0)
    shards = []
    for i, (d, ptr) in enumerate(zip(devs, ptrs)):
        try:
            size = _core.mirror_parts(ptr)[1]
            rows = size // row if row and size % row == 0 and granule % row == 0 else None
            shape = (rows,) + arr.shape[1:] if rows is not None else (size // arr.dtype.itemsize,)
            shards.append(Mirror(d, ptr, shape, arr.dtype, keep=(p,)))
        except BaseException:
            for q in ptrs[len(shards):]:  # the ones no Mirror owns yet
                _core.mirror_destroy(q)
            raise
    return shards


class MultiMirror(_Owned):
    """One host array and a replica on each of several devices, validity
    tracked per byte for every side (mapping_multimirror). Sides: "cpu" and
    device indices 0 .. len(devices)-1 in the order given. A sync to a device
    copies each stale part from the cheapest valid side (the host or a peer).
    Calls on one multimirror are serialized (the C object is not locked);
    close() waits for a call another thread is making."""

    _kind = "multimirror"

    def __init__(self, devices, shape, dtype=None):
        devs = [_dev(d) for d in devices]
        if not devs:
            raise ValueError("multimirror: at least one device")
        shape, dtype, _ = _shape_dtype(shape, dtype, "multimirror")
        n = _nbytes_of(shape, dtype)
        if n == 0:
            raise _ERR["ERR_ZERO_SIZE"]("a multimirror of 0 bytes", -3)
        self._lock = _Family("multimirror")
        dhs = [d._hold() for d in devs]
        ptr = _core.multimirror_create([h.ptr for h in dhs], n)
        # destroyed before any of its devices: it keeps every device's handle
        self._h = _Handle(ptr, _core.multimirror_destroy, devs[0]._h, 0, keep=tuple(d._h for d in devs[1:]))
        self.devices = devs
        self.shape, self.dtype, self.nbytes = shape, dtype, n
        addr, _, gpus = _core.multimirror_parts(ptr, len(devs))
        self._addr = addr
        self.replicas = [Buffer(d, None, n, shape, dtype, owned=False, handle=_Handle(g, None, self._h))
                         for d, g in zip(devs, gpus)]
        self._cpu = None
        devs[0]._adopt(self)

    def _side(self, side, call):
        if side in ("cpu", CPU):
            return -1
        if isinstance(side, str) or isinstance(side, bool) or not hasattr(side, "__index__"):
            raise TypeError("%s: side must be 'cpu' or a device index" % call)
        i = _operator.index(side)
        if not 0 <= i < len(self.devices):
            raise _ERR["ERR_OUT_OF_RANGE"]("%s: device %d of %d" % (call, i, len(self.devices)), -4)
        return i

    @property
    def array(self):
        """The host array as numpy (no sync)."""
        h = self._hold()
        if self._cpu is None:
            addr, size, _ = _core.multimirror_parts(h.ptr, 0)  # the C sizes: nbytes is a plain attribute
            mem = _core.HostMemory(addr, size, h)
            self._cpu = _np.frombuffer(mem, dtype=self.dtype).reshape(self.shape)
        return self._cpu

    def mark_modified(self, side, byte_range=None):
        """side ("cpu" or a device index) wrote byte_range=(offset, nbytes) (default: all)."""
        i = self._side(side, "MultiMirror.mark_modified")
        off, n = (0, self.nbytes) if byte_range is None else byte_range
        off, n = _size(off, "MultiMirror.mark_modified: offset"), _size(n, "MultiMirror.mark_modified: nbytes")
        try:
            with self._lock:
                h = self._hold()
                _core.multimirror_mark(h.ptr, i, off, n)
        except Error as e:
            raise _retag(e, "MultiMirror.mark_modified") from None

    def sync(self, side, stream=None):
        """Makes `side` valid: sync("cpu") (blocking) or sync(j, stream) (a stream of device j)."""
        i = self._side(side, "MultiMirror.sync")
        try:
            sh = None if i < 0 else _stream_hold(stream, self.devices[i])
            with self._lock:
                h = self._hold()
                _queue(sh, (h,), _core.multimirror_sync, _sp(sh), h.ptr, i)
                if i >= 0:
                    self._refresh_replica(h, i)
        except Error as e:
            raise _retag(e, "MultiMirror.sync") from None

    def stale_bytes(self, side):
        i = self._side(side, "MultiMirror.stale_bytes")
        try:
            with self._lock:
                h = self._hold()
                return _core.multimirror_stale(h.ptr, i)
        except Error as e:
            raise _retag(e, "MultiMirror.stale_bytes") from None

    def evict(self, device):
        """Evicts replica `device` now (after the syncs queued on the
        multimirror): what only it holds goes back to the host array; the
        next sync(device) makes it again (a replica on a device with a
        memory budget is also evicted when its device needs room)."""
        i = self._side(device, "evict")
        if i < 0:
            raise _ERR["ERR_INVALID_ARGUMENT"]("evict: the host array is never evicted; give a device index", -2)
        with self._lock:
            h = self._hold()
            _core.multimirror_evict(h.ptr, i)
            self._refresh_replica(h, i)

    def is_resident(self, device):
        """True while replica `device` is allocated (not evicted)."""
        i = self._side(device, "is_resident")
        if i < 0:
            raise _ERR["ERR_INVALID_ARGUMENT"]("is_resident: give a device index", -2)
        with self._lock:
            h = self._hold()
            return _core.multimirror_resident(h.ptr, i)

    def _refresh_replica(self, h, i):
        # an eviction freed replica i's buffer and a later sync made another (None meanwhile)
        g = _core.multimirror_parts(h.ptr, len(self.devices))[2][i]
        r = self.replicas[i]
        if not g:
            r._h = None
        elif r._h is None or r._h.ptr != g:
            r._h = _Handle(g, None, self._h)

    def close(self):
        """Closes it; a call another thread is making finishes first."""
        with self._lock:
            self._h = None
            self._cpu = None
            for r in getattr(self, "replicas", ()):
                r._h = None


def multimirror(devices, shape, dtype=None):
    """A MultiMirror over `devices` (1 to 16): multimirror(devices, nbytes) or (devices, shape, dtype)."""
    return MultiMirror(devices, shape, dtype)


# ---------------------------------------------------------------------------
# Batches and pipelines
# ---------------------------------------------------------------------------

class Batch(_Owned):
    """Many copies moved with few transfers. Each added copy holds its host
    buffer (which cannot be resized meanwhile) and device buffer until a
    flush has done it (a failed flush leaves copies queued: they stay held
    until a later flush succeeds, clear() or close()). Calls on one batch
    from several threads are serialized."""

    _kind = "batch"

    def __init__(self, device=None):
        dev = _dev(device)
        self.device = dev
        self._lock = _Family("batch")
        self._h = _Handle(_core.batch_create(dev._ptr()), _core.batch_destroy, dev._h, 1)
        self._keep = []
        dev._adopt(self)

    def _add(self, to_gpu, host, gpu, offset, call):
        gpu = as_buffer(gpu, call=call)
        gpu._check()
        offset = _size(offset, call + ": offset")
        if gpu._typed:
            _host_dtype_check(call, "cpu_data" if to_gpu else "cpu_result", host, gpu)
        p = _core.pin(host, not to_gpu, "cpu_data" if to_gpu else "cpu_result")
        if p.nbytes:
            with self._lock:
                h, gh = self._hold(), gpu._hold()
                # the record first: an exception from a signal handler (Ctrl-C) just
                # after the add must not leave the C batch with a host buffer nothing holds
                keep = self._keep
                keep.append((p, gh, gpu))
                try:
                    _core.batch_add(h.ptr, to_gpu, gh.ptr, offset, p)
                except Error as e:
                    keep.pop()
                    raise _retag(e, "%s(offset=%d)" % (call, offset)) from None

    def add_to_gpu(self, cpu_data, gpu, offset=0):
        """Records a copy of cpu_data to gpu at offset for the next flush
        (mapping_batch_add_to_gpu): nothing moves until flush()."""
        self._add(True, cpu_data, gpu, offset, "Batch.add_to_gpu")

    def add_to_cpu(self, gpu, cpu_result, offset=0):
        """Records a copy of gpu at offset into cpu_result for the next
        flush (mapping_batch_add_to_cpu)."""
        self._add(False, cpu_result, gpu, offset, "Batch.add_to_cpu")

    def sync_to_gpu(self, cpu_data, gpu, offset=0):
        """Deprecated name of add_to_gpu (it records, it does not sync)."""
        _warnings.warn("Batch.sync_to_gpu is deprecated: use Batch.add_to_gpu", DeprecationWarning, stacklevel=2)
        self._add(True, cpu_data, gpu, offset, "Batch.sync_to_gpu")

    def sync_to_cpu(self, gpu, cpu_result, offset=0):
        """Deprecated name of add_to_cpu."""
        _warnings.warn("Batch.sync_to_cpu is deprecated: use Batch.add_to_cpu", DeprecationWarning, stacklevel=2)
        self._add(False, cpu_result, gpu, offset, "Batch.sync_to_cpu")

    def __len__(self):
        with self._lock:
            h = self._hold()
            return _core.batch_count(h.ptr)

    def clear(self):
        with self._lock:
            h = self._hold()
            _core.batch_clear(h.ptr)
            self._keep = []

    def flush(self, stream=None):
        try:
            self._flush(stream)
        except Error as e:
            raise _retag(e, "Batch.flush") from None

    def _flush(self, stream):
        sh = _stream_hold(stream, self.device)
        with self._lock:
            h = self._hold()
            keep = self._keep
            # what a flush on a stream queued is held until the stream passes it
            # (also when it failed: some copies may be queued)
            _queue(sh if keep else None, tuple((p, g) for p, g, _ in keep), _core.batch_flush, _sp(sh), h.ptr,
                   always=True)
            # done: the batch is empty. A failed flush leaves the copies not
            # done queued in the C batch: their records stay (all of them: which
            # were done is not said), for a retry, clear() or close().
            self._keep = []
        if sh is not None:
            for _, _, b in keep:  # the CUDA array interface's "stream" of each buffer it used
                b._stream = _stream_ref(stream)

    def close(self):
        with self._lock:
            self._h = None
            self._keep = []

    def __exit__(self, exc_type, *rest):
        try:
            if exc_type is None and self._h is not None and len(self):
                self.flush()
        finally:
            self.close()
        return False


def batch(device=None):
    return Batch(device)


class Chunk(collections.namedtuple("Chunk", "index offset nbytes input input_offset output output_offset")):
    """One chunk of Pipeline.run, given to the step: `index`, `offset` and
    `nbytes` in the host arrays; `input` / `output`, the pipeline's device
    chunk buffers (untyped, chunk_bytes long), with the chunk at
    `input_offset` / `output_offset`. Besides the tuple's fields:

    - `src`: this chunk's input as a Buffer with the source's dtype and shape:
      (rows, *src.shape[1:]) where the chunk holds whole rows of it, else
      flat (the dtype's elements, or bytes); `dst` the same for the output
      (in dst's dtype and shape; the source's when dst is None).
    - `rows`: slice(first, stop) of the source's rows in this chunk, or None
      where the chunk does not hold whole rows.

    A pipeline made with element_bytes=a[0].nbytes (or a multiple) always
    cuts whole rows of a."""

    src = dst = rows = None


def _pipeline_layout(obj):
    """(dtype, shape after the first axis) of a host array given to
    Pipeline.run, or None (a plain buffer: bytes)."""
    try:
        a = obj if isinstance(obj, _np.ndarray) else _np.asarray(memoryview(obj))
    except (TypeError, ValueError):
        return None
    if a.dtype.hasobject or a.dtype.itemsize == 0:
        return None
    return a.dtype, (tuple(a.shape[1:]) if a.ndim else None)


def _chunk_view(buf, at, offset, nbytes, layout):
    """(a typed Buffer over nbytes of buf from `at`, the rows it holds)."""
    if at != 0 or nbytes == 0:  # (the library puts every chunk at 0)
        return None, None
    dt, rest = layout if layout is not None else (_np.dtype(_np.uint8), None)
    item = dt.itemsize
    row = item
    for d in rest or ():
        row *= d
    rows = None
    if rest is not None and row and offset % row == 0 and nbytes % row == 0:
        rows = slice(offset // row, (offset + nbytes) // row)
        shape = (nbytes // row,) + rest
    elif offset % item == 0 and nbytes % item == 0:
        shape = (nbytes // item,)
    else:
        dt, shape = _np.dtype(_np.uint8), (nbytes,)
    return Buffer(buf.device, None, nbytes, shape, dt, owned=False, handle=buf._h, typed=True), rows


class Pipeline(_Owned):
    """Runs a host array through your device work in overlapped chunks."""

    _kind = "pipeline"

    def __init__(self, device=None, chunk_bytes=0, depth=0, element_bytes=0):
        dev = _dev(device)
        self.device = dev
        chunk_bytes = _size(chunk_bytes, "pipeline: chunk_bytes")
        depth = _size(depth, "pipeline: depth")
        if depth > 1024:  # ValueError, as documented (a C long overflow raised OverflowError)
            raise ValueError("pipeline: depth=%d is outside 0..1024" % depth)
        element_bytes = _size(element_bytes, "pipeline: element_bytes")
        try:
            ptr, self.chunk_bytes, self.depth, self.element_bytes = _core.pipeline_create(
                dev._ptr(), chunk_bytes, depth, element_bytes)
        except Error as e:
            raise _retag(e, "pipeline") from None
        self._lock = _Family("pipeline")  # one run at a time (a step on the running thread may enter again)
        self._h = _Handle(ptr, _core.pipeline_destroy, dev._h, 1)
        self._wrappers = {}
        self._running = 0
        self._closing = None
        dev._adopt(self)

    def _wrap_stream(self, ptr):
        s = self._wrappers.get(("s", ptr))
        if s is None:
            s = Stream.__new__(Stream)
            s.device, s._h, s._errors = self.device, _Handle(ptr, None, self._h or self._closing), []
            self._wrappers[("s", ptr)] = s
        return s

    def _wrap_buffer(self, ptr):
        b = self._wrappers.get(("b", ptr))
        if b is None:
            b = Buffer(self.device, None, self.chunk_bytes, owned=False,
                       handle=_Handle(ptr, None, self._h or self._closing))
            self._wrappers[("b", ptr)] = b
        return b

    def _host_fn_error(self):
        """The first exception raised by a launch_host function queued on the
        pipeline's streams (their Stream wrappers keep them), and forgets the rest."""
        first = None
        for key, w in list(self._wrappers.items()):
            if key[0] == "s" and w._errors:
                if first is None:
                    first = w._errors[0]
                del w._errors[:]
        return first

    def run(self, src, dst, step):
        """step(stream, chunk) enqueues the work for one Chunk on stream (read
        chunk.src, write chunk.dst: device Buffers in the arrays' dtypes and
        shapes; see Chunk). dst None: nothing is downloaded; dst may be src
        itself (in place), never other memory overlapping it
        (InvalidArgumentError). Blocking. An exception in the step, or in a
        function the step queued with launch_host, stops the run and is
        raised here."""
        if not callable(step):
            raise TypeError("Pipeline.run: step must be callable")
        src_layout = _pipeline_layout(src)
        dst_layout = src_layout if dst is None else _pipeline_layout(dst)
        raised = []  # exceptions of the step and of its launch_host functions: raised as they are

        def call(sp, index, offset, nbytes, _zero, inp, ioff, out, ooff):
            try:
                e = self._host_fn_error()  # a function of an earlier chunk raised: stop now
                if e is not None:
                    raise e
                ib, ob = self._wrap_buffer(inp), self._wrap_buffer(out)
                c = Chunk(index, offset, nbytes, ib, ioff, ob, ooff)
                c.src, c.rows = _chunk_view(ib, ioff, offset, nbytes, src_layout)
                c.dst = _chunk_view(ob, ooff, offset, nbytes, dst_layout)[0]
                step(self._wrap_stream(sp), c)
            except BaseException as e:  # noqa: B902 - raised by run
                raised.append(e)
                raise
        with self._lock:
            self._running += 1  # first: a close() from now on (a step, another thread) defers the destroy
            try:
                h = self._hold()
                if h.gen != h.forks[0]:
                    raise _forked_error(self._kind)
                self._host_fn_error()  # none left from an earlier run
                try:
                    _core.pipeline_run(h.ptr, src, dst, call)
                except BaseException as e:  # noqa: B902
                    late = self._host_fn_error()
                    if raised and e is raised[0]:
                        raise
                    if late is not None:  # the run failed after a function raised: that is the cause
                        raise late
                    if isinstance(e, (Error, ValueError, TypeError)):
                        raise _retag(e, "Pipeline.run") from None
                    raise
                late = self._host_fn_error()  # the last chunks' functions ran after every step
                if late is not None:
                    raise late
            finally:
                self._running -= 1
                if not self._running and self._closing is not None:
                    self._closing = None  # closed during the run: destroyed now that the run is over
                    self._close_wrappers()

    def close(self):
        """Closes it; during a run (inside its own step, or on another
        thread) the destroy waits for the run's end."""
        if self._running and self._h is not None:
            self._closing = self._h
            self._h = None
            return
        self._h = None
        self._close_wrappers()

    def _close_wrappers(self):
        for w in self._wrappers.values():
            w._h = None
        self._wrappers = {}


def pipeline(device=None, chunk_bytes=0, depth=0, element_bytes=0):
    return Pipeline(device, chunk_bytes, depth, element_bytes)


# ---------------------------------------------------------------------------
# Statistics and information
# ---------------------------------------------------------------------------

def stats(device=None):
    """The device's statistics as a dict."""
    return _dev(device).stats()


def reset_stats(device=None):
    _dev(device).reset_stats()


def info():
    """The library's version and every back end with its devices (or why it is unavailable)."""
    return {"version": _core.version(), "backends": _core.list()}


def version():
    return _core.version()
