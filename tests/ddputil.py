"""DDP on the digits example (examples/train_digits.py), side by side: the training loop the
DDP tests share (under mpiexec, under torchrun, across emulated hosts). ``track`` steps a
model under test and a reference model through the same global batches and reports, after
every step, parameters that left float tolerance of the reference's or that differ between
ranks (bitwise)."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from typing import Any

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

import torch  # noqa: E402
from torch import nn  # noqa: E402
from train_digits import digits, shard  # noqa: E402

_DATA: Any = None


def data() -> Any:
    """The digits example's training set (loaded once)."""
    global _DATA
    if _DATA is None:
        _DATA = digits()
    return _DATA


def sgd(ddp: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)


def step(ddp: nn.Module, opt: torch.optim.Optimizer, k: int, rank: int, size: int,
         batch: int = 16) -> None:
    """Global batch ``k``: this rank's slice forward, backward (DDP exchanges), one step."""
    xtr, ytr = data()[0], data()[1]
    idx = shard(k, len(xtr), batch, rank, size)
    opt.zero_grad(set_to_none=False)
    nn.functional.cross_entropy(ddp(xtr[idx]), ytr[idx]).backward()
    opt.step()


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_every_rank(t: torch.Tensor, allgather: Callable[[Any], list[Any]]) -> bool:
    digest = hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()
    return len(set(allgather(digest))) == 1


def track(ours: nn.Module, ddp_ours: nn.Module, ref: nn.Module, ddp_ref: nn.Module,
          steps: int, rank: int, size: int, allgather: Callable[[Any], list[Any]],
          what: str = "ours", rtol: float = 1e-4, atol: float = 1e-5) -> tuple[list[str], float]:
    """Train ``ddp_ours`` (wrapping ``ours``) and ``ddp_ref`` (wrapping ``ref``, from the
    same initial weights) ``steps`` steps side by side. Returns the failure lines (the
    first bad step only) and the largest difference seen. Collective over ``allgather``'s
    group."""
    opt_ours, opt_ref = sgd(ddp_ours), sgd(ddp_ref)
    worst = 0.0
    for k in range(steps):
        step(ddp_ours, opt_ours, k, rank, size)
        step(ddp_ref, opt_ref, k, rank, size)
        a, b = flat(ours), flat(ref)
        worst = max(worst, float((a - b).abs().max()))
        if not torch.allclose(a, b, rtol=rtol, atol=atol):
            return [f"step {k}: max |{what} - reference| = {float((a - b).abs().max())}"], worst
        if not same_on_every_rank(a, allgather):
            return [f"step {k}: {what}: parameters differ across ranks"], worst
    return [], worst
