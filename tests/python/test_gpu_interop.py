"""GPU-only interop: torch and CuPy tensors through DLPack and the CUDA array
interface. Skipped (visibly) without a CUDA device; tests/gpu/run.sh runs them."""
import numpy as np
import pytest

import mapping


def _cuda_device():
    b = {x["name"]: x for x in mapping.info()["backends"]}.get("cuda")
    if not b or not b["available"]:
        pytest.skip("no CUDA device here: %s" % (b["reason"] if b else "cuda not compiled"))
    return mapping.open("cuda", 0)


def test_torch_tensor_via_dlpack_and_back():
    dev = _cuda_device()
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    t = torch.arange(1000, dtype=torch.float32, device="cuda")
    g = mapping.from_dlpack(t, device=dev)
    out = np.empty(1000, np.float32)
    mapping.sync_to_cpu(g, out)
    np.testing.assert_array_equal(out, np.arange(1000, dtype=np.float32))
    mapping.sync_to_gpu(np.ones(1000, np.float32), t)  # a torch tensor as the destination
    torch.cuda.synchronize()
    assert float(t.sum()) == 1000.0
    b = dev.allocate_gpu((10,), np.float32)
    mapping.sync_to_gpu(np.arange(10, dtype=np.float32), b)
    assert torch.from_dlpack(b).cpu().tolist() == list(range(10))


def test_cupy_via_cuda_array_interface():
    dev = _cuda_device()
    cp = pytest.importorskip("cupy", reason="CuPy is not installed")
    b = dev.allocate_gpu((10,), np.int32)
    mapping.sync_to_gpu(np.arange(10, dtype=np.int32), b)
    assert b.__cuda_array_interface__["version"] == 3
    assert cp.asarray(b).get().tolist() == list(range(10))
    c = cp.zeros(10, dtype=cp.int32)
    mapping.sync_to_gpu(np.full(10, 5, np.int32), c)
    assert int(c.sum()) == 50
