"""How long loading the largest profile ringtune accepts takes, and refusing a larger one.

    .venv/bin/python benchmarks/bench_load.py [--rules N] [--runs 2] [--keep FILE]

Writes a profile of ``--rules`` rules (default ``MAX_RULES``, the cap) with
``dump_profile`` (the example profile's header, alternating native / multiring rules, each
with a ``measured`` record, as ``ringtune tune`` writes them) and times, run by run,
process CPU time of ``load_profile``, ``load + sha256`` and their parts (``reader``:
``parse_text``; ``validation``: ``profile_from_dict``; ``sha256``), then the refusal of a
10⁵-rule file (issue 14 once asked 10⁵ rules in < 2 s; issue 25 caps a profile at
``MAX_RULES`` rules and ``MAX_PROFILE_BYTES`` bytes instead: real profiles have a handful).

Medians of ``--runs``. ``Communicator`` construction per rank on the same file:
``mpiexec -n 2 python benchmarks/bench_load.py --communicator FILE``.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

EXAMPLE = HERE / "profiles" / "examples" / "cpu-2core-vm-2ranks.yaml"


def write_big(path: str, n: int) -> None:
    """``n`` rules; over ``MAX_RULES`` the text is written unvalidated (to be refused)."""
    import yaml

    from collectives.profile import MAX_RULES, write_profile
    from safefiles.safeload import load_file

    base = load_file(EXAMPLE, "profile")
    rules: list[dict[str, Any]] = []
    step = 1 << 10
    for i in range(n):
        lo = i * step
        rule: dict[str, Any] = {"min_bytes": lo, "max_bytes": None if i == n - 1 else
                                lo + step - 1}
        if i % 2 == 0:
            rule.update(algorithm="native", params={})
        else:
            rule.update(algorithm="multiring",
                        params={"rings": 2, "chunk_bytes": 16384, "order": "topology"})
        rule["measured"] = {"bytes": lo + 512, "busbw_gbps": 2.1882 + i % 7,
                            "time_us": 1916.82 + i % 13, "native_busbw_gbps": 2.1882,
                            "native_time_us": 1916.82, "speedup": 1.0}
        rules.append(rule)
    base["rules"] = rules
    if n <= MAX_RULES:
        write_profile(base, path)
    else:
        Path(path).write_text(yaml.safe_dump(base, sort_keys=False))


def _cpu(fn: Any) -> float:
    gc.collect()
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def bench(path: str, runs: int) -> dict[str, float]:
    import collectives.algorithms  # noqa: F401 - imported outside the timed part
    from collectives.profile import load_profile

    out: dict[str, list[float]] = {k: [] for k in ("load_profile", "load + sha256", "reader",
                                                   "validation", "sha256")}
    for _ in range(runs):
        out["load_profile"].append(_cpu(lambda: load_profile(path).source_digest))
        out["load + sha256"].append(_cpu(lambda: load_profile(path).sha256))
        for key, seconds in _parts(path).items():
            out[key].append(seconds)
    return {k: statistics.median(v) for k, v in out.items()}


def _parts(path: str) -> dict[str, float]:
    """CPU seconds of the parts of ``load_profile`` + ``sha256``."""
    from collectives.profile import profile_from_dict
    from safefiles.safeload import parse_text, read_bounded

    gc.collect()
    t0 = time.process_time()
    data = parse_text(read_bounded(path), path)
    t1 = time.process_time()
    prof = profile_from_dict(data, path, copy=False)
    t2 = time.process_time()
    assert len(prof.sha256) == 64
    t3 = time.process_time()
    return {"reader": t1 - t0, "validation": t2 - t1, "sha256": t3 - t2}


def communicator(path: str) -> None:
    t0, w0 = time.process_time(), time.perf_counter()
    import numpy as np
    from mpi4py import MPI

    from collectives import Communicator

    comm = Communicator(MPI.COMM_WORLD, profile=path)
    comm.allreduce(np.ones(1 << 12, np.float32))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
    print(f"rank {comm.rank}: Communicator over {len(comm.profile.rules)} rules: CPU "
          f"{time.process_time() - t0:.2f} s, wall {time.perf_counter() - w0:.2f} s, "
          f"peak RSS {rss} MB\n", end="", flush=True)
    comm.close()


def _refusals(path: str, runs: int) -> tuple[float, str]:
    """Median CPU seconds of refusing ``path``, and the message."""
    from collectives.profile import ProfileError, load_profile

    spent, message = [], ""
    for _ in range(runs):
        t0 = time.process_time()
        try:
            load_profile(path)
        except ProfileError as exc:
            spent.append(time.process_time() - t0)
            message = str(exc)
        else:
            raise SystemExit(f"{path}: accepted; expected a refusal")
    return statistics.median(spent), message


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from collectives.profile import MAX_RULES

    ap.add_argument("--rules", type=int, default=MAX_RULES)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--keep", help="write the profile here (and keep it)")
    ap.add_argument("--communicator", metavar="FILE",
                    help="time Communicator construction on FILE (run under mpiexec)")
    args = ap.parse_args()
    if args.communicator:
        communicator(args.communicator)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or str(Path(tmp) / "big.yaml")
        write_big(path, args.rules)
        size = Path(path).stat().st_size
        res = bench(path, args.runs)
        huge = str(Path(tmp) / "huge.yaml")
        write_big(huge, 100_000)
        huge_mb = Path(huge).stat().st_size / 1e6
        refused, message = _refusals(huge, args.runs)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.rules} rules, {size / 1e6:.1f} MB, CPU s (median of {args.runs}; load "
          f"average {load}):")
    for k, v in res.items():
        print(f"  {k:13s} {v:6.2f}")
    print(f"10⁵ rules ({huge_mb:.1f} MB) refused in {refused:.3f} s CPU: {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
