"""Online tuning on a DDP job (issue 24's targets): the step times of one job, step by step.

One job per run, as a user would start them; rank 0 prints one JSON line::

    C=profiles/clusters/emulated-2x2.yaml
    ringtune emulate -q --cluster $C -- .venv-torch/bin/python benchmarks/bench_online.py \
        [--profile FILE] [--tune online --tune-out FILE] --steps 50

The digits MLP of examples/train_digits.py (``--hidden``/``--layers``; 2300x3 is 10.8 M
parameters: DDP's first step one 43.0 MB bucket, then buckets of 21.3 and 21.8 MB, as
``RINGTUNE_LOG=info`` shows), DDP with the ringtune hook, ``--steps``
steps; each step's time is the slowest rank's (an allreduce of the step's time after it).
With ``--tune online``: the tuner's exploring calls, the seconds they took and the share of
the job they cost beyond the best candidate's time (``exploring_extra_s``: Σ over
classes of the exploring calls' time minus calls × best score, what exploring cost).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from mpi4py import MPI
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_digits import digits, init_gloo, make_model, shard  # noqa: E402

from collectives import Communicator  # noqa: E402

WORLD = MPI.COMM_WORLD


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default=None)
    p.add_argument("--tune", default="off", choices=("off", "online"))
    p.add_argument("--tune-out", default=None)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--hidden", type=int, default=2300)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--label", default="")
    args = p.parse_args()
    from torch.nn.parallel import DistributedDataParallel as DDP

    from collectives.torch import HookState, ddp_hook

    torch.set_num_threads(1)
    init_gloo(WORLD)
    rank, size = WORLD.Get_rank(), WORLD.Get_size()
    comm = Communicator(WORLD.Dup(), profile=args.profile, tune=args.tune,
                        tune_out=args.tune_out)
    model = make_model(args.hidden, args.layers)
    ddp = DDP(model)
    state = HookState(comm)
    ddp.register_comm_hook(state, ddp_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    xtr, ytr = digits()[:2]
    times = []
    for step in range(args.steps):
        WORLD.Barrier()
        t = time.perf_counter()
        idx = shard(step, len(xtr), args.batch, rank, size)
        opt.zero_grad(set_to_none=False)
        nn.functional.cross_entropy(ddp(xtr[idx]), ytr[idx]).backward()
        opt.step()
        times.append(WORLD.allreduce(time.perf_counter() - t, op=MPI.MAX))
    out = {"label": args.label, "profile": args.profile, "tune": args.tune,
           "ranks": size, "steps_ms": [round(x * 1e3, 1) for x in times],
           "median_ms_last10": round(statistics.median(times[-10:]) * 1e3, 1),
           "total_s": round(sum(times), 2)}
    tuner = comm.online
    if tuner is not None and rank == 0:
        extra = sum(sc.overhead for sc in tuner.classes.values())
        out.update(exploring_calls=tuner.exploring_calls,
                   exploring_s=round(tuner.explore_seconds, 2),
                   exploring_extra_s=round(extra, 3),
                   settled={str(k[0] * 4): v.config.text() for k, v in tuner.settled.items()},
                   classes={str(sc.nbytes): [sc.calls, len(sc.candidates)]
                            for sc in tuner.classes.values()})
    state.close()
    comm.close()
    if rank == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
