"""``ringtune tune`` end to end through its launcher (``mpiexec -n 2`` in a subprocess): the
profile it writes, resuming, SIGINT, SIGKILL of a rank, a hanging candidate, bad input.

Slow candidates come from the test-only ``sleep`` algorithm (``tests/sleep_algorithm.py``,
loaded in the ranks through ``RINGTUNE_PLUGINS``, which sleeps ``$RINGTUNE_TEST_SLEEP`` seconds
while its plan is built), so runs can be interrupted midway and a hang can be provoked on
purpose. Each test asserts correctness (files, storage contents, exit codes, messages), never
timings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import yaml

from collectives.profile import load_profile

from ..child_signals import SIGNALLED_CHILD
from ..mpi_support import find_processes, tuning_trials

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RINGTUNE = [sys.executable, "-m", "ringtune.cli"]
SLOW = ["--algorithms", "native,sleep", "--sampler", "grid", "--no-progress"]
BUCKETS = ["--buckets", "1K,4K,16K"]


def _env(sleep: str = "0.3,0.4,0.5,0.6") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_"))}
    env.pop("RINGTUNE_LAUNCHED", None)
    env.update(RINGTUNE_PLUGINS="tests.sleep_algorithm", RINGTUNE_TEST_SLEEP=sleep,
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")])))
    return env


def _tune(out: str, *extra: str, sleep: str = "0.3,0.4,0.5,0.6",
          timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RINGTUNE, "tune", "--out", out, "-np", "2", *extra],
                          env={**_env(sleep), **env}, capture_output=True, text=True,
                          timeout=timeout)


def _start(out: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*RINGTUNE, "tune", "--out", out, "-np", "2", *extra],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **SIGNALLED_CHILD)


def _trials(db: str) -> list[tuple[Any, ...]]:
    """(study, number, state, key) of every trial in the SQLite storage."""
    return tuning_trials(db)


def _complete(db: str) -> set[tuple[str, int, str | None]]:
    return {(s, n, k) for s, n, st, k in _trials(db) if st == "COMPLETE"}


def _wait_for_complete(db: str, proc: subprocess.Popen[str], count: int,
                       limit: float = 60) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end and proc.poll() is None:
        if len(_complete(db)) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} finished trials in {db} before the run ended")


def _form(profile: dict[str, Any]) -> tuple[Any, ...]:
    """What two runs of the same command must share (choices may differ by noise)."""
    return (sorted(profile), sorted(profile["topology"]), sorted(profile["tuning"]),
            profile["tuning"]["buckets"], profile["rules"][0]["min_bytes"],
            profile["rules"][-1]["max_bytes"], profile["topology"]["world_size"])


def _assert_clean_profile(folder: Any, name: str = "p.yaml") -> dict[str, Any]:
    """The profile validates (in a process that knows the test-only ``sleep`` algorithm,
    which a noisy A/B may adopt: it runs native once its plan is built)."""
    assert not [f for f in os.listdir(folder) if ".tmp" in f]
    path = str(folder / name)
    res = subprocess.run([*RINGTUNE, "validate", path], env=_env(), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    with open(path) as fh:
        data: dict[str, Any] = yaml.safe_load(fh)
    assert data["topology"]["world_size"] == 2
    if all(r["algorithm"] != "sleep" for r in data["rules"]):
        load_profile(path, world_size=2)
    return data


@pytest.fixture(scope="module")
def reference(tmp_path_factory: Any) -> dict[str, Any]:
    """An uninterrupted run of the command the fault tests interrupt."""
    d = tmp_path_factory.mktemp("reference")
    res = _tune(str(d / "p.yaml"), *BUCKETS, *SLOW)
    assert res.returncode == 0, res.stderr
    return _assert_clean_profile(d)


def test_tune_writes_a_valid_profile_and_rerun_does_not_redo(tmp_path: Any) -> None:
    out = str(tmp_path / "p.yaml")
    res = _tune(out, "--buckets", "1K,64K", "--trials", "4", "--algorithms",
                "native,rhd,multiring", "--report", str(tmp_path / "rep"), "--no-progress")
    assert res.returncode == 0, res.stderr
    prof = _assert_clean_profile(tmp_path)
    assert prof["tuning"]["buckets"] == [1024, 65536]
    assert "speed-up" in res.stdout and "wrote " + out in res.stdout
    assert os.path.exists(tmp_path / "rep" / "busbw.png")
    db = str(tmp_path / "p.db")
    before = _trials(db)
    assert sum(1 for t in before if t[2] == "COMPLETE") >= 2
    with open(out, "rb") as fh:
        first_bytes = fh.read()
    trials = prof["tuning"]["trials"]
    assert f"{trials} trials, run " in res.stdout and "this run added " + str(trials) in res.stdout
    again = _tune(out, "--buckets", "1K,64K", "--trials", "4", "--algorithms",
                  "native,rhd,multiring")
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("not redone") == 2
    assert _trials(db) == before
    # Same arguments, same storage, nothing new: the same profile, byte for byte, and a
    # heading that says when the trials ran and that this run added none.
    with open(out, "rb") as fh:
        assert fh.read() == first_bytes
    first, last = prof["tuning"]["ran"].split("/")
    assert f"{trials} trials, run {first} .. {last}" in again.stdout
    assert "this run added 0" in again.stdout and "unchanged" in again.stdout
    _assert_clean_profile(tmp_path)
    # --fresh starts over: the studies are recreated.
    fresh = _tune(out, "--buckets", "1K", "--trials", "2", "--algorithms", "native,rhd",
                  "--fresh")
    assert fresh.returncode == 0, fresh.stderr
    assert "not redone" not in fresh.stderr


def test_sigint_midway_then_resume(tmp_path: Any, reference: dict[str, Any]) -> None:
    out, db = str(tmp_path / "p.yaml"), str(tmp_path / "p.db")
    proc = _start(out, *BUCKETS, *SLOW)
    _wait_for_complete(db, proc, 3)
    os.killpg(proc.pid, signal.SIGINT)
    text, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, text
    assert not os.path.exists(out), "an interrupted run must not leave a profile"
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]
    done = _complete(db)
    assert len(done) >= 3
    res = _tune(out, *BUCKETS, *SLOW)
    assert res.returncode == 0, res.stderr
    assert done <= _complete(db), "a finished trial was lost"
    assert _form(_assert_clean_profile(tmp_path)) == _form(reference)


def test_sigkill_of_a_rank_then_resume(tmp_path: Any, reference: dict[str, Any]) -> None:
    out, db = str(tmp_path / "p.yaml"), str(tmp_path / "p.db")
    proc = _start(out, *BUCKETS, *SLOW)
    _wait_for_complete(db, proc, 3)
    victim = _rank_pid(out, rank=1)
    os.kill(victim, signal.SIGKILL)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode != 0
    assert not os.path.exists(out)
    done = _complete(db)
    res = _tune(out, *BUCKETS, *SLOW)
    assert res.returncode == 0, res.stderr
    assert done <= _complete(db), "a finished trial was lost"
    assert _form(_assert_clean_profile(tmp_path)) == _form(reference)
    # Nothing is left RUNNING, and every configuration of the grid ended up measured:
    # the trial in flight was lost, then queued again.
    assert not [t for t in _trials(db) if t[2] == "RUNNING"]
    # (PRUNED counts as measured: a noisy machine can make a candidate look 2x slower.)
    keys = {(s, k) for s, _, st, k in _trials(db) if st in ("COMPLETE", "PRUNED")}
    # 5 = native at the library's default and sleep's four; plus MPICH's own algorithms.
    from collectives.natives import mpich

    assert len(keys) == 3 * (5 + len(mpich.native_algorithms()))


def _rank_pid(out: str, rank: int) -> int:
    """The pid of the MPI process of ``rank`` in the run writing ``out``."""
    found = find_processes(env=[f"PMI_RANK={rank}"], cmdline=[out, "ringtune.cli"],
                           live=False)
    if not found:
        raise AssertionError(f"no rank {rank} process found for {out}")
    return found[0]


def test_hanging_candidate_is_retried_once_then_ruled_out(tmp_path: Any) -> None:
    out, db = str(tmp_path / "p.yaml"), str(tmp_path / "p.db")
    args = ["--buckets", "4K", "--trial-timeout", "3", *SLOW]
    res = _tune(out, *args, sleep="3600", timeout=90)
    assert res.returncode != 0
    assert "exceeded --trial-timeout 3 s" in res.stderr
    assert "sleep seconds=3600.0" in res.stderr
    assert "recorded as TIMEOUT" in res.stderr and "retries it once" in res.stderr
    assert "will not be retried" not in res.stderr
    assert not os.path.exists(out)
    failed = [t for t in _trials(db) if t[2] == "FAIL"]
    assert len(failed) == 1 and failed[0][3] is not None and "sleep" in failed[0][3]
    # A timeout may be the machine's fault (a cut link): the next run tries it once more.
    retry = _tune(out, *args, sleep="3600", timeout=90)
    assert retry.returncode != 0
    assert "timed out in 2 runs and is ruled out" in retry.stderr, retry.stderr
    hung = [t for t in _trials(db) if t[3] == failed[0][3] and t[2] == "FAIL"]
    assert len(hung) == 2
    # Ruled out now: the run completes without it.
    again = _tune(out, *args, sleep="3600", timeout=90)
    assert again.returncode == 0, again.stderr
    prof = _assert_clean_profile(tmp_path)
    assert prof["rules"][0]["algorithm"] == "native"
    # The hanging configuration ran twice only (the skipped proposals are not runs).
    assert [t for t in _trials(db) if t[3] == failed[0][3] and t[2] == "FAIL"] == hung


def test_a_timed_out_candidate_that_passes_on_retry_is_measured(tmp_path: Any) -> None:
    out, db = str(tmp_path / "p.yaml"), str(tmp_path / "p.db")
    res = _tune(out, "--buckets", "4K", "--trial-timeout", "3", *SLOW, sleep="3600",
                timeout=90)
    assert res.returncode != 0 and "recorded as TIMEOUT" in res.stderr
    # The fault went away (the same configuration's plan now builds at once): the retry
    # measures it like any other candidate.
    ok = _tune(out, "--buckets", "4K", "--trial-timeout", "3", *SLOW, sleep="3600",
               timeout=90, RINGTUNE_TEST_SLEEP_CAP="0")
    assert ok.returncode == 0, ok.stderr
    states = sorted(st for _, _, st, k in _trials(db) if k and "sleep" in k)
    # (PRUNED counts as measured: it runs native after its delay, so it ties with native.)
    assert len(states) == 2 and "FAIL" in states, states
    assert {"COMPLETE", "PRUNED"} & set(states), states


@pytest.mark.parametrize("args, needle", [
    (["--out", "/proc/version/p.yaml"], "/proc/version/p.yaml: cannot write profile"),
    (["--min-bytes", "64M", "--max-bytes", "1K"], "--minbytes"),
    (["-b", "64M", "-e", "1K"], "-b/--minbytes (67108864) must be ≥ 1 and ≤ -e/--maxbytes"),
    (["--algo", "native", "--algo", "warp"], "unknown algorithm 'warp'"),
    (["--algorithms", "native,warp"], "unknown algorithm 'warp'"),
    (["--trials", "0"], "--trials"),
    (["--sampler", "cmaes"], "--sampler"),
])
def test_bad_tune_arguments_exit_2(args: list[str], needle: str) -> None:
    res = subprocess.run([*RINGTUNE, "tune", *args], env=_env(), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr


def test_bad_storage_is_reported_once_by_rank_0(tmp_path: Any) -> None:
    res = _tune(str(tmp_path / "p.yaml"), "--buckets", "1K", "--storage", "nosuchdb://x",
                "--no-progress")
    assert res.returncode == 2, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("ringtune: error:")]
    assert len(errors) == 1 and "--storage nosuchdb://x" in errors[0]


def test_show_and_validate_a_tuned_profile(tmp_path: Any, reference: dict[str, Any]) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(reference, sort_keys=False))
    show = subprocess.run([*RINGTUNE, "show", str(path)], env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert show.returncode == 0 and "speed-up" in show.stdout
    val = subprocess.run([*RINGTUNE, "validate", str(path), "--against-topology"],
                         env=_env(), capture_output=True, text=True, timeout=60)
    assert val.returncode == 0, val.stderr
    assert "matches this world" in val.stdout
    other = dict(reference, topology=dict(reference["topology"],
                                          fingerprint="sha256:" + "0" * 64))
    path.write_text(yaml.safe_dump(other, sort_keys=False))
    bad = subprocess.run([*RINGTUNE, "validate", str(path), "--against-topology"],
                         env=_env(), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    # One error line, from rank 0 only (mpi4py's launcher may add its own "Abort(2)" note).
    lines = [ln for ln in bad.stderr.splitlines() if ln.startswith("ringtune: error:")]
    assert len(lines) == 1 and "topology.fingerprint" in lines[0], bad.stderr
