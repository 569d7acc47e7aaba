"""``hierarchical`` beyond the contract, at any world size.

Run under ``mpiexec -n K python -m mpi4py -m pytest tests/mpi/test_hierarchical.py`` for K in
1..4. Every grid family, inner choice, dtype and op is in the allreduce contract
(``collectives/testing/contract.py``, run by ``test_contract.py``); here: large random buffers, the
defaults, host layouts, bad parameters and the tuner's search space. Checks of results use
``collectives/testing/results.py``; verdicts are gathered from all ranks before asserting.
"""

from __future__ import annotations

from itertools import product
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from collectives.algorithms import Context, get_algorithm
from collectives.algorithms.hierarchical import (
    Hierarchical,
    auto_dims,
    check_grid_fits_hosts,
    factorisations,
)
from collectives.registry import get_backend
from collectives.testing.results import check_input, mismatches
from collectives.transports.mpi import MpiTransport

from .conftest import agree

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()


def check_one(comm: Any, count: int, dtype: str, op: str, params: dict[str, Any]) -> list[str]:
    buf = check_input(count, dtype, op, RANK)
    comm.allreduce(buf, op=op, algorithm="hierarchical", **params)
    return mismatches(buf, count, dtype, op, N, f"hierarchical {params}")


def sizes(rings: int) -> list[int]:
    return [0, 1, max(0, N - 1), N * rings * 3 + 1]


def test_large_buffer_bitwise_identical(comm: Any) -> None:
    """~1M random float32 elements: every rank ends with bitwise the same result, close to
    the true sum (rounding differs from NumPy's order, so only approximately)."""
    count = (1 << 20) + 3
    rng = np.random.default_rng(1234 + RANK)
    problems: list[str] = []
    grid = [2, 2] if N == 4 else [N]
    for inner in (["multiring"] * len(grid), ["rhd"] * len(grid), ["native"] * len(grid)):
        buf = rng.standard_normal(count).astype(np.float32)
        total = np.zeros(count, dtype=np.float64)
        for data in WORLD.allgather(buf):
            total += data
        comm.allreduce(buf, algorithm="hierarchical", dims=grid, rings=2,
                       chunk_bytes=1 << 16, inner=inner)
        digests = WORLD.allgather(buf.tobytes()[::97])
        if any(d != digests[0] for d in digests):
            problems.append(f"{inner}: results differ across ranks")
        err = float(np.max(np.abs(buf - total)))
        if err > 1e-3:
            problems.append(f"{inner}: max error {err} against the float64 sum")
        # Integers must be exact at this size too.
        problems += check_one(comm, count, "int32", "sum", {"dims": grid, "inner": inner})
    agree(problems)


def test_defaults_work(comm: Any) -> None:
    """``check_params({}, n)`` gives a plan that runs: dims resolved from the host layout."""
    params = get_algorithm("hierarchical").check_params({}, N)
    assert params["dims"] == "auto"
    problems: list[str] = []
    for count in sizes(1):
        problems += check_one(comm, count, "float32", "sum", {})
    agree(problems)


def _context(hosts: tuple[int, ...]) -> Context:
    backend = get_backend("numpy")
    return Context(comm=WORLD, backend=backend, transport=MpiTransport(WORLD, backend),
                   hosts=hosts, world_ranks=tuple(range(N)))


def test_auto_dims_follow_a_multi_host_layout() -> None:
    """Pretend the ranks sit on hosts of two ranks each (hosts interleaved in rank order):
    the default grid is [2, hosts] and the result is right."""
    hosts = tuple(r % max(1, N // 2) for r in range(N)) if N % 2 == 0 else (0,) * N
    ctx = _context(hosts)
    want_dims = auto_dims(hosts, N)
    problems: list[str] = []
    if N == 4 and want_dims != [2, 2]:
        problems.append(f"auto dims {want_dims} for hosts {hosts}")
    for count, dtype in product((0, 1, N * 5 + 1, 1000), ("float64", "int32")):
        algo = Hierarchical(ctx, count, dtype, "sum", Hierarchical.check_params({}, N))
        buf = check_input(count, dtype, "sum", RANK)
        algo.run(buf)
        problems += mismatches(buf, count, dtype, "sum", N, f"auto dims, hosts {hosts}")
    agree(problems)


def test_bad_dims_raise_before_communicating() -> None:
    """Every rank raises the same ValueError, with no collective started (no hang)."""
    cls = get_algorithm("hierarchical")
    for bad, word in (([N + 1], "product"), ([0], "positive"), ("4x4", "list"),
                      ([N, 2], "product")):
        with pytest.raises(ValueError, match=word):
            cls.check_params({"dims": bad}, N)
    with pytest.raises(ValueError, match="inner"):
        cls.check_params({"dims": [N], "inner": ["ring"]}, N)
    with pytest.raises(ValueError, match="one per dimension"):
        cls.check_params({"dims": [N], "inner": ["rhd", "rhd"]}, N)
    if N == 4:
        # Host 0 holds three ranks, host 1 one: a 2x2 grid would pair rank 2 (host 0) with
        # rank 3 (host 1) in its innermost dimension.
        ctx = _context((0, 0, 0, 1))
        params = cls.check_params({"dims": [2, 2]}, N)
        with pytest.raises(ValueError, match="splits a host"):
            Hierarchical(ctx, 100, "float32", "sum", params)
    WORLD.Barrier()


def test_grid_fit_rules() -> None:
    """Pure checks of the host-splitting rule (no communication)."""
    check_grid_fits_hosts([4, 16, 4], tuple(r // 4 for r in range(256)))
    check_grid_fits_hosts([8], (0, 0, 0, 0, 1, 1, 1, 1))      # flat ring over whole hosts
    check_grid_fits_hosts([2, 4], (0, 0, 0, 0, 1, 1, 1, 1))   # pairs inside, then hosts
    with pytest.raises(ValueError, match="splits a host"):
        check_grid_fits_hosts([3, 4], tuple(r // 4 for r in range(12)))
    assert factorisations(12)[0] == [12]
    assert [2, 2, 3] in factorisations(12) and [3, 2, 2] in factorisations(12)


def test_tuner_search_space_gives_runnable_configurations(comm: Any) -> None:
    """What the tuner asks for (``search_space`` through ``autotune.space.suggest``): valid
    parameters that run correctly. Same seed on every rank, so every rank gets the same."""
    import optuna

    from autotune.space import suggest

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    problems: list[str] = []
    seen_dims = set()
    for _ in range(8):
        trial = study.ask()
        cfg = suggest(trial, N, 1 << 16, ["hierarchical"], hosts=len(set(comm.hosts)))
        params = dict(cfg.params)
        checked = get_algorithm(cfg.algorithm).check_params(params, N)
        if N > 1:
            seen_dims.add(tuple(checked["dims"]))
            if len(checked["inner"]) != len(checked["dims"]):
                problems.append(f"{params}: inner does not match dims")
        problems += check_one(comm, N * 37 + 5, "float32", "sum", params)
        study.tell(trial, 1.0)
    if N == 4 and len(seen_dims) < 2:
        problems.append(f"8 random trials explored only the grids {seen_dims}")
    agree(problems)
