"""ringtune bench — an nccl-tests-style allreduce benchmark.

Times one algorithm (``--algo NAME --param K=V …``), the library's own allreduce
(``--algo native``) or what a profile picks per size (``--profile FILE``; without either,
the built-in defaults), from ``-b`` to ``-e`` bytes by factor ``-f``, with ``-w`` warm-up and
``-n`` timed iterations; ``-c 1`` checks every size (``#wrong``). Started without mpiexec it
launches itself on this machine's local ranks (``-np`` to choose how many).

  ringtune bench -b 4K -e 64M -f 4 --algo multiring --param rings=2 --param chunk_bytes=1M
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..engine import add_engine_argument, close_world, engine_world, resolve_engine
from ..errors import UsageError
from ..flags import (
    add,
    add_datatype,
    add_iters,
    add_op,
    add_ranks,
    add_size_range,
    add_stepfactor,
)
from ..launch import check_ranks, default_ranks, relaunch, under_mpiexec

HELP = "nccl-tests-style allreduce benchmark (one algorithm, native, or a profile)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add(p, "--algo", metavar="NAME", help="the one algorithm to time (default: what the "
        "profile, or the built-in defaults, pick per size)")
    p.add_argument("--param", metavar="K=V", action="append", default=[],
                   help="algorithm parameter, repeatable (e.g. rings=2 chunk_bytes=1M "
                   "order=identity)")
    p.add_argument("--profile", metavar="FILE", help="time the profile's choice per size")
    p.add_argument("--transport", metavar="NAME", help="transport (mpi | staged | nccl)")
    add_size_range(p, "8", "64M")
    add_stepfactor(p, 2.0)
    add(p, "-w", "--warmup_iters", type=int, default=5, metavar="N",
        help="warm-up iterations (default 5)")
    add_iters(p, 20)
    p.add_argument("--timing", default="per-iter", choices=("per-iter", "back-to-back"),
                   help="per-iter: median of the slowest rank's time per barrier-started "
                   "iteration (default); back-to-back: total time / iterations averaged "
                   "over ranks, as nccl-tests' all_reduce_perf reports")
    add(p, "-c", "--check", type=int, default=1, choices=(0, 1), metavar="0|1",
        help="check results (#wrong): 1 = yes (default), 0 = no")
    add_datatype(p)
    add_op(p)
    p.add_argument("-G", "--gpu", action="store_true",
                   help="benchmark GPU buffers (CuPy backend)")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="write the rows as JSON (to FILE, or stdout instead of the table)")
    add_ranks(p)
    add_engine_argument(p)


def parse_params(items: list[str]) -> dict[str, Any]:
    """``["rings=2", "chunk_bytes=1M", "order=[[0,1],[1,0]]"]`` → typed dict."""
    from collectives.bench import parse_size
    from safefiles.safeload import InputError, parse_text

    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--param {item!r}: expected KEY=VALUE, e.g. rings=2")
        if key.endswith("bytes"):
            try:
                out[key] = parse_size(text)
                continue
            except ValueError:
                pass
        try:
            # Bounded like every file (an alias bomb in a flag is no better than in one).
            out[key] = parse_text(text, f"--param {key}")
        except InputError as exc:
            if "not valid YAML" not in str(exc):
                raise
            out[key] = text
    return out


def _validate(args: argparse.Namespace) -> tuple[list[int], dict[str, Any]]:
    from collectives.bench import parse_size, size_list
    from collectives.ops import DTYPES, OPS

    if args.algo is None and args.param:
        raise UsageError("--param needs --algo NAME (the algorithm the parameters belong to)")
    if args.algo is not None and args.profile is not None:
        raise UsageError("give either --algo or --profile, not both")
    if args.datatype not in DTYPES + ("bfloat16",):
        raise UsageError(f"-d/--datatype {args.datatype}: use one of {', '.join(DTYPES)}")
    if args.op not in OPS:
        raise UsageError(f"-o/--op {args.op}: use one of {', '.join(OPS)}")
    check_ranks(args.np, args.oversubscribe)
    if args.iters < 1 or args.warmup_iters < 0:
        raise UsageError("-n must be ≥ 1 and -w ≥ 0")
    # A bad size raises ValueError, which the CLI reports as bad input (exit 2).
    sizes = size_list(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    return sizes, parse_params(args.param)


def _check_algorithm(name: str | None, params: dict[str, Any], world_size: int) -> dict[str, Any]:
    """``params`` validated for algorithm ``name`` on ``world_size`` ranks (unchanged when no
    algorithm is named); ``ValueError`` naming the parameter otherwise."""
    if name is None:
        return params
    from collectives.algorithms import get_algorithm

    return get_algorithm(name).check_params(params, world_size)


def run(args: argparse.Namespace) -> int:
    # Validate before launching or communicating: bad flags fail fast, once, with exit 2.
    sizes, params = _validate(args)
    engine = resolve_engine(args)
    if engine.self_launches and not under_mpiexec() and (args.np is None or args.np > 1):
        ranks = args.np or default_ranks()
        _check_algorithm(args.algo, params, ranks)  # fail once, here, before launching
        return relaunch(getattr(args, "cli_argv", sys.argv[1:]), ranks, args.oversubscribe)
    from collectives import Communicator
    from collectives.bench import (
        TIMINGS,
        avg_busbw,
        format_header,
        format_row,
        rows_to_json,
        run_bench,
    )

    world = engine_world(engine, gpu=args.gpu)
    comm = Communicator(world, profile=args.profile)
    rank0 = comm.rank == 0
    to_stdout_json = args.json == "-"
    backend = "cupy" if args.gpu else "numpy"
    params = _check_algorithm(args.algo, params, comm.size)
    # What actually runs: a profile from --profile or $RINGTUNE_PROFILE, or the defaults
    # (and why, when a profile was set aside for another topology).
    prof = comm.profile
    what = (f"algorithm {args.algo}" if args.algo else
            f"profile {prof.path}" if not prof.builtin else
            f"built-in defaults ({comm.set_aside})" if comm.set_aside else "built-in defaults")
    if args.transport:
        moved_by = args.transport
    elif args.algo or backend == "numpy":
        from collectives.registry import get_backend

        moved_by = comm.default_transport(get_backend(backend))
    else:
        moved_by = "per profile rule"
    if rank0 and not to_stdout_json:
        on = comm.engine.describe(comm.comm)
        print(f"# ringtune bench: {comm.size} ranks on {len(set(comm.hosts))} host(s), "
              f"engine {on['engine']} ({on['backend']}), "
              f"{what}, {args.datatype} {args.op}, backend {backend}, transport {moved_by}, "
              f"warmup {args.warmup_iters}, iters {args.iters}, check {args.check}")
        print(f"# time: {args.timing}, {TIMINGS[args.timing]}")
        print("#")
        print("#" + format_header()[1:])
        sys.stdout.flush()

    def show(m: Any) -> None:
        if rank0 and not to_stdout_json:
            print(format_row(m), flush=True)

    rows = run_bench(comm, sizes, args.datatype, args.op, args.algo, params,
                     args.warmup_iters, args.iters, bool(args.check), args.transport, backend,
                     on_row=show, timing=args.timing)
    wrong = sum(m.wrong or 0 for m in rows)
    if rank0:
        if args.json:
            meta = {"ranks": comm.size, "hosts": len(set(comm.hosts)), "what": what,
                    "engine": comm.engine.describe(comm.comm)["engine"],
                    "dtype": args.datatype, "op": args.op, "backend": backend,
                    "timing": args.timing}
            text = rows_to_json(rows, meta)
            if to_stdout_json:
                print(text)
            else:
                from collectives.plumbing.atomic import write_text_atomic

                write_text_atomic(args.json, text + "\n")
        if not to_stdout_json:
            print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
            print(f"# Avg bus bandwidth    : {avg_busbw(rows):.4f}")
    comm.close()
    close_world(engine)
    return 1 if wrong else 0
