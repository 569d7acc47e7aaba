"""What a tuning run's studies are keyed by: the world's identity (topology fingerprint),
the size buckets, each bucket's study name and the default Optuna storage.

Use these to find or name the stored studies of a run (``ringtune tune`` resumes a study
only when its name, derived from the fingerprint, matches), to pick default buckets, or to
get the profile's ``topology`` record (``world_identity`` is collective: call it on every
rank).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any


def default_storage(out: str) -> str:
    """``sqlite:///<profile dir>/<profile stem>.db``."""
    path = os.path.abspath(out)
    stem = os.path.splitext(os.path.basename(path))[0]
    return "sqlite:///" + os.path.join(os.path.dirname(path), stem + ".db")


def power_of_4_buckets(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of 4 from ``min_bytes`` (rounded up to one) to ``max_bytes``."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"-b/--minbytes ({min_bytes}) must be ≥ 1 and ≤ -e/--maxbytes "
                         f"({max_bytes})")
    b = 1
    while b < min_bytes:
        b *= 4
    out = []
    while b <= max_bytes:
        out.append(b)
        b *= 4
    if not out:
        raise ValueError(f"no power of 4 between -b/--minbytes {min_bytes} and -e/--maxbytes "
                         f"{max_bytes}; widen the range or give --buckets")
    return out


def world_identity(comm: Any) -> dict[str, Any]:
    """The ``topology`` record of the profile: fingerprint, world size, hosts, ranks per
    host and a summary. Uses ``probes`` when present; otherwise a fingerprint from the world
    size and the rank → host layout (collective)."""
    from collectives.engines import engine_for

    names = comm.allgather(engine_for(comm).host_name(comm))
    n = len(names)
    hosts = len(set(names))
    per_host = max(names.count(h) for h in set(names))
    fingerprint = summary = None
    try:
        import probes
    except ImportError:
        probes = None  # type: ignore[assignment]
    if probes is not None and hasattr(probes, "world_fingerprint"):
        # The same fingerprint the runtime computes when it loads the profile
        # (Communicator._check_fingerprint); a probe error (a bad $RINGTUNE_TOPOLOGY file)
        # is raised identically on every rank by the probes themselves.
        topo = probes.detect(comm) if hasattr(probes, "detect") else None
        fingerprint = probes.world_fingerprint(comm, topo)
        summ = getattr(topo, "summary", None)
        summary = summ() if callable(summ) else None
    # Every rank must use the same fingerprint (study names); rank 0's decides.
    fingerprint = comm.bcast(fingerprint, root=0)
    summary = comm.bcast(summary, root=0)
    if not fingerprint:
        layout = [sorted(set(names)).index(h) for h in names]
        shape = json.dumps({"world_size": n, "hosts": hosts, "ranks_per_host": per_host,
                            "layout": [layout.count(i) for i in range(hosts)]})
        fingerprint = "sha256:" + hashlib.sha256(shape.encode()).hexdigest()
    if isinstance(fingerprint, str) and not fingerprint.startswith("sha256:"):
        fingerprint = "sha256:" + fingerprint
    if not summary:
        summary = f"{hosts} host{'s' if hosts > 1 else ''} x {per_host} ranks, cpu, " + (
            "shm" if hosts == 1 else "network")
    return {"fingerprint": fingerprint, "world_size": n, "hosts": hosts,
            "ranks_per_host": per_host, "summary": " ".join(str(summary).split())[:200]}


def study_name(prefix: str | None, fingerprint: str, dtype: str, op: str,
               nbytes: int, backend: str = "numpy",
               transports: list[str] | None = None) -> str:
    """One study per bucket, named from the fingerprint (``--study`` replaces the prefix).

    GPU studies (``backend`` ``cupy``) carry the backend and the transports searched in
    the prefix (``<prefix>-cupy.nccl.staged-…``), so host and GPU trials never mix in one
    study and a study is resumed only with the same ``transport`` choices (Optuna refuses
    a categorical whose choices change)."""
    head = prefix or "ringtune-" + fingerprint.split(":", 1)[-1][:16]
    if backend != "numpy":
        head += "-" + ".".join([backend, *(transports or [])])
    return f"{head}-{dtype}-{op}-{nbytes}B"
