"""Fused allreduce of many buffers (Horovod's tensor fusion, GeePS's batched access).

Use ``Communicator.allreduce_many(buffers)`` for a model's gradients outside DDP: many small
allreduces cost one latency each, so small buffers are packed into flat buckets of
``bucket_bytes`` and each bucket is reduced once. ``bucket_bytes=None`` takes the profile's
tuned size (``fusion.bucket_bytes``, searched by ``ringtune tune --workload``), else
``DEFAULT_BUCKET_BYTES``.

Packing: buffers are taken in the order given, grouped by backend and dtype; consecutive
ones are copied into a bucket while it has room; a buffer of ``bucket_bytes`` or more is
reduced in place on its own (no copy). Two staging buckets alternate: while the
communication thread (``collectives.training.exchange``) reduces one, the calling thread
unpacks the previous one and packs the next.

Exactness: each element is reduced exactly as a per-buffer ``allreduce`` reduces it
whenever the reduction of an element does not depend on its position in the message:
always for integers and min/max/prod of exact values, and for floating sums whenever the
partial sums are exact. A floating sum of inexact values at three or more ranks may differ
in the last bit, since ring algorithms start each chunk's sum at a different rank (true of
every fused allreduce: Horovod's, DDP's buckets).

GPU buffers: a bucket is capped at an eighth of the device's free memory, and a buffer
bigger than the bucket is reduced window by window (contiguous views, no copies), so the
scratch of the algorithm and the ``staged`` transport's pinned pieces stay bounded: a
gradient set larger than free device memory is exchanged chunk by chunk.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from ..backend import Backend
from ..registry import backend_for
from ..tensors import as_buffer

#: Bucket size without a tuned profile: DDP's default bucket (bucket_cap_mb=25).
DEFAULT_BUCKET_BYTES = 25 << 20

#: One GPU bucket takes at most 1/8 of free device memory: the two staging buckets and
#: the plans' scratch for the few bucket sizes of a gradient set then fit.
GPU_FREE_FRACTION = 8

#: Staging buckets per (communicator, backend, dtype, size), reused across calls.
_STAGING: weakref.WeakKeyDictionary[Any, dict[tuple[str, str, int], list[Any]]] = (
    weakref.WeakKeyDictionary())


def resolve_bucket_bytes(comm: Any, bucket_bytes: int | None) -> int:
    """``bucket_bytes`` checked, or the profile's tuned size, or the default."""
    if bucket_bytes is None:
        tuned = getattr(comm.profile, "fusion_bucket_bytes", None)
        return int(tuned) if tuned else DEFAULT_BUCKET_BYTES
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"rank {comm.rank}: bucket_bytes must be a positive integer (bytes), "
                         f"got {bucket_bytes!r}; pass None for the profile's tuned size")
    return bucket_bytes


def _gpu_cap(backend: Backend, nbytes: int) -> int:
    free = getattr(backend, "free_bytes", None)
    if free is None:
        return nbytes
    return max(1 << 12, min(nbytes, int(free()) // GPU_FREE_FRACTION))


class _Job:
    """One reduction: a packed bucket (``members`` copied in and out of ``stage``), or a
    buffer reduced in place (``members`` empty)."""

    __slots__ = ("target", "members", "stage", "future")

    def __init__(self, target: Any, members: list[tuple[Any, int, int]], stage: int) -> None:
        self.target = target
        self.members = members
        self.stage = stage
        self.future: Future[Any] | None = None


def _plan_group(flats: list[Any], cap_elems: int,
                window: bool) -> list[tuple[Any, list[tuple[Any, int, int]]]]:
    """Jobs of one (backend, dtype) group: (in-place buffer, []) or (None, members) with
    members (flat, offset, count) packed at ``offset`` of a bucket. With ``window``, a
    buffer bigger than the bucket is reduced in bucket-sized views."""
    jobs: list[tuple[Any, list[tuple[Any, int, int]]]] = []
    cur: list[tuple[Any, int, int]] = []
    used = 0
    for f in flats:
        n = int(f.size)
        if n == 0:
            continue
        if n >= cap_elems:
            if cur:
                jobs.append((None, cur))
                cur, used = [], 0
            if window and n > cap_elems:
                jobs.extend((f[lo:lo + cap_elems], []) for lo in range(0, n, cap_elems))
            else:
                jobs.append((f, []))
            continue
        if used + n > cap_elems:
            jobs.append((None, cur))
            cur, used = [], 0
        cur.append((f, used, n))
        used += n
    if cur:
        jobs.append((None, cur))
    return jobs


def allreduce_many(comm: Any, buffers: Sequence[Any], op: str = "sum",
                   bucket_bytes: int | None = None) -> list[Any]:
    """Allreduce every buffer of ``buffers`` in place; returns them (see the module
    docstring). Collective: every rank passes the same sizes and dtypes in the same order."""
    from .exchange import ExchangeError, exchanger_for

    if isinstance(buffers, (str, bytes)) or not isinstance(buffers, Sequence):
        raise TypeError(f"rank {comm.rank}: allreduce_many takes a list of arrays or tensors, "
                        f"got {type(buffers).__name__}")
    cap_bytes = resolve_bucket_bytes(comm, bucket_bytes)
    groups: dict[tuple[str, str], tuple[Backend, list[Any]]] = {}
    for buf in buffers:
        arr = as_buffer(buf)
        backend = backend_for(arr)
        flat = backend.as_flat(arr)
        groups.setdefault((backend.name, str(flat.dtype)), (backend, []))[1].append(flat)
    try:
        ex = exchanger_for(comm)
    except ExchangeError:
        ex = None  # MPI below SERIALIZED: reduce on this thread, one bucket after another
    if ex is not None and threading.current_thread() is getattr(ex, "_thread", None):
        ex = None  # called from a job on the communication thread itself
    for (_, dtype), (backend, flats) in groups.items():
        nbytes = sum(int(f.size) for f in flats) * int(flats[0].dtype.itemsize)
        cap = min(cap_bytes, nbytes)
        if backend.on_gpu:
            cap = _gpu_cap(backend, cap)
        cap_elems = max(1, cap // int(flats[0].dtype.itemsize))
        _run_group(comm, ex, backend, _plan_group(flats, cap_elems, backend.on_gpu), dtype, op)
        if backend.on_gpu:
            backend.synchronize()
    return list(buffers)


def _stages(comm: Any, backend: Backend, dtype: str, n: int) -> list[Any]:
    per = _STAGING.setdefault(comm, {})
    key = (backend.name, dtype, n)
    if key not in per:
        if backend.on_gpu:
            per.clear()  # device memory is scarce: keep one size of staging only
        per[key] = [backend.empty(n, dtype), backend.empty(n, dtype)]
    return per[key]


def _run_group(comm: Any, ex: Any, backend: Backend,
               plan: list[tuple[Any, list[tuple[Any, int, int]]]], dtype: str,
               op: str) -> None:
    packed = [m for t, m in plan if t is None]
    size = max((m[-1][1] + m[-1][2] for m in packed), default=0)
    stages = _stages(comm, backend, dtype, size) if packed else []
    jobs: deque[_Job] = deque()
    busy = [False, False]
    nxt = 0

    def finish_oldest() -> None:
        job = jobs.popleft()
        assert job.future is not None
        job.future.result()  # raises what the communication thread raised
        if job.members:
            stage = stages[job.stage]
            for flat, off, cnt in job.members:
                backend.copy_into(flat, stage[off:off + cnt])
            busy[job.stage] = False

    try:
        for target, members in plan:
            if members:
                s = nxt
                while busy[s]:
                    finish_oldest()
                stage = stages[s]
                for flat, off, cnt in members:
                    backend.copy_into(stage[off:off + cnt], flat)
                end = members[-1][1] + members[-1][2]
                target = stage[:end]
                busy[s] = True
                nxt = 1 - s
                job = _Job(target, members, s)
            else:
                job = _Job(target, [], -1)
            job.future = _submit(ex, comm, backend, target, op)
            jobs.append(job)
        while jobs:
            finish_oldest()
    finally:
        # On an error, wait for what was already queued (it uses our staging buckets).
        for job in jobs:
            if job.future is not None:
                job.future.exception()


def _on_device(backend: Backend, fn: Any, *args: Any) -> Any:
    """Run ``fn`` on the communication thread with the GPU backend's device current: CUDA's
    current device belongs to each host thread (a new thread starts on device 0), and the
    backend refuses to run on another device than its buffers'. The packing copies and the
    reduction are both queued on the backend's stream, so no other ordering is needed."""
    import cupy

    with cupy.cuda.Device(backend.device):  # type: ignore[attr-defined]
        return fn(*args)


def _submit(ex: Any, comm: Any, backend: Backend, buf: Any, op: str) -> Future[Any]:
    if ex is not None:
        if backend.on_gpu and hasattr(backend, "device"):
            return ex.submit(_on_device, backend, comm.allreduce, buf, op)
        return ex.submit(comm.allreduce, buf, op)
    fut: Future[Any] = Future()
    try:
        fut.set_result(comm.allreduce(buf, op))
    except Exception as exc:  # noqa: BLE001 - raised by the caller through the future
        fut.set_exception(exc)
    return fut
