"""The allreduce contract (``collectives/testing/contract.py``) at every world size 1..16,
in-process.

Threads stand for ranks (``tests/inproc.py``); the real ``Communicator`` runs every
registered algorithm over the ``inproc`` transport on the world communicator, a ``Dup()``
and a ``Split()`` with non-contiguous ranks. Small worlds run every size × op (the dtype
rotating); large ones every size once with op and dtype rotating across configurations —
the full size × dtype × op product runs under ``mpiexec`` (``tests/mpi/test_contract.py``,
the same suite body).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from collectives.testing import contract
from tests import inproc

SIZES = list(range(1, 17))


@pytest.fixture(autouse=True)
def _inproc(monkeypatch: pytest.MonkeyPatch) -> None:
    inproc.register()
    # A failing call raises on its rank (the others then fail with a line naming it)
    # instead of aborting the process, which is every rank here.
    monkeypatch.setenv("RINGTUNE_ON_ERROR", "raise")
    monkeypatch.delenv("RINGTUNE_PROFILE", raising=False)
    monkeypatch.delenv("RINGTUNE_CHECK", raising=False)


SETUP = contract.Setup(transport="inproc", label="inproc")


def _sweep(n: int, kind: str, body: Callable[[Any], list[str]]) -> None:
    """Run ``body(communicator)`` on every rank of an n-rank world, on the communicator of
    ``kind``; fail with every rank's failure lines."""

    def rank(world: Any) -> list[str]:
        # One host, the world's size: probing from every thread would be slow.
        with contract.communicator_of(world, kind, inproc.topology) as (c, label):
            return [f"{label}: {line}" for line in body(c)]

    fails = [line for lines in inproc.run_ranks(n, rank) for line in lines]
    assert not fails, "\n".join(fails[:12])


def _contract(c: Any, dense: bool = False) -> list[str]:
    """Every family and every size × op (dtype rotating) when ``dense``; else the light
    families, every size once."""
    return contract.run_configs(c, contract.configs(c.size, light=not dense), SETUP,
                                density="ops" if dense else "sparse")


@pytest.mark.parametrize("n", SIZES)
def test_contract_on_world(n: int) -> None:
    _sweep(n, "world", lambda c: _contract(c, dense=n <= 4))


@pytest.mark.parametrize("n", [3, 8, 13])
def test_contract_on_dup(n: int) -> None:
    _sweep(n, "dup", _contract)


@pytest.mark.parametrize("n", [2, 5, 7, 16])
def test_contract_on_split(n: int) -> None:
    """Two groups at once (even and odd world ranks, each in reverse order)."""
    _sweep(n, "split", _contract)


@pytest.mark.parametrize("kind", contract.COMM_KINDS)
@pytest.mark.parametrize("n", [3, 6])
def test_shape_default_choice_and_plan_cache(n: int, kind: str) -> None:
    _sweep(n, kind, lambda c: (contract.check_shaped_in_place(c, SETUP)
                               + contract.check_default_choice(c, SETUP, (0, 5, 4099))
                               + contract.check_plan_cache(c, SETUP)))


def test_every_registered_algorithm_is_in_the_contract() -> None:
    """The contract takes its algorithms from the registry: a new one is in it at once."""
    from collectives.algorithms import algorithm_names

    names = {name for name, _ in contract.configs(5)}
    assert names == set(algorithm_names()) - contract.TEST_ONLY
    assert {name for name, _ in contract.configs(5, light=True)} == names


def test_sparse_cases_cover_every_dtype_and_op() -> None:
    from collectives.ops import DTYPES, OPS

    for n in (5, 16):
        for offset in range(3):
            got = contract.cases(n, {}, "sparse", offset)
            assert {d for _, d, _ in got} == set(DTYPES) and {o for _, _, o in got} == set(OPS)
            assert {c for c, _, _ in got} == set(contract.sizes(n, 1))
    pairs = {(d, o) for off in range(25) for _, d, o in contract.cases(7, {}, "sparse", off)}
    assert len(pairs) == len(DTYPES) * len(OPS)


# -- the in-process world itself ---------------------------------------------------------


def test_a_deadlock_fails_with_the_rank_that_waited() -> None:
    """A receive nobody sends: the ranks time out (none hangs), and the message names each
    blocked rank and what it waits for."""
    import numpy as np

    def body(comm: Any) -> None:
        if comm.rank == 1:
            comm.Irecv(np.zeros(4), 0, 7).Wait()
        comm.Barrier()

    with pytest.raises(AssertionError, match="InprocTimeout") as err:
        inproc.run_ranks(3, body, timeout=0.5)
    text = str(err.value)
    assert "rank 1 waits for a message from rank 0 with tag 7" in text or (
        "rank 1: no progress for 0.5 s waiting for a message from rank 0 with tag 7" in text)
    assert "Barrier on communicator WORLD (ranks [1] had not called it" in text


def test_size_mismatch_and_order_of_messages() -> None:
    import numpy as np

    def body(comm: Any) -> list[int]:
        if comm.rank == 0:
            for v in (1, 2, 3):
                comm.Isend(np.full(2, v), 1, 5)
            comm.Isend(np.zeros(3), 1, 6)
            return []
        got = [np.zeros(2, dtype=np.int64) for _ in range(3)]
        reqs = [comm.Irecv(g, 0, 5) for g in got]
        reqs[2].Wait()  # out of order: still the third message
        reqs[0].Wait()
        reqs[1].Wait()
        try:
            comm.Irecv(np.zeros(2), 0, 6).Wait()
        except ValueError as exc:
            assert "24 B from rank 0 (tag 6) met a receive of 16 B" in str(exc)
        return [int(g[0]) for g in got]

    assert inproc.run_ranks(2, body)[1] == [1, 2, 3]


def test_split_dup_and_collectives() -> None:
    import numpy as np

    def body(comm: Any) -> tuple[Any, ...]:
        sub, _ = contract.communicator(comm, "split")
        dup = comm.Dup()
        arr = np.array([comm.rank + 1.0])
        dup.Allreduce(None, arr, "max")
        return (sub.Get_rank(), sub.Get_size(), sub.allgather(comm.rank),
                dup.bcast(comm.rank * 10, root=2), float(arr[0]))

    out = inproc.run_ranks(5, body)
    assert out[0][:3] == (2, 3, [4, 2, 0]) and out[1][:3] == (1, 2, [3, 1])
    assert all(o[3] == 20 and o[4] == 5.0 for o in out)


def _toy_algorithms() -> tuple[type, type]:
    """A correct toy algorithm (every rank sends its whole buffer to every other, then
    reduces in rank order) and a broken one (it leaves out the last rank's data)."""
    import numpy as np

    from collectives.algorithms import Algorithm

    class Toy(Algorithm):
        name = "toy_direct"
        skip_last = False

        def run(self, buf: Any) -> None:
            ctx, n = self.ctx, self.ctx.size
            if n == 1 or self.count == 0:
                return
            parts = [buf.copy() if r == ctx.rank else np.empty_like(buf) for r in range(n)]
            peers = [r for r in range(n) if r != ctx.rank]
            ctx.transport.start([(buf, r, 3) for r in peers],
                                [(parts[r], r, 3) for r in peers]).wait()
            buf[...] = parts[0]
            for part in parts[1:n - 1 if self.skip_last else n]:
                ctx.backend.reduce_into(buf, part, self.op)

    class Broken(Toy):
        name = "toy_broken"
        skip_last = True

    return Toy, Broken


def test_a_new_algorithm_is_run_by_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registered from a test, with no edit elsewhere: the contract lists it and runs it;
    a wrong one fails with the configuration, size, dtype and op of the first bad call."""
    from collectives.algorithms import registry

    toy, broken = _toy_algorithms()
    for cls in (toy, broken):
        monkeypatch.setitem(registry._REGISTRY, cls.name, cls)
    assert ("toy_direct", {}) in contract.configs(4)
    _sweep(5, "split", lambda c: contract.run_configs(c, [("toy_direct", {})], SETUP,
                                                      density="ops"))
    with pytest.raises(AssertionError, match=r"inproc toy_broken count=1 \w+ \w+ on 5 "
                                             r"ranks: 1 wrong"):
        _sweep(5, "world", lambda c: contract.run_configs(c, [("toy_broken", {})], SETUP,
                                                          density="ops"))


@pytest.mark.parametrize("n", [4, 6])
def test_hierarchical_average_is_the_sum_divided_bit_for_bit(
        n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hierarchical`` divides for ``avg`` itself (``fuses_average``: each rank its owned
    block, before the all-gather): the result is the bits of the sum divided afterwards —
    on inputs whose sums round — pipelined or not, inner multiring, rhd or native, odd sizes
    and sizes smaller than the pieces; and no rank divides the whole buffer."""
    import numpy as np

    from collectives.backend import NumpyBackend

    divided: list[int] = []
    plain = NumpyBackend.divide

    def counting(self: Any, buf: Any, k: int) -> None:
        divided.append(int(buf.size))
        plain(self, buf, k)

    monkeypatch.setattr(NumpyBackend, "divide", counting)
    grids = [[2, n // 2], [n // 2, 2]]
    params = [{"dims": g, "inner": inner, "pipeline": p, "rings": 2, "chunk_bytes": 16}
              for g in grids for inner, p in ((["multiring", "rhd"], 1),
                                              (["rhd", "multiring"], 4),
                                              (["native", "multiring"], 1),
                                              (["multiring", "multiring"], 64))]
    counts = (1, n - 1, 1001)

    def body(c: Any) -> list[str]:
        bad = []
        for dtype in ("float32", "float16", "int32"):
            for count in counts:
                rng = np.random.default_rng(1000 * c.rank + count)
                x = (rng.standard_normal(count) * 1000).astype(dtype)
                for ps in params:
                    expect = x.copy()
                    c.allreduce(expect, op="sum", algorithm="hierarchical",
                                transport=SETUP.transport, **ps)
                    if dtype == "int32":  # toward zero, as C and NCCL
                        expect = (np.sign(expect) * (np.abs(expect) // c.size)).astype(dtype)
                    else:
                        expect = np.divide(expect, expect.dtype.type(c.size))
                    got = x.copy()
                    c.allreduce(got, op="avg", algorithm="hierarchical",
                                transport=SETUP.transport, **ps)
                    if got.tobytes() != expect.tobytes():
                        bad.append(f"rank {c.rank} {dtype} count {count} {ps}: "
                                   f"{int(np.sum(got != expect))} elements differ")
        return bad

    _sweep(n, "world", body)
    assert divided and max(divided) < max(counts), max(divided)
