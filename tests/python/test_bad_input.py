"""Bad input gives a clear exception, never a crash."""
import numpy as np
import pytest

import mapping


def test_errors_are_one_class_per_status():
    assert issubclass(mapping.OutOfRangeError, mapping.Error)
    assert issubclass(mapping.InvalidArgumentError, ValueError)
    assert mapping.OutOfRangeError.status == -4
    assert mapping.OutOfRangeError.status_name == "ERR_OUT_OF_RANGE"
    names = {c.__name__ for c in mapping.Error.__subclasses__()}
    assert {"NullArgumentError", "ZeroSizeError", "ConflictError", "UnsupportedError", "DriverError"} <= names


def test_wrong_types(device):
    g = device.allocate_gpu(16)
    with pytest.raises(TypeError, match="buffer protocol"):
        mapping.sync_to_gpu(12345, g)
    with pytest.raises(TypeError):
        mapping.sync_to_gpu(b"x" * 16, "not a buffer")
    with pytest.raises(TypeError):
        mapping.allocate_gpu("ten", device=device)
    with pytest.raises(TypeError):
        mapping.open(backend=3)
    with pytest.raises(TypeError):
        mapping.sync_to_gpu(b"x", g, stream="fast")


def test_non_contiguous_and_read_only(device):
    g = device.allocate_gpu((4, 4), np.float32)
    a = np.zeros((4, 8), np.float32)[:, ::2]
    with pytest.raises(mapping.InvalidArgumentError, match="C-contiguous"):
        mapping.sync_to_gpu(a, g)
    ro = np.zeros((4, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(mapping.InvalidArgumentError, match="writable"):
        mapping.sync_to_cpu(g, ro)
    with pytest.raises(mapping.InvalidArgumentError):
        mapping.sync_to_cpu(g, b"\0" * 64)


def test_size_mismatch_and_ranges(device):
    g = device.allocate_gpu(64)
    with pytest.raises(mapping.OutOfRangeError, match="past its end"):
        mapping.sync_to_gpu(np.zeros(65, np.uint8), g)
    with pytest.raises(mapping.OutOfRangeError):
        mapping.sync_to_cpu(g, bytearray(8), offset=60)
    with pytest.raises(IndexError):
        mapping.sync_to_gpu(b"abcd", g, offset=62)
    with pytest.raises(mapping.Error):
        mapping.fill_gpu(g, 300)
    m = mapping.mirror(100, device=device)
    with pytest.raises(mapping.OutOfRangeError):
        m.mark_cpu_modified(byte_range=(90, 20))
    with pytest.raises(mapping.InvalidArgumentError):
        m.mark_cpu_modified(slice(0, 10, 2))
    with pytest.raises(mapping.InvalidArgumentError):
        with m.cpu("x"):
            pass
    with pytest.raises(mapping.ZeroSizeError):
        mapping.mirror(0, device=device)
    m.close()


def test_closed_objects_and_unknown_backend(device):
    g = device.allocate_gpu(8)
    g.close()
    with pytest.raises(mapping.InvalidHandleError):
        mapping.sync_to_gpu(b"12345678", g)
    with pytest.raises(mapping.NoBackendError, match="unknown back end"):
        mapping.open("nonsense")
    with pytest.raises(mapping.NoDeviceError):
        mapping.open(device.backend, 999)


def test_import_stream_on_host_is_unsupported():
    dev = mapping.open("host")
    with pytest.raises(mapping.UnsupportedError):
        mapping.import_stream(1234, device=dev)
    dev.close()


def test_gc_in_any_order(device):
    """Objects may outlive their device's close, and die in any order."""
    dev = mapping.open(device.backend, 0)
    g = dev.allocate_gpu(1024)
    arr = dev.allocate_cpu((256,), np.float32)
    m = mapping.mirror(1024, device=dev)
    view = m.array
    s = dev.stream()
    dev.close()  # closes g, m, s now; the page-locked array and the view keep the memory
    with pytest.raises(mapping.InvalidHandleError):
        mapping.sync_to_gpu(arr, g)
    arr[:] = 1.0
    view[:] = 2
    del dev, g, s
    assert arr.sum() == 256.0 and int(view.sum()) == 2048
    del m, arr, view
    import gc
    gc.collect()


def test_gc_of_a_cycle_holding_a_device_and_its_objects(device):
    """A reference cycle holding a device and its objects: the collector may
    finalize them in any order; the device's objects are destroyed first."""
    import gc
    for _ in range(20):
        dev = mapping.open(device.backend, 0)
        holder = {"dev": dev, "bufs": [dev.allocate_gpu(4096) for _ in range(3)], "s": dev.stream(),
                  "m": mapping.mirror(4096, device=dev), "b": dev.batch(), "p": mapping.pipeline(dev)}
        holder["self"] = holder  # the cycle
        holder["v"] = holder["m"][0:10]
        del dev, holder
        gc.collect()
