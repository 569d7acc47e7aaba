"""Every JSON Schema file under ``profiles/schema/``, generated from the declared records.

Run ``python -m autotune.schemas`` (``make schema``) after changing a record's declaration
or an algorithm's parameters: it rewrites the profile's schema (``collectives.profile.schema``:
records plus the registries), the topology's (``probes.topology``), and the cluster's and
workload's (``autotune.cluster``). ``--check`` only says which are stale (exit 1); a unit
test does the same. Here, not in ``collectives`` or ``probes``, because the cluster's
records live in ``autotune`` and imports point one way (``autotune -> collectives ->
probes``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from collectives.plumbing.atomic import write_text_atomic
from collectives.profile.schema import SCHEMA_FILE as PROFILE_SCHEMA_FILE
from collectives.profile.schema import profile_schema
from probes.topology import SCHEMA_FILE as TOPOLOGY_SCHEMA_FILE
from probes.topology import topology_schema
from safefiles.records import schema_text

from .cluster import CLUSTER_SCHEMA_FILE, WORKLOAD_SCHEMA_FILE, cluster_schema, workload_schema

#: The folder of the schema files, from the repository root.
SCHEMA_DIR = os.path.join("profiles", "schema")
#: file name -> the function that generates it.
SCHEMAS: dict[str, Callable[[], dict[str, Any]]] = {
    PROFILE_SCHEMA_FILE: profile_schema,
    TOPOLOGY_SCHEMA_FILE: topology_schema,
    CLUSTER_SCHEMA_FILE: cluster_schema,
    WORKLOAD_SCHEMA_FILE: workload_schema,
}


def stale(folder: str = SCHEMA_DIR) -> list[str]:
    """The schema files under ``folder`` that differ from what the declarations generate
    (or cannot be read), each as ``PATH: why``; empty when all are current."""
    out = []
    for name, generate in SCHEMAS.items():
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as fh:
                current = fh.read() == schema_text(generate())
        except OSError as exc:
            out.append(f"{path}: cannot read ({exc.strerror})")
            continue
        if not current:
            out.append(f"{path}: out of date with the declared records and registries")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m autotune.schemas [--check] [DIR]``: write every schema file into DIR
    (default ``profiles/schema``), or with ``--check`` exit 1 naming the stale ones."""
    parser = argparse.ArgumentParser(prog="python -m autotune.schemas",
                                     description="Generate the JSON Schema files.")
    parser.add_argument("folder", nargs="?", default=SCHEMA_DIR,
                        help=f"where the schema files are (default {SCHEMA_DIR})")
    parser.add_argument("--check", action="store_true",
                        help="only check that the files are current")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale(args.folder)
        for line in problems:
            print(f"{line}; run make schema", file=sys.stderr)
        return 1 if problems else 0
    for name, generate in SCHEMAS.items():
        path = os.path.join(args.folder, name)
        write_text_atomic(path, schema_text(generate()))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
