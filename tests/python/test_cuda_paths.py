"""The CUDA side of the package on whatever CUDA driver loads: the fake one
from tests/fake in CI (CTest sets MAPPING_TEST_FAKE_CUDA), a real one in
tests/gpu/run.sh. The CUDA array interface, DLPack's kDLCUDA, and a device
pointer made elsewhere imported through the interface."""
import numpy as np
import pytest

import mapping


@pytest.fixture
def cuda():
    b = {x["name"]: x for x in mapping.info()["backends"]}.get("cuda")
    if not b or not b["available"]:
        pytest.skip("no CUDA driver here (CI runs this on the fake driver): %s" % (b["reason"] if b else "not compiled"))
    dev = mapping.open("cuda", 0)
    yield dev
    dev.close()


class ForeignTensor:
    """A CUDA array made by "another library" (here: memory from mapping), seen only through the interface."""

    def __init__(self, buf):
        self.buf = buf
        self.__cuda_array_interface__ = {"shape": buf.shape, "typestr": buf.dtype.str, "data": (buf.native, False),
                                         "version": 3, "strides": None}


def test_cuda_array_interface_and_dlpack_device(cuda):
    b = cuda.allocate_gpu((8, 4), np.float32)
    cai = b.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (8, 4) and cai["typestr"] == "<f4"
    assert cai["data"] == (b.native, False) and cai["stream"] is None
    assert b.__dlpack_device__() == (2, 0)
    with cuda.stream() as s:
        mapping.sync_to_gpu(np.ones((8, 4), np.float32), b, stream=s)
        assert b.__cuda_array_interface__["stream"] == s.native
        s.synchronize()
    with pytest.raises(AttributeError):
        mapping.open("host").allocate_gpu(4).__cuda_array_interface__


def test_a_foreign_cuda_array_is_imported_without_a_copy(cuda):
    owner = cuda.allocate_gpu((100,), np.int64)
    foreign = ForeignTensor(owner)
    mapping.sync_to_gpu(np.arange(100, dtype=np.int64), foreign)  # accepted as the destination
    np.testing.assert_array_equal(owner.get(), np.arange(100))
    imp = mapping.as_buffer(foreign, device=cuda)
    assert imp.native == owner.native and imp.shape == (100,) and imp.dtype == np.int64
    imp.close()
    np.testing.assert_array_equal(owner.get(), np.arange(100))  # still the owner's
