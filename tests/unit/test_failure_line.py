"""The line that ends every rank when a call fails on one (``collectives.failures``): a peer
that died or went silent (``PeerFailure``: ``PeerGone``, ``StallError``, the torch
transport's ``PeerError``) is the cause the line gives, not the call's arguments; any other
failure keeps the advice on arguments. (That the survivors of a real SIGKILL print it:
tests/cli/test_shm_kill*.py, tests/torchrun/test_killed_rank.py.)"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np
import pytest

from collectives import failures
from collectives.errors import PeerFailure
from collectives.failures import Failures
from collectives.plan import Plan
from collectives.plumbing.stall import StallError
from collectives.shm import PeerGone
from collectives.transports.torch import PeerError

MISMATCH = "every rank must call allreduce with the same size"


class _Ended(Exception):
    pass


class _Comm(Failures):
    comm: Any = object()
    size = 3


def _line(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> str:
    """The line ``fail`` ends the job with, after ``exc``."""
    monkeypatch.delenv("RINGTUNE_ON_ERROR", raising=False)
    said: list[str] = []

    def abort_world(comm: Any, line: str) -> NoReturn:
        said.append(line)
        raise _Ended

    monkeypatch.setattr(failures, "rank_line", lambda comm, text: f"ringtune: rank 0: {text}")
    monkeypatch.setattr(failures, "abort_world", abort_world)
    with pytest.raises(_Ended):
        _Comm().fail(exc, Plan("shm"), np.ones(4, np.float32))
    return said[0]


@pytest.mark.parametrize("exc", [
    PeerGone("rank 0 (h): rank 1 (pid 42) ended while this rank waited 0.2 s for it at "
             "shared-memory step 7: it was killed or crashed; see its own output for why"),
    StallError("rank 0 (h): no progress for 30 s waiting on rank(s) 1: the peer's process "
               "or host died, or the link to it is down (RINGTUNE_STALL_TIMEOUT=30)"),
    PeerError("waiting on rank(s) 1: Connection closed by peer [10.0.0.2]:4242"),
])
def test_a_dead_or_silent_peer_is_the_cause_the_line_gives(
        monkeypatch: pytest.MonkeyPatch, exc: PeerFailure) -> None:
    line = _line(monkeypatch, exc)
    assert line.startswith("ringtune: rank 0: allreduce of 16 B with shm failed: "
                           f"{type(exc).__name__}: "), line
    assert "rank 1 (pid 42) ended" in line or "rank(s) 1" in line, line
    assert "the rank it names is gone or silent" in line, line
    assert MISMATCH not in line and "RINGTUNE_CHECK" not in line, line
    assert line.endswith("RINGTUNE_ON_ERROR=raise hands such failures to the caller)"), line


def test_any_other_failure_keeps_the_advice_on_arguments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    line = _line(monkeypatch, ValueError("operands could not be broadcast"))
    assert "ValueError: operands could not be broadcast; ending every rank" in line, line
    assert MISMATCH in line and "RINGTUNE_CHECK=1 checks it" in line, line
    assert "gone or silent" not in line, line
