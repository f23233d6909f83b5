"""The seed's scenario, written as the seed writes it, on every back end."""
import numpy as np
import pytest

import mapping


def test_seed_script_as_written(device, monkeypatch):
    mapping.set_default_device(device)
    cpu_data = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    gpu_tensor = mapping.allocate_gpu(cpu_data.nbytes)
    mapping.sync_to_gpu(cpu_data, gpu_tensor)
    gpu_result = gpu_tensor
    cpu_result = mapping.allocate_cpu(cpu_data.shape, cpu_data.dtype)
    mapping.sync_to_cpu(gpu_result, cpu_result)
    assert cpu_result.tolist() == [1.0, 2.0, 3.0]
    s = mapping.stats()
    assert s["h2d_bytes"] == 12 and s["d2h_bytes"] == 12


def test_default_device_follows_environment(monkeypatch):
    monkeypatch.setenv("MAPPING_BACKEND", "host")
    monkeypatch.setattr(mapping, "_default", None)
    assert mapping.default_device().backend == "host"


@pytest.mark.parametrize("make", [bytes, bytearray, lambda b: memoryview(bytearray(b)),
                                  lambda b: __import__("array").array("B", b), lambda b: np.frombuffer(b, np.uint8)])
def test_any_buffer_protocol_source(device, make):
    src = bytes(range(200))
    g = device.allocate_gpu(200)
    mapping.sync_to_gpu(make(src), g)
    out = bytearray(200)
    mapping.sync_to_cpu(g, out)
    assert bytes(out) == src


def test_shape_dtype_and_get(device):
    a = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float64)
    g = device.allocate_gpu(a.shape, a.dtype)
    assert g.shape == (4, 5) and g.dtype == np.float64 and g.nbytes == a.nbytes
    mapping.sync_to_gpu(a, g)
    np.testing.assert_array_equal(g.get(), a)
    # offsets are in bytes
    part = np.zeros(5, np.float64)
    mapping.sync_to_cpu(g, part, offset=5 * 8)
    np.testing.assert_array_equal(part, a[1])


def test_size_zero_is_a_no_op(device):
    empty = np.zeros(0, np.float32)
    g = device.allocate_gpu((0,), np.float32)
    assert g.nbytes == 0
    mapping.sync_to_gpu(empty, g)
    mapping.sync_to_cpu(g, empty)
    g2 = device.allocate_gpu(16)
    mapping.sync_to_gpu(b"", g2)
    mapping.sync_to_cpu(g2, bytearray())
    assert device.allocate_cpu((0, 3), np.float32).shape == (0, 3)
    with device.batch() as b:
        b.add_to_gpu(b"", g2)
        assert len(b) == 0


def test_streams_events_and_copies(device):
    n = 1 << 20
    a = np.arange(n, dtype=np.uint32)
    g1, g2 = device.allocate_gpu(a.shape, a.dtype), device.allocate_gpu(a.shape, a.dtype)
    out = np.zeros_like(a)
    with device.stream() as s:
        e0 = s.record()
        mapping.sync_to_gpu(a, g1, stream=s)
        mapping.copy_gpu(g1, g2, stream=s)
        mapping.sync_to_cpu(g2, out, stream=s)
        e1 = s.record()
        s.synchronize()
        assert e1.query()
        assert e0.elapsed(e1) >= 0
    np.testing.assert_array_equal(out, a)
    mapping.fill_gpu(g1, 0xAB)
    assert set(g1.get().view(np.uint8).tolist()) == {0xAB}


def test_batch_and_pipeline(device):
    g = device.allocate_gpu(64 * 100)
    parts = [bytes([i]) * 64 for i in range(100)]
    with device.batch() as b:
        for i, p in enumerate(parts):
            b.add_to_gpu(p, g, offset=i * 64)
    assert bytes(g.get()) == b"".join(parts)

    src = np.arange(1 << 18, dtype=np.float32)
    dst = np.zeros_like(src)
    p = mapping.pipeline(device, element_bytes=4)
    seen = []

    def step(stream, chunk):
        seen.append(chunk.index)
        mapping.copy_gpu(chunk.input, chunk.output, chunk.nbytes, chunk.input_offset, chunk.output_offset,
                         stream=stream)
    p.run(src, dst, step)
    np.testing.assert_array_equal(dst, src)
    assert seen == sorted(seen) and len(seen) >= 1

    def failing(stream, chunk):
        raise RuntimeError("my step failed")
    with pytest.raises(RuntimeError, match="my step failed"):
        p.run(src, dst, failing)
    p.close()


def test_info_and_stats_are_plain_data(device):
    i = mapping.info()
    assert i["version"] == mapping.version()
    assert any(b["name"] == device.backend and b["available"] for b in i["backends"])
    assert device.info()["backend"] == device.backend
    device.reset_stats()
    assert all(v == 0 for v in device.stats().values())


def test_dlpack_export_and_import(device):
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    g = device.allocate_gpu(a.shape, a.dtype)
    mapping.sync_to_gpu(a, g)
    kind, _ = g.__dlpack_device__()
    assert kind == {"host": 1, "opencl": 4, "cuda": 2}[device.backend]
    if device.backend == "host":
        np.testing.assert_array_equal(np.from_dlpack(g), a)  # zero-copy view of host "device" memory
        b = np.arange(6, dtype=np.float32)
        imp = mapping.from_dlpack(b, device=device)
        assert imp.shape == (6,) and imp.dtype == np.float32
        np.testing.assert_array_equal(imp.get(), b)
        mapping.sync_to_gpu(np.full(6, 7, np.float32), imp)
        assert b.tolist() == [7.0] * 6  # the same memory
        imp.close()
    else:
        with pytest.raises(TypeError, match="host memory"):  # numpy memory is device memory only on host
            mapping.from_dlpack(np.arange(4), device=device)
        assert g.__dlpack__() is not None
