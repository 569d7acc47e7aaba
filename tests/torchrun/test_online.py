"""Online tuning under torchrun, with torch.distributed as ringtune's engine: the same
decisions (rank 0's bcast, the allgather of times) over the process group; every call right
and bitwise equal on every rank, every size settled alike, a profile that loads, a second
job that explores nothing, and DDP with ``HookState(tune="online")`` tracking DDP's own
gloo allreduce."""

from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np
import torch
import torch.distributed as dist
from train_digits import capped_ddp, make_model

from collectives import Communicator
from collectives.profile import load_profile
from collectives.testing.results import check_input, expected
from collectives.torch import HookState, ddp_hook

from ..ddputil import track
from .conftest import RANK, SIZE, agree, world

COUNTS = (5, 1001, 70003)
OPTIONS = {"calls": 8, "samples": 2, "candidates": 4, "share": 1.0}


def _folder() -> str:
    return world().bcast(tempfile.mkdtemp(prefix="ringtune-online-tr-") if RANK == 0
                         else None, root=0)


def _steps(c: Communicator, steps: int) -> list[str]:
    bad = []
    for step in range(steps):
        for count in COUNTS:
            buf = torch.from_numpy(check_input(count, "float32", "avg", RANK))
            c.allreduce(buf, op="avg")
            if not np.array_equal(buf.numpy(), expected(count, "float32", "avg", SIZE)):
                bad.append(f"step {step}: {count} elements: wrong result")
            digest = hashlib.sha256(buf.numpy().tobytes()).hexdigest()
            if len(set(world().allgather(digest))) != 1:
                bad.append(f"step {step}: {count} elements: ranks differ")
    return bad


def test_online_tuning_over_a_process_group() -> None:
    out = os.path.join(_folder(), "online.yaml")
    c = Communicator(dist.group.WORLD, tune="online", tune_out=out, tune_options=OPTIONS)
    bad = _steps(c, 12)
    settled = {k[0]: v.config.key for k, v in c.online.settled.items()}
    if any(s != settled for s in world().allgather(settled)):
        bad.append("ranks settled differently")
    if set(settled) != set(COUNTS):
        bad.append(f"settled only {sorted(settled)}")
    c.close()
    agree(bad)
    world().allgather(None)  # rank 0 has written it
    prof = load_profile(out, world_size=SIZE)
    assert prof.tuning["mode"] == "online"
    again = Communicator(dist.group.WORLD, profile=out, tune="online")
    bad = _steps(again, 2)
    if again.online.exploring_calls:
        bad.append(f"the second job explored {again.online.exploring_calls} call(s)")
    again.close()
    agree(bad)


def test_ddp_with_online_tuning_tracks_ddp_over_gloo() -> None:
    comm = Communicator(dist.group.WORLD)
    ours, ref = make_model(32, 3), make_model(32, 3)
    ddp_ours = capped_ddp(ours, 0.004)
    state = HookState(comm, tune="online", tune_options=OPTIONS)
    ddp_ours.register_comm_hook(state, ddp_hook)
    ddp_ref = capped_ddp(ref, 0.004)
    bad, _ = track(ours, ddp_ours, ref, ddp_ref, 16, RANK, SIZE, world().allgather, "online")
    if not comm.online.settled:
        bad.append("no bucket size settled")
    state.close()
    comm.close()
    agree(bad)
