"""Write-tracking mirrors from Python (issue 25): track_writes=True sends the
pages written since the last sync with no mark, on every mechanism this
kernel offers ($MAPPING_TRACK forces one, each in its own process)."""
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
    assert 4 <= moved <= info["granularity"] * 2, moved   # one page (plus a table), not 4 MiB
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
def test_tracked_mirror_sends_written_pages_without_marks(mech, run_python):
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
        code = 0 if m.stale_bytes("gpu") >= 4096 else 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert m.stale_bytes("gpu") == mapping.write_tracking()["granularity"]
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
