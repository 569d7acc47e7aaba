"""Signals and kills during a self-launched ``ringtune tune`` / ``ringtune bench``: SIGTERM,
SIGINT and SIGKILL of the ``ringtune`` process alone (what a batch system, a wrapper's
``terminate()`` or a plain ``kill PID`` sends), and SIGKILL of one rank.

After each: the command has ended and nothing it started is left (every process carrying
this test's marker in its environment: mpiexec, the Hydra proxy and the ranks, which Hydra
puts in sessions of their own, so a session or process-group scan would miss them), the
profile at ``--out`` is still the old one byte for byte, no temporary file is left, the
SQLite storage passes its integrity check, and the next run resumes with every finished
trial kept (at most the trial in flight is lost and queued again). A second run on the
same storage while one holds it is refused, naming the holder's PID. Slow trials come
from the test-only ``sleep`` algorithm (see ``tests/cli/test_autotune_cli.py``).
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ..child_signals import SIGNALLED_CHILD
from ..mpi_support import find_processes, tuning_trials

RINGTUNE = [sys.executable, "-m", "ringtune.cli"]
MARK = "RINGTUNE_TEST_MARK"
ROOT = Path(__file__).resolve().parents[2]
OLD_PROFILE = ROOT / "profiles" / "examples" / "cpu-2core-vm-2ranks.yaml"
TUNE_ARGS = ["-np", "2", "--buckets", "1K,4K,16K", "--algorithms", "native,sleep",
             "--sampler", "grid", "--no-progress", "--trial-timeout", "0",
             # The chain checks kills and resumes, not the time budget: a loaded machine
             # must not end the last run's buckets before every configuration is measured.
             "--budget", "3600"]
#: Grid size: 3 buckets x (native at the library's default + each of MPICH's own
#: algorithms (``impl``) + one sleep configuration per value below).
SLEEPS = "0.2,0.3,0.4"


def _configs() -> int:
    from collectives.natives import mpich

    return 3 * (1 + len(mpich.native_algorithms()) + len(SLEEPS.split(",")))


def _env(mark: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_"))}
    env.pop("RINGTUNE_LAUNCHED", None)
    env.update({MARK: mark, "RINGTUNE_PLUGINS": "tests.sleep_algorithm",
                "RINGTUNE_TEST_SLEEP": SLEEPS,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))})
    return env


def _marked(mark: str, rank: int | None = None) -> list[int]:
    """Live (not zombie) processes whose environment carries ``mark`` (and ``rank``)."""
    env = [f"{MARK}={mark}"] + ([f"PMI_RANK={rank}"] if rank is not None else [])
    return find_processes(env=env)


def _left_behind(mark: str, within: float = 3.0) -> list[str]:
    """What of this test's processes is still alive ``within`` seconds after the command
    ended (each is then killed, by PID, so that one failure does not spill over)."""
    end = time.monotonic() + within
    while True:
        alive = _marked(mark)
        if not alive or time.monotonic() > end:
            break
        time.sleep(0.1)
    out = []
    for pid in alive:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid}: {cmd[:120]}")
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return out


def _start(args: list[str], mark: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen([*RINGTUNE, *args], env=_env(mark), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                **SIGNALLED_CHILD)


def _ended(proc: subprocess.Popen[bytes], mark: str, timeout: float = 30) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _left_behind(mark, 0)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("the command did not end after the signal") from None


def _trials(db: Path) -> list[tuple[Any, ...]]:
    """(study, number, state, config key, marked interrupted) of every trial."""
    return [(*t[:4], bool(t[4])) for t in tuning_trials(db, "interrupted")]


def _finished(db: Path) -> set[tuple[str, int, str | None]]:
    """Measured trials (COMPLETE, or PRUNED: a sleep candidate is far slower than native)."""
    return {(s, n, k) for s, n, st, k, _ in _trials(db) if st in ("COMPLETE", "PRUNED")}


def _integrity(db: Path) -> str:
    con = sqlite3.connect(db, timeout=10)
    try:
        return str(con.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        con.close()


def _wait_for(cond: Any, proc: subprocess.Popen[bytes], what: str, limit: float = 60) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end and proc.poll() is None:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} before the run ended (exit {proc.poll()})")


def _temporaries(folder: Path) -> list[str]:
    """Temporary files of atomic writes (``collectives.plumbing.atomic``: ``.NAME.XXXX.tmp.EXT``).
    Not counted: SQLite's own journal (its crash recovery) and the storage lock file, which
    a killed run leaves unlocked (the next run takes it; a run that ends removes it)."""
    return [f.name for f in folder.iterdir() if ".tmp" in f.name]


def _says_it_stopped(log: str, how: str) -> None:
    """A stop ringtune forwarded is told by ringtune's own line, without the launcher's
    banner calling it a bad termination of the application (``ringtune/relay.py``)."""
    assert f"ringtune: stopped by {how}: " in log, log
    assert "BAD TERMINATION" not in log and "EXIT STRING" not in log, log


#: How each run of the chain is stopped, after how many measured trials (cumulative).
KILLS = [("SIGTERM", 2), ("SIGINT", 3), ("SIGKILL", 4), ("rank 1 SIGKILL", 5)]


def test_tune_killed_every_way_then_resumed(tmp_path: Path) -> None:
    out, db = tmp_path / "p.yaml", tmp_path / "p.db"
    shutil.copyfile(OLD_PROFILE, out)
    old = out.read_bytes()
    for how, after in KILLS:
        mark = uuid.uuid4().hex
        proc = _start(["tune", "--out", str(out), *TUNE_ARGS], mark, tmp_path / "run.log")
        _wait_for(lambda after=after, mark=mark: len(_finished(db)) >= after
                  and len(_marked(mark, 1)) == 1, proc,
                  f"{how}: fewer than {after} measured trials")
        before = _finished(db)
        if how.startswith("rank"):
            os.kill(_marked(mark, 1)[0], signal.SIGKILL)
        else:
            os.kill(proc.pid, getattr(signal, how))
        code = _ended(proc, mark)
        log = (tmp_path / "run.log").read_text(errors="replace")
        assert code != 0, f"{how}: exit 0\n{log}"
        if how in ("SIGTERM", "SIGINT"):
            assert code == 128 + getattr(signal, how), f"{how}: exit {code}\n{log}"
            _says_it_stopped(log, how)
        assert _left_behind(mark, within=3.0 if how != "SIGKILL" else 10.0) == [], how
        assert out.read_bytes() == old, f"{how}: the old profile was changed"
        assert _temporaries(tmp_path) == [], how
        assert _integrity(db) == "ok", how
        assert before <= _finished(db), f"{how}: a finished trial was lost"
    # The last run completes; meanwhile a second run on the same storage is refused.
    mark = uuid.uuid4().hex
    proc = _start(["tune", "--out", str(out), *TUNE_ARGS], mark, tmp_path / "run.log")
    lock = tmp_path / "p.db.lock"
    _wait_for(lambda: lock.exists() and f"pid {proc.pid} " in lock.read_text(), proc,
              "no storage lock naming the run")
    before = _finished(db)
    second = subprocess.run([*RINGTUNE, "tune", "--out", str(out), *TUNE_ARGS],
                            env=_env(mark), capture_output=True, text=True, timeout=60)
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "in use by another ringtune tune" in lines[0], second.stderr
    assert f"pid {proc.pid} " in lines[0], second.stderr
    code = _ended(proc, mark, timeout=120)
    log = (tmp_path / "run.log").read_text(errors="replace")
    assert code == 0, log
    assert _left_behind(mark) == []
    assert out.read_bytes() != old and "wrote " + str(out) in log
    res = subprocess.run([*RINGTUNE, "validate", str(out)], env=_env(mark),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert _temporaries(tmp_path) == [] and _integrity(db) == "ok"
    assert not lock.exists(), "a run that ended left its lock file"
    trials = _trials(db)
    assert before <= _finished(db), "the refused second run disturbed the first"
    assert not [t for t in trials if t[2] == "RUNNING"]
    # Every configuration ended up measured; each kill lost at most its trial in flight.
    assert len({(s, k) for s, _, st, k, _ in trials if st in ("COMPLETE", "PRUNED")}) == \
        _configs()
    assert sum(1 for t in trials if t[4]) <= len(KILLS)


BENCH_ARGS = ["bench", "-np", "2", "--algo", "sleep", "--param", "seconds=60", "-b", "8",
              "-e", "8", "-n", "1", "-w", "0"]


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGHUP", "SIGKILL", "rank 1 SIGKILL"])
def test_bench_stopped(tmp_path: Path, how: str) -> None:
    mark = uuid.uuid4().hex
    rows = tmp_path / "rows.json"
    log = tmp_path / "bench.log"
    proc = _start([*BENCH_ARGS, "--json", str(rows)], mark, log)
    # The header is printed just before the (sleeping) first size.
    _wait_for(lambda: "# ringtune bench:" in log.read_text(errors="replace")
              and len(_marked(mark, 1)) == 1, proc, "no bench header")
    if how.startswith("rank"):
        os.kill(_marked(mark, 1)[0], signal.SIGKILL)
    else:
        os.kill(proc.pid, getattr(signal, how))
    code = _ended(proc, mark)
    assert code != 0, log.read_text()
    if how in ("SIGTERM", "SIGINT", "SIGHUP"):
        assert code == 128 + getattr(signal, how)
        _says_it_stopped(log.read_text(errors="replace"), how)
    assert _left_behind(mark, within=3.0 if how != "SIGKILL" else 10.0) == []
    assert [f.name for f in tmp_path.iterdir()] == ["bench.log"]


@pytest.mark.skipif(shutil.which("nohup") is None, reason="no nohup here")
def test_an_ignored_sighup_stays_ignored(tmp_path: Path) -> None:
    """Under ``nohup`` a hangup must not stop the job: the launcher forwards only the
    signals it was not told to ignore."""
    mark = uuid.uuid4().hex
    log = tmp_path / "bench.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(["nohup", *RINGTUNE, *BENCH_ARGS[:6], "seconds=3",
                                 *BENCH_ARGS[7:]], env=_env(mark), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=tmp_path, **SIGNALLED_CHILD)
    _wait_for(lambda: "# ringtune bench:" in log.read_text(errors="replace"), proc,
              "no bench header")
    os.kill(proc.pid, signal.SIGHUP)
    code = _ended(proc, mark, timeout=60)
    assert code == 0, log.read_text()
    assert "# Out of bounds values : 0 OK" in log.read_text()
    assert _left_behind(mark) == []
