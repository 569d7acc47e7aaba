"""Run a benchmark's job under a time limit that lets ``ringtune emulate`` clean up.

``subprocess.run(..., timeout=)`` sends SIGKILL, which leaves an emulation's network
namespaces behind; ``run`` sends SIGTERM first (emulate then stops its job and removes
them) and SIGKILL only after ``grace`` seconds more.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any


def run(cmd: Sequence[str], timeout: float, grace: float = 60.0,
        **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)``
    ending a late job with SIGTERM, then SIGKILL; ``subprocess.TimeoutExpired`` carries
    what it printed."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
