"""The communication thread's scheduling settings (``collectives.exchange``): the slice
and timer slack a thread asks for are the ones the kernel reports for it, and a bad
environment value warns instead of failing the exchange."""

from __future__ import annotations

import sys
import threading

import pytest

from collectives import exchange

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _on_a_thread(fn):
    out: list = []
    th = threading.Thread(target=lambda: out.append(fn()))
    th.start()
    th.join(30)
    return out[0]


def _sched(field: str) -> int:
    with open("/proc/thread-self/sched") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split(":")[1])
    raise LookupError(field)


def _slack() -> int:
    import ctypes

    libc = ctypes.CDLL(None)
    libc.prctl.restype = ctypes.c_long
    return int(libc.prctl(30, 0, 0, 0, 0))  # PR_GET_TIMERSLACK: this thread's, in ns


@linux
def test_slice_and_slack_are_set_on_the_calling_thread() -> None:
    def run() -> tuple:
        before = _sched("se.slice")
        problems = exchange.set_thread_latency(250, 400)
        after = (_sched("se.slice"), _slack())
        exchange.set_thread_latency(0, None)  # back to the kernel's default slice
        return before, problems, after, _sched("se.slice")

    try:
        _sched("se.slice")
    except (OSError, LookupError):
        pytest.skip("this kernel reports no per-thread slice (before Linux 6.6's EEVDF)")
    before, problems, after, restored = _on_a_thread(run)
    assert problems == []
    assert after == (250_000, 400_000)
    assert restored == before
    assert _sched("se.slice") == before  # the main thread was not touched


def test_bad_environment_value_warns(monkeypatch) -> None:
    monkeypatch.setenv("RINGTUNE_EXCHANGE_SLICE_US", "fast")
    with pytest.warns(UserWarning, match="RINGTUNE_EXCHANGE_SLICE_US='fast'"):
        value, given = exchange._env_us("RINGTUNE_EXCHANGE_SLICE_US", 100, 3)
    assert (value, given) == (100, False)
    monkeypatch.setenv("RINGTUNE_EXCHANGE_SLICE_US", "off")
    assert exchange._env_us("RINGTUNE_EXCHANGE_SLICE_US", 100, 3) == (0.0, True)
