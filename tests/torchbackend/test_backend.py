"""The registered ``ringtune`` backend under torchrun: ``dist.all_reduce`` through ringtune
(every op, dtypes, odd sizes, async, both call forms; closed-form results, bitwise equal
on every rank), the delegated collectives, and DDP tracking DDP over gloo."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from .conftest import RANK, SIZE, agree, gloo_group, gloo_world, ringtune_of

OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "prod": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
DTYPES = [torch.float16, torch.float32, torch.float64, torch.int32, torch.int64]
COUNTS = [0, 1, 7, 1000, 65537]


def _input(count: int, dtype: torch.dtype, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input: small values that encode rank and index (exact in every
    dtype, products stay small)."""
    i = np.arange(count)
    return torch.from_numpy(((rank + i) % 3 + 1).astype(np.float64)).to(dtype)


def _expected(count: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    per = np.stack([_input(count, torch.float64, r).numpy() for r in range(SIZE)]) \
        if count else np.zeros((SIZE, 0))
    if op == "sum":
        out = per.sum(0)
    elif op == "prod":
        out = per.prod(0)
    elif op == "min":
        out = per.min(0)
    elif op == "max":
        out = per.max(0)
    else:  # avg: the sum divided by the world size (integers truncate, as NCCL)
        out = per.sum(0) / SIZE
        if not dtype.is_floating_point:
            out = np.trunc(out)
    return torch.from_numpy(out)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def _check(t: torch.Tensor, want: torch.Tensor, what: str) -> list[str]:
    got = t.to(torch.float64)
    tol = 1e-2 if t.dtype == torch.float16 else 1e-6
    if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol):
        bad = int((got - want).abs().argmax()) if got.numel() else 0
        return [f"{what}: index {bad}: expected {want[bad].item() if want.numel() else '-'}, "
                f"got {got[bad].item() if got.numel() else '-'}"]
    return []


def _bitwise_equal(t: torch.Tensor, what: str) -> list[str]:
    """Every rank holds the same bits (one allgather of digests on the gloo group)."""
    digests: list[Any] = [None] * SIZE
    dist.all_gather_object(digests, _digest(t), group=gloo_group())
    return [] if len(set(digests)) == 1 else [f"{what}: ranks hold different bits"]


@pytest.mark.parametrize("op", list(OPS))
def test_all_reduce_every_op_dtype_and_size(op: str) -> None:
    failures = []
    for dtype in DTYPES:
        for count in COUNTS:
            t = _input(count, dtype, RANK)
            dist.all_reduce(t, op=OPS[op])
            what = f"{op} {dtype} x{count}"
            failures += _check(t, _expected(count, dtype, op), what)
            failures += _bitwise_equal(t, what)
    agree(failures)


def test_all_reduce_runs_through_ringtune() -> None:
    """The world's all_reduce is ringtune's: its Communicator plans the call."""
    backend = ringtune_of()
    comm = backend.communicator
    before = len(comm._plans)
    t = _input(12345, torch.float32, RANK)
    dist.all_reduce(t)
    failures = _check(t, _expected(12345, torch.float32, "sum"), "sum")
    if len(comm._plans) != before + 1:
        failures.append(f"the ringtune Communicator made {len(comm._plans) - before} plans")
    if dist.get_backend() != "ringtune":
        failures.append(f"dist.get_backend() is {dist.get_backend()!r}")
    agree(failures)


def test_async_all_reduces_complete_in_order() -> None:
    """Several async calls in flight, a synchronous one behind them, then every Work
    waited for: all correct (the synchronous call queues behind the async ones)."""
    failures = []
    tensors = [_input(1000 + k, torch.float32, RANK) for k in range(6)]
    works = [dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True) for t in tensors[:5]]
    dist.all_reduce(tensors[5], op=dist.ReduceOp.AVG)
    futures = [w.get_future() for w in works]
    for w in works:
        w.wait()
    for k, t in enumerate(tensors):
        failures += _check(t, _expected(1000 + k, torch.float32, "avg"), f"async {k}")
    for k, f in enumerate(futures):
        value = f.value()
        if not (isinstance(value, list) and value and value[0] is tensors[k]):
            failures.append(f"future {k}'s value is {type(value).__name__}, not [tensor]")
    agree(failures)


def test_tensors_op_form_and_options_form() -> None:
    """``allreduce(tensors, op)`` and ``allreduce(tensors, opts)`` on the group object."""
    group = dist.group.WORLD
    a = _input(100, torch.float64, RANK)
    group.allreduce([a], dist.ReduceOp.MAX).wait()
    b = _input(100, torch.float64, RANK)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MIN
    group.allreduce([b], opts).wait()
    agree(_check(a, _expected(100, torch.float64, "max"), "(tensors, op)")
          + _check(b, _expected(100, torch.float64, "min"), "(tensors, opts)"))


def test_non_contiguous_and_requires_grad() -> None:
    base = torch.stack([_input(50, torch.float32, RANK)] * 3, dim=1)  # column views
    view = base[:, 1]
    dist.all_reduce(view)
    p = torch.nn.Parameter(_input(50, torch.float32, RANK))
    dist.all_reduce(p.data)
    want = _expected(50, torch.float32, "sum")
    failures = _check(view, want, "strided view") + _check(p.detach(), want, "parameter")
    failures += _check(base[:, 0], _expected(50, torch.float64, "sum") * 0
                       + _input(50, torch.float64, RANK), "neighbouring column untouched")
    agree(failures)


def test_all_reduce_ringtune_cannot_run_is_delegated() -> None:
    """bfloat16 (no CPU reduction in ringtune) and bitwise ops: gloo's, same result."""
    a = _input(64, torch.bfloat16, RANK)
    dist.all_reduce(a)
    b = torch.full((8,), 1 << RANK, dtype=torch.int64)
    dist.all_reduce(b, op=dist.ReduceOp.BOR)
    failures = _check(a, _expected(64, torch.float64, "sum"), "bfloat16 sum")
    if b.tolist() != [(1 << SIZE) - 1] * 8:
        failures.append(f"BOR: got {b.tolist()}")
    agree(failures)


def test_delegated_collectives() -> None:
    n, r = SIZE, RANK
    failures: list[str] = []

    def expect(what: str, got: Any, want: Any) -> None:
        if got != want:
            failures.append(f"{what}: expected {want}, got {got}")

    t = torch.full((4,), float(r))
    dist.broadcast(t, src=n - 1)
    expect("broadcast", t.tolist(), [float(n - 1)] * 4)
    outs = [torch.zeros(2) for _ in range(n)]
    dist.all_gather(outs, torch.full((2,), float(r)))
    expect("all_gather", [o.tolist() for o in outs], [[float(k)] * 2 for k in range(n)])
    flat = torch.zeros(2 * n)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(r)))
    expect("all_gather_into_tensor", flat.tolist(), [float(k) for k in range(n) for _ in "ab"])
    out = torch.zeros(3)
    ins = [torch.full((3,), float(r + k)) for k in range(n)]
    gloo_refusal = ""
    try:  # older gloo (torch 2.7's) has no list-form reduce_scatter; 2.14's has
        dist.reduce_scatter(torch.zeros(3), [i.clone() for i in ins], group=gloo_group())
    except RuntimeError as exc:
        gloo_refusal = str(exc)
    if gloo_refusal:
        # Delegated means what init_process_group("gloo") gives: gloo's own refusal.
        try:
            dist.reduce_scatter(out, ins)
            failures.append(f"reduce_scatter: gloo refuses it ({gloo_refusal}), ringtune ran it")
        except RuntimeError as exc:
            expect("reduce_scatter's refusal", str(exc), gloo_refusal)
    else:
        dist.reduce_scatter(out, ins)
        expect("reduce_scatter", out.tolist(), [float(sum(q + r for q in range(n)))] * 3)
    out = torch.zeros(2)
    dist.reduce_scatter_tensor(out, torch.arange(2 * n, dtype=torch.float32))
    expect("reduce_scatter_tensor", out.tolist(), [float(n * (2 * r)), float(n * (2 * r + 1))])
    got = torch.zeros(n)
    dist.all_to_all_single(got, torch.full((n,), float(r)))
    expect("all_to_all_single", got.tolist(), [float(k) for k in range(n)])
    red = torch.full((2,), float(r + 1))
    dist.reduce(red, dst=0)
    if r == 0:
        expect("reduce", red.tolist(), [float(n * (n + 1) // 2)] * 2)
    dist.barrier()
    objs: list[Any] = [None] * n
    dist.all_gather_object(objs, {"rank": r})
    expect("all_gather_object", objs, [{"rank": k} for k in range(n)])
    if n > 1:
        recv = torch.zeros(3)
        ops = [dist.P2POp(dist.isend, torch.full((3,), float(r)), (r + 1) % n),
               dist.P2POp(dist.irecv, recv, (r - 1) % n)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        expect("batch_isend_irecv", recv.tolist(), [float((r - 1) % n)] * 3)
        if r == 0:
            dist.send(torch.full((2,), 7.0), dst=1)
        elif r == 1:
            got = torch.zeros(2)
            dist.recv(got, src=0)
            expect("send/recv", got.tolist(), [7.0, 7.0])
    agree(failures)


def test_new_group_with_ringtune_backend() -> None:
    """A sub-group made with backend ringtune reduces over its members only."""
    members = list(range(0, SIZE, 2))  # ranks 0, 2, …: not contiguous at 3+ ranks
    group = dist.new_group(members, backend="ringtune")
    failures: list[str] = []
    if RANK in members:
        t = torch.full((10,), float(RANK + 1))
        dist.all_reduce(t, group=group)
        want = float(sum(m + 1 for m in members))
        if t.tolist() != [want] * 10:
            failures.append(f"sub-group sum: got {t.tolist()[:2]}, expected {want}")
    agree(failures)


def test_ddp_over_ringtune_tracks_ddp_over_gloo() -> None:
    """The digits example: DDP over the default (ringtune) group and DDP over a gloo group
    from the same start: parameters within float tolerance after every step, and the
    ringtune-trained ones bitwise equal on every rank."""
    from train_digits import capped_ddp, make_model

    from ..ddputil import track

    ours, ref = make_model(32, 2), make_model(32, 2)
    ddp_ours = capped_ddp(ours, 0.004)  # several buckets in flight per step
    ddp_ref = capped_ddp(ref, 0.004, process_group=gloo_group())
    failures, _ = track(ours, ddp_ours, ref, ddp_ref, 12, RANK, SIZE, gloo_world().allgather,
                        "DDP over ringtune")
    agree(failures)


def test_host_tensors_of_one_host_take_shared_memory_without_a_profile() -> None:
    """No profile: the backend's CPU tensors go through ringtune's own shared memory on
    ranks of one host (gloo's TCP loopback is what it replaces), and a call says so."""
    if SIZE < 2:
        pytest.skip("one rank allreduces nothing")
    comm = ringtune_of(dist.group.WORLD).communicator
    t = torch.full((1 << 18,), float(RANK + 1))
    dist.all_reduce(t)
    plan = comm.plan_for(t.numel() * 4)
    fails = [] if plan.algorithm == "shm" else [f"plan {plan.algorithm}, expected shm"]
    fails += _check(t, torch.full((1 << 18,), SIZE * (SIZE + 1) / 2, dtype=torch.float64),
                    "shm default")
    agree(fails)
