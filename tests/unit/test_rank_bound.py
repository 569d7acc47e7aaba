"""The bound on self-launched ranks (ringtune/launch.py, issue 35): ``--oversubscribe`` lifts
the 4-per-core cap, never the machine's bound (cores, PID headroom, memory);
``RINGTUNE_MAX_RANKS`` is the explicit way past it. Refusals only: nothing is launched."""

from __future__ import annotations

from pathlib import Path

import pytest

import ringtune.launch as launch
from collectives.mpi.launcher import MPI_RANK_VARS
from ringtune.errors import UsageError
from ringtune.launch import (
    HARD_RANKS_PER_CORE,
    MEM_PER_RANK,
    TASKS_PER_RANK,
    check_ranks,
    machine_rank_bound,
)


@pytest.fixture(autouse=True)
def _not_launched(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*MPI_RANK_VARS, "PMI_FD", "RINGTUNE_LAUNCHED", "RINGTUNE_MAX_RANKS"):
        monkeypatch.delenv(var, raising=False)

    def no_launch(*_a: object, **_k: object) -> None:
        raise AssertionError("a refusal test launched something")

    monkeypatch.setattr(launch.subprocess, "Popen", no_launch)


def test_the_least_of_cores_pids_and_memory_bounds_and_is_named() -> None:
    gib = 1 << 30
    assert machine_rank_bound(2, 64 * gib, 4_000_000, 500, None) == (
        2 * HARD_RANKS_PER_CORE, f"{HARD_RANKS_PER_CORE} per core, 2 usable cores")
    bound, why = machine_rank_bound(64, 2 * gib, 4_000_000, 500, None)
    assert bound == 2 * gib // MEM_PER_RANK and "MiB available" in why
    bound, why = machine_rank_bound(64, 64 * gib, 32768, 32000, None)
    assert bound == (32768 - 32000) // 2 // TASKS_PER_RANK and "pid_max 32768" in why
    bound, why = machine_rank_bound(64, 64 * gib, 4_000_000, 500, 900)
    assert bound == (900 - 500) // 2 // TASKS_PER_RANK and "RLIMIT_NPROC" in why
    assert machine_rank_bound(1, 0, 10, 10, None)[0] == 1  # at least one rank
    assert machine_rank_bound(3, None, None, None, None)[0] == 3 * HARD_RANKS_PER_CORE


def test_this_machines_bound_is_sane() -> None:
    bound, why = launch.rank_bound()
    cores = launch.usable_cores()
    assert 1 <= bound <= cores * HARD_RANKS_PER_CORE and why


@pytest.mark.parametrize("oversubscribe", [False, True])
def test_above_the_bound_is_refused_with_or_without_oversubscribe(
        monkeypatch: pytest.MonkeyPatch, oversubscribe: bool) -> None:
    monkeypatch.setattr(launch, "usable_cores", lambda: 8)
    monkeypatch.setattr(launch, "rank_bound", lambda: (6, "400 MiB available"))
    check_ranks(6, oversubscribe)
    with pytest.raises(UsageError) as info:
        check_ranks(7, oversubscribe)
    line = str(info.value)
    assert line.startswith("-np 7: ") and "at most 6 (400 MiB available)" in line
    assert "RINGTUNE_MAX_RANKS=7" in line and "\n" not in line


def test_oversubscribe_lifts_the_cap_not_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "usable_cores", lambda: 2)
    with pytest.raises(UsageError, match="--oversubscribe"):
        check_ranks(9)  # the 4-per-core cap, as before
    check_ranks(9, oversubscribe=True)
    with pytest.raises(UsageError, match=r"at most 32 \(16 per core, 2 usable cores\), "
                                         "--oversubscribe or not"):
        check_ranks(100_000, oversubscribe=True)


def test_max_ranks_is_the_explicit_way_past(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "usable_cores", lambda: 2)
    monkeypatch.setenv("RINGTUNE_MAX_RANKS", "64")
    check_ranks(64, oversubscribe=True)
    with pytest.raises(UsageError, match=r"at most 64 \(RINGTUNE_MAX_RANKS\).*raise "
                                         "RINGTUNE_MAX_RANKS"):
        check_ranks(65, oversubscribe=True)
    monkeypatch.setenv("RINGTUNE_MAX_RANKS", "inf")
    with pytest.raises(ValueError, match="RINGTUNE_MAX_RANKS='inf'"):
        check_ranks(65, oversubscribe=True)


def test_the_cli_refuses_before_launching(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from ringtune.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch, "usable_cores", lambda: 2)
    for verb in (["bench", "-b", "8", "-e", "8"], ["tune", "--out", "unused.yaml"]):
        assert main([*verb, "-np", "100000", "--oversubscribe"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "RINGTUNE_MAX_RANKS=100000" in lines[0], lines
    assert list(tmp_path.iterdir()) == []
