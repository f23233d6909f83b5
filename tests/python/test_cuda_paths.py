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


def test_every_queued_operation_records_the_buffers_stream(cuda):
    """Issue 23 item 15: __cuda_array_interface__["stream"] names the stream of
    the last queued work on the buffer, whichever call queued it."""
    a, b = cuda.allocate_gpu((64,), np.float32), cuda.allocate_gpu((64,), np.float32)
    s = cuda.stream()
    a.fill(0, stream=s)
    assert a.__cuda_array_interface__["stream"] == s.native
    s2 = cuda.stream()
    mapping.copy_gpu(a, b, stream=s2)
    assert b.__cuda_array_interface__["stream"] == s2.native
    c = cuda.allocate_gpu((64,), np.float32)
    with cuda.batch() as batch:
        batch.add_to_gpu(np.ones(64, np.float32), c)
        batch.flush(s)
    assert c.__cuda_array_interface__["stream"] == s.native
    m = mapping.mirror((64,), np.float32, device=cuda)
    m.sync_to_gpu(stream=s2)
    assert m.buffer.__cuda_array_interface__["stream"] == s2.native
    s.synchronize()
    s2.synchronize()


class DLPackProducer:
    """A CUDA tensor of "another library" that records the stream its consumer passes."""

    def __init__(self, buf):
        self.buf = buf
        self.streams = []

    def __dlpack_device__(self):
        return self.buf.__dlpack_device__()

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return self.buf.__dlpack__()


def test_from_dlpack_passes_the_consumer_stream(cuda):
    """Issue 23 item 14: the consumer's stream goes to the producer (None would
    mean no synchronization); the default device need not be CUDA."""
    owner = cuda.allocate_gpu((16,), np.int32)
    mapping.sync_to_gpu(np.arange(16, dtype=np.int32), owner)
    prod = DLPackProducer(owner)
    imp = mapping.from_dlpack(prod, device=cuda)
    assert prod.streams and prod.streams[0] is not None and prod.streams[0] != 0
    assert prod.streams[0] in (1, cuda.native[3])
    np.testing.assert_array_equal(imp.get(), np.arange(16))
    imp.close()
    host = mapping.open("host")
    mapping.set_default_device(host)
    try:
        x = mapping.from_dlpack(DLPackProducer(owner))
        y = mapping.from_dlpack(DLPackProducer(owner))
        assert x.device is y.device and x.device.backend == "cuda"  # one device, found again
    finally:
        mapping.set_default_device(cuda)


@pytest.mark.parametrize("handle", [None, 0, 1, 2])
def test_cuda_array_interface_stream_is_waited_for(cuda, handle):
    """The "stream" key of an imported CUDA array: None needs nothing, 0/1 the
    legacy default stream, 2 the per-thread one; never refused."""
    owner = cuda.allocate_gpu((8,), np.float32)
    foreign = ForeignTensor(owner)
    foreign.__cuda_array_interface__["stream"] = handle
    imp = mapping.as_buffer(foreign, device=cuda)
    assert imp.native == owner.native
    imp.close()
