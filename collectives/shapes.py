"""Profiles for several job shapes: one file, one section per (hosts, ranks per host, world
size), so that one cluster profile serves a job's world and its sub-communicators (a
data-parallel group) alike.

A profile's top level is its main shape (``topology`` + ``rules``, as in every profile);
the optional ``shapes`` list holds the others, each ``{topology, rules, source}`` with
``source`` either ``tuned`` (measured by ``ringtune tune --shapes``) or ``predicted`` (the
cost model's choice for a shape nobody tuned, started from the nearest tuned shape's
winners; ``from_world_size`` names that shape). Use ``pick(data, world_size, name,
validate)`` before validation: it returns the profile mapping of the section for that world
(the top level when it matches, or there are no sections) and the note ``explain`` prints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .errors import ProfileError

SECTION_KEYS = ("topology", "rules", "source", "from_world_size")
SOURCES = ("tuned", "predicted")
#: Most sections in one profile: one per job shape a cluster runs (``MAX_RULES`` bounds each).
MAX_SHAPES = 64
#: Largest world size of a profile (``collectives.profile`` takes it from here): 4 M ranks
#: is beyond any machine; a larger value is a typing error that would overflow later.
MAX_WORLD_SIZE = 1 << 22


def sections(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ``shapes`` entries of a profile mapping (empty for a single-shape profile)."""
    value = data.get("shapes") if isinstance(data, Mapping) else None
    return list(value) if isinstance(value, list) else []


def _world(section: Mapping[str, Any]) -> Any:
    topo = section.get("topology")
    return topo.get("world_size") if isinstance(topo, Mapping) else None


def merged(data: Mapping[str, Any], section: Mapping[str, Any]) -> dict[str, Any]:
    """The whole-profile mapping of one section: the top level's common keys (backend,
    dtype, library, …) with the section's topology and rules."""
    out = {k: v for k, v in data.items() if k != "shapes"}
    out["topology"] = section.get("topology")
    out["rules"] = section.get("rules")
    return out


#: Validates one whole-profile mapping (``collectives.profile.profile_from_dict``, passed in
#: by the profile module so that this module does not import it back).
Validate = Callable[[Mapping[str, Any], str], Any]


def check(data: Mapping[str, Any], name: str, validate: Validate) -> None:
    """Validate every section with ``validate`` (``ProfileError`` naming ``shapes[i]``): the
    top level is validated by the caller as usual."""
    value = data.get("shapes")
    if value is None:
        return
    if not isinstance(value, list):
        raise ProfileError(f"{name}: shapes: expected a list of sections, got "
                           f"{type(value).__name__}")
    if len(value) > MAX_SHAPES:
        raise ProfileError(f"{name}: shapes: {len(value)} sections; at most {MAX_SHAPES} (one "
                           "per job shape)")
    seen = {_world(data)}
    for i, sec in enumerate(value):
        where = f"{name}: shapes[{i}]"
        if not isinstance(sec, Mapping):
            raise ProfileError(f"{where}: expected a mapping with topology and rules")
        for key in sec:
            if key not in SECTION_KEYS:
                raise ProfileError(f"{where}.{key}: unknown key (allowed here: "
                                   f"{', '.join(SECTION_KEYS)})")
        if sec.get("source", "tuned") not in SOURCES:
            raise ProfileError(f"{where}.source: expected one of {', '.join(SOURCES)}, got "
                               f"{sec.get('source')!r}")
        if sec.get("source") == "predicted" and "from_world_size" not in sec:
            raise ProfileError(f"{where}.from_world_size: a predicted section names the "
                               "tuned world size it was predicted from (an integer)")
        if "from_world_size" in sec:
            src = sec["from_world_size"]
            if type(src) is not int or not 1 <= src <= MAX_WORLD_SIZE:
                raise ProfileError(f"{where}.from_world_size: expected the tuned world size "
                                   f"it was predicted from, an integer 1..{MAX_WORLD_SIZE}, "
                                   f"got {src!r}")
        try:
            validate(merged(data, sec), f"{where}")
        except ProfileError as exc:
            raise ProfileError(str(exc).replace(f"{where}: ", f"{where}.", 1)) from None
        if _world(sec) in seen:
            raise ProfileError(f"{where}.topology.world_size: {_world(sec)} has a section "
                               "already; one section per world size")
        seen.add(_world(sec))


def pick(data: Any, world_size: int | None, name: str,
         validate: Validate) -> tuple[Any, str]:
    """(the profile mapping for ``world_size``, note for ``explain``)."""
    if not isinstance(data, Mapping) or world_size is None or "shapes" not in data:
        return data, ""
    check(data, name, validate)
    if _world(data) == world_size:
        return {k: v for k, v in data.items() if k != "shapes"}, (
            f"the {world_size}-rank section (main shape)")
    for sec in sections(data):
        if _world(sec) == world_size:
            if sec.get("source") == "predicted":
                note = (f"the {world_size}-rank section predicted by the cost model from "
                        f"the tuned {sec.get('from_world_size')}-rank shape (not measured)")
            else:
                note = f"the tuned {world_size}-rank section"
            return merged(data, sec), note
    # No section: the top level's world-size check reports it (a shape larger than the
    # allocation that tuned the profile, usually), naming the sizes that do have one.
    return data, ""


def tuned_sizes(data: Mapping[str, Any]) -> list[int]:
    """World sizes with a section (main shape first)."""
    out = [_world(data)]
    out += [_world(s) for s in sections(data)]
    return [w for w in out if isinstance(w, int)]
