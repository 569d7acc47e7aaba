"""The transport contract (``collectives/testing/transport_contract.py``) on GPU buffers: every
registered user transport that moves CuPy buffers over the ``mpi`` engine (asked of the registries:
``staged``, ``nccl``, CUDA-aware ``mpi``, a plug-in's tomorrow), each check on the world (and its
``Dup()``/``Split()``). One not available on every rank here (``nccl`` where ranks share a GPU,
``mpi`` without CUDA-aware MPI) is skipped with what every rank has. Runs on the simulated GPU in
``make gpu-sim`` (every rank count, CUDA-aware MPI, one GPU per rank)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collectives.testing import transport_contract as tc

from .conftest import GPU_OK, agree

TRANSPORTS = tc.runnable("mpi", "cupy")
RUN, LEFT = tc.cases(TRANSPORTS)


def _world() -> Any:
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _upload(host: np.ndarray) -> Any:
    """A device copy, ready before any transport reads it (the copy is on the current
    stream; the transports order their own streams after the backend's)."""
    import cupy

    dev = cupy.asarray(host)
    cupy.cuda.get_current_stream().synchronize()
    return dev


@pytest.mark.parametrize("name,check", RUN, ids=[f"{n}-{c}" for n, c in RUN])
def test_gpu_transport_contract(name: str, check: str) -> None:
    assert GPU_OK  # the conftest skips the directory otherwise
    from collectives.cuda import available_transports

    world = _world()
    everyone = world.allgather(available_transports(world))
    if not all(name in have for have in everyone):
        pytest.skip(f"transport {name!r} is not available on every rank here: "
                    + "; ".join(f"rank {r}: {', '.join(h) or 'none'}"
                                for r, h in enumerate(everyone)))
    setup = tc.Setup(transport=name, backend="cupy", upload=_upload)
    agree(tc.run(world, setup, check))


@pytest.mark.parametrize("name,why", LEFT, ids=[n for n, _ in LEFT])
def test_gpu_transport_left_to_another_runner(name: str, why: str) -> None:
    pytest.skip(why)
