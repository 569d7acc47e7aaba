"""The ``staged`` transport: GPU buffers through pinned host memory and MPI (any MPI,
CUDA-aware or not). Use it where NCCL cannot run (two ranks on one GPU, no NCCL) or MPI
cannot take GPU memory.

It follows the stream discipline of every GPU transport (docs/gpu.md), so the multiring
pipeline overlaps reduction and transfer without any device-wide synchronisation:
``start`` records an event on the backend's stream (where the reductions run) and makes
the transport's own streams wait for it, so a send reads finished data and a receive never
overwrites memory a queued reduction still reads; ``wait_recv`` makes the backend's stream
wait for the event that marks the received data in place.

Each message moves as pieces of at most ``piece_bytes``: device-to-host copies
into pinned buffers on one stream, ``MPI_Isend`` of each piece as soon as its copy is done,
``MPI_Irecv`` into pinned buffers posted at once, and host-to-device copies of received
pieces on a second stream while later pieces are still arriving — double-buffered, with
copies in both directions overlapping MPI. Sends are handed to MPI strictly in posting
order (a FIFO), so messages with the same peer and tag keep MPI's matching order. Any
waiting call keeps that FIFO moving, so a rank blocked on a receive still posts the sends
its peers wait for.

``native_allreduce``: NCCL ``allReduce`` (``collectives.cuda.nccl``) when NCCL is usable on
every rank with one GPU per rank, else pinned-host ``MPI_Allreduce`` (copy down, reduce,
copy back). Registered as ``staged`` in ``collectives.registry`` on import.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..registry import register_transport
from ..transport import Pending, Transport, host_allreduce
from .binding import shared_gpus
from .detect import load_nccl
from .nccl import NcclLink
from .peers import byte_size, check_same_transport, peer_records, require_gpu_backend

#: Largest piece a staged message is cut into (pipelining copies with MPI).
PIECE_BYTES = 1 << 22


def pieces(nbytes: int, piece: int) -> list[tuple[int, int]]:
    """(offset, length) pieces of a message; a 0-byte message is one empty piece, so it is
    still sent and matched like any other."""
    if nbytes <= 0:
        return [(0, 0)]
    return [(off, min(piece, nbytes - off)) for off in range(0, nbytes, piece)]


# -- pinned host buffers -------------------------------------------------------------------


class _PinnedPool:
    """Reusable pinned buffers in power-of-two size classes. A buffer whose asynchronous
    copy may still be running is returned with ``release_after(event, …)`` and reused only
    once that event has happened."""

    def __init__(self, ops: Any) -> None:
        self.ops = ops
        self.free: dict[int, list[np.ndarray]] = {}
        self.deferred: deque[tuple[Any, list[np.ndarray]]] = deque()
        self.allocated = 0

    @staticmethod
    def size_class(nbytes: int) -> int:
        return 1 << max(12, (max(1, nbytes) - 1).bit_length())

    def get(self, nbytes: int) -> np.ndarray:
        while self.deferred and self.ops.done(self.deferred[0][0]):
            for buf in self.deferred.popleft()[1]:
                self.release(buf)
        cls = self.size_class(nbytes)
        stack = self.free.get(cls)
        if stack:
            return stack.pop()
        self.allocated += cls
        return self.ops.pinned(cls)

    def release(self, buf: np.ndarray) -> None:
        self.free.setdefault(buf.nbytes, []).append(buf)

    def release_after(self, event: Any, bufs: list[np.ndarray]) -> None:
        if bufs:
            self.deferred.append((event, bufs))

    def clear(self) -> None:
        self.free.clear()
        self.deferred.clear()


# -- staged ----------------------------------------------------------------------------------


class _SendPiece:
    __slots__ = ("event", "host", "n", "dst", "tag", "req")

    def __init__(self, event: Any, host: np.ndarray, n: int, dst: int, tag: int) -> None:
        self.event = event
        self.host = host
        self.n = n
        self.dst = dst
        self.tag = tag
        self.req: Any = None


class _RecvPiece:
    __slots__ = ("req", "host", "dev", "n")

    def __init__(self, req: Any, host: np.ndarray, dev: int, n: int) -> None:
        self.req = req
        self.host = host
        self.dev = dev
        self.n = n


class _StagedPending(Pending):
    __slots__ = ("t", "sends", "recvs", "recv_done", "done")

    def __init__(self, t: StagedTransport) -> None:
        self.t = t
        self.sends: list[_SendPiece] = []
        self.recvs: list[_RecvPiece] = []
        self.recv_done = False
        self.done = False

    def wait_recv(self) -> None:
        if self.recv_done:
            return
        t = self.t
        ops = t.ops
        for rp in self.recvs:
            # Keep our own sends flowing while we wait: a peer may be waiting for them.
            while not t.fifo_empty():
                if rp.req.Test():
                    break
                t.pump()
            else:
                rp.req.Wait()
            # This piece's copy up overlaps the arrival of the next piece.
            ops.h2d(rp.dev, rp.host, rp.n, t.h2d_stream)
        if self.recvs:
            ev = ops.new_event()
            ops.record(ev, t.h2d_stream)
            ops.wait(t.bstream, ev)
            t.pool.release_after(ev, [rp.host for rp in self.recvs])
        self.recv_done = True

    def wait(self) -> None:
        if self.done:
            return
        self.wait_recv()
        t = self.t
        for sp in self.sends:
            while sp.req is None:
                t.pump(block=True)
            sp.req.Wait()
            t.pool.release(sp.host)
        self.done = True


class StagedTransport(Transport):
    """GPU buffers through pinned host memory and MPI (any MPI, CUDA-aware or not)."""

    name = "staged"
    gpu_preference = 2  # any MPI, any GPU layout: the fallback

    def __init__(self, comm: Any, backend: Any, ops: Any = None,
                 piece_bytes: int = PIECE_BYTES, nccl: Any = None) -> None:
        super().__init__(comm, backend)
        from mpi4py import MPI

        if piece_bytes < 1:
            raise ValueError(f"piece_bytes must be ≥ 1, got {piece_bytes}")
        if ops is None:
            from .ops import CudaOps

            ops = CudaOps(backend.device)
        self.ops = ops
        #: The backend's stream, where reductions run and received data must be visible.
        self.bstream: Any = backend.stream
        self.piece = int(piece_bytes)
        self._byte = MPI.BYTE
        self._isend = comm.Isend
        self._irecv = comm.Irecv
        self.d2h_stream = ops.new_stream()
        self.h2d_stream = ops.new_stream()
        self.pool = _PinnedPool(ops)
        self.fifo: deque[_SendPiece] = deque()
        self._nccl_given = nccl
        # native_allreduce: NCCL when every rank has it and no two ranks share a GPU;
        # decided once, together, so that all ranks take the same path.
        mod, why = (nccl, "given") if nccl is not None else load_nccl()
        everyone = peer_records(comm, backend, (self.name, mod is not None, why))
        check_same_transport(everyone)
        records = [(e[1], e[2]) for e in everyone]
        self._native_nccl_ok = (all(e[0][1] for e in everyone)
                                and not shared_gpus(records))
        self._native_link: NcclLink | None = None
        self._native_host: np.ndarray | None = None

    # The FIFO of sends whose device-to-host copy is queued but not yet handed to MPI.
    def fifo_empty(self) -> bool:
        return not self.fifo

    def pump(self, block: bool = False) -> None:
        """Hand to MPI, in posting order, every queued send piece whose copy is done; with
        ``block``, wait for the oldest one's copy first."""
        fifo = self.fifo
        ops = self.ops
        while fifo:
            sp = fifo[0]
            if not ops.done(sp.event):
                if not block:
                    return
                ops.sync_event(sp.event)
                block = False
            fifo.popleft()
            sp.req = self._isend([sp.host[:sp.n], self._byte], sp.dst, sp.tag)

    def _staging(self, arr: Any) -> list[tuple[int, np.ndarray, int]]:
        """(device address, pinned buffer, bytes) of each piece of a message."""
        base = self.ops.ptr(arr)
        return [(base + off, self.pool.get(n), n)
                for off, n in pieces(byte_size(arr), self.piece)]

    def start(self, sends: Sequence[tuple[Any, int, int]],
              recvs: Sequence[tuple[Any, int, int]]) -> Pending:
        ops = self.ops
        pend = _StagedPending(self)
        ready = ops.new_event()
        ops.record(ready, self.bstream)
        if recvs:
            # Copies up must not overwrite what reductions queued so far still read.
            ops.wait(self.h2d_stream, ready)
            for arr, src, tag in recvs:
                for dev, host, n in self._staging(arr):
                    req = self._irecv([host[:n], self._byte], src, tag)
                    pend.recvs.append(_RecvPiece(req, host, dev, n))
        if sends:
            # Copies down read data the backend's stream produced.
            ops.wait(self.d2h_stream, ready)
            for arr, dst, tag in sends:
                for dev, host, n in self._staging(arr):
                    ops.d2h(host, dev, n, self.d2h_stream)
                    ev = ops.new_event()
                    ops.record(ev, self.d2h_stream)
                    sp = _SendPiece(ev, host, n, dst, tag)
                    self.fifo.append(sp)
                    pend.sends.append(sp)
            self.pump()
        return pend

    def native_allreduce(self, buf: Any, op: str) -> None:
        if self._native_nccl_ok:
            if self._native_link is None:
                self._native_link = NcclLink(self.comm, self.backend, self.ops,
                                              self._nccl_given, "native allreduce")
            self._native_link.allreduce(buf, op)
            return
        self._staged_allreduce(buf, op)

    def _staged_allreduce(self, buf: Any, op: str) -> None:
        """Copy to pinned host memory, ``MPI_Allreduce`` in place, copy back."""
        ops = self.ops
        nbytes = byte_size(buf)
        if self._native_host is None or self._native_host.nbytes < nbytes:
            if self._native_host is not None:
                # The previous call's copy up may still read the old buffer, and CuPy's
                # pinned pool hands a dropped buffer out again at once.
                ops.sync_stream(self.h2d_stream)
            self._native_host = ops.pinned(nbytes)
        host = self._native_host
        ready = ops.new_event()
        ops.record(ready, self.bstream)
        ops.wait(self.d2h_stream, ready)
        ops.d2h(host, ops.ptr(buf), nbytes, self.d2h_stream)
        ops.sync_stream(self.d2h_stream)
        host_allreduce(self.comm, host[:nbytes].view(buf.dtype), op)
        ops.wait(self.h2d_stream, ready)
        ops.h2d(ops.ptr(buf), host, nbytes, self.h2d_stream)
        done = ops.new_event()
        ops.record(done, self.h2d_stream)
        ops.wait(self.bstream, done)
        # ``host`` is reused by the next call: its copy down must come after this copy up.
        ops.wait(self.d2h_stream, done)

    def sub(self, comm: Any) -> Transport:
        return StagedTransport(comm, self.backend, self.ops, self.piece, self._nccl_given)

    def close(self) -> None:
        while self.fifo:
            self.pump(block=True)
        # Copies may still read or write the pinned buffers dropped below (a receive's copy
        # up released with release_after, the native buffer): CuPy's pinned pool would
        # hand them out again while the GPU still uses them.
        self.ops.sync_stream(self.d2h_stream)
        self.ops.sync_stream(self.h2d_stream)
        self.pool.clear()
        self._native_host = None
        if self._native_link is not None:
            self._native_link.close()
            self._native_link = None


def make_staged_transport(comm: Any, backend: Any) -> StagedTransport:
    """The registry factory of ``staged`` (GPU buffers only; collective over ``comm``)."""
    require_gpu_backend("staged", backend)
    return StagedTransport(comm, backend)


register_transport("staged", make_staged_transport, backends=("cupy",),
                   cls=StagedTransport)
