"""CTest's python.mpi: tests/python/mpi under `mpiexec -n 4` (Open MPI:
--oversubscribe, and its own --timeout below CTest's). Prints SKIP and exits
77 where mpiexec or mpi4py is missing.

    python tests/python/mpi/run_mpi.py [MPIEXEC]
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    mpiexec = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else shutil.which("mpiexec")
    if not mpiexec or not os.path.exists(mpiexec):
        print("SKIP: mpiexec is not installed (Debian: apt-get install openmpi-bin)")
        return 77
    try:
        import mpi4py  # noqa: F401 (mpi4py.MPI, which starts MPI, is imported by the ranks only)
    except ImportError:
        print("SKIP: mpi4py is not installed for %s (pip install mpi4py)" % sys.executable)
        return 77
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    cmd = [mpiexec, "-n", "4"]
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--oversubscribe", "--timeout", "130"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    cmd += [sys.executable, "-m", "pytest", "-q", "-rs", "--color=no", "-p", "no:cacheprovider", HERE]
    print(" ".join(cmd), flush=True)
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
