"""The ``torch`` engine: ``torch.distributed`` process groups, for jobs started by torchrun
(or any launcher that initialises ``torch.distributed``).

Use it through ``Communicator(torch.distributed.group.WORLD)`` or ``Communicator(group)``
for a group from ``new_group``; a process group built without the default group (a
backend creator's private ``dist.ProcessGroupGloo(PrefixStore(...), rank, size, timeout)``)
comes in as ``Communicator(TorchComm(pg, store=store))``: its sub-groups need the store.

``TorchComm`` gives the runtime the part of mpi4py's ``Comm`` it uses (``Get_rank``,
``Get_size``, ``allgather``, ``bcast``, ``Barrier``, ``Split``, ``Dup``, ``Free``) over a
group, so the ``Communicator``, the algorithms and the probes run unchanged; bytes move
through the ``torch`` transport (``collectives.transports.torch``): gloo for CPU buffers,
NCCL for CUDA buffers. Everything here calls the process group's own methods
(``pg.allgather``, ``pg.send``…) with ranks *of the group*, never the ``dist.*`` functions,
which take world ranks and know only groups registered with the default group.

Sub-groups (``Split``, for the hierarchical grid) and duplicates (``Dup``, for separate
exchange channels) are new gloo (CPU) and NCCL (CUDA) backends built from the job's store
under a ``PrefixStore`` that rank 0 names and every member learns in the ``Split``'s own
allgather. Not ``new_group``: it is collective over the whole default group (every world
rank, same order), while ``Split`` is called only by the members of the communicator being
split (a sub-communicator's ranks); ``use_local_synchronization=True`` lifts that but still
needs the default group, which a backend creator's private group runs before; and a
``PrefixStore`` group is what torch itself does under ``new_group``. The store is the one
given, else the default group's.

Importing this module does not import torch: the engine claims only objects of torch's
modules, which exist only once torch is imported.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .base import Engine
from .registry import register_engine
from .torch_checks import (  # noqa: F401 - re-exported: where callers found them
    TORCH_ENV,
    TORCH_FLOOR,
    launch_refusal,
    missing_torch_feature,
    torch_available,
)

#: Backends ringtune moves bytes over, per device kind: gloo for CPU memory, NCCL for CUDA.
MOVERS: dict[str, str] = {"cpu": "gloo", "cuda": "nccl"}
#: Seconds a sub-group's rendezvous and operations may take (torch's own default for gloo:
#: 30 min) unless ``TorchComm(timeout=...)`` says otherwise.
DEFAULT_TIMEOUT_S = 1800.0
#: ``os._exit`` as it was at import, before ``collectives.plumbing.abort.name_abrupt_exits``
#: wraps it with a line meant for exits ringtune did not choose.
_REAL_EXIT = os._exit
#: Reduction op names to ``dist.ReduceOp`` attribute names (``avg`` reduces with SUM, then
#: the communicator divides).
REDUCE_OPS: dict[str, str] = {"sum": "SUM", "avg": "SUM", "prod": "PRODUCT", "min": "MIN",
                              "max": "MAX"}


#: Seconds ``worker_safe`` waits, at most, for gloo's worker threads to drop a finished
#: collective's tensors.
LET_GO_S = 5.0


@contextlib.contextmanager
def worker_safe(tensors: Sequence[Any]) -> Iterator[None]:
    """Run a gloo *collective* (``allreduce``, ``allgather``…) on CPU ``tensors`` made in
    Python (each not a view: a ``from_numpy``/``frombuffer``/factory tensor) inside this
    block, waiting for its ``Work`` and dropping it there; on leaving, it returns once
    gloo's worker thread has let go of them.

    Why: a gloo worker drops its work, and the tensors in it, just *after* marking it
    done, so ``wait()`` returns first; and torch keeps a tensor's Python object alive
    while C++ holds the tensor, so the drop that leaves only the Python object takes the
    GIL to release it. Done by the worker after the interpreter began to finalize (a job's
    last collective, then exit, on a loaded machine), CPython ends the worker with
    ``pthread_exit``, the C++ unwinder meets a ``noexcept`` frame and the process aborts
    after its work is done ("terminate called without an active exception", SIGABRT; a
    core's backtrace: ``~AsyncWork`` → ``decref_pyobject`` → ``take_gil`` →
    ``PyThread_exit_thread``). So each tensor gets a view that holds it from C++ for the
    block's length (the worker's drop is then never the last but the Python object's), the
    exit waits until the worker's references are gone, and then drops the views on this
    thread, with the GIL. Point-to-point works (``send``/``recv``) need none of this: only
    the caller's ``Work`` holds their tensors. Costs a view per tensor and one
    ``_use_count()`` each when the worker is done already; the wait is bounded by
    ``LET_GO_S``."""
    keep = [t.view(t.shape) for t in tensors]
    # torch has no public reference count: ``_use_count`` is the only way to see that the
    # gloo worker dropped its references (checked on torch 2.13.0 and 2.14.1).
    alone = [t._use_count() for t in tensors]  # noqa: SLF001 - see above
    yield  # an exception leaves at once: the job is ending on an error anyway
    deadline = time.monotonic() + LET_GO_S
    while (any(t._use_count() > n for t, n in zip(tensors, alone))  # noqa: SLF001
           and time.monotonic() < deadline):
        time.sleep(0)  # frees the GIL and the core for the worker
    del keep


def _safe(dev: Any, tensors: Sequence[Any]) -> contextlib.AbstractContextManager[None]:
    """``worker_safe`` for gloo (CPU) tensors; nothing for NCCL's, whose works are held
    by its own watchdog (waiting for that would cost every call its polling period)."""
    return worker_safe(tensors) if dev.type == "cpu" else contextlib.nullcontext()


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _world_size() -> int:
    """The default group's size (0 before ``init_process_group``)."""
    dist = _dist()
    return int(dist.get_world_size()) if dist.is_initialized() else 0


def _rank_hint() -> str:
    """This process's rank for a message written before a group is known."""
    from ..mpi.launcher import launcher_rank

    return str(launcher_rank())


def backends_of(group: Any) -> dict[str, str]:
    """The backend name serving each device kind of ``group`` (``{"cpu": "gloo"}``,
    ``{"cpu": "gloo", "cuda": "nccl"}``…). A ``ProcessGroup`` lists its devices; a bare
    c10d backend (``ProcessGroupGloo``/``ProcessGroupNCCL`` built from a store) serves the
    device its name implies."""
    get = getattr(group, "_get_backend", None)
    if get is None:
        name = str(group.name()).lower()
        return {"cuda": name} if name == "nccl" else {"cpu": name}
    import torch

    out: dict[str, str] = {}
    for dev in getattr(group, "_device_types", ()):
        try:
            out[dev.type] = str(get(torch.device(dev.type)).name()).lower()
        except (RuntimeError, ValueError):
            continue  # no backend registered for that device
    if not out:
        name = str(group.name()).lower()
        out = {"cuda": name} if name == "nccl" else {"cpu": name}
    return out


def describe_backends(backends: dict[str, str]) -> str:
    """``gloo`` when every device has the same backend, else ``cpu:gloo,cuda:nccl``."""
    names = set(backends.values())
    if len(names) == 1:
        return names.pop()
    return ",".join(f"{d}:{b}" for d, b in sorted(backends.items()))


def _timeout_of(group: Any) -> datetime.timedelta | float:
    """The group's own operation timeout (what ``init_process_group(timeout=...)`` set),
    so ringtune's sub-groups give up when the user's group would; else the default."""
    import torch

    backend = group
    if hasattr(group, "_get_backend"):
        for dev in ("cpu", "cuda"):
            try:
                # No public way to the backend object that holds its options (its
                # timeout): ``_get_backend`` (checked on torch 2.13.0 and 2.14.1).
                backend = group._get_backend(torch.device(dev))  # noqa: SLF001
                break
            except (RuntimeError, ValueError):
                continue
    try:
        found = backend.options._timeout  # noqa: SLF001 - torch 2.14.1: no public one
    except (AttributeError, RuntimeError):
        return DEFAULT_TIMEOUT_S
    return found if isinstance(found, datetime.timedelta) else DEFAULT_TIMEOUT_S


def _op_name(op: Any) -> str:
    """A reduction's name from a name or an mpi4py op (mpi4py is imported only when the
    caller already passed one of its ops)."""
    if isinstance(op, str):
        if op not in REDUCE_OPS:
            raise ValueError(f"reduction {op!r}: use one of {', '.join(REDUCE_OPS)}")
        return op
    if type(op).__module__.startswith("mpi4py"):
        from mpi4py import MPI

        for name, mop in (("sum", MPI.SUM), ("prod", MPI.PROD), ("min", MPI.MIN),
                          ("max", MPI.MAX)):
            if op == mop:
                return name
    raise ValueError(f"reduction {op!r}: use one of sum, prod, min, max")


class TorchComm:
    """mpi4py's communicator surface over a ``torch.distributed`` process group (see the
    module docstring). ``group``: a ``ProcessGroup`` (``group.WORLD``, ``new_group``) or a
    c10d backend built from a store; ``store``: where sub-groups rendezvous (default: the
    default group's store); ``timeout``: for sub-groups' rendezvous and operations."""

    def __init__(self, group: Any, store: Any = None,
                 timeout: datetime.timedelta | float | None = None) -> None:
        if group is None:
            raise TypeError(
                f"rank {_rank_hint()}: no process group (None): torch.distributed."
                "group.WORLD is None until torch.distributed.init_process_group has run")
        if isinstance(group, TorchComm):
            raise TypeError("TorchComm over a TorchComm: pass the process group itself")
        self.group = group
        self.rank: int = int(group.rank())
        self.size: int = int(group.size())
        if self.rank < 0:
            raise ValueError(
                f"rank {_rank_hint()}: this process is not a member of the process group "
                "it was given: build the Communicator only on the group's members (new_group "
                "returns a group on every rank; use it where dist.get_rank(group) >= 0)")
        self.backends: dict[str, str] = backends_of(group)
        #: The group serving each device kind (a split's are its own new backends).
        self.groups: dict[str, Any] = dict.fromkeys(self.backends, group)
        self._store = store
        if timeout is None:
            timeout = _timeout_of(group)
        self.timeout = (timeout if isinstance(timeout, datetime.timedelta)
                        else datetime.timedelta(seconds=float(timeout)))
        ranks = self._world_ranks(group)
        #: World rank of each rank of this communicator, where known (error lines).
        self.world_ranks: tuple[int, ...] = ranks or tuple(range(self.size))
        #: ``WORLD`` for the default group (or a group that spans its ranks, or a bare
        #: backend, which is its own world), ``group`` for a sub-group from ``new_group``.
        self.label = "group" if ranks is not None and self.size < _world_size() else "WORLD"
        self.freed = False
        self._owned = False  # its groups are ringtune's own (a Split/Dup): Free drops them

    @staticmethod
    def _world_ranks(group: Any) -> tuple[int, ...] | None:
        """The default group's rank of each rank of ``group``; ``None`` where ``group`` is
        not registered with a default group (a creator's private group)."""
        try:
            dist = _dist()
            if dist.is_initialized() and hasattr(group, "_get_backend"):
                return tuple(int(r) for r in dist.get_process_group_ranks(group))
        except (RuntimeError, ValueError, KeyError):
            pass
        return None

    # -- what the runtime asks ------------------------------------------------------

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self.rank

    def Get_size(self) -> int:  # noqa: N802 - mpi4py's name
        return self.size

    @property
    def backend_label(self) -> str:
        """The group's backend(s) as people write them (``gloo``, ``cpu:gloo,cuda:nccl``)."""
        return describe_backends(self.backends)

    def object_device(self) -> tuple[Any, Any]:
        """(group, device) for the small object collectives: CPU where the group has a
        CPU backend, else its GPU (an NCCL-only group)."""
        import torch

        self._check_live()
        if "cpu" in self.groups:
            return self.groups["cpu"], torch.device("cpu")
        return self.groups["cuda"], torch.device("cuda", torch.cuda.current_device())

    def _check_live(self) -> None:
        if self.freed:
            raise ValueError(f"rank {self.rank}: this communicator ({self.label}) was freed")

    def allgather(self, value: Any) -> list[Any]:
        """Everyone's picklable ``value``, in rank order (two allgathers: lengths, bytes)."""
        if self.size == 1:
            self._check_live()
            return [value]
        import torch

        group, dev = self.object_device()
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        length = torch.tensor([len(data)], dtype=torch.int64, device=dev)
        lengths = [torch.empty_like(length) for _ in range(self.size)]
        with _safe(dev, [length, *lengths]):
            group.allgather([lengths], [length]).wait()
        sizes = [int(t.item()) for t in lengths]
        mine = torch.zeros(max(sizes), dtype=torch.uint8)
        if data:
            mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        mine = mine.to(dev)
        outs = [torch.empty_like(mine) for _ in range(self.size)]
        with _safe(dev, [mine, *outs]):
            group.allgather([outs], [mine]).wait()
        return [pickle.loads(o[:n].cpu().numpy().tobytes()) for o, n in zip(outs, sizes)]

    def bcast(self, value: Any, root: int = 0) -> Any:
        """Rank ``root``'s ``value`` on every rank."""
        return self.allgather(value if self.rank == root else None)[root]

    def Barrier(self) -> None:  # noqa: N802 - mpi4py's name
        """Every rank has reached this call (an allreduce of one element, which every
        backend has; NCCL's own barrier needs device ids)."""
        if self.size == 1:
            return
        import torch

        group, dev = self.object_device()
        one = torch.ones(1, dtype=torch.int32, device=dev)
        with _safe(dev, [one]):
            group.allreduce([one]).wait()
        if dev.type == "cuda":
            one.cpu()  # the wait queued the stream behind NCCL: block until it ran

    barrier = Barrier

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = "sum") -> None:  # noqa: N802
        """mpi4py's ``Allreduce`` of host arrays (timings, counts): ``sendbuf`` an array or
        ``MPI.IN_PLACE``; ``op`` a name (sum/prod/min/max) or an mpi4py op."""
        arr = recvbuf[0] if isinstance(recvbuf, (list, tuple)) else recvbuf
        if isinstance(sendbuf, np.ndarray) and sendbuf is not arr:
            arr[...] = sendbuf
        self.reduce_host(arr, _op_name(op))

    def allreduce(self, value: Any, op: Any = "sum") -> Any:
        """mpi4py's lower-case ``allreduce`` of a number or a host array (a new result)."""
        arr = np.array(value, copy=True)
        self.reduce_host(arr.reshape(-1) if arr.ndim else arr.reshape(1), _op_name(op))
        return arr.item() if np.ndim(value) == 0 else arr

    def reduce_host(self, arr: np.ndarray, op: str) -> None:
        """Allreduce the host array ``arr`` in place with ``op`` over the group (on its
        device: gloo's CPU or NCCL's GPU): the engine's ``allreduce_array`` (timings)."""
        if self.size == 1:
            self._check_live()
            return
        import torch
        import torch.distributed as dist

        group, dev = self.object_device()
        t = torch.from_numpy(np.ascontiguousarray(arr)).to(dev)
        opts = dist.AllreduceOptions()
        opts.reduceOp = getattr(dist.ReduceOp, REDUCE_OPS[op])
        with _safe(dev, [t]):
            group.allreduce([t], opts).wait()
        arr[...] = t.cpu().numpy().reshape(arr.shape)

    # -- blocking point-to-point of host arrays (the link probes: probes.links) ----------

    def _host_group(self) -> Any:
        self._check_live()
        group = self.groups.get("cpu")
        if group is None or self.backends.get("cpu") != "gloo":
            raise ValueError(
                f"rank {self.rank}: point-to-point of host arrays needs a gloo backend, and "
                f"this group's is {self.backend_label}: use init_process_group("
                "'cpu:gloo,cuda:nccl') or a gloo group")
        return group

    @staticmethod
    def _tensor(buf: Any) -> Any:
        import torch

        arr = np.ascontiguousarray(buf[0] if isinstance(buf, (list, tuple)) else buf)
        return torch.from_numpy(arr.reshape(-1).view(np.uint8))

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802
        """Blocking send of a host array to rank ``dest`` of this group."""
        self._host_group().send([self._tensor(buf)], dest, tag).wait()

    def Recv(self, buf: Any, source: int, tag: int = 0) -> None:  # noqa: N802
        """Blocking receive into a contiguous host array from rank ``source``."""
        self._host_group().recv([self._tensor(buf)], source, tag).wait()

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0,  # noqa: N802
                 recvbuf: Any = None, source: int = 0, recvtag: int = 0) -> None:
        """Send ``sendbuf`` to ``dest`` while receiving ``recvbuf`` from ``source``."""
        group = self._host_group()
        recv = group.recv([self._tensor(recvbuf)], source, recvtag)
        send = group.send([self._tensor(sendbuf)], dest, sendtag)
        recv.wait()
        send.wait()

    def Split(self, color: int = 0, key: int = 0) -> TorchComm | None:  # noqa: N802
        """The ranks that pass the same ``color``, ranked by ``key`` (then rank), as a new
        communicator with its own groups; ``None`` for a negative color (MPI.UNDEFINED).
        Collective over this communicator."""
        token = uuid.uuid4().hex[:16] if self.rank == 0 else None
        everyone = self.allgather((int(color), int(key), token))
        name = everyone[0][2]
        if color < 0:
            return None  # MPI.UNDEFINED (negative): in no group, as MPI's COMM_NULL
        mine = sorted((k, r) for r, (c, k, _) in enumerate(everyone) if c == color)
        members = [r for _, r in mine]
        return self._child(f"ringtune/{name}/{color}", members)

    def Dup(self) -> TorchComm:  # noqa: N802 - mpi4py's name
        """The same ranks in their own groups (a separate channel: its messages never meet
        this communicator's). Collective over this communicator."""
        token = uuid.uuid4().hex[:16] if self.rank == 0 else None
        name = self.bcast(token)
        return self._child(f"ringtune/{name}/dup", list(range(self.size)))

    def _child(self, prefix: str, members: list[int]) -> TorchComm:
        dist = _dist()
        store = self.store()
        rank, size = members.index(self.rank), len(members)
        groups: dict[str, Any] = {}
        if self.backends.get("cpu") == "gloo":
            groups["cpu"] = dist.ProcessGroupGloo(dist.PrefixStore(f"{prefix}/cpu", store),
                                                  rank, size, self.timeout)
        if self.backends.get("cuda") == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            # ``ProcessGroupNCCL.Options`` has no public timeout (torch 2.14.1).
            opts._timeout = self.timeout  # noqa: SLF001
            groups["cuda"] = dist.ProcessGroupNCCL(dist.PrefixStore(f"{prefix}/cuda", store),
                                                   rank, size, opts)
        if not groups:
            raise ValueError(
                f"rank {self.rank}: cannot make a sub-group of a torch.distributed group whose "
                f"backend is {self.backend_label}: ringtune makes its own from gloo (CPU) or "
                "NCCL (CUDA); build the Communicator over a gloo or NCCL group")
        child = object.__new__(TorchComm)
        child.group = next(iter(groups.values()))
        child.rank, child.size = rank, size
        child.backends = {d: MOVERS[d] for d in groups}
        child.groups = groups
        child._store = store
        child.timeout = self.timeout
        child.world_ranks = tuple(self.world_ranks[m] for m in members)
        child.label = f"{self.label}/{prefix.rsplit('/', 2)[-1]}"
        child.freed = False
        child._owned = True
        return child

    def store(self) -> Any:
        """The store sub-groups rendezvous through: the one given, else the default
        group's; ``ValueError`` naming the fix when there is none."""
        if self._store is not None:
            return self._store
        dist = _dist()
        if dist.is_initialized():
            from torch.distributed import distributed_c10d

            # The default group's store has no public getter (torch 2.14.1).
            self._store = distributed_c10d._get_default_store()  # noqa: SLF001
            return self._store
        raise ValueError(
            f"rank {self.rank}: a sub-group of this process group needs a store (there is no "
            "default group to borrow one from): pass it, "
            "Communicator(TorchComm(pg, store=store))")

    def Free(self) -> None:  # noqa: N802 - mpi4py's name
        """Release this communicator: its own groups (a Split's, a Dup's) are dropped; a
        group the user gave stays theirs."""
        self.freed = True
        if self._owned:
            self.groups = {}


class TorchEngine(Engine):
    """``torch.distributed`` process groups (see the module docstring)."""

    name = "torch"
    claim_order = 10
    thread_levels = False  # process groups may be called from the exchange thread
    launcher = "torchrun"
    cli_help = ("torch (torch.distributed from torchrun's environment; gloo, NCCL for GPU "
                "buffers)")

    def detect(self) -> bool:
        from ..mpi.launcher import under_torchrun

        return under_torchrun()

    def cli_refusal(self, verb: str, np: int | None) -> str | None:
        return launch_refusal(verb, np)

    def world(self, gpu: bool = False) -> TorchComm:
        """A ``TorchComm`` over the default process group, initialised here from the
        launcher's environment when the process has none yet (``gloo``;
        ``cpu:gloo,cuda:nccl`` for GPU buffers)."""
        dist = _dist()
        if not dist.is_initialized():
            dist.init_process_group("cpu:gloo,cuda:nccl" if gpu else "gloo")
        return TorchComm(dist.group.WORLD)

    def close_world(self) -> None:
        """End the default process group ``world`` started."""
        dist = _dist()
        if dist.is_initialized():
            dist.destroy_process_group()

    def retune_hint(self, size: int) -> str:
        return ("re-tune here with `torchrun --nproc-per-node N --no-python ringtune "
                f"tune` ({size} ranks in all)")

    def version(self) -> str | None:
        import torch

        return str(torch.__version__)

    def claims(self, obj: Any) -> bool:
        if isinstance(obj, TorchComm):
            return True
        return (type(obj).__module__.startswith("torch")
                and all(callable(getattr(obj, m, None))
                        for m in ("rank", "size", "allreduce", "send", "recv")))

    def communicator(self, obj: Any) -> TorchComm:
        return obj if isinstance(obj, TorchComm) else TorchComm(obj)

    def check_world(self, comm: Any) -> None:
        """A group whose backends ringtune cannot move bytes over is refused at once, on
        every rank (every rank sees the same backends)."""
        if not any(MOVERS.get(d) == b for d, b in comm.backends.items()):
            raise ValueError(
                f"rank {comm.rank}: ringtune cannot move bytes over a torch.distributed group "
                f"whose backend is {comm.backend_label}: it runs over gloo (CPU tensors) and "
                "NCCL (CUDA tensors); build the Communicator over such a group, e.g. "
                "dist.new_group(backend='gloo'), or init_process_group('cpu:gloo,cuda:nccl')")

    def host_name(self, comm: Any) -> str:
        return socket.gethostname()

    def world_rank(self, comm: Any) -> int | None:
        ranks = getattr(comm, "world_ranks", ())
        if len(ranks) == comm.Get_size():
            world = ranks[comm.Get_rank()]
            return world if world != comm.Get_rank() else None
        return None

    def abort(self, comm: Any, code: int) -> None:
        # No MPI_Abort here: this rank exits, which closes its connections, so every peer's
        # next operation with it fails; torchrun's agent then stops the other workers.
        _REAL_EXIT(code)

    def transports(self) -> tuple[str, ...]:
        return ("torch",)

    def default_transport(self, comm: Any, backend: Any) -> str:
        return "torch"

    def allreduce_array(self, comm: Any, arr: np.ndarray, op: str) -> None:
        comm.reduce_host(arr, op)

    def describe(self, comm: Any) -> dict[str, str]:
        return {"engine": self.name, "backend": describe_backends(comm.backends)}


TORCH_ENGINE = register_engine(TorchEngine())

__all__ = ["TorchComm", "TorchEngine", "TORCH_ENGINE", "TORCH_FLOOR", "MOVERS", "backends_of",
           "describe_backends", "missing_torch_feature", "torch_available"]
