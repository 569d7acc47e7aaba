"""The tuner's warm start: the configurations the cost model ranks fastest (``best_guesses``).

Use it where the tuner (``autotune.bucket_search``) enqueues its first trials, or anywhere a
short list of likely-best (algorithm, params) pairs for one world size and message size is
wanted; with nothing measured it runs the model on ``default_cluster``.
"""

from __future__ import annotations

from typing import Any

from .calibrate import calibrate
from .cluster import Cluster, Level
from .model import Model


def default_cluster(world_size: int) -> Cluster:
    """A single host of ``world_size`` ranks with generic shared-memory figures, for when
    nothing was measured (only the ranking of configurations matters there)."""
    return Cluster(
        name=f"default-{world_size}",
        levels=(Level("host", max(1, world_size), 5.0, 1.0, 1.0, True,
                      "generic shared memory"),),
        memory_gbs=10.0, overhead_us=10.0, description="uncalibrated default")


def fit_world(cluster: Cluster, world_size: int) -> Cluster:
    """The calibration's cluster when its rank count matches, else its innermost level
    stretched to ``world_size`` ranks (one host)."""
    if cluster.ranks == world_size:
        return cluster
    from dataclasses import replace

    inner = replace(cluster.levels[0], size=max(1, world_size))
    return replace(cluster, levels=(inner,), name=f"{cluster.name} (as {world_size} ranks)")


def best_guesses(world_size: int, nbytes: int, calibration: Any = None,
                 limit: int = 4) -> list[tuple[str, dict[str, Any]]]:
    """The configurations the model ranks fastest for ``nbytes`` on ``world_size`` ranks,
    as (algorithm, params) with runtime parameter names, fastest first and distinct.

    ``calibration``: ``None`` (generic figures), a ``Cluster``, a measured link matrix or a
    ``Topology`` with links (see ``calibrate``)."""
    if world_size <= 1:
        return [("native", {})]
    cluster = default_cluster(world_size) if calibration is None else calibrate(calibration)
    model = Model(fit_world(cluster, world_size))
    return [(p.algorithm, dict(p.params)) for p in model.ranked(int(nbytes), limit)]
