"""The transport contract (``collectives/testing/transport_contract.py``) over the test-only
``inproc`` transport, in-process: threads stand for ranks (``tests/inproc.py``), world sizes 1..5.
The same checks run over real transports under ``mpiexec`` (``tests/mpi``), torchrun
(``tests/torchrun``) and the simulated GPU (``tests/gpu``); this runner proves the suite on
the stand-in every in-process test relies on."""

from __future__ import annotations

from typing import Any

import pytest

from collectives.testing import transport_contract as tc
from tests import inproc


@pytest.fixture(autouse=True)
def _inproc() -> None:
    inproc.register()


@pytest.mark.parametrize("check", list(tc.CHECKS))
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_inproc_transport_contract(n: int, check: str) -> None:
    setup = tc.Setup(transport="inproc")

    def rank(world: Any) -> list[str]:
        why = tc.not_run(world, setup, check)
        if why:
            return [f"inproc: {why}"]  # the stand-in must run every check
        return tc.CHECKS[check](world, setup)

    fails = [f"rank {r}: {line}" for r, lines in enumerate(inproc.run_ranks(n, rank))
             for line in lines]
    assert not fails, "\n".join(fails[:12])
