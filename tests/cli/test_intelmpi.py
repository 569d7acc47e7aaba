"""Under Intel MPI (skips under another library; ``make impi-test`` runs it in .venv-impi,
``pip install -e '.[test,impi]'``): ringtune launches itself with Intel MPI's Hydra, tunes
and benches with its default allreduce only, says so once in one line, and refuses an
``impl`` in one line (exit 2). And the fact behind that module (collectives/natives/
intelmpi.py): Intel MPI fixes its allreduce algorithm at MPI_Init; a run-time MPI_T write
changes nothing, not even on a communicator created after it."""

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

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("impi_probe.py")

pytestmark = pytest.mark.skipif(library_family() != "impi",
                                reason="mpi4py does not load Intel MPI here")

#: Intel MPI's allreduce ids whose reduction order differs from its default on 3 ranks on
#: one host (2021.18: each gives other float32 bits than the default when set at launch).
OTHER_ORDER_IDS = ("3", "8", "16")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "I_MPI_"))}
    env.pop("RINGTUNE_LAUNCHED", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return dict(env, **extra)


def ringtune(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringtune.cli", *args], env=_env(),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _said(res: subprocess.CompletedProcess[str], text: str) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if text in ln]


def test_tune_and_bench_run_its_default_said_once_in_one_line(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    res = ringtune("tune", "-np", "2", "--out", str(prof), "--buckets", "4K,64K",
                   "--trials", "4", "--no-progress")
    assert res.returncode == 0, res.stderr[-1500:]
    said = _said(res, "I_MPI_ADJUST_ALLREDUCE")
    # Once, on one line of its own (no Python file:line before it).
    assert len(said) == 1 and said[0].startswith("ringtune: Intel MPI "), res.stderr[-1500:]
    assert not _said(res, "RuntimeWarning"), res.stderr[-1500:]
    data: dict[str, Any] = yaml.safe_load(prof.read_text())
    assert data["library"]["name"] == "Intel MPI", data["library"]
    for rule in data["rules"]:
        assert rule["algorithm"] != "native" or rule.get("params", {}).get(
            "impl", "auto") == "auto", rule
    res = ringtune("bench", "-np", "2", "--profile", str(prof), "-b", "4K", "-e", "64K",
                   "-n", "3", "-w", "1", "--json")
    assert res.returncode == 0, res.stderr[-1500:]
    out = json.loads(res.stdout)
    assert out["ranks"] == 2 and all(row["wrong"] == 0 for row in out["rows"]), out


def test_an_impl_is_refused_in_one_line() -> None:
    res = ringtune("bench", "-np", "2", "-b", "4K", "-e", "4K", "--algo", "native",
                   "--param", "impl=ring")
    assert res.returncode == 2, res.stderr[-1500:]
    errors = _said(res, "ringtune: error:")
    assert len(errors) == 1 and "impl: 'ring' is not an allreduce algorithm of Intel MPI" \
        in errors[0] and "at MPI_Init (I_MPI_ADJUST_ALLREDUCE)" in errors[0], res.stderr


def _probe(*ids: str, **env: str) -> dict[str, Any]:
    mpiexec = Path(sys.executable).with_name("mpiexec")
    res = subprocess.run([str(mpiexec), "-n", "3", sys.executable, str(PROBE), *ids],
                         env=_env(**env), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-1500:]
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def test_its_algorithm_is_fixed_at_init_not_per_call() -> None:
    default = _probe(*OTHER_ORDER_IDS)
    # Set at launch, each id reduces in another order: the probe can tell algorithms apart.
    for algorithm in OTHER_ORDER_IDS:
        at_launch = _probe(I_MPI_ADJUST_ALLREDUCE=algorithm)["start"]
        assert at_launch != default["start"], f"id {algorithm}: same bits as the default"
    # Written at run time (before a call, or before a Dup): the default's bits every time.
    # If this fails, Intel MPI now selects per call: collectives/natives/intelmpi.py can
    # offer its algorithms as native impl= candidates, as the MPICH module does.
    for algorithm, digests in default["written"].items():
        assert digests == [default["start"]] * 2, (algorithm, default)
