"""``RINGTUNE_LOG=info`` with ``RINGTUNE_PROFILE``: a job's stderr says, per message size,
which rule and algorithm it got and the busbw measured for it (a one-rank MPI job started
as a subprocess, so the environment is read at import as in a real job). ``debug`` says more
than ``info`` (the profile, plan detail, every call); an unknown level is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from collectives.profile import write_profile
from tests.unit.test_profile import base

SCRIPT = """
import numpy as np
from mpi4py import MPI
from collectives import Communicator
comm = Communicator(MPI.COMM_WORLD)
for n in (256, 1 << 16):
    comm.allreduce(np.ones(n, dtype="float32"))
comm.allreduce(np.ones(1 << 16, dtype="float32"))  # same plan: not logged again
print(comm.explain(1024))
"""


def test_log_info_names_rule_algorithm_and_busbw(tmp_path: Any) -> None:
    res = _job(tmp_path, "info")
    path = str(tmp_path / "p.yaml")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ringtune:")]
    assert len(lines) == 2, res.stderr
    assert "1024 B" in lines[0] and "native" in lines[0] and "rule 0" in lines[0]
    assert "measured busbw 1.21 GB/s" in lines[0]
    assert "262144 B" in lines[1] and "multiring" in lines[1] and "rule 1" in lines[1]
    assert "measured busbw 7.8 GB/s" in lines[1] and "1.90x native" in lines[1]
    assert path in res.stdout and "rule 0 [0..65535]" in res.stdout


def _job(tmp_path: Any, level: str) -> subprocess.CompletedProcess[str]:
    prof = base()
    prof["topology"] = {"world_size": 1}
    prof["rules"][1]["params"]["order"] = "identity"
    path = str(tmp_path / "p.yaml")
    write_profile(prof, path)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_"))}
    env.update(RINGTUNE_LOG=level, RINGTUNE_PROFILE=path)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)


def test_log_debug_adds_the_profile_plan_detail_and_every_call(tmp_path: Any) -> None:
    info = _job(tmp_path, "info")
    debug = _job(tmp_path, "DEBUG")
    assert info.returncode == 0 and debug.returncode == 0, debug.stderr
    info_lines = [ln for ln in info.stderr.splitlines() if ln.startswith("ringtune:")]
    lines = [ln for ln in debug.stderr.splitlines() if ln.startswith("ringtune:")]
    # Everything info says, and more: the profile once, each plan's detail, each call.
    assert all(ln in lines for ln in info_lines) and len(lines) > len(info_lines)
    communicator = [ln for ln in lines if ln.startswith("ringtune: communicator:")]
    assert len(communicator) == 1 and str(tmp_path / "p.yaml") in communicator[0]
    plans = [ln for ln in lines if ln.startswith("ringtune: plan ")]
    assert len(plans) == 2 and "order=identity" in plans[1], plans
    calls = [ln for ln in lines if ln.startswith("ringtune: call ")]
    assert [c.split(":")[1].strip() for c in calls] == ["call 1", "call 2", "call 3"]
    assert [c.endswith("(new plan)") for c in calls] == [True, True, False]
    assert calls[2].endswith("(cached plan)") and "multiring" in calls[2]


def test_unknown_log_level_is_refused_naming_the_variable(tmp_path: Any) -> None:
    res = _job(tmp_path, "verbose")
    assert res.returncode != 0
    assert "ValueError: RINGTUNE_LOG='verbose': unknown log level; use one of info, debug" \
        in res.stderr
    env = dict(os.environ, RINGTUNE_LOG="loud")
    cli = subprocess.run([sys.executable, "-m", "ringtune.cli", "show", str(tmp_path / "p.yaml")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2
    assert cli.stderr.strip().splitlines() == [
        "ringtune: error: RINGTUNE_LOG='loud': unknown log level; use one of info, debug "
        "(or unset it for no log)"]
