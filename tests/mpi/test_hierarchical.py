"""``hierarchical`` with explicit grids and per-dimension algorithms, at any world size.

Run under ``mpiexec -n K python -m mpi4py -m pytest tests/mpi/test_hierarchical.py`` for K in
1..4. Every verdict is gathered from all ranks before asserting, so all ranks fail alike.
Inputs encode rank and index so the expected reduction has a closed form that is exact in
every dtype; random float inputs check that all ranks get bitwise the same result.
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
from collectives.transports.mpi import MpiTransport

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
RANK = WORLD.Get_rank()
DTYPES = ("float16", "float32", "float64", "int32", "int64")
OPS = ("sum", "prod", "min", "max")


def grids(n: int) -> list[list[int]]:
    """Every ordered factorisation of n, plus the same with a dimension of size 1."""
    out = [g for g in factorisations(n)]
    out += [[1] + g for g in factorisations(n)[:1]] + [factorisations(n)[0] + [1]]
    return out


def inputs(rank: int, count: int, dtype: str, op: str) -> np.ndarray:
    i = np.arange(count, dtype=np.int64)
    if op == "prod":
        # Small factors so that the product over 4 ranks stays exact in float16.
        vals = (rank * 3 + i) % 3 + 1
    else:
        vals = (rank * 31 + i * 7) % 17 - 8
    return vals.astype(dtype)


def expected(count: int, dtype: str, op: str) -> np.ndarray:
    stack = np.stack([inputs(r, count, dtype, op) for r in range(N)]) if count else None
    if stack is None:
        return np.zeros(0, dtype=dtype)
    f = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op]
    return f(stack, axis=0).astype(dtype)


def agree(problems: list[str]) -> None:
    """Fail on every rank if any rank found a problem."""
    everyone = WORLD.allgather(problems)
    flat = [f"rank {r}: {p}" for r, ps in enumerate(everyone) for p in ps]
    assert not flat, "; ".join(flat[:5]) + (f" (+{len(flat) - 5} more)" if len(flat) > 5 else "")


def check_one(comm: Any, count: int, dtype: str, op: str, params: dict[str, Any]) -> list[str]:
    buf = inputs(RANK, count, dtype, op)
    comm.allreduce(buf, op=op, algorithm="hierarchical", **params)
    want = expected(count, dtype, op)
    if not np.array_equal(buf, want):
        bad = int(np.flatnonzero(buf != want)[0])
        return [f"{params} count={count} {dtype} {op}: index {bad} expected {want[bad]} "
                f"got {buf[bad]}"]
    return []


def sizes(rings: int) -> list[int]:
    return [0, 1, max(0, N - 1), N * rings * 3 + 1]


def test_two_by_two_all_dtypes_and_ops(comm: Any) -> None:
    """The issue's target: every dtype and op, the 2x2 grid at 4 ranks (the grid whose
    product is the world elsewhere), small chunks so the multi-chunk path runs."""
    grid = [2, 2] if N == 4 else factorisations(N)[-1]
    problems: list[str] = []
    for rings, inner in ((2, None), (1, ["rhd"] * len(grid)), (1, ["native"] * len(grid))):
        params = {"dims": grid, "rings": rings, "chunk_bytes": 8, "inner": inner}
        for count, dtype, op in product(sizes(rings), DTYPES, OPS):
            problems += check_one(comm, count, dtype, op, params)
    agree(problems)


@pytest.mark.parametrize("inner_kind", ["multiring", "rhd", "native", "mixed"])
def test_every_grid_and_inner(comm: Any, inner_kind: str) -> None:
    problems: list[str] = []
    for grid in grids(N):
        if inner_kind == "mixed":
            inner = [("rhd", "multiring", "native")[j % 3] for j in range(len(grid))]
        else:
            inner = [inner_kind] * len(grid)
        for rings in (1, 3):
            params = {"dims": grid, "rings": rings, "chunk_bytes": 16, "inner": inner}
            for count, (dtype, op) in product(sizes(rings), (("float32", "sum"),
                                                             ("int64", "max"),
                                                             ("float16", "prod"))):
                problems += check_one(comm, count, dtype, op, params)
    agree(problems)


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
        ibuf = inputs(RANK, count, "int32", "sum")
        comm.allreduce(ibuf, algorithm="hierarchical", dims=grid, inner=inner)
        if not np.array_equal(ibuf, expected(count, "int32", "sum")):
            problems.append(f"{inner}: int32 sum wrong at {count} elements")
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
        buf = inputs(RANK, count, dtype, "sum")
        algo.run(buf)
        if not np.array_equal(buf, expected(count, dtype, "sum")):
            problems.append(f"auto dims, hosts {hosts}, count {count} {dtype}: wrong result")
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
        cfg = suggest(trial, N, 1 << 16, ["hierarchical"])
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
