"""Running under mpiexec: detect it, and launch ourselves under it when started without.

``ringtune bench`` and ``ringtune tune`` started from a plain shell re-run themselves as
``mpiexec -n N python -m ringtune.cli …``; a runtime failure on one rank aborts all
(``ringtune.cli._abort_world``) instead of leaving the others hanging. The mpiexec is the
one the installed MPI provides: next to the Python executable (the ``mpich`` wheel in a
virtual environment), else on ``PATH``; ``$RINGTUNE_MPIEXEC`` overrides.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

from .errors import CommandFailed

_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK",
              "SLURM_PROCID")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def under_mpiexec() -> bool:
    """True when this process was started by an MPI launcher."""
    return any(v in os.environ for v in _RANK_VARS[:4]) or "PMI_FD" in os.environ


def launch_rank() -> int:
    """This process's rank from the launcher's environment (0 when not launched), read
    without initialising MPI, so errors before MPI starts print once."""
    for v in _RANK_VARS:
        val = os.environ.get(v)
        if val and val.isdigit():
            return int(val)
    return 0


def find_mpiexec() -> str:
    """The mpiexec to launch with; ``CommandFailed`` with the fix when there is none."""
    env = os.environ.get("RINGTUNE_MPIEXEC")
    if env:
        return env
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found:
        return found
    raise CommandFailed(
        "no mpiexec found: install MPI (`pip install mpich`), put mpiexec on PATH, or set "
        "RINGTUNE_MPIEXEC; or start the command yourself under mpiexec"
    )


def local_gpu_count() -> int:
    """GPUs visible to this process (NVML, without CuPy); 0 when none or unknown."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return 0
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0
    if visible:
        return min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


def default_ranks() -> int:
    """One rank per local GPU when there are at least two, else max(2, CPU cores), at
    most 8."""
    gpus = local_gpu_count()
    if gpus >= 2:
        return min(gpus, 8)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 2)
    return min(max(2, cores), 8)


def relaunch(argv: Sequence[str], ranks: int | None = None) -> int:
    """Run ``ringtune argv…`` under mpiexec with ``ranks`` ranks; returns its exit code."""
    n = ranks or default_ranks()
    # Not `python -m mpi4py`: that turns every non-zero exit into MPI_Abort and a second
    # stderr line; ringtune.cli aborts the world itself on runtime failures.
    cmd = [find_mpiexec(), "-n", str(n), sys.executable, "-m", "ringtune.cli", *argv]
    env = dict(os.environ, RINGTUNE_LAUNCHED="1")
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130
