"""``toy``: a deliberately naive allreduce, the proof that a new algorithm is one module.

Every rank sends its buffer to ``root``, which reduces them in rank order and sends the
result back to every rank: 2(n−1) whole-buffer messages through one rank, correct and
bitwise identical on all ranks (the result is computed once), slow on purpose. It uses only
``ctx.transport`` and ``ctx.backend`` and overrides nothing but validation, the search
space and the run (plus, to show an ``inner`` choice of ``hierarchical``, ``grid_phase``):
its cost in the model, its schema fragment and its place in the tuner all come from the
``Algorithm`` defaults.

It is *not* registered on import: tests register it themselves (``with registered(Toy):``
from ``collectives.algorithms.registry``), and the registry is clean again afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collectives.algorithms.base import Algorithm, Context

TAG = 310


class GatherPhase:
    """Gather-reduce-broadcast on the region ``[offset, offset + count)``: after
    ``reduce_scatter`` the root owns the whole region reduced (the others an empty shard),
    ``all_gather`` copies it back to every rank."""

    def __init__(self, ctx: Context, offset: int, count: int, dtype: str, op: str,
                 root: int = 0) -> None:
        self.ctx, self.op, self.root = ctx, op, root
        self.offset, self.count = offset, count
        self.trivial = ctx.size == 1 or count == 0
        self.owned = (offset, count) if ctx.rank == root or self.trivial else (offset, 0)
        self.scratch = None if self.trivial else ctx.backend.empty(count, dtype)

    def _region(self, buf: Any) -> Any:
        return buf[self.offset:self.offset + self.count]

    def reduce_scatter(self, buf: Any) -> None:
        if self.trivial:
            return
        t, region = self.ctx.transport, self._region(buf)
        if t.rank != self.root:
            t.start([(region, self.root, TAG)], []).wait()
            return
        # The root reduces in rank order: the same sum on every run, whatever arrives first.
        for peer in range(t.size):
            if peer != self.root:
                t.start([], [(self.scratch, peer, TAG)]).wait()
                self.ctx.backend.reduce_into(region, self.scratch, self.op)

    def all_gather(self, buf: Any) -> None:
        if self.trivial:
            return
        t, region = self.ctx.transport, self._region(buf)
        if t.rank == self.root:
            t.start([(region, peer, TAG + 1) for peer in range(t.size) if peer != self.root],
                    []).wait()
        else:
            t.start([], [(region, self.root, TAG + 1)]).wait()


class Toy(Algorithm):
    """Gather to ``root``, reduce there, send the result back (see the module docstring)."""

    name = "toy"
    param_names = ("root",)
    #: It can run along one dimension of a ``hierarchical`` grid (after the built-ins).
    grid_dimension = 50

    @classmethod
    def check_params(cls, params: Mapping[str, Any], world_size: int) -> dict[str, Any]:
        p = super().check_params(params, world_size)
        root = p.get("root", 0)
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < world_size:
            raise ValueError(f"root: expected a rank 0..{world_size - 1}, got {root!r}")
        return {"root": root}

    @classmethod
    def search_space(cls, trial: Any, world_size: int, nbytes: int) -> dict[str, Any]:
        return {"root": trial.suggest_categorical("toy.root", sorted({0, world_size - 1}))}

    @classmethod
    def grid_phase(cls, ctx: Context, offset: int, count: int, dtype: str, op: str,
                   params: Mapping[str, Any]) -> GatherPhase:
        return GatherPhase(ctx, offset, count, dtype, op)

    def __init__(self, ctx: Context, count: int, dtype: str, op: str,
                 params: Mapping[str, Any]) -> None:
        super().__init__(ctx, count, dtype, op, params)
        self.phase = GatherPhase(ctx, 0, count, dtype, op, self.params.get("root", 0))

    def run(self, buf: Any) -> None:
        self.phase.reduce_scatter(buf)
        self.phase.all_gather(buf)
