"""``ringtune tune --shapes``: one run tunes several shapes of the allocation into the
sections of one profile (the others predicted), and a shape larger than the allocation is
bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from collectives.profile import load_profile

RINGTUNE = [sys.executable, "-m", "ringtune.cli"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_"))}
    env.pop("RINGTUNE_LAUNCHED", None)
    return env


def _tune(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RINGTUNE, "tune", "--out", str(out), "--no-progress",
                           "--buckets", "4K,64K", "--trials", "3", "--algorithms",
                           "native,rhd", *extra], env=_env(), capture_output=True, text=True,
                          timeout=300)


def test_shapes_in_one_run(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    res = _tune(out, "-np", "3", "--shapes", "1,3")
    assert res.returncode == 0, res.stderr
    main = load_profile(out, world_size=3)
    assert main.section == "the 3-rank section (main shape)"
    assert main.library is not None and main.library.name
    one = load_profile(out, world_size=1)
    assert one.section == "the tuned 1-rank section"
    two = load_profile(out, world_size=2)
    assert "predicted by the cost model" in two.section
    assert two.world_size == 2 and two.rules[-1].max_bytes is None
    assert main.tuning["shapes"] == [1, 3]


def test_shape_larger_than_the_allocation(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    res = _tune(out, "-np", "2", "--shapes", "1,4")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "larger than this allocation (2 ranks)" in lines[0], res.stderr
    assert not out.exists()


def test_predicted_sizes_stay_bounded() -> None:
    from autotune.shapes import MAX_PREDICTED, predicted_sizes

    assert predicted_sizes(4, ["a"] * 4) == [1, 2, 3, 4]
    big = predicted_sizes(1024, [f"h{i // 8}" for i in range(1024)])
    assert len(big) <= MAX_PREDICTED and {1, 2, 8, 16, 512} <= set(big)
