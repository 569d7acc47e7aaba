"""Transports: non-blocking point-to-point moves of array views, plus the library's own
allreduce (what the ``native`` algorithm calls).

Algorithms see only ``Transport.start(sends, recvs)``, which posts a batch of sends and
receives and returns a ``Pending`` to wait on. A batch is the unit NCCL needs
(``groupStart``/``groupEnd``) and costs nothing extra with MPI, so one interface serves
``mpi``, ``staged`` (pinned-host staging of GPU buffers) and ``nccl``. This module holds
the interface and the MPI helpers every transport shares; each transport is a module of its
own (``collectives.transports.mpi``; ``staged`` and ``nccl`` in the GPU plug-in), found by
name through ``collectives.registry``.

Messages between the same pair of ranks with the same tag are matched in posting order
(MPI's non-overtaking rule; NCCL's stream order), which is what the ring algorithms rely on.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from .backend import Backend


class Pending(ABC):
    """A posted batch of sends/receives."""

    @abstractmethod
    def wait(self) -> None:
        """Block until every operation of the batch is complete: received data is usable by
        the backend's next operation and sent views may be overwritten."""

    def wait_recv(self) -> None:
        """Block until the received data is usable (sends may still be in flight). The
        default waits for everything."""
        self.wait()

    def test(self, recv_only: bool = False) -> bool:
        """Without blocking: whether ``wait`` (``wait_recv`` with ``recv_only``) would return
        at once. Interleaved schedules (``collectives.algorithms.steps``) poll with it. The
        default never claims completion, so such a schedule waits, one piece at a time,
        where a transport cannot poll."""
        return False

    def requests(self, recv_only: bool = False) -> list[Any] | None:
        """The MPI requests ``wait`` (``wait_recv``) waits for, so that an interleaved
        schedule can block until any request of several batches completes
        (``MPI.Request.Waitany``); ``None`` where the batch is not plain MPI requests or its
        waits must stay its own (the stall watchdog's)."""
        return None


class Transport(ABC):
    """Point-to-point moves between the ranks of one MPI communicator."""

    name: str = ""
    #: Whether schedules can be interleaved over it (a pipelined ``hierarchical``): its
    #: batches can be polled (``Pending.test``) and messages are matched by tag, so pieces
    #: in flight at once, reached in a different order on different ranks, never take each
    #: other's messages. NCCL matches by order alone: its pieces run one after another.
    interleaves: bool = False
    #: Whether a rank may send to itself (a batch with its own rank as destination and
    #: source). Algorithms never do (one rank returns early); gloo has no pair to itself.
    self_sends: bool = True
    #: Who chooses the algorithm of its ``native_allreduce`` where that is not the running
    #: MPI library's (e.g. "NCCL"): a ``native`` ``composition`` (the MPI library's) is
    #: then not set, with one warning naming it. Empty: the MPI library's allreduce.
    native_chooser: str = ""
    #: Whether a ``native`` ``impl`` (one of the MPI library's algorithms) is prepared
    #: around its ``native_allreduce``; False: the default runs, with one warning naming
    #: ``native_chooser``.
    native_impls: bool = True
    #: Its rank among the transports offered for GPU buffers, best first (``nccl`` 0,
    #: CUDA-aware ``mpi`` 1, ``staged`` 2; ``collectives.cuda.available_transports``); the
    #: last is the fallback whose errors say what is missing. ``None``: not offered.
    gpu_preference: int | None = None

    @classmethod
    def usable_on_gpu(cls, here: Any) -> bool:
        """Whether it can move GPU buffers here (asked only of transports with a
        ``gpu_preference``, on a rank whose CuPy works). ``here``: what the machine offers
        (``collectives.cuda.availability.GpuFacts``: ``nccl()``, ``one_gpu_per_rank()``,
        ``cuda_aware_mpi()``), so that a transport never imports the GPU plug-in."""
        return True

    def __init__(self, comm: Any, backend: Backend) -> None:
        self.comm = comm
        self.backend = backend
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()

    @abstractmethod
    def start(
        self,
        sends: Sequence[tuple[Any, int, int]],
        recvs: Sequence[tuple[Any, int, int]],
    ) -> Pending:
        """Post ``sends`` (array view, destination rank, tag) and ``recvs`` (array view,
        source rank, tag) and return at once. Views are contiguous 1-D arrays."""

    @abstractmethod
    def native_allreduce(self, buf: Any, op: str) -> None:
        """The library's own in-place allreduce of the flat ``buf`` (op: sum/prod/min/max)."""

    @abstractmethod
    def sub(self, comm: Any) -> Transport:
        """The same kind of transport over another communicator (a sub-communicator of a
        hierarchical grid)."""

    def close(self) -> None:
        """Release resources (pinned buffers, NCCL communicators)."""


class MpiPending(Pending):
    __slots__ = ("recv_reqs", "send_reqs", "_waitall")

    def __init__(self, recv_reqs: list[Any], send_reqs: list[Any], waitall: Any) -> None:
        self.recv_reqs = recv_reqs
        self.send_reqs = send_reqs
        self._waitall = waitall

    def wait(self) -> None:
        # Completed requests become MPI_REQUEST_NULL, so waiting twice is harmless.
        if self.recv_reqs:
            self._waitall(self.recv_reqs)
        if self.send_reqs:
            self._waitall(self.send_reqs)

    def wait_recv(self) -> None:
        if self.recv_reqs:
            self._waitall(self.recv_reqs)

    def test(self, recv_only: bool = False) -> bool:
        from mpi4py import MPI

        if self.recv_reqs and not MPI.Request.Testall(self.recv_reqs):
            return False
        return recv_only or not self.send_reqs or MPI.Request.Testall(self.send_reqs)

    def requests(self, recv_only: bool = False) -> list[Any] | None:
        return self.recv_reqs if recv_only else self.recv_reqs + self.send_reqs


class WatchedPending(MpiPending):
    """``MpiPending`` whose waits give up after ``RINGTUNE_STALL_TIMEOUT`` without progress
    (collectives/plumbing/stall.py); used only when that variable is set."""

    __slots__ = ("peers",)

    def __init__(self, recv_reqs: list[Any], send_reqs: list[Any], waitall: Any,
                 peers: tuple[list[int], list[int]]) -> None:
        super().__init__(recv_reqs, send_reqs, waitall)
        self.peers = peers

    def wait(self) -> None:
        self.wait_recv()
        if self.send_reqs:
            self._waitall(self.send_reqs, self.peers[1])

    def wait_recv(self) -> None:
        if self.recv_reqs:
            self._waitall(self.recv_reqs, self.peers[0])

    def requests(self, recv_only: bool = False) -> list[Any] | None:
        return None  # blocking goes through the watched waits, which bound a stall


def mpi_op(op: str) -> Any:
    """The ``MPI.Op`` for a reduction op name (``avg`` reduces with SUM, then divides)."""
    from mpi4py import MPI

    return {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN,
            "max": MPI.MAX}[op]


@functools.cache
def mpi_reduces(dtype: Any) -> bool:
    """Whether this MPI can reduce ``dtype`` itself. bfloat16 has no MPI type; float16 has
    one only in some libraries (MPICH's ``MPIX_C_FLOAT16``), which mpi4py then lists.
    Cached: every ``native`` call asks, and the answer is fixed for the process."""
    from mpi4py import MPI

    name = str(dtype)
    if name == "bfloat16":
        return False
    if name == "float16":
        # mpi4py lists the datatypes its build found only there (checked on mpi4py 4.1.2).
        t = MPI._typedict.get("e")  # noqa: SLF001
        return t is not None and t != MPI.DATATYPE_NULL
    return True


def host_allreduce(comm: Any, arr: np.ndarray, op: str) -> None:
    """In-place ``MPI_Allreduce`` of a host array. A half type MPI cannot reduce is reduced
    as float32 and rounded back once: identical on every rank, and exact for the sums of a
    few small values."""
    from mpi4py import MPI

    if mpi_reduces(arr.dtype):
        comm.Allreduce(MPI.IN_PLACE, arr, op=mpi_op(op))
        return
    wide = arr.astype(np.float32)
    comm.Allreduce(MPI.IN_PLACE, wide, op=mpi_op(op))
    arr[...] = wide.astype(arr.dtype)
