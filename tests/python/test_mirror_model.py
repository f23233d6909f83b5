"""Mirrors against a numpy model over random operations: after any sequence of
CPU writes, device writes, marks and syncs (whole or through views, blocking or
on a stream), each side holds what the model says, and a sync moves only the
stale bytes."""
import numpy as np
import pytest

import mapping


@pytest.mark.parametrize("unified", [False, True])
def test_random_operations_match_a_numpy_model(device, unified):
    rng = np.random.default_rng(1234 + unified)
    n = 1 << 14
    m = mapping.mirror((n,), np.uint8, unified=unified, device=device)
    cpu_model = np.zeros(n, np.uint8)  # what the CPU side must hold once synced to the CPU
    gpu_model = np.zeros(n, np.uint8)
    stale_cpu = np.zeros(n, bool)
    stale_gpu = np.ones(n, bool)
    s = device.stream()
    for step in range(300):
        op = rng.integers(0, 5)
        lo = int(rng.integers(0, n - 1))
        hi = int(rng.integers(lo + 1, min(n, lo + 2000) + 1))
        if op == 0 and not stale_cpu[lo:hi].any():  # CPU write + mark (no conflict: the CPU side is valid)
            v = rng.integers(0, 256, hi - lo, dtype=np.uint8)
            m.array[lo:hi] = v
            cpu_model[lo:hi] = v
            m.mark_cpu_modified(slice(lo, hi))
            stale_gpu[lo:hi] = True
        elif op == 1 and not stale_gpu[lo:hi].any():  # device write + mark
            val = int(rng.integers(0, 256))
            m.buffer.fill(val, m.gpu_offset + lo, hi - lo)
            gpu_model[lo:hi] = val
            m.mark_gpu_modified(slice(lo, hi))
            stale_cpu[lo:hi] = True
        elif op == 2:
            before = device.stats()["h2d_bytes"]
            view = m[lo:hi]
            view.sync_to_gpu(stream=s if rng.integers(0, 2) else None)
            s.synchronize()
            moved = device.stats()["h2d_bytes"] - before
            if not unified:
                assert moved >= int(stale_gpu[lo:hi].sum())
            gpu_model[lo:hi] = np.where(stale_gpu[lo:hi], cpu_model[lo:hi], gpu_model[lo:hi])
            stale_gpu[lo:hi] = False
            view.close()
        elif op == 3:
            m.sync_to_cpu()
            cpu_model = np.where(stale_cpu, gpu_model, cpu_model)
            stale_cpu[:] = False
        else:
            assert m.stale_bytes("gpu") == int(stale_gpu.sum())
            assert m.stale_bytes("cpu") == int(stale_cpu.sum())
    m.sync_to_cpu()
    cpu_model = np.where(stale_cpu, gpu_model, cpu_model)
    np.testing.assert_array_equal(m.array, cpu_model)
    m.sync_to_gpu()
    np.testing.assert_array_equal(m.buffer.get()[m.gpu_offset:m.gpu_offset + n], cpu_model)
    m.close()


def test_scattered_edits_move_only_what_changed(device):
    n = 1 << 22
    a = np.zeros(n, np.uint8)
    m = mapping.mirror_wrap(a, device=device)
    m.sync_to_gpu()
    device.set_link(1e-12, 1e9)  # never merge gaps: the figure does not depend on a measured link
    rng = np.random.default_rng(5)
    idx = rng.choice(n // 64, 1000, replace=False) * 64
    for i in idx:
        a[i:i + 64] = 1
        m.mark_cpu_modified(byte_range=(int(i), 64))
    before = device.stats()
    m.sync_to_gpu()
    after = device.stats()
    # moved = n - skipped (h2d_bytes would also count a batch's table)
    assert after["sync_skipped_bytes"] - before["sync_skipped_bytes"] == n - 64 * 1000
    np.testing.assert_array_equal(m.buffer.get(), a)


def test_views_access_intents_and_conflicts(device):
    m = mapping.mirror((1000,), np.float32, device=device)
    with m.cpu("w") as a:
        a[:] = np.arange(1000)
    m.sync_to_gpu()
    v = m[100:200]
    assert v.shape == (100,) and v.gpu_offset == m.gpu_offset + 400
    with v.gpu("rw") as buf:
        buf.fill(0, v.gpu_offset, v.nbytes)
    with m.cpu("r") as a:
        assert (a[100:200] == 0).all() and a[99] == 99
        with pytest.raises(ValueError):
            a[0] = 1
    m.mark_gpu_modified(slice(0, 10))
    with pytest.raises(mapping.ConflictError):
        m.mark_cpu_modified(slice(5, 6))
    v.close()
    m.close()


def test_mirror_adopt_over_numpy_and_a_buffer(device):
    a = np.arange(256, dtype=np.uint16)
    g = device.allocate_gpu(4096 + a.nbytes)
    m = mapping.mirror_adopt(a, g, gpu_offset=4096)
    m.sync_to_gpu()
    back = np.zeros_like(a)
    mapping.sync_to_cpu(g, back, offset=4096)
    np.testing.assert_array_equal(back, a)
    m.close()
