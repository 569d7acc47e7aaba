"""Profiles: loading good files, rejecting every kind of bad one with file + key, rule
selection, atomic writing, and the ``show`` / ``validate`` verbs.

``GOOD`` and ``BAD`` are shared with ``test_profile_schema.py``, which checks that the JSON
Schema agrees with the loader on every one of them.
"""

from __future__ import annotations

import copy
import os
import random
from typing import Any

import pytest
import yaml

from collectives.errors import ProfileError
from collectives.profile import (
    Profile,
    builtin_profile,
    dump_profile,
    load_profile,
    profile_from_dict,
    write_profile,
)

FP = "sha256:" + "ab" * 32


def base() -> dict[str, Any]:
    return {
        "format": "ringtune-profile",
        "version": 1,
        "created": "2026-11-29T17:00:00Z",
        "tool": {"name": "ringtune", "version": "0.1.0"},
        "topology": {"fingerprint": FP, "world_size": 4, "hosts": 1, "ranks_per_host": 4,
                     "summary": "1 host x 4 ranks, cpu, shm"},
        "backend": "numpy",
        "transport": "mpi",
        "dtype": "float32",
        "op": "sum",
        "rules": [
            {"min_bytes": 0, "max_bytes": 65535, "algorithm": "native", "params": {},
             "measured": {"bytes": 32768, "busbw_gbps": 1.21, "time_us": 48.0,
                          "native_busbw_gbps": 1.21}},
            {"min_bytes": 65536, "max_bytes": None, "algorithm": "multiring",
             "params": {"rings": 2, "chunk_bytes": 1048576, "order": "topology"},
             "measured": {"bytes": 16777216, "busbw_gbps": 7.8, "time_us": 3226.0,
                          "native_busbw_gbps": 4.1}},
        ],
        "tuning": {"trials": 180, "seconds": 212.4, "sampler": "TPESampler", "seed": 0},
    }


def _with(change: Any) -> dict[str, Any]:
    d = base()
    change(d)
    return d


def _minimal(d: dict[str, Any]) -> None:
    for k in ("created", "tool", "dtype", "op", "tuning"):
        del d[k]
    d["topology"] = {"world_size": 4}
    d["rules"] = [{"min_bytes": 0, "max_bytes": None, "algorithm": "rhd"}]


def _three_rules(d: dict[str, Any]) -> None:
    d["rules"].insert(1, {"min_bytes": 65536, "max_bytes": 1048575, "algorithm": "rhd",
                          "params": {}, "transport": "mpi"})
    d["rules"][2]["min_bytes"] = 1048576


#: name -> profile mapping that loads.
GOOD: dict[str, dict[str, Any]] = {
    "design_example": base(),
    "minimal": _with(_minimal),
    "three_rules_rule_transport": _with(_three_rules),
    "explicit_orders": _with(lambda d: d["rules"][1]["params"].update(
        order=[[0, 1, 2, 3], [3, 2, 1, 0]])),
    "single_permutation_order": _with(lambda d: d["rules"][1]["params"].update(
        order=[0, 2, 1, 3])),
    "transport_in_params": _with(lambda d: d["rules"][1]["params"].update(transport="mpi")),
    "whole_segment_chunks": _with(lambda d: d["rules"][1]["params"].update(chunk_bytes=0)),
    "extra_section": _with(lambda d: d.update(extra={"note": "hand-tuned"})),
    "no_fingerprint": _with(lambda d: d["topology"].pop("fingerprint")),
    "cupy_staged": _with(lambda d: d.update(backend="cupy", transport="staged")),
    "fusion_bucket_bytes": _with(lambda d: d.update(fusion={"bucket_bytes": 1 << 22})),
}


def _gap(d: dict[str, Any]) -> None:
    d["rules"][1]["min_bytes"] = 70000


def _overlap(d: dict[str, Any]) -> None:
    d["rules"][1]["min_bytes"] = 60000


def _open_middle(d: dict[str, Any]) -> None:
    d["rules"][0]["max_bytes"] = None


#: name -> (profile mapping or raw YAML text, key path the error must name, whether the
#: JSON Schema can see the problem too; ``False`` = only the loader can, see the schema's
#: description for what a schema cannot express).
BAD: dict[str, tuple[Any, str, bool]] = {
    "wrong_format": (_with(lambda d: d.update(format="nccl-tuner")), "format:", True),
    "wrong_version": (_with(lambda d: d.update(version=2)), "version:", True),
    "version_as_string": (_with(lambda d: d.update(version="1")), "version:", True),
    "missing_rules": (_with(lambda d: d.pop("rules")), "rules:", True),
    "missing_topology": (_with(lambda d: d.pop("topology")), "topology:", True),
    "unknown_top_key": (_with(lambda d: d.update(colour="blue")), "colour:", True),
    "unknown_algorithm": (_with(lambda d: d["rules"][1].update(algorithm="bogus")),
                          "rules[1].algorithm:", True),
    "rings_out_of_range": (_with(lambda d: d["rules"][1]["params"].update(rings=17)),
                           "rules[1].params.rings:", True),
    "rings_not_integer": (_with(lambda d: d["rules"][1]["params"].update(rings="two")),
                          "rules[1].params.rings:", True),
    "chunk_not_power_of_two": (_with(lambda d: d["rules"][1]["params"].update(
        chunk_bytes=1000)), "rules[1].params.chunk_bytes:", True),
    "unknown_param": (_with(lambda d: d["rules"][1]["params"].update(speed=3)),
                      "rules[1].params:", True),
    "params_for_native": (_with(lambda d: d["rules"][0]["params"].update(rings=2)),
                          "rules[0].params:", True),
    "order_not_permutation": (_with(lambda d: d["rules"][1]["params"].update(
        order=[[0, 1, 2, 2], [0, 1, 2, 3]])), "rules[1].params.order", False),
    "order_for_other_world": (_with(lambda d: d["rules"][1]["params"].update(
        order=[0, 1])), "rules[1].params.order", False),
    "overlapping_rules": (_with(_overlap), "rules[1].min_bytes:", False),
    "gap_between_rules": (_with(_gap), "rules[1].min_bytes:", False),
    "first_rule_not_zero": (_with(lambda d: d["rules"][0].update(min_bytes=1)),
                            "rules[0].min_bytes:", True),
    "last_rule_bounded": (_with(lambda d: d["rules"][1].update(max_bytes=1 << 30)),
                          "rules[1].max_bytes:", False),
    "open_rule_not_last": (_with(_open_middle), "rules[0].max_bytes:", False),
    "max_below_min": (_with(lambda d: d["rules"][0].update(max_bytes=-1)),
                      "rules[0].max_bytes:", True),
    "empty_rules": (_with(lambda d: d.update(rules=[])), "rules:", True),
    "fusion_zero_bytes": (_with(lambda d: d.update(fusion={"bucket_bytes": 0})),
                          "fusion.bucket_bytes:", True),
    "fusion_bytes_as_text": (_with(lambda d: d.update(fusion={"bucket_bytes": "4M"})),
                             "fusion.bucket_bytes:", True),
    "fusion_unknown_key": (_with(lambda d: d.update(fusion={"bucket_bytes": 8, "size": 8})),
                           "fusion.size:", True),
    "fusion_missing_bytes": (_with(lambda d: d.update(fusion={})), "fusion.bucket_bytes:",
                             True),
    "rules_not_list": (_with(lambda d: d.update(rules={"min_bytes": 0})), "rules:", True),
    "bad_backend": (_with(lambda d: d.update(backend="torch")), "backend:", True),
    "bad_transport": (_with(lambda d: d.update(transport="tcp")), "transport:", True),
    "bad_rule_transport": (_with(lambda d: d["rules"][0].update(transport="ucx")),
                           "rules[0].transport:", True),
    "bad_dtype": (_with(lambda d: d.update(dtype="float8")), "dtype:", True),
    "bad_fingerprint": (_with(lambda d: d["topology"].update(fingerprint="abc")),
                        "topology.fingerprint:", True),
    "world_size_zero": (_with(lambda d: d["topology"].update(world_size=0)),
                        "topology.world_size:", True),
    "negative_measured": (_with(lambda d: d["rules"][0]["measured"].update(busbw_gbps=-1)),
                          "rules[0].measured.busbw_gbps:", True),
    "unknown_rule_key": (_with(lambda d: d["rules"][0].update(priority=1)),
                         "rules[0].priority:", True),
    "invalid_yaml": ("format: ringtune-profile\nrules: [\n  {min_bytes: 0,\n", "not valid YAML",
                     None),
    "truncated_file": (None, "rules[0].max_bytes:", False),  # text built below
    "empty_file": ("", "empty", None),
    "top_level_list": ("- 1\n- 2\n", "mapping", True),
}


def _truncated_text() -> str:
    """A real profile cut after its first rule: still YAML, but no longer covers all
    sizes (the last rule is not open-ended)."""
    text = dump_profile(base())
    cut = text.index("- min_bytes: 65536")
    return text[:cut]


def case_text(name: str) -> str:
    data = BAD[name][0]
    if name == "truncated_file":
        return _truncated_text()
    return data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)


def case_data(name: str) -> Any:
    return yaml.safe_load(case_text(name))


# -- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_profiles_load(tmp_path: Any, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(GOOD[name], sort_keys=False))
    prof = load_profile(str(path), world_size=4)
    assert prof.path == str(path)
    assert prof.rules[0].min_bytes == 0 and prof.rules[-1].max_bytes is None
    assert prof.world_size == 4
    assert not prof.builtin


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_profiles_name_file_and_key(tmp_path: Any, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(case_text(name))
    with pytest.raises(ProfileError) as info:
        load_profile(str(path), world_size=4)
    msg = str(info.value)
    assert msg.startswith(f"{path}: "), msg
    assert BAD[name][1] in msg, msg
    assert "\n" not in msg


def test_error_message_matches_design_example(tmp_path: Any) -> None:
    d = base()
    d["rules"][1]["params"]["rings"] = "two"
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert str(info.value) == (f"{path}: rules[1].params.rings: expected an integer 1..16, "
                               "got 'two'")


def test_profile_for_another_world_size(tmp_path: Any) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(base()))
    assert load_profile(str(path), world_size=4).world_size == 4
    with pytest.raises(ProfileError, match=r"topology\.world_size: profile was tuned for 4 "
                                           r"ranks, this world has 2"):
        load_profile(str(path), world_size=2)


def test_missing_file_and_directory(tmp_path: Any) -> None:
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile(str(tmp_path / "nope.yaml"))
    with pytest.raises(ProfileError, match="is a directory"):
        load_profile(str(tmp_path))


def test_binary_garbage(tmp_path: Any) -> None:
    path = tmp_path / "g.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProfileError, match=str(path)):
        load_profile(str(path))


def test_transport_in_params_moves_to_rule() -> None:
    prof = profile_from_dict(GOOD["transport_in_params"])
    assert prof.rules[1].transport == "mpi"
    assert "transport" not in prof.rules[1].params


# -- selection -------------------------------------------------------------------------------


def test_select_matches_linear_scan() -> None:
    prof = profile_from_dict(GOOD["three_rules_rule_transport"])
    rng = random.Random(1)
    sizes = [0, 1, 65535, 65536, 65537, 1048575, 1048576, 1 << 40]
    sizes += [rng.randrange(0, 1 << 26) for _ in range(300)]
    for nbytes in sizes:
        idx, rule = prof.select(nbytes)
        want = next(i for i, r in enumerate(prof.rules)
                    if r.min_bytes <= nbytes and (r.max_bytes is None or nbytes <= r.max_bytes))
        assert idx == want and rule is prof.rules[want], nbytes


def test_builtin_profile_covers_everything() -> None:
    prof = builtin_profile(4)
    assert prof.builtin
    assert prof.select(0)[1].algorithm == "native"
    assert prof.select(1 << 30)[1].algorithm == "multiring"
    # The built-in rules pass the same validation as a file.
    data = prof.to_dict()
    assert profile_from_dict(data).rules == prof.rules


def test_hash_differs_with_content() -> None:
    a = profile_from_dict(base())
    b = profile_from_dict(base())
    c = profile_from_dict(_with(lambda d: d["rules"][1]["params"].update(rings=3)))
    assert a.sha256 == b.sha256 != c.sha256


# -- writing ---------------------------------------------------------------------------------


def test_to_dict_keeps_the_rules_native_entries() -> None:
    """A rule's ``native`` entries (what ``ringtune export`` reads) survive a load and a
    write back, as written; a rule without them gets none."""
    entry = {"bytes": 65536, "impl": "ring", "composition": "auto", "busbw_gbps": 1.5,
             "time_us": 65.5}
    data = _with(lambda d: d["rules"][1].update(native=[entry]))
    prof = profile_from_dict(data)
    out = prof.to_dict()
    assert out["rules"][1]["native"] == [entry]
    assert "native" not in out["rules"][0]
    assert out["rules"] == data["rules"]
    assert profile_from_dict(yaml.safe_load(dump_profile(prof))).to_dict() == out


def test_write_round_trip(tmp_path: Any) -> None:
    path = str(tmp_path / "out.yaml")
    write_profile(base(), path)
    prof = load_profile(path)
    assert dict(prof.document) == base()
    # A Profile object writes back to the same content.
    path2 = str(tmp_path / "out2.yaml")
    write_profile(prof, path2)
    assert load_profile(path2).sha256 == prof.sha256
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_write_refuses_invalid_profile_and_keeps_old_file(tmp_path: Any) -> None:
    path = tmp_path / "p.yaml"
    write_profile(base(), str(path))
    before = path.read_bytes()
    bad = base()
    bad["rules"][1]["min_bytes"] = 70000
    with pytest.raises(ProfileError, match=r"rules\[1\]\.min_bytes"):
        write_profile(bad, str(path))
    assert path.read_bytes() == before


def test_interrupted_write_leaves_old_file(tmp_path: Any, monkeypatch: Any) -> None:
    path = tmp_path / "p.yaml"
    write_profile(base(), str(path))
    before = path.read_bytes()

    def boom(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    changed = _with(lambda d: d["rules"][1]["params"].update(rings=3))
    with pytest.raises(ProfileError, match="No space left"):
        write_profile(changed, str(path))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["p.yaml"]


def test_unwritable_output(tmp_path: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ProfileError, match="cannot write profile"):
        write_profile(base(), str(blocker / "p.yaml"))
    with pytest.raises(ProfileError, match="is a directory"):
        write_profile(base(), str(tmp_path))


# -- the CLI verbs ---------------------------------------------------------------------------


def _cli(args: list[str], capsys: Any) -> tuple[int, str, str]:
    from ringtune.cli import main

    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", sorted(BAD))
def test_validate_bad_exit_2_one_line(tmp_path: Any, capsys: Any, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(case_text(name))
    code, out, err = _cli(["validate", str(path)], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(path) in lines[0] and BAD[name][1] in lines[0], lines[0]


def test_validate_good_and_show(tmp_path: Any, capsys: Any) -> None:
    path = tmp_path / "p.yaml"
    write_profile(base(), str(path))
    code, out, err = _cli(["validate", str(path)], capsys)
    assert code == 0 and "valid" in out and not err
    code, out, err = _cli(["show", str(path)], capsys)
    assert code == 0, err
    assert "multiring" in out and "rings=2" in out
    # speed-up over native of the second rule: 7.8 / 4.1
    assert "1.90x" in out and "1.00x" in out


def test_show_bad_file_exit_2(tmp_path: Any, capsys: Any) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(case_text("unknown_algorithm"))
    code, out, err = _cli(["show", str(path)], capsys)
    assert code == 2 and "rules[1].algorithm" in err


def test_profile_type_is_frozen() -> None:
    prof = profile_from_dict(copy.deepcopy(base()))
    assert isinstance(prof, Profile)
    with pytest.raises(AttributeError):
        prof.backend = "cupy"  # type: ignore[misc]


def test_fusion_bucket_bytes() -> None:
    """The optional fusion key (allreduce_many's tuned bucket size); old profiles lack it."""
    assert profile_from_dict(GOOD["fusion_bucket_bytes"]).fusion_bucket_bytes == 1 << 22
    assert profile_from_dict(GOOD["design_example"]).fusion_bucket_bytes is None
    assert builtin_profile(2).fusion_bucket_bytes is None
    text = dump_profile(profile_from_dict(GOOD["fusion_bucket_bytes"]))
    assert yaml.safe_load(text)["fusion"] == {"bucket_bytes": 1 << 22}
