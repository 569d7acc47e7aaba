"""Issue 24's targets side by side: the same DDP job with an offline profile, with online
tuning from no profile, and loading the profile the online job wrote, rounds rotated::

    .venv-torch/bin/python benchmarks/bench_online_compare.py --offline P [--rounds 3]

Each arm is one job of ``benchmarks/bench_online.py`` on the emulated 2 x 2 cluster
(``ringtune emulate``; ``--cluster`` to change); the offline arm runs first, last, then
between the others (online always precedes the job loading what it wrote), so that no arm
always runs at the same place in a round. Prints
one JSON line per job and then, per arm, the median over rounds of each job's median step
of steps 41-50 (``median_ms_last10``), the ratio to the offline arm, and for the online arm
the share of the 50 steps' time that exploring cost beyond the best candidates
(``exploring_extra_s / total_s``). The physical bound is the offline arm itself: online
tuning can at best find what the offline tuner found.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import bounded

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def job(cluster: str, extra: list[str], steps: int, timeout: float) -> dict:
    """One bench_online.py job under ``ringtune emulate``; its rank 0's JSON line."""
    cmd = [str(BIN / "ringtune"), "emulate", "-q", "--wait", "600", "--cluster", cluster,
           "--", sys.executable, str(HERE / "bench_online.py"), "--steps", str(steps), *extra]
    try:
        out = bounded.run(cmd, timeout)
    except subprocess.TimeoutExpired as late:
        err = late.stderr if isinstance(late.stderr, str) else ""
        raise SystemExit(f"job timed out after {timeout:g} s: {' '.join(cmd)}\n"
                         f"{err[-2000:]}") from None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"job failed (rc {out.returncode}): {' '.join(cmd)}\n"
                         f"{out.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--offline", required=True, metavar="PROFILE",
                   help="the offline-tuned profile (ringtune tune on the same cluster)")
    p.add_argument("--cluster", default="profiles/clusters/emulated-2x2.yaml")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    a = p.parse_args()
    arms: dict[str, list[dict]] = {"offline": [], "online": [], "next": []}
    with tempfile.TemporaryDirectory(prefix="ringtune-online-") as tmp:
        for r in range(a.rounds):
            written = os.path.join(tmp, f"online-{r}.yaml")
            # The next job loads what this round's online job wrote, so online precedes
            # it; the offline arm moves through the three positions.
            order = [["offline", "online", "next"], ["online", "next", "offline"],
                     ["online", "offline", "next"]][r % 3]
            for arm in order:
                extra = {"offline": ["--profile", a.offline],
                         "online": ["--tune", "online", "--tune-out", written],
                         "next": ["--profile", written]}[arm]
                res = job(a.cluster, [*extra, "--label", arm], a.steps, a.timeout)
                res["round"] = r
                arms[arm].append(res)
                print(json.dumps(res), flush=True)
    base = statistics.median(x["median_ms_last10"] for x in arms["offline"])
    for arm, runs in arms.items():
        med = statistics.median(x["median_ms_last10"] for x in runs)
        ratios = [x["median_ms_last10"] / o["median_ms_last10"]
                  for x, o in zip(runs, arms["offline"])]
        each = ", ".join(str(x["median_ms_last10"]) for x in runs)
        line = (f"{arm:8s} step {med:7.1f} ms (runs {each})"
                f"  {med / base:.3f}x offline; per-round ratios "
                f"{', '.join(f'{q:.3f}' for q in ratios)}")
        if arm == "online":
            shares = [x.get("exploring_extra_s", 0.0) / x["total_s"] for x in runs]
            line += f"; exploring {', '.join(f'{s:.1%}' for s in shares)} of the steps"
            line += f"; settled {runs[-1].get('settled')}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
