"""``ringtune export --format ompi`` proven by the installed Open MPI (skips under another
library: ``make ompi-test`` runs it in .venv-ompi).

A plain job (``tests/allreduce_pattern.py``: no ringtune, a logging user-defined sum) shows
which algorithm ran by the pieces each rank reduces. The exported rules file is read (an
algorithm 5.0.x does not have fails the call: the negative control), the algorithm each
size range names is the one that runs, and a larger communicator than the tuned one keeps
the library's own choice (without the file's last section the tuned rules would drive it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ringtune.launch import find_mpiexec, library_family

ROOT = Path(__file__).resolve().parents[2]
PATTERN = ROOT / "tests" / "allreduce_pattern.py"

pytestmark = pytest.mark.skipif(library_family() != "openmpi",
                                reason="mpi4py does not load Open MPI here")


def _version() -> str:
    from ringtune.export.ompi import installed_version

    return installed_version()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "PRTE_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=str(ROOT), **extra)
    return env


def pattern(n: int, count: int, rules: Path | None) -> dict[str, Any]:
    """The plain job at ``n`` ranks, with the rules file ``rules`` (or none)."""
    extra = {} if rules is None else {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                                      "OMPI_MCA_coll_tuned_dynamic_rules_filename": str(rules)}
    out = subprocess.run([find_mpiexec(), "--oversubscribe", "-n", str(n), sys.executable,
                          str(PATTERN), str(count)], capture_output=True, text=True,
                         timeout=240, env=_env(**extra), cwd=ROOT)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no result (exit {out.returncode}): {out.stderr[-800:]}"
    result: dict[str, Any] = json.loads(lines[0])
    result["returncode"] = out.returncode
    return result


def write_profile(path: Path, world: int, rules: list[dict[str, Any]],
                  library: tuple[str, str]) -> Path:
    data = {"format": "ringtune-profile", "version": 1,
            "library": {"name": library[0], "version": library[1]},
            "topology": {"world_size": world, "hosts": 1, "ranks_per_host": world,
                         "summary": f"1 host x {world} ranks, cpu, shm"},
            "backend": "numpy", "transport": "mpi", "dtype": "float32", "op": "sum",
            "rules": rules}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def export(profile: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringtune.cli", "export", str(profile),
                           "--format", "ompi", "--out", str(out)], capture_output=True,
                          text=True, timeout=180, env=_env(), cwd=ROOT)


TWO_RANGES = [{"min_bytes": 0, "max_bytes": 16383, "algorithm": "native",
               "params": {"impl": "basic_linear"}},
              {"min_bytes": 16384, "max_bytes": None, "algorithm": "native",
               "params": {"impl": "recursive_doubling"}}]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ompi")
    prof = write_profile(tmp / "p.yaml", 2, TWO_RANGES, ("Open MPI", _version()))
    out = tmp / "rules.txt"
    res = export(prof, out)
    assert res.returncode == 0, res.stderr
    return out


def test_the_algorithm_named_is_the_one_that_runs(exported: Path) -> None:
    # 1000 float64 = 8000 B: basic_linear (reduce to the root, then bcast): only rank 0
    # reduces, the whole buffer.
    small = pattern(2, 1000, exported)
    assert small["ok"] and small["calls"] == [[1000], []], small
    # 24000 B: recursive doubling: both ranks reduce the whole buffer once.
    large = pattern(2, 3000, exported)
    assert large["ok"] and large["calls"] == [[3000], [3000]], large


def test_negative_control_an_invalid_entry_fails_the_call(tmp_path: Path) -> None:
    bad = tmp_path / "bad.rules"
    # Algorithm 7 (allgather_reduce) exists only in Open MPI 6.0.
    bad.write_text("1\n2\n1\n2\n1\n0 7 0 0\n")
    if int(_version().split(".")[0]) >= 6:
        pytest.skip("Open MPI 6 has algorithm 7")
    res = pattern(2, 3000, bad)
    assert "error" in res and res["returncode"] != 0, res


def test_larger_communicators_keep_the_library_choice(exported: Path, tmp_path: Path) -> None:
    default = pattern(3, 3000, None)
    assert pattern(3, 3000, exported)["calls"] == default["calls"]
    # Without the file's last section the 2-rank rules would drive 3 ranks too: recursive
    # doubling, every rank reducing whole buffers, where the default (ring) reduces thirds.
    lines = exported.read_text().splitlines()
    cut = next(i for i, ln in enumerate(lines) if "larger than every tuned shape" in ln)
    head = [("1  # communicator sizes" if "# communicator sizes" in ln else ln)
            for ln in lines[:cut]]
    only_two = tmp_path / "only2.rules"
    only_two.write_text("\n".join(head) + "\n")
    forced = pattern(3, 3000, only_two)
    assert forced["calls"] != default["calls"]
    assert all(c == 3000 for calls in forced["calls"] for c in calls), forced


def test_algorithm_set_follows_the_version(tmp_path: Path) -> None:
    rules = [{"min_bytes": 0, "max_bytes": None, "algorithm": "native",
              "params": {"impl": "allgather_reduce"}}]
    prof = write_profile(tmp_path / "six.yaml", 2, rules, ("Open MPI", "6.0.0"))
    res = export(prof, tmp_path / "six.rules")
    if int(_version().split(".")[0]) >= 6:
        assert res.returncode == 0, res.stderr
        return
    assert res.returncode == 2, res.stderr
    # The installed 5.0.x has no allgather_reduce: the profile's impl is refused on loading.
    assert f"'allgather_reduce' is not an allreduce algorithm of Open MPI {_version()}" in (
        res.stderr)
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "six.rules").exists()  # nothing half-written
