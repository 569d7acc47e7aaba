"""The JSON Schema of profile version 1, generated from the algorithm registry.

Use ``profile_schema()`` for the schema as a mapping, ``schema_text()`` for the text of the
checked-in file ``profiles/schema/profile-v1.schema.json``, and ``python -m
collectives.schema`` (``make schema``) to rewrite that file after changing an algorithm's
parameters; ``--check`` says whether it is current (a unit test does the same). The
profile's own keys are written here; each rule's ``params`` come from its algorithm's
``params_schema`` (``collectives.algorithms.base.Algorithm``), so a new algorithm appears
in the schema without an edit here. Test-only algorithms are left out.

The loader (``collectives.profile``) is the authority: it checks everything the schema
says and what a schema cannot express (see the schema's ``description``). Not imported by
``import collectives``: only tools and tests need it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .algorithms import get_algorithm
from .algorithms.native import COMPOSITIONS
from .algorithms.registry import user_algorithm_names
from .engines import engine_names
from .profile import (
    FORMAT,
    LIBRARY_KEYS,
    MAX_RULE_BYTES,
    MAX_RULES,
    MEASURED_KEYS,
    NATIVE_KEYS,
    PROFILE_DTYPES,
    PROFILE_OPS,
    REQUIRED_KEYS,
    RULE_REQUIRED_KEYS,
    VERSION,
)
from .registry import backend_names, transports_for, user_transport_names
from .shapes import MAX_SHAPES, MAX_WORLD_SIZE

#: Where the checked-in schema lives, from the repository root.
SCHEMA_FILE = os.path.join("profiles", "schema", "profile-v1.schema.json")

_DESCRIPTION = (
    "Tuned allreduce rules per message size (docs/design.md 'Profile format'). Generated "
    "from the algorithm registry by `python -m collectives.schema` (make schema): do not "
    "edit by hand. collectives.profile.load_profile checks everything here and, in "
    "addition, what a schema cannot express: rules sorted and contiguous (rules[i].min_bytes "
    "= rules[i-1].max_bytes + 1), only the last rule open-ended (max_bytes null), max_bytes "
    ">= min_bytes, algorithm names registered in this installation, ring-order permutations "
    "of 0..world_size-1, hierarchical dims whose product is the world size, hosts x "
    "ranks_per_host = world_size, the native impl installed in this MPI library, and each "
    "algorithm's own parameter checks; and YAML's 1.0 is a float where an integer is meant "
    "(JSON Schema's integer admits it). A profile file is at most 1 MiB.")

_NULLABLE_FIGURE: dict[str, Any] = {"type": ["number", "null"], "minimum": 0,
                                     "maximum": 1e18}
_BYTES: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_RULE_BYTES}


def _params_schema(name: str) -> dict[str, Any]:
    """The algorithm's ``params_schema`` plus the ``transport`` key a rule's params may
    carry (older profiles name a rule's transport there)."""
    fragment = json.loads(json.dumps(get_algorithm(name).params_schema()))
    fragment.setdefault("type", "object")
    fragment.setdefault("properties", {})["transport"] = {"$ref": "#/$defs/transport"}
    return fragment


def _rule(algorithms: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": list(RULE_REQUIRED_KEYS),
        "additionalProperties": False,
        "properties": {
            "min_bytes": dict(_BYTES),
            "max_bytes": {"type": ["integer", "null"], "minimum": 0,
                          "maximum": MAX_RULE_BYTES},
            "algorithm": {"type": "string", "enum": algorithms},
            "params": {"type": "object"},
            "transport": {"$ref": "#/$defs/transport"},
            "native": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": list(NATIVE_KEYS),
                    "additionalProperties": False,
                    "properties": {
                        "bytes": {"type": "integer", "minimum": 0},
                        "impl": {"type": "string", "minLength": 1},
                        "composition": {"type": "string", "enum": list(COMPOSITIONS)},
                        "busbw_gbps": {"type": "number", "minimum": 0},
                        "time_us": {"type": "number", "minimum": 0},
                    },
                },
            },
            "measured": {
                "type": "object",
                "additionalProperties": False,
                "properties": {k: dict(_NULLABLE_FIGURE) if k != "bytes" else
                               {"type": ["integer", "null"], "minimum": 0,
                                "maximum": MAX_RULE_BYTES} for k in MEASURED_KEYS},
            },
        },
        # One branch per algorithm: its params as its own params_schema says.
        "allOf": [
            {"if": {"properties": {"algorithm": {"const": name}}},
             "then": {"properties": {"params": {"$ref": f"#/$defs/{name}_params"}}}}
            for name in algorithms
        ],
    }


def profile_schema() -> dict[str, Any]:
    """The whole profile schema (JSON Schema draft 2020-12) for the algorithms registered
    now, test-only ones left out."""
    algorithms = user_algorithm_names("display_order")
    topology = {
        "type": "object",
        "required": ["world_size"],
        "additionalProperties": False,
        "properties": {
            "fingerprint": {"type": ["string", "null"], "pattern": "^sha256:[0-9a-f]{64}$",
                            "maxLength": 71},
            "world_size": {"type": "integer", "minimum": 1, "maximum": MAX_WORLD_SIZE},
            "hosts": {"type": "integer", "minimum": 1, "maximum": MAX_WORLD_SIZE},
            "ranks_per_host": {"type": "integer", "minimum": 1, "maximum": MAX_WORLD_SIZE},
            "summary": {"type": "string"},
        },
    }
    defs: dict[str, Any] = {"transport": {"enum": user_transport_names()},
                            "rule": _rule(algorithms)}
    for name in algorithms:
        defs[f"{name}_params"] = _params_schema(name)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://github.com/ringtune/ringtune/profiles/schema/profile-v1.schema.json",
        "title": f"ringtune profile, version {VERSION}",
        "description": _DESCRIPTION,
        "type": "object",
        "required": list(REQUIRED_KEYS),
        "additionalProperties": False,
        "properties": {
            "format": {"const": FORMAT},
            "version": {"const": VERSION, "type": "integer"},
            "created": {"type": "string"},
            "tool": {"type": "object", "required": ["name"], "additionalProperties": False,
                     "properties": {"name": {"type": "string"},
                                    "version": {"type": "string"}}},
            "topology": topology,
            "backend": {"enum": backend_names()},
            "transport": {"$ref": "#/$defs/transport"},
            "dtype": {"enum": list(PROFILE_DTYPES)},
            "op": {"enum": list(PROFILE_OPS)},
            "rules": {"type": "array", "minItems": 1, "maxItems": MAX_RULES,
                      "prefixItems": [{"$ref": "#/$defs/rule",
                                       "properties": {"min_bytes": {"const": 0}}}],
                      "items": {"$ref": "#/$defs/rule"}},
            "fusion": {
                "description": "allreduce_many's fused bucket size, searched by ringtune "
                               "tune --workload",
                "type": "object", "required": ["bucket_bytes"], "additionalProperties": False,
                "properties": {"bucket_bytes": {"type": "integer", "minimum": 1},
                               "measured": {"type": "object"}},
            },
            "tuning": {"type": "object"},
            "shapes": {"type": "array", "maxItems": MAX_SHAPES, "items": {
                "type": "object", "required": ["topology", "rules"],
                "additionalProperties": False,
                "properties": {"topology": {"$ref": "#/properties/topology"},
                               "rules": {"$ref": "#/properties/rules"},
                               "source": {"enum": ["tuned", "predicted"]},
                               "from_world_size": {"type": "integer", "minimum": 1,
                                                   "maximum": MAX_WORLD_SIZE}},
            }},
            "library": {"type": "object", "required": list(LIBRARY_KEYS),
                        "additionalProperties": False,
                        "properties": {"name": {"type": "string"},
                                       "version": {"type": "string"},
                                       "nccl": {"type": "string"}}},
            "engine": {"description": "the distributed engine the profile was tuned over "
                                      "(absent: mpi) and its backend and version",
                       "type": "object", "required": ["name"], "additionalProperties": False,
                       "properties": {"name": {"enum": sorted(engine_names())},
                                      "backend": {"type": "string"},
                                      "version": {"type": "string"}}},
            "extra": {"type": ["object", "null"]},
        },
        # The transports each backend's buffers can use, wherever a transport is named.
        "allOf": [_backend_transports(b) for b in backend_names()],
        "$defs": defs,
    }


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
    return json.dumps(profile_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m collectives.schema [--check] [PATH]``: write the schema to PATH (default
    the repository's ``profiles/schema/profile-v1.schema.json``), or with ``--check`` exit 1
    when PATH differs from what the registry generates."""
    parser = argparse.ArgumentParser(prog="python -m collectives.schema",
                                     description="Generate the profile JSON Schema.")
    parser.add_argument("path", nargs="?", default=SCHEMA_FILE,
                        help=f"the schema file (default {SCHEMA_FILE})")
    parser.add_argument("--check", action="store_true",
                        help="only check that the file is current")
    args = parser.parse_args(argv)
    text = schema_text()
    if args.check:
        try:
            with open(args.path, encoding="utf-8") as fh:
                current = fh.read() == text
        except OSError as exc:
            print(f"{args.path}: cannot read ({exc.strerror}); run make schema", file=sys.stderr)
            return 1
        if not current:
            print(f"{args.path}: out of date with the algorithm registry; run make schema",
                  file=sys.stderr)
            return 1
        return 0
    from .atomic import write_text_atomic

    write_text_atomic(args.path, text)
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
