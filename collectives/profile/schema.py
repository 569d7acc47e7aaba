"""The JSON Schema of profile version 1, generated from the algorithm registry.

Use ``profile_schema()`` for the schema as a mapping, ``schema_text()`` for the text of the
checked-in file ``profiles/schema/profile-v1.schema.json``; ``python -m autotune.schemas``
(``make schema``) rewrites it with the other files' schemas after changing an algorithm's
parameters (a unit test says when it is stale). The profile's own keys are the declared
records of ``collectives.profile.records``; each rule's ``params`` come from its algorithm's
``params_schema`` (``collectives.algorithms.base.Algorithm``), so a new algorithm appears
in the schema without an edit here. Test-only algorithms are left out.

The loader (``collectives.profile``) is the authority: it checks everything the schema
says and what a schema cannot express (see the schema's ``description``). Not imported by
``import collectives``: only tools and tests need it.
"""

from __future__ import annotations

import json
from typing import Any

from safefiles.records import schema_document
from safefiles.records import schema_text as _text

from ..algorithms import get_algorithm
from ..algorithms.registry import user_algorithm_names
from ..engines import engine_names
from ..natives import all_compositions, libraries
from ..registry import backend_names, transports_for, user_transport_names
from .constants import MAX_RULES, VERSION
from .records import ProfileRecord

#: The checked-in schema's file name under ``profiles/schema/``.
SCHEMA_FILE = f"profile-v{VERSION}.schema.json"

_DESCRIPTION = (
    "Tuned allreduce rules per message size (docs/design.md 'Profile format'). Generated "
    "from the profile's declared records and the algorithm registry by `python -m "
    "autotune.schemas` (make schema): do not edit by hand. "
    "collectives.profile.load_profile checks everything here and, in "
    "addition, what a schema cannot express: rules sorted and contiguous (rules[i].min_bytes "
    "= rules[i-1].max_bytes + 1), only the last rule open-ended (max_bytes null), max_bytes "
    ">= min_bytes, algorithm names registered in this installation, ring-order permutations "
    "of 0..world_size-1, hierarchical dims whose product is the world size, hosts x "
    "ranks_per_host = world_size, the native impl installed in this MPI library, and each "
    "algorithm's own parameter checks; and YAML's 1.0 is a float where an integer is meant "
    "(JSON Schema's integer admits it). A profile file is at most 1 MiB.")


def _params_schema(name: str) -> dict[str, Any]:
    """The algorithm's ``params_schema`` plus the ``transport`` key a rule's params may
    carry (older profiles name a rule's transport there)."""
    fragment = json.loads(json.dumps(get_algorithm(name).params_schema()))
    fragment.setdefault("type", "object")
    fragment.setdefault("properties", {})["transport"] = {"$ref": "#/$defs/transport"}
    return fragment


def profile_schema() -> dict[str, Any]:
    """The whole profile schema (JSON Schema draft 2020-12): the keys as
    ``collectives.profile.ProfileRecord`` declares them, the names the registries hold now
    (test-only algorithms and transports left out), each algorithm's params as its own
    ``params_schema`` says."""
    algorithms = user_algorithm_names("display_order")
    names = {"transport": {"$ref": "#/$defs/transport"}, "backend": {"enum": backend_names()},
             "algorithm": {"type": "string", "enum": algorithms},
             "composition": {"type": "string", "enum": list(all_compositions())},
             "engine": {"type": "string", "enum": sorted(engine_names())},
             "library": {"type": "string", "description": (
                 "the MPI library (its name as it reports it; ringtune has a module for "
                 + ", ".join(c.name for c in libraries()) + ")")}}
    doc = schema_document(ProfileRecord, file=SCHEMA_FILE,
                          title=f"ringtune profile, version {VERSION}",
                          description=_DESCRIPTION, names=names)
    props = doc["properties"]
    rules = props["rules"]
    rule = rules.pop("items")
    # One branch per algorithm: its params as its own params_schema says.
    rule["allOf"] = [
        {"if": {"properties": {"algorithm": {"const": name}}},
         "then": {"properties": {"params": {"$ref": f"#/$defs/{name}_params"}}}}
        for name in algorithms
    ]
    rules["prefixItems"] = [{"$ref": "#/$defs/rule", "properties": {"min_bytes": {"const": 0}}}]
    rules["items"] = {"$ref": "#/$defs/rule"}
    # A section's topology and rules are a profile's (checked as one, merged with the rest).
    section = props["shapes"]["items"]["properties"]
    section["topology"] = {"$ref": "#/properties/topology"}
    section["rules"] = {"$ref": "#/properties/rules"}
    defs: dict[str, Any] = {"transport": {"enum": user_transport_names()}, "rule": rule}
    for name in algorithms:
        defs[f"{name}_params"] = _params_schema(name)
    assert rules["maxItems"] == MAX_RULES
    # The transports each backend's buffers can use, wherever a transport is named.
    doc["allOf"] = [_backend_transports(b) for b in backend_names()]
    doc["$defs"] = defs
    return doc


def _backend_transports(backend: str) -> dict[str, Any]:
    """``backend: B`` → every transport named (top level, rules, a rule's params, the
    sections' rules) is one that moves B's buffers (``collectives.registry``)."""
    allowed = {"enum": [t for t in transports_for(backend) if t in user_transport_names()]}
    rule = {"properties": {"transport": allowed,
                           "params": {"properties": {"transport": allowed}}}}
    rules = {"items": rule}
    return {"if": {"properties": {"backend": {"const": backend}}, "required": ["backend"]},
            "then": {"properties": {"transport": allowed, "rules": rules,
                                    "shapes": {"items": {"properties": {"rules": rules}}}}}}


def schema_text() -> str:
    """The checked-in file's text: ``profile_schema()`` as indented JSON."""
    return _text(profile_schema())
