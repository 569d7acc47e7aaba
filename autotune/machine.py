"""A tune that knows the machine: rank 0 samples how busy its host is before the search,
after each bucket and after the A/B choice (``probes.busy``), says so when it is busy, and
records the samples in the profile (``tuning.machine``).

Use ``TuneWatch`` in ``autotune.tuning`` (made collectively, sampled on rank 0 only);
``BUSY_MODES`` are ``ringtune tune --busy``'s values. A timing taken while other processes
take the cores the ranks spin on measures those processes: the issue that asked for this
saw a tune under load average 7.8 on 2 CPUs keep native where the idle machine gains
1.5-2x, and say nothing.

The record is kept in the storage (the first bucket's study, user attribute ``machine``)
when the run measured something, and reused when a rerun measured nothing, so a rerun with
nothing new still writes the same profile bytes.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from probes.busy import (
    MachineWatch,
    ProcReader,
    Sample,
    busy_reason,
    start_time,
    wait_for_quiet,
)

#: ``--busy``: ``warn`` says so and writes; ``wait`` first waits (``--busy-wait``) for a quiet
#: machine; ``refuse`` measures but writes no profile if the machine was busy (exit 2).
BUSY_MODES = ("warn", "wait", "refuse")
#: The study user attribute that holds the machine record of the run that measured.
MACHINE_ATTR = "machine"
#: The shortest window of the first sample: the tune's own set-up usually takes longer.
FIRST_WINDOW_S = 0.5
#: The shortest window of a sample during the tune: a shorter one (a small bucket's A/B
#: takes milliseconds) goes on into the next, and the last verdict stands meanwhile.
MIN_WINDOW_S = 0.5
#: Samples a profile records at most (before, one per bucket, after: tunes have a handful
#: of buckets; the cap bounds a hand-given ``--buckets`` list of hundreds).
MAX_SAMPLES = 40


def job_pids(comm: Any, reader: ProcReader | None = None) -> list[int]:
    """The process ids of ``comm``'s ranks that run on rank 0's machine (collective; the
    list is rank 0's): the job's own processes, whose CPU use is not "other processes". A
    rank is here when this machine has a process of its pid that started when it did:
    emulated hosts (``ringtune emulate``) have host names of their own but share the CPUs.
    Without ``/proc``, the ranks with rank 0's host name."""
    everyone = comm.allgather((socket.gethostname(), os.getpid(), start_time(reader=reader)))
    if comm.Get_rank() != 0:
        return []
    here = everyone[0][0]
    return [everyone[0][1]] + [  # rank 0 is this process
        pid for host, pid, start in everyone[1:]
        if (start_time(pid, reader) == start if start is not None else host == here)]


def warning_line(reason: str, mode: str) -> str:
    """The line said at the start when the machine is busy."""
    fix = {"warn": "--busy wait waits for a quiet machine, --busy refuse writes nothing "
                   "from a busy one",
           "wait": "--busy wait: waiting for a quiet machine",
           "refuse": "--busy refuse writes no profile from a busy machine; --busy warn "
                     "does"}.get(mode, "")
    return (f"ringtune: warning: the machine is busy: {reason}: timings will be unstable"
            + (f" ({fix})" if fix else ""))


class TuneWatch:
    """Rank 0's watch over its host for one tune; on other ranks every method does nothing.
    Collective to make (``job_pids``), local to use."""

    def __init__(self, comm: Any, mode: str = "warn", pids: list[int] | None = None,
                 out: TextIO | None = None, watch: MachineWatch | None = None) -> None:
        self.mode = mode
        gathered = job_pids(comm, watch.reader if watch else None)
        # Standard output, beside the plan of the run it qualifies: standard error is for
        # what went wrong (a refusal is one line there, and tests count on it).
        self.out = out or sys.stdout
        self.watch: MachineWatch | None = None
        if comm.Get_rank() == 0:
            ranks = pids or gathered
            self.watch = watch or MachineWatch(ranks, ranks_here=len(ranks))
        self.started = time.monotonic()
        #: The busiest busy sample's reason ("" while none was busy).
        self.reason = ""
        self._worst = -1.0
        #: The latest sample's verdict (a window too short to sample keeps it).
        self.verdict = ""

    def _note(self, got: Sample) -> str:
        """``got``'s verdict; the run's ``reason`` becomes it when it is the busiest yet
        (other processes' CPUs plus the load: both count tasks competing for the CPUs)."""
        why = busy_reason(got)
        score = (got.others_cpus or 0.0) + (got.load1 or 0.0)
        if why and score > self._worst:
            self.reason, self._worst = why, score
        return why

    def before(self, sleep: Callable[[float], None] = time.sleep) -> str:
        """Rank 0: the first sample (over the set-up so far, at least ``FIRST_WINDOW_S``),
        and when it is busy the warning line. Returns the reason it is busy, or ""."""
        if self.watch is None:
            return ""
        left = FIRST_WINDOW_S - (time.monotonic() - self.started)
        if left > 0:
            sleep(left)
        got = self.watch.sample("before")
        assert got is not None  # no shortest window asked for
        why = self.verdict = busy_reason(got)
        if why:
            print(warning_line(why, self.mode), file=self.out, flush=True)
        self._note(got)
        return why

    def wait(self, timeout_s: float, say: Callable[[str], None],
             sleep: Callable[[float], None] = time.sleep) -> str:
        """Rank 0, ``--busy wait``: wait up to ``timeout_s`` for a quiet window; the
        reason it is still busy, or "" (of the wait's windows only the quiet one it ends
        on is recorded, and the run's ``reason`` starts over from it)."""
        if self.watch is None:
            return ""
        got = wait_for_quiet(self.watch, timeout_s, say, sleep=sleep)
        why = self.verdict = busy_reason(got)
        if why:
            say(f"warning: still busy after {timeout_s:g} s ({why}): tuning anyway")
        else:
            # The tune starts now: what it records begins on the quiet machine.
            self.watch.samples.append(got)
            self.reason, self._worst = "", -1.0
        return why

    def sample(self, label: str) -> str:
        """Rank 0: the window since the last sample, recorded; why it was busy, or ""."""
        if self.watch is None:
            return ""
        if len(self.watch.samples) >= MAX_SAMPLES - 1 and label != "after":
            return self.verdict
        got = self.watch.sample(label, min_window_s=MIN_WINDOW_S)
        if got is not None:
            self.verdict = self._note(got)
        return self.verdict

    def record(self) -> dict[str, Any] | None:
        """Rank 0: the profile's ``tuning.machine`` mapping; ``None`` where nothing is
        known (no ``/proc``)."""
        if self.watch is None:
            return None
        known = [s for s in self.watch.samples if s.known]
        if not known:
            return None
        out: dict[str, Any] = {"cpus": known[-1].cpus, "ranks_here": self.watch.ranks_here}
        if self.reason:
            out["busy"] = self.reason
        out["samples"] = [s.record() for s in known[:MAX_SAMPLES]]
        return out


def summary_line(machine: Any, busy_now: str = "", whose: str = "this") -> str | None:
    """The summary's line about a busy machine (``ringtune tune``'s end, ``ringtune show``
    with ``whose="its"``), or ``None`` when the profile's tune ran on a quiet one.
    ``machine``: the profile's ``tuning.machine``; ``busy_now``: this run's reason."""
    why = busy_now or (machine.get("busy") if isinstance(machine, Mapping) else None)
    if not why:
        return None
    return (f"ringtune: warning: the machine was busy during {whose} tune ({why}): the "
            "timings are unstable; re-tune on a quiet machine (ringtune tune --busy wait), "
            "and distrust the rules marked !")


def save_record(storage: Any, study: str, record: dict[str, Any] | None) -> None:
    """Rank 0: keep the record of the run that measured in ``study``'s user attributes."""
    if record is not None:
        storage.set_study_user_attr(storage.get_study_id_from_name(study), MACHINE_ATTR,
                                    record)


def load_record(storage: Any, study: str) -> dict[str, Any] | None:
    """Rank 0: the record kept by the last run that measured (``None`` before any)."""
    got = storage.get_study_user_attrs(storage.get_study_id_from_name(study)).get(MACHINE_ATTR)
    return got if isinstance(got, dict) else None
