"""Mirror syncs recorded in a CUDA graph, from Python (Mirror.sync_to_gpu on a
capturing stream, Mirror.sync_in_graph, Stream.capturing): each replay moves
the bytes stale then. The capture and the launches go through the driver
with ctypes, as torch.cuda.graph would; the fake driver from tests/fake in CI
(CTest sets MAPPING_TEST_FAKE_CUDA), a real one in tests/gpu/run.sh."""
import ctypes
import os

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


class Driver:
    """The few driver calls a graph needs, in the device's context."""

    def __init__(self, dev):
        self.lib = ctypes.CDLL(os.environ.get("MAPPING_CUDA_LIBRARY") or "libcuda.so.1")
        self.ctx = ctypes.c_void_p(dev.native[0])

    def call(self, name, *args):
        popped = ctypes.c_void_p()
        assert self.lib.cuCtxPushCurrent_v2(self.ctx) == 0
        try:
            r = getattr(self.lib, name)(*args)
        finally:
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(popped))
        assert r == 0, "%s failed: %d" % (name, r)


def test_graph_replays_sync_what_is_stale_then(cuda):
    cu = Driver(cuda)
    s = cuda.stream()
    native = ctypes.c_void_p(s.native)
    m = mapping.mirror((4096,), np.uint8, device=cuda)
    m.sync_to_gpu()
    assert not s.capturing
    cu.call("cuStreamBeginCapture_v2", native, 0)
    assert s.capturing
    m.sync_to_gpu(stream=s)                          # recorded, not run
    m[1024:2048].sync_in_graph(s, to="cpu", max_ranges=8)
    graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
    cu.call("cuStreamEndCapture", native, ctypes.byref(graph))
    cu.call("cuGraphInstantiateWithFlags", ctypes.byref(exe), graph, ctypes.c_ulonglong(0))
    assert not s.capturing
    for r in range(3):
        m.array[:100] = r + 1                         # the CPU writes
        m.mark_cpu_modified(slice(0, 100))
        m.buffer.fill(r + 50, m.gpu_offset + 1500, 10)  # "the kernel" writes
        m.mark_gpu_modified(slice(1500, 1510))
        before = cuda.stats()
        cu.call("cuGraphLaunch", exe, native)
        s.synchronize()
        after = cuda.stats()
        assert after["h2d_payload_bytes"] - before["h2d_payload_bytes"] == 100
        assert after["d2h_payload_bytes"] - before["d2h_payload_bytes"] == 10
        assert after["graph_sync_runs"] - before["graph_sync_runs"] == 2
        assert m.stale_bytes("gpu") == 0 and m.stale_bytes("cpu") == 0
        assert (m.array[:100] == r + 1).all() and (m.array[1500:1510] == r + 50).all()
    cu.call("cuGraphExecDestroy", exe)
    cu.call("cuGraphDestroy", graph)
    with pytest.raises(mapping.Error, match="not being captured"):
        m.sync_in_graph(s, to="gpu")
    with pytest.raises(mapping.Error):
        m.sync_in_graph(s, to="both")
    m.close()
    s.close()
