"""mapping.mpi in one process, without mpiexec (each case in a fresh
interpreter, so MPI starts and ends there): the import, the refusal of
another MPI than the one mapping was built with, the one-rank communicator,
and the messages that say what to install."""
import os
import subprocess
import sys

import pytest

UNDER_MPIEXEC = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"))
pytestmark = pytest.mark.skipif(UNDER_MPIEXEC, reason="these start their own interpreters: run without mpiexec")


def run(code):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def has_mpi4py():
    try:
        import mpi4py  # noqa: F401 (mpi4py.MPI, which starts MPI, is not imported here)
        return True
    except ImportError:
        return False


CHECKS = r"""
import sys
try:
    import mapping.mpi as mm
except ImportError as e:
    print("IMPORT-ERROR:", e)
    sys.exit(0)
import numpy as np
import mapping
from mpi4py import MPI
try:
    mm.DistArray(MPI.COMM_SELF, (10, 4), np.float32, halo=1, device="host")
except mapping.InvalidArgumentError as e:
    print("ONE-RANK:", e)
mpich = {"vendor": ("MPICH", (4, 1, 2)), "library": "MPICH Version: 4.1.2", "comm_size": 4, "comm_world": 0x44000000}
print("MPICH:", mm._check_abi(mm._mpi.abi(), mpich))
other = dict(mm._mpi4py_abi(), library="Open MPI v9.9.9, another build")
print("OTHER-BUILD:", mm._check_abi(mm._mpi.abi(), other))
print("SAME:", mm._check_abi(mm._mpi.abi(), mm._mpi4py_abi()))
"""


def test_import_refusals_and_a_one_rank_communicator():
    if not has_mpi4py():
        pytest.skip("mpi4py is not installed (pip install mpi4py)")
    out = dict(line.split(": ", 1) for line in run(CHECKS).splitlines() if ": " in line)
    if "IMPORT-ERROR" in out:  # a package built without MPI: the message says what to do
        assert "pip install ./python[mpi]" in out["IMPORT-ERROR"] and "apt-get install" in out["IMPORT-ERROR"], out
        pytest.skip("this mapping was built without its MPI part: " + out["IMPORT-ERROR"])
    assert "one rank" in out["ONE-RANK"], out
    built = out["MPICH"]
    assert "mpi4py runs on MPICH 4.1.2" in built and "rebuild mapping" in built, built
    assert "two MPI libraries in one process" in out["OTHER-BUILD"], out
    assert out["SAME"] == "None", out


def test_without_the_mpi_part_import_says_what_to_install():
    code = ("import sys\nsys.modules['mapping._mpi'] = None\n"
            "try:\n    import mapping.mpi\nexcept ImportError as e:\n    print(e)\n")
    out = run(code)
    if not has_mpi4py():
        assert "needs mpi4py" in out and "pip install mpi4py" in out, out
    else:
        assert "built without its MPI part" in out and "pip install ./python[mpi]" in out, out
    # the rest of the package is unaffected
    run("import sys\nsys.modules['mapping._mpi'] = None\nimport mapping, numpy\n"
        "m = mapping.mirror((4,), numpy.float32, device=mapping.open('host'))\nm.sync_to_gpu()\n")


def test_without_mpi4py_import_says_what_to_install():
    out = run("import sys\nsys.modules['mpi4py'] = None\n"
              "try:\n    import mapping.mpi\nexcept ImportError as e:\n    print(e)\n")
    assert "needs mpi4py" in out and "pip install mpi4py" in out, out
