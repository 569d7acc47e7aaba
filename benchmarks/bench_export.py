"""The exported MPICH file vs the best native candidate ringtune measured, per bucket.

Run a plain ``MPI_Allreduce`` under the exported selection file, and, in the same run and
interleaved round by round, the same call with the profile's chosen MPICH algorithm forced
through MPI_T (``collectives.natives.mpich``: what ringtune's ``native impl=X`` candidate ran)::

    .venv/bin/ringtune export PROFILE --format mpich --out build/tuning.json
    MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE=build/tuning.json \\
        .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/bench_export.py PROFILE

For every bucket of the profile's native rules it prints busbw (GB/s, median over rounds of
per-round medians, slowest rank) of both and their ratio (target >= 0.95), and whether the
file's result is bitwise the forced algorithm's (a check, at 3+ ranks, that the file selected
it). A benchmark, not a test: a noisy machine moves both columns.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

from collectives.natives import library, mpich
from collectives.profile import load_profile

comm = MPI.COMM_WORLD


def once(buf: np.ndarray, iters: int) -> float:
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        comm.Allreduce(MPI.IN_PLACE, buf)
    return comm.allreduce((time.perf_counter() - t) / iters, op=MPI.MAX)


def digest(nbytes: int, impl: str | None) -> str:
    rng = np.random.default_rng(comm.rank + 1)
    count = nbytes // 4
    buf = (rng.standard_normal(count) * 10.0 ** rng.integers(-4, 4, count)).astype(np.float32)
    if impl is None:
        comm.Allreduce(MPI.IN_PLACE, buf)
    else:
        with mpich.selected(impl):
            comm.Allreduce(MPI.IN_PLACE, buf)
    return hashlib.sha256(buf.tobytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    prof = load_profile(args.profile, world_size=comm.Get_size())
    n = comm.Get_size()
    factor = 2 * (n - 1) / n
    buckets = list(prof.tuning.get("buckets") or [])
    if comm.rank == 0:
        print(f"# {n} ranks, {' '.join(library())}, file "
              f"{os.environ.get('MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE') or '(none)'}")
        print("size  impl  file_busbw  forced_busbw  ratio  same_result")
    for nbytes in buckets:
        _, rule = prof.select(nbytes)
        impl = str(rule.params.get("impl", "auto")) if rule.algorithm == "native" else None
        if impl is None:
            continue
        buf = np.ones(nbytes // 4, np.float32)
        iters = max(1, min(50, int(2e7 // max(nbytes, 1))))
        sel = mpich.Selector(impl) if impl != "auto" else None
        once(buf, 1)
        t_file, t_forced = [], []
        for _ in range(args.rounds):
            t_file.append(once(buf, iters))
            if sel:
                sel.enter()
            t_forced.append(once(buf, iters))
            if sel:
                sel.exit()
        same = digest(nbytes, None) == digest(nbytes, impl if impl != "auto" else None)
        bf = nbytes / statistics.median(t_file) / 1e9 * factor
        bx = nbytes / statistics.median(t_forced) / 1e9 * factor
        if comm.rank == 0:
            print(f"{nbytes}  {impl}  {bf:.3f}  {bx:.3f}  {bf / bx:.3f}  {same}")


if __name__ == "__main__":
    main()
