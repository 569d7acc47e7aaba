"""A plug-in engine (``tests/toy_engine.py`` through ``RINGTUNE_PLUGINS``, no product file
edited) is a choice of the command line: ``ringtune tune --help`` lists it, ``bench
--engine toy`` runs over it, and ``--engine auto`` takes it where its launcher started
the process. The in-process checks: ``tests/unit/test_toy_engine.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, **env: str) -> Any:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPI_", "OMPI_", "TORCHELASTIC"))}
    full.pop("RINGTUNE_LAUNCHED", None)
    full.update(PYTHONPATH=str(ROOT), RINGTUNE_PLUGINS="tests.toy_engine", **env)
    return subprocess.run([sys.executable, "-m", "ringtune.cli", *args], env=full,
                          capture_output=True, text=True, timeout=120)


def test_tune_help_lists_the_plugin_engine() -> None:
    out = _cli("tune", "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "--engine {auto,mpi,torch,toy}" in text
    assert "toy (threads as ranks, tests/toy_engine.py)" in text


def test_bench_runs_over_the_plugin_engine() -> None:
    for how in (("--engine", "toy"), ()):
        out = _cli("bench", *how, "-b", "1K", "-e", "4K", TOY_ENGINE_RUN="1")
        assert out.returncode == 0, out.stderr
        assert "engine toy (threads)" in out.stdout, out.stdout
        assert "Out of bounds values : 0 OK" in out.stdout, out.stdout


def test_what_the_engine_refuses_is_one_line() -> None:
    out = _cli("tune", "--engine", "toy", "-np", "2")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "ringtune: error: --engine toy: its ranks are threads of one process; drop -np"], \
        out.stderr
