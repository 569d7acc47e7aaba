"""PyTorch tensors in ``Communicator.allreduce`` and ``allreduce_many``, the communication
thread's error path, and the torch API's bad-input errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from collectives.training import exchange
from collectives.training.exchange import ExchangeError, Exchanger

from .conftest import WORLD, agree

RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


def _mine(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed + 1000 * RANK)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)


def test_import_collectives_does_not_import_torch() -> None:
    code = ("import sys, collectives, collectives.tensors, collectives.training.fusion, "
            "collectives.training.exchange; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    agree([] if out.stdout.strip() == "False" else [f"torch imported: {out!r}"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
def test_cpu_tensor_in_place(comm, dtype) -> None:
    t = _mine((3, 5), dtype)
    everyone = WORLD.allgather(t.numpy().copy())
    want = np.sum(everyone, axis=0, dtype=everyone[0].dtype)
    ptr = t.data_ptr()
    out = comm.allreduce(t)
    # Floats: the library sums in its own order, NumPy in rank order.
    close = (np.allclose(t.numpy(), want, rtol=1e-5) if dtype.is_floating_point
             else np.array_equal(t.numpy(), want))
    agree([] if out is t and t.data_ptr() == ptr and close
          else [f"{dtype}: got {t.numpy()}, want {want}"])


def test_avg_of_parameter_under_no_grad(comm) -> None:
    p = torch.nn.Parameter(torch.full((4,), float(RANK)))
    with torch.no_grad():
        comm.allreduce(p, op="avg")
    want = sum(range(SIZE)) / SIZE
    agree([] if torch.all(p == want) and p.requires_grad else [f"{p}"])


@pytest.mark.parametrize("make,needle,fix", [
    (lambda: torch.zeros(4, 6)[:, ::2], "not contiguous", "t.contiguous()"),
    (lambda: torch.zeros(4, requires_grad=True), "requires grad", "torch.no_grad()"),
    (lambda: torch.zeros(4, device="meta"), "device meta", "t.cpu()"),
])
def test_bad_tensor_names_rank_and_fix(comm, make, needle, fix) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        comm.allreduce(make())
    msg = str(info.value)
    agree([] if msg.startswith(f"rank {RANK}:") and needle in msg and fix in msg
          else [msg])


def test_bad_tensor_in_allreduce_many(comm) -> None:
    with pytest.raises(ValueError, match=f"rank {RANK}: .*not contiguous"):
        comm.allreduce_many([torch.zeros(3), torch.zeros(4, 4).t()])


def _many(seed: int) -> list:
    """A model-like mix: tensors of many sizes and dtypes, and a NumPy array."""
    sizes = [7, 1, 300, 4096, 13, 70000, 2, 999, 5]
    out: list = []
    for i, n in enumerate(sizes):
        dt = (torch.float32, torch.int64, torch.float64)[i % 3]
        t = _mine((n,), dt, seed + i)
        if dt.is_floating_point and SIZE > 2:
            # Exact partial sums at any rank count and in any order: 1/8ths of small ints.
            t = torch.round(t * 64) / 8
        out.append(t)
    out.append(np.arange(17, dtype=np.float32) * (RANK + 1))
    return out


@pytest.mark.parametrize("bucket_bytes", [None, 64, 4096, 1 << 16, 1 << 30])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_allreduce_many_matches_per_tensor_bitwise(comm, bucket_bytes, op) -> None:
    fused, single = _many(7), _many(7)
    ret = comm.allreduce_many(fused, op=op, bucket_bytes=bucket_bytes)
    for s in single:
        comm.allreduce(s, op=op)
    bad = []
    if len(ret) != len(fused) or any(a is not b for a, b in zip(ret, fused)):
        bad.append("allreduce_many did not return the buffers it was given")
    for i, (f, s) in enumerate(zip(fused, single)):
        fa = f.numpy() if isinstance(f, torch.Tensor) else f
        sa = s.numpy() if isinstance(s, torch.Tensor) else s
        if fa.tobytes() != sa.tobytes():
            bad.append(f"buffer {i} ({fa.dtype}, {fa.size}): differs from per-tensor "
                       f"allreduce at {np.flatnonzero(fa != sa)[:5]}")
    agree(bad)


def test_allreduce_many_bad_bucket_bytes(comm) -> None:
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=f"rank {RANK}: bucket_bytes"):
            comm.allreduce_many([torch.zeros(2)], bucket_bytes=bad)


def test_error_on_comm_thread_reaches_caller(comm) -> None:
    ex = Exchanger(comm)

    def boom() -> None:
        raise RuntimeError("injected failure")

    first = ex.submit(boom)
    later = ex.submit(lambda: 1)
    bad = []
    try:
        first.result(timeout=60)
        bad.append("no error")
    except RuntimeError as exc:
        if "injected failure" not in str(exc):
            bad.append(str(exc))
    try:
        later.result(timeout=60)
        bad.append("a job after the failure ran")
    except ExchangeError as exc:
        if "earlier exchange failed" not in str(exc):
            bad.append(str(exc))
    ex.close()
    closed = ex.submit(lambda: 1)
    if not isinstance(closed.exception(timeout=5), ExchangeError):
        bad.append("a closed exchanger accepted work")
    agree(bad)


def test_thread_level_checked(comm, monkeypatch) -> None:
    monkeypatch.setattr(exchange, "thread_level", lambda concurrent=False: (1, 2))
    with pytest.raises(ExchangeError, match=f"rank {RANK}: MPI was initialised with "
                       "MPI_THREAD_FUNNELED.*MPI_THREAD_SERIALIZED"):
        Exchanger(comm)


def test_torch_missing_is_one_line() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import collectives.torch\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    msg = out.stdout.strip()
    agree([] if "collectives.torch needs PyTorch" in msg and "ringtune[torch]" in msg
          and msg.startswith("rank ") else [repr(out)])


def test_trace_records_each_job_in_order(comm) -> None:
    """``Exchanger.trace()``: one entry per job with its label, handed over before it
    started and started before it ended; nothing recorded once tracing stops."""
    ex = Exchanger(comm)
    trace = ex.trace(True)
    futs = [ex.submit(lambda x=i: x * 2, label=("job", i)) for i in range(5)]
    results = [f.result(timeout=60) for f in futs]
    ex.trace(False)
    ex.submit(lambda: None).result(timeout=60)
    ex.close()
    bad = [] if results == [0, 2, 4, 6, 8] else [f"results {results}"]
    if trace is None or [j[0] for j in trace.jobs] != [("job", i) for i in range(5)]:
        bad.append(f"labels {trace and [j[0] for j in trace.jobs]}")
    else:
        for label, sub, start, end, cpu, waited in trace.jobs:
            if not sub <= start <= end or cpu < 0 or waited < 0:
                bad.append(f"{label}: {sub} {start} {end} {cpu} {waited}")
        starts = [j[2] for j in trace.jobs]
        if starts != sorted(starts):
            bad.append("jobs ran out of order")
    agree(bad)
