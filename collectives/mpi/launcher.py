"""What the MPI launcher (mpiexec, srun, torchrun) tells a process through its environment:
its rank, the world size, its rank and the rank count on its host.

Use it where a rank is needed before or without MPI (error lines, GPU binding, deciding
whether to relaunch under mpiexec). Every launcher variable the project reads is listed
here, once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: World-rank variables an MPI launcher sets: MPICH/Hydra (PMI), PMIx, Open MPI, MVAPICH2.
MPI_RANK_VARS: tuple[str, ...] = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                                  "MV2_COMM_WORLD_RANK")
#: Every world-rank variable, MPI launchers first, then Slurm and torchrun.
WORLD_RANK_VARS: tuple[str, ...] = (*MPI_RANK_VARS, "SLURM_PROCID", "RANK")
#: World-size variables of the MPI launchers.
WORLD_SIZE_VARS: tuple[str, ...] = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
#: torchrun's (and torch.distributed's env:// convention's) world size.
TORCH_SIZE_VAR = "WORLD_SIZE"
#: Set by torchrun's agent for its workers: a job started by torchrun, not by mpiexec.
TORCHRUN_VARS: tuple[str, ...] = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
#: Local-rank variables, most specific first: MPICH/Hydra, Open MPI, MVAPICH2, PMIx,
#: Slurm, then the torchrun/accelerate convention.
LOCAL_RANK_VARS: tuple[str, ...] = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                    "MV2_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK",
                                    "SLURM_LOCALID", "LOCAL_RANK")
#: The matching local-size variables (how many ranks share this host).
LOCAL_SIZE_VARS: tuple[str, ...] = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                    "MV2_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE",
                                    "SLURM_NTASKS_PER_NODE", "LOCAL_WORLD_SIZE")


def first_int(names: tuple[str, ...],
              env: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """The first of ``names`` set to a non-negative integer, and its name; else ``None``."""
    env = os.environ if env is None else env
    for name in names:
        raw = env.get(name, "").strip()
        if raw.isdigit():
            return int(raw), name
    return None


def launcher_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's world rank as the launcher set it (0 when not launched)."""
    found = first_int(WORLD_RANK_VARS, env)
    return found[0] if found is not None else 0


def launcher_size(env: Mapping[str, str] | None = None) -> int | None:
    """The world size an MPI launcher set, else ``None``."""
    found = first_int(WORLD_SIZE_VARS, env)
    return found[0] if found is not None else None


def local_rank(env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """This process's rank among the ranks of its host, and the variable it came from
    (``"default"`` when no launcher variable is set: then 0)."""
    found = first_int(LOCAL_RANK_VARS, env)
    return found if found is not None else (0, "default")


def local_size(env: Mapping[str, str] | None = None) -> int | None:
    """How many ranks share this host, when the launcher says; else ``None``."""
    found = first_int(LOCAL_SIZE_VARS, env)
    return found[0] if found is not None and found[0] > 0 else None


def under_mpi_launcher(env: Mapping[str, str] | None = None) -> bool:
    """Whether an MPI launcher (mpiexec, srun with PMI) started this process."""
    env = os.environ if env is None else env
    return any(v in env for v in MPI_RANK_VARS) or "PMI_FD" in env


def under_torchrun(env: Mapping[str, str] | None = None) -> bool:
    """Whether torchrun's agent started this process (its workers carry
    ``TORCHELASTIC_RUN_ID``) and no MPI launcher did."""
    env = os.environ if env is None else env
    return any(v in env for v in TORCHRUN_VARS) and first_int(WORLD_SIZE_VARS, env) is None


def job_world_size(env: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """The world size the job's launcher set and the variable that says it: an MPI
    launcher's first, else torchrun's ``WORLD_SIZE``; ``None`` when no launcher set one."""
    env = os.environ if env is None else env
    return first_int(WORLD_SIZE_VARS, env) or first_int((TORCH_SIZE_VAR,), env)


def check_mpi_world(mpi_world_size: int, rank: int | None = None,
                    env: Mapping[str, str] | None = None) -> None:
    """Refuse an MPI world that is not the job's: ``MPI.COMM_WORLD`` has
    ``mpi_world_size`` ranks where the launcher started another number. Under torchrun
    every process's MPI is a 1-rank singleton; under a launcher of another MPI library
    (Hydra's mpiexec starting an Open MPI build of mpi4py) each rank is its own 1-rank
    job. Either way an allreduce would average nothing: raise ``WorldMismatchError`` with
    the fix, on every rank (each sees the same mismatch)."""
    from ..errors import WorldMismatchError

    found = job_world_size(env)
    if found is None or found[0] == mpi_world_size:
        return
    n, var = found
    r = launcher_rank(env) if rank is None else rank
    if var == TORCH_SIZE_VAR:
        fix = ("under torchrun use Communicator(torch.distributed.group.WORLD) or "
               "dist.init_process_group('ringtune'), or launch with mpiexec -n "
               f"{n} python -m mpi4py ...")
    else:
        fix = ("the mpiexec that started this job belongs to another MPI library than the "
               "one mpi4py loaded (`python -m mpi4py --mpi-library` names it): launch with "
               "that library's mpiexec")
    raise WorldMismatchError(
        f"rank {r}: MPI.COMM_WORLD has {mpi_world_size} rank(s) but the launcher started "
        f"{n} ({var}={n}): {fix}")
