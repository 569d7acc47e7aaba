"""``ringtune export``: golden files and parse-back for NCCL and Open MPI, the MPICH file end
to end (a plain mpi4py program under mpiexec gets the exported algorithms), bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.profile import load_profile
from ringtune.export import mpich, nccl, ompi, plan

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path("tests/golden/export")
PROFILE = GOLDEN / "profile.yaml"
BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA", "MPIR_CVAR_"))}
    env.update(extra)
    return env


def export(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "ringtune"), "export", *args], capture_output=True,
                          text=True, timeout=180, cwd=ROOT, env=_env())


@pytest.mark.parametrize("fmt,golden", [("nccl", "expected.nccl.csv"),
                                        ("ompi", "expected.ompi.rules")])
def test_golden_and_parse_back(fmt: str, golden: str) -> None:
    res = export(str(PROFILE), "--format", fmt)
    assert res.returncode == 0, res.stderr
    assert res.stdout == (ROOT / GOLDEN / golden).read_text()
    assert "rules[2]" in res.stderr  # every rule's mapping is reported


def test_readers_follow_the_grammar() -> None:
    rows = nccl.parse((ROOT / GOLDEN / "expected.nccl.csv").read_text())
    assert rows == [{"collective": "allreduce", "min_bytes": 16384, "max_bytes": 4194303,
                     "algorithm": "ring", "protocol": "simple", "channels": 2, "nNodes": 1,
                     "nRanks": 3}]
    rules = ompi.parse((ROOT / GOLDEN / "expected.ompi.rules").read_text())
    assert rules == {2: {3: [(0, 0, 0, 0), (16384, 5, 0, 65536), (4194304, 6, 0, 0),
                             (67108864, 0, 0, 0)],
                         4: [(0, 0, 0, 0)]}}  # larger communicators: the library's choice
    for bad in ("allreduce,0,10,ring,simple,1,1\n", "allreduce,0,10,rings,simple,1,1,1\n",
                "allreduce,0,10,ring,simple,1,1,1,-5\n", "#" + "x" * 300 + "\n"):
        with pytest.raises(ValueError):
            nccl.parse(bad)
    for bad in ("1\n2\n1\n4\n1\n1024 4 0 0\n",  # no 0-byte rule
                "1\n2\n1\n4\n2\n0 4 0 0\n0 3 0 0\n",  # sizes not increasing
                "1\n2\n1\n4\n1\n0 9 0 0\n", "1\n2\n1\n4\n2\n0 4 0 0\n"):
        with pytest.raises(ValueError):
            ompi.parse(bad)
    # allgather_reduce (7) is Open MPI 6.0's: 5.0.x fails the allreduce on it.
    assert ompi.parse("1\n2\n1\n4\n1\n0 7 0 0\n", "6.0.0")[2][4] == [(0, 7, 0, 0)]
    with pytest.raises(ValueError, match="algorithm 7 is not one of Open MPI 5.0.11's"):
        ompi.parse("1\n2\n1\n4\n1\n0 7 0 0\n", "5.0.11")


def test_plan_substitutes_the_best_native_candidate_per_bucket() -> None:
    segs = plan(load_profile(ROOT / PROFILE))
    assert [(s.min_bytes, s.max_bytes, s.impl) for s in segs] == [
        (0, 16383, "tree"), (16384, 262143, "ring"),
        (262144, 4194303, "reduce_scatter_allgather"), (4194304, 67108863, "auto"),
        (67108864, None, "auto")]
    assert segs[0].note == "tuned" and "no native equivalent" in segs[1].note


@pytest.mark.skipif(sys.platform != "linux", reason="reads the libmpi named in /proc")
def test_mpich_file_reaches_a_plain_mpi_program(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    from collectives.natives import mpich as mpich_lib

    if mpich_lib.unavailable_reason():
        pytest.skip(mpich_lib.unavailable_reason())
    out = tmp_path / "tuning.json"
    res = export(str(PROFILE), "--format", "mpich", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert [leaf for _, leaf in mpich.parse(out.read_text())][:3] == [
        mpich.container("tree"), mpich.container("ring"),
        mpich.container("reduce_scatter_allgather")]
    sizes = ["4096", "65536"]  # the tree rule, and the multiring rule's ring bucket

    def digests(**env: str) -> list[str]:
        cmd = [str(BIN / "mpiexec"), "-n", "3", sys.executable,
               str(ROOT / GOLDEN / "plain_allreduce.py"), *sizes]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                             env=_env(**env))
        assert run.returncode == 0, run.stderr
        return [line.split()[1] for line in run.stdout.split("\n") if line.strip()]

    algo = mpich_lib.ALGORITHM_CVAR
    auto = digests()
    forced = [digests(**{algo: "tree"})[0], digests(**{algo: "ring"})[1]]
    tuned = digests(**{mpich.ENV_FILE: str(out)})
    assert tuned == forced, "the exported file did not select tree / ring"
    assert tuned != auto, "the check cannot tell the algorithms apart"


def test_bad_input_exit_2_and_no_file(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    res = export(str(PROFILE), "--format", "intel", "--out", str(out))
    assert res.returncode == 2 and "unknown" in res.stderr and not out.exists()
    ours = (ROOT / PROFILE).read_text()
    head, _, rest = ours.partition("rules:\n")
    lone = tmp_path / "own.yaml"
    lone.write_text(head + "rules:\n- {min_bytes: 0, max_bytes: null, algorithm: rhd, "
                    "params: {}}\n")
    for fmt in ("mpich", "nccl", "ompi"):
        res = export(str(lone), "--format", fmt, "--out", str(out))
        assert res.returncode == 2, res.stderr
        assert "no rule has a native equivalent" in res.stderr
        assert res.stderr.count("\n") == 1 and not out.exists()
    # A file MPICH would reject (an algorithm this library lacks) is refused, not written.
    bad = tmp_path / "bad.yaml"
    bad.write_text(ours.replace("impl: tree", "impl: no_such_algo"))
    res = export(str(bad), "--format", "mpich", "--out", str(out))
    assert res.returncode == 2 and "no_such_algo" in res.stderr and not out.exists()


def test_library_check_rejects_what_mpich_rejects() -> None:
    from collectives.natives import mpich as mpich_lib

    if mpich_lib.unavailable_reason():
        pytest.skip(mpich_lib.unavailable_reason())
    text = (ROOT / GOLDEN / "profile.yaml").read_text()
    assert text  # the golden profile exists
    with pytest.raises(ValueError, match="rejects"):
        mpich.check_with_library('{"collective=allreduce": {"comm_type=intra": '
                                 '{"algorithm=MPIR_Allreduce_intra_no_such": {}}}}')


def test_several_shapes_export_one_branch_each(tmp_path: Path) -> None:
    prof = GOLDEN / "shapes.yaml"
    res = export(str(prof), "--format", "ompi")
    assert res.returncode == 0, res.stderr
    rules = ompi.parse(res.stdout)
    assert sorted(rules[2]) == [2, 3, 4]
    assert rules[2][4] == [(0, 0, 0, 0)]
    assert rules[2][2] == [(0, 4, 0, 0), (1048576, 4, 0, 0)]
    res = export(str(prof), "--format", "nccl")
    assert res.returncode == 0, res.stderr
    assert {r["nRanks"] for r in nccl.parse(res.stdout)} == {2, 3}
    from collectives.natives import mpich as mpich_lib

    if mpich_lib.unavailable_reason():
        return
    out = tmp_path / "t.json"
    res = export(str(prof), "--format", "mpich", "--out", str(out))
    assert res.returncode == 0, res.stderr
    branches = mpich.parse_shapes(out.read_text())
    assert branches[2] == [(1048575, mpich.container("ring")),
                           (None, mpich.container("recursive_doubling"))]
    assert branches[None][0] == (16383, mpich.container("tree"))


def test_mpich_compositions_go_to_the_ch4_file(tmp_path: Path) -> None:
    """A native rule's ``composition`` is exported in MPICH's ch4 selection file (written
    next to --out): the library's ch4 tree with the branch for commutative ops across nodes
    replaced by the rules' compositions per size (golden), checked by the library; the
    algorithm file keeps the rules' algorithms; without --out it is a usage error."""
    from collectives.natives import mpich as mpich_lib

    if mpich_lib.unavailable_reason():
        pytest.skip(mpich_lib.unavailable_reason())
    prof = GOLDEN / "composition.yaml"
    out = tmp_path / "tuning.json"
    res = export(str(prof), "--format", "mpich", "--out", str(out))
    assert res.returncode == 0, res.stderr
    ch4 = tmp_path / "tuning.ch4.json"
    assert f"{mpich.CH4_ENV_FILE}={ch4}" in res.stderr
    assert "rules[1] 1048576..16777215: composition beta" in res.stderr
    tree = json.loads(ch4.read_text())
    branch = tree["collective=allreduce"]["comm_type=intra"]["comm_size=any"][
        "comm_hierarchy=parent"]["is_commutative=yes"]
    golden = json.loads((ROOT / GOLDEN / "expected.ch4-allreduce.json").read_text())
    own = mpich.builtin_tree(marker=b"MPIDI_Allreduce_intra_composition")[
        "collective=allreduce"]["comm_type=intra"]["comm_size=any"][
        "comm_hierarchy=parent"]["is_commutative=yes"]
    golden["avg_msg_size<=1048575"] = own  # the auto rule: the library's own branch
    assert branch == golden
    # The rest of ch4's tree is the library's own.
    assert tree["collective=bcast"] == mpich.builtin_tree(
        marker=b"MPIDI_Allreduce_intra_composition")["collective=bcast"]
    assert [leaf for _, leaf in mpich.parse(out.read_text())][1:] == [
        "<library>", mpich.container("recursive_doubling")]
    res = export(str(prof), "--format", "mpich")
    assert res.returncode == 2 and "--out" in res.stderr
    # delta has no leaf in this MPICH's ch4 file (its parser asserts): said, not written.
    if "delta" not in mpich.file_compositions():
        with_delta = tmp_path / "delta.yaml"
        with_delta.write_text((ROOT / prof).read_text().replace("composition: alpha",
                                                       "composition: delta"))
        res = export(str(with_delta), "--format", "mpich", "--out", str(out))
        assert res.returncode == 0, res.stderr
        assert "composition delta is not expressible" in res.stderr
        assert "MPIR_CVAR_ALLREDUCE_COMPOSITION=4" in res.stderr
        branch = json.loads(ch4.read_text())["collective=allreduce"]["comm_type=intra"][
            "comm_size=any"]["comm_hierarchy=parent"]["is_commutative=yes"]
        assert branch["avg_msg_size=any"] == own
    # A profile without compositions writes no ch4 file.
    plain = tmp_path / "plain.json"
    assert export(str(PROFILE), "--format", "mpich", "--out", str(plain)).returncode == 0
    assert not (tmp_path / "plain.ch4.json").exists()


def test_a_profile_of_another_library_is_refused_by_a_format_that_cannot_map_it(
        tmp_path: Path) -> None:
    """Open MPI's algorithm names in MPICH's file: one line, exit 2, nothing written."""
    prof = tmp_path / "ompi.yaml"
    prof.write_text(
        "format: ringtune-profile\nversion: 1\nlibrary: {name: Open MPI, version: 5.0.11}\n"
        "topology: {world_size: 2, hosts: 1, ranks_per_host: 2, summary: x}\n"
        "backend: numpy\ntransport: mpi\nrules:\n- {min_bytes: 0, max_bytes: null, "
        "algorithm: native, params: {impl: rabenseifner}}\n")
    out = tmp_path / "t.json"
    res = export(str(prof), "--format", "mpich", "--out", str(out))
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "tuned with Open MPI (impl rabenseifner)" in res.stderr
    assert "use --format ompi" in res.stderr
    assert not out.exists()
