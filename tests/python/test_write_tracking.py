"""Write-tracking mirrors from Python: track_writes=True sends the bytes
changed since the last call with no mark, on every mechanism this kernel
offers ($MAPPING_TRACK forces one, each in its own process)."""
import textwrap

import numpy as np
import pytest

import mapping

CHILD = textwrap.dedent("""
    import numpy as np, mapping
    info = mapping.write_tracking()
    assert info["mechanism"] == MECH, info
    assert info["granularity"] >= 4096, info
    dev = mapping.open("host")
    m = mapping.mirror((1 << 20,), np.float32, device=dev, track_writes=True)
    m.sync_to_gpu()
    dev.reset_stats()
    m.array[12345] = 7.0            # one written element, no mark
    m.sync_to_gpu()
    moved = dev.stats()["h2d_bytes"]
    assert 1 <= moved <= 4, moved   # the bytes of the element that changed, not its page, not 4 MiB
    out = np.empty(1 << 20, np.float32)
    mapping.sync_to_cpu(m.buffer, out)
    assert out[12345] == 7.0
    dev.reset_stats()
    m.sync_to_gpu()                 # nothing written since: nothing moves
    assert dev.stats()["h2d_bytes"] == 0
    a = np.zeros(4096, np.uint8)
    w = mapping.mirror_wrap(a, device=dev, track_writes=True)
    w.sync_to_gpu()
    a[100:200] = 9                  # writes to the wrapped array itself
    w.sync_to_gpu()
    back = np.empty_like(a)
    mapping.sync_to_cpu(w.buffer, back)
    assert (back[100:200] == 9).all() and (back[:100] == 0).all()
    print("ok")
""")


def _mechanisms():
    # auto is what this kernel offers; mprotect works on any Linux
    return ["mprotect", mapping.write_tracking()["mechanism"]]


@pytest.mark.parametrize("mech", sorted(set(_mechanisms()) - {"none"}))
def test_tracked_mirror_sends_written_bytes_without_marks(mech, run_python):
    r = run_python("MECH = %r\n" % mech + CHILD, MAPPING_TRACK=mech)
    assert r.returncode == 0 and "ok" in r.stdout, (r.stdout, r.stderr)


def test_no_mechanism_refuses_track_writes_with_unsupported(run_python):
    code = ("import mapping\n"
            "assert mapping.write_tracking()['mechanism'] == 'none'\n"
            "try:\n"
            "    mapping.mirror(4096, track_writes=True, device=mapping.open('host'))\n"
            "except mapping.UnsupportedError as e:\n"
            "    print('refused', e)\n")
    r = run_python(code, MAPPING_TRACK="none")
    assert r.returncode == 0 and "refused" in r.stdout, (r.stdout, r.stderr)


def test_track_writes_must_be_a_bool():
    with pytest.raises(TypeError, match="track_writes"):
        mapping.mirror(4096, track_writes="yes", device=mapping.open("host"))
    with pytest.raises(TypeError, match="mirror_wrap: track_writes"):
        mapping.mirror_wrap(np.zeros(16), track_writes=1)


FORK_CHILD = textwrap.dedent("""
    import os, numpy as np, mapping
    dev = mapping.open("host")
    m = mapping.mirror((1 << 20,), np.uint8, device=dev, track_writes=True)
    m.sync_to_gpu()
    m.array[5000] = 1               # written before the fork, synced after it
    pid = os.fork()
    if pid == 0:
        # The child asks about the inherited mirror (as a worker of a
        # fork-based pool might); it must not take the parent's written
        # pages away from it.
        code = 0 if m.stale_bytes("gpu") == 1 else 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert m.stale_bytes("gpu") == 1
    m.sync_to_gpu()
    out = np.empty(1 << 20, np.uint8)
    mapping.sync_to_cpu(m.buffer, out)
    assert out[5000] == 1
    print("ok")
""")


@pytest.mark.parametrize("mech", sorted(set(_mechanisms()) - {"none"}))
def test_forked_child_leaves_the_parents_tracked_pages(mech, run_python):
    r = run_python(FORK_CHILD, MAPPING_TRACK=mech)
    assert r.returncode == 0 and "ok" in r.stdout, (r.stdout, r.stderr)


STREAM_CHILD = textwrap.dedent("""
    import numpy as np, resource, mapping
    dev = mapping.open("host")
    m = mapping.mirror((1 << 20,), np.float32, device=dev, track_writes=True)   # 4 MiB
    m.sync_to_gpu()
    out = np.empty(1 << 20, np.float32)
    faults = []
    for k in range(6):              # the whole array, rewritten between syncs: a numpy stream
        f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        m.array[:] = k + 0.5
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0)
        m.sync_to_gpu()
        mapping.sync_to_cpu(m.buffer, out)
        assert (out == k + 0.5).all(), k
    # The stream stops: single elements, off the sample pages (one every
    # quarter of MAPPING_TRACK_STREAMS, at addresses that are multiples of it:
    # a write there would count as the stream going on).
    page = mapping.write_tracking()["granularity"]
    base = m.array.ctypes.data
    off_sample = next(p for p in range(1, 64) if (base + p * page) % (int(STREAMS) // 4)) if OPENS else 1
    i = off_sample * page // 4 + 1  # float32 elements
    m.array[i] = -1.0
    m.sync_to_gpu()                 # finds no sample written: the run closes (and goes up once more)
    m.array[i + 1] = -2.0
    stale = m.stale_bytes("gpu")
    m.sync_to_gpu()
    mapping.sync_to_cpu(m.buffer, out)
    assert out[i] == -1.0 and out[i + 1] == -2.0 and out[i + 2] == 5.5
    print("faults", faults, "stale", stale)
    pages = (4 << 20) // mapping.write_tracking()["granularity"]
    if OPENS:    # from the third stream on, only the sample pages fault
        assert all(f >= pages for f in faults[:2]) and all(f <= pages // 4 + 8 for f in faults[3:]), faults
    else:
        assert all(f >= pages for f in faults), faults
    assert 1 <= stale <= 4, stale   # the bytes of one element that changed
    print("ok")
""")


@pytest.mark.parametrize("streams", ["262144", "off"])
def test_numpy_streams_open_a_run_under_uffd(streams, run_python):
    if mapping.write_tracking()["mechanism"] != "uffd":
        pytest.skip("streams are a uffd feature; this kernel offers %s" % mapping.write_tracking()["mechanism"])
    r = run_python("OPENS = %r\nSTREAMS = %r\n" % (streams != "off", streams) + STREAM_CHILD, MAPPING_TRACK="uffd",
                   MAPPING_TRACK_STREAMS=streams)
    assert r.returncode == 0 and "ok" in r.stdout, (r.stdout, r.stderr)


def test_bad_track_streams_value_is_refused(run_python):
    code = ("import mapping\n"
            "try:\n"
            "    mapping.mirror(4096, track_writes=True, device=mapping.open('host'))\n"
            "except ValueError as e:\n"
            "    print('refused', e)\n")
    r = run_python(code, MAPPING_TRACK_STREAMS="sometimes")
    assert r.returncode == 0 and "refused" in r.stdout and "MAPPING_TRACK_STREAMS" in r.stdout, (r.stdout, r.stderr)
