#!/usr/bin/env python3
"""The hostile suite's runner (issue 23): what a careless or hostile user does
with the `mapping` package, each case in its own process.

    python3 tests/python/hostile/run.py [-k PATTERN] [--backend host|opencl|host,opencl] [-j N] [--list]

The cases are in cases.py (a table: name, expected outcome, back ends). Each
runs as `run.py --one NAME` in a fresh interpreter with $MAPPING_BACKEND set,
under a timeout, and is reported as
  pass   the expected outcome (the expected exception, or "ok" with its result checked)
  fail   another outcome (wrong exception, no exception, SystemError, wrong data)
  CRASH  a signal, a sanitizer report, or a non-zero exit without a Python result
  HANG   the timeout passed
The last line is `hostile: N passed, N failed` (failed counts fail, CRASH and
HANG); the exit status is 1 when any case did not pass, 2 on bad usage.
The package is the one `import mapping` finds (PYTHONPATH=build/python for a
build tree). Under an ASan build of the extension, run with LD_PRELOAD of
libasan and ASAN_OPTIONS=detect_leaks=0: a report is a CRASH.
"""
import argparse
import fnmatch
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = "@@hostile-result "
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer",
                   "ThreadSanitizer", "Fatal Python error")


def _load_cases():
    sys.path.insert(0, HERE)
    import cases  # noqa: E402  (the table; imports numpy and mapping)
    return cases


# ---------------------------------------------------------------------------
# child: one case in this process
# ---------------------------------------------------------------------------

def _run_one(name):
    import faulthandler
    faulthandler.enable()
    try:
        cases = _load_cases()
        case = cases.CASES[name]
    except Exception:
        traceback.print_exc()
        print(MARK + "fail could not load the case: %s" % sys.exc_info()[1], flush=True)
        return 0
    verdict = cases.judge(case)
    print(MARK + verdict, flush=True)
    return 0


# ---------------------------------------------------------------------------
# parent
# ---------------------------------------------------------------------------

def _classify(proc_rc, out, err, timed_out):
    if timed_out:
        return "HANG", "no result within the timeout"
    verdict = None
    for line in out.splitlines():
        if line.startswith(MARK):
            verdict = line[len(MARK):]
    sanitizer = next((m for m in SANITIZER_MARKS if m in err), None)
    if proc_rc < 0:
        try:
            sig = signal.Signals(-proc_rc).name
        except ValueError:
            sig = "signal %d" % -proc_rc
        where = "after the case returned (%s)" % verdict if verdict else "during the case"
        return "CRASH", "%s %s" % (sig, where)
    if sanitizer:
        return "CRASH", "%r in stderr (exit %d)" % (sanitizer, proc_rc)
    if verdict is None:
        return "CRASH", "exit %d without a result" % proc_rc
    if proc_rc != 0:
        return "CRASH", "exit %d after the case (%s)" % (proc_rc, verdict)
    if verdict.startswith("pass"):
        return "pass", verdict[5:]
    return "fail", verdict[5:] if verdict.startswith("fail") else verdict


def _spawn(name, backend, timeout):
    env = dict(os.environ)
    env["MAPPING_BACKEND"] = backend
    env.setdefault("PYTHONFAULTHANDLER", "1")
    cmd = [sys.executable, os.path.abspath(__file__), "--one", name]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                         errors="replace", start_new_session=True)
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = p.communicate()
    status, why = _classify(p.returncode, out, err, timed_out)
    return status, why, out, err, time.monotonic() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", dest="pattern", action="append", default=[],
                    help="only cases whose name contains PATTERN (or matches it as a glob); repeatable")
    ap.add_argument("--backend", default=os.environ.get("MAPPING_HOSTILE_BACKEND", "host"),
                    help="host, opencl, or a comma list (default host)")
    ap.add_argument("-j", dest="jobs", type=int, default=2, help="cases run at once (default 2)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case (default 60)")
    ap.add_argument("--list", action="store_true", help="list the cases (name, back ends, expected outcome)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case, and the output of failures")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.one:
        return _run_one(args.one)

    cases = _load_cases()
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    for b in backends:
        if b not in ("host", "opencl"):
            ap.error("--backend: %r is not host or opencl" % b)
    if args.jobs < 1:
        ap.error("-j must be at least 1")

    def wanted(name):
        if not args.pattern:
            return True
        return any(p in name or fnmatch.fnmatch(name, p) for p in args.pattern)

    todo = []
    for b in backends:
        for name, case in cases.CASES.items():
            if wanted(name) and (case.backends is None or b in case.backends):
                todo.append((name, b))

    if args.list:
        for name, b in todo:
            print("%-7s %-48s %s" % (b, name, cases.CASES[name].describe()))
        print("%d cases" % len(todo))
        return 0
    if not todo:
        print("hostile: no case matches")
        print("hostile: 0 passed, 0 failed")
        return 1

    label = len(backends) > 1
    lock = threading.Lock()
    results = []

    def one(item):
        name, b = item
        status, why, out, err, secs = _spawn(name, b, args.timeout)
        shown = ("%s:%s" % (b, name)) if label else name
        with lock:
            results.append((shown, status, why))
            if status != "pass" or args.verbose:
                print("%-5s %s (%.1f s)%s" % (status, shown, secs, ": " + why if why and status != "pass" else ""),
                      flush=True)
            if status != "pass" and (args.verbose or status in ("CRASH", "HANG")):
                tail = (err.strip().splitlines() or ["(no stderr)"])[-25:]
                print("      | " + "\n      | ".join(tail), flush=True)
        return status

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, todo))
    passed = sum(1 for r in results if r[1] == "pass")
    bad = [r for r in results if r[1] != "pass"]
    if bad:
        print("\nnot passed (%d):" % len(bad))
        for shown, status, why in sorted(bad):
            print("  %-5s %s" % (status, shown))
    counts = {s: sum(1 for r in bad if r[1] == s) for s in ("fail", "CRASH", "HANG")}
    print("(%s; %.0f s, back end%s %s)" % (", ".join("%d %s" % (n, s) for s, n in counts.items()),
                                            time.monotonic() - t0, "s" if label else "", ",".join(backends)))
    print("hostile: %d passed, %d failed" % (passed, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
