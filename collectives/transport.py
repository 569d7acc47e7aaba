"""Transports: non-blocking point-to-point moves of array views, plus the library's own
allreduce (what the ``native`` algorithm calls).

Algorithms see only ``Transport.start(sends, recvs)``, which posts a batch of sends and
receives and returns a ``Pending`` to wait on. A batch is the unit NCCL needs
(``groupStart``/``groupEnd``) and costs nothing extra with MPI, so one interface serves
``mpi``, ``staged`` (pinned-host staging of GPU buffers) and ``nccl``. The GPU transports
live in ``collectives.cuda`` and are imported only when asked for.

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

#: Transport names, in order of preference for host buffers.
TRANSPORTS: tuple[str, ...] = ("mpi", "staged", "nccl")


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


class Transport(ABC):
    """Point-to-point moves between the ranks of one MPI communicator."""

    name: str = ""

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


class _MpiPending(Pending):
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


class _WatchedPending(_MpiPending):
    """``_MpiPending`` whose waits give up after ``RINGTUNE_STALL_TIMEOUT`` without progress
    (collectives/stall.py); used only when that variable is set."""

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
        t = MPI._typedict.get("e")
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


class MpiTransport(Transport):
    """mpi4py ``Isend``/``Irecv`` on host arrays, or on GPU arrays when MPI is CUDA-aware.

    Arrays travel as raw bytes, so every dtype moves the same way (float16 and bfloat16
    included); the reduction happens in the backend, never in MPI.
    """

    name = "mpi"

    def __init__(self, comm: Any, backend: Backend) -> None:
        super().__init__(comm, backend)
        from mpi4py import MPI

        self._byte = MPI.BYTE
        self._isend = comm.Isend
        self._irecv = comm.Irecv
        self._waitall = MPI.Request.Waitall
        from .stall import stall_timeout, watched_waitall

        timeout = stall_timeout()
        self._watched = watched_waitall(timeout, comm) if timeout else None

    def start(
        self,
        sends: Sequence[tuple[Any, int, int]],
        recvs: Sequence[tuple[Any, int, int]],
    ) -> Pending:
        if self.backend.on_gpu:
            # mpi4py does not synchronise CuPy streams: data must be ready before MPI reads
            # it, and a receive must not land under a kernel still writing the same memory.
            self.backend.synchronize()
        byte = self._byte
        rreqs = [self._irecv([a, byte], src, tag) for a, src, tag in recvs]
        sreqs = [self._isend([a, byte], dst, tag) for a, dst, tag in sends]
        if self._watched is not None:
            return _WatchedPending(rreqs, sreqs, self._watched,
                                   ([s for _, s, _ in recvs], [d for _, d, _ in sends]))
        return _MpiPending(rreqs, sreqs, self._waitall)

    def native_allreduce(self, buf: Any, op: str) -> None:
        from mpi4py import MPI

        if not mpi_reduces(buf.dtype):
            # MPI cannot reduce this type (bfloat16; float16 in some libraries): through a
            # host copy reduced as float32, on GPU buffers too.
            host = self.backend.to_numpy(buf)
            host_allreduce(self.comm, host, op)
            self.backend.copy_into(buf, host)
            return
        if self.backend.on_gpu:
            self.backend.synchronize()
        if self._watched is not None:
            self._watched([self.comm.Iallreduce(MPI.IN_PLACE, buf, op=mpi_op(op))], [-1])
            return
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=mpi_op(op))

    def sub(self, comm: Any) -> Transport:
        return MpiTransport(comm, self.backend)


def make_transport(name: str, comm: Any, backend: Backend) -> Transport:
    """A transport by name for ``comm`` and ``backend``; ``ValueError`` if it is unknown or
    cannot serve that backend here (the message says why and what to use instead)."""
    if name == "mpi":
        if backend.on_gpu:
            from .cuda import cuda_aware_mpi

            if not cuda_aware_mpi():
                raise ValueError(
                    "transport 'mpi' cannot move GPU buffers: this MPI is not CUDA-aware "
                    "(set RINGTUNE_CUDA_AWARE=1 if it is); use transport 'staged' or 'nccl'"
                )
        return MpiTransport(comm, backend)
    if name in ("staged", "nccl"):
        if not backend.on_gpu:
            raise ValueError(
                f"transport {name!r} moves GPU buffers; host (NumPy) buffers use 'mpi'"
            )
        from .cuda import make_gpu_transport

        return make_gpu_transport(name, comm, backend)
    raise ValueError(f"unknown transport {name!r}: use one of {', '.join(TRANSPORTS)}")


def default_transport(backend: Backend) -> str:
    """The transport used when neither the call nor the profile names one."""
    if not backend.on_gpu:
        return "mpi"
    from .cuda import default_gpu_transport

    return default_gpu_transport()
