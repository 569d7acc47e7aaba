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

from ..errors import ProfileError
from .constants import MAX_SHAPES as MAX_SHAPES
from .constants import MAX_WORLD_SIZE as MAX_WORLD_SIZE
from .constants import SOURCES as SOURCES


def __getattr__(name: str) -> Any:
    if name == "SECTION_KEYS":  # derived from the declaration, which imports probes
        from .records import SECTION_KEYS

        return SECTION_KEYS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    from safefiles.records import RecordError, load

    from .records import Sections

    try:
        # The sections' own keys, as declared (``Section``), before any is validated.
        load(Sections, {"shapes": value})
    except RecordError as exc:
        raise ProfileError(f"{name}: {exc}") from None
    seen = {_world(data)}
    for i, sec in enumerate(value):
        where = f"{name}: shapes[{i}]"
        if sec.get("source") == "predicted" and "from_world_size" not in sec:
            raise ProfileError(f"{where}.from_world_size: a predicted section names the "
                               "tuned world size it was predicted from (an integer)")
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
