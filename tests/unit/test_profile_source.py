"""A profile a job did not name itself but got from ``$RINGTUNE_PROFILE`` (a ``Communicator``,
the DDP hook, the ``ringtune`` torch backend: all build a ``Communicator``) is named with the
variable when it cannot be read: the user must learn where the path came from, not only that
it is missing. One line; the CLI's side is ``tests/cli/test_error_sources.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectives import Communicator


def test_a_missing_profile_from_the_environment_names_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mpi4py import MPI

    missing = str(tmp_path / "nonexistent.yaml")
    monkeypatch.setenv("RINGTUNE_PROFILE", missing)
    with pytest.raises(ValueError) as info:
        Communicator(MPI.COMM_WORLD)
    msg = str(info.value)
    assert "RINGTUNE_PROFILE" in msg and missing in msg and "\n" not in msg, msg


def test_a_missing_profile_passed_by_the_job_names_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mpi4py import MPI

    from collectives import ProfileError

    monkeypatch.delenv("RINGTUNE_PROFILE", raising=False)
    missing = str(tmp_path / "nonexistent.yaml")
    with pytest.raises(ProfileError) as info:
        Communicator(MPI.COMM_WORLD, profile=missing)
    msg = str(info.value)
    assert missing in msg and "RINGTUNE_PROFILE" not in msg and "\n" not in msg, msg
