"""Set-up for the tests run under torchrun, one pytest per rank, with torch.distributed as
ringtune's engine (``make torchrun-test``)::

    torchrun --standalone --nproc-per-node N --no-python .venv-torch/bin/python \\
        -m pytest -q -p no:cacheprovider tests/torchrun

Every rank runs the same tests in the same order; only rank 0 reports; assertions go
through ``agree`` (an allgather over the world group) so that a failure on one rank fails
the test on every rank instead of leaving the others waiting in the next collective. The
gloo world group is made once, with a bounded timeout: a rank that stops answering fails
its peers within two minutes, never hangs the run. Outside torchrun the whole directory
is skipped with the reason.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from ..mpi_support import silence_other_ranks

__all__ = ["RANK", "SIZE", "TIMEOUT", "agree", "world"]

#: Seconds any collective of the test world (and ringtune's sub-groups of it) may wait.
TIMEOUT = datetime.timedelta(seconds=120)
RANK = int(os.environ.get("RANK", "0"))
SIZE = int(os.environ.get("WORLD_SIZE", "1"))
UNDER_TORCHRUN = "TORCHELASTIC_RUN_ID" in os.environ
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

collect_ignore_glob = [] if UNDER_TORCHRUN else ["test_*.py"]


def pytest_report_header(config: pytest.Config) -> str:
    return (f"tests/torchrun: {SIZE} rank(s) under torchrun" if UNDER_TORCHRUN else
            "tests/torchrun: skipped (run them under torchrun: make torchrun-test)")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    silence_other_ranks(config, RANK)
    if UNDER_TORCHRUN:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=TIMEOUT)


_AGREE: Any = None


def world() -> Any:
    """The world group as a ``TorchComm`` (what ``contract.communicator`` splits)."""
    global _AGREE
    if _AGREE is None:
        import torch.distributed as dist

        from collectives.engines.torch import TorchComm

        _AGREE = TorchComm(dist.group.WORLD)
    return _AGREE


def agree(failures: Iterable[str], limit: int = 8) -> None:
    """Fail on every rank if any rank reported failures (each line names its rank)."""
    mine = list(failures)[:limit]
    lines = [f"rank {r}: {m}" for r, msgs in enumerate(world().allgather(mine)) for m in msgs]
    if lines:
        pytest.fail("\n".join(lines[:limit]), pytrace=False)


@pytest.fixture()
def comm() -> Iterator[Any]:
    """A fresh ``Communicator(torch.distributed.group.WORLD)`` per test."""
    import torch.distributed as dist

    from collectives import Communicator

    c = Communicator(dist.group.WORLD)
    yield c
    c.close()
