"""Issue 21's torchrun targets, side by side: ringtune (the registered ``ringtune`` backend
with a profile tuned under torchrun) against gloo, on an emulated cluster (``ringtune
emulate --launcher torchrun``) and on this one host (``torchrun --standalone``).

Run from a shell as root (emulation needs it), with the torch environment, nothing else
running::

    .venv-torch/bin/python benchmarks/bench_torchrun.py               # ~30-40 min
    .venv-torch/bin/python benchmarks/bench_torchrun.py --quick       # ~5 min: proves it runs
    .venv-torch/bin/python benchmarks/bench_torchrun.py --only 2x2 --rounds 5 \\
        --profile-2x2 build/bench-torchrun/2x2.yaml                   # reuse a tuned profile

Per scenario (``2x2``: ``--cluster``, default profiles/clusters/emulated-2x2.yaml, 2 hosts x 2
ranks at 1 Gbit/s; ``1host``: as many ranks on this host):

1. **tune** under torchrun: ``ringtune tune`` as the job (torch engine, gloo), buckets
   64 KiB-64 MiB, unless ``--profile-2x2``/``--profile-1host`` names one already tuned;
2. **DDP step**: examples/train_digits.py (``--hidden``/``--layers``, default 2300x3: 10.7 M
   float32 parameters, communication-bound) with ``--backend ringtune`` and that profile
   (``RINGTUNE_PROFILE``) against ``--backend gloo``: ``--rounds`` jobs of each, interleaved
   (ABBA: drift of a shared machine hits both alike), each job's median step time; the
   table gives the median over jobs and the ratio gloo / ringtune (target: >= 1.3 on 2x2,
   >= 1.0 on one host);
3. **bus bandwidth**: ``ringtune bench --profile P`` against ``ringtune bench --algo native``
   (under the torch engine ``native`` is gloo's own ``all_reduce``), 64 KiB-64 MiB by 4x,
   and a third arm, an A/A control: the gloo job again (``gloo'``). The three arms rotate
   through the three positions round by round; per size the median busbw of each, the
   ratio ringtune / gloo (target: >= 1.0 at every size) and gloo' / gloo, which says how far
   two identical jobs differ on this machine, so a ratio within that spread is noise.

``--no-ddp`` skips step 2 (the bus bandwidth comparison alone takes a few minutes),
``--no-bench`` step 3; ``--batch`` and ``--bucket-view`` shape the DDP job (a smaller batch:
less compute per step, so the allreduce's share of the step, and the most a faster one can
gain, grows).

Prints Markdown tables; ``--out DIR`` (default build/bench-torchrun) keeps the profiles,
every job's JSON and ``results.json``. The numbers are this machine's: on a 2-CPU VM the
emulated hosts share the cores with the kernel's networking (BENCHMARKS.md says how that
bounds them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bounded

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", default=str(ROOT / "profiles/clusters/emulated-2x2.yaml"))
    p.add_argument("--only", choices=("2x2", "1host"), default=None)
    p.add_argument("--ranks", type=int, default=None,
                   help="ranks on one host (default: the cluster file's ranks)")
    p.add_argument("--rounds", type=int, default=3, help="jobs of each side (interleaved)")
    p.add_argument("--steps", type=int, default=40, help="DDP steps per job")
    p.add_argument("--hidden", type=int, default=2300)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=32,
                   help="samples per rank per step (fewer: less compute per step, a more "
                        "communication-bound job)")
    p.add_argument("--bucket-view", action="store_true",
                   help="DDP's gradient_as_bucket_view=True in both arms")
    p.add_argument("--min-bytes", default="64K")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--tune-budget", type=float, default=300.0, help="seconds per tune")
    p.add_argument("--profile-2x2", default=None, metavar="FILE")
    p.add_argument("--profile-1host", default=None, metavar="FILE")
    p.add_argument("--out", default=str(ROOT / "build" / "bench-torchrun"))
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per job")
    p.add_argument("--no-ddp", action="store_true", help="skip the DDP step comparison")
    p.add_argument("--no-bench", action="store_true",
                   help="skip the bus bandwidth comparison")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes, model and budgets, one round: proves the script runs")
    return p


class Scenario:
    """How to start a torchrun job: across the emulated cluster, or on this host."""

    def __init__(self, name: str, args: argparse.Namespace, ranks: int) -> None:
        self.name, self.args, self.ranks = name, args, ranks

    def command(self, job: list[str]) -> list[str]:
        if self.name == "2x2":
            return [sys.executable, "-m", "ringtune.cli", "emulate", "-q", "--cluster",
                    self.args.cluster, "--launcher", "torchrun", "--", *job]
        entry = job if job[0].endswith(".py") else ["--no-python", *job]
        return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(self.ranks),
                *entry]

    def run(self, job: list[str], env: dict[str, str] | None = None) -> None:
        cmd = self.command(job)
        t0 = time.monotonic()
        # SIGTERM first on a timeout: an emulation then removes its namespaces.
        res = bounded.run(cmd, self.args.timeout, cwd=ROOT, env=_env(env))
        if res.returncode != 0:
            raise SystemExit(f"bench_torchrun: {self.name}: `{' '.join(cmd)}` failed "
                             f"(exit {res.returncode}):\n{res.stdout[-2000:]}\n"
                             f"{res.stderr[-3000:]}")
        print(f"  {self.name}: {' '.join(job[:3])} … {time.monotonic() - t0:.0f} s",
              file=sys.stderr, flush=True)


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # `ringtune` of this install
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in ("RINGTUNE_PROFILE", "RINGTUNE_TUNE", "RINGTUNE_TUNE_OUT"):
        env.pop(var, None)
    env.update(extra or {})
    return env


def tune(sc: Scenario, out: Path, given: str | None) -> str:
    if given:
        return given
    a = sc.args
    path = out / f"{sc.name}.yaml"
    job = ["ringtune", "tune", "--out", str(path), "--min-bytes", a.min_bytes,
           "--max-bytes", a.max_bytes, "--budget", str(a.tune_budget), "--no-progress",
           "--storage", f"sqlite:///{out / (sc.name + '.db')}"]
    if a.quick:
        job += ["--buckets", f"{a.min_bytes},{a.max_bytes}", "--trials", "3"]
    sc.run(job)
    return str(path)


def ddp(sc: Scenario, out: Path, profile: str) -> dict[str, Any]:
    a = sc.args
    times: dict[str, list[float]] = {"ringtune": [], "gloo": []}
    for r in range(a.rounds):
        order = ("ringtune", "gloo") if r % 2 == 0 else ("gloo", "ringtune")
        for backend in order:
            path = out / f"{sc.name}-ddp-{backend}-{r}.json"
            sc.run(["examples/train_digits.py", "--backend", backend, "--steps", str(a.steps),
                    "--hidden", str(a.hidden), "--layers", str(a.layers),
                    "--batch", str(a.batch), *(["--bucket-view"] if a.bucket_view else []),
                    "--json", str(path)],
                   env={"RINGTUNE_PROFILE": profile} if backend == "ringtune" else None)
            times[backend].append(json.loads(path.read_text())["median_step_ms"])
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"jobs_ms": times, "median_ms": med, "ratio": med["gloo"] / med["ringtune"]}


SIDES = ("ringtune", "gloo", "gloo'")
FILE_TAG = {"ringtune": "ringtune", "gloo": "gloo", "gloo'": "gloo-again"}


def bench(sc: Scenario, out: Path, profile: str) -> dict[str, Any]:
    a = sc.args
    busbw: dict[str, dict[int, list[float]]] = {side: {} for side in SIDES}
    for r in range(a.rounds):
        order = SIDES[r % 3:] + SIDES[:r % 3]  # each arm takes every position in turn
        for side in order:
            path = out / f"{sc.name}-bench-{FILE_TAG[side]}-{r}.json"
            which = ["--profile", profile] if side == "ringtune" else ["--algo", "native"]
            sc.run(["ringtune", "bench", "-b", a.min_bytes, "-e", a.max_bytes, "-f", "4",
                    "-w", "2", "-n", "5" if a.quick else "10", "--json", str(path), *which])
            for row in json.loads(path.read_text())["rows"]:
                if row["wrong"]:
                    raise SystemExit(f"bench_torchrun: {path}: wrong results at "
                                     f"{row['size']} B")
                busbw[side].setdefault(int(row["size"]), []).append(row["busbw_gbps"])
    rows = []
    for size in sorted(busbw["gloo"]):
        ours, theirs, again = (statistics.median(busbw[side][size]) for side in SIDES)
        rows.append({"bytes": size, "ringtune_busbw_gbps": ours, "gloo_busbw_gbps": theirs,
                     "gloo_again_busbw_gbps": again,
                     "ratio": ours / theirs if theirs else float("nan"),
                     "aa_ratio": again / theirs if theirs else float("nan")})
    return {"rows": rows}


def _size(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def markdown(results: dict[str, Any], args: argparse.Namespace) -> str:
    lines: list[str] = []
    if not args.no_ddp:
        lines += [f"### DDP step, digits MLP {args.hidden}x{args.layers}, batch {args.batch} per "
                  f"rank{', gradients as bucket views' if args.bucket_view else ''}, "
                  f"{args.steps} steps, {args.rounds} interleaved job(s) each", "",
                  "| scenario | ringtune (ms) | gloo (ms) | gloo / ringtune |",
                  "|---|---:|---:|---:|"]
        for name, res in results.items():
            d = res["ddp"]
            lines.append(f"| {name} | {d['median_ms']['ringtune']:.2f} | "
                         f"{d['median_ms']['gloo']:.2f} | {d['ratio']:.2f}x |")
        lines.append("")
    if args.no_bench:
        return "\n".join(lines)
    lines += [f"### `ringtune bench` under torchrun: tuned profile vs gloo's all_reduce "
              f"(busbw GB/s, median of {args.rounds}; gloo' is the A/A control)", "",
              "| scenario | size | ringtune | gloo | gloo' | ringtune / gloo | gloo' / gloo |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, res in results.items():
        for row in res["bench"]["rows"]:
            lines.append(f"| {name} | {_size(row['bytes'])} | "
                         f"{row['ringtune_busbw_gbps']:.4f} | {row['gloo_busbw_gbps']:.4f} | "
                         f"{row['gloo_again_busbw_gbps']:.4f} | {row['ratio']:.2f}x | "
                         f"{row['aa_ratio']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    args = parser().parse_args()
    if args.quick:
        args.rounds, args.steps, args.hidden, args.layers = 1, 8, 64, 2
        args.min_bytes, args.max_bytes, args.tune_budget = "64K", "256K", 30.0
    from ringtune.emulate.spec import load_emulated

    spec = load_emulated(args.cluster)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [args.only] if args.only else ["2x2", "1host"]
    results: dict[str, Any] = {}
    for name in names:
        label = f"{spec.name} (torchrun, emulated)" if name == "2x2" else \
            f"1 host x {args.ranks or spec.ranks} (torchrun --standalone)"
        print(f"== {label}", file=sys.stderr, flush=True)
        sc = Scenario(name, args, args.ranks or spec.ranks)
        profile = tune(sc, out, args.profile_2x2 if name == "2x2" else args.profile_1host)
        results[label] = {"profile": profile,
                          "ddp": None if args.no_ddp else ddp(sc, out, profile),
                          "bench": None if args.no_bench else bench(sc, out, profile)}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(markdown(results, args), flush=True)


if __name__ == "__main__":
    main()
