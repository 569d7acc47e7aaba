"""Which distributed engine a CLI verb runs over, and its world.

``ringtune tune|bench|probe`` run with MPI under mpiexec (or launch themselves under it)
and with ``torch.distributed`` under torchrun::

    torchrun --nproc-per-node 2 --no-python ringtune bench -b 1K -e 1M

Use ``add_engine_argument`` for the verb's ``--engine auto|mpi|torch`` flag (``auto``, the
default: ``torch`` when torchrun's agent started this process, ``collectives.launcher.
under_torchrun``, else ``mpi``), ``resolve_engine`` to decide before anything starts (bad
combinations are one line, exit 2), and ``engine_world`` for the world communicator the
verb then hands to ``Communicator``/``tune``: ``MPI.COMM_WORLD``, or a ``TorchComm`` over
``torch.distributed``'s default group (made here from torchrun's environment: gloo, plus
NCCL for GPU buffers). ``close_world`` ends what ``engine_world`` started.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from collectives.launcher import under_torchrun

from .errors import UsageError

#: ``--engine`` values; ``auto`` follows the launcher.
ENGINE_CHOICES = ("auto", "mpi", "torch")
#: What ``torch.distributed``'s ``env://`` initialisation needs from the launcher.
TORCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def add_engine_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", default="auto", choices=ENGINE_CHOICES,
                   help="distributed engine: mpi (mpiexec, or -np self-launch), torch "
                   "(torch.distributed from torchrun's environment; gloo, NCCL for GPU "
                   "buffers), or auto (default: torch under torchrun, else mpi)")


def resolve_engine(args: argparse.Namespace) -> str:
    """``mpi`` or ``torch`` for this run; ``UsageError`` for combinations that cannot work
    (checked on every rank alike, before any communication)."""
    asked = getattr(args, "engine", "auto") or "auto"
    engine = asked if asked != "auto" else ("torch" if under_torchrun() else "mpi")
    if engine != "torch":
        return engine
    if getattr(args, "np", None) is not None:
        raise UsageError("-np launches ranks under mpiexec (the mpi engine); under torchrun "
                         "the ranks are torchrun's: set them with --nproc-per-node")
    missing = [v for v in TORCH_ENV if not os.environ.get(v)]
    if missing:
        raise UsageError(f"--engine torch: torch.distributed's environment is not set "
                         f"({', '.join(missing)} missing): start the command under torchrun, "
                         "e.g. torchrun --nproc-per-node 2 --no-python ringtune "
                         f"{getattr(args, 'verb', 'bench')} ...")
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise UsageError(f"--engine torch needs PyTorch ({exc}): install it with "
                         "`pip install 'ringtune[torch]'`") from None
    if not dist.is_available():
        raise UsageError("--engine torch: this torch has no torch.distributed; install a "
                         "torch build with distributed support")
    from collectives.engines.torch import missing_torch_feature

    lacking = missing_torch_feature()
    if lacking:
        raise UsageError(f"--engine torch: {lacking}")
    return engine


def engine_world(engine: str, gpu: bool = False) -> Any:
    """The world communicator object of ``engine``: ``MPI.COMM_WORLD`` (``mpi_world``), or
    a ``TorchComm`` over the default process group, initialised here from the launcher's
    environment when the process has none yet (``gloo``; ``cpu:gloo,cuda:nccl`` for GPU
    buffers)."""
    if engine == "mpi":
        from .launch import mpi_world

        return mpi_world()  # no MPI, or another library's launcher: one line
    import torch.distributed as dist

    from collectives.engines.torch import TorchComm

    if not dist.is_initialized():
        dist.init_process_group("cpu:gloo,cuda:nccl" if gpu else "gloo")
    return TorchComm(dist.group.WORLD)


def close_world(engine: str) -> None:
    """End what ``engine_world`` started (torch: the default process group)."""
    if engine != "torch":
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
