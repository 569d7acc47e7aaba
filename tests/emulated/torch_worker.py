"""What the ranks run in tests/emulated/test_torchrun_emulated.py: a torchrun job started by
``ringtune emulate --launcher torchrun -- tests/emulated/torch_worker.py WHAT``; rank 0
prints one JSON line, the tests read it. Every check's failures are gathered from every
rank (``fails``: lines naming the rank), never asserted on one rank alone.

- ``contract``: the allreduce contract of every algorithm over the torch engine
  (``Communicator(group.WORLD)``, gloo), each rank's host name, hierarchical's grid from
  the hosts, bitwise agreement between ranks;
- ``ddp STEPS``: DDP over the default group ``init_process_group("ringtune")`` and DDP over
  a gloo group of the same ranks, on the digits example, step by step side by side;
- ``online COUNT``: online tuning of a COUNT-float32 allreduce; the choice it settles on.
"""

from __future__ import annotations

import datetime
import json
import socket
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

#: Any collective of the job gives up after this long (a lost peer fails the job, never
#: hangs it).
TIMEOUT = datetime.timedelta(seconds=60)


def report(world: Any, fails: list[str], **result: Any) -> None:
    """Rank 0 prints ``result`` with every rank's failure lines (collective)."""
    lines = [f"rank {r}: {m}" for r, ms in enumerate(world.allgather(fails[:8])) for m in ms]
    if world.rank == 0:
        print(json.dumps({**result, "fails": lines}), flush=True)


def contract() -> None:
    from collectives import Communicator
    from collectives.engines.torch import TorchComm
    from collectives.testing import contract as suite

    dist.init_process_group("gloo", timeout=TIMEOUT)
    world = TorchComm(dist.group.WORLD)
    c = Communicator(dist.group.WORLD)
    fails: list[str] = []
    hosts = world.allgather(socket.gethostname())
    fails += suite.run_configs(c, suite.configs(c.size, suite.contract_algorithms(),
                                                light=True),
                               density="ops", family_density="sparse")
    # Hierarchical's default grid from the hosts the ranks found (ranks per host x hosts).
    buf = torch.ones(1 << 12)
    dims = list(c.prepared(buf, algorithm="hierarchical").algo.dims)
    c.allreduce(buf, algorithm="hierarchical")
    if not bool((buf == c.size).all()):
        fails.append(f"hierarchical with its default grid {dims}: wrong result")
    fails += suite.check_default_choice(c)
    report(world, fails, hosts=hosts, dims=dims, engine=c.engine.name,
           algorithms=suite.contract_algorithms())
    c.close()
    dist.destroy_process_group()


def ddp(steps: int) -> None:
    from train_digits import make_model, wrap

    import collectives.torch  # noqa: F401 - registers "ringtune"
    from collectives.engines.torch import TorchComm
    from tests.ddputil import track

    torch.set_num_threads(1)
    dist.init_process_group("ringtune", timeout=TIMEOUT)
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    world = TorchComm(gloo)
    rank, size = dist.get_rank(), dist.get_world_size()
    ours, ref = make_model(32, 2), make_model(32, 2)
    ddp_ours, _ = wrap(ours, "none", bucket_cap_mb=0.004)  # the default group: ringtune
    ddp_ref, _ = wrap(ref, "none", bucket_cap_mb=0.004, process_group=gloo)
    fails, worst = track(ours, ddp_ours, ref, ddp_ref, steps, rank, size, world.allgather,
                         "DDP over ringtune")
    from collectives.torch.backend import RingtuneBackendMixin

    ring = dist.group.WORLD._get_backend(torch.device("cpu"))
    if not isinstance(ring, RingtuneBackendMixin):
        fails.append(f"the default group's CPU backend is {type(ring).__name__}")
        ran = []
    else:
        comm = ring.communicator
        ran = sorted({p.plan.algorithm for p in comm._plans.values()})
        if comm.profile.builtin:
            fails.append("$RINGTUNE_PROFILE was not loaded")
    hosts = world.allgather(socket.gethostname())
    report(world, fails, steps=steps, backend=dist.get_backend(), hosts=hosts, max_diff=worst,
           algorithms=ran)
    dist.destroy_process_group()


def online(count: int) -> None:
    import numpy as np

    from collectives import Communicator
    from collectives.engines.torch import TorchComm

    dist.init_process_group("gloo", timeout=TIMEOUT)
    world = TorchComm(dist.group.WORLD)
    c = Communicator(dist.group.WORLD, tune="online",
                     tune_options={"calls": 12, "samples": 2, "candidates": 4, "share": 1.0})
    fails: list[str] = []
    for call in range(14):
        buf = np.full(count, float(c.rank + 1), dtype=np.float32)
        c.allreduce(buf)
        if not np.all(buf == c.size * (c.size + 1) / 2):
            fails.append(f"call {call}: wrong result")
    settled = {str(k[0]): {"algorithm": v.config.algorithm, "params": dict(v.config.params)}
               for k, v in c.online.settled.items()}
    if any(s != settled for s in world.allgather(settled)):
        fails.append("ranks settled differently")
    report(world, fails, settled=settled, hosts=world.allgather(socket.gethostname()))
    c.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    what, rest = sys.argv[1], sys.argv[2:]
    if what == "contract":
        contract()
    elif what == "ddp":
        ddp(int(rest[0]))
    elif what == "online":
        online(int(rest[0]))
    else:
        raise SystemExit(f"torch_worker: unknown {what!r}")
