"""The simulated GPU checks what it claims to (run only on it: ``make gpu-sim``).

Its value is catching missing stream ordering, so that is tested first: work queued on a
stream is not visible before it runs; a consumer stream that does not wait for a producer
sees stale data under some schedule (and never when it waits); ringtune's ``staged`` and
``nccl`` transports, with their waits removed, deliver wrong data; a reduction not ordered
after the caller's stream reads the buffer before the caller's write. Then the rest of what the GPU
tests rely on: copy kinds refused as a driver would, and C semantics of kernel bodies.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(os.environ.get("RINGTUNE_FAKE_GPU") != "1",
                                reason="tests of the simulated GPU itself (make gpu-sim)")


def _engine() -> Any:
    from cupy import _engine

    return _engine


def _copy(dst: Any, src: Any, stream: Any) -> None:
    import cupy

    rt = cupy.cuda.runtime
    rt.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, rt.memcpyDeviceToDevice,
                   stream.ptr)


def test_queued_copy_lands_only_when_its_stream_runs() -> None:
    import cupy

    s = cupy.cuda.Stream(non_blocking=True)
    src, dst = cupy.arange(8, dtype=cupy.float32), cupy.zeros(8, dtype=cupy.float32)
    _copy(dst, src, s)
    assert cupy.asnumpy(dst).tolist() == [0.0] * 8  # the default stream does not wait for s
    e = cupy.cuda.Event()
    e.record(s)
    e.synchronize()
    assert cupy.asnumpy(dst).tolist() == list(range(8))


def _pipeline(seed: int, wait: bool) -> list[float]:
    """a -> b on stream p, then b -> c on stream q (waiting for p or not)."""
    import cupy

    eng = _engine()
    eng.ENGINE.rng.seed(seed)
    p, q = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    a = cupy.full(4, 7.0, dtype=cupy.float32)
    b, c = cupy.zeros(4, dtype=cupy.float32), cupy.zeros(4, dtype=cupy.float32)
    _copy(b, a, p)
    if wait:
        ev = cupy.cuda.Event()
        ev.record(p)
        q.wait_event(ev)
    _copy(c, b, q)
    q.synchronize()
    p.synchronize()
    return cupy.asnumpy(c).tolist()


def test_a_missing_wait_shows_as_stale_data() -> None:
    unordered = {tuple(_pipeline(seed, wait=False)) for seed in range(20)}
    assert (0.0,) * 4 in unordered, "no schedule ran the consumer before the producer"
    ordered = {tuple(_pipeline(seed, wait=True)) for seed in range(20)}
    assert ordered == {(7.0,) * 4}


def test_staged_transport_without_its_waits_delivers_wrong_data(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mpi4py import MPI

    from collectives.cuda.ops import CudaOps
    from collectives.cuda.staged import StagedTransport
    from collectives.registry import get_backend

    be: Any = get_backend("cupy")

    def run(seed: int) -> bool:
        _engine().ENGINE.rng.seed(seed)
        t = StagedTransport(MPI.COMM_SELF, be, piece_bytes=64)
        src = be.empty(256, "float32")
        be.copy_into(src, np.zeros(256, np.float32))
        one = be.empty(256, "float32")
        be.copy_into(one, np.ones(256, np.float32))
        dst = be.empty(256, "float32")
        be.copy_into(dst, np.full(256, -1, np.float32))
        be.reduce_into(src, one, "sum")  # queued on the backend stream: src becomes 1
        p = t.start([(src, 0, 5)], [(dst, 0, 5)])
        p.wait()
        got = be.to_numpy(dst)
        t.close()
        return bool((got == 1).all())

    assert all(run(seed) for seed in range(10))
    monkeypatch.setattr(CudaOps, "wait", lambda self, stream, event: None)
    assert not all(run(seed) for seed in range(10)), \
        "the simulation did not notice a transport that orders nothing"


def test_copy_kinds_are_checked() -> None:
    import cupy

    rt = cupy.cuda.runtime
    dev = cupy.zeros(4, dtype=cupy.float32)
    host = np.zeros(4, dtype=np.float32)
    with pytest.raises(RuntimeError, match="cudaErrorInvalidValue"):
        rt.memcpyAsync(host.ctypes.data, dev.data.ptr, 16, rt.memcpyHostToDevice, 0)
    with pytest.raises(RuntimeError, match="cudaErrorInvalidValue"):
        rt.memcpyAsync(dev.data.ptr, host.ctypes.data, 16, rt.memcpyDeviceToDevice, 0)


def test_kernel_bodies_follow_c() -> None:
    from cupy import _cexpr

    y = np.array([-7, -6, -1, 0, 1, 6, 7], dtype=np.int32)
    out = _cexpr.run("y = y / n", {"y": y, "n": np.int32(3)})["y"]
    assert out.tolist() == [-2, -2, 0, 0, 0, 2, 2]  # C truncates toward zero
    x = np.array([1, np.nan, 3, 0], dtype=np.float32)
    y = np.array([2, 2, np.nan, 0], dtype=np.float32)
    body = "y = ((x < y || x != x) && !(y != y)) ? x : y"
    got = _cexpr.run(body, {"x": x, "y": y})["y"]
    assert np.array_equal(got, np.minimum(y, x), equal_nan=True)
    with pytest.raises(ValueError, match="unknown name"):
        _cexpr.run("y = y + z", {"y": y})


def test_nccl_transport_without_its_wait_delivers_wrong_data(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The NCCL stream must wait for the reductions queued before a send; the simulated NCCL
    (over MPI, on the streams) shows what happens when it does not."""
    import cupy
    from mpi4py import MPI

    from collectives import Communicator
    from collectives.cuda import available_transports
    from collectives.cuda.nccl import NcclLink
    from collectives.testing.results import check_input, mismatches

    from .conftest import agree

    world = MPI.COMM_WORLD
    if world.Get_size() < 2 or "nccl" not in available_transports(world):
        pytest.skip("needs two ranks with a GPU each (RINGTUNE_FAKE_GPUS >= ranks)")

    def correct(c: Any, seed: int) -> bool:
        _engine().ENGINE.rng.seed(seed)
        right = True
        for algo in ("multiring", "rhd", "hierarchical"):
            for count in (1, 7, 37, 4099):
                buf = cupy.asarray(check_input(count, "float16", "sum", c.rank))
                c.allreduce(buf, algorithm=algo, transport="nccl")
                right &= not mismatches(cupy.asnumpy(buf), count, "float16", "sum", c.size)
        return right

    c = Communicator(world)
    ok = all(world.allgather(all(correct(c, seed) for seed in range(4))))
    monkeypatch.setattr(NcclLink, "_enter", lambda self: None)
    c.clear_plans()
    broken = all(world.allgather(all(correct(c, seed) for seed in range(4))))
    c.close()
    agree([] if ok and not broken else
          [f"with its wait: right={ok}; without: right={broken} (expected True, False)"])


def test_the_callers_stream_is_waited_for() -> None:
    """``as_flat`` orders the backend's stream after the caller's current stream, where the
    buffer was written; without it the reduction may read the buffer before the write."""
    import cupy

    from collectives.registry import get_backend

    be: Any = get_backend("cupy")

    def run(seed: int, ordered: bool) -> float:
        _engine().ENGINE.rng.seed(seed)
        user = cupy.cuda.Stream(non_blocking=True)
        a = cupy.zeros(64, dtype=cupy.float32)
        b = cupy.ones(64, dtype=cupy.float32)
        with user:
            a[...] = 5.0  # queued on the caller's stream
            flat = be.as_flat(a) if ordered else a.reshape(-1)
            be.reduce_into(flat, b, "sum")
        be.synchronize()
        user.synchronize()
        return float(cupy.asnumpy(a)[0])

    assert {run(seed, True) for seed in range(12)} == {6.0}
    assert {run(seed, False) for seed in range(12)} != {6.0}
