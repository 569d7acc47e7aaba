"""The registered ``torch.distributed`` backend ``ringtune``: every ``all_reduce`` of the job
runs the profile's choice, every other collective runs on gloo (CPU) or NCCL (CUDA).

Use it where a job talks through ``torch.distributed`` (torchrun, DDP, FSDP, plain
``dist.all_reduce``) and should get ringtune's tuned allreduce with no code change beyond
the backend name::

    import collectives.torch                       # registers "ringtune"
    dist.init_process_group("ringtune")            # or "cpu:ringtune,cuda:nccl" (torch >= 2.14)
    ddp = DistributedDataParallel(model)           # no comm hook needed

``all_reduce`` (SUM, AVG, PRODUCT, MIN, MAX; ``async_op=True`` too; the
``allreduce(tensors, opts)`` and ``allreduce(tensors, op)`` forms) of one dense tensor of a
dtype ringtune reduces (float16/32/64, int32/64; bfloat16 on CUDA) runs through a ringtune
``Communicator`` (``$RINGTUNE_PROFILE``, else the built-in defaults) on that communicator's
exchange thread, and the returned ``Work`` completes through a future (DDP reads
``get_future()``). Everything else is the delegate's, as the job would get it from
``init_process_group("gloo")`` / ``("nccl")``, stated once here rather than per call: the
other collectives (broadcast, all_gather, reduce_scatter, barrier, send/recv, …), and the
all_reduces ringtune has no algorithm for (bitwise ops, PREMUL_SUM, other dtypes, sparse or
several tensors per call).

Each group holds three of its own c10d groups, all made from the group's store: a gloo
group for the delegated collectives, another for ringtune's allreduce (its exchange thread
then never meets the caller's collectives on one group, so a broadcast on the calling
thread may run while an allreduce is in flight) and, on the first CUDA tensor, NCCL groups
for the same two roles.

Two shapes, chosen at run time by what the installed torch allows:
- torch >= 2.14 lets Python subclass ``torch.distributed.Backend`` (the ``PyBackend``
  trampoline): the creator returns a backend registered per device, so
  ``"cpu:ringtune,cuda:nccl"`` works (CPU all_reduces through ringtune, CUDA ones NCCL's).
- older torch (2.13 tested) only lets Python subclass ``ProcessGroup``: the creator's group
  replaces the whole process group, so the device-map form would drop its other devices;
  ``"ringtune"`` alone serves both devices itself.

Outside a launcher, torch's own ``env://`` rendezvous refuses before this backend is asked
(``environment variable RANK expected, but not set``); ``init_method``/``store`` given by
hand work as with any backend.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from ..mpi.launcher import launcher_rank

__all__ = ["BACKEND_NAME", "RingtuneBackendMixin", "python_backends", "register_backend"]

_log = logging.getLogger("ringtune")
#: Longest wait, in seconds, of ``shutdown``'s barrier (all ranks done with the inner
#: groups before any frees them); a rank that never arrives costs this, never a hang.
SHUTDOWN_BARRIER_S = 30.0

#: The name ``init_process_group`` takes (the contract).
BACKEND_NAME = "ringtune"

#: ``ReduceOp`` kinds ringtune runs, by its op names; others are delegated.
_RedOpType = dist.ReduceOp.RedOpType
RINGTUNE_OPS: dict[Any, str] = {_RedOpType.SUM: "sum", _RedOpType.AVG: "avg",
                                _RedOpType.PRODUCT: "prod", _RedOpType.MIN: "min",
                                _RedOpType.MAX: "max"}
#: Tensor dtypes ringtune reduces, per device kind (collectives.ops); others are delegated.
RINGTUNE_DTYPES: dict[str, frozenset[torch.dtype]] = {
    "cpu": frozenset({torch.float16, torch.float32, torch.float64, torch.int32, torch.int64}),
    "cuda": frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64,
                       torch.int32, torch.int64}),
}
#: A c10d method of the process group's surface -> the delegate's name for it where a
#: gloo/NCCL backend binds it under another name (torch 2.13 binds only the old names).
_ALIASES: dict[str, str] = {"all_gather_single": "_allgather_base",
                            "reduce_scatter_single": "_reduce_scatter_base",
                            "all_to_all_single": "alltoall_base",
                            "recvAnysource": "recv_anysource"}
#: Every collective passed to the delegate unchanged (both the ``ProcessGroup`` names that
#: ``torch.distributed``'s functions call and the ``Backend`` names c10d dispatches to).
DELEGATED: tuple[str, ...] = (
    "broadcast", "allreduce_coalesced", "allreduce_sparse", "reduce", "allgather",
    "_allgather_base", "all_gather_single", "allgather_coalesced",
    "all_gather_single_coalesced", "allgather_into_tensor_coalesced", "gather", "scatter",
    "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
    "reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced", "alltoall",
    "alltoall_base", "all_to_all_single", "send", "recv", "recv_anysource", "barrier",
    "monitored_barrier",
)

# The C++ backend class a Python backend must subclass before torch 2.14 (a whole
# ``ProcessGroup`` there): no public name for it (checked on torch 2.13.0 and 2.14.1).
_C10D_BACKEND: Any = torch._C._distributed_c10d.Backend  # noqa: SLF001
#: How many ringtune backends this process has made (``RingtuneBackendMixin._setup``).
_CREATIONS = itertools.count()
_registered = False
_register_lock = threading.Lock()


def python_backends() -> bool:
    """Whether this torch lets Python subclass ``torch.distributed.Backend`` (the
    ``PyBackend`` trampoline, torch >= 2.14): then ``ringtune`` is a per-device backend and
    ``"cpu:ringtune,cuda:nccl"`` works; else it is a whole ``ProcessGroup``."""
    try:
        type("_Probe", (_C10D_BACKEND,), {})(0, 1)
    except TypeError:  # "No constructor defined!": no trampoline in this build
        return False
    return True


def _reduce_op(opts: Any) -> Any:
    """The ``RedOpType`` of an ``allreduce`` call's second argument: ``AllreduceOptions``,
    a ``ReduceOp`` (the ``allreduce(tensors, op)`` form) or nothing (SUM)."""
    if opts is None:
        return _RedOpType.SUM
    op = opts if isinstance(opts, (dist.ReduceOp, _RedOpType)) else opts.reduceOp
    return op if isinstance(op, _RedOpType) else op.op


def _allreduce_options(opts: Any) -> Any:
    """``AllreduceOptions`` for the delegate from what the caller passed."""
    if isinstance(opts, dist.AllreduceOptions):
        return opts
    out = dist.AllreduceOptions()
    if opts is not None:
        out.reduceOp = opts
    return out


def _device_kind(args: Sequence[Any]) -> str:
    """``cuda`` when the first tensor among ``args`` (lists searched) is on a GPU, else
    ``cpu`` (also for a call without tensors, e.g. barrier)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device.type
        if isinstance(a, (list, tuple)):
            found = _first_tensor(a)
            if found is not None:
                return found.device.type
    return "cpu"


def _first_tensor(items: Sequence[Any]) -> torch.Tensor | None:
    for a in items:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)):
            found = _first_tensor(a)
            if found is not None:
                return found
    return None


def _ready_event(t: torch.Tensor) -> Any:
    """For a CUDA tensor: an event after the kernels queued on the calling thread's stream
    (the exchange thread waits for it before reading); ``None`` for a CPU tensor."""
    if not t.is_cuda:
        return None
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(t.device))
    return ev


def _delegated(name: str) -> Callable[..., Any]:
    def method(self: RingtuneBackendMixin, *args: Any, **kwargs: Any) -> Any:
        return self._delegate(name, args, kwargs)

    method.__name__ = name
    method.__doc__ = f"``{name}`` on the delegate of the tensors' device (gloo or NCCL)."
    return method


class _Lane:
    """ringtune's all_reduce for one device kind of a group: its ``Communicator``, that
    communicator's exchange thread, and what keeps calls in order.

    An asynchronous call (DDP's buckets, ``async_op=True``) is queued on the exchange
    thread and its ``Work`` completes from there. A synchronous call (``dist.all_reduce``'s
    default, which waits at once) runs on the calling thread when nothing is queued: the
    hand-off to a thread and back costs a wake-up each way, tens of µs on an idle core and
    milliseconds on a loaded one, for nothing when the caller waits anyway. Queued calls
    must run first (every rank reduces in the order it called), so ``submitted``/``done``
    count them: each is written by one thread only (the caller's, the exchange thread's),
    and ``lock`` keeps an inline call and a queued one from ever running at once."""

    __slots__ = ("comm", "ex", "submitted", "done", "lock")

    def __init__(self, comm: Any) -> None:
        from ..training.exchange import exchanger_for

        self.comm = comm
        self.ex = exchanger_for(comm)
        self.submitted = 0
        self.done = 0
        self.lock = threading.Lock()

    def run(self, t: torch.Tensor, op: str, tensors: list[torch.Tensor],
            ready: Any) -> list[torch.Tensor]:
        """Reduce ``t`` in place with the profile's choice (on either thread); the value is
        the tensor list, what DDP reads from the future."""
        with self.lock:
            if ready is not None:
                torch.cuda.set_device(t.device)  # a thread's current device starts at 0
                ready.synchronize()
            buf = t.detach()  # a parameter's .data may require grad; its storage counts
            if buf.is_contiguous():
                self.comm.allreduce(buf, op=op)
            else:
                dense = buf.contiguous()
                self.comm.allreduce(dense, op=op)
                buf.copy_(dense)
        return tensors

    def queued(self, t: torch.Tensor, op: str, tensors: list[torch.Tensor],
               ready: Any) -> list[torch.Tensor]:
        try:
            return self.run(t, op, tensors, ready)
        finally:
            self.done += 1

    def submit(self, fut: Any, t: torch.Tensor, op: str, tensors: list[torch.Tensor],
               asynchronous: bool) -> Any:
        """Reduce ``t`` inline or on the exchange thread (see the class docstring) and
        complete ``fut`` with ``tensors``."""
        ready = _ready_event(t)
        if not asynchronous and self.submitted == self.done:
            try:
                fut.set_result(self.run(t, op, tensors, ready))
            except BaseException as exc:  # noqa: BLE001 - delivered through the Work
                fut.set_exception(exc)
            return fut
        self.submitted += 1
        return self.ex.submit_to(fut, self.queued, t, op, tensors, ready)


class RingtuneBackendMixin:
    """What both shapes of the ``ringtune`` backend do (see the module docstring): the
    all_reduce through ringtune, the rest through the delegates. Mixed into a
    ``torch.distributed.Backend`` or ``ProcessGroup`` subclass below."""

    def _setup(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        # Keys of this backend's own groups: a name a group of an earlier backend of the same
        # group name used (re-initialised after destroy_process_group) would meet that
        # group's stale keys in the store. Every rank makes its backends in the same order,
        # so the n-th creation has the same number everywhere.
        self._keys = f"ringtune/{next(_CREATIONS)}"
        from ..communicator import Communicator
        from ..engines.torch import TorchComm

        self._rank, self._size = int(rank), int(size)
        self._store, self._timeout = store, timeout
        self._lock = threading.Lock()
        self._closed = False
        #: Per device kind: the c10d group that runs the delegated collectives.
        self._delegates: dict[str, Any] = {"cpu": self._gloo("delegate")}
        #: Per device kind: ringtune's Communicator, its exchange thread, the call order.
        self._comms: dict[str, _Lane] = {}
        # Made now, collectively, so a bad profile or world fails init_process_group on
        # every rank, before the first step.
        comm = Communicator(TorchComm(self._gloo("allreduce"),
                                      store=dist.PrefixStore(f"{self._keys}/sub/cpu", store),
                                      timeout=timeout))
        self._comms["cpu"] = _Lane(comm)

    # -- the groups ---------------------------------------------------------------------

    def _gloo(self, role: str) -> Any:
        return dist.ProcessGroupGloo(dist.PrefixStore(f"{self._keys}/{role}/cpu", self._store),
                                     self._rank, self._size, self._timeout)

    def _nccl(self, role: str) -> Any:
        if not torch.cuda.is_available():
            raise ValueError(f"rank {self._rank}: a CUDA tensor reached the ringtune backend "
                             "but CUDA is not available in this process")
        opts = dist.ProcessGroupNCCL.Options()
        # ``ProcessGroupNCCL.Options`` has no public timeout (torch 2.14.1).
        opts._timeout = self._timeout  # noqa: SLF001
        return dist.ProcessGroupNCCL(dist.PrefixStore(f"{self._keys}/{role}/cuda", self._store),
                                     self._rank, self._size, opts)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"rank {self._rank}: this ringtune process group was destroyed "
                             "(destroy_process_group); make a new one with "
                             "init_process_group or new_group")

    def _delegate_for(self, kind: str) -> Any:
        """The gloo (``cpu``) or NCCL (``cuda``) group for delegated collectives; the NCCL
        one is made on the first CUDA call (every rank makes the same calls, so every rank
        makes it at the same point)."""
        inner = self._delegates.get(kind)
        if inner is None:
            self._check_open()
            if kind != "cuda":
                raise ValueError(f"rank {self._rank}: the ringtune backend moves CPU tensors "
                                 f"(over gloo) and CUDA tensors (over NCCL), not {kind} "
                                 "tensors: use a backend of that device for them")
            with self._lock:
                inner = self._delegates.get(kind) or self._nccl("delegate")
                self._delegates[kind] = inner
        return inner

    def _ringtune_for(self, kind: str) -> _Lane:
        """ringtune's Communicator for tensors of device ``kind`` and its exchange thread
        (CUDA's made on the first CUDA all_reduce)."""
        got = self._comms.get(kind)
        if got is None:
            self._check_open()
            from ..communicator import Communicator
            from ..engines.torch import TorchComm

            with self._lock:
                got = self._comms.get(kind)
                if got is None:
                    comm = Communicator(TorchComm(
                        self._nccl("allreduce"),
                        store=dist.PrefixStore(f"{self._keys}/sub/cuda", self._store),
                        timeout=self._timeout))
                    got = _Lane(comm)
                    self._comms[kind] = got
        return got

    def _delegate(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        inner = self._delegate_for(_device_kind(args))
        fn = getattr(inner, name, None)
        if fn is None and name in _ALIASES:
            fn = getattr(inner, _ALIASES[name], None)
        if fn is None:
            raise NotImplementedError(
                f"rank {self._rank}: {name} is not offered by the {inner.name()} backend "
                "that the ringtune backend delegates it to")
        return fn(*args, **kwargs)

    # -- all_reduce ---------------------------------------------------------------------

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        """All-reduce through ringtune when it can (see the module docstring), else the
        delegate's. Returns a ``Work`` completed by ringtune's exchange thread."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        kind = _reduce_op(opts)
        op = RINGTUNE_OPS.get(kind)
        t = tensors[0] if len(tensors) == 1 else None
        if (op is None or t is None or t.layout != torch.strided
                or t.dtype not in RINGTUNE_DTYPES.get(t.device.type, ())):
            return self._delegate_for(_device_kind(tensors)).allreduce(
                tensors, _allreduce_options(opts))
        lane = self._ringtune_for(t.device.type)
        if t.is_cuda:
            fut: Any = torch.futures.Future(devices=[t.device])
        else:
            fut = torch.futures.Future()
        lane.submit(fut, t, op, tensors, bool(getattr(opts, "asyncOp", True)))
        return _create_work_from_future(fut)

    # -- the rest -----------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    @property
    def communicator(self) -> Any:
        """ringtune's ``Communicator`` of this group's CPU tensors (``explain``, ``plan_for``,
        ``profile``)."""
        return self._comms["cpu"].comm

    def shutdown(self) -> None:
        """``destroy_process_group``'s teardown (idempotent): finish the queued all_reduces
        and stop the exchange threads, wait until every rank has (a barrier on the gloo
        delegate, bounded by ``SHUTDOWN_BARRIER_S``), then drop every inner group here, on
        every rank at the same point.

        Without the barrier and the drop, a rank's inner gloo groups went when Python freed
        the backend: at the next ``init_process_group`` (the creator's ``_LAST`` held it
        until then) or during interpreter exit, each rank at its own moment, so a rank tore
        its gloo pairs down while its peer's were still live (or the peer had exited), and
        gloo's device thread could meet a pair in a state it enforces against: SIGABRT
        (``test_ringtune_group_again_after_destroy``, about 1 run in 14)."""
        if self._closed:
            return
        self._closed = True
        self._close_lanes()
        cpu = self._delegates.get("cpu")
        if cpu is not None and self._size > 1:
            opts = dist.BarrierOptions()
            opts.timeout = min(self._timeout, datetime.timedelta(seconds=SHUTDOWN_BARRIER_S))
            try:
                cpu.barrier(opts).wait()
            except RuntimeError as exc:  # a peer is gone: nothing left to wait for
                _log.warning("rank %d: ringtune backend shutdown: the ranks' barrier failed "
                             "(%s); freeing the groups anyway", self._rank, exc)
        self._release()

    def abort(self) -> None:
        """Free everything now, without waiting for the other ranks (a failed job)."""
        if self._closed:
            return
        self._closed = True
        self._close_lanes()
        self._release()

    def _close_lanes(self) -> None:
        for lane in self._comms.values():
            lane.comm.close()

    def _release(self) -> None:
        """Drop the inner groups (their gloo pairs close now) and forget being the
        creator's last backend."""
        global _LAST
        for lane in self._comms.values():
            inner = lane.comm.comm  # the TorchComm over the group this backend made
            inner.groups = {}
            inner.freed = True
        self._comms.clear()
        self._delegates.clear()
        if _LAST[1] is self:
            _LAST = (None, None)

    # Torch 2.14's PyBackend reads these properties back through the Python object, which
    # recurses into itself where a subclass does not define them: say what is true.
    @property
    def supports_splitting(self) -> bool:
        return False

    @property
    def supports_coalescing(self) -> bool:
        return False

    @property
    def supports_time_estimate(self) -> bool:
        return False

    @property
    def supports_shrinking(self) -> bool:
        return False

    @property
    def supports_reconfigure(self) -> bool:
        return False

    @property
    def supports_window(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<ringtune backend rank {self._rank} of {self._size}>"


for _name in DELEGATED:
    setattr(RingtuneBackendMixin, _name, _delegated(_name))


class RingtuneProcessGroup(RingtuneBackendMixin, dist.ProcessGroup):  # type: ignore[misc]
    """The ``ringtune`` group as a whole ``ProcessGroup`` (torch without Python backends)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        dist.ProcessGroup.__init__(self, rank, size)
        self._setup(store, rank, size, timeout)
        self._map_checked = False
        self._map_error = ""

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        if not self._map_checked:
            self._check_device_map()
        if self._map_error:
            raise ValueError(self._map_error)
        return RingtuneBackendMixin.allreduce(self, tensors, opts)

    def _check_device_map(self) -> None:
        """This torch made the whole group ours even if the job asked for a device map
        (``"cpu:ringtune,cuda:nccl"``), dropping the other devices' backends: refuse that on
        the first all_reduce, on every rank (all were given the same string), rather than
        serve CUDA tensors other than as asked."""
        self._map_checked = True
        try:
            config = str(dist.get_backend_config(self))
        except (RuntimeError, ValueError, KeyError):
            return  # not registered with the default group: nobody asked for a map
        others = sorted({part.split(":", 1)[1].strip() for part in config.split(",")
                         if ":" in part} - {BACKEND_NAME})
        if others:
            self._map_error = (
                f"rank {self._rank}: init_process_group({config!r}) mixes ringtune with "
                f"{', '.join(others)}, which needs torch >= 2.14 (Python backends; this is "
                f"torch {torch.__version__}): use init_process_group('ringtune'), which "
                "serves CUDA tensors too (all_reduce through ringtune, the rest NCCL's)")

    def _get_backend(self, device: Any) -> Any:
        """The delegate serving ``device`` (torch asks it, e.g. whether send/recv batches
        coalesce)."""
        return self._delegate_for(torch.device(device).type)


@functools.lru_cache(maxsize=1)
def _backend_class() -> type:
    class RingtuneBackend(RingtuneBackendMixin, _C10D_BACKEND):  # type: ignore[misc,valid-type]
        """The ``ringtune`` backend registered per device (torch with Python backends)."""

        def __init__(self, store: Any, rank: int, size: int,
                     timeout: datetime.timedelta) -> None:
            _C10D_BACKEND.__init__(self, rank, size)
            self._setup(store, rank, size, timeout)

    return RingtuneBackend


#: The last group being built and the backend made for it: torch >= 2.14 asks the creator
#: once per device of one group, passing that group (``opts.process_group``) each time,
#: and every ask must get the same object. Keyed by the group object itself, not its name:
#: a name comes back after ``destroy_process_group`` (the next default group is "0" again)
#: and must then get a new backend over the new store. Older torch asks once per group.
_LAST: tuple[Any, Any] = (None, None)


def _create(opts: Any, backend_options: Any = None) -> Any:
    """``register_backend``'s creator (extended API): the ``ringtune`` group or backend of
    one process group (the same object for each device torch asks it for)."""
    global _LAST
    building = getattr(opts, "process_group", None)
    if building is not None and _LAST[0] is building:
        return _LAST[1]
    cls = _backend_class() if python_backends() else RingtuneProcessGroup
    timeout = opts.timeout
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    made = cls(opts.store, opts.group_rank, opts.group_size, timeout)
    _LAST = (building, made) if building is not None else (None, None)
    return made


def register_backend() -> None:
    """Register ``ringtune`` with ``torch.distributed`` (idempotent; ``import
    collectives.torch`` calls it)."""
    global _registered
    with _register_lock:
        if _registered:
            return
        if not dist.is_available():
            raise ImportError(f"rank {launcher_rank()}: this torch has no torch.distributed: "
                              "the ringtune backend needs it (install a torch build with "
                              "distributed support)")
        from ..engines.torch import missing_torch_feature

        missing = missing_torch_feature()
        if missing:
            raise ImportError(f"rank {launcher_rank()}: {missing}")
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                      devices=["cpu", "cuda"])
        _registered = True
