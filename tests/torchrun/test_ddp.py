"""DDP over ringtune's hook with ``Communicator(torch.distributed.group.WORLD)`` under
torchrun: the same training as DDP's own gloo allreduce, step by step, on the digits
example's model and data; with one channel and with two (duplicate groups of ringtune's
own, each with its communication thread); and ``allreduce_many`` equal to per-buffer
``allreduce``."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from train_digits import capped_ddp, digits, make_model, shard

from collectives.torch import HookState, ddp_hook

from .conftest import RANK, SIZE, agree, world

DATA = digits()


def _step(ddp: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    xtr, ytr = DATA[0], DATA[1]
    idx = shard(step, len(xtr), 16, RANK, SIZE)
    opt.zero_grad(set_to_none=False)
    nn.functional.cross_entropy(ddp(xtr[idx]), ytr[idx]).backward()
    opt.step()


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _train_side_by_side(ddp_ours: nn.Module, ours: nn.Module, ddp_ref: nn.Module,
                        ref: nn.Module, steps: int) -> list[str]:
    opt_ours = torch.optim.SGD(ddp_ours.parameters(), lr=0.05, momentum=0.9)
    opt_ref = torch.optim.SGD(ddp_ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        _step(ddp_ours, opt_ours, step)
        _step(ddp_ref, opt_ref, step)
        a, b = _flat(ours), _flat(ref)
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
            return [f"step {step}: max |ours - DDP| = {float((a - b).abs().max())}"]
        digest = hashlib.sha256(a.numpy().tobytes()).hexdigest()
        if len(set(world().allgather(digest))) != 1:
            return [f"step {step}: parameters differ across ranks"]
    return []


@pytest.mark.parametrize("channels,bucket_cap_mb", [(1, 25.0), (1, 0.004), (2, 0.004)])
def test_hook_over_the_world_group_tracks_ddp_over_gloo(comm: Any, channels: int,
                                                        bucket_cap_mb: float) -> None:
    ours, ref = make_model(32, 3), make_model(32, 3)
    ddp_ours = capped_ddp(ours, bucket_cap_mb)
    state = HookState(comm, channels=channels)
    ddp_ours.register_comm_hook(state, ddp_hook)
    ddp_ref = capped_ddp(ref, bucket_cap_mb)
    bad = _train_side_by_side(ddp_ours, ours, ddp_ref, ref, steps=8)
    if len(state.channels) != channels:
        bad.append(f"{len(state.channels)} channels, expected {channels}")
    elif SIZE > 1 and not all(c._plans for c, _ in state.channels):
        bad.append("a channel reduced no bucket")
    state.close()
    agree(bad)


def test_allreduce_many_equals_allreduce(comm: Any) -> None:
    # Small integers as floats: exact partial sums, so a fused bucket (whose ring starts
    # each element's sum at another rank than a per-buffer call's) gives the same bits
    # (collectives/training/fusion.py, "Exactness").
    rng = np.random.default_rng(RANK)
    shapes = [(7,), (300, 3), (1,), (4096,), (0,), (33, 33)]
    bufs = [torch.from_numpy(rng.integers(-50, 50, s).astype(np.float32)) for s in shapes]
    want = [b.clone() for b in bufs]
    for w in want:
        comm.allreduce(w, op="avg")
    comm.allreduce_many(bufs, op="avg", bucket_bytes=4096)
    agree([f"buffer {i} {tuple(b.shape)}" for i, (b, w) in enumerate(zip(bufs, want))
           if not torch.equal(b, w)])
