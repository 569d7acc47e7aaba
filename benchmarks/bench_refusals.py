"""How long and how much memory refusing each of issue 25's inputs takes.

    .venv/bin/python benchmarks/bench_refusals.py [--runs 3]

Writes the inputs the issue names (a FIFO, a 10⁵-rule profile, a 10⁵-rank topology, a host
of 4,096 GPUs, a 65,536-rank cluster, a host profile naming a GPU transport, and the cases
of its item 6) and refuses each through its loader in this process: CPU seconds (median of
``--runs``, untraced) and the traced peak (one run under ``tracemalloc``). Prints one line
per input and the worst of each; exits 1 when any is accepted, takes 1 s or more, or peaks
at 100 MB or more (the issue's targets).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

PROFILE_HEAD = ("format: ringtune-profile\nversion: 1\ntopology: {world_size: 2}\n"
                "backend: numpy\ntransport: mpi\n")
RULE = "rules:\n- {min_bytes: 0, max_bytes: null, algorithm: native}\n"
TOPO_HEAD = "format: ringtune-topology\nversion: 1\nhosts:\n- name: h\n"


def inputs(tmp: Path) -> dict[str, tuple[str, str]]:
    """name -> (kind, path)."""
    files: dict[str, tuple[str, str]] = {}

    def put(name: str, kind: str, text: str) -> None:
        path = tmp / name
        path.write_text(text)
        files[name] = (kind, str(path))

    fifo = tmp / "fifo.yaml"
    os.mkfifo(fifo)
    for kind in ("profile", "topology", "cluster"):
        files[f"fifo as {kind}"] = (kind, str(fifo))
    put("rules-1e5.yaml", "profile", PROFILE_HEAD + "rules:\n" + "".join(
        f"- {{min_bytes: {i}, max_bytes: {i}, algorithm: native}}\n" for i in range(100_000)))
    put("rules-2000.yaml", "profile", PROFILE_HEAD + "rules:\n" + "".join(
        f"- {{min_bytes: {i}, max_bytes: {i}, algorithm: native}}\n" for i in range(2000)))
    put("ranks-1e5.yaml", "topology", TOPO_HEAD + "ranks:\n" + "".join(
        f"- {{rank: {r}}}\n" for r in range(100_000)))
    put("gpus-4096.yaml", "topology", TOPO_HEAD + "  gpus:\n" + "".join(
        f"  - {{index: {i}}}\n" for i in range(4096)))
    cluster = (HERE / "profiles" / "clusters" / "dgx-h100-32.yaml").read_text()
    put("cluster-65536.yaml", "cluster", cluster.replace("ranks: 256", "ranks: 65536")
        .replace("    size: 32\n", "    size: 8192\n"))
    put("cluster-emulate.yaml", "cluster", cluster + "emulate: {mtu: 10}\n")
    put("staged.yaml", "profile", PROFILE_HEAD.replace("transport: mpi", "transport: staged")
        + RULE)
    fp = "sha256:" + "0" * 64
    for name, text in {
        "fingerprint-newline.yaml": PROFILE_HEAD.replace(
            "{world_size: 2}", f"{{world_size: 2, fingerprint: \"{fp}\\n\"}}") + RULE,
        "version-1.0.yaml": PROFILE_HEAD.replace("version: 1", "version: 1.0") + RULE,
        "params-list.yaml": PROFILE_HEAD + RULE.replace("native}", "native, params: []}"),
        "params-null.yaml": PROFILE_HEAD + RULE.replace("native}", "native, params: null}"),
        "chunk-2e62.yaml": PROFILE_HEAD + RULE.replace(
            "native}", "multiring, params: {chunk_bytes: 4611686018427387904}}"),
        "hosts-x-rph.yaml": PROFILE_HEAD.replace(
            "{world_size: 2}", "{world_size: 2, hosts: 2, ranks_per_host: 2}") + RULE,
        "impl-ccl.yaml": PROFILE_HEAD + RULE.replace("native}", "native, params: {impl: ccl}}"),
    }.items():
        put(name, "profile", text)
    for name, host in {
        "dup-gpu.yaml": "  gpus: [{index: 0}, {index: 0}]\n",
        "numa-99.yaml": "  numa: [{id: 0}]\n  gpus: [{index: 0, numa_node: 99}]\n",
        "distances.yaml": "  numa: [{id: 0, distances: [10, 20]}]\n",
        "cpus-empty-part.yaml": "  numa: [{id: 0, cpus: '0,,1'}]\n",
    }.items():
        put(name, "topology", TOPO_HEAD + host)
    put("local-rank.yaml", "topology", TOPO_HEAD + "ranks: [{rank: 0, local_rank: 3}]\n")
    put("summary-list.yaml", "topology", TOPO_HEAD + "summary: [1]\n")
    return files


def loader(kind: str) -> Callable[[str], Any]:
    import probes
    from autotune.cluster import load_cluster
    from collectives.profile import load_profile

    loaders: dict[str, Callable[[str], Any]] = {
        "profile": load_profile, "topology": probes.load_topology, "cluster": load_cluster}
    return loaders[kind]


def refuse(kind: str, path: str) -> str | None:
    """The refusal's message, or ``None`` when the file was accepted."""
    try:
        loader(kind)(path)
    except ValueError as exc:  # ProfileError, TopologyError and the cluster's ValueError
        return str(exc)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    import collectives.algorithms  # noqa: F401 - imported outside the timed part
    import probes  # noqa: F401

    bad = 0
    worst_s = worst_mb = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (kind, path) in inputs(Path(tmp)).items():
            refuse(kind, path)  # warm: first imports
            spent = []
            for _ in range(args.runs):
                t0 = time.process_time()
                message = refuse(kind, path)
                spent.append(time.process_time() - t0)
            tracemalloc.start()
            refuse(kind, path)
            peak = tracemalloc.get_traced_memory()[1] / 1e6
            tracemalloc.stop()
            s = statistics.median(spent)
            worst_s, worst_mb = max(worst_s, s), max(worst_mb, peak)
            ok = message is not None and s < 1.0 and peak < 100
            bad += not ok
            shown = (message or "ACCEPTED").replace(tmp + "/", "")
            print(f"{'ok ' if ok else 'BAD'} {s:6.3f} s {peak:6.1f} MB  {kind:8s} {name}: "
                  f"{shown[:110]}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"worst: {worst_s:.3f} s CPU, {worst_mb:.1f} MB traced (load average {load})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
