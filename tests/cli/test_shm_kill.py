"""The shared-memory allreduce as processes see it: a rank SIGKILLed in the middle of an
allreduce ends the job, and nothing of the job is left in /dev/shm (the segment was
unlinked once every rank had mapped it, so no exit path can leave it); beside a CPU hog on
every core, every result is right and nothing hangs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("shm_killed_job.py")
LOAD_JOB = Path(__file__).with_name("shm_load_job.py")

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")


def segments() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("ringtune-")}


_MAPS = re.compile(r"rank \d+ \(pid (\d+)\): maps in /dev/shm: ")


def job_report(out: str) -> tuple[set[str], set[str]]:
    """The pids of the job's ranks and the /dev/shm files they map, as
    ``shm_killed_job.py`` prints them (a launcher may run two ranks' lines together)."""
    pids: set[str] = set()
    files: set[str] = set()
    for m in _MAPS.finditer(out):
        pids.add(m.group(1))
        rest = out[m.end():].split("\n", 1)[0]
        following = _MAPS.search(rest)
        rest = rest[:following.start()] if following else rest
        files.update(name.split(" (deleted)")[0].strip() for name in rest.split(" | "))
    assert len(pids) == 3, out[-3000:]
    return pids, files - {""}


def left_by_the_job(out: str, before: set[str]) -> list[str]:
    """ringtune segments new since ``before`` that the job's ranks created (a segment's
    name holds its creator's pid): other jobs may come and go in /dev/shm meanwhile, and a
    concurrent test's segment is not this job's leak."""
    pids = job_report(out)[0]
    return sorted(s for s in segments() - before if any(f"-{p}-" in s for p in pids))


#: ``RINGTUNE_STALL_TIMEOUT`` of the kill tests' jobs: the survivors must end well within it.
STALL_S = 30


def check_named(out: str) -> None:
    """Whatever a survivor said (``ringtune: stall:`` and the line that ends the job)
    names the dead rank 1, as the cause rather than the call's arguments, found within the
    stall timeout."""
    for line in out.splitlines():
        if line.startswith("ringtune: stall:"):
            assert re.search(r"rank 1 \(pid \d+\) ended", line), line
            waited = re.search(r"waited ([0-9.]+) s", line)
            assert waited and float(waited.group(1)) < STALL_S, line
        if line.startswith("ringtune: rank ") and " failed: " in line:
            assert re.search(r"rank 1 \(pid \d+\) ended", line), line
            assert "the rank it names is gone or silent" in line, line
            assert "same size" not in line, line


def test_a_killed_rank_ends_the_job_and_nothing_is_left_in_dev_shm() -> None:
    """Hydra ends the survivors itself when a rank dies by a signal (even with
    ``-disable-auto-cleanup``, seen with MPICH 5.0), often before they can print: that
    they name the dead rank is checked where no launcher interferes
    (tests/torchrun/test_killed_rank.py, tests/unit/test_shm.py)."""
    before = segments()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "RINGTUNE_"))}
    env.update(PYTHONPATH=str(ROOT), RINGTUNE_STALL_TIMEOUT=str(STALL_S), OMP_NUM_THREADS="1")
    proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(JOB)], env=env,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "went unnoticed" not in out, out[-3000:]
    assert out.count("first allreduce done") == 3, out[-3000:]  # the segment was in use
    assert not left_by_the_job(out, before), f"left in /dev/shm: {left_by_the_job(out, before)}"
    check_named(out)  # whatever a survivor managed to say


def test_beside_a_hog_on_every_core_results_stay_right() -> None:
    before = segments()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "RINGTUNE_"))}
    env.update(PYTHONPATH=str(ROOT), RINGTUNE_STALL_TIMEOUT="60", OMP_NUM_THREADS="1")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]
    try:
        proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(LOAD_JOB)], env=env,
                              capture_output=True, text=True, timeout=240)
    finally:
        for hog in hogs:
            hog.send_signal(signal.SIGKILL)
            hog.wait()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("all 60 calls right") == 3, out[-3000:]
    assert segments() <= before, f"left in /dev/shm: {sorted(segments() - before)}"
