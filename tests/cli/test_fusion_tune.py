"""What ``tests/unit/test_fusion_tune.py`` cannot check in its own process (whose imports
are already loaded): ``collectives.torch`` without torch fails with one line naming the
rank and the fix, and ``import collectives`` with the fusion and exchange modules stays
light."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None,
                    reason="torch is installed here (tests/torch covers this case)")
def test_torch_api_without_torch() -> None:
    env = dict(os.environ, PMI_RANK="3")
    out = subprocess.run([sys.executable, "-c", "import collectives.torch"], env=env,
                         capture_output=True, text=True, timeout=60)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1
    assert last.startswith("ImportError: rank 3: collectives.torch needs PyTorch")
    assert "pip install 'ringtune[torch]'" in last


def test_import_collectives_stays_light() -> None:
    code = ("import sys, collectives, collectives.training.fusion, collectives.training.exchange, "
            "collectives.tensors; print(sorted(m for m in ('torch', 'cupy', 'optuna') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out
