"""``native`` with ``impl`` under Open MPI: its ``coll/tuned`` algorithms, read from the
library, each run on a duplicate communicator created while it was forced (Open MPI reads
the choice when a communicator is created). Skips under another library.

Which algorithm ran is seen through a logging user-defined sum on the plan's communicator:
basic_linear reduces the whole buffer on rank 0 only, recursive doubling the whole buffer
on every rank, ring pieces of about count/n; the world communicator keeps the default.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from mpi4py import MPI

from collectives.natives import current

from .conftest import WORLD

N = WORLD.Get_size()
RANK = WORLD.Get_rank()
LIB = current()

pytestmark = pytest.mark.skipif(LIB.name != "Open MPI",
                                reason=f"{LIB.label()} is not Open MPI")


def test_algorithms_come_from_the_library() -> None:
    names = LIB.algorithms()
    assert {"ring", "recursive_doubling", "rabenseifner"} <= set(names)
    assert "ignore" not in names and "auto" not in names
    major = int(LIB.version.split(".")[0])
    assert ("allgather_reduce" in names) == (major >= 6)  # 7 is Open MPI 6.0's only


def _sums_and_agrees(comm, impl: str, count: int, period: int) -> None:
    """``native impl=IMPL`` sums an odd-sized float64 buffer exactly, bitwise alike on
    every rank."""
    buf = (np.arange(count, dtype=np.float64) % period) * (RANK + 1)
    comm.allreduce(buf, algorithm="native", impl=impl)
    want = (np.arange(count, dtype=np.float64) % period) * (N * (N + 1) / 2)
    assert np.array_equal(buf, want), f"impl={impl}: wrong sum"
    digests = WORLD.allgather(hashlib.sha256(buf.tobytes()).hexdigest())
    assert len(set(digests)) == 1, f"impl={impl}: ranks disagree"


def test_every_algorithm_sums_correctly_and_agrees(comm) -> None:
    for impl in ["auto", *LIB.algorithms()]:
        _sums_and_agrees(comm, impl, 3 * 1024 + 7, 97)


def test_an_algorithm_the_library_lacks_is_a_value_error(comm) -> None:
    with pytest.raises(ValueError, match=r"'tree' is not an allreduce algorithm of Open MPI"):
        comm.allreduce(np.ones(8, np.float32), algorithm="native", impl="tree")


def _calls(mpi_comm: MPI.Comm, count: int) -> list[list[int]]:
    calls: list[int] = []

    def logged_sum(inbuf: object, inoutbuf: object, datatype: object) -> None:
        a = np.frombuffer(inbuf, dtype=np.float64)  # type: ignore[call-overload]
        b = np.frombuffer(inoutbuf, dtype=np.float64)  # type: ignore[call-overload]
        calls.append(int(a.size))
        b += a

    op = MPI.Op.Create(logged_sum, commute=True)
    try:
        mpi_comm.Allreduce(MPI.IN_PLACE, np.ones(count), op=op)
    finally:
        op.Free()
    return WORLD.allgather(calls)


@pytest.mark.skipif(N < 2, reason="one rank reduces nothing")
def test_the_plan_runs_the_forced_algorithm(comm) -> None:
    count = 3000
    seen = {}
    for impl in ("basic_linear", "recursive_doubling"):
        comm.allreduce(np.ones(count), algorithm="native", impl=impl)
        prepared = [p for p in comm._plans.values()
                    if p.plan.params.get("impl") == impl and p.plan.algorithm == "native"]
        assert prepared, impl
        run_comm = prepared[-1].algo._run_ctx.comm
        assert run_comm != WORLD  # a duplicate made while the algorithm was forced
        seen[impl] = _calls(run_comm, count)
    assert seen["basic_linear"][0] and not any(seen["basic_linear"][1:])
    assert all(c == count for calls in seen["basic_linear"] for c in calls)
    if N & (N - 1) == 0:  # recursive doubling's pure exchange: every rank, whole buffers
        assert all(calls and all(c == count for c in calls)
                   for calls in seen["recursive_doubling"])
    # The world communicator was not changed by the writes.
    assert _calls(WORLD, count) != seen["basic_linear"]


def test_han_is_offered_where_loaded_and_sums_correctly(comm) -> None:
    """``impl=han``: a duplicate made while coll/han's priority was raised. On one host han
    declines the communicator (its ranks share a node) and coll/tuned's own decision runs:
    the result is still the exact sum, the same on every rank; the world keeps its
    components (a tuned algorithm forced afterwards still runs)."""
    from collectives.natives import openmpi

    if not openmpi.han_available():
        pytest.skip("this Open MPI does not load coll/han")
    assert "han" in LIB.algorithms()
    assert "han" not in LIB.algorithms_on(1) and "han" in LIB.algorithms_on(2)
    for impl in ("han", "ring", "han"):
        _sums_and_agrees(comm, impl, 5 * 1024 + 3, 89)
    # The writes were undone: han's priority is its default again.
    from collectives.natives.base import binding

    mpit, _ = binding()
    assert mpit is not None and mpit.read_int(openmpi.HAN_PRIORITY_CVAR) == 35
