"""The search space of the tuner: which algorithms and parameters a bucket may try.

Use ``suggest(trial, world_size, nbytes, algorithms)`` inside an Optuna trial (define-by-run:
the algorithm is chosen first, then that algorithm's own ``search_space`` suggests its
parameters), ``enumerate_space`` to list every configuration of a discrete space (the grid
sampler and the search-efficiency benchmark), and ``config_key`` to compare
configurations. A configuration is a ``collectives.plan.Config``: the algorithm, its params
as the algorithm's ``check_params`` accepts them, and, on GPU buffers only, the chosen
transport (searched as the Optuna parameter ``TRANSPORT_PARAM``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from collectives.algorithms import algorithm_names, get_algorithm
from collectives.algorithms.base import Algorithm
from collectives.candidates import Branch as _Branch
from collectives.candidates import EnumeratingTrial as _EnumeratingTrial
from collectives.plan import Config

__all__ = ["ALGORITHM_PARAM", "TRANSPORT_PARAM", "Config", "searchable", "suggest",
           "config_key", "describe", "enumerate_space", "normalise", "trial_params_for"]

#: Name of the top-level Optuna parameter that picks the algorithm.
ALGORITHM_PARAM = "algorithm"

#: Name of the Optuna parameter that picks the GPU transport (``Config.transport``);
#: searched only when the buffers are on the GPU (``--backend cupy``).
TRANSPORT_PARAM = "transport"


def searchable(names: Sequence[str] | None = None, gpu: bool = False) -> list[str]:
    """The algorithms to search: ``names`` (checked against the registry) or every
    registered algorithm except test-only ones (``Algorithm.test_only``: searched only when
    named) and, for GPU buffers (``gpu``), those whose data path is host memory
    (``Algorithm.intra_host_only``). ``ValueError`` naming an unknown one."""
    known = algorithm_names()
    if not names:
        return [n for n in known if not get_algorithm(n).test_only
                and not (gpu and get_algorithm(n).intra_host_only)]
    out = []
    for n in names:
        if n not in known:
            raise ValueError(f"--algo: unknown algorithm {n!r}; use some of "
                             f"{', '.join(known)}")
        if n not in out:
            out.append(n)
    return out


class _StableNames:
    """Wraps an Optuna trial so that a categorical parameter whose choices depend on other
    parameters (``chunk_bytes`` choices that depend on ``rings``) gets one Optuna name per
    choice list: Optuna refuses a categorical whose value space changes between trials."""

    def __init__(self, trial: Any) -> None:
        self._trial = trial

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        choices = list(choices)
        tag = hashlib.sha1(json.dumps(choices, default=str).encode()).hexdigest()[:6]
        return self._trial.suggest_categorical(f"{name}[{tag}]", choices)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._trial, attr)


def suggest(trial: Any, world_size: int, nbytes: int, algorithms: Sequence[str],
            transports: Sequence[str] | None = None, hosts: int = 1) -> Config:
    """Ask ``trial`` for one configuration (define-by-run, conditional on the algorithm),
    for a world of ``world_size`` ranks on ``hosts`` hosts.

    ``transports`` (GPU buffers only: the transports every rank can use, best first) adds
    the categorical ``TRANSPORT_PARAM``; the chosen one is the configuration's
    ``transport``."""
    algo = trial.suggest_categorical(ALGORITHM_PARAM, list(algorithms))
    cls: type[Algorithm] = get_algorithm(algo)
    if world_size == 1:
        # Every algorithm is a no-op on one rank: parameters cannot matter.
        return Config(algo)
    transport: str | None = None
    if transports:
        transport = trial.suggest_categorical(TRANSPORT_PARAM, list(transports))
    return Config(algo, cls.search_space_on(_StableNames(trial), world_size, nbytes, hosts),
                  transport)


def config_key(config: Config) -> str:
    """A canonical string for a configuration (equal configurations, equal keys):
    ``Config.key``, the text the studies record."""
    return config.key


def describe(config: Config) -> str:
    """``multiring rings=2 chunk_bytes=1048576`` for people (``Config.text``)."""
    return config.text()


def enumerate_space(world_size: int, nbytes: int, algorithms: Sequence[str],
                    transports: Sequence[str] | None = None, hosts: int = 1,
                    ) -> list[tuple[dict[str, Any], Config]]:
    """Every configuration of the space: a list of (Optuna trial params, configuration),
    duplicates (different trial params, same configuration) removed."""
    out: list[tuple[dict[str, Any], Config]] = []
    seen: set[str] = set()
    stack: list[list[int]] = [[]]
    while stack:
        path = stack.pop()
        trial = _EnumeratingTrial(path)
        try:
            cfg = suggest(trial, world_size, nbytes, algorithms, transports, hosts)
        except _Branch as br:
            stack.extend(path + [i] for i in reversed(range(br.n)))
            continue
        key = cfg.key
        if key not in seen:
            seen.add(key)
            out.append((trial.params, cfg))
    return out


def normalise(config: Config, world_size: int) -> Config:
    """The configuration with its parameters as the algorithm fills them in (defaults made
    explicit), for comparing a hand-made guess with the configurations of the space."""
    params = get_algorithm(config.algorithm).check_params(config.params, world_size)
    return Config(config.algorithm, params, config.transport)


def trial_params_for(guess: Config, space: Sequence[tuple[dict[str, Any], Config]],
                     world_size: int) -> dict[str, Any] | None:
    """The Optuna trial params of the space's configuration equal to ``guess`` (after
    filling in defaults), or ``None`` when the guess is outside the space."""
    try:
        want = normalise(guess, world_size)
    except ValueError:
        return None
    for tparams, cfg in space:
        try:
            if normalise(cfg, world_size) == want:
                return tparams
        except ValueError:
            continue
    return None
