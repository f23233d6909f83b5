"""mapping.mpi.DistArray on several ranks (mpiexec -n 4; see conftest.py):
the Jacobi example bit-equal to numpy, the halo bytes each exchange moves,
scatter / gather round trips with uneven blocks, readiness without a
synchronize, delta halos, the local block's views, and every failure ending
alike on every rank, never in a hang."""
import importlib.util
import os
import signal
import threading
import time

import pytest

UNDER_MPIEXEC = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"))
if not UNDER_MPIEXEC:
    pytest.skip("run under mpiexec: mpiexec -n 4 --oversubscribe python -m pytest tests/python/mpi (CTest: python.mpi)",
                allow_module_level=True)

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import mapping  # noqa: E402
import mapping.mpi as mm  # noqa: E402

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
if size < 2:
    pytest.skip("needs 2 ranks or more (mpiexec -n 4)", allow_module_level=True)
mm.set_timeout(20)  # no wait lasts longer: a hang becomes WaitTimeout

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "python", "jacobi_mpi.py")
_spec = importlib.util.spec_from_file_location("jacobi_mpi", EXAMPLE)
jacobi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jacobi)


def _usable(backend):
    b = {x["name"]: x for x in mapping.info()["backends"]}.get(backend)
    if b is None or not b["available"]:
        return "back end %s is not available here: %s" % (backend, b["reason"] if b else "not compiled")
    if backend == "opencl":
        try:
            import pyopencl  # noqa: F401
        except ImportError:
            return "PyOpenCL is not installed (the OpenCL kernels use it)"
    return None


@pytest.fixture(params=["host", "opencl"])
def backend(request):
    why = comm.allgather(_usable(request.param))  # skipped on every rank alike
    if any(why):
        pytest.skip(next(w for w in why if w))
    return request.param


def same_on_every_rank(fn, cls, words=None):
    """fn() raises cls on every rank, the same class everywhere; the message
    has `words` (or, on the ranks that were fine, names the failing rank)."""
    try:
        fn()
        got = None
    except Exception as e:  # noqa: B902
        got = e
    names = comm.allgather(type(got).__name__)
    assert len(set(names)) == 1, "different outcomes across ranks: %s" % names
    assert isinstance(got, cls), "rank %d: %r" % (rank, got)
    if words:  # the ranks that were fine name the failing rank, or the value that differs
        assert words in str(got) or "failed on rank" in str(got) or "differs across ranks" in str(got), str(got)
    return got


def neighbours():
    return (rank > 0) + (rank < size - 1)


# ---- the Jacobi example: bit-equal to numpy ----

@pytest.mark.parametrize("halo", [1, 2])
def test_jacobi_is_bit_equal_to_a_serial_numpy_run(backend, halo):
    rows, cols, steps = 37, 29, 6  # 37 rows: blocks of 10, 9, 9, 9
    result = jacobi.run(comm, rows, cols, steps, halo, device=backend)
    same = None
    if rank == 0:
        expect = jacobi.serial(jacobi.initial(rows, cols), steps)
        same = bool(np.array_equal(result.view(np.uint32), expect.view(np.uint32)))
    assert comm.bcast(same, root=0)


def test_the_example_runs(backend, monkeypatch, capsys):
    monkeypatch.setenv("MAPPING_BACKEND", backend)
    assert jacobi.main(["40", "24", "8", "2"]) == 0
    if rank == 0:
        assert "PASS" in capsys.readouterr().out


# ---- the halo bytes of each exchange ----

@pytest.mark.parametrize("shape,halo", [((64, 33), 2), ((1000,), 5), ((16, 4), 4)])
def test_an_exchange_moves_exactly_the_halo_bytes(backend, shape, halo):
    with mm.DistArray(comm, shape, np.float32, halo=halo, device=backend) as a:
        row = a.dtype.itemsize * int(np.prod(shape[1:]))
        owned, hb, nb = a.owned_rows * row, halo * row, neighbours()
        s = a.device.stream()
        a.mirror.sync_to_gpu()
        with a.gpu("w", s) as buf:  # "a kernel" writes every owned byte: rank + 1
            buf.fill(rank + 1, offset=halo * row, nbytes=owned, stream=s)
        before, mb = a.device.stats(), a.stats()
        a.halo_exchange(s)
        s.synchronize()
        after, ma = a.device.stats(), a.stats()
        assert after["d2h_bytes"] - before["d2h_bytes"] == min(nb * hb, owned)  # overlapping strips move once
        assert after["h2d_bytes"] - before["h2d_bytes"] == nb * hb
        assert ma["exchanges"] - mb["exchanges"] == 1
        assert ma["mpi_bytes_sent"] - mb["mpi_bytes_sent"] == nb * hb
        assert ma["mpi_bytes_received"] - mb["mpi_bytes_received"] == nb * hb
        with a.cpu("r", halo=True) as x:
            b = x.view(np.uint8).reshape(-1)
            if rank > 0:
                assert (b[:hb] == rank).all()
            if rank < size - 1:
                assert (b[-hb:] == rank + 2).all()
        # nothing modified since: nothing to the host, the halos again
        before = a.device.stats()
        a.halo_exchange(s)
        s.synchronize()
        after = a.device.stats()
        assert after["d2h_bytes"] == before["d2h_bytes"]
        assert after["h2d_bytes"] - before["h2d_bytes"] == nb * hb


# ---- scatter and gather ----

@pytest.mark.parametrize("shape,dtype,root", [((103, 7), np.float64, 0), ((1001,), np.int32, 2),
                                              ((10, 3, 2), np.uint8, 3)])
def test_scatter_gather_round_trip_with_uneven_blocks(shape, dtype, root):
    root %= size
    expect = (np.arange(int(np.prod(shape))) % 251).astype(dtype).reshape(shape)
    with mm.DistArray(comm, shape, dtype, halo=1, device="host") as a:
        counts = comm.allgather(a.owned_rows)
        assert sum(counts) == shape[0] and max(counts) - min(counts) <= 1
        a.scatter(expect if rank == root else None, root=root)
        assert np.array_equal(a.owned, expect[a.first_row:a.first_row + a.owned_rows])
        back = (root + 1) % size
        out = a.gather(root=back)
        if rank == back:
            assert np.array_equal(out, expect)
        else:
            assert out is None
        # the owned rows changed on the device: gather takes them from there
        s = a.device.stream()
        with a.gpu("w", s) as buf:
            buf.fill(7, offset=a.halo * a.owned.strides[0], nbytes=a.owned.nbytes, stream=s)
        out = a.gather(root=root, stream=s)
        if rank == root:
            assert (out.view(np.uint8) == 7).all()


# ---- readiness: no synchronize before a send ----

def test_an_exchange_waits_for_the_kernel_that_wrote_the_rows():
    with mm.DistArray(comm, (8 * size, 64), np.float32, halo=1, device="host") as a:
        a.mirror.sync_to_gpu()
        s = a.device.stream()
        dev = np.from_dlpack(a)  # the device side (host back end: host memory)
        owned = slice(a.halo, a.halo + a.owned_rows)

        def slow_kernel():
            time.sleep(0.2)
            dev[owned] = rank + 1
        for stream in (None, s):  # blocking, then on the kernel's stream
            with a.gpu("w", s):
                s.launch_host(slow_kernel)
            a.halo_exchange(stream)  # no s.synchronize() first
            with a.cpu("r", halo=True) as x:
                if rank > 0:
                    assert (x[0] == rank).all()
                if rank < size - 1:
                    assert (x[-1] == rank + 2).all()
            dev[owned] = 0


# ---- delta halos ----

def test_delta_halos_send_only_the_changed_bytes():
    cols = 1024
    nb = neighbours()
    with mm.DistArray(comm, (8 * size, cols), np.float32, halo=1, device="host", delta=True) as d, \
            mm.DistArray(comm, (8 * size, cols), np.float32, halo=1, device="host") as full:
        assert d.delta and not full.delta
        for arr in (d, full):
            with arr.cpu("w") as x:
                x[:] = rank * 1000 + np.arange(x.size, dtype=np.float32).reshape(x.shape)
            arr.halo_exchange()
        row = cols * 4
        for step in range(5):  # 10 % of each boundary row changes per step
            w = slice(step * cols // 10, (step + 1) * cols // 10)
            for arr in (d, full):
                with arr.cpu("rw") as x:
                    x[0, w] += 1
                    x[-1, w] += 1
            sd, sf = d.stats(), full.stats()
            d.halo_exchange()
            full.halo_exchange()
            sent_d = d.stats()["mpi_bytes_sent"] - sd["mpi_bytes_sent"]
            sent_f = full.stats()["mpi_bytes_sent"] - sf["mpi_bytes_sent"]
            assert sent_f == nb * row
            assert sent_d <= nb * (row // 10 + 2 * 64 + 16), (sent_d, sent_f)
            with d.cpu("r", halo=True) as x, full.cpu("r", halo=True) as y:
                assert np.array_equal(x, y)
        assert d.stats()["delta_bytes_saved"] > 0
        d.delta = False
        assert not d.delta


# ---- the local block ----

def test_the_local_block_on_both_sides(backend):
    with mm.DistArray(comm, (5 * size + 1, 6), np.int32, halo=2, device=backend) as a:
        assert a.local_shape == (a.owned_rows + 4, 6) and a.local.shape == a.local_shape
        assert a.owned.shape == (a.owned_rows, 6) and a.buffer.shape == a.local_shape
        assert a.cuda_aware is False and isinstance(mm.cuda_aware(), bool)
        kind = a.__dlpack_device__()[0]
        assert kind == (1 if backend == "host" else 4)
        if backend == "host":
            assert np.from_dlpack(a).shape == a.local_shape
        with a.cpu("w") as x:
            x[:] = rank
        s = a.device.stream()
        with a.gpu("r", s) as buf:  # synced to the device on s
            assert buf.shape == a.local_shape
        got = a.buffer.get(stream=s)
        assert (got[2:2 + a.owned_rows] == rank).all()
        assert repr(a).startswith("<mapping.mpi.DistArray")


# ---- errors: the same exception on every rank, no hang ----

def test_bad_sizes_fail_alike_on_every_rank():
    dev = "host"
    same_on_every_rank(lambda: mm.DistArray(comm, (100 + rank, 8), np.float32, halo=1, device=dev),
                       mapping.InvalidArgumentError, "rows differs across ranks")
    same_on_every_rank(lambda: mm.DistArray(comm, (64, 8), np.float64 if rank == 2 % size else np.float32, 1,
                                            device=dev), mapping.InvalidArgumentError, "element_bytes differs")
    same_on_every_rank(lambda: mm.DistArray(comm, (64, 8 + (rank == 1)), np.float32, 1, device=dev),
                       mapping.InvalidArgumentError, "cols differs")
    same_on_every_rank(lambda: mm.DistArray(comm, (4 * size + 1, 8), np.float32, halo=5, device=dev),
                       mapping.InvalidArgumentError, "wider than the smallest block")
    same_on_every_rank(lambda: mm.DistArray(comm, (size - 1, 8), np.float32, halo=0, device=dev),
                       mapping.InvalidArgumentError, "would own none")
    alone = comm.Split(rank, 0)
    try:
        same_on_every_rank(lambda: mm.DistArray(alone, (64, 8), np.float32, halo=1, device=dev),
                           mapping.InvalidArgumentError, "one rank")
    finally:
        alone.Free()
    # bad on one rank only, caught in Python: that rank says why, the others that it failed
    e = same_on_every_rank(lambda: mm.DistArray(comm, (-1 if rank == 1 else 64, 8), np.float32, 1, device=dev),
                           mapping.InvalidArgumentError)
    assert ("shape" in str(e)) if rank == 1 else ("failed on rank 1" in str(e))
    with mm.DistArray(comm, (64, 8), np.float32, halo=1, device=dev) as a:  # and the next one works
        a.halo_exchange()


def test_bad_calls_on_an_array_fail_alike_on_every_rank():
    g = np.zeros((64, 8), np.float32)
    with mm.DistArray(comm, (64, 8), np.float32, halo=1, device="host") as a:
        same_on_every_rank(lambda: a.scatter(g, root=size), mapping.InvalidArgumentError, "not a rank")
        same_on_every_rank(lambda: a.scatter(g, root=0 if rank else 1), mapping.InvalidArgumentError,
                           "root differs")
        same_on_every_rank(lambda: a.scatter(np.zeros((3, 3), np.float32), root=0), mapping.InvalidArgumentError,
                           "shape")
        same_on_every_rank(lambda: a.gather(root=0, out=np.zeros(5)), mapping.InvalidArgumentError, "out")
        same_on_every_rank(lambda: setattr(a, "delta", rank == 0), mapping.InvalidArgumentError, "differs")
        # a stream of another device on rank 1: every rank fails with rank 1's status
        other = mapping.open("host", (a.device.index + 1) % 4) if rank == 1 else None
        wrong = other.stream() if other is not None else None
        same_on_every_rank(lambda: a.halo_exchange(wrong), mapping.DeviceMismatchError, "device")
        a.halo_exchange()  # the array still works
        a.scatter(g, root=0)
        a.gather(root=0)
        if other is not None:
            wrong.close()
            other.close()


def test_a_rank_that_raises_between_exchanges_stops_the_others():
    class Boom(Exception):
        pass

    def run():
        with mm.DistArray(comm, (40, 16), np.float32, halo=1, device="host") as a:
            for step in range(5):
                if rank == 2 % size and step == 3:
                    raise Boom("rank 2 fails at step 3")
                a.halo_exchange()
    t0 = time.monotonic()
    with pytest.raises((Boom, mm.PeerError)) as ei:
        run()
    assert time.monotonic() - t0 < 15  # not a timeout: the notice stopped the waits
    if rank == 2 % size:
        assert isinstance(ei.value, Boom)
    else:
        assert isinstance(ei.value, mm.PeerError) and ei.value.rank == 2 % size and "Boom" in ei.value.why
    comm.Barrier()
    with mm.DistArray(comm, (40, 16), np.float32, halo=1, device="host") as a:  # new arrays work
        a.halo_exchange()


def test_a_rank_interrupted_in_the_middle_of_an_exchange_stops_the_others():
    class Interrupt(Exception):
        pass

    def handler(signum, frame):
        raise Interrupt("a signal in the middle of an exchange")
    old = signal.signal(signal.SIGUSR1, handler)
    timer = None
    try:
        with pytest.raises((Interrupt, mm.PeerError)) as ei:
            with mm.DistArray(comm, (40, 16), np.float32, halo=1, device="host") as a:
                a.halo_exchange()
                if rank == 2 % size:  # interrupted while it waits for rank 3, which is late
                    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
                    timer.start()
                if rank == 3 % size:
                    time.sleep(1.0)
                a.halo_exchange()
        if rank == 2 % size:
            assert isinstance(ei.value, Interrupt)
        else:
            assert isinstance(ei.value, mm.PeerError) and ei.value.rank == 2 % size
            assert "Interrupt" in ei.value.why
    finally:
        if timer is not None:
            timer.join()
        signal.signal(signal.SIGUSR1, old)
    comm.Barrier()
    with mm.DistArray(comm, (40, 16), np.float32, halo=1, device="host") as a:
        a.halo_exchange()


def test_a_rank_that_never_comes_gives_wait_timeout():
    mm.set_timeout(1.0)
    got = None
    try:
        with mm.DistArray(comm, (40, 16), np.float32, halo=1, device="host") as a:
            if rank == 0:
                time.sleep(3.0)  # past the others' timeout; then it finds their notices
            a.halo_exchange()
    except (mm.WaitTimeout, mm.PeerError) as e:
        got = e
    finally:
        mm.set_timeout(20)
    names = comm.allgather(type(got).__name__)
    assert set(names) <= {"WaitTimeout", "PeerError"} and "WaitTimeout" in names, names
    comm.Barrier()
