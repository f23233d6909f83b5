"""Third hostile round: what ordinary or hostile Python code did to the
package that crashed, hung or corrupted memory, one test per bug. Cases
that crashed the interpreter run in their own process."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mapping

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mapping.__file__)))


def run_isolated(code, backend="host", timeout=60):
    """Runs code in a fresh interpreter with this package; returns its
    output. A crash, a hang or a failed assertion fails the test."""
    e = dict(os.environ)
    e["PYTHONPATH"] = PKG_ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e["MAPPING_BACKEND"] = backend
    if backend == "opencl":
        e["MAPPING_DEVICE"] = "0"
    prologue = "import gc, os, sys, time\nimport numpy as np\nimport mapping\nfrom mapping import _core\n"
    r = subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)], env=e, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, "exit status %d\n--- stdout\n%s\n--- stderr\n%s" % (r.returncode, r.stdout, r.stderr)
    return r.stdout


def opencl_available():
    try:
        return any(b["name"] == "opencl" and b["available"] for b in mapping.info()["backends"])
    except Exception:  # pragma: no cover
        return False


# ---- HostMemory.__init__ again: the owner was dropped under live views ----

def test_host_memory_second_init_is_refused():
    # a.base.base.obj is the HostMemory of an allocate_cpu array or a mirror's
    # array; a second __init__ used to drop its owner (freeing the page-locked
    # memory or the mirror) while the array still pointed there.
    out = run_isolated("""
        dev = mapping.open("host")
        a = mapping.allocate_cpu((1 << 20,), np.uint8, device=dev)
        a[:] = 7
        mem = a.base.base.obj
        assert type(mem) is _core.HostMemory
        try:
            mem.__init__(0, 0, None)
        except TypeError as e:
            print("refused:", e)
        gc.collect()
        b = mapping.allocate_cpu((1 << 20,), np.uint8, device=dev)
        b[:] = 9
        assert (a == 7).all()
        m = mapping.mirror((1 << 18,), np.float32, device=dev)
        arr = m.array
        try:
            arr.base.base.obj.__init__(0, 0, None)
        except TypeError:
            pass
        m.close()
        del m
        gc.collect()
        arr[:] = 1.0                       # still the mirror's memory
        assert arr.sum() == 1 << 18
        try:
            _core.HostMemory(0, -1, None)
        except ValueError:
            print("negative refused")
    """)
    assert "refused: HostMemory is initialized once" in out
    assert "negative refused" in out


# ---- os.fork() with open streams: the child hung destroying them ----

FORK_PROLOGUE = """
    dev = mapping.open()
    s = dev.stream()
    g = dev.allocate_gpu(1 << 20)
    m = mapping.mirror((1 << 16,), np.float32, device=dev)
    a = mapping.allocate_cpu(1 << 16, device=dev)
    p = mapping.pipeline(dev, chunk_bytes=4096)
    x = np.arange(1 << 18, dtype=np.uint8)
    mapping.sync_to_gpu(x, g, stream=s)
    mapping.launch_host(s, lambda: None)
    s.synchronize()                       # the stream's worker now waits for work

    def wait_child(pid, seconds=30):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            time.sleep(0.01)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child hung")
"""


def test_fork_child_closes_and_exits_with_inherited_objects():
    # the child destroyed the parent's stream at close() / exit: a join of a
    # worker thread the child does not have, and a condition variable's
    # destroy that waits for that thread (hung for good)
    out = run_isolated(FORK_PROLOGUE + """
    pid = os.fork()
    if pid == 0:
        m.close(); g.close(); s.close(); p.close(); dev.close()
        del s, g, m, a, p, dev
        gc.collect()
        os._exit(0)
    assert wait_child(pid) == 0
    pid = os.fork()
    if pid == 0:
        sys.exit(0)                       # left open for the interpreter's exit
    assert wait_child(pid) == 0
    s.synchronize(); m.sync_to_gpu()      # the parent's objects are untouched
    p.run(x[:8192], None, lambda st, c: None)
    print("parent ok")
    """)
    assert "parent ok" in out


def test_fork_child_refuses_inherited_streams_and_uses_new_ones():
    # the child queued work on a stream whose worker thread is the parent's:
    # a synchronize() then waited for ever
    out = run_isolated(FORK_PROLOGUE + """
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            try:
                mapping.sync_to_gpu(x, g, stream=s)
                code = 10
            except mapping.InvalidHandleError as e:
                assert "os.fork()" in str(e), e
            for f in (s.synchronize, s.record, lambda: mapping.launch_host(s, print),
                      lambda: m.sync_to_gpu(stream=s), lambda: p.run(x[:8192], None, lambda st, c: None)):
                try:
                    f()
                    code = 11
                except mapping.InvalidHandleError:
                    pass
            y = np.zeros_like(x)
            mapping.sync_to_cpu(g, y)     # blocking calls need no stream
            assert (y == x).all()
            m.array[:] = 1
            m.mark_cpu_modified()
            m.sync_to_gpu()
            s2 = dev.stream()             # the child's own stream works
            mapping.sync_to_gpu(x[::-1].copy(), g, stream=s2)
            s2.synchronize()
            s2.close()
            b = mapping.allocate_cpu(1 << 16, device=dev)
            del b
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 12
        sys.stdout.flush()
        os._exit(code)
    assert wait_child(pid) == 0
    s.synchronize()
    print("parent ok")
    """)
    assert "parent ok" in out


@pytest.mark.skipif(not opencl_available(), reason="no OpenCL device")
def test_fork_child_exits_on_opencl():
    # PoCL's threads are the parent's: the child must not call the driver to
    # destroy what it inherited (documented: not usable in the child)
    out = run_isolated(FORK_PROLOGUE + """
    pid = os.fork()
    if pid == 0:
        del s, g, m, a, p
        gc.collect()
        sys.exit(0)
    assert wait_child(pid) == 0
    s.synchronize()
    print("parent ok")
    """, backend="opencl")
    assert "parent ok" in out


# ---- an exception from a signal handler right after a copy was queued ----

INTERRUPT_AFTER_QUEUE = """
    import linecache, re, threading
    QUEUES = re.compile(r"_core\\.(write|read)\\(sh\\.ptr|_queue\\(sh|_core\\.batch_add\\(")

    def interrupt_after_queue(fn, *args, code=None, **kw):
        # raises KeyboardInterrupt at the first line of fn (or of the
        # function of `code` it calls) after the one that queues the copy:
        # where Ctrl-C's handler runs if the signal comes while the copy is
        # being queued
        code = code or fn.__code__
        lines = [n for n in range(code.co_firstlineno, code.co_firstlineno + 200)
                 if QUEUES.search(linecache.getline(code.co_filename, n))]
        assert lines, "no queueing line in %s" % code.co_name
        fired = []

        def local(frame, event, arg):
            if event == "line" and frame.f_lineno > lines[0] and not fired:
                fired.append(frame.f_lineno)
                raise KeyboardInterrupt("simulated Ctrl-C")
            return local

        def glob(frame, event, arg):
            return local if frame.f_code is code else None
        sys.settrace(glob)
        try:
            fn(*args, **kw)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        return fired

    dev = mapping.open("host")
    s = dev.stream()
    g = dev.allocate_gpu(1 << 22)
    gate = threading.Event()
    mapping.launch_host(s, gate.wait)     # the copies stay queued behind it
    src = bytearray(b"\\x07" * (1 << 22))
    interrupt_after_queue(mapping.sync_to_gpu, src, g, stream=s)
    try:
        src.extend(b"more")
        gate.set()                        # let the stream go: the process can end
        raise AssertionError("resized under the queued copy: its record was lost")
    except BufferError:
        pass
    dst = bytearray(1 << 22)
    interrupt_after_queue(mapping.sync_to_cpu, g, dst, stream=s)
    try:
        dst.extend(b"more")
        gate.set()                        # let the stream go: the process can end
        raise AssertionError("resized under the queued copy: its record was lost")
    except BufferError:
        pass
    del src
    gc.collect()
    junk = [bytearray(b"\\x01" * (1 << 22)) for _ in range(4)]
    gate.set()
    s.synchronize()
    assert dst == b"\\x07" * (1 << 22)
    dst.extend(b"more")                   # done: released
    print("held")
"""


def test_interrupt_right_after_a_queued_copy_keeps_its_buffers():
    # a KeyboardInterrupt between the queued copy and the record that holds
    # its host buffer let the buffer be resized or freed under the copy
    # (a segfault, or wrong data)
    out = run_isolated(INTERRUPT_AFTER_QUEUE)
    assert "held" in out


def test_interrupt_right_after_a_batch_add_keeps_its_buffer():
    # the C batch had the host pointer, the Python batch no record of it:
    # the flush copied from freed memory (a segfault)
    out = run_isolated(INTERRUPT_AFTER_QUEUE.split("    dev = mapping.open")[0] + """
    dev = mapping.open("host")
    g = dev.allocate_gpu(1 << 22)
    b = dev.batch()
    src = bytearray(b"\\x07" * (1 << 22))
    interrupt_after_queue(b.add_to_gpu, src, g, code=mapping.Batch._add.__code__)
    assert len(b) == 1
    try:
        src.extend(b"more")
        raise AssertionError("resized under the batch's copy: its record was lost")
    except BufferError:
        pass
    del src
    gc.collect()
    junk = [bytearray(b"\\x01" * (1 << 22)) for _ in range(4)]
    b.flush()
    assert (g.get() == 7).all()
    print("held")
    """)
    assert "held" in out


def test_queued_keeps_on_failure_only_when_asked():
    dev = mapping.open("host")
    s = dev.stream()
    data = bytearray(16)
    pin = mapping._core.pin(data, False, "data")

    def fails():
        raise mapping.InvalidArgumentError("no", -2)
    with pytest.raises(mapping.InvalidArgumentError):
        mapping._core.queued(s._hold().ptr, (pin,), False, fails)
    with pytest.raises(mapping.InvalidArgumentError):
        mapping._core.queued(s._hold().ptr, (pin,), True, fails)
    del pin
    s.synchronize()
    data.extend(b"x")                     # both records are gone once the stream passed them
    assert mapping._core.queued(s._hold().ptr, (), False, len, b"abc") == 3
    s.close()
    dev.close()


# ---- a __dlpack_device__ that lies about where the capsule's memory is ----

@pytest.mark.skipif(not opencl_available(), reason="no OpenCL device")
def test_dlpack_device_must_match_the_capsule():
    # a cl_mem imported as host memory was read and written as such (a
    # segfault, or PoCL's memory overwritten), and a host pointer as a cl_mem
    out = run_isolated("""
        host = mapping.open("host")
        cl = mapping.open("opencl", 0)
        cb = cl.allocate_gpu((1024,), np.float32)
        hb = host.allocate_gpu((1024,), np.float32)
        mapping.sync_to_gpu(np.arange(1024, dtype=np.float32), cb)

        class Liar:
            def __init__(self, inner, dev):
                self.inner, self.dev = inner, dev

            def __dlpack__(self, stream=None, **kw):
                return self.inner.__dlpack__(stream=stream)

            def __dlpack_device__(self):
                return self.dev
        for obj, dev in ((Liar(cb, (1, 0)), host), (Liar(hb, (4, 0)), cl)):
            try:
                mapping.from_dlpack(obj, device=dev).fill(0)
                raise SystemExit("imported memory of another device")
            except mapping.DeviceMismatchError as e:
                assert "DLPack device" in str(e), e
        gc.collect()
        assert (cb.get() == np.arange(1024, dtype=np.float32)).all()
        cb.close(); hb.close(); cl.close(); host.close()
        print("refused")
    """, backend="opencl")
    assert "refused" in out


def test_dlpack_host_import_still_works():
    dev = mapping.open("host")
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = mapping.from_dlpack(a, device=dev)
    assert b.shape == (3, 4) and (b.get() == a).all()
    src = dev.allocate_gpu((5,), np.float64)
    src.fill(0)
    c = mapping.from_dlpack(src, device=dev)
    assert (c.get() == 0).all()
    b.close(); c.close(); src.close(); dev.close()


# ---- a launch_host function waiting for an event behind itself ----

def test_host_function_waiting_for_a_later_event_of_its_own_stream_raises():
    # waited for good: the event comes after the function on its stream
    out = run_isolated("""
        dev = mapping.open("host")
        s, other = dev.stream(), dev.stream()
        before = s.record()
        seen = []

        def fn():
            before.synchronize()          # before the function: done
            other.record().synchronize()  # another stream: fine
            try:
                s.record().synchronize()
            except mapping.BusyError as e:
                seen.append(str(e))
            s.record().synchronize()      # raised again, by s.synchronize()
        mapping.launch_host(s, fn)
        try:
            s.synchronize()
            raise SystemExit("no error")
        except mapping.BusyError:
            pass
        assert seen and "wait for itself" in seen[0], seen
        e = s.record()
        e.synchronize()                   # outside a host function: as before
        s.close(); other.close(); dev.close()
        print("refused")
    """, timeout=30)
    assert "refused" in out


# ---- shape, dtype and nbytes are plain attributes: exports use the C sizes ----

def test_tampered_attributes_never_export_past_the_memory():
    # the DLPack export used the Buffer's attributes, the mirror's array its
    # nbytes: numpy then read and wrote past the memory (a segfault)
    out = run_isolated("""
        dev = mapping.open("host")
        for tamper in ("shape", "dtype", "nbytes", "empty"):
            b = dev.allocate_gpu((16,), np.uint8) if tamper != "empty" else dev.allocate_gpu(0)
            if tamper == "shape":
                b.shape = (1 << 28,)
            elif tamper == "dtype":
                b.dtype = np.dtype(np.float64)
            elif tamper == "nbytes":
                b.nbytes = 1 << 28
                b.shape = (1 << 28,)
            else:
                b.shape = (1 << 20,)
            try:
                v = np.from_dlpack(b)
                v[:] = 1
                raise SystemExit("exported %s past the buffer" % (v.shape,))
            except BufferError as e:
                assert "does not fit" in str(e), e
        b = dev.allocate_gpu((16,), np.float32)
        v = b.view((4, 4))
        assert np.from_dlpack(v).shape == (4, 4)          # untampered exports as before
        m = mapping.mirror((1 << 10,), np.float32, device=dev)
        m.nbytes = 1 << 30
        m.shape = (1 << 28,)
        try:
            m.array[:] = 1
            raise SystemExit("a mirror array past its memory")
        except ValueError:
            pass
        mm = mapping.multimirror([dev], (1 << 10,), np.float32)
        mm.nbytes = 1 << 30
        mm.shape = (1 << 28,)
        try:
            mm.array[:] = 1
            raise SystemExit("a multimirror array past its memory")
        except ValueError:
            pass
        print("refused")
    """)
    assert "refused" in out
