"""gloo's allreduce, timed the way ringtune times its own: the peer a PyTorch job has on CPUs.

Run under torchrun, or under any MPI launch with torch installed (rank 0 prints a Markdown
table)::

    .venv-torch/bin/torchrun --standalone --nproc-per-node 2 benchmarks/bench_gloo.py --ringtune
    .venv-torch/bin/mpiexec -n 2 .venv-torch/bin/python benchmarks/bench_gloo.py
    ringtune emulate -q --cluster profiles/clusters/emulated-2x2.yaml -- \\
        .venv-torch/bin/python benchmarks/bench_gloo.py --min-bytes 1048576

Under torchrun the process group comes from torchrun's environment, and each rank runs one
torch thread, as torchrun sets ``OMP_NUM_THREADS=1`` for its workers: under mpiexec torch's
OpenMP workers (one per core) go on spinning after each parallel op and take the cores the
ranks need (the ringtune backend's 1 MiB all_reduce took ~450 µs that way, ~110 µs with one
thread). Under MPI the gloo process group is made from the MPI world
(``examples/train_digits.py``'s ``init_gloo``); from then on only gloo is used, since over
libfabric's tcp provider MPI moves data across hosts only while a rank is inside MPI, and a
rank waiting in gloo for a peer that waits in MPI would hang. For each size (float32
``sum``, in place, ``-b`` to ``-e`` by ``-f``): ``--warmup`` calls, then ``--iters``
iterations, each started at a gloo barrier; an iteration's time is the slowest rank's and
the figure is the median, as in ``ringtune bench``. busbw = algbw · 2(n−1)/n. The first
call's result is checked (every rank holds the sum of the ranks' inputs). Speed is
reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_digits import init_gloo, under_torchrun  # noqa: E402


def size_list(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def time_gloo(nbytes: int, warmup: int, iters: int, group: object = None) -> float:
    """Median over iterations of the slowest rank's time (s) of one in-place all_reduce
    over ``group`` (default: the gloo world; ``--ringtune``: the ringtune backend's)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    buf = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
    dist.all_reduce(buf, group=group)
    expected = n * (n + 1) / 2
    if nbytes >= 4 and not bool(torch.all(buf == expected)):
        raise SystemExit(f"rank {rank}: the sum at {nbytes} B is wrong "
                         f"(expected {expected}, got {buf[:4].tolist()} ...)")
    for _ in range(warmup):
        dist.all_reduce(buf, group=group)
    times = torch.zeros(iters, dtype=torch.float64)
    for i in range(iters):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(buf, group=group)
        times[i] = time.perf_counter() - t
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # each iteration: the slowest rank
    return statistics.median(times.tolist())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-b", "--min-bytes", type=int, default=4 << 10)
    ap.add_argument("-e", "--max-bytes", type=int, default=64 << 20)
    ap.add_argument("-f", "--factor", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--ringtune", action="store_true",
                    help="also time the registered 'ringtune' backend (no profile: its "
                         "built-in defaults), interleaved with gloo size by size, in "
                         "--rounds rounds")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", default=None, metavar="FILE",
                    help="also write each round's time (s) per size and arm to FILE (rank 0)")
    args = ap.parse_args()
    if under_torchrun():
        dist.init_process_group("gloo")
    else:
        from mpi4py import MPI

        init_gloo(MPI.COMM_WORLD)
    n = dist.get_world_size()
    factor = 2 * (n - 1) / n if n > 1 else 1.0
    arms: dict[str, object] = {"gloo": None}
    if args.ringtune:
        import collectives.torch  # noqa: F401 - registers the "ringtune" backend

        arms["ringtune"] = dist.new_group(backend="ringtune")
    sizes = size_list(args.min_bytes, args.max_bytes, args.factor)
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for nbytes in sizes:
            for arm, group in arms.items():
                times.setdefault((arm, nbytes), []).append(
                    time_gloo(nbytes, args.warmup, args.iters, group))
    if dist.get_rank() == 0:
        print(f"# {' and '.join(arms)} allreduce, {n} ranks, float32 sum, torch "
              f"{torch.__version__}; slowest rank, median of {args.iters}, median of "
              f"{args.rounds} interleaved rounds; load average "
              f"{os.getloadavg()[0]:.2f} at the end")
        cols = [f"{a} {what}" for a in arms for what in ("ms", "busbw (GB/s)")]
        extra = ["ringtune / gloo"] if args.ringtune else []
        print("| size | " + " | ".join(cols + extra) + " |")
        print("|" + "---|" * (len(cols) + len(extra) + 1))
        for nbytes in sizes:
            med = {a: statistics.median(times[(a, nbytes)]) for a in arms}
            cells = [f"{v:.{k}f}" for a in arms
                     for v, k in ((med[a] * 1e3, 3), (nbytes / med[a] / 1e9 * factor, 2))]
            if args.ringtune:
                cells.append(f"{med['gloo'] / med['ringtune']:.2f}x")
            print(f"| {label(nbytes)} | " + " | ".join(cells) + " |", flush=True)
        if args.json:
            from collectives.plumbing.atomic import write_text_atomic

            write_text_atomic(args.json, json.dumps(
                {"ranks": n, "torch": torch.__version__, "iters": args.iters,
                 "rounds": args.rounds, "arms": list(arms),
                 "rows": [{"bytes": s, "seconds_rounds": {a: times[(a, s)] for a in arms}}
                          for s in sizes]}, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
