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
import os
import queue
import threading
import warnings
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


def thread_level() -> tuple[int, int]:
    """(provided, required) MPI thread levels for background exchange."""
    from mpi4py import MPI

    return int(MPI.Query_thread()), int(MPI.THREAD_SERIALIZED)


def check_thread_level(rank: int) -> None:
    """``ExchangeError`` naming the rank and the fix unless MPI allows a second thread to
    make MPI calls (``MPI_THREAD_SERIALIZED`` or more)."""
    provided, required = thread_level()
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
        check_thread_level(getattr(comm, "rank", 0))
        self.comm = comm
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return not self._closed and self._thread.is_alive()

    def _closed_error(self) -> ExchangeError:
        return ExchangeError(
            f"rank {self.comm.rank}: the exchange thread is closed (Communicator or "
            "HookState closed); make a new HookState")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Queue ``fn(*args)`` on the communication thread; jobs run in submission order
        (the order every rank's collectives must follow)."""
        fut: Future[Any] = Future()
        if self._closed:
            fut.set_exception(self._closed_error())
            return fut
        self._jobs.put((fut, fn, args))
        return fut

    def submit_to(self, fut: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """Like ``submit``, but complete ``fut`` (anything with ``set_result`` and
        ``set_exception``, e.g. a ``torch.futures.Future``) on the communication thread;
        returns ``fut``. The DDP hook's path: one hand-off, no extra future."""
        if self._closed:
            fut.set_exception(self._closed_error())
            return fut
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
        nice = os.environ.get("RINGTUNE_EXCHANGE_NICE", "").strip()
        if nice:
            _renice(nice, getattr(self.comm, "rank", 0))
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


def _renice(value: str, rank: int) -> None:
    """``RINGTUNE_EXCHANGE_NICE=-5``: give this thread (Linux: a thread has its own nice
    value) a higher priority than the training thread, so that on shared cores it runs as
    soon as data arrives, does its short work and sleeps again, instead of queueing behind
    backward for a time slice. Lowering nice below 0 needs CAP_SYS_NICE; without it the
    thread keeps the process's priority (a warning says so)."""
    try:
        level = int(value)
    except ValueError:
        warnings.warn(f"rank {rank}: RINGTUNE_EXCHANGE_NICE={value!r} is not an integer "
                      "(e.g. -5); the exchange thread keeps its priority", stacklevel=2)
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), level)
    except (OSError, AttributeError) as exc:
        warnings.warn(f"rank {rank}: cannot set the exchange thread's nice value to {level} "
                      f"({exc}); it keeps the process's priority", stacklevel=2)


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
