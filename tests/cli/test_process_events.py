"""The kernel's process events that ``ringtune emulate``'s host monitor reads (root
only): a child's exec and exit arrive, in order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ringtune.emulate.monitor import (
    _PROC_EVENT_EXEC,
    _PROC_EVENT_EXIT,
    _process_events,
    _read_events,
)


@pytest.mark.skipif(os.geteuid() != 0, reason="the process connector needs root")
@pytest.mark.parametrize("code", [0, 5, -signal.SIGKILL])
def test_the_kernel_reports_a_childs_exec_and_exit_in_order(code: int) -> None:
    """In order, with the exit's wait status: 0 for a clean exit (which decides nothing in
    the monitor), the code in the high byte, or the signal that ended it."""
    events = _process_events()
    try:
        child = subprocess.Popen([sys.executable, "-c",
                                  f"import sys, time; time.sleep({60 if code < 0 else 0}); "
                                  f"sys.exit({max(code, 0)})"])
        if code < 0:
            child.kill()
        assert child.wait(timeout=30) == code
        seen: list[tuple[int, int, int]] = []
        deadline = time.monotonic() + 10
        while not any(e[0] == _PROC_EVENT_EXIT for e in seen) and time.monotonic() < deadline:
            read, _lost = _read_events(events, 0.1)
            seen += [e for e in read if e[1] == child.pid]
    finally:
        events.close()
    status = -code if code < 0 else code << 8
    assert seen == [(_PROC_EVENT_EXEC, child.pid, 0),
                    (_PROC_EVENT_EXIT, child.pid, status)], seen
