"""Bad input to ``Communicator.allreduce``: a clear error on every rank, before any
communication, and — with RINGTUNE_CHECK=1 — the same error on every rank when ranks pass
different arguments, instead of a hang."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collectives import AgreementError, Communicator

from .conftest import WORLD, agree


def _raises(fn: Any, exc: type[BaseException], *words: str) -> list[str]:
    try:
        fn()
    except exc as e:
        missing = [w for w in words if w not in str(e)]
        return [f"message {str(e)!r} lacks {missing}"] if missing else []
    except Exception as e:  # noqa: BLE001
        return [f"expected {exc.__name__}, got {type(e).__name__}: {e}"]
    return [f"expected {exc.__name__}, nothing raised"]


CASES = [
    ("non-contiguous", lambda c: c.allreduce(np.ones((4, 4), np.float32)[:, 1]), ValueError,
     ("C-contiguous",)),
    ("read-only", lambda c: c.allreduce(np.frombuffer(b"\0" * 16, np.float32)), ValueError,
     ("read-only",)),
    ("dtype", lambda c: c.allreduce(np.ones(4, np.uint8)), TypeError, ("uint8", "float32")),
    ("op", lambda c: c.allreduce(np.ones(4, np.float32), op="mean"), ValueError,
     ("'mean'", "avg")),
    ("rings<1", lambda c: c.allreduce(np.ones(4, np.float32), algorithm="multiring", rings=0),
     ValueError, ("rings", "1..16")),
    ("chunk", lambda c: c.allreduce(np.ones(4, np.float32), algorithm="multiring",
                                    chunk_bytes=1000), ValueError, ("chunk_bytes", "power")),
    ("order", lambda c: c.allreduce(np.ones(4, np.float32), algorithm="multiring",
                                    order=[0] * (c.size + 1)), ValueError, ("permutation",)),
    ("algorithm", lambda c: c.allreduce(np.ones(4, np.float32), algorithm="tree"),
     ValueError, ("'tree'", "multiring")),
    ("param", lambda c: c.allreduce(np.ones(4, np.float32), algorithm="rhd", rings=2),
     ValueError, ("rhd", "rings")),
    ("buffer type", lambda c: c.allreduce([1.0, 2.0]), TypeError, ("list",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_before_communication(comm: Communicator, case: Any) -> None:
    _, call, exc, words = case
    fails = _raises(lambda: call(comm), exc, *words)
    # The communicator is still usable: nothing was left half-sent.
    buf = np.full(8, comm.rank, dtype=np.int64)
    comm.allreduce(buf, algorithm="multiring", rings=2)
    if not (buf == sum(range(comm.size))).all():
        fails.append("communicator broken after a rejected call")
    agree(fails)


def test_check_guard_catches_different_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGTUNE_CHECK", "1")
    c = Communicator(WORLD)
    size = 16 + (c.rank if c.size > 1 else 1)
    buf = np.ones(size, dtype=np.float32)
    if c.size == 1:
        c.allreduce(buf)  # one rank always agrees with itself
        agree([] if (buf == 1).all() else ["1-rank allreduce changed the data"])
        return
    fails = _raises(lambda: c.allreduce(buf, algorithm="multiring"), AgreementError,
                    "rank 0", "rank 1")
    fails += _raises(lambda: c.allreduce(np.ones(4, np.float32 if c.rank else np.float64)),
                     AgreementError, "differ")
    fails += _raises(lambda: c.allreduce(np.ones(4, np.float32),
                                         op="sum" if c.rank else "max"), AgreementError,
                     "differ")
    agree(fails)
    c.close()


def test_check_guard_passes_agreeing_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGTUNE_CHECK", "1")
    c = Communicator(WORLD)
    buf = np.ones(100, dtype=np.int32)
    c.allreduce(buf, algorithm="rhd")
    agree([] if (buf == c.size).all() else ["checked call gave a wrong result"])
    c.close()


def test_avg_divides_by_world_size(comm: Communicator) -> None:
    buf = np.full(10, 3.0 * (comm.rank + 1), dtype=np.float64)
    comm.allreduce(buf, op="avg", algorithm="multiring", rings=2)
    exp = 3.0 * (comm.size + 1) / 2
    agree([] if np.allclose(buf, exp) else [f"avg gave {buf[0]}, expected {exp}"])
