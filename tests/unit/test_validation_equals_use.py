"""What a loader accepts runs; what cannot run is refused at once, in one line (issue 25).

Every registered algorithm x transport x backend is put in a profile (at the top level, on
a rule, in a rule's params) and the loader's verdict is held to what happens: accepted host
profiles run a real allreduce in this process (``MPI.COMM_SELF`` over the real ``mpi``
transport; three ranks over the in-process transport), refused ones name the key. GPU
combinations are checked for acceptance or refusal without a GPU. Then the bounds: chunk
sizes, special files, empty paths, size caps, and the cases of the issue's item 6.
Costs are held to CPU seconds and traced memory as the fuzz suite does (limits that catch
unbounded behaviour, not benchmarks).
"""

from __future__ import annotations

import copy
import os
import re
import socket
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import probes
from autotune.cluster import cluster_from_dict, load_cluster
from collectives.algorithms import get_algorithm
from collectives.algorithms.multiring import (
    CHUNK_BYTES_SCHEMA,
    MAX_BLOCK_CHUNKS,
    MAX_CHUNK_BYTES,
    check_chunk_bytes,
    chunk_choices,
    chunk_elements,
)
from collectives.algorithms.registry import user_algorithm_names
from collectives.errors import ProfileError
from collectives.profile import MAX_RULES, load_profile, profile_from_dict
from collectives.registry import backend_names, transport_refusal, user_transport_names
from collectives.testing import contract
from probes.topology import MAX_GPUS_PER_HOST, MAX_RANKS, Topology, TopologyError
from tests import inproc

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "profiles" / "clusters" / "dgx-h100-32.yaml"
#: CPU seconds and traced bytes any refusal may take (issue 25: < 1 s, < 100 MB).
#: CPU seconds a refusal may take here. The target is < 1 s (measured by
#: benchmarks/bench_refusals.py, worst 0.28 s); a test asserts no timing that load can
#: break (CPU time too grows when two cores are shared by many processes: caches, frequency),
#: so it checks the bound that separates bounded work from the unbounded kind this guards
#: against (11-56 s for the inputs of issue 25), with room for a loaded machine.
MAX_SECONDS = 5.0
MAX_BYTES = 100 << 20


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    inproc.register()
    monkeypatch.setenv("RINGTUNE_ON_ERROR", "raise")
    for var in ("RINGTUNE_PROFILE", "RINGTUNE_CHECK", probes.ENV_TOPOLOGY):
        monkeypatch.delenv(var, raising=False)


def profile(world: int = 1, backend: str = "numpy", transport: str = "mpi",
            algorithm: str = "native", params: dict[str, Any] | None = None,
            where: str = "top") -> dict[str, Any]:
    """A one-rule profile naming ``transport`` at the top level, on the rule, or in the
    rule's params (``where``)."""
    rule: dict[str, Any] = {"min_bytes": 0, "max_bytes": None, "algorithm": algorithm,
                            "params": dict(params or {})}
    data = {"format": "ringtune-profile", "version": 1, "topology": {"world_size": world},
            "backend": backend, "transport": transport, "rules": [rule]}
    if where != "top":
        data["transport"] = "mpi" if transport_refusal("mpi", backend) is None else transport
        if where == "rule":
            rule["transport"] = transport
        else:
            rule["params"]["transport"] = transport
    return data


def verdict(data: Any) -> str | None:
    """``None`` when the loader accepts ``data``, else its one-line message."""
    try:
        profile_from_dict(data, "p.yaml")
    except ProfileError as exc:
        msg = str(exc)
        assert msg.startswith("p.yaml: ") and "\n" not in msg, msg
        return msg
    return None


def params_for(algorithm: str, world: int) -> dict[str, Any]:
    """The contract suite's first configuration of ``algorithm`` at ``world`` ranks."""
    return next(dict(p) for name, p in contract.configs(world, light=True) if name == algorithm)


def combos() -> Iterator[tuple[str, str, str, str]]:
    for algorithm in user_algorithm_names():
        for transport in user_transport_names():
            for backend in backend_names():
                for where in ("top", "rule", "params"):
                    yield algorithm, transport, backend, where


def _run_self(data: dict[str, Any]) -> np.ndarray:
    """The profile's allreduce on ``MPI.COMM_SELF`` with the real transport it names."""
    from mpi4py import MPI

    from collectives import Communicator

    prof = profile_from_dict(data, "p.yaml")
    comm = Communicator(MPI.COMM_SELF, profile=prof, topology=inproc.topology(1))
    try:
        buf = np.arange(1000, dtype=np.float32)
        comm.allreduce(buf)
        return buf
    finally:
        comm.close()


def _run_inproc(data: dict[str, Any], world: int) -> list[np.ndarray]:
    """The profile's allreduce at ``world`` ranks in this process (``inproc`` transport)."""
    from collectives import Communicator

    def rank(c: Any) -> np.ndarray:
        comm = Communicator(c, profile=profile_from_dict(data, "p.yaml"),
                            topology=inproc.topology(world))
        try:
            buf = np.arange(5000, dtype=np.float64) + c.Get_rank()
            comm.allreduce(buf)
            return buf
        finally:
            comm.close()

    return inproc.run_ranks(world, rank)


def test_every_algorithm_transport_backend_validates_iff_it_runs() -> None:
    checked = refused = 0
    for algorithm, transport, backend, where in combos():
        data = profile(1, backend, transport, algorithm, params_for(algorithm, 1), where)
        why = verdict(data)
        can = transport_refusal(transport, backend) is None
        assert (why is None) == can, (algorithm, transport, backend, where, why)
        if why is not None:
            refused += 1
            assert "transport" in why and backend in why, why
            continue
        if backend == "numpy":
            # Runs: a real allreduce on one rank over the transport the profile names.
            assert np.array_equal(_run_self(data), np.arange(1000, dtype=np.float32))
            checked += 1
    assert checked >= len(user_algorithm_names()) and refused > 0


@pytest.mark.parametrize("algorithm", user_algorithm_names())
@pytest.mark.parametrize("world", [2, 3])
def test_accepted_profiles_run_at_several_ranks(algorithm: str, world: int) -> None:
    data = profile(world, "numpy", "inproc", algorithm, params_for(algorithm, world))
    assert verdict(data) is None
    want = world * np.arange(5000, dtype=np.float64) + world * (world - 1) / 2
    for got in _run_inproc(data, world):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("transport", ["staged", "nccl"])
@pytest.mark.parametrize("where", ["top", "rule", "params"])
def test_host_profiles_refuse_gpu_transports(transport: str, where: str) -> None:
    why = verdict(profile(2, "numpy", transport, where=where))
    key = {"top": "transport", "rule": "rules[0].transport",
           "params": "rules[0].params.transport"}[where]
    assert why is not None and f": {key}: " in why and "numpy buffers use mpi" in why, why
    assert verdict(profile(2, "cupy", transport, where=where)) is None


def test_the_issue_example_is_refused_by_validate(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from ringtune.cli import main

    path = tmp_path / "staged.yaml"
    path.write_text("format: ringtune-profile\nversion: 1\ntopology: {world_size: 2}\n"
                    "backend: numpy\ntransport: staged\nrules:\n"
                    "- {min_bytes: 0, max_bytes: null, algorithm: native}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "transport" in err[0] and "staged" in err[0], err


def test_impl_not_run_by_the_installed_library_is_refused() -> None:
    from collectives.natives.mpich import (
        _NOT_CANDIDATES,
        _table,
        native_algorithms,
        unavailable_reason,
    )

    if unavailable_reason():
        pytest.skip(f"no MPI_T here: {unavailable_reason()}")
    for name in _table():
        why = verdict(profile(2, params={"impl": name}))
        assert (why is None) == (name == "auto" or name in native_algorithms()), (name, why)
        if name not in _NOT_CANDIDATES:
            assert why is None
    why = verdict(profile(2, params={"impl": "ccl"}))
    assert why is not None and "rules[0].params.impl" in why


# -- bounded cost from valid values ---------------------------------------------------------


def test_chunk_bytes_range_is_one_in_the_loader_schema_and_search_space() -> None:
    assert check_chunk_bytes(MAX_CHUNK_BYTES) == MAX_CHUNK_BYTES
    for bad in (MAX_CHUNK_BYTES * 2, 1 << 62, 3, -1, True, 1.0):
        with pytest.raises(ValueError, match="chunk_bytes"):
            check_chunk_bytes(bad)
    assert CHUNK_BYTES_SCHEMA["enum"] == [0] + [1 << k for k in range(41)]
    for seg in (1, 1 << 10, 1 << 20, 1 << 30, 1 << 36):
        for c in chunk_choices(seg):
            assert c in CHUNK_BYTES_SCHEMA["enum"] and check_chunk_bytes(c) == c
            assert c == 0 or c * MAX_BLOCK_CHUNKS >= seg  # no choice below the floor
    why = verdict(profile(2, algorithm="multiring", params={"chunk_bytes": 1 << 62}))
    assert why is not None and "rules[0].params.chunk_bytes" in why


def test_chunks_per_block_are_capped() -> None:
    for block in (1, 7, 1000, 300_000, 1 << 28):
        for rings in (1, 2, 16):
            for cb in (1, 2, 8, 1 << 14):
                chunk = chunk_elements(cb, 4, block, rings)
                piece = -(-block // rings)
                assert chunk >= 1 and rings * -(-piece // chunk) <= MAX_BLOCK_CHUNKS + rings


@pytest.mark.parametrize("algorithm,params", [
    ("multiring", {"rings": 1, "chunk_bytes": 1}),
    ("multiring", {"rings": 16, "chunk_bytes": 2}),
    ("hierarchical", {"dims": [2], "chunk_bytes": 1}),
])
def test_tiny_chunks_on_a_large_message_stay_proportional(
        algorithm: str, params: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """300,000 float32 at chunk_bytes 1 made 10⁶ messages (11-56 s, 800 MB); now at most
    MAX_BLOCK_CHUNKS per block and step: counted, and the result exact."""
    from collectives import Communicator

    sent: list[int] = []
    real = inproc.InprocComm.Isend

    def count(self: Any, *a: Any, **k: Any) -> Any:
        sent.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(inproc.InprocComm, "Isend", count)

    def rank(c: Any) -> np.ndarray:
        comm = Communicator(c, topology=inproc.topology(2))
        try:
            buf = np.ones(300_000, dtype=np.float32)
            comm.allreduce(buf, algorithm=algorithm, transport="inproc", **params)
            return buf
        finally:
            comm.close()

    for got in inproc.run_ranks(2, rank):
        assert np.array_equal(got, np.full(300_000, 2, dtype=np.float32))
    # Two ranks, two steps, each rank sends at most MAX_BLOCK_CHUNKS (+ one per ring) per
    # step, plus the set-up's few messages.
    assert 0 < len(sent) <= 2 * 2 * (MAX_BLOCK_CHUNKS + 16) + 64, len(sent)


# -- special files and empty paths ----------------------------------------------------------


def _loaders() -> dict[str, Callable[[str], Any]]:
    return {"profile": load_profile, "topology": probes.load_topology,
            "cluster": load_cluster}


def _special_files(tmp_path: Path) -> Iterator[tuple[str, str]]:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    yield str(fifo), "FIFO"
    yield "/dev/zero", "character device"
    yield "/dev/null", "character device"
    sock_path = tmp_path / "s.yaml"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(sock_path))
        yield str(sock_path), "socket"
    finally:
        sock.close()


def test_special_files_are_refused_without_reading(tmp_path: Path) -> None:
    for path, kind in _special_files(tmp_path):
        for what, load in _loaders().items():
            with pytest.raises((ProfileError, TopologyError, ValueError)) as got:
                _bounded(lambda load=load, path=path: load(path))  # type: ignore[misc]
            assert f"{path}: is a {kind}" in str(got.value) and what in str(got.value)


@pytest.mark.parametrize("verb", ["validate", "show"])
def test_cli_refuses_a_fifo_at_once(tmp_path: Path, verb: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    from ringtune.cli import main

    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    assert main([verb, str(fifo)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FIFO" in err[0], err


def test_an_empty_topology_path_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TopologyError, match="--topology: the path is empty"):
        probes.detect(None, topology_file="")
    monkeypatch.setenv(probes.ENV_TOPOLOGY, "")
    with pytest.raises(TopologyError, match=f"{probes.ENV_TOPOLOGY}: set but empty"):
        probes.detect(None)
    for load in _loaders().values():
        with pytest.raises((ProfileError, TopologyError, ValueError), match="path is empty"):
            load("")


def test_probe_cli_refuses_an_empty_topology(capsys: pytest.CaptureFixture[str]) -> None:
    from ringtune.cli import main

    assert main(["probe", "--topology", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "path is empty" in err[0], err


# -- fast refusals, bounded sizes -----------------------------------------------------------


def _bounded(fn: Callable[[], Any], memory: bool = True) -> Any:
    """``fn()``, run twice: within MAX_SECONDS of CPU time, then (``memory``) within
    MAX_BYTES of traced memory (tracing slows Python several times: never both at once;
    ``memory=False`` where the traced run would cost the suite seconds)."""
    start = time.process_time()
    try:
        fn()
    except Exception:  # noqa: BLE001, S110 - the second run raises it for the caller
        pass
    spent = time.process_time() - start
    assert spent < MAX_SECONDS, f"{spent:.2f} s of CPU"
    if not memory:
        return fn()
    tracemalloc.start()
    try:
        return fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < MAX_BYTES, f"{peak} bytes at peak"


def test_huge_profiles_are_refused_fast(tmp_path: Path) -> None:
    rule = "- {min_bytes: %d, max_bytes: %d, algorithm: native}\n"
    head = "format: ringtune-profile\nversion: 1\ntopology: {world_size: 2}\n" \
           "backend: numpy\ntransport: mpi\nrules:\n"
    big = tmp_path / "big.yaml"
    big.write_text(head + "".join(rule % (i, i) for i in range(100_000)))
    with pytest.raises(ProfileError, match="more than a profile file may have"):
        _bounded(lambda: load_profile(big))
    # Under the byte cap, over the rule cap: refused before any rule is converted.
    many = tmp_path / "many.yaml"
    many.write_text(head + "".join(rule % (i, i) for i in range(MAX_RULES + 1)))
    with pytest.raises(ProfileError, match=f"rules: {MAX_RULES + 1} rules; at most"):
        _bounded(lambda: load_profile(many))
    # The cap itself loads.
    data = yaml.safe_load(many.read_text())
    data["rules"] = data["rules"][:MAX_RULES]
    data["rules"][-1]["max_bytes"] = None
    assert len(_bounded(lambda: profile_from_dict(data, "ok")).rules) == MAX_RULES


def _topology_data(ranks: int = 2, gpus: int = 0) -> dict[str, Any]:
    host = {"name": "h", "gpus": [{"index": i} for i in range(gpus)]}
    return {"format": "ringtune-topology", "version": 1, "hosts": [host],
            "ranks": [{"rank": r, "host": 0, "local_rank": r} for r in range(ranks)]}


def test_huge_topologies_are_refused_fast(tmp_path: Path) -> None:
    head = "format: ringtune-topology\nversion: 1\nhosts:\n- name: h\n"
    cases = {
        # Compact, one flow mapping a line (the issue's 50,000 ranks were 1.2 MB). Refused
        # at MAX_FILE_VALUES while parsing: 18 MB traced at peak (measured once; tracing it
        # here would cost the suite 10 s).
        "ranks": head + "ranks:\n" + "".join(f"- {{rank: {r}}}\n" for r in range(100_000)),
        "hosts[0].gpus": head + "  gpus:\n" + "".join(f"  - {{index: {i}}}\n"
                                                      for i in range(4096)),
    }
    for key, text in cases.items():
        path = tmp_path / "t.yaml"
        path.write_text(text)
        refusal = rf"{re.escape(key)}: \d+ \w+; at most|line \d+: more than \d+ values"
        with pytest.raises(TopologyError, match=refusal):
            _bounded(lambda path=path: probes.load_topology(path),  # type: ignore[misc]
                     memory=key != "ranks")
    # The caps themselves load, and probe's output is linear in the GPUs per host.
    from ringtune.commands.probe import render

    topo = _bounded(lambda: Topology.from_dict(_topology_data(MAX_RANKS), "ok"))
    assert topo.world_size == MAX_RANKS
    text = render(Topology.from_dict(_topology_data(1, MAX_GPUS_PER_HOST), "ok"))
    assert len(text) < 200 * MAX_GPUS_PER_HOST ** 2


def test_huge_clusters_are_refused_fast() -> None:
    data = yaml.safe_load(CLUSTER.read_text())
    data["ranks"] = 65536
    data["levels"][1]["size"] = 8192
    with pytest.raises(ValueError, match="ranks: 65536 ranks; the cost model takes at most"):
        _bounded(lambda: cluster_from_dict(data, "c.yaml"))


# -- the cases of the issue's item 6 --------------------------------------------------------

_GOOD = profile(4)
_GOOD["topology"].update(hosts=2, ranks_per_host=2)


def _edit(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(_GOOD)
    *head, last = path.split(".")
    node: Any = data
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[last] = value
    return data


@pytest.mark.parametrize("path,value,key", [
    ("topology.fingerprint", "sha256:" + "a" * 64 + "\n", "topology.fingerprint"),
    ("version", 1.0, "version"),
    ("rules.0.params", [], "rules[0].params"),
    ("rules.0.params", None, "rules[0].params"),
    ("topology.hosts", 3, "topology.ranks_per_host"),
    ("shapes", [{"topology": {"world_size": 2}, "source": "predicted", "from_world_size": 0,
                 "rules": [{"min_bytes": 0, "max_bytes": None, "algorithm": "native"}]}],
     "shapes[0].from_world_size"),
])
def test_profile_cases_of_the_issue_are_refused(path: str, value: Any, key: str) -> None:
    assert verdict(_GOOD) is None
    why = verdict(_edit(path, value))
    assert why is not None and f": {key}: " in why, why


def test_chunk_bytes_up_to_2_62_is_refused() -> None:
    why = verdict(profile(2, algorithm="multiring", params={"chunk_bytes": 1 << 61}))
    assert why is not None and "chunk_bytes" in why


def _topology_case(edit: Callable[[dict[str, Any]], None]) -> str:
    data = _topology_data(2, 2)
    data["hosts"][0]["numa"] = [{"id": 0, "cpus": "0-1", "distances": [10]}]
    Topology.from_dict(copy.deepcopy(data), "t.yaml")  # the unedited file loads
    edit(data)
    with pytest.raises(TopologyError) as got:
        Topology.from_dict(data, "t.yaml")
    msg = str(got.value)
    assert msg.startswith("t.yaml: ") and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("key,edit", [
    ("hosts[0].gpus[1].index", lambda d: d["hosts"][0]["gpus"][1].update(index=0)),
    ("hosts[0].gpus[0].numa_node", lambda d: d["hosts"][0]["gpus"][0].update(numa_node=99)),
    ("ranks[1].numa_node", lambda d: d["ranks"][1].update(numa_node=99)),
    ("ranks[1].local_rank", lambda d: d["ranks"][1].update(local_rank=5)),
    ("ranks[1].local_rank", lambda d: d["ranks"][1].update(local_rank=0)),
    ("hosts[0].numa[0].distances", lambda d: d["hosts"][0]["numa"][0].update(
        distances=[10, 20])),
    ("hosts[0].numa[0].cpus", lambda d: d["hosts"][0]["numa"][0].update(cpus="0,,1")),
    ("fingerprint", lambda d: d.update(fingerprint=12)),
    ("fingerprint", lambda d: d.update(fingerprint="sha256:" + "0" * 64 + "\n")),
    ("summary", lambda d: d.update(summary=["x"])),
    ("version", lambda d: d.update(version=1.0)),
])
def test_topology_cases_of_the_issue_are_refused(key: str,
                                                 edit: Callable[[dict[str, Any]], None]) -> None:
    assert f"t.yaml: {key}: " in _topology_case(edit)


@pytest.mark.parametrize("emulate,key", [
    ([1], "emulate"), ({"mtu": 10}, "emulate.mtu"), ({"burst_kb": 1e300}, "emulate.burst_kb"),
    ({"progress": "fast"}, "emulate.progress"), ({"nope": 1}, "emulate.nope"),
    ({"hostname_prefix": "h\n"}, "emulate.hostname_prefix"),
    ({"oversubscribe": "yes"}, "emulate.oversubscribe"),
])
def test_cluster_emulate_section_is_checked_by_the_loader(emulate: Any, key: str) -> None:
    data = yaml.safe_load(CLUSTER.read_text())
    assert cluster_from_dict(copy.deepcopy(data), "c.yaml").emulate["mtu"] == 1500
    data["emulate"] = emulate
    with pytest.raises(ValueError, match=rf"^c\.yaml: {key}: "):
        cluster_from_dict(data, "c.yaml")


def test_a_valid_profile_of_every_algorithm_plans_and_checks() -> None:
    """What the loader accepted is what the algorithm's checks accept (one path)."""
    for algorithm in user_algorithm_names():
        params = params_for(algorithm, 4)
        prof = profile_from_dict(profile(4, algorithm=algorithm, params=params), "p")
        get_algorithm(algorithm).check_params(dict(prof.rules[0].params), 4)
