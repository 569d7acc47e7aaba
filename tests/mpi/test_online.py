"""Online tuning under ``mpiexec`` (any world size): every call right and bitwise equal on
every rank while candidates are explored, every size class settled alike on every rank, the
profile written by rank 0 valid, loadable and readable by ``ringtune show``/``export``, a
second job loading it explores nothing, and bad settings fail on every rank before any
step."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np
import pytest

from collectives import AgreementError, Communicator, TopologyMismatchError
from collectives.online import TuneOutLock
from collectives.profile import load_profile, write_profile
from collectives.testing.results import check_input, digest, expected

from .conftest import WORLD, agree

N = WORLD.Get_size()
RANK = WORLD.Get_rank()
COUNTS = (5, 1001, 70003)
RINGTUNE = os.path.join(os.path.dirname(__file__), "..", "..", "bin", "ringtune")
OPTIONS = {"calls": 10, "samples": 2, "candidates": 5, "share": 1.0}


@pytest.fixture(scope="module")
def folder() -> Any:
    path = WORLD.bcast(tempfile.mkdtemp(prefix="ringtune-online-") if RANK == 0 else None)
    yield path
    WORLD.Barrier()


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RINGTUNE_PROFILE", "RINGTUNE_TUNE", "RINGTUNE_TUNE_OUT"):
        monkeypatch.delenv(var, raising=False)


def _steps(c: Communicator, steps: int, op: str = "avg") -> list[str]:
    """``steps`` rounds over ``COUNTS``; each result checked against the closed form and
    against every other rank's bits."""
    bad = []
    for step in range(steps):
        for count in COUNTS:
            buf = check_input(count, "float32", op, RANK)
            c.allreduce(buf, op=op)
            if not np.array_equal(buf, expected(count, "float32", op, N)):
                bad.append(f"step {step}: {count} elements: wrong result")
            if len(set(WORLD.allgather(digest(buf)))) != 1:
                bad.append(f"step {step}: {count} elements: ranks differ")
    return bad


def test_a_job_tunes_online_and_the_next_job_explores_nothing(folder: str) -> None:
    out = os.path.join(folder, "online.yaml")
    c = Communicator(WORLD, tune="online", tune_out=out, tune_options=OPTIONS)
    bad = _steps(c, 14)
    tuner = c.online
    settled = {k[0]: v.config.key for k, v in tuner.settled.items()}
    everyone = WORLD.allgather(settled)
    if any(s != everyone[0] for s in everyone):
        bad.append(f"ranks settled differently: {everyone}")
    if set(settled) != set(COUNTS):
        bad.append(f"settled only {sorted(settled)} of {COUNTS}")
    if N > 1 and tuner.exploring_calls == 0:
        bad.append("nothing was explored")
    c.close()
    WORLD.Barrier()
    agree(bad)
    assert os.path.exists(out)
    prof = load_profile(out, world_size=N)  # valid for this shape
    assert prof.tuning["mode"] == "online"
    assert prof.tuning["online_settled"] == sorted(4 * k for k in COUNTS)
    # Calls made while their size was tuning (each class's calls up to its settlement).
    assert prof.tuning["exploring_calls"] <= prof.tuning["calls"] <= 14 * len(COUNTS)
    assert prof.tuning["calls"] >= len(COUNTS)
    if RANK == 0:
        # The CLI as a job's user runs it, outside this MPI job (no PMI variables).
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_CVAR_", "OMPI_"))}
        for args in (["show", out], ["export", out, "--format", "ompi"]):
            run = subprocess.run([sys.executable, RINGTUNE, *args], capture_output=True,
                                 text=True, timeout=120, env=env)
            assert run.returncode == 0, (args, run.stderr)
    WORLD.Barrier()

    # The next job: loads what was written and explores nothing for those sizes.
    again = Communicator(WORLD, profile=out, tune="online")
    bad = _steps(again, 2)
    if again.online.exploring_calls:
        bad.append(f"explored {again.online.exploring_calls} call(s) again")
    for k in COUNTS:
        if N > 1 and "settled by an earlier job" not in again.explain(4 * k):
            bad.append(f"explain {4 * k}: {again.explain(4 * k)}")
    again.close()
    agree(bad)


def test_the_written_profile_keeps_the_loaded_profiles_other_rules(folder: str) -> None:
    base = os.path.join(folder, "base.yaml")
    out = os.path.join(folder, "merged.yaml")
    data = {"format": "ringtune-profile", "version": 1, "topology": {"world_size": N},
            "backend": "numpy", "transport": "mpi", "tuning": {"trials": 7},
            "rules": [{"min_bytes": 0, "max_bytes": 1 << 20, "algorithm": "rhd",
                       "params": {}},
                      {"min_bytes": (1 << 20) + 1, "max_bytes": None,
                       "algorithm": "multiring", "params": {"rings": 3, "chunk_bytes": 0}}]}
    if RANK == 0:
        write_profile(data, base)
    WORLD.Barrier()
    c = Communicator(WORLD, profile=base, tune="online", tune_out=out,
                     tune_options=OPTIONS)
    bad = _steps(c, 12, op="sum")
    c.close()
    WORLD.Barrier()
    agree(bad)
    prof = load_profile(out, world_size=N)
    last = prof.rules[-1]
    assert (last.algorithm, last.params["rings"]) == ("multiring", 3)
    assert last.min_bytes > 4 * max(COUNTS)
    assert prof.tuning["previous"] == {"trials": 7}
    assert prof.tuning["base"] == base


def _fails_everywhere(make: Any, exc: type[BaseException], words: str) -> None:
    got = ""
    try:
        make()
    except exc as e:  # noqa: PERF203
        got = str(e)
    agree([] if words in got else [f"expected {exc.__name__} with {words!r}, got {got!r}"])


def test_bad_settings_fail_on_every_rank_before_any_step(
        folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGTUNE_TUNE", "onlien")
    _fails_everywhere(lambda: Communicator(WORLD), ValueError,
                      "RINGTUNE_TUNE='onlien': unknown tuning mode")
    monkeypatch.delenv("RINGTUNE_TUNE")
    if N > 1:
        # Only the last rank tunes: every rank names the ranks that differ.
        if RANK == N - 1:
            monkeypatch.setenv("RINGTUNE_TUNE", "online")
        _fails_everywhere(lambda: Communicator(WORLD), AgreementError,
                          "ranks set different tuning options")
        monkeypatch.delenv("RINGTUNE_TUNE", raising=False)
    missing = os.path.join(folder, "no-such-dir", "p.yaml")
    _fails_everywhere(lambda: Communicator(WORLD, tune="online", tune_out=missing),
                      ValueError, "rank 0: RINGTUNE_TUNE_OUT")
    # Another job writing the same file: refused at the start, naming it.
    busy = os.path.join(folder, "busy.yaml")
    lock = TuneOutLock(busy)
    if RANK == 0:
        lock.acquire()
    WORLD.Barrier()
    _fails_everywhere(lambda: Communicator(WORLD, tune="online", tune_out=busy),
                      ValueError, "is being written by another job")
    lock.release()
    WORLD.Barrier()
    assert not os.path.exists(busy)
    # A loaded profile for another shape: the output would mix shapes.
    other = os.path.join(folder, "other.yaml")
    if RANK == 0:
        write_profile({"format": "ringtune-profile", "version": 1,
                       "topology": {"world_size": N + 1}, "backend": "numpy",
                       "transport": "mpi", "rules": [{"min_bytes": 0, "max_bytes": None,
                                                      "algorithm": "native"}]}, other)
    WORLD.Barrier()
    with pytest.warns(RuntimeWarning) if RANK == 0 else _nothing():
        _fails_everywhere(lambda: Communicator(WORLD, profile=other, tune="online",
                                               tune_out=os.path.join(folder, "x.yaml")),
                          TopologyMismatchError, "online tuning would write")
    assert not os.path.exists(os.path.join(folder, "x.yaml.lock"))


class _nothing:  # noqa: N801 - a null context, named as a statement reads
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
