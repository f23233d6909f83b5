"""device_diff=True mirrors from Python: a sync to the CPU after the device
wrote reads back only the changed blocks (MAPPING_MIRROR_DEVICE_DIFF). Each
case runs in its own process so that $MAPPING_DEVICE_DIFF is read fresh."""
import textwrap

import numpy as np
import pytest

import mapping

CHILD = textwrap.dedent("""
    import numpy as np, mapping
    dev = mapping.open(BACKEND)
    n = 1 << 20                                   # 256 blocks of 4 KiB
    m = mapping.mirror((n,), np.uint8, device=dev, device_diff=True)
    m.array[:] = np.arange(n) % 251
    m.mark_cpu_modified()
    m.sync_to_gpu()
    m.mark_gpu_modified()                         # "the device wrote"
    for k in range(20):                           # 20 blocks change on the device
        mapping.fill_gpu(m.buffer, 0xAB, offset=(3 + 12 * k) * 4096 + 100, nbytes=50)
    dev.reset_stats()
    m.sync_to_cpu()
    moved = dev.stats()["d2h_bytes"]
    for k in range(20):
        at = (3 + 12 * k) * 4096
        assert (m.array[at + 100:at + 150] == 0xAB).all()
        assert m.array[at + 99] == (at + 99) % 251 and m.array[at + 150] == (at + 150) % 251
    out = np.empty(n, np.uint8)
    mapping.sync_to_cpu(m.buffer, out)
    assert (out == m.array).all()
    print("moved", moved)
""")


def _run(run_python, backend, mode):
    r = run_python("BACKEND = %r\n" % backend + CHILD, MAPPING_DEVICE_DIFF=mode)
    assert r.returncode == 0 and "moved" in r.stdout, (r.stdout, r.stderr)
    return int(r.stdout.split("moved")[1].split()[0])


def _backends():
    names = ["host"]
    try:
        mapping.open("opencl")
        names.append("opencl")
    except mapping.Error:
        pass
    return names


@pytest.mark.parametrize("backend", _backends())
def test_device_diff_reads_back_only_the_changed_blocks(backend, run_python):
    on = _run(run_python, backend, "on")
    off = _run(run_python, backend, "off")
    assert off >= 1 << 20                          # the whole mirror
    assert 20 * 4096 <= on <= 20 * 4096 + 4096 + 256, on   # 20 blocks and the flags


def test_device_diff_must_be_a_bool():
    with pytest.raises(TypeError, match="device_diff"):
        mapping.mirror(4096, device_diff=1, device=mapping.open("host"))
    with pytest.raises(TypeError, match="mirror_wrap: device_diff"):
        mapping.mirror_wrap(np.zeros(16), device_diff="yes")


def test_a_bad_environment_value_is_refused(run_python):
    code = ("import mapping\n"
            "try:\n"
            "    mapping.mirror(4096, device_diff=True, device=mapping.open('host'))\n"
            "except mapping.InvalidArgumentError as e:\n"
            "    print('refused', e)\n")
    r = run_python(code, MAPPING_DEVICE_DIFF="sometimes")
    assert r.returncode == 0 and "refused" in r.stdout and "MAPPING_DEVICE_DIFF" in r.stdout, (r.stdout, r.stderr)
