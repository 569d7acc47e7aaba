"""``ringtune tune --busy refuse`` beside a CPU hog (issue 38): the tune measures, says the
machine is busy, and ends with exit 2 and one line without writing the profile.

The hog is this test's own child (``while True: pass``, ending by itself after
``HOG_S`` and killed in a ``finally``): other work on the machine (a parallel test run,
other developers) only makes it busier, which is all the test needs. It asserts the
refusal and the files, never timings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RINGTUNE = [sys.executable, "-m", "ringtune.cli"]
#: The hogs' own limit: they end by themselves even if this process is killed.
HOG_S = 90
HOG = f"import time\nend = time.monotonic() + {HOG_S}\nwhile time.monotonic() < end: pass"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_"))}
    env.pop("RINGTUNE_LAUNCHED", None)
    # Under a hog the A/B may disagree with the search by 10x: that check is not this test's.
    env.update(RINGTUNE_TIMING_CHECK="warn",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")])))
    return env


def test_refuse_writes_nothing_from_a_busy_machine(tmp_path: Any) -> None:
    out = tmp_path / "p.yaml"
    # One hog per CPU (at most 2): the ranks' cores are taken whatever else runs.
    hogs = [subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
            for _ in range(min(2, os.cpu_count() or 1))]
    try:
        time.sleep(1.0)  # the hogs are running when the tune's first sample is taken
        res = subprocess.run([*RINGTUNE, "tune", "-np", "2", "--out", str(out),
                              "--buckets", "1K,4K", "--trials", "3", "--algo", "native,rhd",
                              "--budget", "20", "--no-progress", "--busy", "refuse"],
                             env=_env(), capture_output=True, text=True, timeout=120)
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(timeout=30)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("ringtune: error:")]
    assert len(errors) == 1, res.stderr
    assert errors[0].startswith("ringtune: error: --busy refuse: the machine was busy during "
                                "the tune ("), errors[0]
    assert f"no profile written to {out}" in errors[0] and "--busy warn" in errors[0]
    assert "python" in errors[0]  # the hogs are named among the busiest processes
    assert "ringtune: warning: the machine is busy: " in res.stdout, res.stdout
    assert not out.exists()
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]
    assert (tmp_path / "p.db").exists()  # the trials are kept for a rerun
