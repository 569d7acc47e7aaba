"""The toy algorithm of ``tests/toy_algorithm.py``, registered from this test, meets the
allreduce contract at this world size: every dtype and op, sizes {0, 1, n−1, odd, ~64 Ki},
results equal to the closed form and bitwise identical on every rank — alone, with either
root, and as the ``inner`` algorithm of a ``hierarchical`` grid — and the tuner's objective
checks and times it. No file outside the toy's module names it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from autotune.objective import COMPLETE, evaluate, timing_for
from collectives.algorithms import algorithm_names
from collectives.algorithms.registry import registered
from collectives.bench import check_allreduce, fill_input
from collectives.ops import DTYPES, OPS
from collectives.plan import Config

from ..toy_algorithm import Toy
from .conftest import WORLD, agree

N = WORLD.Get_size()
SIZES = sorted({0, 1, max(N - 1, 0), 3 * N + 1, (1 << 16) + 3})


@pytest.fixture(autouse=True)
def toy() -> Iterator[None]:
    with registered(Toy):
        yield
    assert "toy" not in algorithm_names()


def _grids() -> list[dict[str, Any]]:
    """Hierarchical grids with the toy along some dimension: flat, and 2 x N/2 when even."""
    out: list[dict[str, Any]] = [{"dims": [N], "inner": ["toy"]}]
    if N % 2 == 0 and N > 2:
        out += [{"dims": [2, N // 2], "inner": ["toy", "rhd"]},
                {"dims": [2, N // 2], "inner": ["multiring", "toy"]}]
    return out


CONFIGS = [("toy", {}), ("toy", {"root": N - 1})] + [("hierarchical", g) for g in _grids()]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_contract(comm: Any, cfg: tuple[str, dict[str, Any]]) -> None:
    algo, params = cfg
    fails: list[str] = []
    for dtype in DTYPES:
        for op in OPS:
            for count in SIZES:
                res = check_allreduce(comm, count, dtype, op, algo, params)
                where = f"{algo} {params} count={count} {dtype} {op}"
                if not res.ok:
                    fails.append(f"{where}: {res.error or f'{res.wrong} wrong elements'}")
                buf = np.empty(count, dtype=dtype)
                fill_input(buf, comm.rank, op)
                comm.allreduce(buf, op=op, algorithm=algo, **params)
                digests = WORLD.allgather(hashlib.sha256(buf.tobytes()).hexdigest())
                if len(set(digests)) > 1:
                    fails.append(f"{where}: results differ bitwise across ranks")
    comm.clear_plans()
    agree(fails)


def test_the_tuner_checks_and_times_it(comm: Any) -> None:
    fails: list[str] = []
    outcome = evaluate(comm, 1 << 16, "float32", "sum", Config("toy", {"root": 0}),
                       timing_for(100.0))
    if outcome.state != COMPLETE:
        fails.append(f"toy: {outcome.state} {outcome.reason}")
    bad = evaluate(comm, 1 << 16, "float32", "sum", Config("toy", {"root": N}),
                   timing_for(100.0))
    if bad.state == COMPLETE or "root" not in (bad.reason or ""):
        fails.append(f"toy root={N}: {bad.state} {bad.reason} (expected a refusal)")
    agree(fails)
