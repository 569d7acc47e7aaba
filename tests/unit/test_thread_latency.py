"""The overlap benchmark's scheduling experiment (``benchmarks/thread_latency.py``): the
slice and timer slack a thread asks for are the ones the kernel reports for it, and only
for that thread."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "thread_latency", ROOT / "benchmarks" / "thread_latency.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _on_a_thread(fn: Any) -> Any:
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
    set_thread_latency = _module().set_thread_latency

    def run() -> tuple:
        before = _sched("se.slice")
        problems = set_thread_latency(250, 400)
        after = (_sched("se.slice"), _slack())
        set_thread_latency(0, None)  # back to the kernel's default slice
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


def test_the_runtime_reads_no_scheduling_variables() -> None:
    """The experiment left the runtime: the exchange thread keeps the kernel's settings
    and no longer reads RINGTUNE_EXCHANGE_SLICE_US, _SLACK_US or _NICE."""
    from collectives.training import exchange

    text = Path(exchange.__file__).read_text()
    for gone in ("RINGTUNE_EXCHANGE_SLICE_US", "RINGTUNE_EXCHANGE_SLACK_US",
                 "RINGTUNE_EXCHANGE_NICE", "sched_setattr", "setpriority"):
        assert gone not in text, gone
