"""``ringtune tune --backend cupy`` as a user runs it where CuPy is missing: exit 2, one
line naming the fix, no profile. The in-process tests: ``tests/unit/test_tune_gpu.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from collectives.cuda import detect as D

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_backend_cupy_without_cupy_exits_2_with_one_line(tmp_path: Any) -> None:
    if D.cupy_status()[0]:
        pytest.skip("CuPy and a GPU are present: tests/gpu/test_tune_gpu.py tunes them")
    env = {k: v for k, v in os.environ.items() if k != "RINGTUNE_LAUNCHED"
           and not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_"))}
    out = subprocess.run([sys.executable, "-m", "ringtune.cli", "tune", "--backend", "cupy",
                          "--out", str(tmp_path / "p.yaml"), "--buckets", "4K"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "--backend cupy" in lines[0] and "pip install 'ringtune[cuda]'" in lines[0]
    assert not (tmp_path / "p.yaml").exists()
