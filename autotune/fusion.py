"""Search of ``allreduce_many``'s bucket size (``fusion.bucket_bytes`` of a profile).

Use ``search_bucket_bytes(comm, profile, tensor_bytes, dtype, budget_s)`` at the end of a
tuning run (``ringtune tune --workload FILE`` with ``tensor_bytes`` in the file): it times
``allreduce_many`` of buffers of those sizes under the freshly tuned rules, for bucket sizes
from 4 KiB by ×4 up to the whole gradient, and returns the fastest. The best fusion size
depends on the same latency and bandwidth figures as the algorithm choice (small buckets pay
one latency each, large ones delay the first reduction and copy more), so it is measured
where the rules were.

Candidates are interleaved round by round (drift of a shared machine hits all alike); a
round's time is the slowest rank's; the median over rounds decides.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from collectives.ops import itemsize

#: Smallest bucket size tried (below it every tensor is its own message anyway).
MIN_BUCKET_BYTES = 4 << 10


def candidates(total_bytes: int) -> list[int]:
    """Bucket sizes tried: 4 KiB by ×4 up to the first size holding the whole gradient."""
    out = [MIN_BUCKET_BYTES]
    while out[-1] < total_bytes:
        out.append(out[-1] * 4)
    return out


def search_bucket_bytes(comm: Any, profile: Any, tensor_bytes: list[int], dtype: str,
                        budget_s: float = 30.0, rounds: int = 7) -> dict[str, Any]:
    """The ``fusion`` record of the profile: ``{bucket_bytes, measured}`` (collective over
    the mpi4py communicator ``comm``)."""
    from mpi4py import MPI

    from collectives import Communicator

    runtime = Communicator(comm, profile=profile)
    item = itemsize(dtype)
    bufs = [np.ones(max(1, b // item), dtype=dtype) for b in tensor_bytes]
    total = sum(int(b.nbytes) for b in bufs)
    sizes = candidates(total)
    times: dict[int, list[float]] = {s: [] for s in sizes}
    try:
        for s in sizes:  # warm-up: plans and staging built outside the timed rounds
            runtime.allreduce_many(bufs, bucket_bytes=s)
        start = time.monotonic()
        for r in range(rounds):
            for s in sizes:
                comm.Barrier()
                t0 = time.perf_counter()
                runtime.allreduce_many(bufs, bucket_bytes=s)
                times[s].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
            # Every rank decides alike: rank 0's clock.
            over = comm.bcast(time.monotonic() - start > budget_s and r >= 2, root=0)
            if over:
                break
    finally:
        runtime.close()
    med = {s: statistics.median(v) for s, v in times.items()}
    best = min(sizes, key=lambda s: (med[s], s))
    return {"bucket_bytes": int(best),
            "measured": {"tensors": len(bufs), "gradient_bytes": total, "dtype": dtype,
                         "time_us": {str(s): round(med[s] * 1e6, 1) for s in sizes}}}
