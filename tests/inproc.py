"""An in-process world of ranks for unit tests: one thread per rank, no ``mpiexec``.

Use it to run collective code at many world sizes (1..16, non-powers of two included) in a
single pytest process::

    results = run_ranks(5, lambda comm: work(comm))   # one result per rank, in rank order

Each thread gets an ``InprocComm``: the part of mpi4py's ``Comm`` that ringtune's runtime
uses (``Get_rank``/``Get_size``, ``Isend``/``Irecv``/``Issend`` with requests that
``Test``/``Wait``, ``allgather``, ``bcast``, ``Barrier``, ``Allreduce``, ``Dup``, ``Split``,
``Free``), carried by shared memory. ``InprocTransport`` is the ``mpi`` transport's
counterpart over it (``Transport`` interface: ``start``, ``native_allreduce``, ``sub``);
``register()`` adds it to ``collectives.registry`` as transport ``inproc``, so the real
``Communicator`` (plans, parameter checks, ``avg``) runs over it unchanged.

Semantics that matter to the algorithms: messages between two ranks of one communicator
with one tag match in posting order (MPI's non-overtaking rule); a receive must be exactly
the size of the message it matches (stricter than MPI: NCCL needs it, and a mismatch is an
algorithm bug); sends are buffered at posting (eager), so a send's buffer may be reused
once it is posted. ``native_allreduce`` reduces the ranks' contributions in rank order, so
every rank gets bitwise the same result.

A simulated device that progresses only when its host polls it (the GPU transports' fake
streams) can have ``set_progress`` drive it while its rank is blocked, as a real device
runs on its own.

Deadlock-proof: every blocking wait gives up after ``timeout`` seconds with
``InprocTimeout`` naming the rank, what it waited for and what every other blocked rank
waits for; a rank that raises wakes the others, which then fail with a line naming that
rank; ``run_ranks`` raises one ``AssertionError`` that lists every rank's failure.
"""

from __future__ import annotations

import functools
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from collectives.backend import Backend
from collectives.transport import Pending, Transport

#: Seconds a blocked wait lasts before the test fails (a correct run waits milliseconds).
DEFAULT_TIMEOUT = 60.0


class InprocTimeout(RuntimeError):
    """A rank waited longer than the world's timeout (a deadlock, or a peer that stopped)."""


class InprocAborted(RuntimeError):
    """Another rank of the world failed, so this rank's wait can never complete."""


class _World:
    """State shared by the ranks of one ``run_ranks`` call."""

    def __init__(self, size: int, timeout: float) -> None:
        self.size = size
        self.timeout = timeout
        self.lock = threading.Lock()
        # One condition per world rank, all on one lock: a post wakes only its receiver.
        self.cv = [threading.Condition(self.lock) for _ in range(size)]
        #: (context, src, dst, tag, index) -> message bytes (a copy taken at posting).
        self.mail: dict[tuple[Any, ...], np.ndarray] = {}
        #: (context, src, dst, tag) -> next index (send side / receive side).
        self.sent: dict[tuple[Any, ...], int] = {}
        self.posted: dict[tuple[Any, ...], int] = {}
        #: (context, sequence) -> contributions of a collective, by communicator rank
        #: (key -1 counts the ranks that have read them).
        self.slots: dict[tuple[Any, ...], dict[int, Any]] = {}
        self.failed: str | None = None
        #: World rank -> what it is blocked on now (named in a timeout's message).
        self.waiting: dict[int, str] = {}
        #: World rank -> work to drive while that rank is blocked (``set_progress``).
        self.progress: dict[int, Callable[[], object]] = {}
        self.in_progress: set[int] = set()

    def fail(self, line: str) -> None:
        with self.lock:
            if self.failed is None:
                self.failed = line
            for cv in self.cv:
                cv.notify_all()

    def wait_for(self, world_rank: int, ready: Callable[[], bool], what: str) -> None:
        """Block (holding ``lock``) until ``ready()``; fail after the timeout, or at once
        when another rank failed."""
        deadline = time.monotonic() + self.timeout
        cv = self.cv[world_rank]
        outer = self.waiting.get(world_rank)
        self.waiting[world_rank] = what
        progress = self.progress.get(world_rank)
        if world_rank in self.in_progress:
            progress = None  # a wait inside the progress work itself: plain blocking
        try:
            while not ready():
                if self.failed is not None:
                    raise InprocAborted(f"rank {world_rank}: gave up waiting for {what}: "
                                        f"{self.failed}")
                left = deadline - time.monotonic()
                if left <= 0:
                    others = "; ".join(f"rank {r} waits for {w}"
                                       for r, w in sorted(self.waiting.items())
                                       if r != world_rank)
                    raise InprocTimeout(
                        f"rank {world_rank}: no progress for {self.timeout:g} s waiting for "
                        f"{what} (a deadlock, or a peer that never posted the matching "
                        f"call){'; meanwhile ' + others if others else ''}")
                if progress is None:
                    cv.wait(left)
                    continue
                cv.wait(min(left, 0.002))
                # Drive this rank's simulated device outside the lock: its queued work may
                # post messages or wait for peers itself.
                self.in_progress.add(world_rank)
                self.lock.release()
                try:
                    progress()
                finally:
                    self.lock.acquire()
                    self.in_progress.discard(world_rank)
        finally:
            if outer is None:
                del self.waiting[world_rank]
            else:
                self.waiting[world_rank] = outer


def _as_bytes(spec: Any) -> np.ndarray:
    """The bytes of an mpi4py buffer spec (``arr`` or ``[arr, MPI.BYTE]``)."""
    arr = spec[0] if isinstance(spec, (list, tuple)) else spec
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        raise ValueError("in-process messages must be contiguous arrays")
    return arr.reshape(-1).view(np.uint8)


class _Request:
    """A posted send (complete at once: buffered) or receive."""

    __slots__ = ("comm", "key", "dst", "done")

    def __init__(self, comm: InprocComm, key: tuple[Any, ...] | None, dst: np.ndarray | None,
                 ) -> None:
        self.comm = comm
        self.key = key
        self.dst = dst
        self.done = key is None

    def _take(self) -> None:
        # Called with the world lock held, once the message is there.
        assert self.key is not None and self.dst is not None
        data = self.comm.world.mail.pop(self.key)
        if data.size != self.dst.size:
            _, src, dst, tag, _ = self.key
            raise ValueError(f"rank {self.comm.world_rank}: a message of {data.size} B from "
                             f"rank {src} (tag {tag}) met a receive of {self.dst.size} B")
        self.dst[...] = data
        self.done = True

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        if self.done:
            return True
        world = self.comm.world
        with world.lock:
            if self.key in world.mail:
                self._take()
        return self.done

    def Wait(self) -> None:  # noqa: N802 - mpi4py's name
        if self.done:
            return
        world = self.comm.world
        key = self.key
        assert key is not None
        with world.lock:
            world.wait_for(self.comm.world_rank, lambda: key in world.mail,
                           f"a message from rank {key[1]} with tag {key[3]} "
                           f"on communicator {self.comm.name}")
            self._take()


def waitall(requests: Sequence[Any]) -> None:
    """``MPI.Request.Waitall`` for in-process requests."""
    for req in requests:
        req.Wait()


def _reduce(parts: Sequence[np.ndarray], op: Any) -> np.ndarray:
    """Reduce in rank order (the same order, hence bits, on every rank)."""
    name = _op_name(op)
    ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
             "max": np.maximum}[name]
    with np.errstate(over="ignore"):
        return functools.reduce(lambda a, b: ufunc(a, b), parts[1:], parts[0].copy())


def _op_name(op: Any) -> str:
    if isinstance(op, str):
        return op
    from mpi4py import MPI

    for name, mop in (("sum", MPI.SUM), ("prod", MPI.PROD), ("min", MPI.MIN),
                      ("max", MPI.MAX)):
        if op == mop:
            return name
    raise ValueError(f"in-process Allreduce has no op {op!r}")


class InprocComm:
    """One rank's handle on an in-process communicator (see the module docstring)."""

    def __init__(self, world: _World, context: tuple[Any, ...], members: tuple[int, ...],
                 world_rank: int) -> None:
        self.world = world
        self.context = context
        #: World ranks of this communicator's ranks, by communicator rank.
        self.members = members
        self.world_rank = world_rank
        self.rank = members.index(world_rank)
        self.size = len(members)
        self.name = "WORLD" if context == ("world",) else "/".join(map(str, context[1:]))
        self._seq = 0
        self.freed = False

    # -- mpi4py's surface -------------------------------------------------------------

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self.rank

    def Get_size(self) -> int:  # noqa: N802 - mpi4py's name
        return self.size

    def _check(self, peer: int) -> None:
        if self.freed:
            raise ValueError(f"rank {self.world_rank}: communicator {self.name} was freed")
        if not 0 <= peer < self.size:
            raise ValueError(f"rank {self.world_rank}: peer {peer} outside communicator "
                             f"{self.name} of {self.size} ranks")

    def Isend(self, spec: Any, dst: int, tag: int = 0) -> _Request:  # noqa: N802
        self._check(dst)
        data = _as_bytes(spec).copy()
        world = self.world
        key = (self.context, self.rank, dst, tag)
        with world.lock:
            idx = world.sent.get(key, 0)
            world.sent[key] = idx + 1
            world.mail[(*key, idx)] = data
            world.cv[self.members[dst]].notify_all()
        return _Request(self, None, None)

    Issend = Isend  # buffered here: a synchronous send needs no other behaviour

    def Irecv(self, spec: Any, src: int, tag: int = 0) -> _Request:  # noqa: N802
        self._check(src)
        key = (self.context, src, self.rank, tag)
        world = self.world
        with world.lock:
            idx = world.posted.get(key, 0)
            world.posted[key] = idx + 1
        return _Request(self, (*key, idx), _as_bytes(spec))

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0,  # noqa: N802
                 recvbuf: Any = None, source: int = 0, recvtag: int = 0) -> None:
        recv = self.Irecv(recvbuf, source, recvtag)
        self.Isend(sendbuf, dest, sendtag).Wait()
        recv.Wait()

    def _collective(self, value: Any, what: str) -> list[Any]:
        """Everyone's ``value`` in communicator rank order (the core of every collective)."""
        if self.freed:
            raise ValueError(f"rank {self.world_rank}: communicator {self.name} was freed")
        key = (self.context, self._seq)
        self._seq += 1
        world = self.world
        with world.lock:
            slot = world.slots.setdefault(key, {})
            slot[self.rank] = value
            if len(slot) == self.size:
                for r in self.members:
                    world.cv[r].notify_all()
            world.wait_for(self.world_rank, lambda: len(slot) >= self.size,
                           f"{what} on communicator {self.name} (ranks "
                           f"{sorted(set(range(self.size)) - set(slot))} had not called it "
                           "when this one did)")
            out = [slot[r] for r in range(self.size)]
            # The last rank to read frees the slot (counted under a key no rank uses).
            slot[-1] = slot.get(-1, 0) + 1
            if slot[-1] == self.size:
                del world.slots[key]
        return out

    def allgather(self, value: Any) -> list[Any]:
        return self._collective(value, "allgather")

    def bcast(self, value: Any, root: int = 0) -> Any:
        return self._collective(value, "bcast")[root]

    def Barrier(self) -> None:  # noqa: N802 - mpi4py's name
        self._collective(None, "Barrier")

    barrier = Barrier

    def allreduce(self, value: Any, op: Any = "sum") -> Any:
        """Reduce a number or an array over the ranks (in rank order)."""
        out = _reduce([np.asarray(p) for p in self._collective(value, "allreduce")], op)
        return out.item() if np.isscalar(value) else out

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = "sum") -> None:  # noqa: N802
        arr = recvbuf[0] if isinstance(recvbuf, (list, tuple)) else recvbuf
        src = arr if not isinstance(sendbuf, np.ndarray) else sendbuf  # IN_PLACE or not
        parts = self._collective(np.array(src, copy=True), "Allreduce")
        arr[...] = _reduce(parts, op)

    def Dup(self) -> InprocComm:  # noqa: N802 - mpi4py's name
        seq = self._seq
        self._collective(None, "Dup")
        return InprocComm(self.world, (*self.context, f"dup{seq}"), self.members,
                          self.world_rank)

    def Split(self, color: int = 0, key: int = 0) -> InprocComm:  # noqa: N802
        seq = self._seq
        everyone = self._collective((color, key), "Split")
        mine = sorted((k, r) for r, (c, k) in enumerate(everyone) if c == color)
        members = tuple(self.members[r] for _, r in mine)
        return InprocComm(self.world, (*self.context, f"split{seq}.{color}"), members,
                          self.world_rank)

    def Free(self) -> None:  # noqa: N802 - mpi4py's name
        self.freed = True

    def Abort(self, code: int = 1) -> None:  # noqa: N802 - mpi4py's name
        raise RuntimeError(f"rank {self.world_rank}: Abort({code}) on communicator {self.name}")


def set_progress(comm: InprocComm, fn: Callable[[], object] | None) -> None:
    """Call ``fn`` while this rank is blocked in any wait (``None``: stop). A simulated GPU
    progresses only when its host polls it, where a real one runs on its own: a rank
    blocked on a peer that waits for this rank's queued device work would otherwise hang
    the simulation though the code is right."""
    world = comm.world
    with world.lock:
        if fn is None:
            world.progress.pop(comm.world_rank, None)
        else:
            world.progress[comm.world_rank] = fn


class _InprocPending(Pending):
    __slots__ = ("recvs",)

    def __init__(self, recvs: list[_Request]) -> None:
        self.recvs = recvs

    def wait(self) -> None:
        for req in self.recvs:
            req.Wait()

    def test(self, recv_only: bool = False) -> bool:
        # Sends are buffered (complete at once): the batch is over when its receives are.
        return all([req.Test() for req in self.recvs])


class InprocTransport(Transport):
    """The ``mpi`` transport's behaviour over an ``InprocComm``: raw-byte messages, the
    reduction in the backend, and an in-order ``native_allreduce``."""

    name = "inproc"
    interleaves = True

    def start(self, sends: Sequence[tuple[Any, int, int]],
              recvs: Sequence[tuple[Any, int, int]]) -> Pending:
        comm = self.comm
        if self.backend.on_gpu:
            self.backend.synchronize()  # as MpiTransport: the data must be ready
        rreqs = [comm.Irecv(a, src, tag) for a, src, tag in recvs]
        for a, dst, tag in sends:
            comm.Isend(a, dst, tag)
        return _InprocPending(rreqs)

    def native_allreduce(self, buf: Any, op: str) -> None:
        if self.backend.on_gpu:
            self.backend.synchronize()
        self.comm.Allreduce(None, buf, op)

    def sub(self, comm: Any) -> Transport:
        return InprocTransport(comm, self.backend)


def make_inproc_transport(comm: Any, backend: Backend) -> InprocTransport:
    """The registry factory of transport ``inproc`` (host buffers over an ``InprocComm``)."""
    if not isinstance(comm, InprocComm):
        raise ValueError("transport 'inproc' runs only over tests.inproc.InprocComm")
    return InprocTransport(comm, backend)


def register() -> None:
    """Add transport ``inproc`` to ``collectives.registry`` (idempotent; tests only)."""
    from collectives.registry import register_transport, transport_names

    if "inproc" not in transport_names():
        register_transport("inproc", make_inproc_transport, test_only=True)


@functools.cache
def topology(size: int) -> Any:
    """A one-host ``probes.Topology`` of ``size`` ranks (this machine's host, probed once),
    for ``Communicator(comm, topology=...)``: probing from every thread would be slow."""
    import dataclasses

    from probes import layout
    from probes.topology import RankPlace

    one = layout.single()
    return dataclasses.replace(one, ranks=tuple(RankPlace(rank=r, host=0, local_rank=r)
                                                for r in range(size)))


def run_ranks(size: int, fn: Callable[[InprocComm], Any],
              timeout: float = DEFAULT_TIMEOUT) -> list[Any]:
    """Run ``fn(comm)`` on ``size`` threads, one per rank of a fresh world, and return
    their results in rank order. Any rank's exception fails the whole call with one
    ``AssertionError`` naming each failing rank (the first traceback included)."""
    world = _World(size, timeout)
    results: list[Any] = [None] * size
    errors: dict[int, str] = {}
    first_trace: list[str] = []

    def body(rank: int) -> None:
        comm = InprocComm(world, ("world",), tuple(range(size)), rank)
        try:
            results[rank] = fn(comm)
        except BaseException as exc:  # noqa: BLE001 - reported below, per rank
            errors[rank] = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, InprocAborted) and not first_trace:
                first_trace.append(traceback.format_exc())
            world.fail(f"rank {rank} failed ({type(exc).__name__})")

    threads = [threading.Thread(target=body, args=(r,), name=f"inproc-rank-{r}",
                                daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + 5
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    if hung:
        world.fail("the run timed out")
        errors.update({r: "still running after the timeout (stuck outside a wait)"
                       for r in hung})
    if errors:
        # The ranks that failed first matter; the aborted ones only followed.
        lines = [f"rank {r}: {errors[r]}" for r in sorted(errors)
                 if not errors[r].startswith("InprocAborted")]
        lines = lines or [f"rank {r}: {errors[r]}" for r in sorted(errors)]
        raise AssertionError(f"in-process world of {size} rank(s):\n" + "\n".join(lines)
                             + ("\n" + first_trace[0] if first_trace else ""))
    return results
