"""A rule's best native candidate keeps its MPICH composition: the tuner records it, the
profile loader checks it, and ``ringtune export`` writes what was measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.choose import best_native
from autotune.records import Choice
from collectives.errors import ProfileError
from collectives.plan import Config
from collectives.profile import load_profile
from ringtune.export import plan

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "tests/golden/export/profile.yaml"


def _choice(*natives: tuple[dict, float]) -> Choice:
    grid = Config("hierarchical", {"dims": [2, 2], "pipeline": 16})
    cands = [(Config("native", p), t) for p, t in natives] + [(grid, 100.0)]
    return Choice(1 << 20, grid, 100.0, natives[0][1], 2.0, 2.0 * 100.0 / natives[0][1],
                  cands)


def test_best_native_records_the_composition_it_was_measured_with() -> None:
    entry = best_native(_choice(({}, 200.0), ({"impl": "reduce_scatter_allgather",
                                               "composition": "beta"}, 150.0),
                                ({"composition": "delta"}, 180.0)))
    assert entry == [{"bytes": 1 << 20, "impl": "reduce_scatter_allgather",
                      "composition": "beta", "busbw_gbps": round(2.0 * 100 / 150, 4),
                      "time_us": 150.0}]
    # The library's own composition is not written (auto is what an absent key means).
    assert "composition" not in best_native(_choice(({}, 120.0), ({"composition": "beta"},
                                                                   150.0)))[0]


def _with_native_line(tmp_path: Path, line: str) -> Path:
    text = PROFILE.read_text()
    old = "  - {bytes: 1048576, impl: reduce_scatter_allgather, busbw_gbps: 2.5, time_us: 559.2}"
    assert old in text
    out = tmp_path / "p.yaml"
    out.write_text(text.replace(old, line))
    return out


def test_export_writes_the_native_entry_composition(tmp_path: Path) -> None:
    path = _with_native_line(tmp_path, "  - {bytes: 1048576, impl: reduce_scatter_allgather, "
                                       "composition: beta, busbw_gbps: 2.5, time_us: 559.2}")
    segs = plan(load_profile(path))
    by_impl = {(s.impl, s.min_bytes): s.composition for s in segs}
    # The multiring rule (16 KiB..4 MiB) is exported as its best native candidates: the
    # 1 MiB one with the composition it was measured with, the 64 KiB one with MPICH's own.
    assert by_impl[("reduce_scatter_allgather", 262144)] == "beta"
    assert by_impl[("ring", 16384)] == "auto"


def test_an_unknown_native_entry_composition_is_named(tmp_path: Path) -> None:
    path = _with_native_line(tmp_path, "  - {bytes: 1048576, impl: reduce_scatter_allgather, "
                                       "composition: omega, busbw_gbps: 2.5, time_us: 559.2}")
    with pytest.raises(ProfileError, match=r"rules\[1\]\.native\[1\]\.composition: expected "
                                           r"one of auto, alpha, beta"):
        load_profile(path)


def test_the_schema_allows_the_native_entry_composition(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import json

    import yaml

    schema = json.loads((ROOT / "profiles/schema/profile-v1.schema.json").read_text())
    good = _with_native_line(tmp_path, "  - {bytes: 1048576, impl: reduce_scatter_allgather, "
                                       "composition: beta, busbw_gbps: 2.5, time_us: 559.2}")
    jsonschema.validate(yaml.safe_load(good.read_text()), schema)
    bad = yaml.safe_load(good.read_text().replace("composition: beta", "composition: omega"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_a_native_algorithm_within_the_margin_of_the_default_is_not_recorded() -> None:
    # 2% faster than the library's default is within --margin (3%): the default is what
    # `ringtune export` must write, not an algorithm that won by noise.
    near = _choice(({}, 100.0), ({"impl": "recursive_multiplying"}, 98.0))
    assert best_native(near, margin=0.03)[0]["impl"] == "auto"
    assert best_native(near, margin=0.03)[0]["time_us"] == 100.0
    # A clear win (20%) is recorded, as is any win without a margin.
    clear = _choice(({}, 100.0), ({"impl": "recursive_multiplying"}, 80.0))
    assert best_native(clear, margin=0.03)[0]["impl"] == "recursive_multiplying"
    assert best_native(near)[0]["impl"] == "recursive_multiplying"


def test_open_mpi_export_keeps_its_measured_default_over_an_analogy(tmp_path: Path) -> None:
    """A profile tuned with Open MPI whose ``rhd``/``multiring`` rules measured Open MPI's
    own decision as its best algorithm exports that decision (0), never Rabenseifner or
    the segmented ring by analogy (untimed, and slower in a plain job); without a native
    measurement the analogy still applies, and says so."""
    from ringtune.export.ompi import parse, render

    head = ("format: ringtune-profile\nversion: 1\n"
            "library: {name: Open MPI, version: 5.0.10}\n"
            "topology: {world_size: 2, hosts: 1, ranks_per_host: 2}\n"
            "backend: numpy\ntransport: mpi\n")
    path = tmp_path / "ompi.yaml"
    path.write_text(head + "rules:\n"
                    "- {min_bytes: 0, max_bytes: 131071, algorithm: rhd, params: {},\n"
                    "   native: [{bytes: 65536, impl: auto, busbw_gbps: 1.0, time_us: 60.0}]}\n"
                    "- {min_bytes: 131072, max_bytes: 1048575, algorithm: multiring,\n"
                    "   params: {rings: 2, chunk_bytes: 65536},\n"
                    "   native: [{bytes: 262144, impl: ring, busbw_gbps: 2.0, time_us: 131.0}]}\n"
                    "- {min_bytes: 1048576, max_bytes: null, algorithm: rhd, params: {}}\n")
    profile = load_profile(str(path))
    text, notes = render([(profile, plan(profile))])
    rows = parse(text, "5.0.10")[2][2]
    assert rows == [(0, 0, 0, 0), (131072, 4, 0, 0), (1048576, 6, 0, 0)], text
    assert "the library's own decision" in notes[0]
    assert "rabenseifner (the same algorithm)" in notes[-1]
