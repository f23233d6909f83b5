"""Fixtures: `device` runs a test once per back end this machine has (host,
and opencl where PoCL or another OpenCL driver is installed); an absent back
end shows as a skipped test with the reason."""
import os
import subprocess
import sys

import pytest

# CTest passes the fake CUDA driver (tests/fake) so the CUDA paths run without a
# GPU; the library reads MAPPING_CUDA_LIBRARY when it first loads back ends.
if os.environ.get("MAPPING_TEST_FAKE_CUDA") and not os.environ.get("MAPPING_CUDA_LIBRARY"):
    os.environ["MAPPING_CUDA_LIBRARY"] = os.environ["MAPPING_TEST_FAKE_CUDA"]

mapping = pytest.importorskip("mapping", reason="the mapping package is not installed (pip install ./python)")
np = pytest.importorskip("numpy")

BACKENDS = ["host", "opencl"]


def _available():
    info = {b["name"]: b for b in mapping.info()["backends"]}
    return info


@pytest.fixture(params=BACKENDS)
def device(request):
    b = _available().get(request.param)
    if b is None or not b["available"]:
        pytest.skip("back end %s is not available here: %s" % (request.param, b["reason"] if b else "not compiled"))
    # An OpenCL CPU device is used only when asked for: ask for it.
    dev = mapping.open(request.param, 0)
    yield dev
    dev.close()


@pytest.fixture
def opencl_device():
    b = _available().get("opencl")
    if b is None or not b["available"]:
        pytest.skip("back end opencl is not available here: %s" % (b["reason"] if b else "not compiled"))
    dev = mapping.open("opencl", 0)
    yield dev
    dev.close()


@pytest.fixture
def run_python():
    """run_python(code, **env): runs `code` in a fresh interpreter, with the
    environment plus `env` (for variables read once per process), and returns
    the subprocess.CompletedProcess (text stdout and stderr)."""
    def run(code, **env):
        return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True,
                              text=True, timeout=120)
    return run
