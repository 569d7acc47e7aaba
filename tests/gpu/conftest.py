"""Shared set-up of the GPU tests: skip everything, with the reason, where there is no GPU.

Run single-process (``pytest tests/gpu``, world size 1) or under
``mpiexec -n K python -m mpi4py -m pytest tests/gpu``. Multi-rank assertions go through
``agree`` so that every rank fails together (no rank left hanging in a collective).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from collectives.cuda.detect import cupy_status

GPU_OK, GPU_WHY = cupy_status()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if GPU_OK:
        return
    skip = pytest.mark.skip(reason=f"no GPU here: {GPU_WHY}")
    here = Path(__file__).parent
    for item in items:
        # This hook sees the whole session's items: mark only the GPU tests.
        if here in Path(item.path).parents:
            item.add_marker(skip)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() > 0:
        # Only rank 0 reports (see tests/mpi/conftest.py); stderr stays open for crashes.
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter._tw._file = open(os.devnull, "w")  # noqa: SIM115 - lives for the run


def agree(failures: Iterable[str], comm: Any = None, limit: int = 8) -> None:
    """Fail on every rank if any rank reported failures (each names its rank)."""
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    mine = list(failures)[:limit]
    everyone = comm.allgather(mine)
    lines = [f"rank {r}: {msg}" for r, msgs in enumerate(everyone) for msg in msgs]
    if lines:
        pytest.fail("\n".join(lines[:limit]), pytrace=False)


@pytest.fixture(scope="session")
def backend() -> Any:
    from collectives.backend import get_backend

    return get_backend("cupy")
