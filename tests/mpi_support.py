"""Helpers for tests that run under ``mpiexec`` (tests/mpi and the multi-rank GPU tests).

Every rank runs the same tests in the same order; only rank 0 reports, and a failure seen on
any rank fails the test on every rank (``agree``) instead of leaving the others to hang in
the next collective.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
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
