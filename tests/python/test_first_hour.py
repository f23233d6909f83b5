"""What a newcomer met in the first hour with the Python package: a pipeline
step's exception swallowed (dst silently zeros), chunk buffers as flat
uint8, info() listing 16 of 64 devices, from_dlpack refusing an empty array,
errors naming the C function instead of the Python call, 0.1.0's
mark(offset, nbytes) raising TypeError with no deprecation, and the version."""
import os
import re
import warnings

import numpy as np
import pytest

import mapping


# ---- Pipeline.run raises what a step's launch_host function raised ----

def _copy_step(stream, c):
    mapping.copy_gpu(c.input, c.output, nbytes=c.nbytes, src_offset=c.input_offset, dst_offset=c.output_offset,
                     stream=stream)


@pytest.mark.parametrize("bad_chunk", [3, 15])  # in the middle; the last (raised after every step was called)
def test_pipeline_run_raises_the_exception_of_a_steps_host_function(device, bad_chunk):
    src = np.arange(1 << 14, dtype=np.float32)
    dst = np.zeros_like(src)
    p = mapping.pipeline(device=device, chunk_bytes=4096, depth=2)
    assert src.nbytes // p.chunk_bytes == 16

    def step(stream, c):
        _copy_step(stream, c)
        if c.index == bad_chunk:
            def kernel():
                raise ZeroDivisionError("in chunk %d" % c.index)
            mapping.launch_host(stream, kernel)

    with pytest.raises(ZeroDivisionError, match="in chunk %d" % bad_chunk):
        p.run(src, dst, step)
    # nothing is left over: the next run works and raises nothing
    dst[:] = 0
    p.run(src, dst, _copy_step)
    assert (dst == src).all()
    p.close()


def test_pipeline_step_exception_is_raised_as_it_is(device):
    p = mapping.pipeline(device=device, chunk_bytes=4096)

    def step(stream, c):
        raise KeyError("mine")
    with pytest.raises(KeyError, match="mine"):
        p.run(np.zeros(1 << 14, np.uint8), None, step)


# ---- chunk views with the source's dtype and shape ----

def test_pipeline_chunk_views_carry_the_source_dtype_and_shape(device):
    src = np.arange(3 * 1024 * 5, dtype=np.float32).reshape(3 * 1024, 5)
    dst = np.zeros((3 * 1024, 5), np.int32)           # same bytes, another dtype
    p = mapping.pipeline(device=device, chunk_bytes=20 * 1024, element_bytes=src[0].nbytes)
    seen = []

    def step(stream, c):
        assert c.src.dtype == np.float32 and c.dst.dtype == np.int32
        assert c.src.shape == (c.nbytes // 20, 5) and c.dst.shape == c.src.shape
        assert c.rows == slice(c.offset // 20, (c.offset + c.nbytes) // 20)
        assert c.src.nbytes == c.nbytes and c.src.device is device
        seen.append(c.rows)
        mapping.copy_gpu(c.src, c.dst, stream=stream)
    p.run(src, dst, step)
    assert [r.start for r in seen] == [0, 1024, 2048] and seen[-1].stop == 3 * 1024
    assert (dst.view(np.float32) == src).all()


def test_pipeline_chunk_views_are_flat_where_chunks_cut_rows(device):
    src = np.arange(3000 * 3, dtype=np.float32).reshape(3000, 3)    # 12-byte rows, 4 KiB chunks
    p = mapping.pipeline(device=device, chunk_bytes=4096)
    shapes = []

    def step(stream, c):
        shapes.append((c.src.shape, c.src.dtype, c.rows))
        _copy_step(stream, c)
    out = np.zeros_like(src)
    p.run(src, out, step)
    assert shapes[0] == ((1024,), np.float32, None)
    assert (out == src).all()
    got = []
    p.run(bytearray(10000), None, lambda s, c: got.append((c.src.shape, c.src.dtype)))
    assert got[0] == ((4096,), np.uint8)


def test_pipeline_chunk_views_on_the_host_back_end_are_numpy_arrays():
    dev = mapping.open("host")
    src = np.arange(64 * 256, dtype=np.float64).reshape(64, 256)
    dst = np.empty_like(src)
    p = mapping.pipeline(device=dev, chunk_bytes=16 * 2048, element_bytes=src[0].nbytes)

    def step(stream, c):
        def kernel():
            np.multiply(np.from_dlpack(c.src), 2, out=np.from_dlpack(c.dst))
        stream.launch_host(kernel)
    p.run(src, dst, step)
    assert (dst == 2 * src).all()


# ---- info() lists every device ----

def test_info_lists_every_device(run_python):
    r = run_python("import mapping\n"
                   "b = [b for b in mapping.info()['backends'] if b['name'] == 'host'][0]\n"
                   "print(b['device_count'], len(b['devices']), b['devices'][-1]['name'])\n",
                   MAPPING_HOST_DEVICES="64")
    assert r.returncode == 0, r.stderr
    count, listed, _ = r.stdout.split(None, 2)
    assert (count, listed) == ("64", "64"), r.stdout


# ---- from_dlpack takes empty arrays ----

@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0,), (2, 0, 4)])
def test_from_dlpack_accepts_empty_arrays(shape):
    dev = mapping.open("host")
    b = mapping.from_dlpack(np.zeros(shape, np.float32), device=dev)
    assert b.shape == shape and b.nbytes == 0 and b.dtype == np.float32


def test_from_dlpack_still_refuses_a_non_contiguous_array():
    dev = mapping.open("host")
    with pytest.raises(ValueError, match="not C-contiguous"):
        mapping.from_dlpack(np.zeros((4, 6), np.float32)[:, ::2], device=dev)


# ---- errors name the Python call ----

ERRORS = r"""
import numpy as np, mapping
d0, d1 = mapping.open("host", 0), mapping.open("host", 1)
m = mapping.mirror((16,), np.float32, device=d0)
mm = mapping.multimirror([d0, d1], (16,), np.float32)
s = d1.stream()
p = mapping.pipeline(device=d0, chunk_bytes=64, element_bytes=3)
cases = {
    "Mirror.sync_to_gpu": lambda: m.sync_to_gpu(s),
    "Mirror.sync_to_cpu": lambda: m.sync_to_cpu(s),
    "Mirror.gpu": lambda: m.gpu("rw", stream=s).__enter__(),
    "Mirror.mark_cpu_modified": lambda: m.mark_cpu_modified(byte_range=(60, 8)),
    "Mirror.stale_bytes": lambda: m.stale_bytes("both"),
    "MultiMirror.sync": lambda: mm.sync(0, s),
    "Pipeline.run": lambda: p.run(np.zeros(16), None, lambda st, c: None),
}
for call, f in cases.items():
    try:
        f()
        print(call, "| no error")
    except mapping.Error as e:
        print(call, "|", e)
"""


def test_mirror_and_pipeline_errors_name_the_python_call(run_python):
    r = run_python(ERRORS, MAPPING_HOST_DEVICES="2", MAPPING_BACKEND="host")
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(" | ", 1) for line in r.stdout.splitlines())
    assert len(lines) == 7, r.stdout
    for call, msg in lines.items():
        assert msg.startswith(call + ": "), (call, msg)
        assert not re.search(r"\bmapping_\w+:", msg), (call, msg)   # the C function's name is gone
    assert "another device" in lines["Mirror.sync_to_gpu"]
    assert "element_bytes" in lines["Pipeline.run"]


def test_the_status_and_class_survive_the_python_name():
    dev = mapping.open("host")
    m = mapping.mirror((4,), np.float32, device=dev)
    with pytest.raises(mapping.OutOfRangeError) as e:
        m.mark_gpu_modified(byte_range=(8, 16))
    assert e.value.status == mapping.OutOfRangeError.status and str(e.value).startswith("Mirror.mark_gpu_modified: ")


# ---- 0.1.0's mark(offset, nbytes) ----

@pytest.mark.parametrize("side", ["cpu", "gpu"])
def test_the_0_1_0_byte_form_of_marks_warns_and_still_works(side):
    dev = mapping.open("host")
    m = mapping.mirror((4, 4), np.float32, device=dev)
    m.sync_to_gpu()
    if side == "gpu":
        m.sync_to_cpu()
    mark = getattr(m, "mark_%s_modified" % side)
    stale = "gpu" if side == "cpu" else "cpu"
    with pytest.warns(DeprecationWarning, match=r"mark_%s_modified\(byte_range=" % side) as w:
        mark(4, 8)                         # bytes 4..12, as in 0.1.0
    assert w[0].filename == __file__       # the warning points at the caller
    assert m.stale_bytes(stale) == 8
    m.sync_to_gpu() if side == "cpu" else m.sync_to_cpu()
    with pytest.warns(DeprecationWarning):
        mark(np.int64(16), nbytes=16)      # nbytes= as a keyword, as 0.1.0 also took it
    assert m.stale_bytes(stale) == 16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mark(1)                            # the index form does not warn
        mark(byte_range=(0, 4))
    with pytest.raises(TypeError), pytest.warns(DeprecationWarning):
        mark(4, 8, byte_range=(0, 4))
    with pytest.raises(TypeError), pytest.warns(DeprecationWarning):
        mark(slice(0, 2), 8)


# ---- the version ----

def test_version_is_one_number_everywhere():
    here = os.path.dirname(os.path.abspath(__file__))
    pyproject = os.path.join(here, "..", "..", "python", "pyproject.toml")
    version = re.search(r'^version = "([^"]+)"', open(pyproject).read(), re.M).group(1)
    assert mapping.__version__ == mapping.version() == mapping.info()["version"] == version
    changelog = open(os.path.join(here, "..", "..", "CHANGELOG.md")).read()
    assert "## [%s]" % version in changelog
