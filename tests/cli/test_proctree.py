"""The bounded launcher runner of the launcher suites (tests/proctree.py): a timeout ends
the whole process tree, grandchildren included, and keeps what the job printed."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.proctree import descendants, run_bounded

# A launcher stand-in: a shell that starts two "ranks" (one of them with a child of its
# own), prints their pids and waits.
TREE = ("sleep 300 & a=$!; sh -c 'sleep 300 & echo $!; wait' & b=$!; "
        "echo $a; echo $b; wait")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_a_timeout_kills_the_whole_tree() -> None:
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as err:
        run_bounded(["sh", "-c", TREE], timeout=2.0)
    assert time.monotonic() - t0 < 30
    printed = err.value.output or ""
    pids = [int(x) for x in printed.split()]
    assert len(pids) == 3, printed  # both ranks and the grandchild printed their pids
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "a rank outlived the timeout"


def test_a_job_that_ends_returns_its_output_and_code() -> None:
    res = run_bounded(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=30)
    assert (res.returncode, res.stdout, res.stderr) == (3, "out\n", "err\n")


def test_descendants_of_this_process() -> None:
    with subprocess.Popen(["sh", "-c", "sleep 30 & wait"]) as proc:
        try:
            deadline = time.monotonic() + 10
            while len(descendants(proc.pid)) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            kids = descendants(proc.pid)
            assert len(kids) == 1 and proc.pid in descendants(os.getpid())
        finally:
            for k in [*descendants(proc.pid), proc.pid]:
                os.kill(k, 9)
