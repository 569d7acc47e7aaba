"""The allreduce contract (``collectives/testing/contract.py``) under ``mpiexec``, at any
world size.

The suite body is the one the in-process sweep runs (``tests/unit/test_contract_inproc.py``)
over real MPI: every registered algorithm and parameter family, sizes {0, 1, 2, n−1,
n·rings·3+1, 37, 97}, on the world communicator (defaults: every dtype × op; families:
every op with the dtype rotating, so each pair runs at some size), a ``Dup()`` and a
``Split()`` with non-contiguous ranks (lighter); results equal to the closed form of
``collectives/testing/results.py`` and bitwise identical on every rank. Then ~1M elements,
a shaped buffer, the profile's default choice and the plan cache. A new algorithm is tested here
the moment it is registered (with its default parameters).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collectives.ops import DTYPES, OPS
from collectives.testing import contract
from collectives.testing.results import check_input, disagreement, mismatches

from .conftest import WORLD, agree

#: (Communicator, kind, label) over the world, a ``Dup()`` and a ``Split()`` of it.
kind_comm = contract.kind_comm_fixture(lambda: WORLD)


@pytest.mark.parametrize("algo", contract.contract_algorithms())
def test_contract(kind_comm: tuple[Any, str, str], algo: str) -> None:
    c, kind, label = kind_comm
    cfgs = contract.configs(c.size, [algo])
    if kind == "world":
        # Defaults: every size x dtype x op; families: every size x op, each (dtype, op)
        # pair at some size.
        fails = contract.run_configs(c, cfgs, density="full", family_density="ops")
    else:
        fails = contract.run_configs(c, contract.configs(c.size, [algo], light=True),
                                     density="ops", family_density="sparse")
    agree([f"{label}: {line}" for line in fails])


LARGE = 1 << 20


@pytest.mark.parametrize("cfg", [(name, {}) for name in contract.contract_algorithms()]
                         + [("multiring", {"rings": 4, "chunk_bytes": 1 << 16})],
                         ids=contract.config_id)
def test_large_all_dtypes_ops(comm: Any, cfg: contract.Config) -> None:
    algo, params = cfg
    fails: list[str] = []
    for dtype in DTYPES:
        for op in OPS:
            fails += contract.check_one(comm, algo, params, LARGE + 3, dtype, op)
    agree(fails)


def test_multichunk_path_large_tiny_chunks(comm: Any) -> None:
    """Many chunks per step on a buffer of 64 Ki elements (4 KiB chunks of float16)."""
    agree(contract.check_one(comm, "multiring", {"rings": 2, "chunk_bytes": 4096},
                             (1 << 16) + 5, "float16", "sum"))


def test_shape_default_choice_plan_cache(kind_comm: tuple[Any, str, str]) -> None:
    c, kind, label = kind_comm
    # Both sides of the built-in 32 MiB rule boundary on the world; below it elsewhere.
    counts = (0, 5, 1 << 17, (9 << 20) + 3) if kind == "world" else (0, 5, 1 << 17)
    agree([f"{label}: {line}" for line in contract.check_shaped_in_place(c)
           + contract.check_default_choice(c, counts=counts) + contract.check_plan_cache(c)])


def test_native_widens_half_types_mpi_cannot_reduce(comm: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An MPI without a float16 type (Open MPI; bfloat16 everywhere): ``native`` reduces a
    float32 copy and rounds back once — right, and the same on every rank."""
    # The mpi transport's module: where native's call looks both names up.
    import collectives.transports.mpi as transport

    monkeypatch.setattr(transport, "mpi_reduces", lambda dtype: str(dtype) != "float16")
    widened: list[str] = []
    real = transport.host_allreduce

    def spy(mpi_comm: Any, arr: np.ndarray, op: str) -> None:
        widened.append(str(arr.dtype))
        real(mpi_comm, arr, op)

    monkeypatch.setattr(transport, "host_allreduce", spy)
    fails: list[str] = []
    for op in OPS:
        for count in (0, 1, 37, 4099):
            buf = check_input(count, "float16", op, comm.rank)
            comm.allreduce(buf, op=op, algorithm="native")
            fails += mismatches(buf, count, "float16", op, comm.size, "native float16")
            fails += disagreement(buf, WORLD.allgather, f"native float16 {op} count={count}")
    if comm.size > 1 and set(widened) != {"float16"}:
        fails.append(f"native did not take the host float32 path: {widened}")
    agree(fails)


def test_mpi_reduces_knows_the_half_types() -> None:
    from collectives.transport import mpi_reduces

    agree([] if not mpi_reduces("bfloat16") and mpi_reduces("float32") else
          ["bfloat16 must be widened (MPI has no bfloat16 type)"])
