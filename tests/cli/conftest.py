"""Every process a test of tests/cli starts is bounded and cleaned up.

A test here starts programs (mpiexec and its ranks, the CLI, which may start mpiexec in
turn). ``subprocess.run(..., timeout=)`` kills only the program it started: when that is
mpiexec, its proxies and ranks live on, and a test that fails midway can leave a whole job
behind. So every process started here carries a marker in its environment (which
mpiexec, Hydra's proxies and the ranks inherit), and after each test whatever still runs
with that test's marker gets ``LEFTOVER_GRACE_S`` to end, then is killed, and the test fails
naming it: no orphans, whatever the test did.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.mpi_support import find_processes

MARK = "RINGTUNE_TEST_PROCESS"
#: Seconds a test's processes get to end by themselves after the test (a launcher that is
#: still reaping ranks it killed) before they are killed.
LEFTOVER_GRACE_S = 10.0


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"{pid} ({cmd[:120]})"


@pytest.fixture(autouse=True)
def _processes_end_with_the_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    token = uuid.uuid4().hex
    original = subprocess.Popen.__init__

    def init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        env = kwargs.get("env")
        kwargs["env"] = {**(os.environ if env is None else env), MARK: token}
        original(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)
    yield
    mark = f"{MARK}={token}"
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    left = find_processes(env=[mark])
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = find_processes(env=[mark])
    if not left:
        return
    named = [_describe(pid) for pid in left]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pytest.fail(f"the test left {len(left)} process(es) running {LEFTOVER_GRACE_S:g} s "
                f"after it ended (now killed): {'; '.join(named)}", pytrace=False)
