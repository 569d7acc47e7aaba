"""The pieces of issue 11 that need neither MPI nor torch: workload tensor sizes, the
bucket-size candidates of ``ringtune tune --workload`` (``collectives.torch`` without
torch: ``tests/cli/test_fusion_tune.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.cluster import load_workload, workload_from_dict
from autotune.fusion import candidates
from ringtune.cli import main

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "profiles" / "clusters" / "workloads"


def test_workload_tensor_bytes() -> None:
    w = load_workload(WORKLOADS / "digits-mlp-64x2.yaml")
    assert w.tensor_bytes and sum(w.tensor_bytes) == w.gradient_bytes
    assert load_workload(WORKLOADS / "resnet50-p100.yaml").tensor_bytes == ()


@pytest.mark.parametrize("tensors,needle", [
    ([10, 20], "sum to 30 B, but gradient_bytes is 100"),
    ([100, 0], "positive integers"),
    ("100", "positive integers"),
])
def test_bad_tensor_bytes(tensors: object, needle: str) -> None:
    with pytest.raises(ValueError, match=f"w.yaml: tensor_bytes: .*{needle}"):
        workload_from_dict({"gradient_bytes": 100, "compute_seconds": 1.0,
                            "tensor_bytes": tensors}, "w.yaml")


def test_candidates_cover_the_gradient() -> None:
    assert candidates(1) == [4096]
    assert candidates(35880) == [4096, 16384, 65536]
    assert candidates(1 << 20)[-1] == 1 << 20


def test_tune_workload_without_tensors_exits_2(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({"gradient_bytes": 100, "compute_seconds": 1.0}))
    assert main(["tune", "--workload", str(path), "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "no tensor_bytes" in err and "--write-workload" in err


def test_tune_missing_workload_exits_2(tmp_path: Path) -> None:
    assert main(["tune", "--workload", str(tmp_path / "none.yaml"),
                 "--out", str(tmp_path / "p.yaml")]) == 2
