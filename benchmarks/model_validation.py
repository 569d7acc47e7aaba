"""Validate the cost model against this machine: measured vs predicted allreduce time.

Run under MPI (any world size; the issue asks for 2 and 4 ranks)::

    .venv/bin/mpiexec -n 4 .venv/bin/python benchmarks/model_validation.py [--json FILE]

It calibrates the model in-process (``autotune.model.measure``: ping-pong between disjoint
pairs of ranks for latency and bandwidth, the software cost of posting a message, the
reduction rate), then times ``native``, ``multiring`` (rings 1 and 2) and ``rhd`` at 64 KiB to
64 MiB with the benchmark harness (``collectives.bench.time_allreduce``: slowest rank,
median of the timed iterations) and prints, per row, predicted / measured. The target is
±35% (ratio 0.65..1.35) at 1 MiB and above. Rank 0 prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIGS: list[tuple[str, dict]] = [
    ("native", {}),
    ("multiring", {"rings": 1}),
    ("multiring", {"rings": 2}),
    ("rhd", {}),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-bytes", type=int, default=64 << 10)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3,
                    help="repeat calibration and every timing; keep the best (the machine is "
                    "shared: the best repeat is the least disturbed one)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()

    from mpi4py import MPI

    from autotune.model import Model, measure
    from collectives import Communicator
    from collectives.bench import time_allreduce

    world = MPI.COMM_WORLD
    n, rank = world.Get_size(), world.Get_rank()
    cluster = best_calibration([measure(world) for _ in range(max(1, args.repeats))])
    model = Model(cluster)
    comm = Communicator(world)
    sizes = []
    size = args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= args.factor
    measured: dict[tuple[int, int], float] = {}
    for _ in range(max(1, args.repeats)):
        # Configurations interleaved within each repeat, so a burst of load from other work
        # on the machine hits one repeat of every configuration, not all repeats of one.
        for size in sizes:
            for i, (name, params) in enumerate(CONFIGS):
                m = time_allreduce(comm, size // 4, "float32", "sum", name, params,
                                   warmup=args.warmup, iters=args.iters)
                key = (size, i)
                measured[key] = min(measured.get(key, float("inf")), m.time_us)
    comm.close()
    fresh = fresh_data_check(world)
    rows = []
    for size in sizes:
        for i, (name, params) in enumerate(CONFIGS):
            t = measured[(size, i)]
            predicted = float(model.time(name, params, [size])[0]) * 1e6
            rows.append({"ranks": n, "bytes": size, "algorithm": name, "params": params,
                         "measured_us": round(t, 1), "predicted_us": round(predicted, 1),
                         "ratio": round(predicted / t, 2) if t else None})
    if rank == 0:
        lv = cluster.levels[0]
        print(f"calibration: {n} ranks, link {lv.bandwidth_gbs:.2f} GB/s, latency "
              f"{lv.latency_us:.1f} us, per-message overhead {cluster.overhead_us:.1f} us, "
              f"memory {cluster.memory_gbs:.1f} GB/s (reduction {cluster.memory_gbs / 3:.1f})")
        print("bandwidth curve (bytes: GB/s): " + ", ".join(
            f"{_size(b)}: {g:.2f}" for b, g in lv.curve))
        print("memory curve (bytes: GB/s): " + ", ".join(
            f"{_size(b)}: {g:.1f}" for b, g in cluster.memory_curve))
        print()
        print("| ranks | size | algorithm | measured (µs) | predicted (µs) | predicted/measured |"
              " within ±35% |")
        print("|---:|---:|---|---:|---:|---:|:---:|")
        for r in rows:
            label = r["algorithm"] + (f" rings={r['params']['rings']}" if r["params"] else "")
            ok = r["ratio"] is not None and 0.65 <= r["ratio"] <= 1.35
            judged = "yes" if ok else ("no" if r["bytes"] >= 1 << 20 else "(no, <1 MiB)")
            print(f"| {r['ranks']} | {_size(r['bytes'])} | {label} | {r['measured_us']:.0f} | "
                  f"{r['predicted_us']:.0f} | {r['ratio']:.2f} | {judged} |")
        if fresh:
            print(f"\nfresh-data check (512 KiB exchange between ranks 0 and 1, median): "
                  f"resent unchanged {fresh[0]:.0f} µs; right after a reduction wrote it "
                  f"{fresh[1]:.0f} µs (the reduction alone: {fresh[2]:.0f} µs)")
        big = [r for r in rows if r["bytes"] >= 1 << 20]
        inside = sum(1 for r in big if 0.65 <= r["ratio"] <= 1.35)
        print(f"\nrows at >= 1 MiB within ±35%: {inside} of {len(big)}")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"calibration": {
                    "bandwidth_gbs": lv.bandwidth_gbs, "latency_us": lv.latency_us,
                    "overhead_us": cluster.overhead_us, "memory_gbs": cluster.memory_gbs},
                    "rows": rows}, f, indent=1)
    return 0


def fresh_data_check(world: object, nbytes: int = 512 << 10, reps: int = 30) -> tuple | None:
    """Exchange time of a buffer sent again unchanged vs the same buffer right after a
    reduction wrote into it, as the algorithms send (ranks 0 and 1; others wait)."""
    import time

    import numpy as np

    n, rank = world.Get_size(), world.Get_rank()  # type: ignore[attr-defined]
    if n < 2:
        return None
    out = None
    if rank < 2:
        peer = 1 - rank
        a = np.ones(nbytes // 4, dtype=np.float32)
        b = np.ones_like(a)

        def med(step: object) -> float:
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                step()  # type: ignore[operator]
                ts.append(time.perf_counter() - t0)
            return float(np.median(ts)) * 1e6

        def exchange() -> None:
            world.Sendrecv(a, peer, 7, b, peer, 7)  # type: ignore[attr-defined]

        def reduce_then_exchange() -> None:
            np.add(a, b, out=a)
            exchange()

        exchange()
        out = (med(exchange), med(reduce_then_exchange), med(lambda: np.add(a, b, out=a)))
    return world.bcast(out, root=0)  # type: ignore[attr-defined]


def best_calibration(runs: list) -> object:
    """The least disturbed of several calibrations: highest bandwidth and memory rate,
    lowest latency and overhead, level by level."""
    from dataclasses import replace

    levels = []
    for j, lv in enumerate(runs[0].levels):
        curve = tuple((b, max(r.levels[j].curve[k][1] for r in runs))
                      for k, (b, _) in enumerate(lv.curve))
        levels.append(replace(
            lv, bandwidth_gbs=max(r.levels[j].bandwidth_gbs for r in runs),
            latency_us=min(r.levels[j].latency_us for r in runs), curve=curve))
    mem_curve = tuple((b, max(r.memory_curve[k][1] for r in runs))
                      for k, (b, _) in enumerate(runs[0].memory_curve))
    return replace(runs[0], levels=tuple(levels), memory_curve=mem_curve,
                   memory_gbs=max(r.memory_gbs for r in runs),
                   overhead_us=min(r.overhead_us for r in runs))


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


if __name__ == "__main__":
    sys.exit(main())
