"""The papers side by side: what the cost model predicts for the clusters of Goyal et al.
and PowerAI DDL, next to what the papers report. Nothing here is tuned to the papers: the
cluster files hold hardware figures (``profiles/clusters/``, with sources) and the model
is the same one ``ringtune simulate`` uses.

    .venv/bin/python benchmarks/papers.py

Prints Markdown (the tables of BENCHMARKS.md, issue 6). Single process, about a second.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from autotune.cluster import load_cluster, load_workload  # noqa: E402
from autotune.model import Model  # noqa: E402

CLUSTERS = os.path.join(ROOT, "profiles", "clusters")


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def goyal() -> list[str]:
    """Halving/doubling vs ring on 32 servers: Goyal et al. sum inside a server first, then
    allreduce among the 32 servers (one buffer per server), then broadcast inside. The
    inter-server allreduce is modelled on the cluster seen as one rank per server."""
    cluster = load_cluster(os.path.join(CLUSTERS, "goyal-bigbasin-32.yaml")).flat_hosts()
    model = Model(cluster)
    sizes = [1 << k for k in range(16, 28, 2)] + [102_400_000]
    ring = model.time("multiring", {"rings": 1}, sizes)
    hd = model.time("rhd", {}, sizes)
    lines = [
        "| buffer | ring (µs) | halving/doubling (µs) | ring / HD predicted |",
        "|---:|---:|---:|---:|",
    ]
    for s, r, h in zip(sizes, ring, hd):
        label = "102.4 MB (ResNet-50, all gradients)" if s == 102_400_000 else _size(s)
        lines.append(f"| {label} | {r * 1e6:,.0f} | {h * 1e6:,.0f} | {r / h:.2f}× |")
    return lines


def ddl() -> list[str]:
    """Scaling efficiency at 256 GPUs for ResNet-50 on DDL's cluster: flat ring vs the
    4x16x4 and 4x8x8 grids; and the same configurations on Goyal et al.'s cluster."""
    work = load_workload(os.path.join(CLUSTERS, "workloads", "resnet50-p100.yaml"))
    full = replace(work, overlap=1.0)
    lines = [
        "| cluster | configuration | allreduce (ms) | efficiency, no overlap | "
        "efficiency, full overlap |",
        "|---|---|---:|---:|---:|",
    ]
    configs: list[tuple[str, str, dict[str, Any]]] = [
        ("flat ring (multiring, rings=1)", "multiring", {"rings": 1}),
        ("4x16x4 grid, ring per dimension", "hierarchical", {"dims": [4, 16, 4]}),
        ("4x8x8 grid, ring per dimension", "hierarchical", {"dims": [4, 8, 8]}),
        ("halving/doubling (rhd)", "rhd", {}),
    ]
    for fname in ("ddl-minsky-64.yaml", "goyal-bigbasin-32.yaml"):
        cluster = load_cluster(os.path.join(CLUSTERS, fname))
        model = Model(cluster)
        rows = list(configs)
        if "goyal" in fname:
            rows = [configs[0], ("8x32 grid, ring per dimension", "hierarchical",
                                 {"dims": [8, 32]}), configs[3]]
        for label, algo, params in rows:
            t = float(model.time(algo, params, [work.gradient_bytes])[0])
            lines.append(f"| {cluster.name} | {label} | {t * 1e3:.1f} | "
                         f"{100 * work.efficiency(t):.1f}% | {100 * full.efficiency(t):.1f}% |")
        best = model.best([work.gradient_bytes])
        name, pred = min(((k, v[0]) for k, v in best.items()), key=lambda kv: kv[1].time_us)
        t = pred.time_us * 1e-6
        lines.append(f"| {cluster.name} | model's best: {pred.describe()} | {t * 1e3:.1f} | "
                     f"{100 * work.efficiency(t):.1f}% | {100 * full.efficiency(t):.1f}% |")
    return lines


def main() -> int:
    np.set_printoptions(precision=3)
    print("### Goyal et al.: halving/doubling vs ring, inter-server allreduce on 32 servers")
    print()
    print("\n".join(goyal()))
    print()
    print("### PowerAI DDL: scaling efficiency at 256 GPUs, ResNet-50")
    print()
    print("\n".join(ddl()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
