"""The one closed-form check of an allreduce result, for every test that runs one.

Inputs come from ``collectives.bench.fill_input`` (small integers that encode rank and
index, exact in every dtype) and the exact answer from ``collectives.bench.expected_result``
— the same pair ``ringtune bench --check`` uses, so the tests and the product agree on what
"right" means. Use::

    buf = check_input(count, dtype, op, rank)        # this rank's input (host array)
    ... allreduce buf ...
    fails += mismatches(got, count, dtype, op, size, where="multiring rings=2")
    fails += disagreement(got, comm.allgather, where)   # bitwise identical on every rank

``avg`` on floating types is compared with a relative tolerance (the division rounds); every
other case must be exact.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from collectives.bench import expected_result, fill_input

__all__ = ["check_input", "digest", "disagreement", "expected", "mismatches"]


def check_input(count: int, dtype: str, op: str, rank: int) -> np.ndarray:
    """``rank``'s check input for ``op``: ``count`` elements of ``dtype`` (a fresh host
    array, the caller's to reduce in place)."""
    return _input(count, dtype, op, rank).copy()


@functools.lru_cache(maxsize=4096)
def _input(count: int, dtype: str, op: str, rank: int) -> np.ndarray:
    buf = np.empty(count, dtype=dtype)
    fill_input(buf, rank, op)
    return buf


@functools.lru_cache(maxsize=4096)
def expected(count: int, dtype: str, op: str, size: int) -> np.ndarray:
    """The exact allreduce over ``size`` ranks of their ``check_input`` (read-only: cached,
    since every rank of an in-process world asks for the same)."""
    exp = expected_result(count, dtype, op, size)
    exp.setflags(write=False)
    return exp


def mismatches(got: Any, count: int, dtype: str, op: str, size: int,
               where: str = "") -> list[str]:
    """Failure lines (empty when right) for ``got``, the allreduce of ``size`` ranks'
    check inputs: how many elements are wrong and the first of them."""
    got = np.asarray(got).reshape(-1)
    if got.size != count:
        return [f"{where}: result has {got.size} elements, expected {count}"]
    exp = expected(count, dtype, op, size)
    if op == "avg" and np.dtype(dtype).kind == "f":
        tol = 1e-2 if dtype == "float16" else 1e-6
        bad = np.flatnonzero(~np.isclose(got.astype(np.float64), exp.astype(np.float64),
                                         rtol=tol, atol=0))
    else:
        bad = np.flatnonzero(got != exp)
    if not bad.size:
        return []
    i = int(bad[0])
    return [f"{where} count={count} {dtype} {op} on {size} ranks: {bad.size} wrong, first "
            f"at index {i}: expected {exp[i]!r}, got {got[i]!r}"]


def digest(buf: Any) -> str:
    """A hash of the bytes of a host array (compare results across ranks cheaply)."""
    return hashlib.sha256(np.ascontiguousarray(buf).tobytes()).hexdigest()


def disagreement(got: Any, allgather: Callable[[Any], list[Any]], where: str = "") -> list[str]:
    """Collective: a failure line when the ranks' results are not bitwise identical."""
    digests = allgather(digest(got))
    if len(set(digests)) > 1:
        groups: dict[str, list[int]] = {}
        for r, d in enumerate(digests):
            groups.setdefault(d, []).append(r)
        return [f"{where}: results differ bitwise across ranks "
                f"({' vs '.join(str(g) for g in groups.values())})"]
    return []
