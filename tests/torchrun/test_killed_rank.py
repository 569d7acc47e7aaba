"""A rank killed in a torchrun job ends the job in bounded time, with a line from a
surviving rank that names the dead one (gloo's own error names only an address). Started
once, from the 1-rank run of ``make torchrun-test`` (it launches its own 3-rank job).

torchrun's agent stops every other worker (SIGTERM) at its first poll after one dies: with
its default 0.1 s poll, a loaded machine let the agent end the survivors before they had
run at all, and the line this test checks for was never printed. The agent polls every
``MONITOR_S`` here, so the survivors have that long to notice the dead rank themselves
(gloo sees the closed connection at once); the job still ends in bounded time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SIZE

WORKER = Path(__file__).with_name("killed_worker.py")
#: How often torchrun's agent looks at its workers (see the module's docstring).
MONITOR_S = 20


def _segments() -> set[str]:
    return ({f for f in os.listdir("/dev/shm") if f.startswith("ringtune-")}
            if os.path.isdir("/dev/shm") else set())


@pytest.mark.skipif(SIZE != 1, reason="run once, from the 1-rank run (it starts its own job)")
@pytest.mark.parametrize("algorithm,named", [
    ("multiring", "waiting on rank(s) 1"),
    # Shared memory: the survivors see rank 1's process gone; its segment was unlinked
    # once mapped, so nothing of the job stays in /dev/shm.
    ("shm", "rank 1 (pid "),
])
def test_a_killed_rank_ends_the_job_naming_it(algorithm: str, named: str) -> None:
    before = _segments()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHELASTIC_", "MASTER_", "GROUP_", "ROLE_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "3", "--monitor-interval", str(MONITOR_S), str(WORKER), algorithm],
        capture_output=True, text=True, timeout=240, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "went unnoticed" not in out, out[-3000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("ringtune: rank ")]
    assert lines, out[-3000:]
    assert any(named in ln and "failed" in ln for ln in lines), "\n".join(lines)
    # The dead rank is the cause the line gives, not the arguments of the call.
    for line in lines:
        if "failed" in line and named in line:
            assert "gone or silent" in line and "same size" not in line, line
    assert _segments() <= before, f"left in /dev/shm: {sorted(_segments() - before)}"
