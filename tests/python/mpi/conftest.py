"""tests/python/mpi: mapping.mpi, run under mpiexec:

    mpiexec -n 4 --oversubscribe python -m pytest tests/python/mpi   (CTest: python.mpi)

Outside mpiexec only test_single_process.py runs; the rank tests show SKIP.
Every wait is bounded: mapping.mpi gives up after 20 s (set_timeout), a
SIGALRM watchdog interrupts a test after 60 s, and a rank whose test fails
tells the others (notify_failure), whose waits then give up at once."""
import os
import signal

import pytest

UNDER_MPIEXEC = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"))
TEST_TIMEOUT = 60
if UNDER_MPIEXEC:
    collect_ignore = ["test_single_process.py"]  # it starts interpreters of its own: one process, no mpiexec


class Watchdog(Exception):
    """A test ran past TEST_TIMEOUT seconds."""


def _alarm(signum, frame):
    raise Watchdog("the test ran for more than %d s (tests/python/mpi/conftest.py)" % TEST_TIMEOUT)


@pytest.fixture(autouse=True)
def watchdog():
    if not UNDER_MPIEXEC:
        yield
        return
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TEST_TIMEOUT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if UNDER_MPIEXEC and report.when == "call" and report.failed:
        import mapping.mpi
        mapping.mpi.notify_failure("test %s failed on this rank" % item.name)
