"""Shared set-up for tests run under ``mpiexec -n K python -m mpi4py -m pytest tests/mpi``.

Every rank runs the same tests in the same order. Only rank 0 reports (the others' terminal
reporter is removed; their exit code still counts). Assertions go through ``agree`` so that
a failure seen on one rank fails the test on every rank instead of leaving ranks to hang in
the next collective.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pytest
from mpi4py import MPI

WORLD = MPI.COMM_WORLD


@pytest.hookimpl(trylast=True)  # after the terminal plugin has made its reporter
def pytest_configure(config: pytest.Config) -> None:
    if WORLD.Get_rank() > 0:
        # Ranks > 0 report through rank 0 (see ``agree``); their reports would interleave
        # with rank 0's. pytest writes through the terminal reporter's own handle (a dup of
        # stdout taken before conftest runs), so silence that; stderr stays open so a crash
        # on any rank is still visible.
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter._tw._file = open(os.devnull, "w")  # noqa: SIM115 - lives for the run


def agree(failures: Iterable[str], comm: MPI.Comm = WORLD, limit: int = 8) -> None:
    """Fail on every rank if any rank reported failures (each names its rank)."""
    mine = list(failures)[:limit]
    everyone = comm.allgather(mine)
    lines = [f"rank {r}: {msg}" for r, msgs in enumerate(everyone) for msg in msgs]
    if lines:
        pytest.fail("\n".join(lines[:limit]), pytrace=False)


@pytest.fixture(scope="session")
def world() -> MPI.Comm:
    return WORLD


@pytest.fixture(scope="session")
def comm():
    from collectives import Communicator

    c = Communicator(WORLD)
    yield c
    c.close()
