"""Background exchange: one thread that makes every MPI call of a ``Communicator``.

Use ``exchanger_for(comm)`` to get the communicator's thread (made on first use, shared by
the DDP hook and ``allreduce_many``) and ``submit(fn, *args)`` to run ``fn`` there; it
returns a ``concurrent.futures.Future`` that completes when ``fn`` returns and raises what
``fn`` raised. So the training thread keeps computing (backward of the next bucket, packing
the next fused bucket) while a bucket is reduced: mpi4py and the reductions release the GIL.

Thread level. Only this thread calls MPI on the communicator once it runs, so MPI needs
``MPI_THREAD_SERIALIZED`` (checked at start; mpi4py asks for ``MULTIPLE`` by default):
- with ``SERIALIZED`` the training thread must not call MPI at all while an exchange is in
  flight: call ``drain()`` (or ``HookState.wait()``) first;
- with ``MULTIPLE`` it may call MPI at any time, on *another* communicator (give ringtune
  its own, e.g. ``Communicator(MPI.COMM_WORLD.Dup())``): two threads issuing collectives on
  one communicator would match them in different orders on different ranks.

Errors. An exception in a job fails that job's future and every later one with the same
error (the collective state across ranks is unknown after it), so the training thread
raises instead of waiting forever. ``close()`` finishes queued jobs, then stops the thread;
it is also called at interpreter exit, before mpi4py finalizes MPI.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

#: MPICH settings that make a waiting MPI call sleep instead of spinning: after
#: ``..._NO_PROGRESS_COUNT`` polls without progress it calls ``usleep(1)`` (~50-60 µs with
#: Linux's timer slack), and yields with ``nanosleep`` rather than ``sched_yield``. Set them
#: in the environment before MPI starts (``from mpi4py import MPI``) when ranks share cores
#: with compute: a comm thread spinning in ``MPI_Wait`` takes a core from backward, which is
#: what hid nothing in the overlap figures of BENCHMARKS.md. Costs latency on an idle core.
QUIET_PROGRESS_ENV = {
    "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
    "MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT": "64",
    "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1",
    "MPIR_CVAR_POLLS_BEFORE_YIELD": "64",
}

#: Seconds ``close()`` waits for queued work before giving up on the thread (it is a daemon:
#: a hung collective cannot keep the process alive).
CLOSE_TIMEOUT_S = 60.0

_LEVELS = {0: "MPI_THREAD_SINGLE", 1: "MPI_THREAD_FUNNELED", 2: "MPI_THREAD_SERIALIZED",
           3: "MPI_THREAD_MULTIPLE"}


class ExchangeError(RuntimeError):
    """The communication thread cannot run (thread level) or is closed or broken."""


def thread_level(concurrent: bool = False) -> tuple[int, int]:
    """(provided, required) MPI thread levels for background exchange; ``concurrent``:
    for several communication threads at once (each on its own communicator), which
    needs ``MPI_THREAD_MULTIPLE``."""
    from mpi4py import MPI

    return (int(MPI.Query_thread()),
            int(MPI.THREAD_MULTIPLE if concurrent else MPI.THREAD_SERIALIZED))


def check_thread_level(rank: int, concurrent: bool = False, comm: Any = None) -> None:
    """``ExchangeError`` naming the rank and the fix unless MPI allows a second thread to
    make MPI calls (``MPI_THREAD_SERIALIZED`` or more; ``MPI_THREAD_MULTIPLE`` for
    ``concurrent`` threads, e.g. ``HookState(channels=2)``). ``comm`` (a ``Communicator``):
    nothing to check where its engine has no thread levels (``torch.distributed``: each
    channel has its own groups, which any one thread may call)."""
    engine = getattr(comm, "engine", None)
    if engine is not None and not engine.thread_levels:
        return
    provided, required = thread_level(concurrent)
    if concurrent and provided < required:
        raise ExchangeError(
            f"rank {rank}: MPI was initialised with {_LEVELS.get(provided, provided)}, but "
            "several exchange channels call MPI from several threads at once and need "
            "MPI_THREAD_MULTIPLE: keep mpi4py's default (mpi4py.rc.thread_level = "
            "'multiple'), or use one channel")
    if provided < required:
        raise ExchangeError(
            f"rank {rank}: MPI was initialised with {_LEVELS.get(provided, provided)}, but "
            "ringtune's background exchange calls MPI from its own thread and needs "
            "MPI_THREAD_SERIALIZED: keep mpi4py's default (mpi4py.rc.thread_level = "
            "'multiple') or set it to 'serialized' before `from mpi4py import MPI`")


class Exchanger:
    """The communication thread of one ``Communicator`` (see the module docstring).

    The hot path is one ``SimpleQueue.put`` on the submitting thread and one ``get`` on the
    communication thread (both C, no Python lock): the DDP hook hands a bucket over with
    ``submit_to`` and a ``torch.futures.Future`` that this thread completes itself, without
    a ``concurrent.futures.Future`` and its callback in between (each costs a lock and a
    ``notify``; see the hook overhead figures in BENCHMARKS.md).
    """

    def __init__(self, comm: Any, name: str = "ringtune-exchange") -> None:
        check_thread_level(getattr(comm, "rank", 0), comm=comm)
        self.comm = comm
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._closed = False
        self._trace: JobTrace | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return not self._closed and self._thread.is_alive()

    @property
    def tracing(self) -> bool:
        """Whether jobs are being recorded (``trace()``)."""
        return self._trace is not None

    def trace(self, on: bool = True) -> JobTrace | None:
        """Start recording a ``JobTrace`` of every job submitted from now on (``on=False``
        stops; returns the trace either way). Off by default: it costs two timer reads and
        two ``/proc`` reads per job."""
        if on and self._trace is None:
            self._trace = JobTrace()
        trace = self._trace
        if not on:
            self._trace = None
        return trace

    def _closed_error(self) -> ExchangeError:
        return ExchangeError(
            f"rank {self.comm.rank}: the exchange thread is closed (Communicator or "
            "HookState closed); make a new HookState")

    def submit(self, fn: Callable[..., Any], *args: Any, label: Any = None) -> Future[Any]:
        """Queue ``fn(*args)`` on the communication thread; jobs run in submission order
        (the order every rank's collectives must follow). ``label`` names the job in a
        ``trace()``."""
        fut: Future[Any] = Future()
        return self.submit_to(fut, fn, *args, label=label)

    def submit_to(self, fut: Any, fn: Callable[..., Any], *args: Any,
                  label: Any = None) -> Any:
        """Like ``submit``, but complete ``fut`` (anything with ``set_result`` and
        ``set_exception``, e.g. a ``torch.futures.Future``) on the communication thread;
        returns ``fut``. The DDP hook's path: one hand-off, no extra future."""
        if self._closed:
            fut.set_exception(self._closed_error())
            return fut
        if self._trace is not None:
            fn = self._trace.wrap(fn, label)
        self._jobs.put((fut, fn, args))
        return fut

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every job submitted so far has finished (then the calling thread may
        use MPI even under ``MPI_THREAD_SERIALIZED``). Jobs run in order, so a marker queued
        now is reached only after them; a marker costs nothing on the hot path (no counter
        under a lock per job)."""
        if self._closed or not self._thread.is_alive():
            # A marker behind close()'s stop would never run: wait for the thread instead.
            if threading.current_thread() is not self._thread:
                self._thread.join(timeout)
            return
        done = threading.Event()
        self._jobs.put((None, done.set, ()))
        if not done.wait(timeout):
            raise ExchangeError(f"rank {self.comm.rank}: exchange jobs still running "
                                f"after {timeout} s; a rank may have left the job")

    def _loop(self) -> None:
        get = self._jobs.get
        while True:
            item = get()
            if item is None:
                return
            fut, fn, args = item
            if fut is None:  # a drain marker: runs even after an error
                fn()
                continue
            try:
                if self._error is not None:
                    raise ExchangeError(
                        f"rank {self.comm.rank}: an earlier exchange failed ({self._error}); "
                        "the ranks' collectives are out of step, restart the job"
                    ) from self._error
                if type(fut) is not Future or fut.set_running_or_notify_cancel():
                    fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - delivered to the waiting thread
                if self._error is None:
                    self._error = exc
                if not _done(fut):
                    fut.set_exception(exc)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Finish queued jobs and stop the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


def _schedstat() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of the calling thread, from
    Linux's ``/proc/thread-self/schedstat``; zeros where it is missing."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            run, wait = f.read().split()[:2]
        return int(run) * 1e-9, int(wait) * 1e-9
    except (OSError, ValueError):
        return 0.0, 0.0


class JobTrace:
    """Timeline of the jobs of one ``Exchanger`` (``Exchanger.trace()``): per job, when it
    was handed over (on the submitting thread), when the communication thread started and
    finished it (``time.perf_counter`` seconds), and on that thread the CPU time it used and
    the time it was runnable but waited for a core (Linux schedstat). Use it to see where a
    step's communication time goes: queueing behind earlier buckets (start − submit), CPU
    starvation (waited), polling (cpu close to end − start) or the link (neither)."""

    def __init__(self) -> None:
        #: (label, submit, start, end, cpu_s, waited_s) per finished job, in run order.
        self.jobs: list[tuple[Any, float, float, float, float, float]] = []

    def wrap(self, fn: Callable[..., Any], label: Any) -> Callable[..., Any]:
        """``fn`` timed as one job submitted now."""
        submitted = time.perf_counter()
        jobs = self.jobs

        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            run0, wait0 = _schedstat()
            try:
                return fn(*args)
            finally:
                end = time.perf_counter()
                run1, wait1 = _schedstat()
                jobs.append((label, submitted, start, end, run1 - run0, wait1 - wait0))

        return timed

    def clear(self) -> None:
        self.jobs.clear()


def _done(fut: Any) -> bool:
    done = getattr(fut, "done", None)
    return bool(done()) if done is not None else False


_EXCHANGERS: weakref.WeakKeyDictionary[Any, Exchanger] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def exchanger_for(comm: Any) -> Exchanger:
    """The communication thread of ``comm`` (a ``Communicator``), started on first use."""
    with _LOCK:
        ex = _EXCHANGERS.get(comm)
        if ex is None or not ex.alive:
            ex = Exchanger(comm)
            _EXCHANGERS[comm] = ex
        return ex


def close_exchanger(comm: Any) -> None:
    """Stop ``comm``'s communication thread, if it has one (after its queued work)."""
    with _LOCK:
        ex = _EXCHANGERS.pop(comm, None)
    if ex is not None:
        ex.close()


@atexit.register
def _close_all() -> None:
    # atexit handlers run before mpi4py finalizes MPI (its C-level exit hook), so no MPI
    # call is in flight on this thread when MPI is finalized.
    for ex in list(_EXCHANGERS.values()):
        ex.close()
