"""The GPU transports' logic on the CPU: ``staged`` and ``nccl`` over a simulated GPU.

``FakeOps`` stands in for ``collectives.cuda.ops.CudaOps``: "device memory" is host memory,
but every copy and every backend operation is *queued* on a simulated stream and runs only
when the host polls (an event query, a synchronisation), one item per stream per poll,
with stream-waits-on-event honoured. A transport that forgot to chain a stream to an event
would read or overwrite data too early here, and the results would be wrong.

``FakeNccl`` stands in for ``cupy.cuda.nccl``: a group's sends and receives run on the
stream as MPI messages *all with the same tag*, like NCCL, which has no tags — so the
multi-rank run also checks that the algorithms post messages between two ranks in the same
order on both sides. Sends are synchronous (``Issend``) and groups run one after another
on the stream, as large NCCL transfers do: a cycle of groups waiting for each other across
ranks would hang the run (it is bounded by a timeout) instead of hiding in eager buffers.

The multi-rank part runs the allreduce contract (``collectives/testing/contract.py``) over
both transports in an in-process world (``tests/inproc.py``, one thread and one simulated GPU
per rank) at several world sizes, on the world, a ``Dup()`` and a ``Split()``; and this file
under ``mpiexec -n 3`` (``python -m mpi4py``; ``tests/cli/test_cuda_transports.py`` runs it)
for what needs processes: set-up errors agreed over MPI and ``Communicator`` on GPU buffers
with the registry's backend replaced.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from collectives.backend import NumpyBackend

# -- the simulated GPU -----------------------------------------------------------------------


class FakeEvent:
    def __init__(self) -> None:
        self.gen = 0  # records issued
        self.fired = 0  # records executed


class FakeStream:
    _ids = itertools.count(1)

    def __init__(self, every: int = 1) -> None:
        self.id = next(self._ids)
        self.queue: deque[tuple[str, Any]] = deque()
        #: Runs one item every ``every`` polls: a slow stream (the backend's compute) lets
        #: a missing event wait show up as data used too early or overwritten too soon.
        self.every = every


class FakeOps:
    """The CudaOps interface over simulated streams (see the module docstring)."""

    MAX_STEPS = 1_000_000

    def __init__(self) -> None:
        self.streams: dict[int, FakeStream] = {}
        self.device = 0
        self.running = 0  # depth of queued work being run (see poll)

    # streams and events
    def new_stream(self, every: int = 1) -> FakeStream:
        s = FakeStream(every)
        self.streams[s.id] = s
        return s

    def new_event(self) -> FakeEvent:
        return FakeEvent()

    def record(self, event: FakeEvent, stream: FakeStream) -> None:
        event.gen += 1
        stream.queue.append(("record", (event, event.gen)))

    def wait(self, stream: FakeStream, event: FakeEvent) -> None:
        stream.queue.append(("wait", (event, event.gen)))

    def enqueue(self, stream: FakeStream, fn: Callable[[], object]) -> None:
        stream.queue.append(("run", fn))

    def step(self) -> bool:
        """Run at most one ready item per stream; True if anything ran. Slow streams take
        their turn every ``every`` polls, or when nothing else can run."""
        self.polls = getattr(self, "polls", 0) + 1
        ran = self._pass(lambda s: self.polls % s.every == 0)
        return ran or self._pass(lambda s: True)

    def _pass(self, turn: Callable[[FakeStream], bool]) -> bool:
        ran = False
        for s in list(self.streams.values()):
            if not s.queue or not turn(s):
                continue
            kind, arg = s.queue[0]
            if kind == "wait":
                ev, gen = arg
                if ev.fired < gen:
                    continue
            s.queue.popleft()
            if kind == "record":
                ev, gen = arg
                ev.fired = max(ev.fired, gen)
            elif kind == "run":
                self.running += 1
                try:
                    arg()
                finally:
                    self.running -= 1
            ran = True
        return ran

    def poll(self) -> None:
        """Progress as a GPU would while its host is blocked elsewhere — but never from
        inside queued work (a stream runs one item at a time, in order)."""
        if not self.running:
            self.step()

    def _until(self, cond: Callable[[], bool], what: str) -> None:
        for _ in range(self.MAX_STEPS):
            if cond():
                return
            if not self.step() and not cond():
                raise RuntimeError(f"simulated GPU deadlock waiting for {what}")
        raise RuntimeError(f"simulated GPU never finished {what}")

    def done(self, event: FakeEvent) -> bool:
        self.step()
        return event.fired >= event.gen

    def sync_event(self, event: FakeEvent) -> None:
        self._until(lambda: event.fired >= event.gen, "an event")

    def sync_stream(self, stream: FakeStream) -> None:
        self._until(lambda: not stream.queue, "a stream")

    # memory
    def ptr(self, arr: np.ndarray) -> int:
        return int(arr.ctypes.data)

    def d2h(self, host: np.ndarray, dev_ptr: int, nbytes: int, stream: FakeStream) -> None:
        dst = host.ctypes.data
        self.enqueue(stream, lambda: ctypes.memmove(dst, dev_ptr, nbytes))

    def h2d(self, dev_ptr: int, host: np.ndarray, nbytes: int, stream: FakeStream) -> None:
        src = host.ctypes.data
        self.enqueue(stream, lambda: ctypes.memmove(dev_ptr, src, nbytes))

    def pinned(self, nbytes: int) -> np.ndarray:
        # Poisoned, so a piece read before its copy landed shows up as wrong data.
        return np.full(max(1, nbytes), 0xA5, dtype=np.uint8)

    def device_context(self) -> Any:
        return contextlib.nullcontext()

    def stream_ptr(self, stream: FakeStream) -> int:
        return stream.id


class FakeBackend(NumpyBackend):
    """NumPy arrays posing as GPU arrays: every operation is queued on a simulated stream."""

    name = "cupy"
    on_gpu = True

    def __init__(self, ops: FakeOps, device: int = 0) -> None:
        self.ops = ops
        self.stream = ops.new_stream(every=3)
        self.device = device
        self.binding = None

    def reduce_into(self, dst: Any, src: Any, op: str) -> None:
        self.ops.enqueue(self.stream, lambda: NumpyBackend.reduce_into(self, dst, src, op))

    def copy_into(self, dst: Any, src: Any) -> None:
        self.ops.enqueue(self.stream, lambda: NumpyBackend.copy_into(self, dst, src))

    def divide(self, buf: Any, n: int) -> None:
        self.ops.enqueue(self.stream, lambda: NumpyBackend.divide(self, buf, n))

    def synchronize(self) -> None:
        self.ops.sync_stream(self.stream)

    def default_transport(self) -> str:
        # What CupyBackend answers: the GPU plug-in's choice.
        from collectives.cuda import default_gpu_transport

        return default_gpu_transport()

    def mpi_refusal(self) -> str | None:
        return "this MPI is not CUDA-aware"


_NP_OF_NCCL = {2: np.int32, 4: np.int64, 6: np.float16, 7: np.float32, 8: np.float64}


class FakeNccl:
    """``cupy.cuda.nccl`` as far as the transports use it, over MPI with a single tag."""

    NCCL_UINT8 = 1
    available = True

    def __init__(self, ops: FakeOps, comm: Any = None) -> None:
        self.ops = ops
        self.comm = comm
        self.group: list[tuple[str, int, int, int, int]] | None = None
        self.inits = 0

    def for_comm(self, comm: Any) -> FakeNccl:
        return FakeNccl(self.ops, comm)

    @staticmethod
    def get_unique_id() -> tuple[int, ...]:
        return tuple(range(128))

    def groupStart(self) -> None:  # noqa: N802 - cupy's name
        assert self.group is None, "nested group"
        self.group = []

    def groupEnd(self) -> None:  # noqa: N802
        ops, comm, group = self.ops, self.comm, self.group
        self.group = None
        assert group is not None
        if not group:
            return
        streams = {sid for *_, sid in group}
        assert len(streams) == 1
        stream = ops.streams[streams.pop()]

        def exchange() -> None:
            from mpi4py import MPI

            reqs = []
            for kind, ptr, n, peer, _ in group:
                view = np.ctypeslib.as_array((ctypes.c_uint8 * max(n, 1)).from_address(ptr))
                if kind == "r":
                    reqs.append(comm.Irecv([view[:n], MPI.BYTE], peer, 0))
                else:
                    # Synchronous: completes only once matched, as a large NCCL send.
                    reqs.append(comm.Issend([view[:n], MPI.BYTE], peer, 0))
            for req in reqs:  # Request.Wait: an MPI request or an in-process one
                req.Wait()

        ops.enqueue(stream, exchange)

    def NcclCommunicator(self, size: int, uid: Any, rank: int) -> Any:  # noqa: N802
        assert uid == self.get_unique_id()
        assert size == self.comm.Get_size() and rank == self.comm.Get_rank()
        self.inits += 1
        nccl = self

        class Comm:
            def send(self, ptr: int, n: int, dt: int, peer: int, stream: int) -> None:
                assert dt == nccl.NCCL_UINT8 and nccl.group is not None
                nccl.group.append(("s", ptr, n, peer, stream))

            def recv(self, ptr: int, n: int, dt: int, peer: int, stream: int) -> None:
                assert dt == nccl.NCCL_UINT8 and nccl.group is not None
                nccl.group.append(("r", ptr, n, peer, stream))

            def allReduce(self, sptr: int, rptr: int, count: int, dt: int, op: int,  # noqa: N802
                          stream: int) -> None:
                from mpi4py import MPI

                assert sptr == rptr
                npdt = np.dtype(_NP_OF_NCCL[dt])
                mop = {0: MPI.SUM, 1: MPI.PROD, 2: MPI.MAX, 3: MPI.MIN}[op]
                buf = np.ctypeslib.as_array(
                    (ctypes.c_uint8 * max(1, count * npdt.itemsize)).from_address(rptr))
                arr = buf[:count * npdt.itemsize].view(npdt)
                nccl.ops.enqueue(nccl.ops.streams[stream],
                                 lambda: nccl.comm.Allreduce(MPI.IN_PLACE, arr, op=mop))

            def destroy(self) -> None:
                pass

        return Comm()


def without_machine_nccl() -> None:
    """Keep this machine's NCCL out of these tests: where CuPy, a GPU and NCCL are installed,
    a transport built without ``nccl=`` would load the real library and hand it the fake
    backend's host pointers. ``FakeNccl`` is the only NCCL here."""
    import collectives.cuda.nccl as nccl
    import collectives.cuda.staged as staged

    for module in (nccl, staged):
        module.load_nccl = lambda: (None, "NCCL is simulated by FakeNccl in these tests")


@pytest.fixture(autouse=True)
def _no_machine_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    import collectives.cuda.nccl as nccl
    import collectives.cuda.staged as staged

    for module in (nccl, staged):
        monkeypatch.setattr(module, "load_nccl",
                            lambda: (None, "NCCL is simulated by FakeNccl in these tests"))


def make(kind: str, comm: Any, ops: FakeOps, backend: FakeBackend, piece: int = 64) -> Any:
    from collectives.cuda.nccl import NcclTransport
    from collectives.cuda.staged import StagedTransport

    if kind == "staged":
        return StagedTransport(comm, backend, ops=ops, piece_bytes=piece)
    if kind == "staged-nccl-native":
        return StagedTransport(comm, backend, ops=ops, piece_bytes=piece, nccl=FakeNccl(ops))
    return NcclTransport(comm, backend, ops=ops, nccl=FakeNccl(ops))


# -- single process ----------------------------------------------------------------------------


@pytest.fixture()
def self_comm() -> Any:
    from mpi4py import MPI

    return MPI.COMM_SELF


@pytest.mark.parametrize("kind", ["staged", "nccl"])
def test_self_exchange_every_size_and_piece_count(self_comm: Any, kind: str) -> None:
    ops = FakeOps()
    be = FakeBackend(ops)
    t = make(kind, self_comm, ops, be, piece=48)
    rng = np.random.default_rng(1)
    for nbytes in (0, 1, 47, 48, 49, 200, 1000):
        src = rng.integers(0, 255, size=nbytes, dtype=np.uint8)
        dst = np.zeros(nbytes, dtype=np.uint8)
        p = t.start([(src, 0, 5)], [(dst, 0, 5)])
        p.wait_recv()
        p.wait()
        be.synchronize()
        assert np.array_equal(dst, src), (kind, nbytes)
    t.close()


def test_staged_send_waits_for_the_data_it_sends(self_comm: Any) -> None:
    """A reduction queued before start() must land before the copy down reads the data."""
    ops = FakeOps()
    be = FakeBackend(ops)
    t = make("staged", self_comm, ops, be, piece=16)
    a = np.arange(40, dtype=np.float32)
    be.reduce_into(a, np.full(40, 100, dtype=np.float32), "sum")  # queued, not yet run
    out = np.zeros(40, dtype=np.float32)
    p = t.start([(a, 0, 1)], [(out, 0, 1)])
    p.wait()
    be.synchronize()
    assert np.array_equal(out, np.arange(40, dtype=np.float32) + 100)


def test_staged_recv_does_not_overwrite_data_still_being_reduced(self_comm: Any) -> None:
    """A receive into scratch must wait for the queued reduction that reads that scratch."""
    ops = FakeOps()
    be = FakeBackend(ops)
    t = make("staged", self_comm, ops, be, piece=8)
    buf = np.zeros(16, dtype=np.int64)
    scratch = np.arange(16, dtype=np.int64)
    first = t.start([(np.full(16, 7, dtype=np.int64), 0, 2)], [])  # the data is on its way
    spare = np.zeros(4)
    for _ in range(30):  # a busy compute stream
        be.copy_into(spare, spare)
    be.reduce_into(buf, scratch, "sum")  # queued behind them: reads scratch = 0..15
    p = t.start([], [(scratch, 0, 2)])  # must land after that reduction
    p.wait()
    first.wait()
    be.synchronize()
    assert np.array_equal(buf, np.arange(16)) and np.all(scratch == 7)


def test_pinned_pool_reuses_buffers_only_after_their_copies() -> None:
    from collectives.cuda.staged import _PinnedPool

    ops = FakeOps()
    pool = _PinnedPool(ops)
    a = pool.get(5000)
    assert a.nbytes == 8192 and pool.size_class(4096) == 4096 and pool.size_class(1) == 4096
    s = ops.new_stream()
    ev = ops.new_event()
    ops.enqueue(s, lambda: None)
    ops.record(ev, s)
    pool.release_after(ev, [a])
    b = pool.get(5000)
    assert b is not a  # the copy had not run when b was requested
    ops.sync_stream(s)
    c = pool.get(6000)
    assert c is a


def test_pieces_cover_messages() -> None:
    from collectives.cuda.staged import pieces

    assert pieces(0, 4) == [(0, 0)]
    assert pieces(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert pieces(8, 4) == [(0, 4), (4, 4)]


def test_native_allreduce_single_rank(self_comm: Any) -> None:
    for kind in ("staged", "staged-nccl-native", "nccl"):
        ops = FakeOps()
        be = FakeBackend(ops)
        t = make(kind, self_comm, ops, be)
        buf = np.arange(10, dtype=np.float32)
        t.native_allreduce(buf, "sum")
        be.synchronize()
        assert np.array_equal(buf, np.arange(10, dtype=np.float32)), kind
        t.close()


def test_close_waits_for_copies_into_pinned_buffers(self_comm: Any) -> None:
    """close() drops the pinned buffers: the copies still queued on them must be done first
    (CuPy's pinned pool hands a dropped buffer out again at once)."""
    ops = FakeOps()
    be = FakeBackend(ops)
    t = make("staged", self_comm, ops, be, piece=16)
    spare = np.zeros(4)
    for _ in range(30):  # a busy compute stream: the copies up wait behind it
        be.copy_into(spare, spare)
    src = np.arange(64, dtype=np.uint8)
    dst = np.zeros(64, dtype=np.uint8)
    p = t.start([(src, 0, 9)], [(dst, 0, 9)])
    p.wait_recv()
    p.wait()
    assert t.h2d_stream.queue, "test set-up: the copies up should still be queued"
    t.close()
    assert not t.h2d_stream.queue and not t.d2h_stream.queue
    be.synchronize()
    assert np.array_equal(dst, src)


def test_staged_native_waits_before_replacing_its_pinned_buffer(self_comm: Any) -> None:
    """A bigger native allreduce replaces the pinned buffer only after the previous call's
    copy up, which reads the old one, has run."""
    ops = FakeOps()
    be = FakeBackend(ops)
    t = make("staged", self_comm, ops, be)
    spare = np.zeros(4)
    for _ in range(30):
        be.copy_into(spare, spare)
    small = np.arange(10, dtype=np.float32)
    t.native_allreduce(small, "sum")
    pending_at_alloc: list[int] = []
    pinned = ops.pinned

    def watched(nbytes: int) -> np.ndarray:
        pending_at_alloc.append(len(t.h2d_stream.queue))
        return pinned(nbytes)

    ops.pinned = watched  # type: ignore[method-assign]
    big = np.arange(5000, dtype=np.float32)
    t.native_allreduce(big, "sum")
    be.synchronize()
    assert pending_at_alloc == [0]
    assert np.array_equal(small, np.arange(10, dtype=np.float32))
    assert np.array_equal(big, np.arange(5000, dtype=np.float32))
    t.close()


def test_cuda_ops_done_reads_the_event_whatever_its_kind() -> None:
    """``CudaOps.done`` must query the event, whether ``done`` is a property (CuPy) or a
    method: a bound method is always true and would let sends leave before their copy."""
    from collectives.cuda.ops import CudaOps

    class PropEvent:
        def __init__(self, state: bool) -> None:
            self.state = state

        @property
        def done(self) -> bool:
            return self.state

    class MethodEvent(PropEvent):
        def done(self) -> bool:  # type: ignore[override]
            return self.state

    ops = CudaOps.__new__(CudaOps)  # no CuPy here: done() needs none
    for kind in (PropEvent, MethodEvent):
        assert ops.done(kind(True)) is True
        assert ops.done(kind(False)) is False, kind.__name__


class _Recorder:
    """A transport that records what each rank posts (messages complete at once)."""

    name = "recorder"

    def __init__(self, rank: int, size: int, log: list[tuple[str, int, int, int]]) -> None:
        from collectives.registry import get_backend

        self.rank, self.size, self.log = rank, size, log
        self.backend = get_backend("numpy")
        self.comm = None

    def start(self, sends: Any, recvs: Any) -> Any:
        for a, peer, tag in sends:
            self.log.append(("s", peer, tag, a.nbytes))
        for a, peer, tag in recvs:
            self.log.append(("r", peer, tag, a.nbytes))

        class Done:
            def wait(self) -> None:
                pass

            wait_recv = wait

        return Done()

    def native_allreduce(self, buf: Any, op: str) -> None:
        pass


@pytest.mark.parametrize("algo,params", [
    ("multiring", {"rings": 1, "chunk_bytes": 8}),
    ("multiring", {"rings": 2, "chunk_bytes": 8, "order": "identity"}),
    ("multiring", {"rings": 4, "chunk_bytes": 4}),
    ("multiring", {"rings": 3, "chunk_bytes": 0}),
    ("rhd", {}),
])
def test_algorithms_post_in_a_tag_independent_order(algo: str, params: dict[str, Any]) -> None:
    """NCCL matches messages between two ranks in posting order, ignoring tags: the
    sequence of (tag, size) rank A sends to rank B must equal what B posts to receive
    from A."""
    from collectives.algorithms import Context, get_algorithm

    cls = get_algorithm(algo)
    for n in (2, 3, 4, 5):
        checked = cls.check_params(params, n)
        for count in (1, 5, 12, 37, 100):
            logs = []
            for r in range(n):
                log: list[tuple[str, int, int, int]] = []
                tr: Any = _Recorder(r, n, log)
                ctx = Context(comm=None, backend=tr.backend, transport=tr, hosts=(0,) * n,
                              world_ranks=tuple(range(n)))
                with np.errstate(all="ignore"):  # scratch holds garbage: only order counts
                    cls(ctx, count, "float32", "sum", checked).run(np.zeros(count, np.float32))
                logs.append(log)
            for a in range(n):
                for b in range(n):
                    if a != b:
                        sent = [(t, s) for k, p, t, s in logs[a] if k == "s" and p == b]
                        got = [(t, s) for k, p, t, s in logs[b] if k == "r" and p == a]
                        assert sent == got, (algo, params, n, count, a, b)


KINDS = ("staged", "staged-nccl-native", "nccl")


@pytest.mark.parametrize("n,comm_kind", [(2, "world"), (3, "world"), (5, "world"),
                                         (4, "split"), (7, "split"), (3, "dup")])
def test_gpu_transports_contract_in_process(n: int, comm_kind: str) -> None:
    """The allreduce contract (``collectives/testing/contract.py``) over ``staged`` and (fake)
    ``nccl`` on the simulated GPU, every rank a thread of an in-process world
    (``tests/inproc.py``), one "GPU" per rank: every registered algorithm, every size once, op and
    dtype rotating."""
    from collectives.testing import contract
    from tests import inproc

    def rank(world: Any) -> list[str]:
        comm, label = contract.communicator(world, comm_kind)
        fails: list[str] = []
        for kind in KINDS:
            ops = FakeOps()
            be = FakeBackend(ops, device=world.Get_rank())
            # The simulated GPU runs queued work while its rank waits (as a GPU would).
            inproc.set_progress(world, ops.poll)
            runner = contract.DirectRunner(comm, be, make(kind, comm, ops, be, piece=32))
            cfgs = contract.configs(comm.Get_size(), light=True, gpu=True)
            fails += contract.run_configs(runner, cfgs, contract.Setup(label=kind),
                                          density="sparse", where=f"{label} ")
            runner.close()
            runner.ctx.transport.close()
        contract.release(comm, comm_kind)
        return fails

    fails = [line for lines in inproc.run_ranks(n, rank) for line in lines]
    assert not fails, "\n".join(fails[:12])


# -- multi-rank (run as a script under mpiexec) --------------------------------------------


def main() -> int:
    from mpi4py import MPI

    from collectives.cuda.errors import GpuError
    from collectives.errors import AgreementError

    without_machine_nccl()
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    failures: list[str] = []
    # Every algorithm over every transport: test_gpu_transports_contract_in_process (the
    # contract at several world sizes and communicator kinds). Here what needs processes.
    # Two ranks on one GPU with nccl: every rank gets the same clear error.
    ops = FakeOps()
    shared = FakeBackend(ops, device=0)
    try:
        make("nccl", world, ops, shared)
        if n > 1:
            failures.append("nccl with a shared GPU did not raise")
    except GpuError as exc:
        if n == 1 or "one GPU per rank" not in str(exc) or "ranks 0, 1" not in str(exc):
            failures.append(f"shared-GPU error unclear: {exc}")
    # Ranks that chose different transports: the same AgreementError everywhere.
    ops = FakeOps()
    be = FakeBackend(ops, device=rank)
    try:
        make("staged" if rank == 0 else "nccl", world, ops, be)
        if n > 1:
            failures.append("mismatched transports did not raise")
    except AgreementError as exc:
        if "GPU transports differ across ranks" not in str(exc):
            failures.append(f"mismatch error unclear: {exc}")
    failures += _communicator_checks(world, rank, n)
    everyone = world.allgather(failures)
    if rank == 0:
        lines = [f"rank {r}: {f}" for r, fs in enumerate(everyone) for f in fs]
        if lines:
            print("\n".join(lines[:20]))
            return 1
        print(f"multi-rank GPU transport checks passed ({n} ranks)")
    return 1 if any(everyone) else 0


class FakeGpuArray:
    """A buffer that announces itself as CUDA memory (what ``backend_for`` looks at)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str,
                                         "data": (a.ctypes.data, False), "version": 3}


def _communicator_checks(world: Any, rank: int, n: int) -> list[str]:
    """``Communicator.allreduce`` on GPU buffers end to end over the simulated GPU (default
    transport, ``avg``, the final synchronisation), and ``RINGTUNE_CHECK=1`` catching host
    and GPU buffers mixed across ranks."""
    import collectives.cuda.ops as cops
    import collectives.registry as cbk
    from collectives import AgreementError, Communicator

    fails: list[str] = []
    ops = FakeOps()
    fake = FakeBackend(ops, device=rank)
    fake.as_flat = lambda buf: buf.a.reshape(-1)  # type: ignore[method-assign]
    saved = cbk._BACKENDS.get("cupy"), cops.CudaOps
    cbk._BACKENDS["cupy"] = fake
    cops.CudaOps = lambda device: ops  # type: ignore[assignment,misc,return-value]
    try:
        c = Communicator(world)
        x = FakeGpuArray(np.full(1001, rank + 1.0, dtype=np.float32))
        if c.allreduce(x, op="avg") is not x or not np.all(x.a == (n + 1) / 2):
            fails.append(f"communicator avg on GPU buffers: {x.a[:3]} != {(n + 1) / 2}")
        plan = next(iter(c._plans.values())).plan
        if plan.transport != "staged":
            fails.append(f"default GPU transport without CuPy should be staged: {plan}")
        c.close()
        if n > 1:
            os.environ["RINGTUNE_CHECK"] = "1"
            try:
                c = Communicator(world)
            finally:
                del os.environ["RINGTUNE_CHECK"]
            mixed: Any = (np.ones(16, np.float32) if rank == 0
                          else FakeGpuArray(np.ones(16, np.float32)))
            try:
                c.allreduce(mixed)
                fails.append("mixed host/GPU buffers were not caught")
            except AgreementError as exc:
                if "'numpy'" not in str(exc) or "'cupy'" not in str(exc):
                    fails.append(f"mixed-buffer error does not say which: {exc}")
            c.close()
    finally:
        if saved[0] is None:
            cbk._BACKENDS.pop("cupy", None)
        else:
            cbk._BACKENDS["cupy"] = saved[0]
        cops.CudaOps = saved[1]  # type: ignore[misc]
    return fails


if __name__ == "__main__":
    sys.exit(main())
