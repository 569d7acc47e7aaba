"""How busy this machine is: the load average, the CPUs busy in total, and the CPU share of
the processes that are not the job's own, with the three busiest named.

Use ``MachineWatch`` where timings are about to be taken and their stability matters (``ringtune
tune`` samples before its search, after each bucket and after the A/B choice): a timing
taken while other processes take the CPUs the ranks spin on measures the other processes.
``MachineWatch.sample(label)`` reports the window since the previous sample; ``busy_reason``
says whether a sample's machine was busy, and why, in one phrase; ``wait_for_quiet`` waits,
bounded, for a sample that is not.

Linux only (``/proc``): elsewhere, or where ``/proc`` cannot be read, a sample says nothing
(``Sample.known`` false) and nothing is ever busy. Only this host is observed: the ranks on
other hosts of a multi-host job are not. Every read goes through a ``ProcReader`` (a fake in
the unit tests) and reads at most ``MAX_PROCS`` processes, so a sample costs milliseconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

#: Processes read per sample at most (a login node has a few thousand; each read is one small
#: file): beyond it the rest are not named, and the total still counts them (``/proc/stat``).
MAX_PROCS = 4096
#: Other processes may use this much of one CPU beyond the CPUs the job leaves free before
#: the machine counts as busy: a shell, an editor or a monitor stay below it, while one
#: process computing beside the ranks (a build, a second tune, a test suite) is far above it
#: and takes a rank's core away for a quarter of the time or more, which moves a timing by
#: more than the tuner's default --margin of 3%.
OTHERS_SLACK_CPUS = 0.25
#: The load average may exceed the job's ranks and the CPUs it leaves free by this many
#: runnable tasks before the machine counts as busy. The load average lags (one minute) and
#: counts short-lived tasks that the per-process shares miss (a build's compilers); a whole
#: task more than the CPUs is a queue, not a blip.
LOAD_SLACK = 1.0
#: Processes named in a sample: the busiest ones, by command name, each using at least
#: ``MIN_NAMED_CPUS`` (a kernel worker's 0.01 CPU is no news).
TOP = 3
MIN_NAMED_CPUS = 0.05


class ProcReader(Protocol):
    """Where samples come from: ``/proc`` (``LinuxProc``), or a fake in the unit tests."""

    def text(self, path: str) -> str | None:
        """The text of a file under ``/proc`` (``loadavg``, ``stat``, ``1234/stat``), or
        ``None`` when it cannot be read (a process that ended, no ``/proc``)."""

    def pids(self) -> list[int]:
        """The process ids now listed under ``/proc``."""

    def clock(self) -> float:
        """Monotonic seconds."""


class LinuxProc:
    """The real ``/proc``."""

    root = "/proc"

    def text(self, path: str) -> str | None:
        try:
            with open(os.path.join(self.root, path), encoding="utf-8",
                      errors="replace") as fh:
                return fh.read(65536)
        except OSError:
            return None

    def pids(self) -> list[int]:
        try:
            return [int(name) for name in os.listdir(self.root) if name.isdigit()]
        except OSError:
            return []

    def clock(self) -> float:
        return time.monotonic()


@dataclass(frozen=True)
class Proc:
    """One process as ``/proc/PID/stat`` says: its command name, parent and CPU ticks."""

    comm: str
    ppid: int
    ticks: int
    #: When it started (clock ticks since boot): with the pid, it names one process of
    #: this machine's boot (a pid alone may be another host's, or reused).
    start: int = 0


@dataclass(frozen=True)
class Reading:
    """``/proc`` at one moment; two readings make a ``Sample``."""

    at: float
    load1: float | None
    cpus: int
    total_ticks: int
    idle_ticks: int
    procs: Mapping[int, Proc] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    """The machine over one window: ``load1`` (the load average at its end), ``busy_cpus``
    (CPUs busy in total, any process or the kernel), ``job_cpus`` (the job's processes) and
    ``others_cpus`` (every other process; ``top``: the busiest by command name)."""

    label: str
    seconds: float
    cpus: int
    ranks_here: int
    load1: float | None = None
    busy_cpus: float | None = None
    job_cpus: float | None = None
    others_cpus: float | None = None
    top: tuple[tuple[str, float], ...] = ()

    @property
    def known(self) -> bool:
        """Whether ``/proc`` could be read (else the sample says nothing)."""
        return self.cpus > 0 and self.others_cpus is not None

    def record(self) -> dict[str, Any]:
        """The plain mapping a profile's ``tuning.machine.samples`` holds."""
        out: dict[str, Any] = {"at": self.label, "seconds": round(self.seconds, 1)}
        if self.load1 is not None:
            out["load"] = round(self.load1, 2)
        for key, value in (("busy_cpus", self.busy_cpus), ("job_cpus", self.job_cpus),
                           ("others_cpus", self.others_cpus)):
            if value is not None:
                out[key] = round(value, 2)
        if self.top:
            out["top"] = [f"{name} {cpus:.2f}" for name, cpus in self.top]
        return out


def parse_stat_line(text: str) -> Proc | None:
    """``/proc/PID/stat`` as a ``Proc``; ``None`` for anything unreadable. The command name
    is in parentheses and may itself hold spaces and parentheses: the fields follow the
    last ``)``."""
    head, sep, tail = text.rpartition(")")
    if not sep or "(" not in head:
        return None
    fields = tail.split()
    try:
        # Fields 4 (ppid), 14 (utime), 15 (stime) and 22 (starttime) of proc(5); the state
        # is field 3.
        start = int(fields[19]) if len(fields) > 19 else 0
        return Proc(head.split("(", 1)[1], int(fields[1]), int(fields[11]) + int(fields[12]),
                    start)
    except (IndexError, ValueError):
        return None


def start_time(pid: int | str = "self", reader: ProcReader | None = None) -> int | None:
    """When process ``pid`` started (``Proc.start``), ``None`` where ``/proc`` says nothing:
    with the pid, what tells a rank on this machine from a rank elsewhere that happens to
    have the same pid."""
    proc = parse_stat_line((reader or LinuxProc()).text(f"{pid}/stat") or "")
    return proc.start if proc is not None and proc.start > 0 else None


def read(reader: ProcReader, max_procs: int = MAX_PROCS) -> Reading:
    """One reading of ``reader`` (zeros where ``/proc`` says nothing)."""
    at = reader.clock()
    load1: float | None = None
    loadavg = reader.text("loadavg")
    if loadavg:
        try:
            load1 = float(loadavg.split()[0])
        except (IndexError, ValueError):
            load1 = None
    cpus, total, idle = 0, 0, 0
    for line in (reader.text("stat") or "").splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            try:
                ticks = [int(x) for x in rest.split()]
            except ValueError:
                continue
            # user nice system idle iowait irq softirq steal (guest is inside user).
            total, idle = sum(ticks[:8]), sum(ticks[3:5])
        elif name.startswith("cpu") and name[3:].isdigit():
            cpus += 1
    procs: dict[int, Proc] = {}
    for pid in sorted(reader.pids())[:max_procs]:
        proc = parse_stat_line(reader.text(f"{pid}/stat") or "")
        if proc is not None:
            procs[pid] = proc
    return Reading(at, load1, cpus, total, idle, procs)


def job_processes(procs: Mapping[int, Proc], ranks: Iterable[int]) -> set[int]:
    """The job's processes among ``procs``: its ranks, their ancestors (the launcher:
    ``ringtune``, ``mpiexec``, Hydra's proxy; the shell above them, idle) and their
    descendants. A process beside them (a sibling of ``ringtune`` started by the same
    shell) is another's."""
    job = {pid for pid in ranks if pid > 0}
    for pid in list(job):
        seen = 0
        while pid in procs and seen < 64:  # bounded: a ppid cycle cannot hang it
            pid = procs[pid].ppid
            if pid <= 0:
                break
            job.add(pid)
            seen += 1
    children: dict[int, list[int]] = {}
    for pid, proc in procs.items():
        children.setdefault(proc.ppid, []).append(pid)
    todo = [pid for pid in ranks if pid > 0]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in job:
                job.add(child)
                todo.append(child)
    return job


def window(before: Reading, after: Reading, ranks: Collection[int], label: str,
           ticks_per_s: float, ranks_here: int) -> Sample:
    """The sample of the window between two readings. A process in ``after`` only started
    inside the window: all its ticks are the window's."""
    seconds = max(after.at - before.at, 0.0)
    if after.cpus <= 0 or seconds <= 0 or ticks_per_s <= 0:
        return Sample(label, seconds, after.cpus, ranks_here, load1=after.load1)
    job = job_processes(after.procs, ranks)
    job_t = 0.0
    others: dict[str, float] = {}
    for pid, proc in after.procs.items():
        old = before.procs.get(pid)
        # The same pid with fewer ticks is a new process that reused the number.
        delta = proc.ticks - old.ticks if old and old.ticks <= proc.ticks else proc.ticks
        cpus = delta / ticks_per_s / seconds
        if pid in job:
            job_t += cpus
        elif cpus > 0:
            others[proc.comm] = others.get(proc.comm, 0.0) + cpus
    total = after.total_ticks - before.total_ticks
    busy = None
    if total > 0:
        busy = after.cpus * (1 - (after.idle_ticks - before.idle_ticks) / total)
    named = [kv for kv in others.items() if kv[1] >= MIN_NAMED_CPUS]
    top = tuple(sorted(named, key=lambda kv: (-kv[1], kv[0]))[:TOP])
    return Sample(label, seconds, after.cpus, ranks_here, load1=after.load1, busy_cpus=busy,
                  job_cpus=job_t, others_cpus=sum(others.values()), top=top)


def busy_reason(sample: Sample) -> str:
    """Why the machine was busy in ``sample`` (one phrase), or ``""`` when it was not (or
    nothing is known). Busy: other processes used more than the CPUs the job's ranks on this
    host leave free plus ``OTHERS_SLACK_CPUS``, or the load average exceeded the ranks and
    those free CPUs by more than ``LOAD_SLACK``."""
    if not sample.known:
        return ""
    free = max(0, sample.cpus - sample.ranks_here)
    why = []
    if sample.load1 is not None and sample.load1 > sample.ranks_here + free + LOAD_SLACK:
        why.append(f"load {sample.load1:.1f} on {sample.cpus} CPUs")
    others = sample.others_cpus or 0.0
    if others > free + OTHERS_SLACK_CPUS:
        named = ", ".join(f"{name} {cpus:.1f}" for name, cpus in sample.top)
        why.append(f"other processes use {others:.1f} CPUs" + (f" ({named})" if named else ""))
    if not why:
        return ""
    if sample.load1 is not None and not why[0].startswith("load"):
        why.insert(0, f"load {sample.load1:.1f} on {sample.cpus} CPUs")
    return "; ".join(why)


class MachineWatch:
    """Samples of this machine, each over the window since the previous one. ``ranks``: the
    job's rank processes on this host (their ancestors and descendants are the job's too);
    ``ranks_here``: how many CPUs they spin on (the count of ranks here)."""

    def __init__(self, ranks: Collection[int], ranks_here: int | None = None,
                 reader: ProcReader | None = None, max_procs: int = MAX_PROCS) -> None:
        self.reader: ProcReader = reader or LinuxProc()
        self.ranks = set(ranks)
        self.ranks_here = len(self.ranks) if ranks_here is None else ranks_here
        self.max_procs = max_procs
        try:
            self.ticks_per_s = float(os.sysconf("SC_CLK_TCK"))
        except (ValueError, OSError, AttributeError):
            self.ticks_per_s = 100.0  # Linux's USER_HZ everywhere it runs
        self.last = read(self.reader, max_procs)
        self.samples: list[Sample] = []

    def sample(self, label: str, keep: bool = True, min_window_s: float = 0.0
               ) -> Sample | None:
        """The window since the previous sample (or since the watch was made); ``keep``:
        add it to ``samples`` (the record a tune writes). ``None`` when less than
        ``min_window_s`` has passed: the window then goes on into the next sample (CPU
        time is counted in ticks of 10 ms, so a window of a few ticks is mostly rounding)."""
        if min_window_s > 0 and self.reader.clock() - self.last.at < min_window_s:
            return None
        now = read(self.reader, self.max_procs)
        got = window(self.last, now, self.ranks, label, self.ticks_per_s, self.ranks_here)
        self.last = now
        if keep:
            self.samples.append(got)
        return got


def wait_for_quiet(watch: MachineWatch, timeout_s: float, say: Callable[[str], None],
                   window_s: float = 5.0, sleep: Callable[[float], None] = time.sleep,
                   every_s: float = 30.0) -> Sample:
    """Sample windows of ``window_s`` until one is not busy or ``timeout_s`` have passed;
    ``say`` a line when it starts waiting and every ``every_s``. Returns the last sample
    (busy if the wait ran out)."""
    start = watch.reader.clock()
    last_said = start
    said = False
    while True:
        sleep(window_s)
        got = watch.sample("waiting", keep=False)
        assert got is not None  # no shortest window asked for
        why = busy_reason(got)
        now = watch.reader.clock()
        if not why:
            if said:
                say(f"the machine is quiet after {now - start:.0f} s: starting")
            return got
        if not said or now - last_said >= every_s:
            say(f"waiting for a quiet machine ({why}); {now - start:.0f} of "
                f"{timeout_s:g} s")
            said, last_said = True, now
        if now - start >= timeout_s:
            return got
