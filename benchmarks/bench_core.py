"""Runtime-core benchmark: every algorithm configuration side by side, one run.

Run under mpiexec (rank 0 prints a Markdown table for BENCHMARKS.md):

    .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py benchmarks/bench_core.py
    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py benchmarks/bench_core.py --iters 5

For each size (4 KiB to 64 MiB by ×4, float32 sum) it times ``native``, ``rhd`` and
``multiring`` with rings 1/2/4 × chunk 64 KiB/1 MiB/whole segment, interleaved per size so
that drift of a shared machine hits all configurations alike. It also measures, in the same
run, the memory-copy bandwidth (``numpy.copyto`` of 64 MiB on every rank at once): the
ceiling a shared-memory allreduce can approach. Finally the per-call overhead of
``Communicator.allreduce`` over running the cached plan directly, at 8 bytes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

from collectives import Communicator
from collectives.bench import size_list, time_allreduce

CONFIGS: list[tuple[str, dict[str, int]]] = [("native", {}), ("rhd", {})] + [
    ("multiring", {"rings": r, "chunk_bytes": c})
    for r in (1, 2, 4) for c in (1 << 16, 1 << 20, 0)
]


def label(algo: str, params: dict) -> str:
    if not params:
        return algo
    c = params["chunk_bytes"]
    cs = "seg" if c == 0 else f"{c >> 10}K" if c < 1 << 20 else f"{c >> 20}M"
    return f"mr r{params['rings']} {cs}"


def copy_bandwidth(world: MPI.Comm, nbytes: int = 64 << 20, reps: int = 7) -> float:
    """GB/s of one rank's memcpy while every rank copies at once (same contention as an
    allreduce with all ranks active)."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    times = []
    for _ in range(reps):
        world.Barrier()
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(world.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return nbytes / statistics.median(times) / 1e9


def overhead_us(comm: Communicator, reps: int = 2000) -> tuple[float, float]:
    """Median per-call µs of comm.allreduce vs the cached plan's run, 8 bytes, native."""
    buf = np.ones(2, np.float32)
    prepared = comm.prepared(buf, algorithm="native")
    res = []
    for fn in (lambda: comm.allreduce(buf, algorithm="native"), lambda: prepared.run(buf)):
        samples = []
        for _ in range(5):
            comm.comm.Barrier()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            samples.append((time.perf_counter() - t) / reps * 1e6)
        res.append(statistics.median(samples))
    return res[0], res[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", type=int, default=4 << 10)
    ap.add_argument("-e", type=int, default=64 << 20)
    ap.add_argument("-f", type=float, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    comm = Communicator(world)
    n = comm.size
    sizes = size_list(args.b, args.e, args.f)
    table: dict[int, dict[str, float]] = {}
    for nbytes in sizes:
        row = {}
        for algo, params in CONFIGS:
            m = time_allreduce(comm, nbytes // 4, "float32", "sum", algo, params,
                               args.warmup, args.iters)
            row[label(algo, params)] = m.busbw_gbps
        table[nbytes] = row
    call_us, run_us = overhead_us(comm)
    # Last: freeing its 64 MiB arrays moves glibc's mmap threshold, which changes how later
    # buffers are allocated (and, through UCX, how fast MPI moves them).
    ceiling = copy_bandwidth(world)
    if comm.rank == 0:
        cols = [label(a, p) for a, p in CONFIGS]
        print(f"# {n} ranks, float32 sum, busbw GB/s (median of {args.iters}); "
              f"memcpy ceiling {ceiling:.2f} GB/s")
        print("| size | " + " | ".join(cols) + " | best ours / native |")
        print("|" + "---|" * (len(cols) + 2))
        for nbytes, row in table.items():
            best = max(v for k, v in row.items() if k != "native")
            ratio = best / row["native"] if row["native"] else float("nan")
            size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
            print(f"| {size} | " + " | ".join(f"{row[c]:.2f}" for c in cols)
                  + f" | {ratio:.2f}x |")
        print(f"\nmemcpy ceiling (64 MiB, all ranks copying): {ceiling:.2f} GB/s")
        print(f"overhead at 8 B (native): Communicator.allreduce {call_us:.2f} us/call, "
              f"cached plan run {run_us:.2f} us/call, added {call_us - run_us:.2f} us")
    comm.close()


if __name__ == "__main__":
    main()
