"""Helpers for tests that run under ``mpiexec`` (tests/mpi and the multi-rank GPU tests).

Every rank runs the same tests in the same order; only rank 0 reports, and a failure seen on
any rank fails the test on every rank (``agree``) instead of leaving the others to hang in
the next collective.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import pytest


def silence_other_ranks(config: pytest.Config, rank: int) -> None:
    """Ranks > 0 report through rank 0: their reports would interleave with rank 0's.
    pytest writes through the terminal reporter's own handle (a dup of stdout taken before
    conftest runs), so silence that; stderr stays open so a crash on any rank is visible.
    Call from a ``trylast`` ``pytest_configure`` (after the reporter exists)."""
    if rank > 0:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter._tw._file = open(os.devnull, "w")  # noqa: SIM115 - lives for the run


def agree(failures: Iterable[str], comm: Any = None, limit: int = 8) -> None:
    """Fail on every rank if any rank reported failures (each line names its rank)."""
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    mine = list(failures)[:limit]
    everyone = comm.allgather(mine)
    lines = [f"rank {r}: {msg}" for r, msgs in enumerate(everyone) for msg in msgs]
    if lines:
        pytest.fail("\n".join(lines[:limit]), pytrace=False)


def find_processes(env: Sequence[str] = (), cmdline: Sequence[str] = (),
                   live: bool = True) -> list[int]:
    """Pids of the processes (``/proc``) whose environment holds every ``NAME=value`` of
    ``env`` and whose command line has every word of ``cmdline`` as one of its arguments;
    ``live``: not zombies. For tests that find the ranks a run launched
    (``PMI_RANK=1``) or check that none is left behind; a process that ends while being
    read is skipped."""
    want_env = [e.encode() for e in env]
    want_cmd = [c.encode() for c in cmdline]
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
            args: list[bytes] = []
            if want_cmd:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    args = fh.read().split(b"\0")
            state = b""
            if live:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if (all(e in environ for e in want_env) and state != b"Z"
                and all(c in args for c in want_cmd)):
            found.append(int(pid))
    return found


def tuning_trials(db: str | os.PathLike[str], *attrs: str) -> list[tuple[Any, ...]]:
    """(study, number, state, config key, then the JSON value of each user attribute in
    ``attrs``) of every trial in a tuning run's Optuna SQLite storage; ``[]`` while the
    file or its tables do not exist yet (the run is starting). For tests that follow a
    ``ringtune tune`` run from outside."""
    import json
    import sqlite3

    if not os.path.exists(db):
        return []
    names = ("config", *attrs)
    columns = ", ".join(
        "(SELECT value_json FROM trial_user_attributes a "
        f"WHERE a.trial_id = t.trial_id AND a.key = '{name}')" for name in names)
    con = sqlite3.connect(db, timeout=10)
    try:
        rows = con.execute(
            f"SELECT s.study_name, t.number, t.state, {columns} "
            "FROM trials t JOIN studies s ON s.study_id = t.study_id").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()
    return [(s, n, st, json.loads(c)["key"] if c else None,
             *(json.loads(v) if v else None for v in rest))
            for s, n, st, c, *rest in rows]
