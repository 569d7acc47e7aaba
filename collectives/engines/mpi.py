"""The ``mpi`` engine: mpi4py communicators (and objects with their surface, such as the
tests' in-process world), as ringtune has always run.

Use it for jobs started by ``mpiexec``. Every transport but another engine's own runs over
it (``mpi``, and on GPUs ``staged`` and ``nccl``). Its communicator object is the mpi4py
``Comm`` itself; what MPI-specific the runtime needs is here: ``MPI_Get_processor_name``,
``MPI_Abort``, thread levels, the refusal of a singleton MPI world in a torchrun job.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..mpi.launcher import check_mpi_world, under_mpi_launcher
from ..transport import mpi_op
from .base import Engine
from .registry import engine_names, get_engine, register_engine


def _is_mpi4py(obj: Any) -> bool:
    return type(obj).__module__.startswith("mpi4py")


class MpiEngine(Engine):
    """mpi4py communicators (see the module docstring)."""

    name = "mpi"
    claim_order = 1000  # last: it claims anything shaped like an mpi4py communicator
    thread_levels = True
    launcher = "mpiexec"
    cli_help = "mpi (mpiexec, or -np self-launch)"
    self_launches = True
    tunes_shapes = tunes_gpu = measures_links = True
    native_library = True

    def detect(self) -> bool:
        return under_mpi_launcher()

    def world(self, gpu: bool = False) -> Any:
        """``MPI.COMM_WORLD``: ``NoMpiError`` (an ``ImportError``) naming what to install
        when no MPI library loads, ``WorldMismatchError`` when the launcher started another
        world than MPI's (a launcher of another library)."""
        from ..mpi.mpilib import load_mpi

        MPI = load_mpi()
        check_mpi_world(MPI.COMM_WORLD.Get_size())
        return MPI.COMM_WORLD

    def retune_hint(self, size: int) -> str:
        return f"re-tune here with `ringtune tune -np {size}`"

    def library(self, gpu: bool = False) -> dict[str, str] | None:
        from ..mpi.mpit import nccl_version
        from ..natives import library

        name, version = library()
        lib = {"name": name, "version": version}
        nccl = nccl_version() if gpu else None
        if nccl:
            lib["nccl"] = nccl
        return lib

    def claims(self, obj: Any) -> bool:
        return _is_mpi4py(obj) or (callable(getattr(obj, "Get_rank", None))
                                   and callable(getattr(obj, "Get_size", None)))

    def check_world(self, comm: Any) -> None:
        # Only a real MPI world can be a singleton in a torchrun job; duck-typed worlds
        # (the tests' threads) are the world they say they are.
        if _is_mpi4py(comm):
            from mpi4py import MPI

            # The launcher's rank, not MPI's: in a singleton every process is MPI rank 0.
            check_mpi_world(MPI.COMM_WORLD.Get_size())

    def host_name(self, comm: Any) -> str:
        from mpi4py import MPI

        return str(MPI.Get_processor_name())

    def world_rank(self, comm: Any) -> int | None:
        try:
            from mpi4py import MPI

            world = MPI.COMM_WORLD.Get_rank()
            if comm != MPI.COMM_WORLD and world != comm.Get_rank():
                return int(world)
        except Exception:  # noqa: BLE001 - naming the rank in ``comm`` is enough
            pass
        return None

    def abort(self, comm: Any, code: int) -> None:
        comm.Abort(code)  # MPI_Abort: ends every rank of the job

    def transports(self) -> tuple[str, ...]:
        return ("mpi",)

    def runs_transport(self, name: str) -> bool:
        # Every transport but another engine's own (GPU plug-ins register theirs later).
        return not any(name in get_engine(e).transports() for e in engine_names()
                       if e != self.name)

    def default_transport(self, comm: Any, backend: Any) -> str:
        return str(backend.default_transport())

    def allreduce_array(self, comm: Any, arr: np.ndarray, op: str) -> None:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, arr, op=mpi_op(op))

    def describe(self, comm: Any) -> dict[str, str]:
        from ..natives import library

        return {"engine": self.name, "backend": library()[0]}


MPI_ENGINE = register_engine(MpiEngine())
