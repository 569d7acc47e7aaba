"""How long loading a very large profile takes: 10⁵ rules (issue 14: target < 2 s).

    .venv/bin/python benchmarks/bench_load.py [--rules 100000] [--runs 2] [--keep FILE]

Writes a profile of ``--rules`` rules with ``dump_profile`` (the example profile's header,
alternating native / multiring rules, each with a ``measured`` record, as ``ringtune tune``
writes them) and times, interleaved run by run (a shared machine's drift hits both alike),
process CPU time of:

- ``event reader``: ``parse_text(fast=False)`` (libyaml's event stream, every value built
  with the bounds) + ``profile_from_dict`` + ``sha256`` — what loading cost before the
  table reader;
- ``load_profile``: ``load_profile`` alone (table reader, validation, the file's byte
  digest ``source_digest``): what a rank pays, since ranks agree on the byte digest and
  compute the content hash only when their copies differ byte for byte;
- ``load + sha256``: ``load_profile`` + the content hash ``Profile.sha256`` (what every
  rank paid before the byte digest);
- its parts: ``reader`` (``parse_text``: the table reader and the event reader for the
  rest), ``validation`` (``profile_from_dict``, the collector paused as ``load_profile``
  pauses it) and ``sha256`` (``Profile.sha256``).

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
    from collectives.profile import write_profile
    from probes.safeload import load_file

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
    write_profile(base, path)


def _cpu(fn: Any) -> float:
    gc.collect()
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def bench(path: str, runs: int) -> dict[str, float]:
    import collectives.algorithms  # noqa: F401 - imported outside the timed part
    from collectives.profile import load_profile, profile_from_dict
    from probes.safeload import parse_text, read_bounded

    out: dict[str, list[float]] = {k: [] for k in ("event reader", "load_profile",
                                                   "load + sha256", "reader", "validation",
                                                   "sha256")}
    for _ in range(runs):
        out["event reader"].append(_cpu(lambda: profile_from_dict(
            parse_text(read_bounded(path), path, fast=False), path, copy=False).sha256))
        out["load_profile"].append(_cpu(lambda: load_profile(path).source_digest))
        out["load + sha256"].append(_cpu(lambda: load_profile(path).sha256))
        for key, seconds in _parts(path).items():
            out[key].append(seconds)
    return {k: statistics.median(v) for k, v in out.items()}


def _parts(path: str) -> dict[str, float]:
    """CPU seconds of the parts of ``load_profile`` + ``sha256``, each with the collector
    as ``load_profile`` leaves it (paused while reading and validating)."""
    from collectives.profile import profile_from_dict
    from probes.safeload import parse_text, read_bounded

    gc.collect()
    t0 = time.process_time()
    data = parse_text(read_bounded(path), path)
    t1 = time.process_time()
    gc.disable()
    try:
        prof = profile_from_dict(data, path, copy=False)
    finally:
        gc.enable()
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", type=int, default=100_000)
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
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.rules} rules, {size / 1e6:.1f} MB, CPU s (median of {args.runs}; load "
          f"average {load}):")
    for k, v in res.items():
        print(f"  {k:13s} {v:6.2f}")
    print(f"  ratio        {res['event reader'] / res['load + sha256']:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
