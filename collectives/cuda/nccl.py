"""The ``nccl`` transport: NCCL point-to-point send/recv, one group per batch, one GPU per
rank. Use it on GPU machines with NCCL where every rank has its own GPU (the fastest path
there); ``staged`` serves the rest.

Each batch is one ``groupStart``/``groupEnd`` group on a dedicated stream, chained to the
backend's stream by events (docs/gpu.md). NCCL has no tags: messages between two ranks
match in posting order whatever their tag, which is what the algorithms guarantee
(``tests/unit/test_cuda_transports.py`` checks that every algorithm posts in a
rank-consistent order). The NCCL communicator (``NcclLink``, also ``staged``'s native
allreduce) is built once per transport (unique id broadcast over MPI) and refuses two ranks
on one GPU with a clear error before NCCL would. Registered as ``nccl`` in
``collectives.registry`` on import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..registry import register_transport
from ..transport import Pending, Transport
from .binding import shared_gpu_message, shared_gpus
from .detect import load_nccl
from .errors import GpuError
from .peers import byte_size, check_same_transport, peer_records, require_gpu_backend

#: NCCL's ncclDataType_t / ncclRedOp_t values (stable ABI), used when CuPy's module does
#: not define a name.
NCCL_DTYPES = {"int32": ("NCCL_INT32", 2), "int64": ("NCCL_INT64", 4),
               "float16": ("NCCL_FLOAT16", 6), "float32": ("NCCL_FLOAT32", 7),
               "float64": ("NCCL_FLOAT64", 8), "bfloat16": ("NCCL_BFLOAT16", 9)}
NCCL_OPS = {"sum": ("NCCL_SUM", 0), "avg": ("NCCL_SUM", 0), "prod": ("NCCL_PROD", 1),
            "max": ("NCCL_MAX", 2), "min": ("NCCL_MIN", 3)}


def _dtype_name(arr: Any) -> str:
    return str(arr.dtype)


class _EventPending(Pending):
    """A batch whose completion is one event; waiting makes the backend stream wait."""

    __slots__ = ("ops", "stream", "event", "waited")

    def __init__(self, ops: Any, stream: Any, event: Any) -> None:
        self.ops = ops
        self.stream = stream
        self.event = event
        self.waited = False

    def wait(self) -> None:
        if not self.waited:
            self.ops.wait(self.stream, self.event)
            self.waited = True

    def wait_recv(self) -> None:
        self.wait()


# -- NCCL ------------------------------------------------------------------------------------


class NcclLink:
    """One NCCL communicator over an MPI communicator, and the stream it works on."""

    def __init__(self, comm: Any, backend: Any, ops: Any, nccl: Any, what: str) -> None:
        if nccl is not None and hasattr(nccl, "for_comm"):
            nccl = nccl.for_comm(comm)  # the unit tests' CPU fake of NCCL, bound to comm
        mod, why = (nccl, "given") if nccl is not None else load_nccl()
        rank, size = comm.Get_rank(), comm.Get_size()
        everyone = peer_records(comm, backend, ("nccl", mod is not None, why))
        check_same_transport(everyone)
        missing = [r for r, e in enumerate(everyone) if not e[0][1]]
        if missing:
            raise GpuError(f"{what}: transport 'nccl' is not available on rank(s) "
                           f"{', '.join(map(str, missing))}: {everyone[missing[0]][0][2]}")
        records = [(e[1], e[2]) for e in everyone]
        groups = shared_gpus(records)
        if groups:
            raise GpuError(shared_gpu_message(groups, records, "transport 'nccl'"))
        uid: Any = None
        err = None
        if rank == 0:
            try:
                uid = mod.get_unique_id()
            except Exception as exc:  # noqa: BLE001 - shared with every rank below
                err = f"rank 0: ncclGetUniqueId failed: {exc}"
        uid, err = comm.bcast((uid, err), root=0)
        if err:
            raise GpuError(err)
        self.mod = mod
        self.ops = ops
        self.backend = backend
        self.stream = ops.new_stream()
        self.u8 = int(getattr(mod, "NCCL_UINT8", 1))
        # NCCL ties the communicator to the current device: make it ours.
        with ops.device_context():
            self.comm = mod.NcclCommunicator(size, uid, rank)

    def _enter(self) -> None:
        ready = self.ops.new_event()
        self.ops.record(ready, self.backend.stream)
        self.ops.wait(self.stream, ready)

    def _leave(self) -> Any:
        done = self.ops.new_event()
        self.ops.record(done, self.stream)
        return done

    def start(self, sends: Sequence[tuple[Any, int, int]],
              recvs: Sequence[tuple[Any, int, int]]) -> Pending:
        ops = self.ops
        self._enter()
        sptr = ops.stream_ptr(self.stream)
        mod, comm, u8 = self.mod, self.comm, self.u8
        mod.groupStart()
        try:
            # Empty messages are skipped on both sides alike (their sizes match).
            for arr, src, _tag in recvs:
                if arr.size:
                    comm.recv(ops.ptr(arr), byte_size(arr), u8, src, sptr)
            for arr, dst, _tag in sends:
                if arr.size:
                    comm.send(ops.ptr(arr), byte_size(arr), u8, dst, sptr)
        finally:
            mod.groupEnd()
        return _EventPending(ops, self.backend.stream, self._leave())

    def allreduce(self, buf: Any, op: str) -> None:
        name = _dtype_name(buf)
        if name not in NCCL_DTYPES:
            raise TypeError(f"NCCL allReduce has no dtype {name}: use one of "
                            f"{', '.join(NCCL_DTYPES)}")
        dname, dval = NCCL_DTYPES[name]
        oname, oval = NCCL_OPS[op]
        self._enter()
        ptr = self.ops.ptr(buf)
        self.comm.allReduce(ptr, ptr, int(buf.size), int(getattr(self.mod, dname, dval)),
                            int(getattr(self.mod, oname, oval)), self.ops.stream_ptr(self.stream))
        self.ops.wait(self.backend.stream, self._leave())

    def close(self) -> None:
        self.ops.sync_stream(self.stream)
        destroy = getattr(self.comm, "destroy", None)
        if destroy is not None:
            destroy()


class NcclTransport(Transport):
    """NCCL point-to-point send/recv, one group per batch, one GPU per rank."""

    name = "nccl"
    native_chooser = "NCCL"
    native_impls = False
    gpu_preference = 0  # NCCL's own kernels: the best where every rank has its own GPU

    @classmethod
    def usable_on_gpu(cls, here: Any) -> bool:
        return bool(here.nccl() and here.one_gpu_per_rank())

    def __init__(self, comm: Any, backend: Any, ops: Any = None, nccl: Any = None) -> None:
        super().__init__(comm, backend)
        if ops is None:
            from .ops import CudaOps

            ops = CudaOps(backend.device)
        self.ops = ops
        self._nccl_given = nccl
        self.link = NcclLink(comm, backend, ops, nccl, "transport 'nccl'")

    def start(self, sends: Sequence[tuple[Any, int, int]],
              recvs: Sequence[tuple[Any, int, int]]) -> Pending:
        return self.link.start(sends, recvs)

    def native_allreduce(self, buf: Any, op: str) -> None:
        self.link.allreduce(buf, op)

    def sub(self, comm: Any) -> Transport:
        return NcclTransport(comm, self.backend, self.ops, self._nccl_given)

    def close(self) -> None:
        self.link.close()


def make_nccl_transport(comm: Any, backend: Any) -> NcclTransport:
    """The registry factory of ``nccl`` (GPU buffers, one GPU per rank; collective)."""
    require_gpu_backend("nccl", backend)
    return NcclTransport(comm, backend)


register_transport("nccl", make_nccl_transport, backends=("cupy",), cls=NcclTransport)
