"""Mirrors larger than the device (issue 40) from Python: mapping.open(budget=),
Device.memory_budget / resident_bytes, Mirror.evict / is_resident /
set_residency, MultiMirror.evict / is_resident; the data stays right."""
import numpy as np
import pytest

import mapping

MB = 1 << 20


@pytest.fixture
def dev():
    d = mapping.open("host", budget=3 * MB)
    yield d
    d.close()


def test_open_with_a_budget_and_change_it(dev):
    assert dev.memory_budget == 3 * MB
    assert dev.resident_bytes == 0
    dev.memory_budget = 4 * MB
    assert dev.memory_budget == 4 * MB
    with pytest.raises(ValueError):
        dev.memory_budget = -1
    with pytest.raises(TypeError):
        dev.memory_budget = 1.5
    with pytest.raises(ValueError):
        mapping.open("host", budget=2 ** 61)


def test_lru_eviction_keeps_every_mirrors_data(dev):
    ms = [mapping.mirror((MB // 8,), np.float64, device=dev) for _ in range(5)]  # 5 MiB under 3 MiB
    for i, m in enumerate(ms):
        with m.cpu("w") as a:
            a[:] = i
        with m.gpu("rw") as buf:  # the device doubles the data
            src = np.empty(a.size)
            mapping.sync_to_cpu(buf, src, offset=m.gpu_offset)
            mapping.sync_to_gpu(src * 2, buf, offset=m.gpu_offset)
    assert sum(m.is_resident for m in ms) < 5  # some went
    assert dev.stats()["evictions"] >= 2
    for i, m in enumerate(ms):
        m.sync_to_cpu()
        assert (m.array == 2 * i).all()
    assert dev.stats()["peak_resident_bytes"] <= 3 * MB


def test_evict_writes_back_and_the_next_acquire_brings_it_back(dev):
    m = mapping.mirror((1024,), np.uint8, device=dev)
    m.sync_to_gpu()
    with m.gpu("rw") as buf:
        mapping.sync_to_gpu(np.full(16, 7, np.uint8), buf, offset=m.gpu_offset + 100)
    before = dev.stats()["evict_writeback_bytes"]
    m.evict()
    assert not m.is_resident
    assert dev.stats()["evict_writeback_bytes"] - before == 1024  # acquired for writing: all of it
    assert (m.array[100:116] == 7).all()
    with pytest.raises(mapping.InvalidArgumentError):
        m.buffer  # not resident
    with m.gpu("r") as buf:
        out = np.empty(1024, np.uint8)
        mapping.sync_to_cpu(buf, out, offset=m.gpu_offset)
    assert m.is_resident and (out == m.array).all()
    m.evict()
    m.sync_to_gpu()
    assert m.buffer is not None and m.is_resident


def test_hints_and_bad_hints(dev):
    a, b = mapping.mirror((MB,), np.uint8, device=dev), mapping.mirror((MB,), np.uint8, device=dev)
    a.set_residency("keep")
    b.set_residency("evict_first")
    a.set_residency("default")
    with pytest.raises(mapping.InvalidArgumentError):
        a.set_residency("sometimes")


def test_a_mirror_larger_than_the_budget_is_refused_clearly(dev):
    with pytest.raises(mapping.OutOfDeviceMemoryError) as e:
        mapping.mirror((4 * MB,), np.uint8, device=dev)
    assert "memory budget" in str(e.value)


def test_multimirror_replica_eviction():
    d0, d1 = mapping.open("host"), mapping.open("host", budget=MB)
    mm = mapping.MultiMirror([d0, d1], (4096,), np.uint8)
    mm.array[:] = 3
    mm.mark_modified("cpu")
    mm.sync(1)
    mm.evict(1)
    assert not mm.is_resident(1) and mm.is_resident(0)
    assert mm.stale_bytes(1) == 4096
    mm.sync(1)
    assert mm.is_resident(1) and mm.stale_bytes(1) == 0
    out = np.empty(4096, np.uint8)
    mapping.sync_to_cpu(mm.replicas[1], out)
    assert (out == 3).all()
    with pytest.raises(mapping.InvalidArgumentError):
        mm.evict("cpu")
    mm.close()
    d0.close()
    d1.close()
