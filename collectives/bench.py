"""The benchmark harness (nccl-tests conventions): check, time and tabulate allreduce.

Every speed figure of ringtune — ``ringtune bench``, each tuning trial, the scripts under
``benchmarks/`` — comes from here, so they all mean the same thing:

- one iteration's time is the slowest rank's (max over ranks); the reported time is the
  median over the timed iterations;
- ``algbw = bytes / time`` and ``busbw = algbw · 2(n−1)/n`` (comparable across rank counts);
- checking fills inputs that encode rank and index, so the expected result has a closed
  form that is exact in every dtype, and counts the mismatched elements (``#wrong``).

All functions here are collective over the communicator and return the same value on
every rank.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from safefiles.numbers import parse_number
from safefiles.numbers import parse_size as _parse_size

from .communicator import Communicator

# busbw lives in ops (online tuning records it without importing the harness); the
# harness's importers keep finding it here.
from .ops import busbw as busbw
from .ops import busbw_factor, is_integer, itemsize
from .registry import get_backend


def parse_size(text: str | int, what: str = "size") -> int:
    """``"4K"``, ``"64M"``, ``"1G"`` or ``"1048576"`` → bytes (K/M/G are powers of 1024, as
    nccl-tests). ``ValueError`` naming ``what`` and the text otherwise: a negative, ``inf``,
    ``nan``, ``1e400`` or a size above ``safefiles.numbers.MAX_SIZE`` included (the one
    number parser, ``safefiles.numbers``)."""
    return _parse_size(text, what)


def size_list(begin: int, end: int, factor: float) -> list[int]:
    """Sizes from ``begin`` to ``end`` bytes, multiplying by ``factor`` (nccl-tests ``-f``)."""
    # A factor of inf or nan would make the loop below never end or overflow: refuse it.
    factor = parse_number(factor, "-f (factor)", kind=float, hi=1 << 20)
    if factor <= 1:
        raise ValueError(f"-f (factor) must be greater than 1, got {factor}")
    if end < begin:
        raise ValueError(f"-e ({end}) must not be smaller than -b ({begin})")
    out, s = [], max(begin, 0)
    while s <= end:
        out.append(s)
        nxt = int(s * factor)
        s = nxt if nxt > s else s + 1
    return out


# -- closed-form check data ------------------------------------------------------------
# Inputs depend on the index only through a small period, so the expected reduction over
# all ranks is a table of period entries: exact, and O(count) to build for any world size.

_PERIOD = {"sum": 13, "avg": 13, "min": 13, "max": 13, "prod": 15}


def _input_table(op: str, rank: int) -> np.ndarray:
    """Input of ``rank`` for index residues 0..period-1 (small integers, exact in float16)."""
    j = np.arange(_PERIOD[op], dtype=np.int64)
    if op == "prod":
        # Factors ±1/±2 with at most four 2s over all ranks: the product stays ≤ 16 in size.
        mag = np.where(((j + rank) % 3 == 0) & (rank < 12), 2, 1)
        sign = np.where((j + 2 * rank) % 5 == 0, -1, 1)
        return mag * sign
    return (3 * j + 5 * rank) % 13 - 6


def fill_input(buf: np.ndarray, rank: int, op: str) -> None:
    """Fill a host array with ``rank``'s check input for ``op``."""
    table = _input_table(op, rank)
    idx = np.arange(buf.size, dtype=np.int64) % table.size
    buf.reshape(-1)[...] = table[idx].astype(buf.dtype)


def expected_result(count: int, dtype: str, op: str, n: int) -> np.ndarray:
    """The exact allreduce of the check inputs of ranks 0..n−1."""
    tables = np.stack([_input_table(op, r) for r in range(n)])
    red = {"sum": tables.sum(0), "avg": tables.sum(0), "prod": tables.prod(0),
           "min": tables.min(0), "max": tables.max(0)}[op]
    dt = np.dtype(dtype)
    if op == "avg":
        if is_integer(dtype):
            red = np.sign(red) * (np.abs(red) // n)
            table = red.astype(dt)
        else:
            table = np.divide(red.astype(dt), dt.type(n))
    else:
        table = red.astype(dt)
    idx = np.arange(count, dtype=np.int64) % table.size
    return table[idx]


@dataclass(frozen=True)
class CheckResult:
    """Outcome of a correctness check: mismatched elements over all ranks, and the error
    message if the candidate raised (then ``wrong`` is −1)."""

    wrong: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.wrong == 0


def _make_buffer(backend_name: str, count: int, dtype: str) -> Any:
    backend = get_backend(backend_name)
    buf = backend.empty(count, dtype)
    return backend, buf


def _upload(backend: Any, dst: Any, host: np.ndarray) -> None:
    if backend.on_gpu:
        backend.copy_into(dst, host)
        backend.synchronize()
    else:
        np.copyto(dst, host)


def check_allreduce(comm: Communicator, count: int, dtype: str = "float32", op: str = "sum",
                    algorithm: str | None = None, params: Mapping[str, Any] | None = None,
                    transport: str | None = None, backend: str = "numpy") -> CheckResult:
    """Run one allreduce on check inputs and count wrong elements (collective).

    Errors raised before communication (bad parameters, unsupported dtype) are caught and
    returned identically on all ranks, so a bad candidate fails instead of hanging."""
    error: str | None = None
    wrong = 0
    try:
        be, buf = _make_buffer(backend, count, dtype)
        host = np.empty(count, dtype=np.dtype(dtype) if dtype != "bfloat16" else np.float32)
        fill_input(host, comm.rank, op)
        _upload(be, buf, host)
        comm.allreduce(buf, op=op, algorithm=algorithm, transport=transport,
                       **dict(params or {}))
        got = be.to_numpy(buf)
        exp = expected_result(count, dtype if dtype != "bfloat16" else "float32", op,
                              comm.size)
        if op == "avg" and not is_integer(dtype):
            tol = 1e-2 if dtype in ("float16", "bfloat16") else 1e-6
            bad = ~np.isclose(got.astype(np.float64), exp.astype(np.float64), rtol=tol,
                              atol=0)
        else:
            bad = got != exp
        wrong = int(np.count_nonzero(bad))
    except (ValueError, TypeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    everyone = comm.comm.allgather((wrong, error))
    errors = [f"rank {r}: {e}" for r, (_, e) in enumerate(everyone) if e]
    if errors:
        return CheckResult(-1, errors[0] if len(errors) < len(everyone) else everyone[0][1])
    return CheckResult(sum(w for w, _ in everyone))


@dataclass(frozen=True)
class Measurement:
    """Timing of one configuration at one size (identical on all ranks)."""

    nbytes: int
    count: int
    dtype: str
    op: str
    algorithm: str
    params: Mapping[str, Any]
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    samples_us: tuple[float, ...] = field(default=(), repr=False)
    wrong: int | None = None
    #: How ``time_us`` was measured (``TIMINGS``).
    timing: str = "per-iter"


#: The ways ``time_allreduce`` measures a call, and what each figure means.
TIMINGS: dict[str, str] = {
    "per-iter": "median over iterations of the slowest rank's time, each iteration started "
                "by a barrier",
    "back-to-back": "iterations run back to back after one barrier, total time / iterations, "
                    "averaged over ranks (all_reduce_perf's default)",
}


def check_timing(timing: str) -> str:
    """``timing`` if it is one of ``TIMINGS``, else ``ValueError`` naming them."""
    if timing not in TIMINGS:
        raise ValueError(f"timing {timing!r}: use one of {', '.join(TIMINGS)}")
    return timing


def time_allreduce(comm: Communicator, count: int, dtype: str = "float32", op: str = "sum",
                   algorithm: str | None = None, params: Mapping[str, Any] | None = None,
                   warmup: int = 5, iters: int = 20, transport: str | None = None,
                   backend: str = "numpy", timing: str = "per-iter") -> Measurement:
    """Time ``iters`` allreduces after ``warmup`` untimed ones (collective).

    Every candidate — ``native`` included — is timed the same way: its plan is prepared
    once, and each timed call is ``Communicator.run_prepared`` (what ``allreduce`` runs
    once it has found the plan), so no candidate pays per-call work another skips.
    ``timing`` (``TIMINGS``): ``per-iter`` or ``back-to-back``. The buffer starts at zero
    so repeated reductions neither overflow nor hit denormals."""
    check_timing(timing)
    be, buf = _make_buffer(backend, count, dtype)
    _upload(be, buf, np.zeros(count, dtype=np.dtype(dtype) if dtype != "bfloat16"
                                 else np.float32))
    p = dict(params or {})
    prepared = comm.prepared(buf, op=op, algorithm=algorithm, transport=transport, **p)
    flat = be.as_flat(buf)
    run = comm.run_prepared
    for _ in range(warmup):
        run(prepared, flat)
    barrier = comm.comm.Barrier
    clock = time.perf_counter
    # The engine's own reduction of the timings (MPI_Allreduce, or the process group's).
    reduce_times = comm.engine.allreduce_array

    if timing == "back-to-back":
        barrier()
        t0 = clock()
        for _ in range(iters):
            run(prepared, flat)
        total = np.array([(clock() - t0) / max(1, iters)])
        reduce_times(comm.comm, total, "sum")
        samples: tuple[float, ...] = (float(total[0]) / comm.size * 1e6,)
    else:
        local = np.empty(iters, dtype=np.float64)
        for i in range(iters):
            barrier()
            t0 = clock()
            run(prepared, flat)
            local[i] = clock() - t0
        reduce_times(comm.comm, local, "max")
        samples = tuple(float(s) * 1e6 for s in local)
    t_us = statistics.median(samples) if samples else 0.0
    nbytes = count * itemsize(dtype)
    algbw = nbytes / (t_us * 1e-6) / 1e9 if t_us > 0 else 0.0
    if algorithm is None:
        plan = comm.plan_for(nbytes)
        name, used = plan.algorithm, dict(plan.params)
    else:
        name, used = algorithm, p
    return Measurement(nbytes, count, dtype, op, name, used, t_us, algbw,
                       algbw * busbw_factor(comm.size), samples, timing=timing)


# -- the table ---------------------------------------------------------------------------

def run_bench(comm: Communicator, sizes: Sequence[int], dtype: str = "float32",
              op: str = "sum", algorithm: str | None = None,
              params: Mapping[str, Any] | None = None, warmup: int = 5, iters: int = 20,
              check: bool = True, transport: str | None = None, backend: str = "numpy",
              on_row: Any = None, timing: str = "per-iter") -> list[Measurement]:
    """Check (when ``check``) and time each size; ``on_row(m)`` is called per row (rank 0
    prints as it goes, so long runs show progress)."""
    size = itemsize(dtype)
    rows = []
    for nbytes in sizes:
        count = nbytes // size
        wrong: int | None = None
        if check:
            res = check_allreduce(comm, count, dtype, op, algorithm, params, transport,
                                  backend)
            if res.error:
                raise ValueError(res.error)
            wrong = res.wrong
        m = time_allreduce(comm, count, dtype, op, algorithm, params, warmup, iters,
                           transport, backend, timing)
        m = Measurement(**{**asdict(m), "samples_us": m.samples_us, "wrong": wrong})
        rows.append(m)
        if on_row is not None:
            on_row(m)
    return rows


def _algo_label(m: Measurement) -> str:
    """``multiring(r2,c65536)``: the table's narrow column; the two parameters every ring
    has are abbreviated, other numeric ones keep their name (``sleep(seconds=0.0)``), text
    and lists are left to the full configuration text of the reports."""
    if not m.params:
        return m.algorithm
    short = {"rings": "r", "chunk_bytes": "c"}
    bits = [f"{short[k]}{v}" if k in short else f"{k}={v}" for k, v in m.params.items()
            if k in short or not isinstance(v, (str, list))]
    return f"{m.algorithm}({','.join(bits)})" if bits else m.algorithm


def format_row(m: Measurement) -> str:
    wrong = "N/A" if m.wrong is None else str(m.wrong)
    return (f"{m.nbytes:>12} {m.count:>11} {m.dtype:>8} {m.op:>6} {_algo_label(m):>22} "
            f"{m.time_us:>10.1f} {m.algbw_gbps:>11.3f} {m.busbw_gbps:>11.3f} {wrong:>6}")


def format_header() -> str:
    return (f"{'size':>12} {'count':>11} {'type':>8} {'redop':>6} {'algo':>22} "
            f"{'time(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6}")


def avg_busbw(rows: Sequence[Measurement]) -> float:
    return statistics.fmean(m.busbw_gbps for m in rows) if rows else 0.0


def rows_to_json(rows: Sequence[Measurement], meta: Mapping[str, Any]) -> str:
    out = {**meta, "rows": [
        {"size": m.nbytes, "count": m.count, "type": m.dtype, "redop": m.op,
         "algo": m.algorithm, "params": dict(m.params), "time_us": round(m.time_us, 3),
         "algbw_gbps": round(m.algbw_gbps, 4), "busbw_gbps": round(m.busbw_gbps, 4),
         "wrong": m.wrong} for m in rows],
        "avg_busbw_gbps": round(avg_busbw(rows), 4)}
    return json.dumps(out, indent=2)
