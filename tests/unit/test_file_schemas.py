"""The topology, cluster and workload JSON Schemas are the loaders' declarations, written out.

``profiles/schema/`` holds one schema per kind of file, generated from the records the
loaders check (``python -m autotune.schemas``, ``make schema``). Here: the files are
current and valid schemas; every shipped cluster and workload file and every recorded
machine's probed topology (``tests/fixtures/*/topology.yaml``) passes both the schema and
its loader; and for every key of those files, replaced by each value of another kind or
removed, or joined by an unknown key, the schema and the loader agree, except for the
cross-field checks the schemas' descriptions list (``LOADER_ONLY``, each with its reason: a
new disagreement fails). The profile's schema has its own tests (``test_profile_schema``,
``test_schema_is_the_loader``).
"""

from __future__ import annotations

import copy
import glob
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

import probes
from autotune.cluster import (
    CLUSTER_SCHEMA_FILE,
    WORKLOAD_SCHEMA_FILE,
    cluster_from_dict,
    load_cluster,
    load_workload,
    workload_from_dict,
)
from autotune.schemas import SCHEMAS, stale
from probes.topology import SCHEMA_FILE as TOPOLOGY_SCHEMA_FILE
from probes.topology import Topology, TopologyError
from tests import fuzzing
from tests.fixtures import MACHINES, probed_topology

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "profiles" / "schema"
CLUSTERS = sorted(glob.glob(str(ROOT / "profiles" / "clusters" / "*.yaml")))
WORKLOADS = sorted(glob.glob(str(ROOT / "profiles" / "clusters" / "workloads" / "*.yaml")))
TOPOLOGIES = [ROOT / "tests" / "fixtures" / name / "topology.yaml" for name in MACHINES]


def _validator(name: str) -> Any:
    schema = json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _errors(validator: Any, data: Any) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(data)]


def test_the_schema_files_are_generated_from_the_declarations() -> None:
    """A declaration or registry changed without ``make schema`` fails here."""
    assert stale(str(SCHEMA_DIR)) == [], "profiles/schema is stale: run make schema"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_file_is_a_draft_2020_12_schema(name: str) -> None:
    schema = _validator(name).schema
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith("/profiles/schema/" + name)
    assert "make schema" in schema["description"]


# -- the checked-in files pass both ---------------------------------------------------------


@pytest.mark.parametrize("path", CLUSTERS, ids=lambda p: Path(p).name)
def test_shipped_cluster_files_pass_schema_and_loader(path: str) -> None:
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    assert not _errors(_validator(CLUSTER_SCHEMA_FILE), data)
    assert load_cluster(path).ranks == data["ranks"]


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: Path(p).name)
def test_shipped_workload_files_pass_schema_and_loader(path: str) -> None:
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    assert not _errors(_validator(WORKLOAD_SCHEMA_FILE), data)
    assert load_workload(path).gradient_bytes == data["gradient_bytes"]


def test_the_shipped_files_are_found() -> None:
    """The globs above see the files (an empty parametrization would pass silently)."""
    assert len(CLUSTERS) >= 5 and len(WORKLOADS) >= 1 and len(TOPOLOGIES) == 3


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.parent.name)
def test_probed_topologies_pass_schema_and_loader(path: Path, tmp_path: Path) -> None:
    """Each recorded machine's ``topology.yaml`` is valid both ways, and is still what the
    probes read on that machine (else: ``python tests/fixtures/make_fixtures.py``)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert not _errors(_validator(TOPOLOGY_SCHEMA_FILE), data)
    loaded = probes.load_topology(path)
    assert data["fingerprint"] == loaded.fingerprint()
    probed = probed_topology(path.parent.name, tmp_path)
    assert data == yaml.safe_load(probed.to_yaml()), \
        f"{path} is stale: run PYTHONPATH=. python tests/fixtures/make_fixtures.py"


# -- the schema and the loader agree on every variant ----------------------------------------

#: What each key is replaced by (JSON has no NaN or infinity: the loader refuses YAML's
#: .nan/.inf, a JSON Schema never meets them). ``one`` is valid alone and meets the checks
#: across fields.
VALUES: dict[str, Any] = {"string": "x", "negative": -1, "zero": 0, "one": 1, "null": None,
                          "list": [1, 2], "mapping": {"k": 1}, "huge": 10 ** 30,
                          "true": True, "float": 0.5}

#: (kind, variant pattern) -> why the loader refuses what the schema accepts: the checks a
#: schema cannot state, as the schemas' descriptions list them.
LOADER_ONLY: dict[tuple[str, str], str] = {
    ("topology", r"hosts\.0\.(numa|gpus)\.0\.cpus=string"): "CPU lists as text: numbers, ranges",
    ("topology", r"hosts\.0\.numa\.0\.distances=list"): "one distance per NUMA node",
    ("topology", r"hosts\.0\.numa\.0\.id=one"): "NUMA ids distinct",
    ("topology", r"hosts\.0\.gpus\.0\.index=one"): "GPU indexes distinct",
    ("topology", r"hosts\.0\.gpu_pairs\.0\.(a|b)=(zero|one)|hosts\.0\.gpus removed"):
        "gpu_pairs name two different listed GPUs",
    ("topology", r"ranks\.0\.(rank|host|local_rank)=one"):
        "ranks in order, host indexes that exist, local ranks distinct",
    ("topology", r"ranks removed|links\.(bandwidth_gbps|latency_us)( removed|\.0=list)"):
        "links matrices of one row and column per rank",
    ("cluster", r"(ranks|levels\.0\.size)=one"): "the product of levels[*].size is ranks",
    ("cluster", r"ranks_per_host=one"): "a host is whole innermost levels",
    ("workload", r"gradient_bytes=one|tensor_bytes(\.0=one|=list)"):
        "tensor_bytes sum to gradient_bytes",
}


def _topology_base(tmp: Path) -> dict[str, Any]:
    """The DGX A100's probed topology with a measured link matrix, trimmed to 4 ranks (4
    GPUs with one NVLink entry each, 2 of their pairs, 2 NICs, 3 PCI devices): every key,
    and a short suite (a JSON Schema validator takes about 20 µs a value)."""
    data = yaml.safe_load((ROOT / "tests" / "fixtures" / "dgx-a100" / "topology.yaml")
                          .read_text(encoding="utf-8"))
    n = 4
    h = data["hosts"][0]
    h["gpus"] = [{**g, "nvlinks": g["nvlinks"][:1]} for g in h["gpus"][:n]]
    h["gpu_pairs"] = [p for p in h["gpu_pairs"] if p["a"] < n and p["b"] < n][:2]
    h["nics"], h["pci"] = h["nics"][:2], h["pci"][:3]
    data["ranks"] = data["ranks"][:n]
    data["links"] = {
        "bandwidth_gbps": [[None if i == j else 10.0 + i + j for j in range(n)]
                           for i in range(n)],
        "latency_us": [[None if i == j else 2.5 for j in range(n)] for i in range(n)],
        "message_bytes": 1 << 22, "small_bytes": 8, "repetitions": 5,
        "concurrent_gbps": [[1.0] * n]}
    return data


def _key_paths(data: Any) -> Iterator[tuple[Any, ...]]:
    """One path per position (list entries beyond the first skipped)."""
    todo: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while todo:
        path, node = todo.pop(0)
        if path:
            yield path
        if isinstance(node, dict):
            todo.extend((path + (k,), v) for k, v in node.items())
        elif isinstance(node, list) and node:
            todo.append((path + (0,), node[0]))


def _edited(data: Any, path: tuple[Any, ...], edit: Callable[[Any, Any], None]) -> Any:
    """A copy of ``data`` with ``edit(parent, key)`` applied at ``path``."""
    out = copy.deepcopy(data)
    node = out
    for p in path[:-1]:
        node = node[p]
    edit(node, path[-1])
    return out


def _setter(value: Any) -> Callable[[Any, Any], None]:
    def put(node: Any, key: Any) -> None:
        node[key] = value
    return put


def _variants(data: Any) -> Iterator[tuple[str, Any]]:
    for path in _key_paths(data):
        where = ".".join(map(str, path))
        for name, value in VALUES.items():
            yield f"{where}={name}", _edited(data, path, _setter(value))
        if isinstance(path[-1], str):
            yield f"{where} removed", _edited(data, path, lambda n, k: n.__delitem__(k))
            yield f"{where}_unknown added", _edited(
                data, path, lambda n, k: n.__setitem__(k + "_unknown", 1))


def _kinds(tmp: Path) -> list[tuple[str, str, Any, Callable[[Any], Any]]]:
    """(kind, schema file, base data, loader of plain data raising ValueError)."""
    out: list[tuple[str, str, Any, Callable[[Any], Any]]] = [
        ("topology", TOPOLOGY_SCHEMA_FILE, _topology_base(tmp),
         lambda d: Topology.from_dict(d, "t.yaml")),
        ("workload", WORKLOAD_SCHEMA_FILE,
         yaml.safe_load(Path(WORKLOADS[0]).read_text(encoding="utf-8")),
         lambda d: workload_from_dict(d, "w.yaml"))]
    for path in CLUSTERS:
        if Path(path).stem in ("emulated-2x2", "dgx-h100-32"):  # with and without emulate:
            out.append(("cluster", CLUSTER_SCHEMA_FILE,
                        yaml.safe_load(Path(path).read_text(encoding="utf-8")),
                        lambda d: cluster_from_dict(d, "c.yaml")))
    return out


def test_schema_and_loader_agree_on_every_variant(tmp_path: Path) -> None:
    """A seeded sample of the variants by default (``tests/fuzzing.py``; a JSON Schema
    validator is slow), every one with ``RINGTUNE_FUZZ=full`` (``make fuzz``)."""
    wrong = []
    refused = {"schema": 0, "loader": 0, "both": 0}
    for kind, schema_file, base, load in _kinds(tmp_path):
        validator = _validator(schema_file)
        assert not _errors(validator, base)
        load(base)
        for label, data in fuzzing.sample(_variants(base), f"schema {kind}"):
            schema_ok = validator.is_valid(data)
            try:
                load(data)
                loader_ok = True
            except (ValueError, TopologyError):
                loader_ok = False
            refused["schema"] += not schema_ok
            refused["loader"] += not loader_ok
            refused["both"] += not schema_ok and not loader_ok
            if schema_ok == loader_ok or schema_ok and any(
                    k == kind and re.fullmatch(pattern, label)
                    for k, pattern in LOADER_ONLY):
                continue
            wrong.append(f"{kind} {label}: schema {'accepts' if schema_ok else 'refuses'}, "
                         f"loader {'accepts' if loader_ok else 'refuses'}")
    assert not wrong, "\n".join(wrong) + f"\n({fuzzing.describe()})"
    assert refused["both"] > 100, refused  # the variants reach the checks
