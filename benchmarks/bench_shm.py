"""The shared-memory allreduce (``shm``) side by side with the library's own, one host.

Run under mpiexec (rank 0 prints a Markdown table for BENCHMARKS.md):

    .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py benchmarks/bench_shm.py
    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py benchmarks/bench_shm.py --rounds 3

``--json FILE`` also writes what it measured (each round's busbw per size and configuration,
the copy bound, the passes) for ``benchmarks/report.py``.

``--two-copy`` adds a column ``shm 2c``: shm 1024K with single-copy reads off (the path a
host that refuses ``process_vm_readv`` runs), timed in the same rounds.

For each size (64 KiB to 64 MiB by ×4, float32 sum) it times ``native`` (the MPI library's
``MPI_Allreduce``), ``shm`` at three chunk sizes and ``multiring`` (two whole-segment rings,
the built-in large-message choice), in ``--rounds`` rounds that visit every configuration
once per size in turn, so that a shared machine's drift hits all alike; each cell is the
median over rounds of each round's median. Beside them, measured in the same run with every
rank at work at once, the bounds of the machine and of shm's design at 64 MiB:

- ``copy``: one rank's ``memcpy`` of the message (GB/s) — the copy bound. Every allreduce
  reads each rank's input once and writes its output once, as the copy does, so the copy's
  time is the floor of the allreduce's: busbw at most copy × 2(P−1)/P (the same figure at
  2 ranks, 1.5× it at 4 — comparing busbw with the copy's GB/s unscaled would flatter 4
  ranks). The line prints that ceiling and the share the best shm column reaches;
- ``phases``: the time the segment's (two-copy) path's three passes over memory take on
  their own at that size (the copy in of (P−1)/P of the message, the reduction of 1/P from
  P inputs, the copy out of (P−1)/P): the bound of a host that refuses single copy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from collectives import Communicator
from collectives.algorithms import shm as shm_algo
from collectives.bench import size_list, time_allreduce
from collectives.ops import busbw_factor

CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("native", {}),
    ("shm", {"chunk_bytes": 1 << 16}),
    ("shm", {"chunk_bytes": 1 << 18}),
    ("shm", {"chunk_bytes": 1 << 20}),
    ("multiring", {"rings": 2, "chunk_bytes": 0}),
]


#: The segment's two-copy path beside the single-copy one (``--two-copy``): same chunk.
TWO_COPY = ("shm", {"chunk_bytes": 1 << 20})


def label(algo: str, params: dict[str, Any]) -> str:
    if algo == "shm":
        return f"shm {params['chunk_bytes'] >> 10}K"
    if algo == "multiring":
        return "mr r2 seg"
    return algo


def timed(world: MPI.Comm, fn: Any, reps: int = 7) -> float:
    """Median seconds of ``fn()`` on the slowest rank, every rank at work at once."""
    times = []
    for _ in range(reps):
        world.Barrier()
        t = time.perf_counter()
        fn()
        times.append(world.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return statistics.median(times)


def phase_bounds(world: MPI.Comm, nbytes: int) -> dict[str, float]:
    """Seconds of shm's passes over memory at ``nbytes`` on their own (module docstring)."""
    n = world.Get_size()
    count = nbytes // 4
    src = np.ones(count, np.float32)
    dst = np.empty_like(src)
    part = count // n
    parts = [np.ones(part, np.float32) for _ in range(n)]
    out = np.empty(part, np.float32)

    def reduce() -> None:
        np.copyto(out, parts[0])
        for p in parts[1:]:
            np.add(out, p, out=out)

    copy_all = timed(world, lambda: np.copyto(dst, src))
    share = count - part
    copy_in = timed(world, lambda: np.copyto(dst[:share], src[:share]))
    return {"copy": copy_all, "copy in": copy_in, "reduce": timed(world, reduce),
            "copy out": copy_in}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", type=int, default=64 << 10)
    ap.add_argument("-e", type=int, default=64 << 20)
    ap.add_argument("-f", type=float, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--two-copy", action="store_true",
                    help="also time shm 1024K with single-copy reads off (the segment's "
                         "copy in / copy out), interleaved with the rest: column 'shm 2c'")
    ap.add_argument("--json", default=None, metavar="FILE",
                    help="also write the measurements (each round's busbw per size and "
                         "configuration, the copy bound, the passes) to FILE (rank 0)")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    comm = Communicator(world)
    # Its own communicator (own plans, own segment), whose plans are built with single-copy
    # reads off: the path a host that refuses them runs.
    two = Communicator(world.Dup()) if args.two_copy else None
    n = comm.size
    sizes = size_list(args.b, args.e, args.f)
    cells: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.rounds):
        for nbytes in sizes:
            for algo, params in CONFIGS:
                m = time_allreduce(comm, nbytes // 4, "float32", "sum", algo, params,
                                   args.warmup, args.iters)
                cells.setdefault((nbytes, label(algo, params)), []).append(m.busbw_gbps)
            if two is not None:
                saved = shm_algo.SINGLE_COPY_MIN_BYTES
                shm_algo.SINGLE_COPY_MIN_BYTES = 1 << 62
                try:
                    m = time_allreduce(two, nbytes // 4, "float32", "sum", *TWO_COPY,
                                       args.warmup, args.iters)
                finally:
                    shm_algo.SINGLE_COPY_MIN_BYTES = saved
                cells.setdefault((nbytes, "shm 2c"), []).append(m.busbw_gbps)
    bounds = phase_bounds(world, sizes[-1])
    load = open("/proc/loadavg").read().split()[0]
    if comm.rank == 0:
        cols = [label(a, p) for a, p in CONFIGS] + (["shm 2c"] if two is not None else [])
        lib = MPI.Get_library_version().splitlines()[0].strip()
        print(f"# {n} ranks, float32 sum, busbw GB/s (median of {args.rounds} rounds of "
              f"{args.iters}); load average {load} at the end; {lib}")
        print("| size | " + " | ".join(cols) + " | best shm / native |")
        print("|" + "---|" * (len(cols) + 2))
        for nbytes in sizes:
            row = {c: statistics.median(cells[(nbytes, c)]) for c in cols}
            best = max(v for k, v in row.items() if k.startswith("shm") and k != "shm 2c")
            size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
            print(f"| {size} | " + " | ".join(f"{row[c]:.2f}" for c in cols)
                  + f" | {best / row['native']:.2f}x |")
        big = sizes[-1]
        factor = busbw_factor(n)
        copy_gbs = big / bounds["copy"] / 1e9
        passes = bounds["copy in"] + bounds["reduce"] + bounds["copy out"]
        # Every allreduce reads each rank's input once and writes its output once, as the
        # copy does: the copy's time is the floor of the allreduce's, i.e. busbw at most
        # copy x 2(P-1)/P. shm's single copy moves exactly that (reads: its block's parts,
        # its own; writes: its block, pushed to every peer; the scratch stays in cache).
        ceiling = copy_gbs * factor
        best_big = max(statistics.median(cells[(big, c)]) for c in cols
                       if c.startswith("shm") and c != "shm 2c")
        print(f"\ncopy bound ({big >> 20} MiB, every rank copying): {copy_gbs:.2f} GB/s, "
              f"i.e. busbw at most {ceiling:.2f} (x 2(P-1)/P); best shm reaches "
              f"{best_big / ceiling:.0%} of it; "
              f"the segment's two-copy passes alone at {big >> 20} MiB: copy in "
              f"{bounds['copy in'] * 1e3:.1f} ms + reduce {bounds['reduce'] * 1e3:.1f} ms + "
              f"copy out {bounds['copy out'] * 1e3:.1f} ms = {passes * 1e3:.1f} ms, "
              f"i.e. at most {big * factor / passes / 1e9:.2f} GB/s busbw for this design")
        if args.json:
            from collectives.plumbing.atomic import write_text_atomic

            write_text_atomic(args.json, json.dumps(
                {"ranks": n, "library": lib, "rounds": args.rounds, "iters": args.iters,
                 "columns": cols, "bound_bytes": big, "copy_gbs": copy_gbs,
                 "passes_s": bounds, "load_end": float(load),
                 "rows": [{"bytes": s, "busbw_rounds": {c: cells[(s, c)] for c in cols}}
                          for s in sizes]}, indent=1))
    if two is not None:
        two.close()
    comm.close()


if __name__ == "__main__":
    main()
