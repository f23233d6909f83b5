"""Interpreter exit with stream work still queued: no call into Python after
finalization, whatever is queued.

An exit handler registered before `import mapping` runs after the package's
own, so the stream work it queues can still be running when the interpreter
is freed. A stream's thread then called Py_AddPendingCall (a copy's record)
or took the GIL (a launch_host function) on a freed interpreter: a segfault
at exit in about 1 run in 4 of such a program. 200 runs here, each a forked
child that exits through the interpreter's own finalization."""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

import mapping

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mapping.__file__)))
RUNS = 200

# The parent imports mapping once (a fresh interpreter per run costs ~0.4 s
# of CPU; a fork ~25 ms) and forks RUNS children, up to PARALLEL at a time.
# Each child:
# - puts an exit handler after the package's (as one registered before
#   `import mapping` is) that queues a copy (0.5 s on the modelled link), a
#   launch_host function fn1 (at exit, launch_host waits for it: it runs), and
#   from fn1 another copy and fn2 on a second stream, which nothing waits
#   for: they complete during or after finalization;
# - leaks the streams and buffers, so finalization destroys nothing that
#   would wait for them;
# - exits with status 1 through glibc's on_exit(sleep), which sleeps 1 s
#   after the interpreter is freed: the copies complete in that window,
#   where the old package called Py_AddPendingCall on the freed
#   interpreter (a segfault in every run on an idle machine).
DRIVER = textwrap.dedent(r"""
    import atexit, ctypes, gc, os, sys
    import numpy as np
    import mapping
    from mapping import _core

    RUNS, PARALLEL = int(sys.argv[1]), int(sys.argv[2])
    r, w = os.pipe()


    def child():
        def late():
            s, s2 = mapping.stream(), mapping.stream()
            b, b2 = mapping.allocate_gpu(4096), mapping.allocate_gpu(4096)
            data = np.ones(4096, np.uint8)
            mapping.sync_to_gpu(data, b, stream=s)

            def fn2():
                os.write(w, b"2")

            def fn1():
                os.write(w, b"1")
                mapping.sync_to_gpu(data, b2, stream=s2)
                mapping.launch_host(s2, fn2)
            mapping.launch_host(s, fn1)
            for o in (s, s2, b, b2, data):
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(o))
            _core.drain()  # no drain pending: the next record's completion asks for one
        atexit.unregister(mapping._finish_host_functions_at_exit)
        atexit.register(late)
        atexit.register(mapping._finish_host_functions_at_exit)
        libc = ctypes.CDLL(None)
        libc.on_exit(ctypes.cast(libc.sleep, ctypes.c_void_p), None)  # exit(1): sleep(1) after finalization
        sys.exit(1)


    gc.freeze()
    running, statuses = set(), {}
    for i in range(RUNS):
        while len(running) >= PARALLEL:
            pid, st = os.wait()
            running.discard(pid)
            statuses[st] = statuses.get(st, 0) + 1
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child()
        running.add(pid)
    while running:
        pid, st = os.wait()
        running.discard(pid)
        statuses[st] = statuses.get(st, 0) + 1
    os.close(w)
    out = b""
    while True:
        d = os.read(r, 4096)
        if not d:
            break
        out += d
    print("statuses", sorted(("signal %d" % (s & 0x7f) if s & 0x7f else "exit %d" % (s >> 8), n)
                             for s, n in statuses.items()))
    print("fn1", out.count(b"1"), "fn2", out.count(b"2"))
""")


def env(**extra):
    e = dict(os.environ)
    e["PYTHONPATH"] = PKG_ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.update(extra)
    return e


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "on_exit"), reason="needs glibc's on_exit")
def test_exit_with_stream_work_queued_by_a_late_exit_handler_never_crashes_200_runs():
    r = subprocess.run([sys.executable, "-c", DRIVER, str(RUNS), "100"], capture_output=True, text=True,
                       timeout=240, env=env(MAPPING_BACKEND="host", MAPPING_HOST_LINK="1e9,0.5"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "statuses [('exit 1', %d)]" % RUNS in r.stdout, r.stdout + r.stderr[-3000:]
    # at exit, launch_host waits for its function: it runs while Python can run it
    assert "fn1 %d " % RUNS in r.stdout, r.stdout + r.stderr[-3000:]


# The issue's own program, in fresh interpreters, on each back end.
LATE_HANDLER = textwrap.dedent(r"""
    import atexit, os, sys
    import numpy as np

    def late():
        import mapping
        s = mapping.stream()
        b = mapping.allocate_gpu(16 << 20)
        mapping.sync_to_gpu(np.ones(16 << 20, np.uint8), b, stream=s)
        mapping.launch_host(s, lambda: os.write(1, b"fn ran\n"))
        mapping.sync_to_gpu(np.ones(16 << 20, np.uint8), b, stream=s)
        globals()["_left"] = (s, b)
    atexit.register(late)
    import mapping
""")


def test_exit_handler_registered_before_import_queues_stream_work():
    info = {b["name"]: b for b in mapping.info()["backends"]}
    backends = [b for b in ("host", "opencl", "host") if info.get(b, {}).get("available")]
    procs = [subprocess.Popen([sys.executable, "-c", LATE_HANDLER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env(MAPPING_BACKEND=b)) for b in backends]
    for b, p in zip(backends, procs):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, "%s: exit status %d\n%s\n%s" % (b, p.returncode, out, err)
        assert out.count("fn ran") == 1, b + ": " + out + err
