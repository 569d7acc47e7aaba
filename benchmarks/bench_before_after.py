"""The tuned-profile benchmark on two checkouts, alternated job by job: is the code slower?

A refactor that must not change behaviour must not change speed either. This runs
``benchmarks/bench_tuned.py`` (each checkout's own) with one profile under ``mpiexec``,
alternating ``before`` and ``after`` jobs ``--pairs`` times so that machine noise falls on
both alike, and prints per size the median time of the profile's choice (``tuned``) in each
checkout and their ratio, beside the same ratio for the library's own allreduce
(``native``): the native call is the same code in both, so its ratio is what the machine's
drift reads, and a tuned ratio within that spread cannot be told from 1.0::

    git worktree add /tmp/before f5c025b
    .venv/bin/python benchmarks/bench_before_after.py --before /tmp/before \\
        --profile PROFILE -np 2 [--pairs 3] [-b 1K -e 64M -f 4] [--json FILE]

The profile must load in both checkouts (use algorithms both have). The machine's load
average is printed before and after.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_one(tree: Path, profile: str, ranks: int, sizes: list[str], out: Path) -> list[Any]:
    """One bench_tuned job of ``tree``'s code (rounds 1); its rows."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))}
    env["PYTHONPATH"] = str(tree)
    cmd = [str(mpiexec), "-n", str(ranks), sys.executable, "-m", "mpi4py",
           str(tree / "benchmarks" / "bench_tuned.py"), "--profile", profile, *sizes,
           "--rounds", "1", "--json", str(out)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, timeout=900,
                   stdout=subprocess.DEVNULL)
    rows: list[Any] = json.loads(out.read_text())["rows"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="a checkout of the earlier commit")
    ap.add_argument("--after", default=str(ROOT), help="the later checkout (this one)")
    ap.add_argument("--profile", required=True)
    ap.add_argument("-np", type=int, default=2, dest="ranks")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("-b", default="1K")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", default="4")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    sizes = ["-b", args.b, "-e", args.e, "-f", args.f]
    profile = str(Path(args.profile).resolve())
    times: dict[str, dict[int, dict[str, list[float]]]] = {"before": {}, "after": {}}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            # Alternate which goes first, so neither always runs on a warmer machine.
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            for side in order:
                rows = run_one(trees[side], profile, args.ranks, sizes,
                               Path(tmp) / f"{side}-{i}.json")
                for r in rows:
                    cell = times[side].setdefault(r["bytes"], {"tuned": [], "native": []})
                    cell["tuned"].append(r["time_us"]["tuned"])
                    cell["native"].append(r["time_us"]["native"])
                print(f"pair {i + 1}/{args.pairs}: {side} done", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    out = []
    print(f"# bench_tuned.py, {args.ranks} ranks, profile {args.profile}, {args.pairs} "
          f"alternated pairs of jobs; medians of time_us; load "
          f"{load_before[0]:.1f} -> {load_after[0]:.1f}")
    print(f"{'size':>10} {'tuned before':>13} {'tuned after':>12} {'after/before':>13}"
          f" {'native a/b':>11}")
    for nbytes in sorted(times["after"]):
        med = {side: {k: statistics.median(v) for k, v in times[side][nbytes].items()}
               for side in ("before", "after")}
        ratio = med["after"]["tuned"] / med["before"]["tuned"]
        control = med["after"]["native"] / med["before"]["native"]
        out.append({"bytes": nbytes, "before": med["before"], "after": med["after"],
                    "tuned_after_over_before": ratio, "native_after_over_before": control})
        print(f"{nbytes:>10} {med['before']['tuned']:>13.1f} {med['after']['tuned']:>12.1f}"
              f" {ratio:>13.2f} {control:>11.2f}")
    if args.json:
        from collectives.plumbing.atomic import write_text_atomic

        write_text_atomic(args.json, json.dumps(
            {"ranks": args.ranks, "profile": args.profile, "pairs": args.pairs,
             "load": [load_before, load_after], "rows": out}, indent=2) + "\n")


if __name__ == "__main__":
    main()
