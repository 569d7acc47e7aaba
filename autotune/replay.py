"""Recorded A/B choices: a rerun of a finished tune writes the same profile, byte for byte.

The search is resumable (``autotune.bucket_search``), but the A/B re-measurement after it
(``autotune.choose.ab_choice``) times the candidates again; on a noisy machine a rerun with
nothing new to search would then choose differently and rewrite the profile with other
rules. So each bucket's choice is recorded in its study (user attribute ``ab_choice``)
together with what it was chosen from (``choice_inputs``: native, the candidates, the
margin, the confirmation's rounds). A later run reuses the record when those inputs are
unchanged and measures again only when the search gave the bucket, or a neighbour, a new
best.

Use ``load_choices`` and ``save_choice`` on rank 0 (they touch the storage), inside
``autotune.lockstep.on_root``; ``reuse`` on every rank.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

from collectives.plan import Config

from . import space
from .choose import CONFIRM_ROUNDS, ab_candidates
from .records import BucketSummary, Choice, TuneOptions

#: The study user attribute that holds the bucket's recorded choice.
CHOICE_ATTR = "ab_choice"


def choice_inputs(opts: TuneOptions, summaries: Sequence[BucketSummary], i: int,
                  world_size: int) -> dict[str, Any]:
    """Everything bucket ``i``'s choice depends on except the timings (JSON-plain)."""
    native, own, borrowed = ab_candidates(opts, summaries, i, world_size)
    return {"native": space.config_key(native),
            "own": [space.config_key(c) for c in own],
            "borrowed": [space.config_key(c) for c in borrowed],
            "margin": opts.margin,
            # Choices recorded before the confirmation of a winner against native (or
            # with another number of rounds) are measured again, not reused.
            "confirm_rounds": CONFIRM_ROUNDS}


def choice_to_record(choice: Choice, inputs: dict[str, Any]) -> dict[str, Any]:
    """The JSON-plain record of a choice: the ``Choice`` fields, each configuration as
    ``Config.record``."""
    data = {f.name: getattr(choice, f.name) for f in dataclasses.fields(choice)}
    data["config"] = choice.config.record()
    data["candidates"] = [[c.record(), t] for c, t in choice.candidates]
    return {"inputs": inputs, "choice": data}


def _config(record: Any) -> Config:
    return Config.from_record(record["algorithm"], record.get("params"),
                              record.get("transport"))


def choice_from_record(record: Any) -> Choice | None:
    """The ``Choice`` of a stored record; ``None`` for a record this version cannot read
    (then the bucket is simply measured again). Records written before ``Config`` (the
    algorithm and params as fields, the transport inside params) read too."""
    try:
        data = dict(record["choice"])
        if "config" in data:
            data["config"] = _config(data["config"])
            data["candidates"] = [(_config(c), float(t)) for c, t in data["candidates"]]
        else:
            data["config"] = Config.from_record(data.pop("algorithm"), data.pop("params"))
            data["candidates"] = [(Config.from_record(a, p), float(t))
                                  for a, p, t in data["candidates"]]
        return Choice(**data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def reuse(record: Any, inputs: dict[str, Any]) -> Choice | None:
    """The recorded choice when it was made from exactly ``inputs``, else ``None``."""
    if not isinstance(record, dict) or record.get("inputs") != inputs:
        return None
    return choice_from_record(record)


def load_choices(storage: Any, studies: Sequence[str]) -> list[Any]:
    """Rank 0: the recorded choice of each study (``None`` where there is none)."""
    out = []
    for name in studies:
        study_id = storage.get_study_id_from_name(name)
        out.append(storage.get_study_user_attrs(study_id).get(CHOICE_ATTR))
    return out


def save_choice(storage: Any, study: str, choice: Choice, inputs: dict[str, Any]) -> Choice:
    """Rank 0: stamp ``choice`` with the time and record it in ``study``; returns the
    stamped choice (broadcast, so every rank builds the same profile)."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    stamped = dataclasses.replace(choice, measured_at=now.isoformat().replace("+00:00", "Z"),
                                  seconds=round(choice.seconds, 3))
    storage.set_study_user_attr(storage.get_study_id_from_name(study), CHOICE_ATTR,
                                choice_to_record(stamped, inputs))
    return stamped
