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
import ctypes
import os
import platform
import queue
import sys
import threading
import time
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

#: The communication thread's scheduler slice (µs) unless ``RINGTUNE_EXCHANGE_SLICE_US``
#: says otherwise; ``None``: the kernel's (~1.4 ms on 2 CPUs). On Linux ≥ 6.12 (EEVDF with
#: ``PREEMPT_SHORT``) a waking thread whose slice is shorter preempts the running one, so a
#: short slice (e.g. 100) lets data that arrives during backward move on at once instead of
#: after backward's slice: the traces of BENCHMARKS.md (issue 11, third pass) showed the
#: thread runnable but off-CPU 4–40 ms of each 4 MB bucket. Measured side by side it was not
#: a clear gain (+3 and −18 points of overlap in two runs: preempting backward more often
#: costs backward too), so it is opt-in. Needs no privilege (unlike a lower nice value).
DEFAULT_SLICE_US: float | None = None

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
        if self._closed:
            fut.set_exception(self._closed_error())
            return fut
        if self._trace is not None:
            fn = self._trace.wrap(fn, label)
        self._jobs.put((fut, fn, args))
        return fut

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
        rank = getattr(self.comm, "rank", 0)
        nice = os.environ.get("RINGTUNE_EXCHANGE_NICE", "").strip()
        if nice:
            _renice(nice, rank)
        _start_latency(rank)
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


class _SchedAttr(ctypes.Structure):
    """Linux's ``struct sched_attr`` (``sched_setattr(2)``)."""

    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32),
                ("sched_flags", ctypes.c_uint64), ("sched_nice", ctypes.c_int32),
                ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
                ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64),
                ("sched_util_min", ctypes.c_uint32), ("sched_util_max", ctypes.c_uint32)]


_SYS_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}
_PR_SET_TIMERSLACK = 29


def set_thread_latency(slice_us: float | None = None,
                       slack_us: float | None = None) -> list[str]:
    """On the calling thread (Linux): ask for a scheduler slice of ``slice_us`` (``0``: the
    kernel's default; see ``DEFAULT_SLICE_US``) and a timer slack of ``slack_us`` (how late
    the kernel may end this thread's sleeps, e.g. MPICH's throttled ``usleep(1)`` between
    polls; the kernel's default is 50 µs: a larger slack means fewer wake-ups while a
    transfer waits on a slow link). ``None`` leaves a setting as it is. Returns what could
    not be set (empty when all was), so a caller decides whether to warn: the call runs on
    the thread whose settings change, e.g. the communication thread (``Exchanger.submit``)."""
    problems: list[str] = []
    if not sys.platform.startswith("linux"):
        return [f"thread scheduling settings are Linux-only (here: {sys.platform})"]
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as exc:
        return [f"no C library to call ({exc})"]
    if slice_us is not None:
        nr = _SYS_SCHED_SETATTR.get(platform.machine())
        if nr is None:
            problems.append(f"sched_setattr: unknown syscall number on {platform.machine()}")
        else:
            # SCHED_OTHER at the thread's own nice value: only the slice changes.
            nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            attr = _SchedAttr(size=ctypes.sizeof(_SchedAttr), sched_policy=0,
                              sched_nice=nice, sched_runtime=int(slice_us * 1000))
            if libc.syscall(nr, 0, ctypes.byref(attr), 0) != 0:
                err = ctypes.get_errno()
                problems.append(f"sched_setattr(slice {slice_us} µs): {os.strerror(err)}")
    if slack_us is not None:
        # 0 would mean "the process's default", not "no slack": 1 ns is the least.
        if libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(max(1, int(slack_us * 1000))),
                      0, 0, 0) != 0:
            problems.append(f"prctl(PR_SET_TIMERSLACK): {os.strerror(ctypes.get_errno())}")
    return problems


def _env_us(name: str, default: float | None, rank: int) -> tuple[float | None, bool]:
    """(µs, given explicitly) from ``name``; ``off`` means the kernel's default (0 µs)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default, False
    if raw == "off":
        return 0.0, True
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        warnings.warn(f"rank {rank}: {name}={raw!r} is not a number of µs ≥ 0 (or off); "
                      "using the default", stacklevel=3)
        return default, False
    return value, True


def _start_latency(rank: int) -> None:
    """The communication thread's slice and timer slack (``RINGTUNE_EXCHANGE_SLICE_US``,
    default ``DEFAULT_SLICE_US``; ``RINGTUNE_EXCHANGE_SLACK_US``, default the kernel's;
    e.g. ``RINGTUNE_EXCHANGE_SLICE_US=100``).
    A default that the kernel refuses is silent; a value the user set warns."""
    slice_us, slice_set = _env_us("RINGTUNE_EXCHANGE_SLICE_US", DEFAULT_SLICE_US, rank)
    slack_us, slack_set = _env_us("RINGTUNE_EXCHANGE_SLACK_US", None, rank)
    if slice_us is None and slack_us is None:
        return
    problems = set_thread_latency(slice_us, slack_us)
    if problems and (slice_set or slack_set):
        warnings.warn(f"rank {rank}: the exchange thread keeps the kernel's scheduling "
                      f"settings: {'; '.join(problems)}", stacklevel=2)


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
