"""The ``torch`` transport: point-to-point moves and the group's own allreduce over a
``torch.distributed`` process group (the ``torch`` engine's communicators,
``collectives.engines.torch.TorchComm``).

Use it for every buffer under the ``torch`` engine (the engine picks it by default):

- host (NumPy) buffers move over the group's **gloo** backend as CPU tensors that share the
  arrays' memory (``torch.from_numpy``, no copy), with ``send``/``recv`` whose tags gloo
  honours;
- GPU (CuPy / torch CUDA) buffers move over its **NCCL** backend as CUDA tensors that share
  the arrays' memory (``__cuda_array_interface__``), each batch one coalesced group of
  sends and receives (what ``batch_isend_irecv`` does; NCCL ignores tags and matches by
  order alone).

Neither can be polled honestly (a gloo ``Work`` says it is complete only once waited on;
NCCL's completes on a stream), so ``interleaves`` is False: schedules over it run piece by
piece, as over the ``nccl`` transport. ``native_allreduce`` is the group's own
``allreduce`` (gloo's or NCCL's): the baseline a torch user has. Messages travel as bytes;
the group's allreduce sees the buffer's own dtype.

``RINGTUNE_STALL_TIMEOUT=S`` bounds every wait: no completion for S seconds raises
``StallError`` naming this rank, its host and the peers waited on.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Sequence
from typing import Any

from ..backend import Backend
from ..engines.torch import MOVERS, REDUCE_OPS, TorchComm, worker_safe
from ..errors import PeerFailure
from ..plumbing.stall import ENV as STALL_ENV
from ..plumbing.stall import StallError, stall_timeout
from ..transport import Pending, Transport
from .registry import register_transport


class PeerError(PeerFailure):
    """A send, receive or the group's allreduce failed: a peer died or its link broke."""


#: NumPy/CuPy dtype names to torch dtype attribute names (the group's allreduce reduces
#: the buffer's own type; point-to-point moves bytes).
TORCH_DTYPES: dict[str, str] = {"float16": "float16", "float32": "float32",
                                "float64": "float64", "int32": "int32", "int64": "int64",
                                "bfloat16": "bfloat16", "uint8": "uint8"}


def _refusal(comm: TorchComm, backend: Backend) -> str | None:
    """Why ``comm``'s group cannot move ``backend``'s buffers (the sentence names the
    group's backend and the fix), or ``None`` when it can."""
    device = "cuda" if backend.on_gpu else "cpu"
    have = comm.backends.get(device)
    need = MOVERS[device]
    if have == need:
        return None
    where = f"a torch.distributed group whose backend is {comm.backend_label}"
    if device == "cuda":
        return (f"a CUDA buffer on {where}: ringtune moves CUDA tensors only over NCCL; use "
                "an NCCL group (init_process_group('cpu:gloo,cuda:nccl') or "
                "new_group(backend='nccl')), or pass CPU tensors")
    if have == "nccl" or have is None:
        return (f"a CPU buffer on {where}: NCCL moves only CUDA tensors; move the tensor to "
                "its GPU (tensor.cuda()) or give the group a CPU backend "
                "(init_process_group('cpu:gloo,cuda:nccl'))")
    return (f"a CPU buffer on {where}: ringtune moves CPU tensors only over gloo; build the "
            "Communicator over a gloo group (dist.new_group(backend='gloo'))")


def make_torch_transport(comm: Any, backend: Backend) -> TorchTransport:
    """The registry factory of transport ``torch``; ``ValueError`` naming the rank, the
    group's backend and the fix where the group cannot move ``backend``'s buffers."""
    if not isinstance(comm, TorchComm):
        raise ValueError(
            f"transport 'torch' moves bytes over torch.distributed groups, and this "
            f"communicator is a {type(comm).__module__}.{type(comm).__name__}: use transport "
            "'mpi', or build the Communicator over a process group")
    why = _refusal(comm, backend)
    if why is not None:
        raise ValueError(f"rank {comm.rank}: {why}")
    return TorchTransport(comm, backend)


class _TorchPending(Pending):
    __slots__ = ("transport", "recv_works", "send_works", "recv_peers", "send_peers")

    def __init__(self, transport: TorchTransport, recv_works: list[Any],
                 send_works: list[Any], recv_peers: list[int], send_peers: list[int]) -> None:
        self.transport = transport
        self.recv_works = recv_works
        self.send_works = send_works
        self.recv_peers = recv_peers
        self.send_peers = send_peers

    def wait_recv(self) -> None:
        if self.recv_works:
            self.transport.wait_works(self.recv_works, self.recv_peers)
            self.recv_works = []

    def wait(self) -> None:
        self.wait_recv()
        if self.send_works:
            self.transport.wait_works(self.send_works, self.send_peers)
            self.send_works = []


class TorchTransport(Transport):
    """Point-to-point over a process group's gloo (host buffers) or NCCL (GPU buffers)
    backend; see the module docstring."""

    name = "torch"
    interleaves = False
    self_sends = False  # gloo (and a bare group's NCCL) have no pair from a rank to itself
    native_chooser = "the torch.distributed group's backend (gloo, NCCL)"

    def __init__(self, comm: TorchComm, backend: Backend) -> None:
        super().__init__(comm, backend)
        import torch
        import torch.distributed as dist

        self._torch = torch
        self.gpu = bool(backend.on_gpu)
        self.device = "cuda" if self.gpu else "cpu"
        self.group = comm.groups[self.device]
        self.world_ranks = comm.world_ranks
        self._dtypes = {k: getattr(torch, v) for k, v in TORCH_DTYPES.items()}
        self._opts = {}
        for op, attr in REDUCE_OPS.items():
            opts = dist.AllreduceOptions()
            opts.reduceOp = getattr(dist.ReduceOp, attr)
            self._opts[op] = opts
        timeout = stall_timeout()
        #: RINGTUNE_STALL_TIMEOUT as the waits' bound; ``None``: plain waits.
        self._stall = datetime.timedelta(seconds=timeout) if timeout else None
        self._stall_s = timeout

    def _bytes(self, arr: Any) -> Any:
        """A uint8 tensor sharing ``arr``'s memory (1-D contiguous views: no copy)."""
        if self.gpu:
            return self._torch.as_tensor(arr.view("uint8"), device="cuda")
        return self._torch.from_numpy(arr.view("uint8"))

    def start(self, sends: Sequence[tuple[Any, int, int]],
              recvs: Sequence[tuple[Any, int, int]]) -> Pending:
        group = self.group
        if self.gpu:
            return self._start_nccl(sends, recvs)
        # Zero-byte messages are skipped on both sides: sender and receiver know the size.
        rworks = [group.recv([self._bytes(a)], src, tag) for a, src, tag in recvs if a.size]
        sworks = [group.send([self._bytes(a)], dst, tag) for a, dst, tag in sends if a.size]
        return _TorchPending(self, rworks, sworks, [s for a, s, _ in recvs if a.size],
                             [d for a, d, _ in sends if a.size])

    def _start_nccl(self, sends: Sequence[tuple[Any, int, int]],
                    recvs: Sequence[tuple[Any, int, int]]) -> Pending:
        """One coalesced NCCL group per batch (``batch_isend_irecv``'s way on a bare
        group): NCCL launches its sends and receives together, so a ring step's send and
        receive cannot wait on each other. NCCL runs on its own stream, ordered after the
        *torch* current stream: the backend's stream (CuPy kernels that wrote the data) is
        synchronised first."""
        self.backend.synchronize()
        group = self.group
        device = self._torch.device("cuda", self._torch.cuda.current_device())
        posts = [(self._bytes(a), p, True) for a, p, _ in recvs if a.size]
        posts += [(self._bytes(a), p, False) for a, p, _ in sends if a.size]
        if not posts:
            return _TorchPending(self, [], [], [], [])
        # Coalescing is the one way to post a batch of NCCL sends and receives as one
        # group call from Python: private on ProcessGroup (checked on torch 2.14.1).
        group._start_coalescing(device)  # noqa: SLF001
        try:
            for t, peer, is_recv in posts:
                (group.recv if is_recv else group.send)([t], peer, 0)
        finally:
            work = group._end_coalescing(device)  # noqa: SLF001
        peers = sorted({p for _, p, _ in posts})
        return _TorchPending(self, [work], [], peers, [])

    def wait_works(self, works: list[Any], peers: list[int]) -> None:
        """Wait for ``works`` (bounded by ``RINGTUNE_STALL_TIMEOUT`` when set); on a GPU,
        block until NCCL's stream has run them, so the backend's own stream may use the
        data (``Work.wait`` only orders torch's current stream after NCCL's)."""
        # One peer per work (a coalesced NCCL batch: every peer of the batch).
        each = [[p] for p in peers] if len(peers) == len(works) else [peers] * len(works)
        for w, who in zip(works, each):
            try:
                if self._stall is None:
                    w.wait()
                else:
                    w.wait(self._stall)
            except RuntimeError as exc:
                text = str(exc).lower()
                if self._stall is not None and ("timed out" in text or "timeout" in text):
                    self._stalled(who)
                # A peer that died closes its connections: name it (gloo names only an
                # address), so the line that ends the job says which rank went away.
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                raise PeerError(f"waiting on {self._names(who)}: {first}") from exc
        if self.gpu:
            self._torch.cuda.current_stream().synchronize()

    def _names(self, peers: list[int]) -> str:
        if not peers or -1 in peers:
            return "every other rank (the group's allreduce)"
        return "rank(s) " + ", ".join(str(self.world_ranks[p]) if 0 <= p < len(
            self.world_ranks) else str(p) for p in sorted(set(peers)))

    def _stalled(self, peers: list[int]) -> None:
        me = self.world_ranks[self.rank] if self.rank < len(self.world_ranks) else self.rank
        msg = (f"rank {me} ({socket.gethostname()}): no progress for {self._stall_s:g} s "
               f"waiting on {self._names(peers)}: the peer's process or host died, or the "
               f"link to it is down ({STALL_ENV}={self._stall_s:g})")
        import sys

        print(f"ringtune: stall: {msg}", file=sys.stderr, flush=True)
        raise StallError(msg)

    def native_allreduce(self, buf: Any, op: str) -> None:
        """The group's own ``allreduce`` of ``buf`` in place (gloo's or NCCL's)."""
        if self.gpu:
            self.backend.synchronize()
        if self.gpu:
            t = self._bytes(buf).view(self._dtypes[str(buf.dtype)])
            self.wait_works([self.group.allreduce([t], self._opts[op])], [-1])
            return
        if not buf.size:
            return  # nothing to reduce (and frombuffer refuses an empty buffer)
        # A tensor of its own over buf's memory (not a view: worker_safe holds it by one).
        t = self._torch.frombuffer(buf.reshape(-1).view("uint8"),
                                   dtype=self._dtypes[str(buf.dtype)])
        with worker_safe([t]):
            self.wait_works([self.group.allreduce([t], self._opts[op])], [-1])

    def sub(self, comm: Any) -> Transport:
        return make_torch_transport(comm, self.backend)


# torch is imported by the transport's constructor only, under the ``torch`` engine.
register_transport("torch", make_torch_transport, cls=TorchTransport)
