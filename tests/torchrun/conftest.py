"""Set-up for the tests run under torchrun, one pytest per rank, with torch.distributed as
ringtune's engine (``make torchrun-test``)::

    torchrun --standalone --nproc-per-node N --no-python .venv-torch/bin/python \\
        -m pytest -q -p no:cacheprovider tests/torchrun

The default group is gloo's, made once with a bounded timeout; assertions go through
``agree`` over it (``tests/torchutil.py``: what this suite shares with tests/torchbackend).
Outside torchrun the whole directory is skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..torchutil import COLLECT_IGNORE, RANK, SIZE, TIMEOUT, Agreement, configure, report_header

__all__ = ["RANK", "SIZE", "TIMEOUT", "agree", "world"]

collect_ignore_glob = COLLECT_IGNORE


def _world_group() -> Any:
    import torch.distributed as dist

    return dist.group.WORLD


_AGREEMENT = Agreement(_world_group)
#: The world group as a ``TorchComm`` (what ``contract.communicator`` splits).
world = _AGREEMENT.world
agree = _AGREEMENT.agree


def pytest_report_header(config: pytest.Config) -> str:
    return report_header("tests/torchrun", "", "torchrun-test")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    configure(config, "gloo")


@pytest.fixture()
def comm() -> Iterator[Any]:
    """A fresh ``Communicator(torch.distributed.group.WORLD)`` per test."""
    import torch.distributed as dist

    from collectives import Communicator

    c = Communicator(dist.group.WORLD)
    yield c
    c.close()
