"""The JSON Schema is the loader: cases generated from the schema itself, both ways.

For every constrained position of the generated schema (top-level keys, the topology,
a rule, its measured record and native entries, each algorithm's params), values are made
from the position's own constraints — each enum member and a non-member, the bounds and one
past them, wrong types, a removed required key, an unknown key — and put into a valid
profile. The schema's verdict and the loader's must agree, except for the loader-only
checks the schema's description lists (cross-field rules a schema cannot state); those
disagreements are listed here one by one, so a new one fails.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from collectives.errors import ProfileError
from collectives.profile import profile_from_dict
from collectives.profile.schema import profile_schema

WORLD = 4
BASE: dict[str, Any] = {
    "format": "ringtune-profile", "version": 1, "created": "now",
    "tool": {"name": "ringtune", "version": "0"},
    "library": {"name": "MPICH", "version": "4"},
    "topology": {"world_size": WORLD}, "backend": "numpy", "transport": "mpi",
    "dtype": "float32", "op": "sum",
    "rules": [{"min_bytes": 0, "max_bytes": None, "algorithm": "native", "params": {},
               "measured": {"bytes": 1}, "native": [{"bytes": 1, "impl": "ring",
                                                     "busbw_gbps": 1.0, "time_us": 1.0}]}],
    "fusion": {"bucket_bytes": 1}, "tuning": {}, "extra": {},
}
#: Params that make each algorithm's rule valid at WORLD ranks (the base of its cases).
PARAMS: dict[str, dict[str, Any]] = {"hierarchical": {"dims": [2, 2]}}

#: (position, value) pairs where the loader refuses what the schema accepts: the checks
#: a schema cannot state (docs/design.md "Profile format"), each named by its reason.
LOADER_ONLY = {
    # JSON has one number type: JSON Schema's "integer" admits 1.0, and enums compare 1.0
    # equal to 1. YAML tells them apart, and the loader takes only integers there.
    r"[^=]*=-?\d+\.0": "an integer written as a float",
    # hosts / ranks_per_host at most world_size, and their product world_size.
    r"topology\.(hosts|ranks_per_host)=\d+": "hosts x ranks_per_host = world_size",
    r"rules\[0\]\.max_bytes=\d+": "the last rule is open-ended (max_bytes null)",
    r"rules\[0\]\.params\.impl='.*'": "impl names the installed MPI's algorithms",
    r"rules\[0\]\.params\.(order|dims|inner|pipeline)=.*": "each algorithm's own checks",
}


def _leaf_values(schema: dict[str, Any], defs: dict[str, Any]) -> Iterator[Any]:
    """Values made from one position's constraints: members and non-members, bounds and
    one past them, and values of other types; every integer also as a float (``1.0``
    equals ``1`` in Python, not in the schema)."""
    for v in _values(schema, defs):
        yield v
        if type(v) is int and abs(v) < 1 << 53:
            yield float(v)


def _values(schema: dict[str, Any], defs: dict[str, Any]) -> Iterator[Any]:
    if "$ref" in schema:
        yield from _values(defs[schema["$ref"].rsplit("/", 1)[1]], defs)
        return
    for branch in schema.get("anyOf", []):
        yield from _values(branch, defs)
    if "const" in schema:
        yield schema["const"]
        yield "zz-other"
    yield from schema.get("enum", [])
    if "enum" in schema:
        yield "zz-not-a-member"
        yield 3
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    for t in ("integer", "number"):
        if t in types:
            lo, hi = schema.get("minimum"), schema.get("maximum")
            for v in (lo, hi):
                if v is not None:
                    yield v
                    yield v - 1 if v is lo else v + 1
            yield 1.5
    if "string" in types:
        yield "x"
        yield "x\n"
    if "null" in types:
        yield None
    yield True
    yield [1]
    yield {"zz": 1}
    yield "zz-text" if "string" not in types else 7


def _positions() -> Iterator[tuple[str, list[Any], dict[str, Any], dict[str, Any]]]:
    """(label, path into the profile, the position's schema, the base profile)."""
    schema = profile_schema()
    defs = schema["$defs"]
    rule = defs["rule"]["properties"]
    for key, sub in schema["properties"].items():
        if key not in ("rules", "topology", "shapes"):
            yield key, [key], sub, BASE
    for key, sub in schema["properties"]["topology"]["properties"].items():
        yield f"topology.{key}", ["topology", key], sub, BASE
    for key, sub in rule.items():
        if key not in ("params", "measured", "native"):
            yield f"rules[0].{key}", ["rules", 0, key], sub, BASE
    for key, sub in rule["measured"]["properties"].items():
        yield f"rules[0].measured.{key}", ["rules", 0, "measured", key], sub, BASE
    for key, sub in rule["native"]["items"]["properties"].items():
        yield f"rules[0].native[0].{key}", ["rules", 0, "native", 0, key], sub, BASE
    for name in rule["algorithm"]["enum"]:
        base = copy.deepcopy(BASE)
        base["rules"][0].update(algorithm=name, params=dict(PARAMS.get(name, {})))
        for key, sub in defs[f"{name}_params"]["properties"].items():
            if key != "transport":
                yield f"rules[0].params.{key}", ["rules", 0, "params", key], sub, base


def _put(data: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    node: Any = out
    for k in path[:-1]:
        node = node[k]
    if value is _REMOVE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return out


_REMOVE = object()


def _loader_accepts(data: dict[str, Any]) -> bool:
    try:
        profile_from_dict(data, "p.yaml")
    except ProfileError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("p.yaml: "), exc
        return False
    return True


@pytest.fixture(scope="module")
def validator() -> Any:
    schema = profile_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_base_profiles_pass_both(validator: Any) -> None:
    bases = {id(b): b for *_, b in _positions()}
    for base in bases.values():
        assert validator.is_valid(base), [e.message for e in validator.iter_errors(base)]
        assert _loader_accepts(base)


def test_schema_and_loader_agree_on_generated_cases(validator: Any) -> None:
    disagree: list[str] = []
    used: set[str] = set()
    cases = 0
    for label, path, sub, base in _positions():
        values = list(_leaf_values(sub, profile_schema()["$defs"])) + [_REMOVE]
        seen: set[str] = set()
        for value in values:
            key = json.dumps(value, default=repr) + type(value).__name__
            if key in seen:
                continue
            seen.add(key)
            data = _put(base, path, value)
            cases += 1
            schema_ok = validator.is_valid(data)
            loader_ok = _loader_accepts(data)
            if schema_ok == loader_ok:
                continue
            shown = f"{label}={value!r}"
            reason = next((rx for rx in LOADER_ONLY if re.fullmatch(rx, shown)), None)
            if not loader_ok and reason is not None:
                used.add(reason)
                continue
            disagree.append(f"{shown}: schema {'accepts' if schema_ok else 'refuses'}, "
                            f"loader {'accepts' if loader_ok else 'refuses'}")
    assert cases > 300
    assert not disagree, "\n".join(disagree)
    assert used == set(LOADER_ONLY), f"no longer loader-only: {set(LOADER_ONLY) - used}"


def test_schema_keys_are_the_loaders_keys() -> None:
    """Every mapping's keys are declared once (collectives.profile, collectives.profile.shapes) and
    the schema lists exactly those."""
    from collectives import profile as cp
    from collectives.profile.shapes import SECTION_KEYS

    schema = profile_schema()
    rule = schema["$defs"]["rule"]
    pairs = [
        (schema, cp.REQUIRED_KEYS, cp.OPTIONAL_KEYS),
        (schema["properties"]["topology"], ("world_size",),
         tuple(k for k in cp.TOPOLOGY_KEYS if k != "world_size")),
        (rule, cp.RULE_REQUIRED_KEYS, cp.RULE_OPTIONAL_KEYS),
        (rule["properties"]["native"]["items"], cp.NATIVE_KEYS, cp.NATIVE_OPTIONAL_KEYS),
        (schema["properties"]["library"], cp.LIBRARY_KEYS, cp.LIBRARY_OPTIONAL_KEYS),
        (schema["properties"]["shapes"]["items"], ("topology", "rules"),
         tuple(k for k in SECTION_KEYS if k not in ("topology", "rules"))),
    ]
    for sub, required, optional in pairs:
        assert sorted(sub["required"]) == sorted(required)
        assert set(sub["properties"]) == set(required) | set(optional)
        assert sub["additionalProperties"] is False
    assert set(rule["properties"]["measured"]["properties"]) == set(cp.MEASURED_KEYS)
