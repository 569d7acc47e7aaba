"""The contract every registered allreduce algorithm must meet, at any world size.

Sizes {0, 1, n−1, n·rings·k+1, ~1M elements}, every dtype and op, tiny ``chunk_bytes`` so
the multi-chunk path runs, rings 1..4: the result equals the closed-form reduction of inputs
that encode rank and index, and is bitwise identical on every rank. A new algorithm is
tested here the moment it is registered (with its default parameters).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from collectives.algorithms import algorithm_names
from collectives.bench import expected_result, fill_input
from collectives.ops import DTYPES, OPS

from .conftest import WORLD, agree

N = WORLD.Get_size()

# (algorithm, params) configurations: every registered algorithm with defaults, plus the
# multiring variants the contract names explicitly.
CONFIGS: list[tuple[str, dict[str, Any]]] = [(name, {}) for name in algorithm_names()]
CONFIGS += [("multiring", {"rings": r, "chunk_bytes": 8}) for r in (1, 2, 3, 4)]
CONFIGS += [("multiring", {"rings": 2, "chunk_bytes": 0, "order": "identity"}),
            ("multiring", {"rings": 3, "chunk_bytes": 64,
                           "order": [list(reversed(range(N)))] * 3})]


def _id(cfg: tuple[str, dict[str, Any]]) -> str:
    name, params = cfg
    if not params:
        return name
    return name + "-" + "-".join(f"{k}{v if not isinstance(v, list) else 'perm'}"
                                 for k, v in params.items())


def small_sizes(rings: int) -> list[int]:
    return sorted({0, 1, max(N - 1, 0), N * rings * 3 + 1, 37})


def check_one(comm: Any, algo: str, params: dict[str, Any], count: int, dtype: str,
              op: str) -> list[str]:
    """Run one allreduce; return failure lines (closed form and bitwise agreement)."""
    buf = np.empty(count, dtype=dtype)
    fill_input(buf, comm.rank, op)
    out = comm.allreduce(buf, op=op, algorithm=algo, **params)
    fails = []
    if out is not buf:
        fails.append("allreduce did not return its buffer")
    exp = expected_result(count, dtype, op, comm.size)
    if op == "avg" and dtype.startswith("float"):
        tol = 1e-2 if dtype == "float16" else 1e-6
        bad = np.flatnonzero(~np.isclose(buf, exp, rtol=tol, atol=0))
    else:
        bad = np.flatnonzero(buf != exp)
    where = f"{algo} {params} count={count} {dtype} {op}"
    if bad.size:
        i = int(bad[0])
        fails.append(f"{where}: {bad.size} wrong, first at index {i}: expected {exp[i]!r}, "
                     f"got {buf[i]!r}")
    digest = hashlib.sha256(buf.tobytes()).hexdigest()
    digests = WORLD.allgather(digest)
    if len(set(digests)) > 1:
        fails.append(f"{where}: results differ bitwise across ranks")
    return fails


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_small_sizes_all_ops(comm: Any, cfg: tuple[str, dict[str, Any]], dtype: str) -> None:
    algo, params = cfg
    fails: list[str] = []
    for op in OPS:
        for count in small_sizes(int(params.get("rings", 1))):
            fails += check_one(comm, algo, params, count, dtype, op)
    agree(fails)


LARGE = 1 << 20


@pytest.mark.parametrize("cfg", [(name, {}) for name in algorithm_names()]
                         + [("multiring", {"rings": 4, "chunk_bytes": 1 << 16})], ids=_id)
def test_large_all_dtypes_ops(comm: Any, cfg: tuple[str, dict[str, Any]]) -> None:
    algo, params = cfg
    fails: list[str] = []
    for dtype in DTYPES:
        for op in OPS:
            fails += check_one(comm, algo, params, LARGE + 3, dtype, op)
    agree(fails)


def test_multichunk_path_large_tiny_chunks(comm: Any) -> None:
    """Many chunks per step on a buffer of 64 Ki elements (4 KiB chunks of float16)."""
    fails = check_one(comm, "multiring", {"rings": 2, "chunk_bytes": 4096}, (1 << 16) + 5,
                      "float16", "sum")
    agree(fails)


def test_any_shape_in_place(comm: Any) -> None:
    buf = np.empty((3, 5, 7), dtype=np.float64)
    fill_input(buf, comm.rank, "sum")
    view = buf
    comm.allreduce(buf, op="sum", algorithm="multiring", rings=2, chunk_bytes=16)
    exp = expected_result(buf.size, "float64", "sum", comm.size).reshape(3, 5, 7)
    agree([] if view.shape == (3, 5, 7) and np.array_equal(buf, exp) else
          ["3-D buffer reduced wrongly or reshaped"])


def test_profile_choice_default_path(comm: Any) -> None:
    """Without algorithm=..., the (built-in) profile's choice runs and is correct."""
    fails: list[str] = []
    # Below and above the built-in rule boundary (32 MiB): both rules run.
    for count in (0, 5, 1 << 17, (9 << 20) + 3):
        buf = np.empty(count, dtype=np.float32)
        fill_input(buf, comm.rank, "max")
        comm.allreduce(buf, op="max")
        if not np.array_equal(buf, expected_result(count, "float32", "max", comm.size)):
            fails.append(f"default choice wrong for count={count} ({comm.explain(count * 4)})")
    agree(fails)


def test_plan_cache_reuses_plans(comm: Any) -> None:
    buf = np.ones(1000, dtype=np.float32)
    comm.allreduce(buf, algorithm="rhd")
    after_first = len(comm._plans)
    comm.allreduce(buf, algorithm="rhd")
    agree([] if len(comm._plans) == after_first else ["second identical call built a new plan"])


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
            buf = np.empty(count, dtype=np.float16)
            fill_input(buf, comm.rank, op)
            comm.allreduce(buf, op=op, algorithm="native")
            exp = expected_result(count, "float16", op, comm.size)
            ok = (np.allclose(buf, exp, rtol=1e-2) if op == "avg" else
                  np.array_equal(buf, exp))
            if not ok:
                fails.append(f"native float16 {op} count={count}: {buf[:4]} != {exp[:4]}")
            if len(set(WORLD.allgather(hashlib.sha256(buf.tobytes()).hexdigest()))) > 1:
                fails.append(f"native float16 {op} count={count}: ranks differ")
    if comm.size > 1 and set(widened) != {"float16"}:
        fails.append(f"native did not take the host float32 path: {widened}")
    agree(fails)


def test_mpi_reduces_knows_the_half_types() -> None:
    from collectives.transport import mpi_reduces

    agree([] if not mpi_reduces("bfloat16") and mpi_reduces("float32") else
          ["bfloat16 must be widened (MPI has no bfloat16 type)"])
