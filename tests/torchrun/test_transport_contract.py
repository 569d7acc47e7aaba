"""The transport contract (``collectives/testing/transport_contract.py``) over the ``torch``
engine, under torchrun: every registered user transport the engine runs on host buffers (asked of
the registries: ``torch``, over gloo), each check on the world group (and its ``Dup()`` and
``Split()``: gloo groups of ringtune's own). Transports this runner cannot run are skipped with the
reason and the runner that tests them (``-rs``)."""

from __future__ import annotations

import pytest

from collectives.testing import transport_contract as tc

from .conftest import agree, world

TRANSPORTS = tc.runnable("torch", "numpy")
RUN, LEFT = tc.cases(TRANSPORTS)


@pytest.mark.parametrize("name,check", RUN, ids=[f"{n}-{c}" for n, c in RUN])
def test_transport_contract(name: str, check: str) -> None:
    setup = tc.Setup(transport=name)
    agree(tc.run(world(), setup, check))


@pytest.mark.parametrize("name,why", LEFT, ids=[n for n, _ in LEFT])
def test_transport_left_to_another_runner(name: str, why: str) -> None:
    pytest.skip(why)


def test_the_torch_transport_is_among_those_run() -> None:
    agree([] if ("torch", "") in TRANSPORTS else [f"torch not runnable: {TRANSPORTS}"])
