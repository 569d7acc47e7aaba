"""Per-call cost of online tuning once settled, against a fixed profile (issue 24's target:
at most 5 µs per call).

    mpiexec -n 2 python -m mpi4py benchmarks/online_overhead.py [--calls 2000] [--rounds 15]

Two communicators on duplicates of the world run the same choice (the built-in defaults'
``native`` for a 16-byte message, the latency-bound case where a per-call cost shows most):
one fixed, one tuning online with a single candidate (so it settles at once on the same
choice). Batches of ``--calls`` calls alternate between them, each after a barrier; each
batch's time is the slowest rank's; the figure is the median per-call time of each side and
their difference. Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

from collectives import Communicator


def batch(comm: Communicator, buf: np.ndarray, calls: int) -> float:
    world = MPI.COMM_WORLD
    world.Barrier()
    t = time.perf_counter()
    for _ in range(calls):
        comm.allreduce(buf)
    mine = (time.perf_counter() - t) / calls
    return float(world.allreduce(mine, op=MPI.MAX))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    world = MPI.COMM_WORLD
    fixed = Communicator(world.Dup())
    online = Communicator(world.Dup(), tune="online", tune_options={"candidates": 1})
    buf = np.ones(4, dtype=np.float32)
    for c in (fixed, online):
        for _ in range(10):  # plans built, the online class settled
            c.allreduce(buf)
    assert "settled by online tuning" in online.explain(16), online.explain(16)
    times: dict[str, list[float]] = {"fixed": [], "online": []}
    for r in range(args.rounds):
        order = [("fixed", fixed), ("online", online)]
        for name, c in order if r % 2 == 0 else order[::-1]:
            times[name].append(batch(c, buf, args.calls))
    if world.Get_rank() == 0:
        f, o = (statistics.median(times[k]) * 1e6 for k in ("fixed", "online"))
        print(f"# {world.Get_size()} ranks, 16 B float32 sum, {args.rounds} batches of "
              f"{args.calls} calls each side, alternating; slowest rank per batch, median")
        print(f"fixed profile  {f:8.2f} us/call")
        print(f"online settled {o:8.2f} us/call")
        print(f"difference     {o - f:+8.2f} us/call")
    for c in (fixed, online):
        c.close()
        c.comm.Free()


if __name__ == "__main__":
    main()
