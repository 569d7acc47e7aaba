"""How long loading the largest accepted records takes, and what ``import collectives`` costs.

    .venv/bin/python benchmarks/bench_records.py [--runs 5]

Writes a profile of ``MAX_RULES`` rules (each with params and measured figures, what a
hand-made table holds) and the largest topology the caps admit (``MAX_HOSTS`` hosts of
8 GPUs, ``MAX_RANKS`` ranks), then times, in this process, CPU seconds (median of
``--runs``): reading each file through its loader (parse + validate), and validating its
already-parsed data alone (``profile_from_dict``, ``Topology.from_dict``). Last, the wall
time of ``python -c 'import collectives'`` in a fresh interpreter (median of ``--runs``).
The figures chose the one declared-record validator (``safefiles.records``): see
docs/profile-format.md "How files are checked".
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))


def profile_text(rules: int) -> str:
    lines = ["format: ringtune-profile", "version: 1", "topology: {world_size: 4}",
             "backend: numpy", "transport: mpi", "rules:"]
    for i in range(rules):
        hi = "null" if i == rules - 1 else str(i * 1024 + 1023)
        algo = ("algorithm: multiring, params: {rings: 2, chunk_bytes: 65536, order: "
                "topology}" if i % 2 else "algorithm: native, params: {}")
        lines.append(f"- {{min_bytes: {i * 1024}, max_bytes: {hi}, {algo}, measured: "
                     f"{{bytes: {i * 1024 + 512}, busbw_gbps: 1.5, time_us: 12.5, "
                     "native_busbw_gbps: 1.25, speedup: 1.2}}")
    return "\n".join(lines) + "\n"


def topology_text(hosts: int, gpus: int) -> str:
    lines = ["format: ringtune-topology", "version: 1", "hosts:"]
    for h in range(hosts):
        lines.append(f"- name: h{h}")
        lines.append("  gpus: [" + ", ".join(f"{{index: {g}, name: H100}}"
                                             for g in range(gpus)) + "]")
    lines.append("ranks:")
    for h in range(hosts):
        for g in range(gpus):
            lines.append(f"- {{rank: {h * gpus + g}, host: {h}, local_rank: {g}, gpu: {g}}}")
    return "\n".join(lines) + "\n"


def cpu_median(fn: Callable[[], Any], runs: int) -> float:
    fn()  # warm: first imports, caches
    spent = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        spent.append(time.process_time() - t0)
    return statistics.median(spent)


def import_seconds(runs: int) -> float:
    spent = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import collectives"], check=True, cwd=HERE)
        spent.append(time.perf_counter() - t0)
    return statistics.median(spent)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    import probes
    from collectives.profile import MAX_RULES, load_profile, profile_from_dict
    from probes.topology import MAX_HOSTS, MAX_RANKS, Topology
    from safefiles.safeload import parse_text

    gpus = MAX_RANKS // MAX_HOSTS
    with tempfile.TemporaryDirectory() as tmp:
        prof = Path(tmp) / "rules.yaml"
        prof.write_text(profile_text(MAX_RULES))
        topo = Path(tmp) / "topology.yaml"
        topo.write_text(topology_text(MAX_HOSTS, gpus))
        pdata = parse_text(prof.read_text(), str(prof))
        tdata = parse_text(topo.read_text(), str(topo))
        rows = [
            (f"profile, {MAX_RULES} rules: load_profile", lambda: load_profile(prof)),
            (f"profile, {MAX_RULES} rules: validate only",
             lambda: profile_from_dict(pdata, "p")),
            (f"topology, {MAX_HOSTS} hosts x {gpus} GPUs, {MAX_RANKS} ranks: load_topology",
             lambda: probes.load_topology(topo)),
            ("topology, same: validate only", lambda: Topology.from_dict(tdata, "t")),
        ]
        for label, fn in rows:
            print(f"{cpu_median(fn, args.runs):7.3f} s CPU  {label}")
    print(f"{import_seconds(args.runs):7.3f} s wall  python -c 'import collectives'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
