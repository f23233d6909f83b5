"""A few seconds of the hostile suite inside pytest: the table loads (and is at
least issue 23's size), and a sample of the cases that crashed the old package
runs through run.py, each in its own process. The whole suite (about a minute
per back end) is run by CI with run.py directly."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "run.py")
SAMPLE = ["life.dlpack.", "dtype.object.sync_to_cpu", "resize.bytearray.queued_", "life.queued.buffer_close_read",
          "thread.sync_does_not_drop_other_threads_objects", "life.pickle_roundtrip_then_free", "mirror2d.mark_row_slice"]


def _run(*args):
    return subprocess.run([sys.executable, RUN] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)


def test_the_table_loads_and_is_large_enough():
    p = _run("--list", "--backend", "host")
    assert p.returncode == 0, p.stdout[-2000:]
    count = int(p.stdout.strip().splitlines()[-1].split()[0])
    assert count >= 170, count


def test_a_sample_each_in_its_own_process():
    args = []
    for k in SAMPLE:
        args += ["-k", k]
    p = _run("--backend", "host", *args)
    last = p.stdout.strip().splitlines()[-1]
    assert p.returncode == 0 and last.endswith(" 0 failed"), p.stdout[-4000:]
    assert int(last.split()[1]) >= len(SAMPLE), last


def test_the_runner_reports_a_hang_and_fails():
    p = _run("--backend", "host", "-k", "misc.pipeline_roundtrip", "--timeout", "0.01")
    assert p.returncode == 1, p.stdout
    assert "HANG" in p.stdout and p.stdout.strip().endswith("hostile: 0 passed, 1 failed"), p.stdout


if __name__ == "__main__":
    sys.exit(pytest.main(["-q", __file__]))
