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
