"""DDP training on the digits example with online tuning (``HookState(tune="online")``):
it tracks the same job run with a fixed choice (parameters within float tolerance, bitwise
equal across ranks) while its buckets explore candidates, settles every bucket size, writes
a profile that loads and validates, and a second job loading it explores nothing."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
from torch import nn
from train_digits import capped_ddp, make_model

from collectives import Communicator
from collectives.profile import load_profile

from ..ddputil import flat, same_on_every_rank, sgd, step, track
from .conftest import WORLD, agree

RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
OPTIONS = {"calls": 8, "samples": 2, "candidates": 4, "share": 1.0}


@pytest.fixture()
def folder() -> Any:
    path = WORLD.bcast(tempfile.mkdtemp(prefix="ringtune-online-ddp-") if RANK == 0
                       else None)
    yield path
    WORLD.Barrier()


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RINGTUNE_PROFILE", "RINGTUNE_TUNE", "RINGTUNE_TUNE_OUT"):
        monkeypatch.delenv(var, raising=False)


def _wrap(model: nn.Module, comm: Communicator, **tune: Any) -> tuple[nn.Module, Any]:
    from collectives.torch import HookState, ddp_hook

    ddp = capped_ddp(model, 0.004)  # several buckets of a few sizes
    state = HookState(comm, **tune)
    ddp.register_comm_hook(state, ddp_hook)
    return ddp, state


def test_online_ddp_tracks_a_fixed_choice_and_its_profile_is_reused(folder: str) -> None:
    out = os.path.join(folder, "online.yaml")
    tuned_comm = Communicator(WORLD.Dup())
    fixed_comm = Communicator(WORLD.Dup())
    ours, ref = make_model(32, 2), make_model(32, 2)
    ddp_ours, state = _wrap(ours, tuned_comm, tune="online", tune_out=out,
                            tune_options=OPTIONS)
    ddp_ref, fixed = _wrap(ref, fixed_comm)
    bad, _ = track(ours, ddp_ours, ref, ddp_ref, 20, RANK, SIZE, WORLD.allgather, "online")
    tuner = tuned_comm.online
    sizes = {k[0] for k in tuner.settled}
    if not tuner.settled:
        bad.append("no bucket size settled")
    if SIZE > 1 and not tuner.exploring_calls:
        bad.append("nothing was explored")
    state.close()
    fixed.close()
    tuned_comm.close()  # rank 0 writes the profile
    fixed_comm.close()
    for c in (tuned_comm, fixed_comm):
        c.comm.Free()
    WORLD.Barrier()
    agree(bad)
    prof = load_profile(out, world_size=SIZE)
    assert prof.tuning["mode"] == "online"
    # Every size settled, and those still exploring when the job ended (DDP's first-step
    # buckets, called once) with what was learnt.
    assert set(prof.tuning["online_settled"]) >= {4 * s for s in sizes}

    # The next job loads it: the same buckets, nothing explored.
    again = Communicator(WORLD.Dup(), profile=out)
    model = make_model(32, 2)
    ddp, state = _wrap(model, again, tune="online")
    opt = sgd(ddp)
    for k in range(3):
        step(ddp, opt, k, RANK, SIZE)
    bad = [] if not again.online.exploring_calls else [
        f"the second job explored {again.online.exploring_calls} call(s)"]
    if not same_on_every_rank(flat(model), WORLD.allgather):
        bad.append("second job: parameters differ across ranks")
    state.close()
    again.close()
    again.comm.Free()
    agree(bad)
