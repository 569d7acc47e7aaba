"""The kernel's process events that ``ringtune emulate``'s host monitor reads (root
only): a child's exec and exit arrive, in order."""

from __future__ import annotations

import os
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
def test_the_kernel_reports_a_childs_exec_and_exit_in_order() -> None:
    events = _process_events()
    try:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        child.kill()
        child.wait(timeout=30)
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + 10
        while (_PROC_EVENT_EXIT, child.pid) not in seen and time.monotonic() < deadline:
            read, _lost = _read_events(events, 0.1)
            seen += [e for e in read if e[1] == child.pid]
    finally:
        events.close()
    assert seen == [(_PROC_EVENT_EXEC, child.pid), (_PROC_EVENT_EXIT, child.pid)], seen
