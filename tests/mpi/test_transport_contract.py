"""The transport contract (``collectives/testing/transport_contract.py``) under ``mpiexec``, at any
world size: every registered user transport that the ``mpi`` engine runs on host buffers (asked of
the registries: ``mpi``, and a plug-in's tomorrow), each check on the world (and its
``Dup()``/``Split()``). Transports this runner cannot run are skipped with the reason and the
runner that tests them (``-rs``)."""

from __future__ import annotations

import pytest

from collectives.testing import transport_contract as tc

from .conftest import WORLD, agree

TRANSPORTS = tc.runnable("mpi", "numpy")
RUN, LEFT = tc.cases(TRANSPORTS)


@pytest.mark.parametrize("name,check", RUN, ids=[f"{n}-{c}" for n, c in RUN])
def test_transport_contract(name: str, check: str) -> None:
    setup = tc.Setup(transport=name)
    agree(tc.run(WORLD, setup, check))


@pytest.mark.parametrize("name,why", LEFT, ids=[n for n, _ in LEFT])
def test_transport_left_to_another_runner(name: str, why: str) -> None:
    pytest.skip(why)


def test_the_mpi_transport_is_among_those_run() -> None:
    """The registry question is not empty here: the built-in transport is always run."""
    agree([] if ("mpi", "") in TRANSPORTS else [f"mpi not runnable: {TRANSPORTS}"])
