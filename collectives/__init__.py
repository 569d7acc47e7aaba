"""ringtune's runtime: a topology-aware allreduce for jobs under MPI (mpi4py) and
torch.distributed, with its own shared-memory path within a host.

    from collectives import Communicator
    comm = Communicator(MPI.COMM_WORLD)
    comm.allreduce(buf, op="sum")

Importing this package is light: no optuna, no CuPy (until a GPU buffer arrives), no NVML.
"""

from __future__ import annotations

from .algorithms import algorithm_names, get_algorithm
from .communicator import Communicator
from .errors import (
    AgreementError,
    ProfileError,
    RingtuneError,
    TopologyMismatchError,
    WorldMismatchError,
)
from .plan import Plan

__version__ = "0.1.0"

__all__ = [
    "Communicator",
    "Plan",
    "ProfileError",
    "AgreementError",
    "TopologyMismatchError",
    "WorldMismatchError",
    "RingtuneError",
    "algorithm_names",
    "get_algorithm",
    "__version__",
]
