"""A sample of bad input files through the command line, as a user meets them: exit 2, one
line on stderr naming the file, no traceback. Every mutation of every kind of file goes
through the loaders in one process in ``tests/unit/test_fuzz_inputs.py``."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.unit.test_fuzz_inputs import CLUSTERS, PROFILE, ROOT, Kind, replaced
from tests.unit.test_fuzz_inputs import kinds as kinds  # the fixture, shared

SAMPLE = {
    "dup-rules.yaml": PROFILE.read_text() + "rules: []\n",
    "set-extra.yaml": PROFILE.read_text() + "extra: !!set {a, b}\n",
    "bomb-extra.yaml": PROFILE.read_text() + "extra:\n  a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"  {c}: &{c} [{', '.join(['*' + p] * 9)}]\n"
        for p, c in zip("abcdefgh", "bcdefghi")),
    "python-tag.yaml": "format: !!python/object/apply:os.system ['true']\n",
    "huge-world.yaml": PROFILE.read_text().replace("world_size: 2", "world_size: " + "9" * 30),
    "inner-no-dims.yaml": PROFILE.read_text().replace("    dims: [2]\n", ""),
}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringtune.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))


def _one_line_exit_2(proc: subprocess.CompletedProcess[str], path: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"ringtune: error: {path}: "), proc.stderr


@pytest.mark.parametrize("name", sorted(SAMPLE))
def test_cli_refuses_bad_profiles(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(SAMPLE[name])
    for verb in ("validate", "show"):
        _one_line_exit_2(_cli(verb, str(path)), str(path))


def test_cli_refuses_bad_topology_and_cluster(tmp_path: Path, kinds: list[Kind]) -> None:
    topo = next(k for k in kinds if k.name == "topology-gpu")
    bad = replaced(topo.data, ("links", "bandwidth_gbps", 0, 1), math.inf)
    path = tmp_path / "inf.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = _cli("probe", "--topology", str(path))
    _one_line_exit_2(proc, str(path))
    assert "links.bandwidth_gbps[0][1]" in proc.stderr or "finite" in proc.stderr
    cluster = yaml.safe_load(CLUSTERS[0].read_text())
    cluster["levels"][0]["bandwidth_gbs"] = -3.0
    path = tmp_path / "neg.yaml"
    path.write_text(yaml.safe_dump(cluster))
    _one_line_exit_2(_cli("simulate", "--cluster", str(path)), str(path))


def test_cli_names_other_kinds_of_file(tmp_path: Path, kinds: list[Kind]) -> None:
    topo = tmp_path / "topo.yaml"
    topo.write_text(next(k for k in kinds if k.name == "topology").text)
    proc = _cli("show", str(topo))
    _one_line_exit_2(proc, str(topo))
    assert "this is a topology file" in proc.stderr and "not a profile" in proc.stderr


def test_cli_refuses_a_large_file_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with open(path, "wb") as fh:
        fh.truncate(50 << 20)  # sparse: 50 MB without writing them
    _one_line_exit_2(_cli("validate", str(path)), str(path))
