"""Profiles with sections for several job shapes: the runtime picks the section of its own
communicator (the world, or a sub-communicator), ``explain`` says which (tuned or predicted
by the cost model), a shape without a section is refused as before, and a profile tuned
with another library version warns."""

from __future__ import annotations

import os
import tempfile
import warnings
from typing import Any

import pytest
import yaml

from collectives import Communicator, ProfileError, TopologyMismatchError
from collectives.profile import write_profile

from .conftest import WORLD, agree

N = WORLD.Get_size()
RANK = WORLD.Get_rank()


def rules(algorithm: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [{"min_bytes": 0, "max_bytes": 1023, "algorithm": "native", "params": {}},
            {"min_bytes": 1024, "max_bytes": None, "algorithm": algorithm,
             "params": params or {}}]


def profile(main: int, sections: dict[int, str]) -> dict[str, Any]:
    """Main shape ``main`` ranks (rhd above 1 KiB); sections: size -> tuned | predicted
    (a tuned section runs multiring rings=size, a predicted one native: tell-tale rules)."""
    shapes = []
    for size, source in sorted(sections.items()):
        sec: dict[str, Any] = {"topology": {"world_size": size, "hosts": 1,
                                            "ranks_per_host": size},
                               "source": source}
        if source == "predicted":
            sec["rules"] = rules("native")
            sec["from_world_size"] = main
        else:
            sec["rules"] = rules("multiring", {"rings": size, "chunk_bytes": 0})
        shapes.append(sec)
    return {"format": "ringtune-profile", "version": 1,
            "topology": {"world_size": main, "hosts": 1, "ranks_per_host": main},
            "backend": "numpy", "transport": "mpi", "rules": rules("rhd"), "shapes": shapes}


def _write(data: dict[str, Any]) -> str:
    path = None
    if RANK == 0:
        fd, path = tempfile.mkstemp(suffix=".yaml", dir=os.environ.get("TMPDIR", "/tmp"))
        with os.fdopen(fd, "w") as fh:
            # Plain YAML, not write_profile: bad profiles are written too, and rank 0 must
            # not fail alone while the others wait in the broadcast.
            yaml.safe_dump(data, fh)
    return WORLD.bcast(path, root=0)


def _expect(size: int, sections: dict[int, str], main: int) -> tuple[str, str]:
    if size == main:
        return "rhd", f"the {size}-rank section (main shape)"
    if sections[size] == "predicted":
        return "native", f"predicted by the cost model from the tuned {main}-rank shape"
    return "multiring", f"the tuned {size}-rank section"


SECTIONS = {1: "tuned", 2: "tuned", 3: "predicted"}


def test_world_and_sub_communicators_pick_their_section() -> None:
    path = _write(profile(4, SECTIONS))
    bad = []
    try:
        comm = Communicator(WORLD, profile=path)
        algo, note = _expect(N, SECTIONS, 4)
        if comm.plan_for(1 << 20).algorithm != algo:
            bad.append(f"world of {N}: {comm.plan_for(1 << 20).algorithm}, want {algo}")
        if note not in comm.explain(1 << 20):
            bad.append(f"world of {N}: explain {comm.explain(1 << 20)!r} lacks {note!r}")
        comm.close()
        # A data-parallel-like group: ranks split in two halves.
        sub = WORLD.Split(RANK % 2, RANK)
        comm = Communicator(sub, profile=path)
        algo, note = _expect(sub.Get_size(), SECTIONS, 4)
        if comm.plan_for(1 << 20).algorithm != algo or note not in comm.explain(4096):
            bad.append(f"group of {sub.Get_size()}: {comm.explain(4096)}")
        comm.close()
        sub.Free()
    except Exception as exc:  # noqa: BLE001 - every rank must reach agree()
        bad.append(f"rank {RANK}: {type(exc).__name__}: {exc}")
    finally:
        # Every rank has read the file before rank 0 removes it: without this barrier a
        # slow rank 1 (a loaded machine) found it gone, left the test before agree() and
        # the job hung or aborted.
        WORLD.Barrier()
        if RANK == 0:
            os.unlink(path)
    agree(bad)


@pytest.mark.skipif(N == 4, reason="the main shape always has its rules")
def test_shape_without_section_falls_back_like_another_world_size() -> None:
    # As for a single-shape profile of another world size: warn and use the built-in
    # defaults (explain says why), or raise on every rank when strict.
    path = _write(profile(4, {s: "tuned" for s in (1, 2, 3) if s != N}))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            comm = Communicator(WORLD, profile=path)
        if RANK == 0:  # the warning is rank 0's
            assert any("tuned for 4 ranks" in str(w.message) for w in caught), caught
        text = comm.explain(1 << 20)
        assert "built-in defaults" in text and "set aside: tuned for 4 ranks" in text, text
        comm.close()
        with pytest.raises(TopologyMismatchError, match="tuned for 4 ranks"):
            Communicator(WORLD, profile=path, strict=True)
    finally:
        WORLD.Barrier()
        if RANK == 0:
            os.unlink(path)


def test_bad_section_names_its_key() -> None:
    data = profile(4, SECTIONS)
    data["shapes"][0]["rules"][1]["params"] = {"rings": "two"}
    path = _write(data)
    try:
        with pytest.raises(ProfileError, match=r"shapes\[0\]\.rules\[1\]\.params\.rings"):
            Communicator(WORLD, profile=path)
    finally:
        WORLD.Barrier()
        if RANK == 0:
            os.unlink(path)


def test_other_library_version_warns() -> None:
    from collectives.natives import library

    name, version = library()
    data = profile(N, {})
    del data["shapes"]
    data["library"] = {"name": name, "version": version + ".old"}
    path = _write(data)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            Communicator(WORLD, profile=path).close()
        msgs = [str(w.message) for w in seen if "tuned with" in str(w.message)]
        agree([] if msgs and version + ".old" in msgs[0] else [f"no warning: {seen}"])
        data["library"] = {"name": name, "version": version}
        if RANK == 0:
            write_profile(data, path)
        WORLD.Barrier()  # (a valid profile: write_profile cannot fail on rank 0 alone)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            Communicator(WORLD, profile=path).close()
        agree([str(w.message) for w in seen if "tuned with" in str(w.message)])
    finally:
        if RANK == 0:
            os.unlink(path)
