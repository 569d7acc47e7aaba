"""``native``: the communication library's own allreduce (MPI_Allreduce on host buffers,
NCCL allReduce on GPU buffers). The baseline every tuned choice must beat, and often the
best choice for small messages, where its latency-optimised algorithms win."""

from __future__ import annotations

from typing import Any

from . import register
from .base import Algorithm


@register
class Native(Algorithm):
    """Delegate to ``transport.native_allreduce``; no parameters."""

    name = "native"

    def run(self, buf: Any) -> None:
        if self.count == 0 or self.ctx.size == 1:
            return
        self.ctx.transport.native_allreduce(buf, self.op)
