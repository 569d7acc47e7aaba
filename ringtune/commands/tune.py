"""Tune this machine: search allreduce configurations per message size, write a profile.

Started without mpiexec it launches itself on this machine's local ranks (one per GPU when
there are at least two, else max(2, CPU cores), at most 8; -np overrides). Rerunning the
same command resumes from the Optuna storage (default: SQLite next to --out): finished
buckets are not searched again; --fresh starts over.

examples:
  ringtune tune --out profiles/local.yaml
  ringtune tune -np 4 -b 64K -e 16M --trials 20 --report report/
  ringtune tune --backend cupy --out profiles/gpu.yaml     # GPU buffers, transports searched
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from ..engine import add_engine_argument, close_world, engine_world, resolve_engine
from ..errors import CommandFailed, UsageError
from ..flags import add_algos, add_datatype, add_op, add_ranks, add_size_range, add_wait, algo_list

if TYPE_CHECKING:
    from autotune.records import TuneOptions

HELP = "tune allreduce on this machine and write a profile"

DEFAULT_OUT = "ringtune-profile.yaml"
DEFAULT_TRIALS = 30
DEFAULT_BUDGET_S = 200.0
DEFAULT_TRIAL_TIMEOUT_S = 120.0
DEFAULT_BUSY_WAIT_S = 600.0
#: ``--busy`` (``autotune.machine.BUSY_MODES``; a unit test holds the two equal, so that
#: building the parser imports nothing of autotune).
BUSY_MODES = ("warn", "wait", "refuse")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=DEFAULT_OUT, metavar="FILE",
                   help=f"profile to write (default: {DEFAULT_OUT})")
    add_size_range(p, "1K", "64M", "bucket", aliases=(["--min-bytes"], ["--max-bytes"]))
    p.add_argument("--buckets", default=None, metavar="LIST",
                   help="comma-separated bucket sizes instead of powers of 4 from -b to -e")
    p.add_argument("--trials", type=int, default=DEFAULT_TRIALS, metavar="N",
                   help=f"candidates measured per bucket at most (default {DEFAULT_TRIALS})")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                   help=f"wall-clock budget of the whole run (default {DEFAULT_BUDGET_S:g})")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage URL (default: sqlite:///<out dir>/<out stem>.db)")
    p.add_argument("--study", default=None, metavar="NAME",
                   help="prefix of the study names (default: from the topology fingerprint)")
    p.add_argument("--sampler", default="tpe", choices=("tpe", "random", "grid"),
                   help="tpe (default), random, or grid (every configuration)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--trial-timeout", type=float, default=DEFAULT_TRIAL_TIMEOUT_S,
                   metavar="S", help="abort the job when one candidate runs longer "
                   "(recorded TIMEOUT; the next run retries it once, a second timeout "
                   f"rules it out; default {DEFAULT_TRIAL_TIMEOUT_S:g}, 0 = off)")
    p.add_argument("--margin", type=float, default=0.03,
                   help="a non-native choice must beat native by this fraction (default 0.03)")
    add_algos(p, "algorithms to search",
              aliases=["--algorithms"], dest="algorithms")
    p.add_argument("--backend", default="auto", metavar="NAME",
                   help="where the tuned buffers live: numpy (host), cupy (GPU; also searches "
                        "the GPU transports every rank can use), a plug-in's backend, or auto "
                        "(default: cupy when rank 0 has a GPU transport, else numpy)")
    add_datatype(p, aliases=["--dtype"], what="element type tuned")
    add_op(p, what="reduction op tuned")
    p.add_argument("--workload", default=None, metavar="FILE",
                   help="also search allreduce_many's bucket size (profile key fusion) on "
                        "the gradient tensor sizes (tensor_bytes) of this workload file")
    p.add_argument("--report", default=None, metavar="DIR",
                   help="also write DIR/busbw.png and DIR/report.md")
    p.add_argument("--fresh", action="store_true",
                   help="delete this run's studies from the storage and start over")
    add_wait(p, "another run holds the storage", "default: refuse at once")
    p.add_argument("--busy", default="warn", choices=BUSY_MODES,
                   help="when other processes load this machine (they take the CPUs the "
                        "ranks spin on, so timings are unstable): warn (default: say so at "
                        "the start and in the summary, mark unstable rules, write), wait "
                        "(first wait up to --busy-wait for a quiet machine), refuse (measure, "
                        "but write no profile if it was busy; exit 2)")
    p.add_argument("--busy-wait", type=float, default=DEFAULT_BUSY_WAIT_S, metavar="SECONDS",
                   help="--busy wait: the longest wait for a quiet machine, then tune anyway "
                        f"(default {DEFAULT_BUSY_WAIT_S:g})")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.add_argument("--shapes", default=None, metavar="LIST",
                   help="also tune these job shapes (rank counts, e.g. 1,2,4: the first N "
                        "ranks of the allocation) into sections of the one profile")
    add_ranks(p)
    add_engine_argument(p)


def _options(args: argparse.Namespace) -> TuneOptions:
    """Validate the flags (before any MPI start-up, so errors print once)."""
    from autotune.naming import power_of_4_buckets
    from autotune.records import TuneOptions
    from collectives.bench import parse_size
    from collectives.ops import DTYPES, OPS
    from collectives.profile import check_writable

    from ..launch import check_ranks

    check_ranks(args.np, args.oversubscribe)
    # Bad sizes raise ValueError, which the CLI reports as bad input (exit 2).
    if args.buckets:
        buckets = sorted({parse_size(x) for x in args.buckets.split(",") if x.strip()})
        if not buckets or buckets[0] < 1:
            raise UsageError(f"--buckets {args.buckets!r}: give sizes ≥ 1 byte")
    else:
        buckets = power_of_4_buckets(parse_size(args.min_bytes), parse_size(args.max_bytes))
    if args.trials < 1:
        raise UsageError(f"--trials must be at least 1, got {args.trials}")
    if args.budget <= 0:
        raise UsageError(f"--budget must be positive, got {args.budget:g}")
    if not 0 <= args.margin < 1:
        raise UsageError(f"--margin must be in [0, 1), got {args.margin:g}")
    if args.dtype not in DTYPES:
        raise UsageError(f"-d/--datatype {args.dtype!r}: use one of {', '.join(DTYPES)}")
    if args.op not in OPS:
        raise UsageError(f"-o/--op {args.op!r}: use one of {', '.join(OPS)}")
    check_writable(args.out)
    if args.report and os.path.exists(args.report) and not os.path.isdir(args.report):
        raise UsageError(f"--report {args.report}: exists and is not a folder")
    backend = getattr(args, "backend", "auto")
    if backend == "cupy":
        _check_cupy_here()
    algorithms = algo_list(args.algorithms)
    if algorithms:
        from autotune.space import searchable

        searchable(algorithms)  # ValueError naming the algorithm: bad input (exit 2)
    workload = getattr(args, "workload", None)
    tensor_bytes = _workload_tensors(workload) if workload else None
    return TuneOptions(out=args.out, buckets=buckets, trials=args.trials,
                       budget_s=args.budget, storage=args.storage, study=args.study,
                       sampler=args.sampler, seed=args.seed,
                       trial_timeout_s=args.trial_timeout or None, margin=args.margin,
                       algorithms=algorithms, dtype=args.dtype, op=args.op, fresh=args.fresh,
                       report=args.report, progress=not args.no_progress, backend=backend,
                       wait=args.wait or 0.0, tensor_bytes=tensor_bytes,
                       busy=getattr(args, "busy", "warn"),
                       busy_wait_s=getattr(args, "busy_wait", DEFAULT_BUSY_WAIT_S))


def _workload_tensors(path: str) -> list[int]:
    """The tensor sizes of a ``--workload`` file (bad files raise ValueError: exit 2)."""
    from autotune.cluster import load_workload

    work = load_workload(path)
    if not work.tensor_bytes:
        raise UsageError(f"--workload {path}: no tensor_bytes (the gradient tensors' sizes, "
                         "which allreduce_many fuses); add them, e.g. with "
                         "`python examples/train_digits.py --write-workload FILE`")
    return list(work.tensor_bytes)


def _check_cupy_here() -> None:
    """``--backend cupy`` where this process has no CuPy or GPU: one line, before any rank
    starts. Only outside mpiexec (the launching process): under mpiexec the ranks decide
    together in ``autotune.tuning.resolve_backend``, so no rank raises alone."""
    from ..launch import under_mpiexec

    if under_mpiexec():
        return
    from autotune.tuning import cupy_missing
    from collectives.cuda.detect import cupy_status

    ok, why = cupy_status()
    if not ok:
        raise UsageError(cupy_missing(why, " here"))


def plan_lines(opts: TuneOptions, ranks: int, engine: str,
               stop_pid: int | None = None) -> list[str]:
    """What a run will do, said before it starts: the ranks, the sizes, the budget, the two
    files it writes, and how to stop and resume it. ``stop_pid``: the process to signal
    (the launching ``ringtune``, which forwards to mpiexec and its ranks); ``None`` under
    the user's own launcher, which is then the one to signal."""
    from autotune.naming import default_storage
    from autotune.progress import size_text
    from autotune.storage_errors import sqlite_path

    sizes = (f"{size_text(opts.buckets[0])}" if len(opts.buckets) == 1 else
             f"{size_text(opts.buckets[0])} .. {size_text(opts.buckets[-1])}")
    storage = opts.storage or default_storage(opts.out)
    db = sqlite_path(storage)
    where = os.path.abspath(db) if db else storage
    stop = (f"Ctrl-C, or `kill {stop_pid}` (SIGTERM)" if stop_pid is not None else
            "Ctrl-C, or SIGTERM to the launcher (mpiexec, torchrun)")
    return [
        f"ringtune tune: {ranks} ranks over {engine}, {len(opts.buckets)} message size(s) "
        f"{sizes} ({opts.dtype} {opts.op}), up to {opts.trials} trials each, budget "
        f"{opts.budget_s:g} s, sampler {opts.sampler}",
        f"  writes the profile {os.path.abspath(opts.out)} at the end, and the trials as "
        f"they run to {where}",
        f"  stop: {stop}; finished trials are kept, and the same command resumes from "
        "them (--fresh starts over)",
    ]


def run(args: argparse.Namespace) -> int:
    from ..launch import relaunch, under_mpiexec

    opts = _options(args)
    engine = resolve_engine(args)
    shapes = bool(getattr(args, "shapes", None)) and not engine.tunes_shapes
    if shapes or (opts.backend == "cupy" and not engine.tunes_gpu):
        raise UsageError(f"{'--shapes' if shapes else '--backend cupy'} is not supported "
                         f"with --engine {engine.name} yet: tune under mpiexec for it, or "
                         "drop the flag")
    if (engine.self_launches and not under_mpiexec()
            and not os.environ.get("RINGTUNE_LAUNCHED")):
        from ..launch import default_ranks

        # Said here, before mpiexec and the ranks start (seconds on a loaded machine): a
        # bare `ringtune tune` runs for minutes and writes two files into this folder.
        print("\n".join(plan_lines(opts, args.np or default_ranks(), engine.name,
                                   stop_pid=os.getpid())), flush=True)
        return relaunch(getattr(args, "cli_argv", sys.argv[1:]), args.np, args.oversubscribe)

    from autotune.report import profile_heading, rule_table, write_report
    from autotune.tuning import TuneError, tune

    comm = engine_world(engine)
    rank = comm.Get_rank()
    if rank == 0 and not os.environ.get("RINGTUNE_LAUNCHED"):
        # Under the user's own mpiexec or torchrun (the launching process said it otherwise).
        print("\n".join(plan_lines(opts, comm.Get_size(), engine.name)), flush=True)
    try:
        if getattr(args, "shapes", None):
            from autotune.shapes import parse_shapes, tune_shapes

            result = tune_shapes(comm, opts, parse_shapes(args.shapes, comm.Get_size()))
        else:
            result = tune(comm, opts)
    except TuneError as exc:
        if exc.usage:
            raise UsageError(str(exc)) from None
        raise CommandFailed(str(exc)) from None
    if rank == 0:
        print()
        print(profile_heading(result.profile, result.path, added=result.added))
        print(rule_table(result.profile))
        done = "wrote" if result.rewritten else "unchanged (nothing new to measure):"
        print(f"{done} {result.path} in {result.seconds:.0f} s "
              f"(storage {result.profile['tuning']['storage']})")
        from autotune.machine import summary_line

        busy = summary_line(result.profile["tuning"].get("machine"), result.busy)
        if busy:
            print(busy, flush=True)
        if opts.report:
            paths = write_report(opts.report, result)
            print("report: " + ", ".join(paths))
    comm.Barrier()
    close_world(engine)
    return 0
