"""mapping.mpi: distributed arrays over MPI, for mpi4py communicators.

The optional part of the package that wraps libmapping_mpi (docs/mpi.md)::

    from mpi4py import MPI
    import numpy as np
    import mapping.mpi

    u = mapping.mpi.DistArray(MPI.COMM_WORLD, (4096, 4096), np.float32, halo=1)
    u.scatter(initial, root=0)             # root's numpy array to every rank's owned rows
    s = u.device.stream()
    for step in range(100):
        with u.gpu("rw", s) as buf:        # the whole local block on the device
            launch_kernel(buf, s)          # your kernel on s
        u.halo_exchange(s)                 # waits for the kernel itself: no synchronize() first
    result = u.gather(root=0)              # numpy array on root, None elsewhere

Every collective call (the constructor, scatter, gather, halo_exchange, the
delta setter) fails with the same mapping.Error subclass on every rank, never
hangs on a rank that failed: see docs/python.md, "Many processes".
"""
import ctypes as _ctypes
import importlib as _importlib
import os as _os
import sys as _sys
import weakref as _weakref

import numpy as _np

import mapping as _mapping
from mapping import Stream as _Stream
from . import _core
from ._errors import ERRORS as _ERRORS, BY_NAME as _ERR, Error

_INSTALL_HINT = ("install an MPI with its compiler wrapper (Debian: apt-get install libopenmpi-dev openmpi-bin), "
                 "then pip install mpi4py and reinstall mapping with its MPI part: pip install ./python[mpi]")

try:
    from mpi4py import MPI
except ImportError as _e:
    raise ImportError("mapping.mpi needs mpi4py (%s): %s" % (_e, _INSTALL_HINT)) from None


def _load_extension():
    """mapping._mpi, sharing mapping._core's libmapping (made global first)."""
    try:
        _ctypes.CDLL(_core.__file__, mode=_os.RTLD_NOW | _os.RTLD_GLOBAL | getattr(_os, "RTLD_NOLOAD", 0))
    except OSError:  # pragma: no cover - then the import below names the missing symbol
        pass
    try:
        return _importlib.import_module("mapping._mpi")
    except ModuleNotFoundError as e:
        if e.name != "mapping._mpi":
            raise
        raise ImportError("this mapping was built without its MPI part (no MPI was found when it was built): "
                          + _INSTALL_HINT + " (MAPPING_PYTHON_MPI=ON makes a build without MPI fail)") from None
    except ImportError as e:
        raise ImportError("mapping._mpi could not be loaded: %s" % e) from None


_mpi = _load_extension()


def _mpi4py_abi():
    def call(name, *args):
        f = getattr(MPI, name, None)
        return f(*args) if f is not None else None
    return {"vendor": call("get_vendor"), "library": call("Get_library_version"),
            "comm_size": call("_sizeof", MPI.Comm), "comm_world": call("_handleof", MPI.COMM_WORLD)}


def _check_abi(ours, theirs):
    """None, or why mpi4py's MPI is not the one mapping._mpi was built against."""
    def name(v):
        if not v:
            return "an unknown MPI"
        ver = v[1]
        ver = ".".join(str(x) for x in ver) if isinstance(ver, (tuple, list)) else str(ver)
        return ("%s %s" % (v[0], ver)).strip()
    built = name(ours["vendor"])
    fix = ("rebuild mapping against mpi4py's MPI (pip install ./python[mpi] with that MPI's mpicc first on PATH), "
           "or make mpi4py use %s (pip install --no-binary mpi4py mpi4py, built with its mpicc)" % built)
    v = theirs.get("vendor")
    if v and ours["vendor"][0].lower() != str(v[0]).lower():
        return "mapping.mpi was built against %s, but mpi4py runs on %s: %s" % (built, name(v), fix)
    if theirs.get("comm_size") not in (None, ours["comm_size"]):
        return ("mapping.mpi's MPI_Comm has %d bytes, mpi4py's %d: the two MPI libraries differ in their ABI; %s"
                % (ours["comm_size"], theirs["comm_size"], fix))
    def text(s):
        return s.replace("\x00", "").strip()
    lib = theirs.get("library")
    if lib is not None and text(lib) != text(ours["library"]):
        return ("two MPI libraries in one process: mapping.mpi runs on %r, mpi4py on %r; %s"
                % (text(ours["library"]), text(lib), fix))
    if theirs.get("comm_world") not in (None, ours["comm_world"]):
        return "two copies of the MPI library are loaded (their MPI_COMM_WORLD differ); " + fix
    return None


_why = _check_abi(_mpi.abi(), _mpi4py_abi())
if _why:
    raise ImportError(_why)


class PeerError(Error):
    """Another rank of a distributed array failed (an exception, Ctrl-C, a
    timeout) and said so: this rank's collective call gave up instead of
    waiting for ever. ``rank`` is that rank, ``why`` its message. The
    distributed arrays of this process that were alive then are no longer
    usable (each call raises again); make new ones."""

    def __init__(self, rank, why="", status=None):
        origin, _, text = why.partition(" ")
        if origin.startswith("@") and origin[1:].isdigit():  # a notice passed on: the rank that failed first
            rank, why = int(origin[1:]), text
        super().__init__("rank %d failed (%s): this rank gave up waiting for it; the distributed arrays are no "
                         "longer usable" % (rank, why or "no reason given"), status)
        self.rank = rank
        self.why = why

    def __reduce__(self):
        return (type(self), (self.rank, self.why, self.status))


class WaitTimeout(Error, TimeoutError):
    """A collective call waited longer than set_timeout() for the other ranks."""


_mpi.set_errors(Error, _ERRORS, PeerError, WaitTimeout)

_timeout = [0.0]


def set_timeout(seconds):
    """How long a collective call waits for the other ranks before it gives
    up (WaitTimeout, after telling them). None or 0: for ever, as MPI does
    ($MAPPING_MPI_TIMEOUT sets it at import)."""
    t = 0.0 if seconds is None else float(seconds)
    if t < 0 or t != t:
        raise ValueError("set_timeout: seconds must be >= 0 or None, got %r" % (seconds,))
    _timeout[0] = t
    _mpi.set_timeout(t)


def get_timeout():
    return _timeout[0] or None


try:
    set_timeout(float(_os.environ.get("MAPPING_MPI_TIMEOUT", "0") or 0))
except ValueError:
    raise ImportError("MAPPING_MPI_TIMEOUT=%r is not a number of seconds" % _os.environ.get("MAPPING_MPI_TIMEOUT"))

# ---------------------------------------------------------------------------
# A failing rank: it tells the others, on every live array
# ---------------------------------------------------------------------------

_arrays = _weakref.WeakSet()  # the live DistArrays of this process


def notify_failure(why="", exc=None):
    """Tells the other ranks that this one stops taking part: every live
    DistArray sends a notice to every other rank of its communicator, where
    the collective calls waiting for this rank give up with PeerError. The
    arrays of this process are then no longer usable. A DistArray used as a
    context manager does this when an exception leaves the block; a rank
    that dies of an uncaught exception does it too (sys.excepthook)."""
    if exc is not None:
        why = "%s: %s" % (type(exc).__name__, exc) if str(exc) else type(exc).__name__
    for a in list(_arrays):
        a._give_up(("@%d %s" % (a.rank, why))[:255], None)


def _peer_failed(e):
    """Another rank failed: this rank's arrays are given up too, and the
    notice goes on, naming that rank (a rank waiting on another array, or on
    a rank that is not a neighbour, learns it there)."""
    for a in list(_arrays):
        a._give_up(("@%d %s" % (e.rank, e.why))[:255], e)


_previous_hook = _sys.excepthook


def _excepthook(t, v, tb):
    try:
        if _arrays and not isinstance(v, PeerError):
            notify_failure(exc=v)
    finally:
        _previous_hook(t, v, tb)


_sys.excepthook = _excepthook

# ---------------------------------------------------------------------------
# The distributed array
# ---------------------------------------------------------------------------


def _destroy_local(ptr):
    _mpi.destroy(ptr, False)


def _device_for(device, local):
    """The device of this rank: a mapping.Device as given; else device (local
    rank modulo count) of the back end named (None: $MAPPING_BACKEND, or the
    default device's), one Device per (back end, index) in the process."""
    if isinstance(device, _mapping.Device):
        return device
    if device is not None and not isinstance(device, str):
        raise TypeError("DistArray: device must be a mapping.Device, a back end's name or None, got %s"
                        % type(device).__name__)
    backend = device or _os.environ.get("MAPPING_BACKEND") or _mapping.default_device().backend
    count = 1
    for b in _mapping.info()["backends"]:
        if b["name"] == backend and b["available"]:
            count = max(1, b["device_count"])
    return _mapping._implicit_device(backend, local % count)


def _shape(shape):
    if isinstance(shape, (int, _np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    shape = tuple(int(_mapping._index(s, "DistArray: shape")) for s in shape)
    if not shape or any(s < 0 for s in shape):
        raise ValueError("DistArray: shape %r: one or more sizes >= 0 (rows first)" % (shape,))
    return shape


class DistArray:
    """A global array of `shape` (rows first), split by rows over the ranks
    of `comm` (an mpi4py communicator; None: COMM_WORLD), each rank's block a
    mapping mirror on its device with `halo` copies of its neighbours' rows
    above and below (docs/mpi.md). Collective: every rank makes it, with the
    same shape, dtype and halo. `device`: a mapping.Device, a back end's name
    ("host", "opencl", "cuda"), or None ($MAPPING_BACKEND); by name, each rank
    takes device (rank within the node modulo the device count).

    The local block: `local` (numpy, host side, halos included), `owned`
    (numpy, the owned rows), `mirror` / `owned_mirror` (mapping.Mirror),
    `buffer` and `__dlpack__` (the device side), `cpu()` / `gpu()` access
    contexts (mapping_mirror_acquire_cpu / _gpu). Collective calls:
    scatter, gather, halo_exchange, the `delta` setter."""

    def __init__(self, comm=None, shape=None, dtype=_np.float64, halo=0, device=None, delta=False):
        self._h = None
        self._failure = None
        self.comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(self.comm, MPI.Comm):
            raise TypeError("DistArray: comm must be an mpi4py communicator, got %s" % type(comm).__name__)
        local = _mpi.local_rank(self.comm)  # collective: first, on every rank alike
        bad = None
        try:
            shape, dtype, halo = _shape(shape), _np.dtype(dtype), _mapping._index(halo, "DistArray: halo")
            if dtype.hasobject or dtype.itemsize == 0:
                raise TypeError("DistArray: dtype %s is not plain data" % dtype)
            if halo < 0:
                raise ValueError("DistArray: halo must be >= 0, got %d" % halo)
            dev = _device_for(device, local)
        except (TypeError, ValueError, Error) as e:
            bad = e  # still take part in the collective creation, so the other ranks fail too
        if bad is not None:
            self._create_failed(bad)
        rest = shape[1:]
        cols = int(_np.prod(rest)) if rest else 0
        ptr = self._create(shape[0], cols, dtype.itemsize, halo, dev)
        self._finish(ptr, shape, dtype, dev, delta)

    def _create_failed(self, bad):
        """Takes part with an invalid size (the others fail alike), then raises
        this rank's reason: as it is if it came from the library (the same on
        every rank, as a missing back end), else as InvalidArgumentError."""
        try:
            _mpi.create(self.comm, 2 ** 31, 0, 1, 0, None)
        except Error:
            pass
        if isinstance(bad, Error):
            raise bad
        raise _ERR["ERR_INVALID_ARGUMENT"](str(bad), -2) from bad

    def _create(self, rows, cols, itemsize, halo, dev):
        dh = dev._hold()
        try:
            return _mpi.create(self.comm, rows, cols, itemsize, halo, dh.ptr)
        except (PeerError, WaitTimeout) as e:
            if isinstance(e, PeerError):
                _peer_failed(e)
            raise
        except Error:
            raise
        except BaseException as e:
            notify_failure(exc=e)
            raise

    def _finish(self, ptr, shape, dtype, dev, delta):
        info = _mpi.info(ptr)
        self.device = dev
        self.shape = shape
        self.dtype = dtype
        self.rank, self.size = info["rank"], info["size"]
        self.halo = info["halo"]
        self.first_row, self.owned_rows = info["first_row"], info["owned_rows"]
        self.local_shape = (self.owned_rows + 2 * self.halo,) + shape[1:]
        self.cuda_aware = info["cuda_aware"]
        # The array's handle: destroyed (locally, no MPI wait) when the last
        # export (numpy view, DLPack capsule, mirror) has gone.
        self._h = _mapping._Handle(ptr, _destroy_local, dev._h, -1)
        self.mirror = self._borrow(info["mirror"], self.local_shape, None)
        self.owned_mirror = self._borrow(info["owned"], (self.owned_rows,) + shape[1:], self.mirror._lock)
        self._family = self.mirror._lock
        _arrays.add(self)
        if delta:
            self.delta = True

    def _borrow(self, ptr, shape, family):
        """A mapping.Mirror over a mirror the C array owns (never destroyed by
        Python), keeping the array's handle."""
        m = _mapping.Mirror(self.device, ptr, shape, self.dtype, keep=(self._h,), family=family)
        m._h.destroy = None
        return m

    def __repr__(self):
        return "<mapping.mpi.DistArray %s %s halo %d, rank %d/%d rows %d..%d%s>" % (
            self.shape, self.dtype, getattr(self, "halo", 0), getattr(self, "rank", -1), getattr(self, "size", 0),
            getattr(self, "first_row", 0), getattr(self, "first_row", 0) + getattr(self, "owned_rows", 0),
            " closed" if self._h is None else "")

    # ---- state ----
    def _hold(self):
        h = self._h
        if h is None or h.ptr is None:
            raise _ERR["ERR_INVALID_HANDLE"]("this DistArray is closed", -5)
        if self._failure is not None:
            raise self._failed()
        return h

    def _failed(self):
        e = self._failure
        if isinstance(e, PeerError):
            return PeerError(e.rank, e.why, e.status)
        return PeerError(self.rank, "this rank gave up: %s" % e.partition(" ")[2], -14)

    def _give_up(self, why, peer):
        """This process stops using the array: tell the other ranks (once)."""
        h = self._h
        if h is None or h.ptr is None or self._failure is not None:
            return
        self._failure = peer if peer is not None else why
        try:
            _mpi.notify(h.ptr, why)
        except Exception:  # pragma: no cover - a notice that cannot be sent
            pass

    def _collective(self, fn, *args):
        """fn(handle, *args), a collective C call, with the outcome handled:
        an agreed C error is raised as it is (every rank raises the same); a
        peer's failure or a give-up (signal, timeout) gives up every array."""
        h = self._h
        if h is None or h.ptr is None or self._failure is not None:
            h = self._hold()  # raises
        try:
            with self._family:
                return fn(h.ptr, *args)  # a notice that came already: PeerError, the call not made
        except BaseException as e:
            self._failed_call(e)
            raise

    @staticmethod
    def _failed_call(e):
        """After a collective call raised e: another rank's failure gives up
        this process's arrays too; a give-up here (a signal handler's
        exception while waiting, Ctrl-C, a timeout) tells the other ranks;
        an agreed library error (the same on every rank) changes nothing."""
        if isinstance(e, PeerError):
            _peer_failed(e)
        elif isinstance(e, WaitTimeout) or not isinstance(e, Error):
            notify_failure(exc=e)

    # ---- the local block ----
    @property
    def local(self):
        """The whole local block on the host (numpy, halo rows included; no sync: see cpu())."""
        return self.mirror.array

    @property
    def owned(self):
        """The owned rows on the host (numpy; no sync: see cpu())."""
        return self.owned_mirror.array

    @property
    def buffer(self):
        """The whole local block on the device (mapping.Buffer of local_shape; owned rows from row `halo`)."""
        return self.mirror.buffer.view(self.local_shape, self.dtype)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """The device side of the local block, as DLPack (halo rows included)."""
        return self.buffer.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        return self.mirror.buffer.__dlpack_device__()

    def cpu(self, access="rw", halo=False):
        """with a.cpu("r"|"w"|"rw") as x: x is the owned rows (halo=True: the
        whole block) on the host, synced before a read, marked after a write
        (mapping_mirror_acquire_cpu)."""
        return (self.mirror if halo else self.owned_mirror).cpu(access)

    def gpu(self, access="rw", stream=None, halo=False):
        """with a.gpu("r"|"w"|"rw", stream) as buf: the owned rows (halo=True:
        the whole block) synced to the device on `stream`, marked modified
        after a write, released at the end (mapping_mirror_acquire_gpu /
        release_gpu). buf is the whole local block's device Buffer
        (local_shape): the owned rows start at row `halo`."""
        m = self.mirror if halo else self.owned_mirror
        ctx = m.gpu(access, stream)

        class _Block:
            def __enter__(_self):
                gpu = ctx.__enter__()
                buf = self.mirror.buffer.view(self.local_shape, self.dtype)
                buf._stream = gpu._stream  # the stream of the access, for DLPack's and CUDA's consumers
                return buf

            def __exit__(_self, *exc):
                return ctx.__exit__(*exc)
        return _Block()

    # ---- collective calls ----
    def halo_exchange(self, stream=None):
        """Fills the halo rows from the neighbours (collective). stream: where
        your kernels run (None: blocking); the boundary rows are taken after
        the work queued there, and on other streams that wrote them through
        gpu(): no synchronize() first. Work you queue on `stream` afterwards
        sees the halos."""
        h = self._h
        if h is None or h.ptr is None or self._failure is not None:
            h = self._hold()  # raises
        sh = None if stream is None else getattr(stream, "_h", None)
        if sh is not None and (type(stream) is not _Stream or sh.ptr is None or sh.gen != sh.forks[0]):
            sh = _mapping._stream_hold(stream, self.device)  # raises, or imports a pyopencl queue
        elif sh is None and stream is not None:
            sh = _mapping._stream_hold(stream, self.device)
        try:  # _collective, inlined: this is the call of every step
            with self._family:
                _mpi.exchange(h.ptr, None if sh is None else sh.ptr)
        except BaseException as e:
            self._failed_call(e)
            raise

    def scatter(self, global_array, root=0):
        """Root's global array (shape and dtype of the DistArray; ignored on
        the other ranks) to every rank's owned rows, which become modified on
        the host. Collective. Halo rows are not filled: halo_exchange next."""
        root = _mapping._index(root, "scatter: root")
        buf = None
        if self.rank == root:
            try:
                buf = self._global_in(global_array)
            except (TypeError, ValueError) as e:
                self._agree_bad_root(e, _mpi.scatter, None)
        self._collective(_mpi.scatter, buf, root)

    def _global_in(self, g):
        arr = _np.asarray(g)
        if arr.shape != self.shape:
            raise ValueError("scatter: the global array has shape %s, the DistArray %s" % (arr.shape, self.shape))
        if arr.dtype != self.dtype:
            raise TypeError("scatter: the global array has dtype %s, the DistArray %s" % (arr.dtype, self.dtype))
        return _np.ascontiguousarray(arr)

    def _agree_bad_root(self, e, fn, *args):
        """Bad input on root: the same call with root -1 (every rank fails:
        the roots differ), then this rank raises its reason."""
        try:
            self._collective(fn, *args, -1)
        except Error:
            pass
        raise _ERR["ERR_INVALID_ARGUMENT"](str(e), -2) from e

    def gather(self, root=0, out=None, stream=None):
        """Every rank's owned rows (synced to the host after the work on
        `stream`, only what is stale) into one global numpy array on root,
        returned there (`out` if given); None on the other ranks. Collective."""
        root = _mapping._index(root, "gather: root")
        if self.rank == root:
            if out is None:
                out = _np.empty(self.shape, self.dtype)
            elif not isinstance(out, _np.ndarray) or out.shape != self.shape or out.dtype != self.dtype:
                self._agree_bad_root(ValueError("gather: out must be a numpy array of shape %s and dtype %s"
                                                % (self.shape, self.dtype)), _mpi.gather, None, None)
        else:
            out = None
        sh = _mapping._stream_hold(stream, self.device)
        self._collective(_mpi.gather, None if sh is None else sh.ptr, out, root)
        return out

    @property
    def delta(self):
        """Delta halos: exchanges send only the boundary bytes that changed
        since the last exchange (64-byte granules; docs/mpi.md). Setting it
        is collective (the same value on every rank)."""
        return _mpi.stats(self._hold().ptr)["delta"]

    @delta.setter
    def delta(self, on):
        self._collective(_mpi.set_delta, bool(on))

    def stats(self):
        """This rank's exchange statistics: exchanges, mpi_bytes_sent,
        mpi_bytes_received, delta_bytes_saved, delta (the device's own copy
        statistics: a.device.stats())."""
        return _mpi.stats(self._hold().ptr)

    # ---- lifetime ----
    def close(self):
        """Lets go of the array on this rank (no MPI wait: ranks may close in
        any order). Its memory is freed once no export (numpy view, DLPack
        capsule, mirror) uses it."""
        self._h = None
        _arrays.discard(self)
        for m in (getattr(self, "owned_mirror", None), getattr(self, "mirror", None)):
            if m is not None:
                m.close()

    @property
    def closed(self):
        return self._h is None

    def __enter__(self):
        return self

    def __exit__(self, t, v, tb):
        if v is not None and not isinstance(v, PeerError):
            notify_failure(exc=v)  # the other ranks must not wait for this one
        self.close()
        return False

    def __copy__(self):
        raise TypeError("a mapping.mpi.DistArray cannot be copied")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce_ex__(self, protocol):
        raise TypeError("a mapping.mpi.DistArray cannot be pickled: gather() it")


def cuda_aware():
    """True where this MPI moves CUDA device memory itself (MPIX_Query_cuda_support)."""
    query = getattr(MPI, "Query_cuda_support", None)
    return bool(query()) if query is not None else False


__all__ = ["DistArray", "PeerError", "WaitTimeout", "notify_failure", "set_timeout", "get_timeout", "cuda_aware",
           "MPI"]
