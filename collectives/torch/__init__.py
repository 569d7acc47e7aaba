"""A DDP communication hook that averages gradient buckets with ringtune.

Use it in place of DDP's own allreduce (three lines; ``comm`` must not be used by your own
code concurrently, hence the ``Dup``)::

    from collectives import Communicator
    from collectives.torch import HookState, ddp_hook
    ddp_model.register_comm_hook(HookState(Communicator(MPI.COMM_WORLD.Dup())), ddp_hook)

``ddp_hook`` hands each ``GradBucket`` to the communicator's communication thread
(``collectives.training.exchange``) and returns at once with a ``torch.futures.Future``; the thread
averages the bucket with the profile's choice for its size while backward computes the
next bucket, then completes the future. An error on that thread fails the future, so
``loss.backward()`` raises on the training thread instead of hanging. DDP with the gloo
process group (CPU tensors) is what the tests run; CUDA buckets (NCCL process group) go to
ringtune's GPU backend in the same way, ordered after the gradient kernels by an event (not
verified here: no GPU).

CPU cores shared by ranks: MPICH busy-polls while the communication thread waits, taking the
core backward needs; start MPI with ``collectives.training.exchange.QUIET_PROGRESS_ENV`` in the
environment (MPICH then sleeps after empty polls) where compute and communication share
cores, e.g. ``os.environ.update(QUIET_PROGRESS_ENV)`` before ``from mpi4py import MPI``.

Modes (``HookState(comm, staleness=..., average_every=...)``; both off by default):
- ``staleness=1``: step t applies the average of step t-1's gradients, while step t's are
  exchanged behind step t+1's forward and backward (the first step applies zeros). Every
  rank applies the same update, so parameters stay identical across ranks.
- ``average_every=H`` (local SGD): gradients are not exchanged; each rank steps on its own
  gradients and ``state.average_parameters(model.parameters())`` after ``optimizer.step()``
  averages the parameters every H-th step (call it every step).

Online tuning (``HookState(comm, tune="online", tune_out=FILE)``, or the communicator's own
``RINGTUNE_TUNE=online``): each bucket size's algorithm is chosen on the job's first steps
and kept (``collectives.online``); buckets of a size still exploring take the full path,
settled ones the cached plan. Every rank must pass the same tuning arguments.

Channels (``HookState(comm, channels=2)``, off by default): bucket i is averaged on
channel i % 2, each channel a duplicate of ``comm`` with its own communication thread, so
that two buckets are in flight at once: on a tiered cluster one bucket's inter-host phase
runs while the next one's intra-host phase uses the cores. Needs ``MPI_THREAD_MULTIPLE``.

The first time a bucket layout is seen the ranks compare it (one small allgather on the
communication thread): ranks whose models differ fail together with the layouts named,
instead of reducing mismatched buckets.

The package is ringtune's PyTorch integration, needing torch to import: this module (the
DDP hook) and ``backend`` (the registered ``torch.distributed`` backend ``ringtune``, which
importing this package registers). ``collectives.tensors`` (tensors as buffers) stays
outside: the communicator uses it without torch, and a module here would import torch.
"""

from __future__ import annotations

from concurrent.futures import Future as _CFuture
from typing import Any

from ..tensors import as_buffer, rank_label

try:
    import torch
    import torch.distributed
except ImportError as _exc:  # the torch API without torch: one line with the fix
    raise ImportError(f"rank {rank_label()}: collectives.torch needs PyTorch ({_exc}); install it "
                      "with `pip install 'ringtune[torch]'` (or `make .venv-torch/.installed`)"
                      ) from None

from ..errors import AgreementError, require_agreement
from ..plan import plan_key as _plan_key
from ..training.exchange import exchanger_for

__all__ = ["HookState", "ddp_hook"]

#: Most exchange channels of one ``HookState`` (communication threads each with a
#: duplicate communicator; more than a few only add threads competing for the cores).
MAX_CHANNELS = 8


def _ready_event(t: Any) -> Any:
    """On the thread that queued the work writing ``t`` (DDP's autograd thread): an event
    after it on that thread's current stream, or ``None`` for a CPU tensor."""
    if not t.is_cuda:
        return None
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(t.device))
    return ev


def _on_comm_thread(t: Any, ready: Any) -> None:
    """On the communication thread, before a CUDA tensor is read: make its GPU the current
    device (CUDA's current device belongs to each host thread, and this thread starts on
    device 0; the GPU backend refuses a mismatch) and wait until the kernels that wrote it
    have run (they were queued on another thread's stream, which the backend's stream knows
    nothing of)."""
    if ready is None:
        return
    torch.cuda.set_device(t.device)
    ready.synchronize()


def _check_ddp_world(comm: Any) -> None:
    """DDP's default process group and the communicator must span the same ranks, or the
    hook would average over another world (a 1-rank MPI world under torchrun averages
    nothing): ``WorldMismatchError`` on every rank, before the first step."""
    from ..errors import WorldMismatchError

    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    if getattr(comm.comm, "label", "") == "group":
        # A new_group the user chose (collectives.engines.torch): DDP may run over that same
        # group (DDP(process_group=...)), which the hook cannot see; WORLD, an MPI world
        # and ringtune's own sub-groups are checked.
        return
    world = dist.get_world_size()
    if world != comm.size:
        raise WorldMismatchError(
            f"rank {dist.get_rank()}: DDP's process group has {world} ranks but the "
            f"Communicator has {comm.size}: build the Communicator over the same ranks "
            "(Communicator(torch.distributed.group.WORLD) under torchrun, "
            "Communicator(MPI.COMM_WORLD.Dup()) under mpiexec)")


class HookState:
    """State of ``ddp_hook``: the ``Communicator``, its communication thread, the mode."""

    def __init__(self, comm: Any, staleness: int = 0, average_every: int = 1,
                 channels: int = 1, tune: str | None = None, tune_out: Any = None,
                 tune_options: Any = None) -> None:
        from ..communicator import Communicator

        if not isinstance(comm, Communicator):
            raise TypeError(f"rank {rank_label()}: HookState needs a collectives.Communicator, "
                            f"got {type(comm).__name__}: wrap it, HookState(Communicator(comm))")
        if staleness not in (0, 1):
            raise ValueError(f"rank {comm.rank}: staleness must be 0 or 1, got {staleness!r}")
        if isinstance(average_every, bool) or not isinstance(average_every, int) \
                or average_every < 1:
            raise ValueError(f"rank {comm.rank}: average_every must be an integer ≥ 1, got "
                             f"{average_every!r}")
        if staleness and average_every > 1:
            raise ValueError(f"rank {comm.rank}: choose staleness=1 or average_every>1, not "
                             "both")
        if isinstance(channels, bool) or not isinstance(channels, int) \
                or not 1 <= channels <= MAX_CHANNELS:
            raise ValueError(f"rank {comm.rank}: channels must be an integer 1..{MAX_CHANNELS},"
                             f" got {channels!r}")
        _check_ddp_world(comm)
        if tune is None:
            tune = "online" if comm.online is not None or tune_out is not None \
                or tune_options is not None else "off"
        # Online tuning of the buckets (collectives.online): one allgather compares every
        # rank's tuning arguments (ranks that differ fail together, before any step); on
        # the calling thread, before the communication thread starts.
        comm.enable_online(tune_out=tune_out, tune_options=tune_options, tune=tune)
        if comm.online is not None and channels > 1:
            raise ValueError(f"rank {comm.rank}: online tuning explores on one channel: use "
                             "channels=1 with tune='online' (or RINGTUNE_TUNE=online)")
        self.comm = comm
        self.rank: int = comm.rank
        self.world: int = comm.size
        self.staleness = staleness
        self.average_every = average_every
        self.exchanger = exchanger_for(comm)  # checks the MPI thread level
        #: Per channel: the communicator and its communication thread (channel 0 is
        #: ``comm``'s own); bucket i goes to channel i % channels (see ``_open_channels``).
        self.channels: list[tuple[Any, Any]] = [(comm, self.exchanger)]
        if channels > 1:
            self._open_channels(channels)
        self.step = 0
        self._checked: set[tuple[Any, ...]] = set()
        # per bucket index: (tensor, flat view, prepared plan, plan key); see _reduce_bucket
        self._fast: dict[int, tuple[Any, Any, Any, Any]] = {}
        # staleness 1: per parameter, the averaged gradient of the previous step.
        self._stale: dict[int, Any] = {}
        self._pending: list[_CFuture[Any]] = []

    def _open_channels(self, channels: int) -> None:
        """More exchange channels: each one a duplicate of ``comm`` with the same profile
        and topology and its own communication thread, so that bucket k+1's allreduce runs
        while bucket k's is still in flight. Why: a tier-aware allreduce alternates phases
        that wait on different resources (``hierarchical``: the shared-memory reduce-scatter
        and all-gather on the cores, the inter-host phase on the uplink); with one thread
        the uplink idles during every intra-host phase and the cores idle during the
        inter-host one. Two buckets in flight fill each other's gaps. Every rank maps bucket
        i to the same channel and each channel runs its buckets in DDP's order, so the
        collectives match on every communicator. Needs ``MPI_THREAD_MULTIPLE`` (two threads
        in MPI at once, on different communicators); checked here, on every rank."""
        from ..communicator import Communicator
        from ..training.exchange import check_thread_level

        comm = self.comm
        check_thread_level(comm.rank, concurrent=True, comm=comm)

        profile = comm.profile

        def dup() -> Any:  # collective; on comm's thread, which owns its MPI calls
            return Communicator(comm.comm.Dup(), profile=profile, strict=comm.strict,
                                topology=comm.topology)

        for _ in range(channels - 1):
            extra = self.exchanger.submit(dup).result()
            self.channels.append((extra, exchanger_for(extra)))

    # -- the hook's side ---------------------------------------------------------------

    def _signature(self, bucket: Any) -> tuple[Any, ...]:
        buf = bucket.buffer()
        return (bucket.index(), int(buf.numel()), str(buf.dtype), buf.device.type,
                bool(bucket.is_last()))

    def _check(self, sig: tuple[Any, ...], buf: Any, comm: Any = None) -> None:
        """On the communication thread of ``comm`` (default: the state's): every rank has
        the same bucket and can serve it, and DDP's group is the communicator's world (a
        HookState made before ``init_process_group`` was not checked at construction):
        ``WorldMismatchError`` in the first ``backward``, before any optimizer step."""
        comm = self.comm if comm is None else comm
        _check_ddp_world(comm)
        problem = ""
        try:
            from ..registry import backend_for

            backend_for(as_buffer(buf))
        except (TypeError, ValueError, ImportError) as exc:
            problem = str(exc)
        everyone = comm.comm.allgather((sig, problem))
        bad = [(r, p) for r, (_, p) in enumerate(everyone) if p]
        if bad:
            r, p = bad[0]
            raise AgreementError(p if p.startswith(f"rank {r}") else f"rank {r}: {p}")
        require_agreement(
            [f"bucket {s[0]}: {s[1]} x {s[2]} on {s[3]}{' (last)' if s[4] else ''}"
             for s, _ in everyone],
            "DDP gradient bucket layouts",
            "every rank must wrap the same model (same parameters, shapes, dtypes and "
            "order) with the same DDP bucket_cap_mb")

    def _reduce(self, sig: tuple[Any, ...], buf: Any, ready: Any, comm: Any = None) -> Any:
        """On the communication thread of ``comm`` (default: the state's): average ``buf``
        in place."""
        comm = self.comm if comm is None else comm
        _on_comm_thread(buf, ready)
        if sig not in self._checked:
            self._check(sig, buf, comm)
            self._checked.add(sig)
        comm.allreduce(buf, op="avg")
        return buf

    def _reduce_bucket(self, comm: Any, index: int, last: bool, buf: Any,
                       ready: Any) -> Any:
        """On the communication thread: average a DDP bucket in place, the fast way once
        its layout is known. DDP hands the same bucket tensors every step, so the checked
        layout, the NumPy (or CUDA) view and the prepared plan are kept per bucket index
        and reused while the tensor's memory, size and dtype are the same (the kept tensor
        holds that memory, so an equal address is the same memory); a rebuilt bucket takes
        the full path again. ``RINGTUNE_CHECK`` and debug logging always take the full
        ``Communicator.allreduce`` (their per-call work is the point of them). ``comm``
        is the bucket's channel."""
        _on_comm_thread(buf, ready)
        hit = self._fast.get(index)
        if hit is not None and hit[0].data_ptr() == buf.data_ptr() \
                and hit[0].numel() == buf.numel() and hit[0].dtype == buf.dtype \
                and comm.cached_plan(hit[3]) is hit[2]:
            prepared: Any = hit[2]
            comm.run_prepared(prepared, hit[1])
            return buf
        sig = (index, int(buf.numel()), str(buf.dtype), buf.device.type, last)
        self._reduce(sig, buf, None, comm)
        if not (comm.check_args or comm.logs_calls):
            from ..registry import backend_for

            arr = as_buffer(buf)
            backend = backend_for(arr)
            flat = backend.as_flat(arr)
            key = _plan_key(flat, "avg", backend, None, None, {})
            made = comm.cached_plan(key)  # made by the allreduce just run
            if len(self._fast) > 256:  # a model whose buckets keep changing: do not grow
                self._fast.clear()
            if last:
                # DDP rebuilds its buckets after the first step, often into fewer: drop the
                # entries past the last one, or they would keep the old buckets' memory.
                for stale in [k for k in list(self._fast) if k > index]:
                    del self._fast[stale]
            if made is not None:
                self._fast[index] = (buf, flat, made, key)
        return buf

    def submit(self, bucket: Any) -> _CFuture[Any]:
        """Queue the averaging of ``bucket``'s buffer (in place) on the communication
        thread."""
        buf = bucket.buffer()
        return self.exchanger.submit(self._reduce, self._signature(bucket), buf,
                                     _ready_event(buf))

    def submit_bucket(self, bucket: Any) -> Any:
        """The hook's path: queue ``bucket`` and return a ``torch.futures.Future`` that the
        communication thread completes (one queue put here; everything else there)."""
        buf = bucket.buffer()
        index = bucket.index()
        chans = self.channels
        comm, ex = chans[index % len(chans)] if len(chans) > 1 else chans[0]
        label = (index, buf.numel() * buf.element_size()) if ex.tracing else None
        return ex.submit_to(torch.futures.Future(), self._reduce_bucket, comm, index,
                            bucket.is_last(), buf, _ready_event(buf), label=label)

    # -- modes --------------------------------------------------------------------------

    def stale_exchange(self, bucket: Any) -> Any:
        """The hook's path with staleness 1: queue this step's gradients (a copy: DDP reuses
        the bucket), then put the previous step's averages in the bucket."""
        buf = bucket.buffer()
        copy = buf.detach().clone()
        sig = self._signature(bucket)
        # CUDA: the clone is queued on this thread's stream; the event orders the comm
        # thread's read after it (and after the gradient kernels before it).
        fut = self.exchanger.submit(self._reduce, sig, copy, _ready_event(copy))
        # Keep only what ``wait`` still has to report: finished exchanges that succeeded are
        # referenced by ``_stale`` until used (a long run must not keep every step's copy).
        self._pending = [f for f in self._pending if not f.done() or f.exception()]
        self._pending.append(fut)
        offsets, off = [], 0
        for p in bucket.parameters():
            offsets.append((id(p), off, p.numel()))
            off += p.numel()
        prev = self._stale
        for pid, o, n in offsets:
            old = prev.get(pid)
            if old is None:
                buf[o:o + n].zero_()  # first step: no averaged gradient yet
            else:
                old_fut, old_view = old
                old_fut.result()  # finished during this step's compute (raises its error)
                buf[o:o + n].copy_(old_view)
        for pid, o, n in offsets:
            prev[pid] = (fut, copy[o:o + n])
        return buf

    def average_parameters(self, params: Any) -> None:
        """Local SGD: average ``params`` across ranks every ``average_every``-th call (call
        it after each ``optimizer.step()``); a no-op otherwise and in the other modes."""
        if self.average_every == 1:
            return
        if self.step % self.average_every:  # ``step`` counts finished backward passes
            return
        data = [p.detach() for p in params]
        ready = _ready_event(data[0]) if data else None  # after optimizer.step's kernels
        self.exchanger.submit(self._average, data, ready).result()

    def _average(self, data: list[Any], ready: Any) -> None:
        """On the communication thread: average parameters in place (local SGD)."""
        if data:
            _on_comm_thread(data[0], ready)
        self.comm.allreduce_many(data, "avg")

    def wait(self) -> None:
        """Wait for every exchange queued so far (e.g. before calling MPI yourself under
        ``MPI_THREAD_SERIALIZED``, or before saving parameters with ``staleness=1``)."""
        for _, ex in self.channels:
            ex.drain()
        for fut in self._pending:
            fut.result()
        self._pending.clear()

    def close(self) -> None:
        """Finish queued exchanges and stop the communication threads (the extra channels'
        communicators are freed; ``comm`` stays the caller's)."""
        from ..training.exchange import close_exchanger

        for extra, ex in self.channels[1:]:
            ex.close()
            extra.close()
            extra.comm.Free()  # collective: every rank closes its HookState
        del self.channels[1:]
        close_exchanger(self.comm)


def _done_future(value: Any) -> Any:
    tfut: Any = torch.futures.Future()
    tfut.set_result(value)
    return tfut


def ddp_hook(state: HookState, bucket: Any) -> Any:
    """DDP communication hook: average ``bucket`` with ringtune; see the module docstring.
    Register it with ``ddp_model.register_comm_hook(HookState(comm), ddp_hook)``."""
    last = bool(bucket.is_last())
    try:
        if state.average_every > 1:
            out = _done_future(bucket.buffer())  # local SGD: each rank keeps its own
        elif state.staleness:
            out = _done_future(state.stale_exchange(bucket))
        else:
            out = state.submit_bucket(bucket)
    except BaseException as exc:  # noqa: BLE001 - delivered through the future
        out = torch.futures.Future()
        out.set_exception(exc)
    if last:
        state.step += 1
    return out


# DDP checks the hook's annotations against the real classes (register_comm_hook), and
# ``from __future__ import annotations`` leaves strings: give it the objects.
ddp_hook.__annotations__ = {"state": HookState, "bucket": torch.distributed.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}

# ``import collectives.torch`` registers the ``ringtune`` torch.distributed backend
# (collectives/torch/backend.py): ``dist.init_process_group("ringtune")``.
from .backend import register_backend  # noqa: E402

register_backend()
