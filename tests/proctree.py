"""Run a launcher (torchrun, mpiexec) bounded by a timeout that ends its whole process tree.

``subprocess.run(..., timeout=)`` kills only the process it started: a launcher's ranks,
its children, outlive it, reparented and still holding ports and memory. Starting the
launcher in a session of its own and killing the session would reach them, but it also
changes the job (torchrun's ranks then die of SIGABRT in gloo's teardown at exit on torch
2.14), so this walks the tree instead: on timeout every descendant is found through
``/proc/PID/task/TID/children`` (before any is killed: a killed parent's children are
reparented and lost to the walk) and killed, then the launcher.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid`` (children first, then theirs), from /proc."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue  # gone already
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as fh:
                    kids = [int(x) for x in fh.read().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in out:
                    out.append(kid)
                    todo.append(kid)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s descendants, then ``pid``: stop the tree from the root first (so
    the launcher cannot start or restart ranks), collect its members, then kill them."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return
    for kid in descendants(pid):
        try:
            os.kill(kid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_bounded(cmd: Sequence[str], timeout: float,
                **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)`` that on timeout
    kills the process tree and raises ``subprocess.TimeoutExpired`` with what the job
    printed so far."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired as left:
                # A process that escaped the walk still holds the pipes: stop reading.
                out, err = left.output, left.stderr
            if isinstance(out, bytes):
                out = out.decode(errors="replace")
            if isinstance(err, bytes):
                err = err.decode(errors="replace")
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
