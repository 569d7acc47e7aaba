"""A communicator whose world is not the job's is refused before any step: under torchrun
every process's ``MPI.COMM_WORLD`` is a 1-rank singleton, and an allreduce over it would
leave every gradient un-averaged without a word."""

from __future__ import annotations

from typing import Any

import pytest

from collectives import Communicator, WorldMismatchError
from collectives.mpi.launcher import check_mpi_world, job_world_size, under_torchrun

TORCHRUN = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"}


def test_a_singleton_under_torchrun_is_refused_naming_both_sizes_and_the_fix() -> None:
    with pytest.raises(WorldMismatchError) as err:
        check_mpi_world(1, env=TORCHRUN)
    msg = str(err.value)
    assert msg.startswith("rank 1: MPI.COMM_WORLD has 1 rank(s) but the launcher started 2 "
                          "(WORLD_SIZE=2)"), msg
    assert "Communicator(torch.distributed.group.WORLD)" in msg


def test_another_mpis_launcher_is_refused_naming_the_library_check() -> None:
    env = {"PMI_SIZE": "3", "PMI_RANK": "2"}
    with pytest.raises(WorldMismatchError, match=r"rank 2: .* has 1 rank\(s\) but the "
                       r"launcher started 3 \(PMI_SIZE=3\).*--mpi-library"):
        check_mpi_world(1, env=env)


@pytest.mark.parametrize("env", [{}, {"WORLD_SIZE": "1"}, {"PMI_SIZE": "4", "WORLD_SIZE": "9"}])
def test_matching_or_absent_launchers_pass(env: dict[str, str]) -> None:
    size = int(env.get("PMI_SIZE", env.get("WORLD_SIZE", "1")))
    check_mpi_world(size, env=env)  # no error


def test_mpi_launcher_wins_over_world_size_and_torchrun_is_detected() -> None:
    assert job_world_size({"PMI_SIZE": "4", "WORLD_SIZE": "9"}) == (4, "PMI_SIZE")
    assert job_world_size({"WORLD_SIZE": "2"}) == (2, "WORLD_SIZE")
    assert job_world_size({}) is None
    assert under_torchrun(TORCHRUN)
    assert not under_torchrun({**TORCHRUN, "PMI_SIZE": "2"})


def test_communicator_over_an_mpi_singleton_in_a_torchrun_job_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mpi4py import MPI

    for k, v in TORCHRUN.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(WorldMismatchError, match="WORLD_SIZE=2"):
        Communicator(MPI.COMM_WORLD)


def test_no_communicator_outside_torchrun_is_mpis_world() -> None:
    from mpi4py import MPI

    comm = Communicator()
    assert comm.size == MPI.COMM_WORLD.Get_size() == 1
    comm.close()


@pytest.mark.parametrize("how", ["env", "keyword"])
def test_an_empty_profile_name_is_an_error_not_the_defaults(
        monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    from mpi4py import MPI

    from collectives import ProfileError

    if how == "env":
        monkeypatch.setenv("RINGTUNE_PROFILE", "")
    kw = {"profile": ""} if how == "keyword" else {}
    with pytest.raises(ProfileError, match=r"(RINGTUNE_PROFILE|profile=) is empty: name a "
                                           r"profile file, or unset it"):
        Communicator(MPI.COMM_WORLD, **kw)


def test_explain_says_what_host_buffers_run_under_a_gpu_profile(tmp_path: Any) -> None:
    from mpi4py import MPI

    prof = tmp_path / "gpu.yaml"
    prof.write_text("format: ringtune-profile\nversion: 1\ntopology: {world_size: 1}\n"
                    "backend: cupy\ntransport: nccl\nrules:\n"
                    "- {min_bytes: 0, max_bytes: null, algorithm: native}\n")
    comm = Communicator(MPI.COMM_WORLD, profile=str(prof))
    line = comm.explain(1024)
    assert "over nccl" in line and "(for cupy buffers; host buffers run over mpi)" in line, line
    comm.close()
