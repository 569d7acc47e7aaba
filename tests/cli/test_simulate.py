"""``ringtune simulate`` as a user runs it, in its own process: a bad cluster file is exit 2
and one line on stderr. The in-process tests: ``tests/unit/test_simulate.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.unit.test_simulate import LEVELS, ROOT, _write


def test_console_script_exit_code(tmp_path: Path) -> None:
    """The installed entry point, as a user runs it: exit 2 and one line on stderr."""
    path = _write(tmp_path, "bad.yaml", "ranks: 8\nmemory_gbs: 1\n" +
                  LEVELS.replace("bandwidth_gbs: 5", "bandwidth_gbs: 0"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "ringtune.cli", "simulate", "--cluster", path],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("expected a positive number, got 0")
    assert "levels[1].bandwidth_gbs" in proc.stderr and proc.stdout == ""
