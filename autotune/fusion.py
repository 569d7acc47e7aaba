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

``tuned_fusion`` is what a tuning run calls: the search's result is recorded in the storage
(user attribute ``fusion_choice`` of the first bucket's study) with what it was searched
from, and a rerun of a finished tune with the same arguments reuses it, so it writes the
same profile, byte for byte, as the plain rerun does (``autotune.replay``); another
workload, dtype, budget or other tuned rules search again.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
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
                # The slowest rank's time (an allgather: every engine's communicator
                # object has one).
                times[s].append(max(comm.allgather(time.perf_counter() - t0)))
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


#: The study user attribute that holds the recorded bucket-size search.
FUSION_ATTR = "fusion_choice"


def fusion_inputs(profile: dict[str, Any], tensor_bytes: Sequence[int], dtype: str,
                  budget_s: float) -> dict[str, Any]:
    """Everything the bucket-size search depends on except the timings (JSON-plain): the
    tuned rules it runs under, the tensors, the dtype and its time budget."""
    return {"rules": profile["rules"], "tensor_bytes": [int(b) for b in tensor_bytes],
            "dtype": dtype, "budget_s": float(budget_s)}


def reuse(record: Any, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The recorded ``fusion`` record when it was searched from exactly ``inputs``."""
    if not isinstance(record, dict) or record.get("inputs") != inputs:
        return None
    fusion = record.get("fusion")
    if not isinstance(fusion, dict) or not isinstance(fusion.get("bucket_bytes"), int):
        return None  # a record this version cannot read: search again
    return fusion


def tuned_fusion(comm: Any, storage: Any, study: str, profile: dict[str, Any],
                 tensor_bytes: Sequence[int], dtype: str, budget_s: float,
                 say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """The profile's ``fusion`` record (collective over ``comm``): the one recorded in
    ``study`` when it was searched from the same inputs, else searched now under
    ``profile``'s rules (rank 0's profile is used on every rank) and recorded. ``say``:
    the progress line."""
    from collectives.profile import profile_from_dict

    from .lockstep import on_root

    # Rank 0's profile: each rank stamped its own ``created`` time.
    tuned = comm.bcast(profile if comm.Get_rank() == 0 else None, root=0)
    inputs = fusion_inputs(tuned, tensor_bytes, dtype, budget_s)

    def load() -> Any:
        study_id = storage.get_study_id_from_name(study)
        return storage.get_study_user_attrs(study_id).get(FUSION_ATTR)

    found = reuse(on_root(comm, load), inputs)
    if found is not None:
        say("allreduce_many's bucket size is recorded in the storage: reused")
        return found
    say("searching allreduce_many's bucket size on the workload's tensors")
    fusion = search_bucket_bytes(comm, profile_from_dict(tuned, "<tuned profile>",
                                                         world_size=comm.Get_size()),
                                 list(tensor_bytes), dtype, budget_s=budget_s)
    # Every rank writes rank 0's result (the medians are of the slowest rank anyway).
    fusion = comm.bcast(fusion, root=0)

    def save() -> None:
        storage.set_study_user_attr(storage.get_study_id_from_name(study), FUSION_ATTR,
                                    {"inputs": inputs, "fusion": fusion})

    on_root(comm, save)
    return fusion
