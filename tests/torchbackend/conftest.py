"""Set-up for the registered ``ringtune`` backend's tests, run under torchrun, one pytest
per rank, with ``ringtune`` as the default process group's backend (``make
torchbackend-test``)::

    torchrun --standalone --nproc-per-node N --no-python .venv-torch/bin/python \\
        -m pytest -q -p no:cacheprovider tests/torchbackend

A gloo group over every rank is the reference the backend is checked against and the
channel of ``agree`` (``tests/torchutil.py``: what this suite shares with tests/torchrun).
Outside torchrun the directory is skipped with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..torchutil import (
    COLLECT_IGNORE,
    RANK,
    SIZE,
    TIMEOUT,
    UNDER_TORCHRUN,
    Agreement,
    configure,
    report_header,
)

__all__ = ["RANK", "SIZE", "TIMEOUT", "agree", "gloo_group", "gloo_world", "ringtune_of"]

collect_ignore_glob = COLLECT_IGNORE

_GLOO: Any = None


def gloo_group() -> Any:
    """A gloo group over every rank (the reference the ringtune backend is checked
    against)."""
    return _GLOO


_AGREEMENT = Agreement(gloo_group)
agree = _AGREEMENT.agree
#: The gloo group as a ``TorchComm`` (``allgather`` of Python objects).
gloo_world = _AGREEMENT.world


def pytest_report_header(config: pytest.Config) -> str:
    return report_header("tests/torchbackend", ", default group 'ringtune'",
                         "torchbackend-test")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    global _GLOO
    configure(config, "ringtune")
    if UNDER_TORCHRUN:
        import torch.distributed as dist

        _GLOO = dist.new_group(backend="gloo", timeout=TIMEOUT)


def ringtune_of(group: Any = None) -> Any:
    """The ringtune backend object serving ``group``'s CPU tensors (default: the world)."""
    import torch
    import torch.distributed as dist

    from collectives.torch.backend import RingtuneBackendMixin

    group = dist.group.WORLD if group is None else group
    if isinstance(group, RingtuneBackendMixin):
        return group
    backend = group._get_backend(torch.device("cpu"))
    assert isinstance(backend, RingtuneBackendMixin), type(backend)
    return backend
