"""The runtime follows profiles, at any world size: rule choice per size, ``explain`` and the
``RINGTUNE_LOG=info`` line, ``$RINGTUNE_PROFILE``, and every bad case raising the same
error on every rank (different profiles on different ranks, a broken file on one rank, a
topology mismatch under strict). A topology mismatch (another world size, another
fingerprint) without strict warns once, falls back to built-in defaults, and ``explain``
says why."""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from typing import Any

import numpy as np
import pytest

from collectives import AgreementError, Communicator, ProfileError, TopologyMismatchError
from collectives.profile import write_profile
from collectives.testing.results import check_input, mismatches

from .conftest import WORLD, agree

N = WORLD.Get_size()
RANK = WORLD.Get_rank()


def profile_dict(world_size: int = N, rings: int = 2,
                 fingerprint: str | None = None) -> dict[str, Any]:
    topo: dict[str, Any] = {"world_size": world_size}
    if fingerprint:
        topo["fingerprint"] = fingerprint
    return {
        "format": "ringtune-profile", "version": 1, "topology": topo,
        "backend": "numpy", "transport": "mpi",
        "rules": [
            {"min_bytes": 0, "max_bytes": 4095, "algorithm": "native", "params": {},
             "measured": {"bytes": 1024, "busbw_gbps": 0.5, "native_busbw_gbps": 0.5}},
            {"min_bytes": 4096, "max_bytes": 65535, "algorithm": "rhd", "params": {}},
            {"min_bytes": 65536, "max_bytes": None, "algorithm": "multiring",
             "params": {"rings": rings, "chunk_bytes": 4096, "order": "topology"},
             "measured": {"bytes": 1048576, "busbw_gbps": 3.0, "native_busbw_gbps": 2.0}},
        ],
    }


@pytest.fixture(scope="module")
def folder() -> Any:
    path = WORLD.bcast(tempfile.mkdtemp(prefix="ringtune-prof-") if RANK == 0 else None)
    yield path
    WORLD.Barrier()


def shared_profile(folder: str, name: str, data: dict[str, Any]) -> str:
    """Rank 0 writes, everyone reads the same file."""
    path = os.path.join(folder, name)
    if RANK == 0:
        write_profile(data, path)
    WORLD.Barrier()
    return path


def outcome(fn: Any) -> str:
    """The exception type and message ``fn`` raised (or "ok"), for comparing ranks."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test compares what was raised
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def test_profile_rules_pick_the_algorithm_and_results_are_right(folder: str) -> None:
    path = shared_profile(folder, "good.yaml", profile_dict())
    comm = Communicator(WORLD, profile=path)
    fails = []
    for nbytes, algo in ((1024, "native"), (8192, "rhd"), (1 << 18, "multiring")):
        plan = comm.plan_for(nbytes)
        if plan.algorithm != algo or plan.source != "profile":
            fails.append(f"{nbytes} B: got {plan.algorithm} from {plan.source}, want {algo}")
        count = nbytes // 4
        buf = check_input(count, "float32", "sum", RANK)
        comm.allreduce(buf)
        fails += mismatches(buf, count, "float32", "sum", N, f"{nbytes} B via {algo}")
    line = comm.explain(1 << 18)
    for piece in ("multiring", "rule 2", "[65536..∞]", path, "measured busbw 3.0 GB/s",
                  "native 2.0 GB/s (1.50x native)"):
        if piece not in line:
            fails.append(f"explain lacks {piece!r}: {line}")
    comm.close()
    agree(fails)


def test_ringtune_log_info_names_rule_and_busbw(folder: str, caplog: Any) -> None:
    path = shared_profile(folder, "log.yaml", profile_dict())
    comm = Communicator(WORLD, profile=path)
    caplog.set_level(logging.INFO, logger="ringtune")
    comm.allreduce(np.ones(1 << 16, dtype="float32"))
    comm.close()
    fails = []
    if RANK == 0:
        text = " ".join(r.getMessage() for r in caplog.records if r.name == "ringtune")
        for piece in ("262144 B", "multiring", "rule 2", "measured busbw 3.0 GB/s"):
            if piece not in text:
                fails.append(f"log lacks {piece!r}: {text!r}")
    agree(fails)


def test_env_var_profile(folder: str, monkeypatch: Any) -> None:
    path = shared_profile(folder, "env.yaml", profile_dict())
    monkeypatch.setenv("RINGTUNE_PROFILE", path)
    comm = Communicator(WORLD)
    got = (comm.plan_for(8192).algorithm, comm.profile.path)
    comm.close()
    agree([] if got == ("rhd", path) else [f"got {got}"])


def _fallback(path: str, **kw: Any) -> tuple[Communicator, list[str]]:
    """A communicator built on ``path``, and the RuntimeWarnings this rank saw."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comm = Communicator(WORLD, profile=path, **kw)
    return comm, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("other", [N + 1, max(N - 1, 1) if N > 1 else N + 2])
def test_profile_for_another_world_size_warns_and_falls_back(folder: str, other: int) -> None:
    """Another world size is a topology mismatch: warn once (rank 0), use built-in defaults
    and say so in ``explain``; not a ``ProfileError`` on every rank (that was the old
    behaviour, contradicting the design and the README)."""
    data = profile_dict(world_size=other)
    data["topology"]["hosts"] = 1
    if other < N:  # the rules must be valid for the profile's own world size
        data["rules"][2]["params"]["rings"] = 1
    path = shared_profile(folder, f"other{other}.yaml", data)
    comm, caught = _fallback(path)
    fails = []
    if not comm.profile.builtin or comm.plan_for(8192).source != "default":
        fails.append("a profile for another world size was used")
    hosts = len(set(comm.hosts))
    shape = (f"tuned for {other} rank{'s' * (other != 1)} on 1 host, this job has {N} "
             f"rank{'s' * (N != 1)} on {hosts} host{'s' * (hosts != 1)}")
    if len(caught) != (1 if RANK == 0 else 0):
        fails.append(f"expected one warning on rank 0 only, got {caught}")
    elif RANK == 0 and (path not in caught[0] or shape not in caught[0]
                        or "using built-in defaults" not in caught[0]):
        fails.append(f"warning: {caught[0]}")
    line = comm.explain(1 << 18)
    if f"built-in defaults (profile {path} set aside: {shape})" not in line:
        fails.append(f"explain: {line}")
    count = 1 << 16
    buf = check_input(count, "float32", "sum", RANK)
    comm.allreduce(buf)
    fails += mismatches(buf, count, "float32", "sum", N, "after falling back")
    comm.close()
    agree(fails)


def test_profile_for_another_world_size_raises_when_strict(folder: str,
                                                           monkeypatch: Any) -> None:
    path = shared_profile(folder, "strict-other.yaml", profile_dict(world_size=N + 1))
    fails = []
    for how in ("strict=True", "RINGTUNE_STRICT=1"):
        if how == "strict=True":
            result = outcome(lambda: Communicator(WORLD, profile=path, strict=True))
        else:
            monkeypatch.setenv("RINGTUNE_STRICT", "1")
            result = outcome(lambda: Communicator(WORLD, profile=path))
        everyone = WORLD.allgather(result)
        if len(set(everyone)) != 1:
            fails.append(f"{how}: ranks disagree: {everyone}")
        if not result.startswith(TopologyMismatchError.__name__) or path not in result \
                or f"tuned for {N + 1} ranks" not in result or "ringtune tune -np" not in result:
            fails.append(f"{how}: unexpected: {result}")
    agree(fails)


def test_missing_env_profile_is_an_error_not_a_fallback(folder: str, monkeypatch: Any) -> None:
    monkeypatch.setenv("RINGTUNE_PROFILE", os.path.join(folder, "nope.yaml"))
    result = outcome(lambda: Communicator(WORLD))
    agree([] if result.startswith("ProfileError") and "nope.yaml" in result
          else [f"unexpected: {result}"])


def test_different_profiles_on_different_ranks(folder: str) -> None:
    if N == 1:
        pytest.skip("one rank cannot load a different profile than itself")
    path = os.path.join(folder, f"rank{RANK}.yaml")
    write_profile(profile_dict(rings=1 + RANK % 2), path)
    WORLD.Barrier()
    result = outcome(lambda: Communicator(WORLD, profile=path))
    everyone = WORLD.allgather(result)
    fails = [] if result.startswith("AgreementError") and "different profiles" in result \
        else [f"unexpected: {result}"]
    if len(set(everyone)) != 1:
        fails.append(f"ranks raised different errors: {everyone}")
    agree(fails)
    assert issubclass(AgreementError, Exception)


def test_copies_laid_out_differently_hold_the_same_profile(folder: str) -> None:
    """Ranks agree on the file's bytes first; where the bytes differ (a copy written with
    another layout and a comment, here on odd ranks) they compare the content, and equal
    content is the same profile: every rank builds its communicator, with the same plan."""
    if N == 1:
        pytest.skip("one rank has one copy")
    import yaml

    path = os.path.join(folder, f"copy{RANK}.yaml")
    data = profile_dict()
    if RANK % 2 == 0:
        write_profile(data, path)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write("# the same profile, another layout\n")
            yaml.safe_dump(data, f, default_flow_style=False, sort_keys=True)
    WORLD.Barrier()
    from collectives.profile import load_profile

    digests = WORLD.allgather(load_profile(path).source_digest)
    fails = [] if len(set(digests)) == 2 else [f"the copies' bytes should differ: {digests}"]
    result = outcome(lambda: Communicator(WORLD, profile=path).plan_for(8192).algorithm)
    if result != "ok":
        fails.append(result)
    agree(fails)


def test_broken_profile_on_one_rank_fails_everywhere(folder: str) -> None:
    if N == 1:
        pytest.skip("needs a rank whose file differs")
    path = os.path.join(folder, f"broken{RANK}.yaml")
    if RANK == N - 1:
        with open(path, "w") as fh:
            fh.write("format: ringtune-profile\nversion: 1\nrules: [\n")
    else:
        write_profile(profile_dict(), path)
    WORLD.Barrier()
    result = outcome(lambda: Communicator(WORLD, profile=path))
    fails = [] if result.startswith("ProfileError") and "not valid YAML" in result \
        else [f"unexpected: {result}"]
    agree(fails)


def test_fingerprint_mismatch_warns_and_falls_back_or_raises(folder: str) -> None:
    probes = pytest.importorskip("probes")
    if not hasattr(probes, "world_fingerprint"):
        pytest.skip("probes.world_fingerprint is not available")
    path = shared_profile(folder, "elsewhere.yaml",
                          profile_dict(fingerprint="sha256:" + "0" * 64))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comm = Communicator(WORLD, profile=path)
    fails = []
    if not comm.profile.builtin:
        fails.append("profile of another topology was used instead of built-in defaults")
    mine = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    if len(mine) != (1 if RANK == 0 else 0):
        fails.append(f"expected one warning on rank 0 only, got {len(mine)}")
    line = comm.explain(1024)
    if f"built-in defaults (profile {path} set aside: tuned on topology sha256:0000" \
            not in line:
        fails.append(f"explain: {line}")
    comm.close()
    strict = outcome(lambda: Communicator(WORLD, profile=path, strict=True))
    if not strict.startswith(TopologyMismatchError.__name__):
        fails.append(f"strict: {strict}")
    # The same world size on another host layout: the reason names both layouts (one rank
    # has no other layout: a profile of 1 rank on 2 hosts does not validate).
    if N > 1:
        data = profile_dict(fingerprint="sha256:" + "0" * 64)
        data["topology"]["hosts"] = 2
        path = shared_profile(folder, "two-hosts.yaml", data)
        comm, _ = _fallback(path)
        line = comm.explain(1024)
        comm.close()
        if f"set aside: tuned for {N} ranks on 2 hosts, this job has" not in line:
            fails.append(f"explain: {line}")
    agree(fails)
    assert issubclass(ProfileError, ValueError)
