"""Under Open MPI (skips under another library; ``make ompi-test`` runs it in .venv-ompi):
``ringtune`` launches itself with Open MPI's mpiexec (``-np`` above the core count gets
``--oversubscribe``; as root, the variables it requires), and tune -> export -> a plain job:
the exported rules file makes the plain job run, at each tuned size, the algorithm the
profile chose (the same reduction pattern as that algorithm forced by its MCA variable).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ringtune.launch import library_family

from .test_export_openmpi import ROOT, pattern

pytestmark = pytest.mark.skipif(library_family() != "openmpi",
                                reason="mpi4py does not load Open MPI here")


def _env() -> dict[str, str]:
    # Not under a launcher, and not told how to run as root: ringtune must say it itself.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "PRTE_", "HYDRA_"))}
    env.pop("RINGTUNE_LAUNCHED", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def ringtune(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringtune.cli", *args], env=_env(),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_bench_launches_more_ranks_than_cores() -> None:
    n = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2) + 1
    res = ringtune("bench", "-np", str(n), "-b", "4K", "-e", "4K", "-n", "2", "-w", "1",
                   "-c", "1", "--json")
    assert res.returncode == 0, res.stderr[-1500:]
    out = json.loads(res.stdout)
    assert out["ranks"] == n, out  # one job of n ranks, not n jobs of one
    assert all(row["wrong"] == 0 for row in out["rows"]), out


def test_tune_export_plain_job(tmp_path: Path) -> None:
    from collectives.natives.openmpi import known_algorithms
    from ringtune.export.ompi import installed_version, parse

    prof = tmp_path / "p.yaml"
    res = ringtune("tune", "-np", "2", "--out", str(prof), "--buckets", "4K,64K",
                   "--trials", "6", "--algorithms", "native", "--no-progress")
    assert res.returncode == 0, [ln for ln in res.stderr.splitlines() if "ringtune" in ln]
    data: dict[str, Any] = yaml.safe_load(prof.read_text())
    version = installed_version()
    assert data["library"] == {"name": "Open MPI", "version": version}

    rules_file = tmp_path / "r.rules"
    res = ringtune("export", str(prof), "--format", "ompi", "--out", str(rules_file))
    assert res.returncode == 0, res.stderr
    parsed = parse(rules_file.read_text(), version)[2]
    assert sorted(parsed) == [2, 3]
    ids = known_algorithms(version)
    for rule in data["rules"]:
        nbytes = int(rule["measured"]["bytes"])
        count = nbytes // 8  # float64 elements in the plain job
        impl = rule["params"].get("impl", "auto")
        with_file = pattern(2, count, rules_file)
        assert with_file["ok"] and with_file["returncode"] == 0, with_file
        if impl == "auto":
            expected = pattern(2, count, None)
        else:
            forced = tmp_path / f"{impl}.rules"
            forced.write_text(f"1\n2\n1\n2\n1\n0 {ids[impl]} 0 0\n")
            expected = pattern(2, count, forced)
        assert with_file["calls"] == expected["calls"], (impl, nbytes)
