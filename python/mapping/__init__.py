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
import collections
import weakref

import numpy as _np

from . import _core
from ._errors import *  # noqa: F401,F403  (Error and one subclass per status)
from ._errors import Error, BY_NAME as _ERR

__version__ = "0.1.0"

CPU = "cpu"
GPU = "gpu"

# DLPack device types (dlpack.h)
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_OPENCL = 1, 2, 3, 4
_DL_CODE = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_DL_KIND = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}


class _Handle:
    """Owns one C object; destroys it when the last Python reference goes
    (a numpy view of host memory holds one, so memory never dangles). `parent`
    (its device's handle, or a mirror's) stays alive until then.

    The garbage collector may finalize a device's handle before its children's
    (objects reachable only from a reference cycle are finalized in any
    order), so a device's handle knows its children's handles and destroys them
    first (mirrors, then batches and pipelines, streams, events, buffers), and a
    child whose device is gone does nothing."""

    __slots__ = ("ptr", "destroy", "parent", "rank", "children", "__weakref__")

    def __init__(self, ptr, destroy, parent=None, rank=9):
        self.ptr = ptr
        self.destroy = destroy
        self.parent = parent
        self.rank = rank
        self.children = None
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

    def release(self):
        ptr = self.ptr
        if ptr is None or self.destroy is None:
            self.ptr = None
            return
        if self.children:
            for child in sorted(list(self.children), key=lambda h: h.rank):
                child.release()
        if not self._ancestors_alive():
            self.ptr = None
            return
        self.ptr = None
        try:
            self.destroy(ptr)
        except Exception:  # pragma: no cover - never raise from GC
            pass

    def __del__(self):
        self.release()


class _Owned:
    """Base of the objects that hold a C handle: close() / context manager; a
    closed object raises mapping.InvalidHandleError."""

    _kind = "object"

    def _ptr(self):
        h = self._h
        if h is None or h.ptr is None:
            raise _ERR["ERR_INVALID_HANDLE"]("this %s is closed" % self._kind, -5)
        return h.ptr

    @property
    def closed(self):
        return self._h is None

    def close(self):
        """Frees it now (the memory itself goes once no numpy view of it remains)."""
        self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _nbytes_of(shape, dtype):
    n = _np.dtype(dtype).itemsize
    for s in shape:
        n *= int(s)
    return n


def _shape_dtype(shape, dtype):
    """allocate_*(nbytes) or (shape, dtype): returns (shape tuple, numpy dtype)."""
    if dtype is None:
        if isinstance(shape, (tuple, list)):
            return tuple(int(s) for s in shape), _np.dtype(_np.float32)
        if not isinstance(shape, int) or isinstance(shape, bool):
            raise TypeError("expected a byte count or a shape, got %s" % type(shape).__name__)
        return (int(shape),), _np.dtype(_np.uint8)
    if isinstance(shape, int):
        shape = (shape,)
    return tuple(int(s) for s in shape), _np.dtype(dtype)


# ---------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------

class Device(_Owned):
    """An open device. Everything made from it holds it open; close() frees
    its objects now and the device as soon as no numpy view of its memory is left."""

    _kind = "device"

    def __init__(self, ptr, keep=None):
        self._h = _Handle(ptr, _core.close)
        self._children = weakref.WeakSet()
        self._keep = keep  # e.g. the pyopencl.Context it was opened on
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
        return _core.device_link(self._ptr())

    def set_link(self, latency=0.0, bandwidth=0.0):
        """Sets the link model (0 fields: measure again on next use)."""
        _core.device_set_link(self._ptr(), float(latency), float(bandwidth))

    def close(self):
        if self._h is None:
            return
        for order in (Mirror, Batch, Pipeline, Stream, Event, Buffer):
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
_opencl_devices = {}


def open(backend=None, device=None, context=None, queue=None):  # noqa: A001 (the library's own name)
    """Opens a device: open(backend="host"|"opencl"|"cuda", device=N); with no
    arguments $MAPPING_BACKEND / $MAPPING_DEVICE or the best available.
    open(context=pyopencl.Context[, queue=pyopencl.CommandQueue]) opens on
    PyOpenCL's context, so its buffers can be used directly."""
    if context is not None:
        return open_opencl(context, queue=queue)
    if backend is not None and not isinstance(backend, str):
        raise TypeError("backend must be a str such as 'host', 'opencl' or 'cuda'")
    if device is not None and (not isinstance(device, int) or isinstance(device, bool)):
        raise TypeError("device must be an int index")
    return Device(_core.open(backend, -1 if device is None else device))


def _int_ptr(obj, what):
    p = getattr(obj, "int_ptr", None)
    if p is None:
        if isinstance(obj, int):
            return obj
        raise TypeError("%s must be a pyopencl object (with .int_ptr) or an int handle" % what)
    return int(p)


def open_opencl(context, device=None, queue=None):
    """A device on an OpenCL context made elsewhere: a pyopencl.Context (or a
    cl_context int), its device (default: the context's first device), and an
    optional in-order queue that becomes the device's own queue."""
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
    return Device(_core.open_opencl(ctx, dev, q), keep=(context, device, queue))


def _device_for_opencl_context(context):
    key = int(context.int_ptr)
    d = _opencl_devices.get(key)
    if d is None or d.closed:
        d = open_opencl(context)
        _opencl_devices[key] = d
    return d


def default_device():
    """The device the module-level functions use: opened on first use from
    $MAPPING_BACKEND / $MAPPING_DEVICE (or the best available)."""
    global _default
    if _default is None or _default.closed:
        _default = open()
    return _default


def set_default_device(device):
    """Makes `device` the one the module-level functions use."""
    global _default
    if not isinstance(device, Device):
        raise TypeError("expected a mapping.Device")
    _default = device


def _dev(device):
    return default_device() if device is None else device


# ---------------------------------------------------------------------------
# Device memory
# ---------------------------------------------------------------------------

class Buffer(_Owned):
    """Device ("GPU") memory: a shape and dtype over nbytes bytes. Works with
    DLPack (__dlpack__), __cuda_array_interface__ (CUDA), and PyOpenCL
    (.cl_mem for pyopencl.Buffer.from_int_ptr)."""

    _kind = "buffer"

    def __init__(self, device, ptr, nbytes, shape=None, dtype=None, owned=True, keep=None):
        self.device = device
        self._h = _Handle(ptr, _core.free_gpu if owned else None, device._h, 4)
        self.nbytes = nbytes
        self.dtype = _np.dtype(_np.uint8 if dtype is None else dtype)
        self.shape = (nbytes // self.dtype.itemsize,) if shape is None else tuple(shape)
        self._keep = keep
        self._stream = None  # the last stream queued work on it (for the CUDA array interface)
        if owned:
            device._adopt(self)

    def __repr__(self):
        return "<mapping.Buffer %d bytes %s %s on %s>" % (self.nbytes, self.shape, self.dtype, self.device.backend)

    def __len__(self):
        return self.shape[0] if self.shape else 1

    @property
    def size(self):
        return self.nbytes // self.dtype.itemsize

    @property
    def native(self):
        """The native handle as an int: cl_mem (OpenCL), CUdeviceptr (CUDA), address (host)."""
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
        """The same memory with another shape/dtype (no copy)."""
        dt = self.dtype if dtype is None else _np.dtype(dtype)
        shape = (self.nbytes // dt.itemsize,) if shape is None else tuple(shape)
        if _nbytes_of(shape, dt) != self.nbytes:
            raise _ERR["ERR_INVALID_ARGUMENT"]("view: %s of %s is not %d bytes" % (shape, dt, self.nbytes), -2)
        b = Buffer(self.device, self._ptr() if self.nbytes else None, self.nbytes, shape, dt, owned=False, keep=self)
        return b

    def get(self, stream=None):
        """A new numpy array with the buffer's content."""
        out = _np.empty(self.shape, self.dtype)
        sync_to_cpu(self, out, stream=stream)
        if stream is not None:
            stream.synchronize()
        return out

    def fill(self, value, offset=0, nbytes=None, stream=None):
        """Sets bytes to `value` (0..255)."""
        n = self.nbytes - offset if nbytes is None else nbytes
        if not isinstance(value, int) or not 0 <= value <= 255:
            raise _ERR["ERR_INVALID_ARGUMENT"]("fill: value %r is not a byte (0..255)" % (value,), -2)
        if n == 0:
            return
        _core.fill_gpu(_stream_ptr(stream, self.device), self._ptr(), offset, n, value)

    # ---- DLPack ----
    def __dlpack_device__(self):
        kind = {"host": _DL_CPU, "cuda": _DL_CUDA, "opencl": _DL_OPENCL}.get(self.device.backend, _DL_CPU)
        return (kind, 0 if self.device.backend == "host" else self.device.index)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("mapping buffers are exported without a copy")
        kind, index = self.__dlpack_device__()
        if self._stream is not None and not self._stream.closed:
            self._stream.synchronize()  # make queued work visible to any consumer stream
        code = _DL_CODE.get(self.dtype.kind)
        if code is None:
            raise BufferError("dtype %s has no DLPack equivalent" % self.dtype)
        addr = self.native
        return _core.to_dlpack(addr, kind, index, tuple(self.shape), (code, self.dtype.itemsize * 8), self)

    # ---- CUDA array interface v3 ----
    @property
    def __cuda_array_interface__(self):
        if self.device.backend != "cuda":
            raise AttributeError("__cuda_array_interface__: this buffer is on the %s back end" % self.device.backend)
        s = self._stream
        stream = _core.stream_native(s._ptr()) if s is not None and not s.closed else None
        return {"shape": tuple(self.shape), "typestr": self.dtype.str, "data": (self.native, False),
                "version": 3, "strides": None, "stream": stream or None}


def allocate_gpu(shape, dtype=None, device=None):
    """Device memory: allocate_gpu(nbytes) (uint8) or allocate_gpu(shape, dtype).
    Its content is undefined until written. Size 0 gives an empty buffer."""
    shape, dtype = _shape_dtype(shape, dtype)
    dev = _dev(device)
    n = _nbytes_of(shape, dtype)
    ptr = _core.allocate_gpu(dev._ptr(), n) if n else None
    return Buffer(dev, ptr, n, shape, dtype)


class _HostBlock:
    """Page-locked memory from mapping_allocate_cpu; freed with the last numpy view."""
    __slots__ = ("dev", "addr", "__weakref__")
    _free = staticmethod(_core.free_cpu)

    def __init__(self, dev_handle, addr):
        self.dev = dev_handle
        self.addr = addr

    def __del__(self):
        if self.addr and self.dev is not None and self.dev.ptr:
            try:
                self._free(self.dev.ptr, self.addr)
            except Exception:  # pragma: no cover
                pass
        self.addr = None


def allocate_cpu(shape, dtype=None, device=None):
    """A numpy array in page-locked host memory (the fastest copies):
    allocate_cpu(nbytes) (uint8) or allocate_cpu(shape, dtype). Freed with the
    array; it keeps its device open until then."""
    shape, dtype = _shape_dtype(shape, dtype)
    dev = _dev(device)
    n = _nbytes_of(shape, dtype)
    if n == 0:
        return _np.empty(shape, dtype)
    addr = _core.allocate_cpu(dev._ptr(), n)
    mem = _core.HostMemory(addr, n, _HostBlock(dev._h, addr))
    return _np.frombuffer(mem, dtype=dtype).reshape(shape)


def _import_pyopencl_buffer(obj):
    dev = _device_for_opencl_context(obj.context)
    n = int(obj.size)
    ptr = _core.import_gpu(dev._ptr(), int(obj.int_ptr), 0, n)
    return Buffer(dev, ptr, n, keep=obj)


def _is_pyopencl(obj, name):
    mod = type(obj).__module__ or ""
    return mod.startswith("pyopencl") and any(c.__name__ == name for c in type(obj).__mro__)


def as_buffer(obj, device=None):
    """A mapping.Buffer for obj: itself; a pyopencl.Buffer (opens a device on
    its context); an object with __dlpack__ or __cuda_array_interface__
    (torch, CuPy) imported without a copy. The memory stays the owner's."""
    if isinstance(obj, Buffer):
        return obj
    if _is_pyopencl(obj, "Buffer"):
        return _import_pyopencl_buffer(obj)
    if hasattr(obj, "__cuda_array_interface__") and not hasattr(obj, "__dlpack__"):
        return _import_cai(obj, device)
    if hasattr(obj, "__dlpack__"):
        return from_dlpack(obj, device=device)
    raise TypeError("expected a mapping.Buffer, a pyopencl.Buffer or a DLPack / CUDA-array-interface device "
                    "tensor; got %s" % type(obj).__name__)


def import_gpu(native, nbytes, offset=0, device=None, shape=None, dtype=None, keep=None):
    """Device memory made elsewhere as a Buffer: a cl_mem (int) on a device
    opened on its context, a CUdeviceptr (int), or an address (host back end).
    Freeing the Buffer never frees the memory; `keep` is held until then."""
    dev = _dev(device)
    ptr = _core.import_gpu(dev._ptr(), int(native), offset, nbytes)
    if shape is None and dtype is not None:
        shape = (nbytes // _np.dtype(dtype).itemsize,)
    return Buffer(dev, ptr, nbytes, shape, dtype, keep=keep)


def _import_cai(obj, device):
    cai = obj.__cuda_array_interface__
    dt = _np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    if cai.get("strides") not in (None, ()):
        exp = dt.itemsize
        for s, st in zip(reversed(shape), reversed(cai["strides"])):
            if s > 1 and st != exp:
                raise _ERR["ERR_INVALID_ARGUMENT"]("__cuda_array_interface__: not C-contiguous", -2)
            exp *= s
    dev = _dev(device)
    if dev.backend != "cuda":
        raise _ERR["ERR_DEVICE_MISMATCH"]("a CUDA array needs a CUDA device (this one is %s)" % dev.backend, -6)
    n = _nbytes_of(shape, dt)
    ptr = _core.import_gpu(dev._ptr(), cai["data"][0], 0, n) if n else None
    return Buffer(dev, ptr, n, shape, dt, keep=obj)


def from_dlpack(obj, device=None):
    """Imports a DLPack tensor's memory (torch, CuPy; numpy on the host back
    end) as a Buffer, without a copy. The producer's memory is released when
    the Buffer is freed."""
    if not hasattr(obj, "__dlpack__"):
        raise TypeError("from_dlpack: %s has no __dlpack__" % type(obj).__name__)
    kind, index = obj.__dlpack_device__()
    kind = int(kind)
    want = {_DL_CPU: "host", _DL_CUDA: "cuda", _DL_OPENCL: "opencl"}.get(kind)
    dev = device
    if dev is None:
        dev = default_device()
        if want is not None and dev.backend != want:
            dev = open(want, int(index) if want != "host" else 0)
    if want is None or dev.backend != want:
        raise _ERR["ERR_DEVICE_MISMATCH"](
            "from_dlpack: the tensor is on DLPack device type %d, the device is %s (a CPU tensor is device memory "
            "only on the host back end: use sync_to_gpu to copy it)" % (kind, dev.backend), -6)
    try:
        capsule = obj.__dlpack__(stream=None)
    except TypeError:
        capsule = obj.__dlpack__()
    ptr, _, _, shape, (code, bits), n = _core.import_dlpack(dev._ptr(), capsule)
    dt = _np.dtype("%s%d" % (_DL_KIND.get(code, "u"), bits // 8)) if code != 6 else _np.dtype(bool)
    return Buffer(dev, ptr, n, shape, dt, keep=obj)


# ---------------------------------------------------------------------------
# Copies
# ---------------------------------------------------------------------------

def _stream_ptr(stream, device):
    if stream is None:
        return None
    if isinstance(stream, Stream):
        return stream._ptr()
    if _is_pyopencl(stream, "CommandQueue"):
        return import_stream(stream, device)._ptr()
    raise TypeError("stream must be a mapping.Stream, a pyopencl.CommandQueue or None")


def _keep_for(stream, device, *objs):
    """Host objects queued work uses stay alive until the stream has passed it."""
    if isinstance(stream, Stream):
        stream._keep.extend(objs)
    elif stream is not None and _is_pyopencl(stream, "CommandQueue"):
        # The caller waits on PyOpenCL's queue, not through mapping: mark the
        # point with an event and let go of the objects once it has passed.
        s = import_stream(stream, device)
        s._keep = [(e, o) for e, o in s._keep if not (isinstance(e, Event) and e.query())]
        s._keep.append((Event(s), objs))


def sync_to_gpu(cpu_data, gpu, offset=0, stream=None):
    """Copies cpu_data (any C-contiguous buffer: numpy, bytes, bytearray,
    array.array, memoryview) into gpu at byte `offset`. gpu: a Buffer, a
    pyopencl.Buffer, or a DLPack / CUDA-array tensor. stream None: blocking.
    An empty cpu_data is a no-op."""
    if type(gpu) is not Buffer:
        gpu = as_buffer(gpu)
    if gpu.nbytes == 0:
        if memoryview(cpu_data).nbytes:
            raise _ERR["ERR_OUT_OF_RANGE"]("sync_to_gpu: the buffer is empty", -4)
        return
    if stream is None:
        _core.write(None, gpu._h.ptr if gpu._h is not None else gpu._ptr(), offset, cpu_data,
                    gpu.device._hold_gil_below)
        return
    _core.write(_stream_ptr(stream, gpu.device), gpu._ptr(), offset, cpu_data)
    gpu._stream = stream if isinstance(stream, Stream) else None
    _keep_for(stream, gpu.device, cpu_data, gpu)


def sync_to_cpu(gpu, cpu_result, offset=0, stream=None):
    """Copies gpu[offset, +len(cpu_result) bytes) into cpu_result (a writable,
    C-contiguous buffer). stream None: blocking. An empty cpu_result is a no-op."""
    if type(gpu) is not Buffer:
        gpu = as_buffer(gpu)
    if gpu.nbytes == 0:
        if memoryview(cpu_result).nbytes:
            raise _ERR["ERR_OUT_OF_RANGE"]("sync_to_cpu: the buffer is empty", -4)
        return
    if stream is None:
        _core.read(None, gpu._h.ptr if gpu._h is not None else gpu._ptr(), offset, cpu_result,
                   gpu.device._hold_gil_below)
        return
    _core.read(_stream_ptr(stream, gpu.device), gpu._ptr(), offset, cpu_result)
    _keep_for(stream, gpu.device, cpu_result, gpu)


def copy_gpu(src, dst, nbytes=None, src_offset=0, dst_offset=0, stream=None):
    """Device-to-device copy (default: all of src)."""
    src, dst = as_buffer(src), as_buffer(dst)
    n = src.nbytes - src_offset if nbytes is None else nbytes
    if n == 0:
        return
    _core.copy_gpu(_stream_ptr(stream, src.device), src._ptr(), src_offset, dst._ptr(), dst_offset, n)
    _keep_for(stream, src.device, src, dst)


def fill_gpu(gpu, value, offset=0, nbytes=None, stream=None):
    """Sets bytes of gpu to value (0..255)."""
    as_buffer(gpu).fill(value, offset, nbytes, stream)


# ---------------------------------------------------------------------------
# Streams and events
# ---------------------------------------------------------------------------

class Stream(_Owned):
    """An in-order queue (CUDA stream, OpenCL queue, a worker thread on host).
    Host objects used by queued work are kept alive until synchronize()."""

    _kind = "stream"

    def __init__(self, device=None, _ptr=None, _keep=None):
        dev = _dev(device)
        self.device = dev
        ptr = _core.stream_create(dev._ptr()) if _ptr is None else _ptr
        self._h = _Handle(ptr, _core.stream_destroy, dev._h, 2)
        self._keep = []
        self._owner = _keep
        dev._adopt(self)

    @property
    def native(self):
        """cl_command_queue / CUstream as an int (0 on the host back end)."""
        return _core.stream_native(self._ptr()) or 0

    def synchronize(self):
        """Waits for the queued work; raises its first error."""
        try:
            _core.stream_sync(self._ptr())
        finally:
            self._keep.clear()

    def record(self):
        """An Event at the current end of the stream."""
        return Event(self)

    def wait(self, event):
        """Later work on this stream waits for event."""
        _core.stream_wait_event(self._ptr(), event._ptr())

    def close(self):
        self._h = None
        self._keep = []


def stream(device=None):
    return Stream(device)


def import_stream(queue, device=None):
    """A stream on a native queue made elsewhere: a pyopencl.CommandQueue
    (on a device opened on its context) or a CUstream int."""
    if _is_pyopencl(queue, "CommandQueue"):
        dev = device if device is not None else _device_for_opencl_context(queue.context)
        key = int(queue.int_ptr)
        s = dev._imported_queues.get(key)
        if s is None or s.closed:
            s = Stream(dev, _core.import_stream(dev._ptr(), key), _keep=queue)
            dev._imported_queues[key] = s
        return s
    dev = _dev(device)
    return Stream(dev, _core.import_stream(dev._ptr(), int(queue)), _keep=queue)


class Event(_Owned):
    _kind = "event"

    def __init__(self, stream):
        self.device = stream.device
        self._h = _Handle(_core.event_record(stream._ptr()), _core.event_destroy, stream.device._h, 3)
        self.device._adopt(self)

    def synchronize(self):
        _core.event_sync(self._ptr())

    def query(self):
        """True once the stream has passed the event."""
        return _core.event_query(self._ptr())

    def elapsed(self, end):
        """Seconds from this event to `end` (both completed)."""
        return _core.event_elapsed(self._ptr(), end._ptr())


# ---------------------------------------------------------------------------
# Mirrors
# ---------------------------------------------------------------------------

_ACCESS = {"r": 1, "w": 2, "rw": 3, "wr": 3}
_SIDES = {"cpu": 1, "gpu": 2, CPU: 1, GPU: 2, 1: 1, 2: 2}


class _Access:
    def __init__(self, enter, leave=None):
        self._enter, self._leave = enter, leave

    def __enter__(self):
        return self._enter()

    def __exit__(self, *exc):
        if self._leave is not None:
            self._leave()
        return False


class Mirror(_Owned):
    """A host array and its device twin whose validity is tracked per byte:
    .array is a numpy view of the host side, .buffer the device Buffer (this
    mirror's bytes start at .gpu_offset). A sync moves only stale bytes.
    Access intents: ``with m.cpu("rw") as a:`` and ``with m.gpu("rw", stream) as buf:``."""

    _kind = "mirror"

    def __init__(self, device, ptr, shape, dtype, keep=None):
        self.device = device
        self._h = _Handle(ptr, _core.mirror_destroy, device._h, 0)
        self._keep = keep
        self.dtype = _np.dtype(dtype)
        self.shape = tuple(shape)
        addr, size, gpu, off, unified = _core.mirror_parts(ptr)
        self.nbytes = size
        self.gpu_offset = off
        self.is_unified = unified
        self._addr = addr
        self._gpu = Buffer(device, gpu, off + size, owned=False, keep=self._h)
        self._cpu = None
        device._adopt(self)

    def __repr__(self):
        return "<mapping.Mirror %s %s%s>" % (self.shape, self.dtype, " unified" if self.is_unified else "")

    @property
    def array(self):
        """The host side as a numpy array (no sync: see cpu() and sync_to_cpu)."""
        self._ptr()
        if self._cpu is None:
            mem = _core.HostMemory(self._addr, self.nbytes, self._h)
            self._cpu = _np.frombuffer(mem, dtype=self.dtype).reshape(self.shape)
        return self._cpu

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)

    @property
    def buffer(self):
        """The family's device Buffer; this mirror's bytes start at gpu_offset."""
        self._ptr()
        return self._gpu

    def _range(self, key, nbytes):
        if key is None:
            return 0, self.nbytes
        item = self.dtype.itemsize
        if isinstance(key, slice):
            start, stop, step = key.indices(self.nbytes // item)
            if step != 1:
                raise _ERR["ERR_INVALID_ARGUMENT"]("a mirror range must have step 1", -2)
            return start * item, max(0, stop - start) * item
        if isinstance(key, int) and not isinstance(key, bool):
            if nbytes is not None:
                return key, nbytes  # byte offset and size
            n = self.nbytes // item
            if key < 0:
                key += n
            if not 0 <= key < n:
                raise _ERR["ERR_OUT_OF_RANGE"]("index %d is outside the mirror's %d elements" % (key, n), -4)
            return key * item, item
        raise TypeError("expected a slice, an element index, or a byte offset with nbytes")

    def mark_cpu_modified(self, key=None, nbytes=None):
        """"I wrote these bytes on the CPU": a slice of elements, an element
        index, a byte offset with nbytes, or nothing for all of it."""
        off, n = self._range(key, nbytes)
        if n:
            _core.mirror_mark(self._ptr(), 1, off, n)

    def mark_gpu_modified(self, key=None, nbytes=None):
        off, n = self._range(key, nbytes)
        if n:
            _core.mirror_mark(self._ptr(), 2, off, n)

    def sync_to_gpu(self, stream=None):
        _core.mirror_sync(_stream_ptr(stream, self.device), self._ptr(), 2)

    def sync_to_cpu(self, stream=None):
        _core.mirror_sync(_stream_ptr(stream, self.device), self._ptr(), 1)

    def stale_bytes(self, side="gpu"):
        if side not in _SIDES:
            raise _ERR["ERR_INVALID_ARGUMENT"]("side must be 'cpu' or 'gpu'", -2)
        return _core.mirror_stale(self._ptr(), _SIDES[side])

    def __getitem__(self, key):
        """A view over a slice of elements (flat), sharing the state."""
        off, n = self._range(key, None)
        if n == 0:
            raise _ERR["ERR_ZERO_SIZE"]("an empty mirror view", -3)
        ptr = _core.mirror_view(self._ptr(), off, n)
        return Mirror(self.device, ptr, (n // self.dtype.itemsize,), self.dtype, keep=self)

    def cpu(self, access="rw"):
        """with m.cpu("rw") as a: ... syncs before a read ("r"), marks after a
        write ("w"; "w" alone discards: nothing is copied). a is the numpy view."""
        if access not in _ACCESS:
            raise _ERR["ERR_INVALID_ARGUMENT"]("access must be 'r', 'w' or 'rw'", -2)

        def enter():
            _core.mirror_acquire_cpu(self._ptr(), _ACCESS[access])
            arr = self.array
            if access == "r":
                arr = arr.view()
                arr.flags.writeable = False
            return arr
        return _Access(enter)

    def gpu(self, access="rw", stream=None):
        """with m.gpu("rw", stream) as buf: launch your work on buf at
        m.gpu_offset (on `stream`, or the device's own queue when None); on
        exit it is released, so later calls order themselves after it."""
        if access not in _ACCESS:
            raise _ERR["ERR_INVALID_ARGUMENT"]("access must be 'r', 'w' or 'rw'", -2)
        sp = _stream_ptr(stream, self.device)

        def enter():
            _core.mirror_acquire_gpu(sp, self._ptr(), _ACCESS[access])
            return self._gpu

        def leave():
            _core.mirror_release_gpu(sp, self._ptr())
        return _Access(enter, leave)

    def close(self):
        self._h = None
        self._cpu = None
        if getattr(self, "_gpu", None) is not None:
            self._gpu._h = None


def _mirror_shape(shape, dtype):
    return _shape_dtype(shape, dtype)


def mirror(shape, dtype=None, unified=False, device=None):
    """A new mirror: zero-filled page-locked host memory and a device buffer.
    mirror(nbytes) or mirror(shape, dtype); unified=True uses one unified
    allocation where the device has it."""
    shape, dtype = _mirror_shape(shape, dtype)
    dev = _dev(device)
    n = _nbytes_of(shape, dtype)
    if n == 0:
        raise _ERR["ERR_ZERO_SIZE"]("a mirror of 0 bytes", -3)
    return Mirror(dev, _core.mirror_create(dev._ptr(), n, _core.MIRROR_UNIFIED if unified else 0), shape, dtype)


def mirror_wrap(array, pin=False, device=None):
    """A mirror over your numpy array (C-contiguous, writable; not copied)."""
    dev = _dev(device)
    addr, n = _core.address_of(array, True)
    if n == 0:
        raise _ERR["ERR_ZERO_SIZE"]("a mirror of 0 bytes", -3)
    arr = _np.asarray(array)
    return Mirror(dev, _core.mirror_wrap(dev._ptr(), addr, n, _core.MIRROR_PIN if pin else 0), arr.shape,
                  arr.dtype, keep=array)


def mirror_adopt(array, gpu, gpu_offset=0, gpu_valid=False, device=None):
    """A mirror over both sides supplied by you: a numpy array and device
    memory (a Buffer, pyopencl.Buffer, or DLPack tensor) at gpu_offset bytes.
    gpu_valid=True: the device side holds the data (the CPU side starts stale)."""
    buf = as_buffer(gpu, device)
    addr, n = _core.address_of(array, True)
    if n == 0:
        raise _ERR["ERR_ZERO_SIZE"]("a mirror of 0 bytes", -3)
    arr = _np.asarray(array)
    flags = _core.MIRROR_GPU_VALID if gpu_valid else 0
    ptr = _core.mirror_adopt(buf.device._ptr(), addr, buf._ptr(), gpu_offset, n, flags)
    return Mirror(buf.device, ptr, arr.shape, arr.dtype, keep=(array, buf))


# ---------------------------------------------------------------------------
# Batches and pipelines
# ---------------------------------------------------------------------------

class Batch(_Owned):
    """Many copies moved with few transfers. Host objects are held until the flush is done."""

    _kind = "batch"

    def __init__(self, device=None):
        dev = _dev(device)
        self.device = dev
        self._h = _Handle(_core.batch_create(dev._ptr()), _core.batch_destroy, dev._h, 1)
        self._keep = []
        dev._adopt(self)

    def sync_to_gpu(self, cpu_data, gpu, offset=0):
        gpu = as_buffer(gpu)
        addr, n = _core.address_of(cpu_data, False)
        if n:
            _core.batch_add(self._ptr(), True, gpu._ptr(), offset, addr, n)
            self._keep.append((cpu_data, gpu))

    def sync_to_cpu(self, gpu, cpu_result, offset=0):
        gpu = as_buffer(gpu)
        addr, n = _core.address_of(cpu_result, True)
        if n:
            _core.batch_add(self._ptr(), False, gpu._ptr(), offset, addr, n)
            self._keep.append((cpu_result, gpu))

    def __len__(self):
        return _core.batch_count(self._ptr())

    def clear(self):
        _core.batch_clear(self._ptr())
        self._keep = []

    def flush(self, stream=None):
        _core.batch_flush(_stream_ptr(stream, self.device), self._ptr())
        if stream is not None:
            _keep_for(stream, self.device, *self._keep)
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


Chunk = collections.namedtuple("Chunk", "index offset nbytes input input_offset output output_offset")


class Pipeline(_Owned):
    """Runs a host array through your device work in overlapped chunks."""

    _kind = "pipeline"

    def __init__(self, device=None, chunk_bytes=0, depth=0, element_bytes=0):
        dev = _dev(device)
        self.device = dev
        ptr, self.chunk_bytes, self.depth, self.element_bytes = _core.pipeline_create(
            dev._ptr(), chunk_bytes, depth, element_bytes)
        self._h = _Handle(ptr, _core.pipeline_destroy, dev._h, 1)
        self._wrappers = {}
        dev._adopt(self)

    def _wrap_stream(self, ptr):
        s = self._wrappers.get(("s", ptr))
        if s is None:
            s = Stream.__new__(Stream)
            s.device, s._h, s._keep, s._owner = self.device, _Handle(ptr, None), [], None
            self._wrappers[("s", ptr)] = s
        return s

    def _wrap_buffer(self, ptr):
        b = self._wrappers.get(("b", ptr))
        if b is None:
            b = Buffer(self.device, ptr, self.chunk_bytes, owned=False)
            self._wrappers[("b", ptr)] = b
        return b

    def run(self, src, dst, step):
        """step(stream, chunk) enqueues the work for one Chunk on stream (read
        chunk.input at input_offset, write chunk.output at output_offset).
        dst None: nothing is downloaded. Blocking."""
        if not callable(step):
            raise TypeError("step must be callable")

        def call(sp, index, offset, nbytes, _zero, inp, ioff, out, ooff):
            step(self._wrap_stream(sp), Chunk(index, offset, nbytes, self._wrap_buffer(inp), ioff,
                                              self._wrap_buffer(out), ooff))
        _core.pipeline_run(self._ptr(), src, dst, call)


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
