"""Every input file ringtune reads, mutated: each variant is refused with one line naming
the file, or accepted only if it then works — never a crash, never unbounded time or memory.

From a valid profile (the shipped example), topology (``ringtune probe --out`` of this
machine, and a recorded 8-GPU machine with measured links), cluster and workload file
(``profiles/clusters``), every key path (one per schema position: ``rules[0].x`` stands for
every rule) is replaced by each of a string, a negative, zero, NaN, infinity, null, a list,
a huge integer and a deep nesting, or removed; and each text is truncated at many points
and given alias bombs at every level. Each variant goes through the real loader in this
process (``load_profile``, ``probes.load_topology``, ``load_cluster``, ``load_workload``);
the plain data also goes through the validators alone (``profile_from_dict`` …). Accepted
means it works: a profile selects and checks every rule and writes back; a topology gives a
fingerprint, ring orders and its table; a cluster's model predicts finite times. A sample
goes through the command line (exit 2, one stderr line, no traceback):
``tests/cli/test_fuzz_inputs.py``.

By default a seeded fifth of the variants runs (``tests/fuzzing.py``: the same ones every
run); ``RINGTUNE_FUZZ=full`` runs every variant (``make fuzz``), ``RINGTUNE_FUZZ_SEED=N``
another sample.

Time (CPU) and memory (tracemalloc peak) per variant are held to 1 s and 200 MB: limits
that catch unbounded behaviour (an alias bomb expanded, a range expanded), not benchmarks.
``RINGTUNE_FUZZ_STATS=FILE`` writes the counts as JSON (BENCHMARKS.md "Reliability", with
``RINGTUNE_FUZZ=full``; ``selection`` says which).
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

import probes
import safefiles.safeload as psl
from autotune.cluster import cluster_from_dict, load_cluster, load_workload, workload_from_dict
from collectives.errors import ProfileError
from collectives.profile import dump_profile, load_profile, profile_from_dict
from probes.topology import Links, Topology, TopologyError
from safefiles.safeload import parse_text
from tests import fuzzing
from tests.fixtures import MACHINES, materialize

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "examples" / "cpu-2core-vm-2ranks.yaml"
CLUSTERS = [ROOT / "profiles" / "clusters" / n for n in ("dgx-h100-32.yaml",
                                                         "ddl-minsky-64.yaml")]
WORKLOAD = ROOT / "profiles" / "clusters" / "workloads" / "resnet50-p100.yaml"
MAX_SECONDS = 1.0
MAX_BYTES = 200 << 20


def nested(depth: int) -> Any:
    out: Any = 1
    for _ in range(depth):
        out = [out]
    return out


def bomb(levels: int, width: int = 9) -> Any:
    """``levels`` of ``width`` references to one list: YAML writes it with anchors and
    aliases (``yaml.safe_dump`` anchors shared objects), width**levels values expanded."""
    item: Any = ["lol"] * width
    for _ in range(levels - 1):
        item = [item] * width
    return item


VALUES: dict[str, Any] = {
    "string": "x", "negative": -1, "zero": 0, "nan": math.nan, "inf": math.inf,
    "null": None, "list": [1, 2], "huge": 10 ** 30, "deep": nested(100),
}


# -- the kinds of file ----------------------------------------------------------------------


def _check_profile(prof: Any) -> None:
    from autotune.report import profile_heading, rule_table
    from collectives.algorithms import get_algorithm

    for r in prof.rules:
        for n in (r.min_bytes, r.max_bytes if r.max_bytes is not None else r.min_bytes + 1):
            assert prof.select(n)[1] is r
        get_algorithm(r.algorithm).check_params(dict(r.params), prof.world_size)
    assert len(prof.sha256) == 64
    again = profile_from_dict(parse_text(dump_profile(prof), "<again>"), "<again>")
    assert again.rules == prof.rules
    rule_table(dict(prof.document))
    profile_heading(dict(prof.document), prof.path)


def _check_topology(topo: Topology) -> None:
    from ringtune.commands.probe import render

    fp = topo.fingerprint()
    assert fp.startswith("sha256:")
    topo.summary()
    if topo.world_size:
        for ring in topo.ring_orders(2):
            assert sorted(ring) == list(range(topo.world_size))
    assert Topology.from_dict(topo.to_dict(), "<again>").fingerprint() == fp
    render(topo)


def _check_cluster(c: Any) -> None:
    from autotune.model import Model

    model = Model(c)
    dims = [c.ranks_per_host, c.hosts] if c.hosts > 1 and c.ranks_per_host > 1 else [c.ranks]
    for algo, params in (("native", {}), ("multiring", {"rings": 2}), ("rhd", {}),
                         ("hierarchical", {"dims": dims})):
        t = model.time(algo, params, [1024, 1 << 20])
        assert all(math.isfinite(x) and x >= 0 for x in t), (algo, t)
    c.with_hosts(1)


def _check_workload(w: Any) -> None:
    for seconds in (0.0, 1e-3, 10.0):
        eff = w.efficiency(seconds)
        assert math.isfinite(w.step_seconds(seconds)) and 0 < eff <= 1


@dataclass
class Kind:
    name: str
    data: Any
    load: Callable[[str], Any]
    from_dict: Callable[[Any, str], Any]
    check: Callable[[Any], None]
    errors: tuple[type[BaseException], ...]
    suffix: str = ".yaml"
    text: str = ""
    #: Only key paths starting with one of these (what the other bases do not cover).
    only: tuple[str, ...] = ()
    max_depth: int = 99


@dataclass
class Tally:
    variants: int = 0
    refused: int = 0
    accepted: int = 0
    traced: int = 0
    max_seconds: float = 0.0
    max_bytes: int = 0
    failures: list[str] = field(default_factory=list)


def _topology_base() -> dict[str, Any]:
    """What ``ringtune probe --out`` writes for this machine (one process, no MPI)."""
    data = yaml.safe_load(probes.detect(None).to_yaml())
    assert isinstance(data, dict)
    return data


def _gpu_base(tmp: Path) -> dict[str, Any]:
    """A recorded 8-GPU host (NVLink pairs, NICs, PCI) with a measured link matrix."""
    from probes import layout
    from probes.topology import RankPlace

    root, nv = materialize("dgx-a100" if "dgx-a100" in MACHINES else sorted(MACHINES)[0], tmp)
    host = layout.read_host(root, responder=nv, name="fixture")
    n = 4
    bw = tuple(tuple(None if i == j else 10.0 + i + j for j in range(n)) for i in range(n))
    lat = tuple(tuple(None if i == j else 2.5 for j in range(n)) for i in range(n))
    topo = Topology(hosts=(host,), ranks=tuple(
        RankPlace(rank=i, host=0, local_rank=i, gpu=i if host.gpus else None)
        for i in range(n)), links=Links(bw, lat, 1 << 22, 8, 5))
    data = topo.to_dict()
    # A few of each (4 GPUs, their pairs, 2 NICs, 6 PCI devices) keep every key and the
    # suite short: mutation covers one path per schema position anyway.
    h = data["hosts"][0]
    h["gpus"] = h["gpus"][:n]
    h["gpu_pairs"] = [p for p in h["gpu_pairs"] if p["a"] < n and p["b"] < n]
    h["nics"], h["pci"] = h["nics"][:2], h["pci"][:6]
    return data


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> list[Kind]:
    tmp = tmp_path_factory.mktemp("bases")
    prof = yaml.safe_load(PROFILE.read_text())
    prof["extra"] = {"note": "hand-written", "nested": {"a": [1, 2.5], "b": None}}

    def topo_load(path: str) -> Topology:
        return probes.load_topology(path)

    gpu = _gpu_base(tmp)

    out = [
        Kind("profile", prof, lambda p: load_profile(p), lambda d, n: profile_from_dict(d, n),
             _check_profile, (ProfileError,)),
        Kind("topology", _topology_base(), topo_load, Topology.from_dict, _check_topology,
             (TopologyError,)),
        Kind("topology-gpu", gpu, topo_load, Topology.from_dict, _check_topology,
             (TopologyError,), only=("hosts.0.gpus", "hosts.0.gpu_pairs", "links")),
        Kind("topology-json", copy.deepcopy(gpu), topo_load, Topology.from_dict, _check_topology,
             (TopologyError,), suffix=".json", max_depth=2),
        Kind("workload", yaml.safe_load(WORKLOAD.read_text()), load_workload,
             workload_from_dict, _check_workload, (ValueError,)),
    ]
    for path in CLUSTERS:
        out.append(Kind(f"cluster {path.stem}", yaml.safe_load(path.read_text()), load_cluster,
                        cluster_from_dict, _check_cluster, (ValueError,)))
    for k in out:
        k.text = _dump(k, k.data)
        # The bases themselves are valid and work.
        k.check(k.load(_write(tmp, k, "base", k.text)))
    return out


# -- mutation -------------------------------------------------------------------------------


def key_paths(data: Any) -> Iterator[tuple[Any, ...]]:
    """One path per schema position (list indices beyond the first of a shape skipped)."""
    seen: set[tuple[Any, ...]] = set()
    todo: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while todo:
        path, node = todo.pop(0)
        if path:
            shape = tuple("*" if isinstance(p, int) else p for p in path)
            if shape in seen:
                continue
            seen.add(shape)
            yield path
        if isinstance(node, dict):
            todo.extend((path + (k,), v) for k, v in node.items())
        elif isinstance(node, list):
            todo.extend((path + (i,), v) for i, v in enumerate(node))


def replaced(data: Any, path: tuple[Any, ...], value: Any, remove: bool = False) -> Any:
    out = copy.deepcopy(data)
    node = out
    for p in path[:-1]:
        node = node[p]
    if remove:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def _dump(kind: Kind, data: Any) -> str:
    if kind.suffix == ".json":
        return json.dumps(data)
    return yaml.dump(data, Dumper=_DUMPER, sort_keys=False, default_flow_style=None)


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _write(tmp: Path, kind: Kind, label: str, text: str) -> str:
    safe = "".join(c if c.isalnum() else "_" for c in f"{kind.name}-{label}")[:80]
    path = tmp / f"{safe}{kind.suffix}"
    path.write_text(text)
    return str(path)


#: Memory is traced (tracemalloc slows Python several times over) for every variant whose
#: value could grow memory — alias bombs, deep nesting, huge numbers, lists, truncations —
#: and for every TRACE_EVERY-th of the rest; CPU time is bounded for all of them.
TRACE_ALWAYS = ("bomb", "deep", "huge", "list", "truncated")
TRACE_EVERY = 10


def _traced(tally: Tally, what: str) -> bool:
    return any(w in what for w in TRACE_ALWAYS) or tally.variants % TRACE_EVERY == 0


def _run(tally: Tally, what: str, source: str, load: Callable[[], Any],
         check: Callable[[Any], None], errors: tuple[type[BaseException], ...]) -> None:
    tally.variants += 1
    trace = _traced(tally, what)
    if trace:
        tally.traced += 1
        tracemalloc.start()
    t0 = time.process_time()
    try:
        try:
            obj = load()
        except errors as exc:
            msg = str(exc)
            tally.refused += 1
            if "\n" in msg or not msg.startswith(source):
                tally.failures.append(f"{what}: refusal is not one line naming {source}: "
                                      f"{msg[:200]!r}")
        else:
            check(obj)
            tally.accepted += 1
    except Exception as exc:  # noqa: BLE001 - every crash is collected and reported
        tally.failures.append(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")
    seconds = time.process_time() - t0
    peak = 0
    if trace:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    tally.max_seconds = max(tally.max_seconds, seconds)
    tally.max_bytes = max(tally.max_bytes, peak)
    if seconds > MAX_SECONDS or peak > MAX_BYTES:
        tally.failures.append(f"{what}: {seconds:.2f} s CPU, {peak >> 20} MiB")


def _variants(kind: Kind) -> Iterator[tuple[str, str | None, Any]]:
    """(label, text for the file path or None, data for the validator path or None)."""
    for path in key_paths(kind.data):
        where = ".".join(map(str, path))
        if len(path) > kind.max_depth or kind.only and not where.startswith(kind.only):
            continue
        for name, value in VALUES.items():
            data = replaced(kind.data, path, value)
            yield f"{where}={name}", _dump(kind, data), data
        yield f"{where} removed", _dump(kind, replaced(kind.data, path, None, remove=True)), \
            replaced(kind.data, path, None, remove=True)
        if kind.suffix != ".json":  # JSON has no aliases
            yield f"{where}=bomb9", _dump(kind, replaced(kind.data, path, bomb(9))), None
            yield f"{where}=bomb3", _dump(kind, replaced(kind.data, path, bomb(3))), None
    if kind.suffix != ".json":
        yield "document=bomb9", _dump(kind, bomb(9)), None
    text = kind.text
    cuts = sorted({int(len(text) * i / 60) for i in range(60)} |
                  {i for i, c in enumerate(text) if c == "\n"})
    for cut in cuts[:: max(1, len(cuts) // 80)]:
        yield f"truncated at {cut}", text[:cut], None


def test_every_mutation_is_refused_or_works(kinds: list[Kind],
                                            tmp_path: Path) -> None:
    tally = Tally()
    try:
        for kind in kinds:
            for label, text, data in fuzzing.sample(_variants(kind), kind.name):
                if text is not None:
                    path = _write(tmp_path, kind, "v", text)
                    _run(tally, f"{kind.name} file {label}", path,
                         lambda p=path, k=kind: k.load(p), kind.check, kind.errors)
                if data is not None and not label.endswith("=deep"):
                    _run(tally, f"{kind.name} data {label}", "<fuzz>",
                         lambda d=data, k=kind: k.from_dict(d, "<fuzz>"), kind.check,
                         kind.errors)
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    stats = {"variants": tally.variants, "refused": tally.refused, "accepted": tally.accepted,
             "memory_traced": tally.traced,
             "max_cpu_seconds": round(tally.max_seconds, 3),
             "max_traced_mib": round(tally.max_bytes / (1 << 20), 1),
             "failures": len(tally.failures), "selection": fuzzing.mode()}
    out = os.environ.get("RINGTUNE_FUZZ_STATS")
    if out:
        Path(out).write_text(json.dumps(stats, indent=1) + "\n")
    print(stats)
    assert not tally.failures, "\n".join([fuzzing.describe(), *tally.failures[:30]])
    assert tally.refused > 0 and tally.accepted > 0


# -- through the command line ---------------------------------------------------------------


def test_other_kinds_of_file_are_named() -> None:
    with pytest.raises(ProfileError, match="this is a cluster file"):
        load_profile(CLUSTERS[0])
    with pytest.raises(TopologyError, match="this is a profile file"):
        probes.load_topology(PROFILE)
    with pytest.raises(ValueError, match="this is a workload file"):
        load_cluster(WORKLOAD)


def test_large_file_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with open(path, "wb") as fh:
        fh.truncate(50 << 20)  # sparse: 50 MB without writing them
    t0 = time.process_time()
    with pytest.raises(ProfileError, match="more than a profile file may have"):
        load_profile(path)
    assert time.process_time() - t0 < MAX_SECONDS


# -- the reader agrees with PyYAML on what is YAML ------------------------------------------

#: A table as dump_profile writes it, then every way a hand edit can change it: the reader
#: must agree with PyYAML's safe loader on each (and on its CRLF twin).
_TABLE = """format: ringtune-profile
rules:
- min_bytes: 0
  max_bytes: 1023
  algorithm: native
  params: {}
  measured: {bytes: 512, busbw_gbps: 2.5, time_us: 1.5e-05, native_busbw_gbps: 2.5,
    speedup: 1.0}
- min_bytes: 1024
  max_bytes: null
  algorithm: hierarchical
  params:
    dims: [2]
    inner: [rhd]
    rings: 2
tuning: {trials: 3}
"""
_EDITS = [
    ("algorithm: native", "algorithm: 'native'"), ("algorithm: native", "algorithm: yes"),
    ("algorithm: native", "algorithm: ~"), ("algorithm: native", "algorithm: native # c"),
    ("algorithm: native", "algorithm:  native"), ("algorithm: native", "algorithm:native"),
    ("algorithm: native", "algorithm: !!str native"), ("algorithm: native", "algorithm: &a x"),
    ("params: {}", "params: *a"), ("max_bytes: 1023", "max_bytes: 0x3ff"),
    ("max_bytes: 1023", "max_bytes: 01777"), ("max_bytes: 1023", "max_bytes: 1_023"),
    ("max_bytes: 1023", "max_bytes: 1023.0"), ("max_bytes: 1023", "max_bytes: -5"),
    ("max_bytes: 1023", "max_bytes: 1e3"), ("max_bytes: 1023", "max_bytes: .inf"),
    ("max_bytes: 1023", "max_bytes: 99999999999999999999999"),
    ("max_bytes: 1023", "max_bytes: 2001-01-01"), ("max_bytes: 1023", "min_bytes: 1"),
    ("max_bytes: 1023", "null: 1"), ("max_bytes: 1023", "on: 1"),
    ("max_bytes: 1023", "max_bytes: 1023\n"), ("max_bytes: 1023", "max_bytes: 1023\n#x"),
    ("max_bytes: 1023", "max_bytes: 1023 "), ("max_bytes: 1023", "max_bytes:\t1023"),
    ("max_bytes: 1023", "max_bytes: 10\n    23"), ("dims: [2]", "dims: [2, [3]]"),
    ("dims: [2]", "dims: [2,3]"), ("dims: [2]", "dims: [ 2 ]"), ("dims: [2]", "dims: []"),
    ("dims: [2]", "dims:\n    - 2"), ("dims: [2]", "dims:\n      - 2"),
    ("rings: 2", "rings:"), ("rings: 2", "rings: 2\n    rings: 3"),
    ("    rings: 2", "   rings: 2"), ("    rings: 2", "      rings: 2"),
    ("speedup: 1.0}", "speedup: 1.0"), ("speedup: 1.0}", "speedup: 1.0}}"),
    ("    speedup", "  speedup"), ("    speedup", "speedup"),
    ("{bytes: 512", "{bytes: 512, bytes: 1"),
    ("- min_bytes: 1024", "-  min_bytes: 1024"), ("- min_bytes: 1024", "- {min_bytes: 1024}"),
    ("- min_bytes: 1024", "-\n  min_bytes: 1024"), ("tuning: {trials: 3}", "rules: []"),
    ("format: ringtune-profile", "created: 'a\nrules:\n- b'"),
    # issue 25: a top-level flow mapping left open, a block list at column 0 after it.
    ("format: ringtune-profile\nrules:", "{format: ringtune-profile,\nrules:"),
    ("tuning: {trials: 3}\n", "tuning: {trials: 3}\n}\n"),
    ("tuning: {trials: 3}\n", "tuning: {trials: 3}"), ("\n", "\r\n"),
    ("tuning: {trials: 3}", "---\nx: 1"), ("params: {}", "params: {a: &b 1}"),
]


class _NoDates(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """PyYAML's safe loader less timestamps: ringtune keeps an unquoted date as text (a
    documented choice, safefiles/safeload.py)."""

    yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if not tag.endswith(":timestamp")]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def _agrees_with_pyyaml(text: str) -> bool:
    """PyYAML refuses ``text`` → the reader refuses it; the reader accepts it → it reads what
    PyYAML reads (the reader refuses more: duplicate keys, tags, non-finite numbers).
    Returns whether the reader accepted it."""
    try:
        ref: Any = yaml.load(text, Loader=_NoDates)  # noqa: S506 - a safe loader
    except yaml.YAMLError:
        ref = None
        refused = True
    else:
        refused = False
    try:
        got: Any = parse_text(text, "t.yaml")
    except psl.InputError as exc:
        assert str(exc).startswith("t.yaml: ") and "\n" not in str(exc), exc
        return False
    assert not refused, f"PyYAML refuses, the reader accepts: {text!r}"
    assert got == ref and repr(got) == repr(ref), text  # repr: 1 vs 1.0 vs True
    return True


def test_the_reader_agrees_with_pyyaml_on_what_is_yaml(kinds: list[Kind]) -> None:
    texts = [_TABLE] + [_TABLE.replace(a, b, 1) for a, b in _EDITS]
    texts += [t.replace("\n", "\r\n") for t in texts]
    accepted = sum(_agrees_with_pyyaml(t) for t in texts)
    assert 0 < accepted < len(texts)  # some edits are YAML, others are not
    prof = next(k for k in kinds if k.name == "profile")
    assert sum(_agrees_with_pyyaml(text) for _, text, _ in _variants(prof)
               if text is not None) > 100


def test_open_flow_mapping_is_refused_with_any_line_ending(tmp_path: Path) -> None:
    text = ("{format: ringtune-profile, version: 1, topology: {world_size: 2}, backend: numpy,"
            " transport: mpi,\nrules:\n- {min_bytes: 0, max_bytes: null, algorithm: native}"
            "\n}\n")
    for ending in ("\n", "\r\n"):
        path = tmp_path / "open.yaml"
        path.write_bytes(text.replace("\n", ending).encode())
        with pytest.raises(ProfileError, match="not valid YAML"):
            load_profile(path)


def test_the_c_parser_is_used_where_libyaml_is_installed() -> None:
    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml here")
    from yaml._yaml import CParser

    parser = psl._parser("a: 1")
    try:
        assert isinstance(parser, CParser)
    finally:
        parser.dispose()
