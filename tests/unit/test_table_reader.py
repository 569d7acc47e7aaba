"""The fast paths of profile loading (issue 14: 10⁵ rules in < 2 s) against the general ones.

The table reader (``probes.safeload._fast_rules``) must give exactly what the event reader
gives, or leave the file to it; the validation's fast path (``collectives.profile._fast_rule``)
must build the same rules as the full checks and leave every refusal to them. Profiles are
generated in many shapes, written as ``ringtune tune`` writes them (``dump_profile``), and
edited by hand in ways that must make the fast paths step aside.
"""

from __future__ import annotations

import copy
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest

import probes.safeload as psl
from collectives import profile as cp
from collectives.errors import ProfileError
from collectives.profile import dump_profile, load_profile, profile_from_dict
from probes.safeload import parse_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "profiles" / "examples" / "cpu-2core-vm-2ranks.yaml"


def _number(rng: random.Random) -> float | int:
    """A measured figure in the forms PyYAML writes: small, large, exponents, integers."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randrange(0, 10 ** rng.randrange(1, 19))
    if kind == 1:
        return round(rng.uniform(0, 100), rng.randrange(0, 6))
    if kind == 2:
        return rng.uniform(0, 1) * 10.0 ** rng.randrange(-12, 18)  # 1.5e-05, 1.2e+17
    if kind == 3:
        return float(rng.randrange(0, 1000))  # 12.0
    if kind == 4:
        return 0
    return rng.choice([0.0, 1.0, 2.1882, 1916.82])


def _params(rng: random.Random, algo: str) -> dict[str, Any]:
    if algo == "multiring":
        out: dict[str, Any] = {"rings": rng.choice([1, 2, 4]),
                               "chunk_bytes": rng.choice([0, 4096, 16384]),
                               "order": rng.choice(["topology", "identity"])}
        return dict(rng.sample(sorted(out.items()), rng.randrange(len(out) + 1)))
    if algo == "hierarchical":
        return {"dims": [2], "rings": rng.choice([1, 2]), "inner": [rng.choice(["rhd"])]}
    return {}


def _profile(rng: random.Random, n: int) -> dict[str, Any]:
    """A valid profile of ``n`` rules over 2 ranks in one of many shapes."""
    data = psl.load_file(EXAMPLE, "profile")
    rules = []
    lo = 0
    for i in range(n):
        algo = rng.choice(["native", "multiring", "rhd", "hierarchical"])
        rule: dict[str, Any] = {"min_bytes": lo, "max_bytes": None}
        if i < n - 1:
            rule["max_bytes"] = lo + rng.choice([0, 1, 63, 1023, 10 ** rng.randrange(1, 15)])
            lo = rule["max_bytes"] + 1
        rule["algorithm"] = algo
        if rng.random() < 0.9:
            rule["params"] = _params(rng, algo)
        if rng.random() < 0.2:
            rule["transport"] = rng.choice(["mpi", "staged"])
        if rng.random() < 0.8:
            keys = rng.sample(cp.MEASURED_KEYS, rng.randrange(len(cp.MEASURED_KEYS) + 1))
            rule["measured"] = {k: (rng.randrange(1 << 40) if k == "bytes" else
                                    None if rng.random() < 0.05 else _number(rng))
                                for k in keys}
        if rng.random() < 0.05:
            rule["native"] = [{"bytes": 4096, "impl": "ring", "busbw_gbps": _number(rng),
                               "time_us": 1.5}]
        rules.append(rule)
    data["rules"] = rules
    return data


def _readings(text: str) -> tuple[Any, bool]:
    """Both readers' result on ``text`` (data, or the refusal's message), asserted equal,
    and whether the table reader read it itself."""
    results = []
    for fast in (True, False):
        try:
            results.append(parse_text(text, "t.yaml", fast=fast))
        except psl.InputError as exc:
            results.append(("refused", str(exc)))
    assert results[0] == results[1], text
    assert repr(results[0]) == repr(results[1]), text  # 1 vs 1.0 vs True; -0.0 vs 0.0
    return results[0], psl._fast_rules(text, "t.yaml", psl.MAX_NODES) is not None


#: Hand edits of one rule's text that a template cannot stand for, or that change how
#: YAML reads a number: each must read exactly as the event reader reads it.
_NUMBER_EDITS = [
    ("0123", True), ("-0123", True), ("00", True), ("1e5", False), ("1.5e5", False),
    (".5", False), ("1.", False), ("+1", False), ("1_000", False), ("0x1f", False),
    ("0o17", False), ("1:30", False), ("'12'", False), ('"12"', False), ("!!str 12", False),
    ("!!float 12", False), ("12 # 34", False), ("12 34", False), ("-0", False),
    ("-0.0", False), ("99999999999999999999", False), ("1.0e+400", False),
    ("123456789012345678901.5", False), ("1.5E+05", False), ("ring2", False),
    ("[1, 02]", True), ("{a: 1}", False), ("2001-01-01", False), ("&x 12", False),
]


@pytest.mark.parametrize("seed", range(12))
def test_generated_profiles_read_alike_and_load_alike(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    data = _profile(rng, rng.choice([1, 2, 5, 40, 300]))
    text = dump_profile(data)
    got, fast = _readings(text)
    if len(data["rules"]) <= 64:  # (more distinct entries than that: the reader may pass)
        assert fast, "a table as dump_profile writes it goes through the table reader"
    path = tmp_path / "p.yaml"
    path.write_text(text)
    prof = load_profile(path)
    ref = profile_from_dict(parse_text(text, str(path), fast=False), str(path), copy=False)
    assert prof == ref and repr(prof.rules) == repr(ref.rules)
    assert prof.sha256 == ref.sha256
    # Hand edits of one number of one rule: the same reading (or refusal) as the event
    # reader, whichever reader reads it.
    lines = text.splitlines(keepends=True)
    numbered = [i for i, line in enumerate(lines) if line.startswith("  max_bytes: ")
                and line.strip() != "max_bytes: null"]
    for edit, _ in _NUMBER_EDITS:
        if not numbered:
            break
        i = rng.choice(numbered)
        edited = "".join(lines[:i] + [f"  max_bytes: {edit}\n"] + lines[i + 1:])
        _readings(edited)


def test_number_forms_are_read_as_yaml_1_1_reads_them() -> None:
    base = "rules:\n- a: {}\n  b: [1, {}]\n"
    fast_read = 0
    for edit, leading_zero in _NUMBER_EDITS:
        _, fast = _readings(base.replace("{}", edit))
        fast_read += fast
        if leading_zero:
            assert not fast, f"{edit}: an integer with a leading zero is octal in YAML 1.1"
    assert 0 < fast_read < len(_NUMBER_EDITS)
    got, _ = _readings("rules:\n- a: 0123\n")
    assert got == {"rules": [{"a": 83}]}  # octal, as yaml.safe_load reads it
    got, fast = _readings("rules:\n- a: [12, -3, 1.5e-05, 1.0]\n  b: 1e5\n")
    assert fast and got["rules"][0] == {"a": [12, -3, 1.5e-05, 1.0], "b": "1e5"}


def test_a_table_the_template_cannot_stand_for_still_reads_alike() -> None:
    # Digits inside text, in keys, in comments, after tags: those entries are read from
    # their own text; aliases, "$", non-ASCII and second items make the reader give up.
    table = ("rules:\n- name: ring2\n  n: 5\n- name: ring3 # 4\n  n: 6\n- 'k1': 7\n"
             "- n: !!str 12\n- n: 12 # 13\n")
    got, fast = _readings(table)
    assert fast and got["rules"][0] == {"name": "ring2", "n": 5}
    for text in ("rules:\n- a: &x 1\n- b: *x\n", "rules:\n- a: $1\n", "rules:\n- a: é1\n",
                 "rules:\n- a: 1\n-\n  b: 2\n", "rules:\n- a: 1\n- a: 2\n  a: 3\n",
                 "rules:\n- 12: a\n", "rules:\n- a: 1\r\n- b: 2\n"):
        _, fast = _readings(text)
        assert not fast, text


def test_the_benchmark_table_goes_through_templates(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A table of ``bench_load``'s shape (as ``ringtune tune`` writes it) is read from a
    handful of templates, not entry by entry: the regression that would bring back
    seconds per 10⁵ rules."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_load
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    path = tmp_path / "big.yaml"
    bench_load.write_big(str(path), 3000)
    text = path.read_text()
    reads: list[str] = []
    real = psl._read_entry

    def counted(entry: str, builder: Any) -> Any:
        reads.append(entry)
        return real(entry, builder)

    monkeypatch.setattr(psl, "_read_entry", counted)
    data = psl._fast_rules(text, str(path), psl.MAX_NODES)
    assert data is not None and len(data["rules"]) == 3000
    assert len(reads) <= 40, f"{len(reads)} entries read one by one"
    monkeypatch.undo()
    assert data == parse_text(text, str(path), fast=False)
    # And its rules take the validation's fast path: the full checks see only the few
    # rules whose params are new.
    full: list[int] = []
    real_fast = cp._fast_rule

    def fast_or_not(item: Any, *args: Any) -> Any:
        rule = real_fast(item, *args)
        if rule is None:
            full.append(item["min_bytes"])
        return rule

    monkeypatch.setattr(cp, "_fast_rule", fast_or_not)
    load_profile(path)
    assert len(full) <= 3


def _load_both(data: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """``profile_from_dict`` with and without the validation's fast path: the profile, or
    the refusal's message."""
    out = []
    for fast in (True, False):
        with monkeypatch.context() as m:
            if not fast:
                m.setattr(cp, "_fast_rule", lambda *a: None)
            try:
                out.append(profile_from_dict(copy.deepcopy(data), "p.yaml"))
            except ProfileError as exc:
                out.append(("refused", str(exc)))
    return out[0], out[1]


#: Values a rule's fields can take that the fast path must leave to the full checks.
_ODD = [True, False, None, -1, 1.5, 2.0, math.nan, math.inf, -0.0, "1", 1 << 63, 10 ** 30,
        [], {}, [1], {"a": 1}]


@pytest.mark.parametrize("seed", range(4))
def test_validation_fast_path_builds_the_same_rules(seed: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(100 + seed)
    data = _profile(rng, 30)
    fast, full = _load_both(data, monkeypatch)
    assert isinstance(fast, cp.Profile) and fast == full
    assert all(type(r) is cp.Rule and r.__dict__ == f.__dict__
               for r, f in zip(fast.rules, full.rules))
    # Every field of some rule replaced by each odd value, keys added and removed: the
    # same profile or the same message (naming the same rule and key).
    for _ in range(60):
        bad = copy.deepcopy(data)
        rule = rng.choice(bad["rules"])
        where = rng.choice(["min_bytes", "max_bytes", "algorithm", "params", "transport",
                            "measured", "native", "params.rings", "params.transport",
                            "measured.bytes", "measured.speedup", "extra_key"])
        value = rng.choice(_ODD)
        if "." in where:
            outer, inner = where.split(".")
            if not isinstance(rule.get(outer), dict):
                rule[outer] = {}
            rule[outer][inner] = value
        elif where == "extra_key":
            rule["surprise"] = 1
        else:
            rule[where] = value
        a, b = _load_both(bad, monkeypatch)
        assert a == b, (where, value)
    # Params given once in full and then again with other types of equal value.
    first = {"min_bytes": 0, "max_bytes": 9, "algorithm": "multiring",
             "params": {"rings": 2, "chunk_bytes": 0}}
    for rings in (2.0, True, "2"):
        second = {"min_bytes": 10, "max_bytes": None, "algorithm": "multiring",
                  "params": {"rings": rings, "chunk_bytes": 0}}
        a, b = _load_both(dict(data, rules=[first, second]), monkeypatch)
        assert a == b, rings


def test_profile_hash_is_a_content_hash(tmp_path: Path) -> None:
    data = _profile(random.Random(7), 20)
    a = tmp_path / "a.yaml"
    a.write_text(dump_profile(data))
    # The same content with the keys of every rule in the other order and a comment (the
    # general reader reads that one): the same hash.
    b = tmp_path / "b.yaml"
    swapped = copy.deepcopy(data)
    swapped["rules"] = [dict(reversed(list(r.items()))) for r in swapped["rules"]]
    b.write_text("# a comment\n" + dump_profile(swapped))
    assert load_profile(a).sha256 == load_profile(b).sha256
    # A value, or only its type, changed: another hash.
    hashes = set()
    for measured in ({"speedup": 1}, {"speedup": 1.0}, {"speedup": 1.0000001}, {"bytes": 1},
                     {}):
        other = copy.deepcopy(data)
        other["rules"][3]["measured"] = measured
        c = tmp_path / "c.yaml"
        c.write_text(dump_profile(other))
        hashes.add(load_profile(c).sha256)
    assert len(hashes) == 5
