"""``cupy.cuda.nccl`` of the simulated GPU: NCCL's semantics, carried by MPI.

A communicator is an MPI communicator over the same ranks (found from the unique id, which
names the rank that made it); like NCCL it refuses two ranks on one GPU. ``send``/``recv``
inside ``groupStart``/``groupEnd`` become one operation per stream that posts them all
(``Irecv``/``Isend``, one tag: messages between two ranks match in posting order, as in
NCCL) and keeps the stream busy until they complete — polled, so other streams and other
communicators progress meanwhile, as on a GPU. ``allReduce`` is an ``Iallreduce`` on the
stream (bfloat16, which MPI lacks, reduced as float32). The values of the datatype and op
constants are NCCL's.

``RINGTUNE_FAKE_NCCL=0`` makes NCCL "not installed" (``available = False``).
"""

from __future__ import annotations

import itertools
import os
import struct
from typing import Any

import numpy as np

available = os.environ.get("RINGTUNE_FAKE_NCCL", "1") != "0"

NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 6, 7, 8, 9
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3

#: Tags of the fake's own set-up messages on COMM_WORLD (far above ringtune's).
_TAG_BASE = 31000


class NcclError(RuntimeError):
    pass


def _dtype(code: int) -> np.dtype:
    table: dict[int, Any] = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64,
                             5: np.uint64, 6: np.float16, 7: np.float32, 8: np.float64}
    if code == NCCL_BFLOAT16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if code not in table:
        raise NcclError(f"ncclInvalidArgument: datatype {code}")
    return np.dtype(table[code])


def _host(ptr: int, nbytes: int) -> tuple[np.ndarray, Any]:
    """A byte view of simulated device memory, and what keeps it alive."""
    from .. import _foreign  # the package imports this module: look it up when used

    try:
        arr = _foreign(int(ptr), (nbytes,), np.dtype(np.uint8), None)
    except ValueError as exc:
        raise NcclError(f"ncclInvalidArgument: {exc}") from None
    return arr._a, arr._keep


def get_version() -> int:
    return 22703  # 2.27.3


_serial = itertools.count()


def get_unique_id() -> bytes:
    """128 bytes naming the world rank that made it, and a serial number."""
    from mpi4py import MPI

    return struct.pack("<qq", MPI.COMM_WORLD.Get_rank(), next(_serial)).ljust(128, b"\0")


_group_depth = 0
_group: list[tuple[NcclCommunicator, str, int, int, int, int]] = []


def groupStart() -> None:  # noqa: N802 - NCCL's name
    global _group_depth
    _group_depth += 1


def groupEnd() -> None:  # noqa: N802
    global _group_depth
    if _group_depth < 1:
        raise NcclError("ncclInvalidUsage: groupEnd without groupStart")
    _group_depth -= 1
    if _group_depth == 0:
        _flush()


def _flush() -> None:
    from mpi4py import MPI

    from . import STREAMS, Stream

    by_stream: dict[int, list[tuple[NcclCommunicator, str, int, int, int, int]]] = {}
    for item in _group:
        by_stream.setdefault(item[5], []).append(item)
    _group.clear()
    for sptr, items in by_stream.items():
        stream = Stream.null if sptr == 0 else STREAMS.get(sptr)
        if stream is None:
            raise NcclError(f"ncclInvalidArgument: stream {sptr:#x}")

        def op(items: list[Any] = items) -> Any:
            reqs, keep = [], []
            for comm, kind, ptr, nbytes, peer, _ in items:
                view, owner = _host(ptr, nbytes)
                keep.append(owner)
                post = comm.mpi.Irecv if kind == "recv" else comm.mpi.Isend
                reqs.append(post([view, MPI.BYTE], peer, 0))

            def poll() -> bool:
                if not MPI.Request.Testall(reqs):
                    return False
                keep.clear()  # the memory may go once the transfers are done
                return True

            return poll

        stream._enqueue(op)


class NcclCommunicator:
    def __init__(self, ndev: int, commId: bytes, rank: int) -> None:  # noqa: N803
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        maker, serial = struct.unpack("<qq", bytes(commId)[:16])
        tag = _TAG_BASE + serial % 500
        me = world.Get_rank()
        if rank == 0:
            if me != maker:
                raise NcclError("ncclInvalidUsage: rank 0 must be the unique id's maker")
            members = {0: me}
            for _ in range(ndev - 1):
                r, wr = world.recv(source=MPI.ANY_SOURCE, tag=tag)
                members[r] = wr
            order = [members[r] for r in range(ndev)]
            for r in range(1, ndev):
                world.send(order, dest=order[r], tag=tag)
        else:
            world.send((rank, me), dest=maker, tag=tag)
            order = world.recv(source=maker, tag=tag)
        self.mpi = world.Create_group(world.Get_group().Incl(order), tag)
        from . import runtime

        where = (MPI.Get_processor_name(), runtime.getDevice())
        everyone = self.mpi.allgather(where)
        if len(set(everyone)) != len(everyone):
            self.mpi.Free()
            raise NcclError("ncclInvalidUsage: Duplicate GPU detected: two ranks of this "
                            f"communicator use one GPU ({everyone})")

    def _p2p(self, kind: str, ptr: int, count: int, datatype: int, peer: int,
             stream: int) -> None:
        nbytes = int(count) * _dtype(datatype).itemsize
        _group.append((self, kind, int(ptr), nbytes, int(peer), int(stream)))
        if _group_depth == 0:
            _flush()

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._p2p("send", sendbuf, count, datatype, peer, stream)

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._p2p("recv", recvbuf, count, datatype, peer, stream)

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int,  # noqa: N802
                  op: int, stream: int) -> None:
        from mpi4py import MPI

        from . import STREAMS, Stream

        dt = _dtype(datatype)
        mop = {NCCL_SUM: MPI.SUM, NCCL_PROD: MPI.PROD, NCCL_MAX: MPI.MAX,
               NCCL_MIN: MPI.MIN}[int(op)]
        nbytes = int(count) * dt.itemsize
        st = Stream.null if int(stream) == 0 else STREAMS[int(stream)]

        def run() -> Any:
            src, owner_s = _host(sendbuf, nbytes)
            dst, owner_d = _host(recvbuf, nbytes)
            keep = [owner_s, owner_d]
            s, d = src.view(dt), dst.view(dt)
            wide = dt.kind == "V" or dt.name == "bfloat16"
            work = d.astype(np.float32) if wide else d
            if int(sendbuf) != int(recvbuf):
                work[...] = s.astype(np.float32) if wide else s
            req = self.mpi.Iallreduce(MPI.IN_PLACE, work, op=mop)

            def poll() -> bool:
                if not req.Test():
                    return False
                if wide:
                    d[...] = work.astype(dt)
                keep.clear()
                return True

            return poll

        st._enqueue(run)

    def destroy(self) -> None:
        self.mpi.Free()
