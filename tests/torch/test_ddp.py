"""The DDP hook on the gloo process group: the same training as DDP's own allreduce, the
same parameters on every rank, errors that reach ``backward()`` on every rank."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn
from train_digits import digits, make_model, shard, wrap

from collectives import AgreementError

from ..ddputil import track
from .conftest import WORLD, agree

RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
DATA = digits()


def _step(ddp: nn.Module, opt: torch.optim.Optimizer, step: int, state=None) -> None:
    xtr, ytr = DATA[0], DATA[1]
    idx = shard(step, len(xtr), 16, RANK, SIZE)
    opt.zero_grad(set_to_none=False)
    nn.functional.cross_entropy(ddp(xtr[idx]), ytr[idx]).backward()
    opt.step()
    if state is not None:
        state.average_parameters(ddp.parameters())


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _same_on_every_rank(t: torch.Tensor) -> bool:
    digest = hashlib.sha256(t.numpy().tobytes()).hexdigest()
    return len(set(WORLD.allgather(digest))) == 1


def _train_side_by_side(ddp_ours: nn.Module, ours: nn.Module, ddp_ref: nn.Module,
                        ref: nn.Module, steps: int) -> list[str]:
    """``steps`` SGD steps of both wrapped models on the same shards; what went wrong (the
    first step whose parameters differ from DDP's own, or differ across ranks), else []."""
    return track(ours, ddp_ours, ref, ddp_ref, steps, RANK, SIZE, WORLD.allgather,
                 rtol=1e-5, atol=1e-6)[0]


@pytest.mark.parametrize("bucket_cap_mb", [25.0, 0.004])  # one bucket; several
def test_hook_matches_ddp_allreduce_each_step(comm, bucket_cap_mb) -> None:
    ours, ref = make_model(32, 2), make_model(32, 2)
    ddp_ours, state = wrap(ours, "ringtune", comm, bucket_cap_mb)
    ddp_ref, _ = wrap(ref, "gloo", None, bucket_cap_mb)
    bad = _train_side_by_side(ddp_ours, ours, ddp_ref, ref, steps=12)
    if bucket_cap_mb < 1 and not state._checked:
        bad.append("no bucket layout was checked")
    agree(bad)


@pytest.mark.parametrize("bucket_cap_mb", [25.0, 0.004])
def test_hook_matches_ddp_with_gradients_as_bucket_views(comm, bucket_cap_mb) -> None:
    # gradient_as_bucket_view=True: the gradients are views into the buckets the hook
    # averages in place, so nothing copies them back; the result must still be DDP's.
    ours, ref = make_model(32, 2), make_model(32, 2)
    ddp_ours, _ = wrap(ours, "ringtune", comm, bucket_cap_mb, bucket_view=True)
    ddp_ref, _ = wrap(ref, "gloo", None, bucket_cap_mb, bucket_view=True)
    agree(_train_side_by_side(ddp_ours, ours, ddp_ref, ref, steps=12))


class _Bucket:
    """What DDP hands a hook (``GradBucket``'s methods the hook calls). DDP itself keeps
    ranks' buckets alike (it broadcasts rank 0's bucket assignment), so a mismatch comes
    from a caller that drives the hook on its own, or ranks wrapping different models."""

    def __init__(self, n: int, index: int = 0, last: bool = True) -> None:
        self.buf = torch.ones(n)
        self._index, self._last = index, last

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self.buf

    def is_last(self) -> bool:
        return self._last

    def parameters(self) -> list:
        return [self.buf]


def test_layout_mismatch_fails_on_every_rank(comm) -> None:
    from collectives.torch import HookState, ddp_hook

    if SIZE == 1:
        pytest.skip("needs two ranks")
    state = HookState(comm)
    fut = ddp_hook(state, _Bucket(100 if RANK == 0 else 64))
    with pytest.raises(AgreementError) as info:
        fut.wait()
    msg = str(info.value)
    agree([] if "DDP gradient bucket layouts differ across ranks" in msg
          and "rank 0: bucket 0: 100 x torch.float32 on cpu (last)" in msg
          and "bucket_cap_mb" in msg else [msg[:400]])


def test_bucket_rank_cannot_serve_fails_on_every_rank(comm) -> None:
    from collectives.torch import HookState, ddp_hook

    state = HookState(comm)
    bucket = _Bucket(8)
    if RANK == SIZE - 1:
        bucket.buf = torch.ones(16)[::2]  # not contiguous: this rank cannot reduce it
    with pytest.raises(AgreementError) as info:
        ddp_hook(state, bucket).wait()
    msg = str(info.value)
    agree([] if f"rank {SIZE - 1}: tensor of shape (8,) is not contiguous" in msg
          else [msg[:400]])


def test_hook_averages_a_bucket(comm) -> None:
    from collectives.torch import HookState, ddp_hook

    state = HookState(comm)
    bucket = _Bucket(10)
    bucket.buf.fill_(float(RANK))
    out = ddp_hook(state, bucket).wait()
    want = sum(range(SIZE)) / SIZE
    agree([] if out is bucket.buf and torch.all(out == want) and state.step == 1
          else [f"{out}"])


def test_error_on_comm_thread_raises_in_backward(comm, monkeypatch) -> None:
    model = make_model(16, 1)
    ddp, state = wrap(model, "ringtune", comm)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)

    def failing(*args, **kwargs):
        raise RuntimeError(f"rank {RANK}: injected transport failure")

    monkeypatch.setattr(state.comm, "allreduce", failing)
    with pytest.raises(Exception) as info:
        _step(ddp, opt, 0)
    agree([] if "injected transport failure" in str(info.value) else [str(info.value)])


def test_staleness_one_keeps_ranks_identical(comm) -> None:
    model = make_model(32, 2)
    start = _flat(model).clone()
    ddp, state = wrap(model, "ringtune", comm, 0.004, staleness=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    bad = []
    for step in range(8):
        _step(ddp, opt, step)
        now = _flat(model)
        if step == 0 and not torch.equal(now, start):
            bad.append("the first step must apply no gradient (none is averaged yet)")
        if step > 0 and torch.equal(now, start):
            bad.append(f"step {step}: parameters did not move")
        if not _same_on_every_rank(now):
            bad.append(f"step {step}: parameters differ across ranks")
    if len(state._pending) > 4:
        bad.append(f"{len(state._pending)} exchanges kept after 8 steps (grows with steps)")
    state.wait()
    agree(bad)


def test_local_sgd_averages_every_h_steps(comm) -> None:
    model = make_model(32, 2)
    ddp, state = wrap(model, "ringtune", comm, average_every=3)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    bad = []
    for step in range(6):
        _step(ddp, opt, step, state)
        same = _same_on_every_rank(_flat(model))
        if (step + 1) % 3 == 0 and not same:
            bad.append(f"step {step}: not averaged")
        if (step + 1) % 3 and same and SIZE > 1:
            bad.append(f"step {step}: ranks identical without averaging (no local steps?)")
    agree(bad)


def test_hook_state_wants_a_communicator() -> None:
    from collectives.torch import HookState

    with pytest.raises(TypeError, match=f"rank {RANK}: HookState needs a "
                       "collectives.Communicator"):
        HookState(WORLD)


def test_bad_modes(comm) -> None:
    from collectives.torch import HookState

    for kwargs in ({"staleness": 2}, {"average_every": 0},
                   {"staleness": 1, "average_every": 2}, {"channels": 0},
                   {"channels": True}, {"channels": 99}):
        with pytest.raises(ValueError, match=f"rank {RANK}: "):
            HookState(comm, **kwargs)


def test_agreement_error_is_exported() -> None:
    assert issubclass(AgreementError, ValueError)


def test_hook_keeps_no_bucket_of_an_old_layout(comm) -> None:
    """DDP rebuilds its buckets after the first step, often into fewer; the hook's
    per-bucket cache must then hold only the current buckets (an old one kept would pin
    gradient-sized memory for the life of the job)."""
    from collectives.torch import HookState, ddp_hook

    state = HookState(comm)
    first = [_Bucket(50, i, i == 2) for i in range(3)]  # the layout of step 0
    rebuilt = [_Bucket(75, i, i == 1) for i in range(2)]  # after DDP's rebuild
    for layout in (first, rebuilt, rebuilt):
        for fut in [ddp_hook(state, b) for b in layout]:
            fut.wait()
    held = {k: v[0] for k, v in state._fast.items()}
    agree([] if sorted(held) == [0, 1] and all(held[i] is rebuilt[i].buf for i in held)
          else [f"cache holds buckets {sorted(held)}"])


def test_channels_match_ddp_allreduce_each_step(comm) -> None:
    """Buckets spread over two exchange channels (two communication threads, each with its
    own communicator) train exactly as DDP's own allreduce, and both channels carry
    buckets."""
    from collectives.torch import HookState, ddp_hook

    ours, ref = make_model(32, 3), make_model(32, 3)
    ddp_ours, _ = wrap(ours, "gloo", None, 0.004)
    state = HookState(comm, channels=2)
    ddp_ours.register_comm_hook(state, ddp_hook)
    ddp_ref, _ = wrap(ref, "gloo", None, 0.004)
    bad = _train_side_by_side(ddp_ours, ours, ddp_ref, ref, steps=8)
    if len(state.channels) != 2:
        bad.append(f"{len(state.channels)} channels")
    elif SIZE > 1 and not all(c._plans for c, _ in state.channels):
        bad.append("a channel reduced no bucket")
    extra = state.channels[-1][0]
    state.close()
    from mpi4py import MPI

    if len(state.channels) != 1 or extra.comm != MPI.COMM_NULL:
        bad.append("close() kept the extra channel")
    agree(bad)


def test_channels_need_thread_multiple(comm, monkeypatch) -> None:
    from collectives.torch import HookState
    from collectives.training import exchange

    # SERIALIZED provided: one channel is fine, two threads in MPI at once are not.
    monkeypatch.setattr(exchange, "thread_level",
                        lambda concurrent=False: (2, 3 if concurrent else 2))
    with pytest.raises(exchange.ExchangeError, match=f"rank {RANK}: MPI was initialised "
                       "with MPI_THREAD_SERIALIZED.*MPI_THREAD_MULTIPLE"):
        HookState(comm, channels=2)
