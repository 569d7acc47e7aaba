"""Set-up for the registered ``ringtune`` backend's tests, run under torchrun, one pytest
per rank, with ``ringtune`` as the default process group's backend (``make
torchbackend-test``)::

    torchrun --standalone --nproc-per-node N --no-python .venv-torch/bin/python \\
        -m pytest -q -p no:cacheprovider tests/torchbackend

Every rank runs the same tests in the same order; only rank 0 reports; assertions go
through ``agree`` (an allgather over a gloo group of its own) so that a failure on one
rank fails the test on every rank. Collectives time out after two minutes: a rank that
stops answering fails its peers, never hangs the run. Outside torchrun the directory is
skipped with the reason.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Iterable
from typing import Any

import pytest

from ..mpi_support import silence_other_ranks

__all__ = ["RANK", "SIZE", "TIMEOUT", "agree", "gloo_group", "ringtune_of"]

TIMEOUT = datetime.timedelta(seconds=120)
RANK = int(os.environ.get("RANK", "0"))
SIZE = int(os.environ.get("WORLD_SIZE", "1"))
UNDER_TORCHRUN = "TORCHELASTIC_RUN_ID" in os.environ
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

collect_ignore_glob = [] if UNDER_TORCHRUN else ["test_*.py"]

_GLOO: Any = None
_AGREE: Any = None


def pytest_report_header(config: pytest.Config) -> str:
    return (f"tests/torchbackend: {SIZE} rank(s) under torchrun, default group 'ringtune'"
            if UNDER_TORCHRUN else
            "tests/torchbackend: skipped (run them under torchrun: make torchbackend-test)")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    global _GLOO
    silence_other_ranks(config, RANK)
    if UNDER_TORCHRUN:
        import torch
        import torch.distributed as dist

        import collectives.torch  # noqa: F401 - registers "ringtune"

        torch.set_num_threads(1)
        dist.init_process_group("ringtune", timeout=TIMEOUT)
        # The reference group (DDP over gloo) and the tests' own agreement channel.
        _GLOO = dist.new_group(backend="gloo", timeout=TIMEOUT)


def gloo_group() -> Any:
    """A gloo group over every rank (the reference the ringtune backend is checked
    against)."""
    return _GLOO


def agree(failures: Iterable[str], limit: int = 8) -> None:
    """Fail on every rank if any rank reported failures (each line names its rank)."""
    global _AGREE
    if _AGREE is None:
        from collectives.engines.torch import TorchComm

        _AGREE = TorchComm(_GLOO)
    mine = list(failures)[:limit]
    lines = [f"rank {r}: {m}" for r, msgs in enumerate(_AGREE.allgather(mine)) for m in msgs]
    if lines:
        pytest.fail("\n".join(lines[:limit]), pytrace=False)


def ringtune_of(group: Any = None) -> Any:
    """The ringtune backend object serving ``group``'s CPU tensors (default: the world)."""
    import torch
    import torch.distributed as dist

    from collectives.torch_backend import RingtuneBackendMixin

    group = dist.group.WORLD if group is None else group
    if isinstance(group, RingtuneBackendMixin):
        return group
    backend = group._get_backend(torch.device("cpu"))
    assert isinstance(backend, RingtuneBackendMixin), type(backend)
    return backend
