"""What must hold before ``torch.distributed`` becomes ringtune's engine: the lowest torch
ringtune supports (checked by a feature, not a version string) and, for the CLI, the
launcher's environment.

Use ``missing_torch_feature()`` where torch becomes the engine or backend (``import
collectives.torch``, the CLI) and ``launch_refusal(verb, np)`` for a CLI verb under
``--engine torch`` (``TorchEngine.cli_refusal``). Importing it does not import torch.
"""

from __future__ import annotations

import os

#: What ``torch.distributed``'s ``env://`` initialisation needs from the launcher.
TORCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launch_refusal(verb: str, np: int | None) -> str | None:
    """Why the CLI's ``verb`` cannot run over the torch engine here (one line naming the
    fix), else ``None``: ``-np`` (torchrun starts the ranks), torchrun's environment
    missing, no PyTorch, a torch without torch.distributed or below the floor."""
    if np is not None:
        return ("-np launches ranks under mpiexec (the mpi engine); under torchrun "
                "the ranks are torchrun's: set them with --nproc-per-node")
    missing = [v for v in TORCH_ENV if not os.environ.get(v)]
    if missing:
        return (f"--engine torch: torch.distributed's environment is not set "
                f"({', '.join(missing)} missing): start the command under torchrun, "
                "e.g. torchrun --nproc-per-node 2 --no-python ringtune "
                f"{verb} ...")
    try:
        import torch.distributed as dist
    except ImportError as exc:
        return (f"--engine torch needs PyTorch ({exc}): install it with "
                "`pip install 'ringtune[torch]'`")
    if not dist.is_available():
        return ("--engine torch: this torch has no torch.distributed; install a "
                "torch build with distributed support")
    lacking = missing_torch_feature()
    return f"--engine torch: {lacking}" if lacking else None


#: The lowest torch ringtune supports: pyproject.toml's ``torch`` extra says the same, and
#: ``make torch-lowest`` runs the torch suites on it. 2.13, not 2.7 (the first with the
#: feature below): on 2.7.0 ``ringtune tune`` under torchrun hangs at exit after writing
#: its profile, a cause not found.
TORCH_FLOOR = "2.13"


def missing_torch_feature() -> str | None:
    """What the installed torch lacks for ringtune's torch engine and backend, as one line
    naming the fix; ``None`` when it has everything. Checked where torch.distributed becomes
    ringtune's engine (the CLI under torchrun, ``import collectives.torch``) rather than
    by comparing version strings: a build that has the feature passes whatever it is called.

    The feature: ``ProcessGroup.shutdown``, which ``destroy_process_group`` calls on every
    group from torch 2.7 on (2.5 and 2.6 call it on NCCL's alone). Without it (torch 2.2)
    the groups ringtune builds (the ``ringtune`` backend's, a communicator's sub-groups) are
    freed whenever garbage collection reaches them: their sockets stay open after
    ``destroy_process_group``, and gloo aborts the process at exit (``terminate called
    without an active exception``)."""
    import torch

    # The feature is on the C++ class; torch._C is where it is (checked on torch 2.14.1).
    c10d = getattr(torch._C, "_distributed_c10d", None)  # noqa: SLF001
    if c10d is not None and callable(getattr(c10d.ProcessGroup, "shutdown", None)):
        return None
    return (f"torch {torch.__version__} has no ProcessGroup.shutdown (destroy_process_group "
            "cannot free the groups ringtune builds; gloo aborts at exit): ringtune's torch "
            f"engine and backend need torch >= {TORCH_FLOOR}: "
            f"pip install 'torch>={TORCH_FLOOR}'")


def torch_available() -> bool:
    """Whether torch.distributed can be imported here (without importing it twice)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available())
