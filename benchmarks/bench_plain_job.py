"""A plain job's ``MPI_Allreduce``, with and without ringtune's exported tuning file.

The job never imports ringtune: it is mpi4py's ``Allreduce`` on float32 buffers, timed per
size (median of ``--iters`` calls after warm-up, the slowest rank's). ``compare`` starts it
``--rounds`` times without the file, with it, and without it again (the A/A control: the
ratio two identical jobs show here is the noise a with/without ratio must exceed), the
order rotated each round, under the library mpi4py loads, and prints one Markdown table:
busbw (GB/s, the median over rounds) without and with the file, their ratio, and the
control's::

    .venv/bin/ringtune export PROFILE --out build/tuning.json     # the profile's library
    .venv/bin/python benchmarks/bench_plain_job.py compare --file build/tuning.json -np 2
    .venv-ompi/bin/python benchmarks/bench_plain_job.py compare --file build/rules.txt -np 2

MPICH reads the file through ``MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE``, Open MPI
through ``coll_tuned_use_dynamic_rules``/``coll_tuned_dynamic_rules_filename``. A benchmark,
not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

SIZES = [64 << 10 << (2 * i) for i in range(6)]  # 64 KiB .. 64 MiB, x4


def job(iters: int) -> None:
    """One plain job: rank 0 prints ``{size: seconds}`` as one JSON line."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = {}
    for size in SIZES:
        a = np.ones(size // 4, np.float32)
        b = np.empty_like(a)
        n = max(3, min(iters, (256 << 20) // size))
        for _ in range(2):
            comm.Allreduce(a, b)
        times = []
        for _ in range(n):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(a, b)
            times.append(time.perf_counter() - t0)
        if not np.all(b == comm.size):
            raise SystemExit(f"wrong result at {size} bytes")
        out[size] = comm.allreduce(statistics.median(times), op=MPI.MAX)
    if comm.rank == 0:
        print(json.dumps(out), flush=True)


def _library_env(path: str) -> dict[str, str]:
    from mpi4py import MPI

    version = MPI.Get_library_version()
    if "Open MPI" in version:
        return {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                "OMPI_MCA_coll_tuned_dynamic_rules_filename": path,
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return {"MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE": path}


def compare(args: argparse.Namespace) -> None:
    path = os.path.abspath(args.file)
    if not os.path.isfile(path):
        raise SystemExit(f"bench_plain_job: {args.file}: no such file (ringtune export writes it)")
    with_file = _library_env(path)
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = mpiexec if os.path.exists(mpiexec) else (shutil.which("mpiexec") or "mpiexec")
    argv = [mpiexec, *(["--oversubscribe"] if "OMPI_MCA_coll_tuned_use_dynamic_rules" in
                      with_file else []), "-n", str(args.np), sys.executable, __file__, "job",
            "--iters", str(args.iters)]
    # Three arms per round: without the file, with it, and without it again (the A/A
    # control: how far two identical jobs differ here, the noise a ratio must exceed). The
    # order rotates each round so that a drift of the machine favours no arm.
    arms = ("without", "with", "control")
    runs: dict[str, list[dict[int, float]]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for arm in arms[r % 3:] + arms[:r % 3]:
            env = dict(os.environ)
            if arm == "with":
                env.update(with_file)
            elif "OMPI_ALLOW_RUN_AS_ROOT" in with_file:
                env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
            if res.returncode != 0:
                raise SystemExit(f"bench_plain_job: the job failed ({res.returncode}): "
                                 f"{res.stderr.strip()[-500:]}")
            line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1]
            runs[arm].append({int(k): v for k, v in json.loads(line).items()})
            print(f"round {r + 1}/{args.rounds}: {arm}", file=sys.stderr, flush=True)
    factor = 2 * (args.np - 1) / args.np
    print(f"| size | without the file (GB/s) | with {os.path.basename(path)} (GB/s) | "
          "with / without | A/A control: without / without |")
    print("|---|---|---|---|---|")
    for size in SIZES:
        t0, t1, tc = (statistics.median(x[size] for x in runs[a]) for a in arms)
        bw0, bw1 = factor * size / t0 / 1e9, factor * size / t1 / 1e9
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        print(f"| {label} | {bw0:.3f} | {bw1:.3f} | {t0 / t1:.2f}x | {t0 / tc:.2f}x |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    j = sub.add_parser("job")
    j.add_argument("--iters", type=int, default=20)
    c = sub.add_parser("compare")
    c.add_argument("--file", required=True)
    c.add_argument("-np", "--np", type=int, default=2)
    c.add_argument("--rounds", type=int, default=5)
    c.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    job(args.iters) if args.cmd == "job" else compare(args)


if __name__ == "__main__":
    main()
