"""Fourth hostile round: what ordinary or hostile Python code did to the
package that crashed, hung, leaked or gave wrong data, one test per bug.
Cases that crashed or hung the interpreter run in their own process (and
the new hostile cases through tests/python/hostile/run.py)."""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import mapping

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mapping.__file__)))
HOSTILE_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile", "run.py")
PROLOGUE = "import gc, os, sys, time, threading\nimport numpy as np\nimport mapping\nfrom mapping import _core\n"


def run_isolated(code, backend="host", timeout=60, prologue=PROLOGUE):
    """Runs code in a fresh interpreter with this package; returns its
    output. A crash, a hang (timeout) or a failed assertion fails the test."""
    e = dict(os.environ)
    e["PYTHONPATH"] = PKG_ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e["MAPPING_BACKEND"] = backend
    try:
        r = subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)], env=e, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as t:
        raise AssertionError("hung: no exit within %d s\n--- stdout\n%s\n--- stderr\n%s"
                             % (timeout, t.stdout, t.stderr)) from None
    assert r.returncode == 0, "exit status %d\n--- stdout\n%s\n--- stderr\n%s" % (r.returncode, r.stdout, r.stderr)
    return r.stdout


def threads():
    return len(os.listdir("/proc/self/task"))


# ---- C objects let go of inside a launch_host function leaked ----

def test_objects_dropped_inside_a_host_function_are_destroyed_not_leaked():
    # The last reference to a stream (or its device) dropped inside a function
    # running on that stream: the library refuses to destroy a stream, a device
    # or a pipeline from a function on its own stream (it would wait for
    # itself), so each was leaked silently, with its worker thread.
    dev0 = mapping.open("host")
    before = threads()
    for i in range(30):
        dev = mapping.open("host") if i % 2 else dev0
        s = dev.stream()
        holder = [s, dev, dev.allocate_gpu(1 << 16), mapping.mirror(4096, device=dev)]
        ran = threading.Event()

        def fn(holder=holder, ran=ran):
            holder.clear()
            ran.set()
        mapping.launch_host(s, fn)
        del s, dev
        assert ran.wait(10)
        mapping._core.drain()  # what the function let go of is destroyed on this thread
    mapping._core.drain()
    assert threads() <= before + 2, (before, threads())
    b = dev0.allocate_gpu(16)
    b.fill(3)
    assert (b.get() == 3).all()


# ---- interpreter exit with a launch_host function still queued hung ----

def test_exit_with_a_queued_host_function_runs_it_and_exits():
    # At finalization the stream's destroy waited for the function, whose thread
    # can no longer take the GIL: the exit hung for good.
    out = run_isolated("""
        import functools
        s = mapping.stream()
        b = mapping.allocate_gpu(64 << 20)
        mapping.sync_to_gpu(np.ones(64 << 20, np.uint8), b, stream=s)   # keeps the stream busy a while
        mapping.launch_host(s, functools.partial(os.write, 1, b"fn ran\\n"))
        print("leaving", flush=True)
    """, timeout=60)
    assert "leaving" in out and "fn ran" in out, out


def test_exit_with_a_host_function_queued_after_mappings_atexit_does_not_hang():
    # atexit handlers run last-in first-out: one registered before `import
    # mapping` runs after the package's own, and its function is still queued
    # at finalization; the exit must end all the same.
    out = run_isolated("""
        import atexit, functools, os
        import numpy as np

        def late():
            import mapping
            s = mapping.stream()
            b = mapping.allocate_gpu(64 << 20)
            mapping.sync_to_gpu(np.ones(64 << 20, np.uint8), b, stream=s)
            mapping.launch_host(s, functools.partial(os.write, 1, b""))
            globals()["_left"] = (s, b)
            print("late queued", flush=True)
        atexit.register(late)
        import mapping
        print("leaving", flush=True)
    """, prologue="", timeout=60)
    assert "late queued" in out, out


# ---- FamilyLock made with __new__ alone: NULL lock ----

def test_family_lock_made_without_init_does_not_crash():
    out = run_isolated("""
        m = mapping.mirror(64)
        for cls in (type(m._lock), _core.FamilyLock):
            lock = cls.__new__(cls)
            with lock:                      # dereferenced a NULL lock (SIGSEGV)
                assert lock.locked() and lock._is_owned()
            assert not lock.locked()
            lock.pending = 1
            try:
                lock.reap()
            except AttributeError:          # no _reap_locked / orphans: a clean error
                pass
        print("ok")
    """)
    assert "ok" in out


# ---- os.fork() while another thread held a family lock: the child hung ----

def test_fork_child_uses_a_family_another_parent_thread_held():
    out = run_isolated("""
        m = mapping.mirror((1 << 16,), np.float32)
        m.sync_to_gpu()
        held, release = threading.Event(), threading.Event()

        def holder():
            with m._lock:                   # as a sync on another thread does
                held.set()
                release.wait(30)
        t = threading.Thread(target=holder)
        t.start()
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                m.array[5] = 2.0
                m.mark_cpu_modified(5)      # waited for the parent's thread, which the child lacks
                m.sync_to_gpu()
                assert m.stale_bytes("gpu") == 0
                code = 0
            finally:
                os._exit(code)
        release.set()
        t.join()
        end = time.monotonic() + 30
        while time.monotonic() < end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung")
        assert status == 0, status
        m.mark_cpu_modified(); m.sync_to_gpu()   # the parent's lock is its own still
        print("ok")
    """)
    assert "ok" in out


def test_fork_child_opens_a_device_while_a_parent_thread_held_the_registry():
    # default_device() in the child waited for the registry lock a parent thread
    # held (opening a device, which takes a second on OpenCL)
    out = run_isolated("""
        held, release = threading.Event(), threading.Event()

        def opener():
            with mapping._registry_lock:
                held.set()
                release.wait(30)
        t = threading.Thread(target=opener)
        t.start()
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                b = mapping.allocate_gpu(16)      # opens the default device
                b.fill(1)
                code = 0 if (b.get() == 1).all() else 4
            finally:
                os._exit(code)
        release.set()
        t.join()
        end = time.monotonic() + 30
        while time.monotonic() < end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung")
        assert status == 0, status
        print("ok")
    """)
    assert "ok" in out


# ---- Pipeline.run with dst overlapping src: silently wrong data ----

@pytest.mark.parametrize("depth", [1, 2])
def test_pipeline_refuses_a_dst_overlapping_src(depth):
    dev = mapping.open("host")
    k = 4096
    p = mapping.pipeline(dev, chunk_bytes=k, depth=depth)

    def step(s, c):
        mapping.copy_gpu(c.input, c.output, c.nbytes, c.input_offset, c.output_offset, stream=s)
    a = (np.arange(16 * k) // k).astype(np.uint8)
    ref = a.copy()
    # each chunk's output overwrote the next chunk's input before it was read
    with pytest.raises(mapping.InvalidArgumentError, match="overlaps"):
        p.run(a[:-k], a[k:], step)
    with pytest.raises(mapping.InvalidArgumentError, match="overlaps"):
        p.run(a[k:], a[:-k], step)
    assert (a == ref).all()
    p.run(a, a, step)                    # in place: each chunk is read before it is written
    assert (a == ref).all()
    out = np.zeros_like(a)
    p.run(a, out, step)
    assert (out == ref).all()


def test_pipeline_depth_past_1024_is_a_value_error_as_documented():
    # docs/python.md rule 9: a pipeline depth past 1024 raises ValueError; one
    # past a C long raised OverflowError
    for depth in (1025, 2 ** 63, 2 ** 70):
        with pytest.raises(ValueError, match="depth"):
            mapping.pipeline(mapping.open("host"), depth=depth)


# ---- with m.cpu("w") / m.gpu("w"): "marks after" marked only before ----

@pytest.mark.parametrize("access", ["rw", "w"])
def test_cpu_block_marks_after_a_sync_inside_it(device, access):
    # the C acquire marks at the start; a sync inside the block (a helper, or
    # another thread: the block holds no lock) took that mark, and the writes
    # after it were never sent: stale_bytes said 0, the device had old data
    m = mapping.mirror((1024,), np.float32, device=device)
    m.sync_to_gpu()
    with m.cpu(access) as a:
        a[0] = 1
        m.sync_to_gpu()
        a[1] = 2
    assert m.stale_bytes("gpu") > 0
    m.sync_to_gpu()
    g = m.buffer.view((m.buffer.nbytes // 4,), np.float32).get()[m.gpu_offset // 4:][:1024]
    assert g[0] == 1 and g[1] == 2
    with m.cpu(access) as a:              # closed inside the block: nothing to mark, no error
        m.close()


@pytest.mark.parametrize("access", ["rw", "w"])
def test_gpu_block_marks_after_a_sync_inside_it(device, access):
    m = mapping.mirror((1024,), np.uint8, device=device)
    m.sync_to_gpu()
    with m.gpu(access) as buf:
        m.sync_to_cpu()                   # before the device work was queued
        mapping.fill_gpu(buf, 7, offset=m.gpu_offset, nbytes=1024)
    m.sync_to_cpu()
    assert (m.array == 7).all()           # was all 0: the CPU side counted as valid


def test_cpu_block_marks_after_a_sync_on_another_thread():
    m = mapping.mirror((1 << 16,), np.float32)
    m.sync_to_gpu()
    inside, synced = threading.Event(), threading.Event()

    def other():
        inside.wait(10)
        m.sync_to_gpu()
        synced.set()
    t = threading.Thread(target=other)
    t.start()
    with m.cpu("w") as a:
        inside.set()
        assert synced.wait(10)
        a[:] = 5                          # after the other thread's sync
    t.join()
    m.sync_to_gpu()
    assert (m.buffer.view((1 << 16,), np.float32).get() == 5).all()


# ---- every pyopencl.CommandQueue used as a stream was kept for good ----

def test_pyopencl_queues_used_once_are_not_kept_for_good():
    cl = pytest.importorskip("pyopencl")
    try:
        ctx = cl.Context(cl.get_platforms()[0].get_devices()[:1])
    except Exception as e:  # pragma: no cover - no OpenCL device
        pytest.skip("no OpenCL device for pyopencl: %s" % e)
    dev = mapping.open(context=ctx)
    b = dev.allocate_gpu(4096)
    for i in range(60):                   # a queue per task, dropped after it
        q = cl.CommandQueue(ctx)
        mapping.sync_to_gpu(np.full(4096, i, np.uint8), b, stream=q)
        q.finish()
        del q
    assert len(dev._imported_queues) <= 17, len(dev._imported_queues)  # was 60: one per queue, for good
    assert b.get()[0] == 59
    held = [cl.CommandQueue(ctx) for _ in range(30)]
    streams = [mapping.import_stream(q) for q in held]
    for q, s in zip(held, streams):       # queues still held are found again
        assert mapping.import_stream(q) is s
    dev.close()


# ---- sub-array dtypes: numpy expands them into the shape ----

def test_subarray_dtypes_join_the_shape_as_in_numpy():
    dt = np.dtype((np.float32, (3,)))
    b = mapping.allocate_gpu((4,), dt)
    assert b.shape == (4, 3) and b.dtype == np.float32  # np.empty((4,), dt).shape
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    mapping.sync_to_gpu(x, b)
    assert (b.get() == x).all()           # get() raised TypeError (float32 vs ('<f4', (3,)))
    m = mapping.mirror((4,), dt)
    assert m.array.shape == (4, 3)        # .array raised "cannot reshape"
    m.array[1] = 7
    m.mark_cpu_modified(1)
    assert m.stale_bytes("gpu") == 48     # a new mirror's device side is all stale
    m.sync_to_gpu()
    assert m[1:2].shape == (1, 3)
    v = mapping.allocate_gpu(48).view((4,), dt)
    assert v.shape == (4, 3) and v.get().shape == (4, 3)
    assert mapping.allocate_cpu((2,), dt).shape == (2, 3)


# ---- the same, each in its own process through the hostile runner ----

ROUND4_CASES = ["gc.exit_with_a_queued_host_function", "misc.family_lock_without_init",
                "life.fork_child_with_a_family_lock_a_parent_thread_held", "host_fn.drops_its_own_stream_and_device",
                "misc.pipeline_dst_overlapping_src"]


def test_round4_hostile_cases_each_in_its_own_process():
    args = []
    for name in ROUND4_CASES:
        args += ["-k", name]
    p = subprocess.run([sys.executable, HOSTILE_RUN, "--backend", "host"] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    last = p.stdout.strip().splitlines()[-1]
    assert p.returncode == 0 and last.endswith(" 0 failed"), p.stdout[-4000:]
    assert int(last.split()[1]) == len(ROUND4_CASES), p.stdout[-4000:]
