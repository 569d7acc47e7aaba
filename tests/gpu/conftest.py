"""Shared set-up of the GPU tests: skip everything, with the reason, where there is no GPU.

Run single-process (``pytest tests/gpu``, world size 1) or under
``mpiexec -n K python -m mpi4py -m pytest tests/gpu``. With ``RINGTUNE_FAKE_GPU=1``
they run on the CPU against the simulated GPU of ``tests/fakegpu`` (``make gpu-sim``).
Multi-rank assertions go through ``agree`` so that every rank fails together (no rank left
hanging in a collective).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("RINGTUNE_FAKE_GPU") == "1":
    # The simulated GPU (tests/fakegpu/cupy): first on the path of this process and of the
    # ranks it launches, before anything imports CuPy.
    _FAKE = str(Path(__file__).resolve().parents[1] / "fakegpu")
    sys.path.insert(0, _FAKE)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_FAKE, os.environ.get("PYTHONPATH")) if p)

from collectives.cuda.detect import cupy_status  # noqa: E402 - after the simulated GPU

from ..mpi_support import agree, silence_other_ranks

GPU_OK, GPU_WHY = cupy_status()

__all__ = ["GPU_OK", "GPU_WHY", "agree"]  # what the test modules import from here


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if GPU_OK:
        return
    skip = pytest.mark.skip(reason=f"no GPU here: {GPU_WHY}")
    here = Path(__file__).parent
    for item in items:
        # This hook sees the whole session's items: mark only the GPU tests.
        if here in Path(item.path).parents:
            item.add_marker(skip)


@pytest.hookimpl(trylast=True)  # after the terminal plugin has made its reporter
def pytest_configure(config: pytest.Config) -> None:
    from mpi4py import MPI

    silence_other_ranks(config, MPI.COMM_WORLD.Get_rank())


@pytest.fixture(scope="session")
def backend() -> Any:
    from collectives.registry import get_backend

    return get_backend("cupy")
