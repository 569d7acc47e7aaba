"""The progress watchdog (RINGTUNE_STALL_TIMEOUT): a wait on a peer that never sends ends
with StallError naming this rank and the peer, after about the timeout; off by default."""

from __future__ import annotations

import time

import numpy as np
import pytest

from collectives.plumbing.stall import ENV, StallError, stall_timeout
from collectives.registry import backend_for
from collectives.transports.mpi import MpiTransport

from .conftest import WORLD, agree

RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


def test_timeout_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    for text, want in (("", None), ("0", None), ("2.5", 2.5), (" 10 ", 10.0)):
        monkeypatch.setenv(ENV, text)
        assert stall_timeout() == want
    monkeypatch.delenv(ENV)
    assert stall_timeout() is None
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=ENV):
            stall_timeout()


def test_stalled_receive_names_the_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    if SIZE < 2:
        pytest.skip("needs a peer")
    monkeypatch.setenv(ENV, "0.5")
    comm = WORLD.Dup()
    t = MpiTransport(comm, backend_for(np.empty(1)))
    fails: list[str] = []
    peer = SIZE - 1
    if RANK == 0:
        buf = np.zeros(8, np.float32)
        t0 = time.monotonic()
        pending = t.start([], [(buf, peer, 7)])  # the peer sends only after the timeout
        try:
            pending.wait()
            fails.append("no StallError although the peer never sent")
        except StallError as exc:
            waited = time.monotonic() - t0
            if f"waiting on rank(s) {peer}" not in str(exc) or "rank 0 (" not in str(exc):
                fails.append(f"message does not name rank 0 and peer {peer}: {exc}")
            if not 0.4 < waited < 30:
                fails.append(f"gave up after {waited:.2f} s, expected about 0.5 s")
        comm.Barrier()
        pending.wait()  # the late message arrives: the request completes, nothing dangles
        if not np.all(buf == 1):
            fails.append(f"late message not received: {buf}")
    else:
        comm.Barrier()
        if RANK == peer:
            t.start([(np.ones(8, np.float32), 0, 7)], []).wait()
    # A batch that progresses is never stopped, however long it takes in total.
    x = np.full(1 << 16, RANK + 1, np.float32)
    for _ in range(3):
        t.native_allreduce(x, "sum")
        x[:] = RANK + 1
    t.close()
    comm.Free()
    agree(fails)
