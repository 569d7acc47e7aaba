"""The first trials of a new bucket's study: ``native``, then the cost model's best guesses
and the hand-made guesses both tuners share (``collectives.candidates.guesses``), each as
the trial parameters of the search space (``autotune.space``).

Use ``warm_start(...)`` on rank 0 when a study has no trials yet
(``autotune.bucket_search.Driver.prepare`` enqueues what it returns, in order).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from collectives.candidates import guesses as candidate_guesses
from collectives.plan import Config
from collectives.profile import builtin_profile

from . import space


def warm_start(algorithms: Sequence[str], world_size: int, nbytes: int, hosts: int,
               transports: Sequence[str] | None,
               grid_of: Callable[[], list[tuple[dict[str, Any], Config]]],
               ) -> list[dict[str, Any]]:
    """``native`` first, then the cost model's best guesses and sensible defaults.
    ``grid_of()``: the bucket's enumerated space (``ValueError`` for a continuous one)."""
    out: list[dict[str, Any]] = []
    # On GPU buffers every warm-start guess uses the best transport every rank has.
    best_transport = transports[0] if transports else None
    if best_transport is None or world_size <= 1:
        best_transport = None
    if "native" in algorithms:
        first: dict[str, Any] = {space.ALGORITHM_PARAM: "native"}
        if best_transport is not None:
            first[space.TRANSPORT_PARAM] = best_transport
        try:
            # native's own parameters (the library's ``impl``) at its default.
            exact = space.trial_params_for(Config("native", {}, best_transport),
                                           grid_of(), world_size)
        except ValueError:
            exact = None
        out.append(exact or first)
    guesses: list[Config] = []
    # Imported here: the model pulls in NumPy-heavy code the driver's other paths skip.
    from .guesses import best_guesses

    try:
        # The model's three best among the algorithms searched here.
        guesses.extend([Config(a, p) for a, p in best_guesses(world_size, nbytes)
                        if a in algorithms][:3])
    except Exception as exc:  # noqa: BLE001 - a guess is only a head start
        warnings.warn(f"cost model guesses unavailable: {exc}", RuntimeWarning,
                      stacklevel=3)
    _, rule = builtin_profile(world_size).select(nbytes)
    guesses.append(Config(rule.algorithm, rule.params))
    # The hand-made guesses both tuners share (``collectives.candidates.guesses``), by
    # name: shared memory (one host), two whole-segment rings and halving-doubling
    # after the defaults' choice,
    # and the library's flat composition (one of many native configurations there,
    # often better than its own choice across hosts) first among the guesses; a guess
    # outside the space is dropped below.
    shared = candidate_guesses(world_size, nbytes, hosts)
    guesses += [shared[name] for name in ("shm", "two_rings", "rhd") if name in shared]
    if "flat_composition" in shared:
        guesses.insert(0, shared["flat_composition"])
    try:
        grid = grid_of()
    except ValueError:
        return out
    for guess in guesses:
        if guess.algorithm not in algorithms:
            continue
        # On GPU buffers every guess runs on the best transport every rank has.
        tparams = space.trial_params_for(guess.with_transport(best_transport), grid,
                                         world_size)
        if tparams is not None and tparams not in out:
            out.append(tparams)
    return out
