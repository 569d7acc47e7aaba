"""What the suites run under torchrun share (tests/torchrun, tests/torchbackend): one pytest
per rank, every rank running the same tests in the same order, only rank 0 reporting, and
assertions made collective (``Agreement``) so that a failure on one rank fails the test on
every rank instead of leaving the others waiting in the next collective. Collectives time
out after ``TIMEOUT``: a rank that stops answering fails its peers, never hangs the run.
Outside torchrun a suite is skipped with the reason (``COLLECT_IGNORE``, ``report_header``).
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from .mpi_support import silence_other_ranks

__all__ = ["COLLECT_IGNORE", "RANK", "SIZE", "TIMEOUT", "UNDER_TORCHRUN", "Agreement",
           "configure", "report_header"]

#: Seconds any collective of a test world (and ringtune's sub-groups of it) may wait.
TIMEOUT = datetime.timedelta(seconds=120)
RANK = int(os.environ.get("RANK", "0"))
SIZE = int(os.environ.get("WORLD_SIZE", "1"))
UNDER_TORCHRUN = "TORCHELASTIC_RUN_ID" in os.environ
#: A conftest's ``collect_ignore_glob``: nothing to collect outside torchrun.
COLLECT_IGNORE: list[str] = [] if UNDER_TORCHRUN else ["test_*.py"]

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)  # train_digits' helpers


def report_header(suite: str, under: str, target: str) -> str:
    """pytest's header line: what the suite runs as (``under``), or how to run it."""
    return (f"{suite}: {SIZE} rank(s) under torchrun{under}" if UNDER_TORCHRUN else
            f"{suite}: skipped (run them under torchrun: make {target})")


def configure(config: pytest.Config, backend: str) -> None:
    """Silence ranks other than 0 and, under torchrun, make the default process group
    (``backend``) with ``TIMEOUT``, one torch thread per rank."""
    silence_other_ranks(config, RANK)
    if UNDER_TORCHRUN:
        import torch
        import torch.distributed as dist

        if backend == "ringtune":
            import collectives.torch  # noqa: F401 - registers "ringtune"
        torch.set_num_threads(1)
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=TIMEOUT)


class Agreement:
    """``agree(failures)``: fail on every rank if any rank reported failures (each line
    names its rank), over a ``TorchComm`` of the gloo group ``group()`` (made on first use,
    when every rank asks)."""

    def __init__(self, group: Callable[[], Any]) -> None:
        self._group = group
        self._comm: Any = None

    def world(self) -> Any:
        """The group as a ``TorchComm`` (what ``contract.communicator`` splits)."""
        if self._comm is None:
            from collectives.engines.torch import TorchComm

            self._comm = TorchComm(self._group())
        return self._comm

    def agree(self, failures: Iterable[str], limit: int = 8) -> None:
        mine = list(failures)[:limit]
        lines = [f"rank {r}: {m}" for r, msgs in enumerate(self.world().allgather(mine))
                 for m in msgs]
        if lines:
            pytest.fail("\n".join(lines[:limit]), pytrace=False)
