"""Remove the shared-memory segments that killed MPI jobs of a test run left in /dev/shm.

MPICH (``mpich_shm_*``) and Open MPI (``sm_segment.*``) remove their segments when a job
ends normally, not when a rank is killed or the job aborts — which many tests do on purpose.
``make test`` runs this at its end (whatever the outcome)::

    python tests/shm_leftovers.py --since EPOCH_SECONDS

A segment is removed only when it was created during the run (``--since``), is older than
``MIN_AGE_S`` (a job still setting up has had its peers attach by then) and no live
process maps it (``/proc/*/maps``): a concurrent job's segments are left alone. ringtune's
own segments never need this: they are unlinked as soon as every rank has mapped them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

SHM = Path("/dev/shm")
#: MPICH's segments, and Open MPI's btl/sm backing files (``sm_segment.HOST.UID.JOB.RANK``).
PREFIXES = ("mpich_shm_", "sm_segment.")
#: Seconds a segment must have existed before it may be judged left behind.
MIN_AGE_S = 60.0


def mapped() -> set[str]:
    """Paths under /dev/shm that some live process maps."""
    out: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if "/dev/shm/" in line:
                        out.add(line.split("/dev/shm/", 1)[1].split(" (deleted)")[0].strip())
        except OSError:
            continue  # gone, or not ours to read
    return out


def leftovers(since: float, now: float | None = None) -> list[Path]:
    """Segments created at or after ``since`` that are old enough and mapped by nobody."""
    now = time.time() if now is None else now
    if not SHM.is_dir():
        return []
    candidates = []
    for entry in SHM.iterdir():
        if not entry.name.startswith(PREFIXES):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_ctime >= since and now - st.st_mtime >= MIN_AGE_S:
            candidates.append(entry)
    busy = mapped() if candidates else set()
    return [p for p in candidates if p.name not in busy]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--since", type=float, required=True, help="the run's start (epoch s)")
    args = ap.parse_args()
    removed = 0
    for path in leftovers(args.since):
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    if removed:
        print(f"shm_leftovers: removed {removed} segment(s) killed MPI jobs left in {SHM}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
