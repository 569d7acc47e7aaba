"""Set-up for the PyTorch tests, run under ``mpiexec -n K python -m mpi4py -m pytest
tests/torch`` in the torch environment (``make torch-test``). Every rank runs the same tests;
only rank 0 reports; assertions go through ``agree`` so a failure on one rank fails the test
on all of them. The gloo process group DDP needs is made once from MPI."""

from __future__ import annotations

import os
import sys

import pytest
from mpi4py import MPI

from ..mpi_support import agree, silence_other_ranks

__all__ = ["WORLD", "agree"]

WORLD = MPI.COMM_WORLD
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    silence_other_ranks(config, WORLD.Get_rank())


@pytest.fixture(scope="session", autouse=True)
def gloo() -> None:
    import torch
    import torch.distributed as dist
    from train_digits import init_gloo

    torch.set_num_threads(1)
    init_gloo(WORLD)
    yield
    dist.destroy_process_group()


@pytest.fixture()
def comm():
    """A fresh communicator (and so a fresh communication thread) per test, on its own
    duplicate of the world so that the tests' own MPI calls never interleave with it."""
    from collectives import Communicator

    c = Communicator(WORLD.Dup())
    yield c
    c.close()
    c.comm.Free()
