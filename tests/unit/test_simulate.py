"""``ringtune simulate``: tables, JSON, report, and one clear error (exit 2) per bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from ringtune.cli import main

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "profiles" / "clusters"
H100_128 = str(CLUSTERS / "dgx-h100-128.yaml")
RESNET = str(CLUSTERS / "workloads" / "resnet50-p100.yaml")


def test_json_has_every_size_and_algorithm(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--cluster", H100_128, "-b", "1K", "-e", "512M", "-f", "2",
                 "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cluster"]["ranks"] == 1024 and data["cluster"]["hosts"] == 128
    assert [r["bytes"] for r in data["sizes"]] == [1024 << i for i in range(20)]
    for row in data["sizes"]:
        algos = row["algorithms"]
        assert set(algos) == {"native", "multiring", "rhd", "hierarchical", "shm"}
        fastest = min(algos, key=lambda a: algos[a]["time_us"])
        assert row["best"] == fastest
        for r in algos.values():
            assert r["time_us"] > 0 and r["busbw_gbps"] > 0
        dims = algos["hierarchical"]["params"]["dims"]
        assert len(dims) >= 2 and math.prod(dims) == 1024


def test_table_and_workload_scaling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = str(CLUSTERS / "goyal-bigbasin-32.yaml")
    out = tmp_path / "r.json"
    code = main(["simulate", "--cluster", cluster, "-b", "64K", "-e", "16M", "-f", "4",
                 "--workload", RESNET, "--json", str(out), "--report", str(tmp_path / "rep")])
    assert code == 0
    text = capsys.readouterr().out
    assert "# cluster goyal-bigbasin-32: 256 ranks = 32 hosts x 8" in text
    assert "scaling efficiency" in text
    data = json.loads(out.read_text())
    scaling = data["workload"]["scaling"]
    assert [s["hosts"] for s in scaling] == [1, 2, 4, 8, 16, 32]
    assert [s["ranks"] for s in scaling] == [8, 16, 32, 64, 128, 256]
    for s in scaling:
        for r in s["algorithms"].values():
            assert 0 < r["efficiency"] <= 1
            # efficiency = compute / (compute + allreduce) without overlap
            want = 0.164 / (0.164 + r["allreduce_ms"] / 1e3)
            assert r["efficiency"] == pytest.approx(want, rel=1e-4)
    png = tmp_path / "rep" / "simulate.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "goyal-bigbasin-32" in (tmp_path / "rep" / "simulate.md").read_text()


def _write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


LEVELS = """levels:
  - {name: host, size: 4, bandwidth_gbs: 10, latency_us: 1}
  - {name: net, size: 2, bandwidth_gbs: 5, latency_us: 3}
"""


@pytest.mark.parametrize("body,key", [
    ("ranks: 8\nmemory_gbs: 100\n", "levels: missing"),
    ("ranks: 8\nmemory_gbs: 100\nlevels: []\n", "levels: expected a non-empty list"),
    ("ranks: 8\nmemory_gbs: 100\n" + LEVELS.replace("bandwidth_gbs: 5", "bandwidth_gbs: 0"),
     "levels[1].bandwidth_gbs"),
    ("ranks: 8\nmemory_gbs: 100\n" + LEVELS.replace("bandwidth_gbs: 10", "bandwidth_gbs: -2"),
     "levels[0].bandwidth_gbs"),
    ("ranks: 12\nmemory_gbs: 100\n" + LEVELS, "levels: sizes 4 x 2 = 8 ranks, but ranks is 12"),
    ("ranks: 8\nmemory_gbs: 100\nracks: 3\n" + LEVELS, "racks: unknown key"),
    ("ranks: 8\nmemory_gbs: 100\n" + LEVELS.replace("latency_us: 3", "latency_us: 3, mtu: 9"),
     "levels[1].mtu: unknown key"),
    ("ranks: 8\nmemory_gbs: [1\n", "not valid YAML"),
])
def test_bad_cluster_file_exits_2_naming_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, key: str) -> None:
    path = _write(tmp_path, "bad.yaml", body)
    assert main(["simulate", "--cluster", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"ringtune: error: {path}: ") and key in err, err


@pytest.mark.parametrize("body,key", [
    ("gradient_bytes: 100\n", "compute_seconds: missing"),
    ("gradient_bytes: -5\ncompute_seconds: 1\n", "gradient_bytes: expected a positive"),
    ("gradient_bytes: 100\ncompute_seconds: 1\noverlap: 1.5\n", "overlap: expected a fraction"),
    ("gradient_bytes: 100\ncompute_seconds: 1\nbatch: 32\n", "batch: unknown key"),
])
def test_bad_workload_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   body: str, key: str) -> None:
    path = _write(tmp_path, "w.yaml", body)
    assert main(["simulate", "--cluster", H100_128, "--workload", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: {key}" in err, err


def test_missing_file_and_bad_options_exit_2(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nope.yaml")
    assert main(["simulate", "--cluster", missing]) == 2
    assert missing in capsys.readouterr().err
    assert main(["simulate", "--cluster", H100_128, "--algo", "tree"]) == 2
    assert "--algo tree" in capsys.readouterr().err
    assert main(["simulate"]) == 2
    assert "--cluster" in capsys.readouterr().err


def test_plot_gives_each_algorithm_one_style_in_both_panels(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import matplotlib.pyplot as plt

    from ringtune.commands.simulate import figure

    out = tmp_path / "r.json"
    code = main(["simulate", "--cluster", str(CLUSTERS / "goyal-bigbasin-32.yaml"), "-b", "64K",
                 "-e", "16M", "-f", "4", "--workload", RESNET, "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    fig = figure(result)
    try:
        panels = [{ln.get_label(): ln for ln in ax.get_lines()} for ax in fig.axes]
    finally:
        plt.close(fig)
    assert len(panels) == 2 and set(panels[0]) == set(panels[1]) == {
        "native", "multiring", "rhd", "hierarchical", "shm"}

    def style(ln: Any) -> tuple[Any, ...]:
        return (ln.get_color(), ln.get_marker(), ln.get_linestyle())

    for name in panels[0]:
        assert style(panels[0][name]) == style(panels[1][name]), name
    # Distinct colours, markers and line styles: a series drawn over an identical one (rhd
    # over native) still shows, and the larger one underneath stays visible around it.
    # Matplotlib names four line styles: with more series, colour and marker still differ.
    series = len(panels[0])
    for attr, kinds in ((lambda ln: ln.get_color(), series),
                        (lambda ln: ln.get_marker(), series),
                        (lambda ln: ln.get_linestyle(), min(series, 4))):
        assert len({attr(ln) for ln in panels[0].values()}) == kinds
    lines = panels[0]
    under, over = sorted((lines["native"], lines["rhd"]), key=lambda ln: ln.get_zorder())
    assert under.get_markersize() > over.get_markersize()
    assert under.get_linewidth() > over.get_linewidth()
