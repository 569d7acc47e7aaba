"""The candidates of one size class in online tuning: the incumbent first, then the
built-in defaults' choice and the hand-made guesses both tuners share
(``collectives.candidates.guesses``) where the tuner's space holds them, then random
configurations of that space. Use ``candidate_list``; rank 0 calls it once per class.
"""

from __future__ import annotations

import random

from ..candidates import draw, guesses, in_space, normalised
from ..plan import Config
from .options import OnlineOptions


def candidate_list(incumbent: Config, world_size: int, nbytes: int, hosts: int,
                   ranks_per_host: int | None, opts: OnlineOptions,
                   rng: random.Random, default: Config | None = None,
                   ) -> list[Config]:
    """The candidates of one size class: ``incumbent`` (the profile's choice, always
    first), then ``default`` (the built-in defaults' choice) and every shared guess
    (``collectives.candidates.guesses``, in its order) where the tuner's space holds them,
    then random configurations of the space, distinct after defaults are filled in,
    ``opts.candidates`` at most."""
    out: list[Config] = [incumbent]
    seen: set[Config] = set()
    try:
        seen.add(normalised(incumbent.with_transport(None), world_size))
    except ValueError:
        pass
    if world_size <= 1:
        return out  # every algorithm is a no-op on one rank: nothing to explore

    def add(cfg: Config, checked: bool) -> None:
        if len(out) >= opts.candidates:
            return
        try:
            norm = normalised(cfg, world_size)
        except ValueError:
            return  # refused by check_params: never explored
        if norm in seen or not (checked or in_space(cfg, world_size, nbytes, hosts)):
            return
        seen.add(norm)
        out.append(norm)

    tried: list[Config] = [] if default is None else [default]
    tried += guesses(world_size, nbytes, hosts, ranks_per_host).values()
    for g in tried:
        add(g, False)
    tries = 0
    while len(out) < opts.candidates and tries < 20 * opts.candidates:
        tries += 1
        add(draw(rng, world_size, nbytes, hosts), True)
    return out
