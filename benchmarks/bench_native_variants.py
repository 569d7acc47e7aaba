"""What MPI_Allreduce runs: the library's default next to each of its forced variants.

Use it to find which of MPICH's allreduce algorithms and compositions the default selection
amounts to on a given world (the cost model's ``native`` formula must describe that one).
Run across emulated hosts::

    ringtune emulate -q --cluster profiles/clusters/emulated-2x2.yaml -- \\
        .venv/bin/python benchmarks/bench_native_variants.py

Each variant is MPI_Allreduce (float32 sum, in place) with one MPICH control variable
written through MPI_T just before its calls and restored after: ``composition=N``
(``MPIR_CVAR_ALLREDUCE_COMPOSITION``: 1 intra-node reduce + inter-node allreduce of the node
leaders + intra-node bcast, 2 the network module's allreduce over the whole communicator,
3 shared memory only (one node; across nodes MPICH falls back to 2), 4 several leaders per
node; ``native composition=`` sets the same variable per call)
and ``algorithm=NAME`` (``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM``). Variants are interleaved
within a repeat (the machine is shared); one iteration's time is the slowest rank's, the
figure the median over repeats x iterations. Rank 0 prints a Markdown table, ms and the
ratio to the default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

COMPOSITION_CVAR = "MPIR_CVAR_ALLREDUCE_COMPOSITION"
DEFAULT_VARIANTS = ("default", "composition=1", "composition=2",
                    "algorithm=reduce_scatter_allgather", "algorithm=ring",
                    "algorithm=recursive_doubling", "algorithm=smp")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import numpy as np
    from mpi4py import MPI

    from collectives.natives import mpich

    world = MPI.COMM_WORLD
    variants = [v for v in args.variants.split(",") if v]
    sizes = []
    s = args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.factor
    bufs = {size: np.ones(size // 4, dtype=np.float32) for size in sizes}
    times: dict[tuple[int, str], list[float]] = {}

    def timed(size: int, variant: str) -> list[float]:
        kind, _, value = variant.partition("=")
        old = None
        if kind == "composition":
            old = mpich.write_int_cvar(COMPOSITION_CVAR, int(value))
        sel = mpich.Selector(value) if kind == "algorithm" else None
        if sel is not None:
            sel.enter()
        out = []
        try:
            buf = bufs[size]
            world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)  # warm-up (and first-call set-up)
            for _ in range(args.iters):
                world.Barrier()
                t0 = time.perf_counter()
                world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
                out.append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        finally:
            if sel is not None:
                sel.exit()
            if old is not None:
                mpich.write_int_cvar(COMPOSITION_CVAR, old)
        return out

    for _ in range(args.repeats):
        for size in sizes:
            for v in variants:
                times.setdefault((size, v), []).extend(timed(size, v))
    if world.Get_rank() == 0:
        hosts = world.allgather(MPI.Get_processor_name())
        print(f"# MPI_Allreduce variants, {world.Get_size()} ranks on {sorted(set(hosts))}; "
              f"medians of {args.repeats} repeats x {args.iters} iterations (slowest rank)")
        print("| size |" + "".join(f" {v} ms (x default) |" for v in variants))
        print("|---|" + "---|" * len(variants))
        for size in sizes:
            med = {v: statistics.median(times[(size, v)]) for v in variants}
            base = med[variants[0]]
            print(f"| {size >> 10} KiB |" + "".join(
                f" {med[v] * 1e3:.1f} ({base / med[v]:.2f}x) |" for v in variants), flush=True)
    else:
        world.allgather(MPI.Get_processor_name())
    return 0


if __name__ == "__main__":
    sys.exit(main())
