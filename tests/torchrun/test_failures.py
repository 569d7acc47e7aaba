"""The loud failures under a real torchrun (issue 21, item 1): a communicator whose world
is not the job's, or a group ringtune cannot use, raises on every rank, before any step,
with one line naming both sizes (or the backend) and the fix — never a silent un-averaged
step."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from collectives import Communicator, WorldMismatchError

from .conftest import RANK, SIZE, agree, world

multi = pytest.mark.skipif(SIZE < 2, reason="a mismatch needs a world of 2 ranks or more")


def _raised(fn, kind: type[BaseException], *words: str) -> list[str]:
    """What is wrong with ``fn()``'s failure: it must raise ``kind`` with every word."""
    try:
        fn()
    except kind as exc:
        msg = str(exc)
        missing = [w for w in words if w not in msg]
        if "\n" in msg.strip():
            missing.append("(one line)")
        return [f"message lacks {missing}: {msg}"] if missing else []
    except Exception as exc:  # noqa: BLE001 - reported, every rank agrees below
        return [f"raised {type(exc).__name__}: {exc}"]
    return [f"no {kind.__name__} raised"]


@multi
def test_an_mpi_singleton_under_torchrun_raises_on_every_rank() -> None:
    from mpi4py import MPI

    assert MPI.COMM_WORLD.Get_size() == 1  # what torchrun gives every process

    def hook_over_mpi() -> None:
        from collectives.torch import HookState

        HookState(Communicator(MPI.COMM_WORLD.Dup()))

    agree(_raised(lambda: Communicator(MPI.COMM_WORLD), WorldMismatchError,
                  f"rank {RANK}:", "has 1 rank(s)", f"WORLD_SIZE={SIZE}",
                  "Communicator(torch.distributed.group.WORLD)")
          + _raised(hook_over_mpi, WorldMismatchError, f"WORLD_SIZE={SIZE}"))


@multi
def test_a_hook_over_fewer_ranks_than_ddp_raises_before_a_step() -> None:
    """Each rank alone in its own group (a Split by rank): DDP's group has SIZE ranks, the
    communicator 1 — HookState refuses it before DDP runs a step."""
    from collectives.torch import HookState, ddp_hook

    alone = world().Split(RANK, 0)
    c = Communicator(alone)
    model = DDP(nn.Linear(4, 2))

    def register() -> None:
        model.register_comm_hook(HookState(c), ddp_hook)

    fails = _raised(register, WorldMismatchError, f"rank {RANK}:", f"has {SIZE} ranks",
                    "Communicator has 1", "Communicator(torch.distributed.group.WORLD)")
    c.close()
    alone.Free()
    agree(fails)


def test_no_group_yet_is_one_clear_line() -> None:
    agree(_raised(lambda: Communicator(None), TypeError, "init_process_group"))


def test_a_cuda_buffer_on_a_gloo_group_is_refused(comm) -> None:
    """Without a GPU the refusal is checked on the transport's own test of the buffer's
    device (the same function the factory calls); with one, on a real CUDA tensor."""
    from collectives.transports.torch import make_torch_transport

    class _Gpu:
        name, on_gpu = "cupy", True

    agree(_raised(lambda: make_torch_transport(comm.comm, _Gpu()), ValueError,
                  f"rank {RANK}:", "backend is gloo", "NCCL"))
    if torch.cuda.is_available():
        t = torch.ones(4, device="cuda")
        agree(_raised(lambda: comm.allreduce(t), ValueError, "backend is gloo"))


@multi
def test_a_hook_made_before_the_group_fails_in_the_first_backward(monkeypatch) -> None:
    """A HookState built while torch.distributed was not initialised yet (nothing to
    compare then) over a 1-rank communicator: the first backward raises, on every rank,
    before the optimizer has taken a step."""
    import torch.distributed as dist

    from collectives.torch import HookState, ddp_hook

    alone = world().Split(RANK, 0)
    c = Communicator(alone)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    state = HookState(c)
    monkeypatch.undo()
    model = DDP(nn.Linear(4, 2))
    model.register_comm_hook(state, ddp_hook)
    before = [p.detach().clone() for p in model.parameters()]

    def backward() -> None:
        model(torch.ones(3, 4)).sum().backward()

    fails = _raised(backward, Exception, "DDP's process group has", "Communicator has 1")
    if any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters())):
        fails.append("parameters changed")
    state.close()
    c.close()
    alone.Free()
    agree(fails)
