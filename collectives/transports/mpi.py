"""The ``mpi`` transport: mpi4py ``Isend``/``Irecv`` of raw bytes and ``MPI_Allreduce`` as
the library's own allreduce. Use it for host buffers, and for GPU buffers when MPI is
CUDA-aware (the backend says whether MPI may be handed its buffers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backend import Backend
from ..transport import (
    MpiPending,
    Pending,
    Transport,
    WatchedPending,
    host_allreduce,
    mpi_op,
    mpi_reduces,
)
from .registry import register_transport


def make_mpi_transport(comm: Any, backend: Backend) -> MpiTransport:
    """The ``mpi`` transport for ``backend``'s buffers; ``ValueError`` when MPI cannot be
    handed them (GPU memory with an MPI that is not CUDA-aware: the message says what to
    use instead)."""
    refusal = backend.mpi_refusal()
    if refusal is not None:
        raise ValueError(f"transport 'mpi' cannot move {backend.name} buffers: {refusal}")
    return MpiTransport(comm, backend)


class MpiTransport(Transport):
    """mpi4py ``Isend``/``Irecv`` on host arrays, or on GPU arrays when MPI is CUDA-aware.

    Arrays travel as raw bytes, so every dtype moves the same way (float16 and bfloat16
    included); the reduction happens in the backend, never in MPI.
    """

    name = "mpi"
    interleaves = True
    gpu_preference = 1  # GPU buffers straight to MPI, where MPI is CUDA-aware

    @classmethod
    def usable_on_gpu(cls, here: Any) -> bool:
        return bool(here.cuda_aware_mpi())

    def __init__(self, comm: Any, backend: Backend) -> None:
        super().__init__(comm, backend)
        from mpi4py import MPI

        self._byte = MPI.BYTE
        self._isend = comm.Isend
        self._irecv = comm.Irecv
        self._waitall = MPI.Request.Waitall
        from ..plumbing.stall import stall_timeout, watched_waitall

        timeout = stall_timeout()
        # RINGTUNE_STALL_TIMEOUT: waits that give up after a stall (collectives/plumbing/stall.py);
        # unset, the plain Waitall path below is unchanged.
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
            return WatchedPending(rreqs, sreqs, self._watched,
                                   ([s for _, s, _ in recvs], [d for _, d, _ in sends]))
        return MpiPending(rreqs, sreqs, self._waitall)

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


register_transport("mpi", make_mpi_transport, cls=MpiTransport)
