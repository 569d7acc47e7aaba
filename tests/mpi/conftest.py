"""Shared set-up for tests run under ``mpiexec -n K python -m mpi4py -m pytest tests/mpi``.

Every rank runs the same tests in the same order. Only rank 0 reports (the others' terminal
reporter is removed; their exit code still counts). Assertions go through ``agree`` so that
a failure seen on one rank fails the test on every rank instead of leaving ranks to hang in
the next collective.
"""

from __future__ import annotations

import pytest
from mpi4py import MPI

from ..mpi_support import agree, silence_other_ranks

__all__ = ["WORLD", "agree"]  # what the test modules import from here

WORLD = MPI.COMM_WORLD


@pytest.hookimpl(trylast=True)  # after the terminal plugin has made its reporter
def pytest_configure(config: pytest.Config) -> None:
    silence_other_ranks(config, WORLD.Get_rank())


@pytest.fixture(scope="session")
def world() -> MPI.Comm:
    return WORLD


@pytest.fixture(scope="session")
def comm():
    from collectives import Communicator

    c = Communicator(WORLD)
    yield c
    c.close()
