"""ringtune's per-call cost over the library's own allreduce, at sizes where it shows.

Times ``Communicator.allreduce`` against ``MPI_Allreduce`` on the same buffer, 2,000 calls
× 5 repeats each (medians), at 8 B, 4 KiB and 64 KiB, with a profile whose rules there
are the library's own (so the difference is ringtune's dispatch: the rule lookup, the
plan cache, the argument checks). Run it on two checkouts to see whether a change made the
hot path slower::

    PYTHONPATH=CHECKOUT .venv/bin/mpiexec -n 2 .venv/bin/python \\
        benchmarks/call_overhead.py PROFILE
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from collectives import Communicator
from collectives.profile import load_profile


def per_call_us(call: Callable[[], object], calls: int = 2000, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean time of ``calls`` back-to-back calls."""
    out = []
    for _ in range(repeats):
        MPI.COMM_WORLD.Barrier()
        t = time.perf_counter()
        for _ in range(calls):
            call()
        out.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(out)


def main() -> None:
    comm = Communicator(MPI.COMM_WORLD, profile=load_profile(sys.argv[1]))
    for nbytes in (8, 4096, 65536):
        buf = np.ones(nbytes // 4, np.float32)
        for _ in range(200):
            comm.allreduce(buf)
        ours = per_call_us(lambda: comm.allreduce(buf))  # noqa: B023 (called at once)
        theirs = per_call_us(lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buf))  # noqa: B023
        if MPI.COMM_WORLD.rank == 0:
            print(f"{nbytes:>6} B  ringtune {ours:7.2f} us  MPI_Allreduce {theirs:7.2f} us  "
                  f"difference {ours - theirs:6.2f} us", flush=True)


if __name__ == "__main__":
    main()
