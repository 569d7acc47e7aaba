"""The error of GPU set-up problems (no GPU, wrong device, NCCL missing, shared GPU)."""

from __future__ import annotations

from ..errors import RingtuneError


class GpuError(RingtuneError, ValueError):
    """GPU buffers or a GPU transport cannot be used as asked. The message names the rank,
    what was found, and the fix. A ``ValueError``: it is bad input or set-up, not a bug
    (the CLI exits 2)."""
