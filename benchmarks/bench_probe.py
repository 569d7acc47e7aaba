"""How long `ringtune probe` takes, with and without `--measure`, and how long the ring-order
search takes on the recorded 8-GPU machines.

    .venv/bin/python benchmarks/bench_probe.py [--runs 5] [--ranks 4]

Wall-clock times of whole commands as a user starts them (process start, MPI start-up,
probing, printing), median of ``--runs``. Targets (issue 3): under 2 s without
``--measure``; under 30 s with ``--measure`` on 4 ranks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))


def _time(cmd: list[str], runs: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA"))}
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, timeout=300)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=4)
    args = ap.parse_args()
    bindir = Path(sys.executable).parent
    ringtune = [str(bindir / "ringtune")]
    mpi = [str(bindir / "mpiexec"), "-n", str(args.ranks)]
    rows = [
        ("ringtune probe", ringtune + ["probe"]),
        (f"mpiexec -n {args.ranks} ringtune probe", mpi + ringtune + ["probe"]),
        (f"mpiexec -n {args.ranks} ringtune probe --measure",
         mpi + ringtune + ["probe", "--measure"]),
    ]
    print(f"# {args.runs} runs each, median wall time")
    for label, cmd in rows:
        print(f"{label:<45} {_time(cmd, args.runs):8.3f} s")

    from probes import layout
    from probes.topology import RankPlace, Topology
    from tests.fixtures import MACHINES, materialize

    with tempfile.TemporaryDirectory() as tmp:
        for name in MACHINES:
            root, nv = materialize(name, Path(tmp))
            t0 = time.perf_counter()
            h = layout.read_host(root, responder=nv, name=name)
            parse = time.perf_counter() - t0
            for hosts in (1, 4):
                topo = Topology(hosts=(h,) * hosts, ranks=tuple(
                    RankPlace(rank=r, host=r // 8, local_rank=r % 8, gpu=r % 8)
                    for r in range(8 * hosts)))
                t0 = time.perf_counter()
                topo.ring_orders(16)
                search = time.perf_counter() - t0
                print(f"{name:<10} x{hosts} hosts: read_host {parse * 1e3:6.1f} ms, "
                      f"16 ring orders {search * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
