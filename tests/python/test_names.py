"""One meaning per word: Batch.add_to_gpu / add_to_cpu record copies for the
next flush (the old Batch.sync_to_* names still work and warn), and
Mirror.needs_sync answers without waiting where stale_bytes waits."""
import numpy as np
import pytest

import mapping


def test_batch_add_records_and_flush_moves():
    dev = mapping.open("host")
    g = mapping.allocate_gpu(256, device=dev)
    b = dev.batch()
    src = np.arange(16, dtype=np.uint8)
    b.add_to_gpu(src, g, offset=32)
    assert len(b) == 1
    out = np.zeros(16, np.uint8)
    b.flush()
    b.add_to_cpu(g, out, offset=32)
    assert (out == 0).all()        # recorded, not done
    b.flush()
    assert (out == src).all()


def test_old_batch_names_warn_and_still_work():
    dev = mapping.open("host")
    g = mapping.allocate_gpu(64, device=dev)
    b = dev.batch()
    with pytest.warns(DeprecationWarning, match="add_to_gpu"):
        b.sync_to_gpu(np.ones(8, np.uint8), g)
    out = np.zeros(8, np.uint8)
    with pytest.warns(DeprecationWarning, match="add_to_cpu"):
        b.sync_to_cpu(g, out)
    b.flush()
    assert (out == 1).all()


def test_mirror_needs_sync_follows_marks_without_waiting():
    dev = mapping.open("host")
    m = mapping.mirror(8192, device=dev)
    assert m.needs_sync("gpu") is True and m.needs_sync("cpu") is False   # a new mirror: GPU stale
    m.sync_to_gpu()
    assert m.needs_sync() is False
    m.array[5] = 1
    m.mark_cpu_modified(byte_range=(0, 16))
    assert m.needs_sync("gpu") is True
    s = dev.stream() if hasattr(dev, "stream") else mapping.stream(dev)
    m.sync_to_gpu(stream=s)
    assert m.needs_sync("gpu") is False            # queued counts as done
    s.synchronize()
    with pytest.raises(ValueError):
        m.needs_sync("both")
