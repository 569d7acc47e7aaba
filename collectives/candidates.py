"""The offline tuner's search space, walked without Optuna: what online tuning may try.

Use ``searchable_algorithms()`` for the algorithms a search considers, ``draw(rng, …)`` for
one random configuration of the space, ``guesses(…)`` for the hand-made configurations both
tuners try before searching, ``in_space(config, …)`` to ask whether a hand-made guess is
one of its configurations, and ``EnumeratingTrial`` to list a discrete space depth-first
(``autotune.space.enumerate_space`` uses it). Online tuning
(``collectives.online``) lives in ``collectives``, which never imports ``autotune`` or
Optuna; so the space is derived here from the algorithm classes themselves, exactly as
``autotune.space.suggest`` asks Optuna for it: an algorithm among the searchable ones, then
that algorithm's own ``search_space_on(trial, world_size, nbytes, hosts)``, with a small
stand-in for the Optuna trial. A configuration drawn here is one the offline tuner could
have tried, and nothing outside it is ever explored.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from .algorithms import algorithm_names, get_algorithm
from .plan import Config

#: Size classes from this size on also try the pipelined tier-aware grid across hosts.
PIPELINE_GUESS_BYTES = 8 << 20

#: Leaves of one algorithm's sub-space ``in_space`` walks at most (hierarchical's space
#: on 8 ranks is ~3,000 configurations, ~0.3 ms each): a guess not found within it is
#: treated as outside the space, never explored.
MAX_WALK = 6000


def searchable_algorithms() -> list[str]:
    """Every registered algorithm the tuner searches: all but test-only ones
    (``Algorithm.test_only``, searched only when named)."""
    return [n for n in algorithm_names() if not get_algorithm(n).test_only]


class Branch(Exception):
    """Raised by ``EnumeratingTrial`` at the first suggestion past its path: ``n`` options."""

    def __init__(self, n: int) -> None:
        self.n = n


class EnumeratingTrial:
    """A stand-in for ``optuna.Trial`` that replays a prefix of choices (``path``: option
    indices) and stops at the first new suggestion, raising ``Branch`` with how many options
    it has (depth-first enumeration). ``params`` holds the choices made, by name."""

    def __init__(self, path: list[int]) -> None:
        self.path = path
        self.pos = 0
        self.params: dict[str, Any] = {}

    def _pick(self, name: str, options: list[Any]) -> Any:
        if not options:
            raise ValueError(f"search space parameter {name!r} has no options")
        if self.pos >= len(self.path):
            raise Branch(len(options))
        value = options[self.path[self.pos]]
        self.pos += 1
        self.params[name] = value
        return value

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._pick(name, list(choices))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        return int(self._pick(name, list(range(low, high + 1, step))))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        if step is None:
            raise ValueError(f"search space parameter {name!r} is continuous; the grid "
                             "sampler needs discrete parameters (use --sampler tpe)")
        n = int(round((high - low) / step))
        return float(self._pick(name, [low + i * step for i in range(n + 1)]))


class RandomTrial:
    """A stand-in for ``optuna.Trial`` that picks every suggestion uniformly at random
    (Optuna's ``RandomSampler`` over the same define-by-run space)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        options = list(choices)
        if not options:
            raise ValueError(f"search space parameter {name!r} has no options")
        return options[self.rng.randrange(len(options))]

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        return int(self.rng.choice(range(low, high + 1, step)))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        if step is None:
            return self.rng.uniform(low, high)
        n = int(round((high - low) / step))
        return float(low + self.rng.randrange(n + 1) * step)


def _config(trial: Any, algorithm: str, world_size: int, nbytes: int, hosts: int) -> Config:
    if world_size <= 1:
        return Config(algorithm)  # every algorithm is a no-op on one rank
    cls = get_algorithm(algorithm)
    return Config(algorithm, cls.search_space_on(trial, world_size, nbytes, hosts))


def draw(rng: random.Random, world_size: int, nbytes: int, hosts: int = 1,
         algorithms: Sequence[str] | None = None) -> Config:
    """One configuration of the space, drawn at random (the algorithm first, uniformly,
    then each of its parameters)."""
    names = list(algorithms) if algorithms is not None else searchable_algorithms()
    algo = names[rng.randrange(len(names))]
    return _config(RandomTrial(rng), algo, world_size, nbytes, hosts)


def guesses(world_size: int, nbytes: int, hosts: int = 1,
            ranks_per_host: int | None = None) -> dict[str, Config]:
    """The hand-made configurations the tuners try before any search, by name, in the order
    online tuning tries them (``collectives.online.guesses``, after the built-in defaults'
    choice); the offline tuner's warm start (``autotune.bucket_search``) takes some of
    them by name. The one list of guesses: add one here, under a new name, and to the
    tuner that should try it. Each tuner drops a guess its space does not hold for this
    world (``in_space``); only guesses that make sense here are listed (the tier-aware grid
    needs several hosts of ``ranks_per_host`` > 1 ranks each)."""
    out: dict[str, Config] = {}
    if hosts > 1:
        if ranks_per_host and ranks_per_host * hosts == world_size and ranks_per_host > 1:
            # The tier-aware grid: reduce-scatter inside hosts, then across them.
            grid = {"dims": [ranks_per_host, hosts], "rings": 1, "chunk_bytes": 0,
                    "inner": ["multiring", "multiring"]}
            if nbytes >= PIPELINE_GUESS_BYTES:
                # Large buckets: the same grid pipelined (1 MiB pieces, 8 in flight), what
                # the offline tuner chose on the emulated 2 x 2 at 64 MiB (1.55x native);
                # random draws alone rarely reach it within a class's few candidates.
                out["grid_pipelined"] = Config("hierarchical", {**grid, "chunk_bytes": 1 << 20,
                                                                "pipeline": 8})
            out["grid"] = Config("hierarchical", grid)
            # The same grid with shared memory inside the hosts (DDL's shape with the
            # fastest path on each tier).
            out["grid_shm"] = Config("hierarchical", {**grid, "inner": ["shm", "multiring"]})
        from .natives import current

        # The library's flat composition (``NativeLibrary.flat_composition``: one of many
        # native configurations there, often better than its own choice across hosts).
        flat = current().flat_composition
        if flat:
            out["flat_composition"] = Config("native", {"composition": flat})
    out["native"] = Config("native")
    if hosts <= 1:
        out["shm"] = Config("shm")  # ringtune's own shared memory, the host's fastest path
    out["two_rings"] = Config("multiring", {"rings": 2, "chunk_bytes": 0})
    out["rhd"] = Config("rhd")
    out["one_ring"] = Config("multiring", {"rings": 1, "chunk_bytes": 0})
    return out


def normalised(config: Config, world_size: int) -> Config:
    """``config`` with its parameters as the algorithm fills them in (defaults explicit);
    ``ValueError`` where ``check_params`` refuses them."""
    params = get_algorithm(config.algorithm).check_params(config.params, world_size)
    return Config(config.algorithm, params, config.transport)


def in_space(config: Config, world_size: int, nbytes: int, hosts: int = 1,
             limit: int = MAX_WALK) -> bool:
    """Whether ``config`` (after filling in defaults) is a configuration of the tuner's
    space for this message and world: its algorithm is searchable and some walk of that
    algorithm's own space gives it. Walks at most ``limit`` configurations."""
    if config.algorithm not in searchable_algorithms():
        return False
    try:
        want = normalised(config.with_transport(None), world_size)
    except ValueError:
        return False
    stack: list[list[int]] = [[]]
    walked = 0
    while stack and walked < limit:
        path = stack.pop()
        trial = EnumeratingTrial(path)
        try:
            cfg = _config(trial, config.algorithm, world_size, nbytes, hosts)
        except Branch as br:
            stack.extend(path + [i] for i in reversed(range(br.n)))
            continue
        walked += 1
        try:
            if normalised(cfg, world_size) == want:
                return True
        except ValueError:
            continue
    return False
