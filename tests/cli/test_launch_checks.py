"""Launch sizes (``-np``), the one-line usage errors of the CLI, and the study-storage lock,
checked without launching any rank."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from autotune.records import TuneError
from autotune.storelock import StorageLock, lock_path
from ringtune.errors import UsageError
from ringtune.launch import OVERSUBSCRIBE_FACTOR, check_ranks, usable_cores

RINGTUNE = [sys.executable, "-m", "ringtune.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_", "MV2_", "SLURM_"))}
    env.pop("RINGTUNE_LAUNCHED", None)
    env.update(extra)
    return env


def _one_line(args: list[str], **env: str) -> str:
    res = subprocess.run([*RINGTUNE, *args], env=_env(**env), capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("ringtune: error: ") and lines[0].count("ringtune:") == 1, \
        lines[0]
    return lines[0]


TOO_MANY = str(usable_cores() * OVERSUBSCRIBE_FACTOR + 1)


@pytest.mark.parametrize("verb", [["tune", "--out", "unused.yaml"], ["bench", "-b", "8",
                                                                      "-e", "8"]])
@pytest.mark.parametrize("np, needle", [("0", "give at least 1 rank"),
                                        ("-1", "give at least 1 rank"),
                                        (TOO_MANY, "--oversubscribe")])
def test_bad_np_is_refused_before_launching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            verb: list[str], np: str, needle: str) -> None:
    monkeypatch.chdir(tmp_path)
    line = _one_line([*verb, "-np", np])
    assert f"-np {np}:" in line and needle in line
    assert list(tmp_path.iterdir()) == [], "nothing may be created for a refused command"


def test_np_limit_names_the_cores_and_oversubscribe_lifts_it() -> None:
    cores = usable_cores()
    limit = cores * OVERSUBSCRIBE_FACTOR
    check_ranks(limit)
    check_ranks(limit + 1, oversubscribe=True)
    with pytest.raises(UsageError, match=f"{cores} usable core.*at most {limit} ranks"):
        check_ranks(limit + 1)
    with pytest.raises(UsageError, match="at least 1"):
        check_ranks(0, oversubscribe=True)
    with pytest.raises(UsageError, match="^p.yaml: topology.world_size 1000"):
        check_ranks(1000, what="p.yaml: topology.world_size 1000")


def test_np_that_contradicts_an_outside_mpiexec_is_refused(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Under someone else's mpiexec, -np launches nothing: a different count is a mistake,
    not something to ignore (read from the launcher's environment, without MPI)."""
    line = _one_line(["bench", "-np", "3", "-b", "8", "-e", "8"], PMI_RANK="0", PMI_SIZE="2")
    assert "started by mpiexec with 2 ranks" in line
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.delenv("RINGTUNE_LAUNCHED", raising=False)
    check_ranks(2)
    check_ranks(None)


def test_usage_errors_print_the_prefix_once() -> None:
    line = _one_line(["bench", "--no-such-flag"])
    assert "`ringtune bench` has no flag --no-such-flag" in line
    assert "`ringtune bench --help`" in line
    line = _one_line(["tune", "--trials", "many"])
    assert "--trials: invalid int value: 'many'" in line and "`ringtune tune --help`" in line


@pytest.mark.parametrize("url, expect", [
    ("sqlite:///rel/p.db", os.path.join(os.getcwd(), "rel", "p.db.lock")),
    ("sqlite:////abs/dir/p.db", "/abs/dir/p.db.lock"),
    ("sqlite://", None),
    ("sqlite:///:memory:", None),
    ("sqlite:///file:x?mode=memory&uri=true", None),
    ("postgresql://user@host/db", None),
    ("nosuchdb://x", None),
])
def test_lock_path(url: str, expect: str | None) -> None:
    assert lock_path(url) == expect


def test_storage_lock_refuses_names_the_holder_waits_and_cleans_up(tmp_path: Path) -> None:
    path = str(tmp_path / "p.db.lock")
    url = "sqlite:///" + str(tmp_path / "p.db")
    first = StorageLock.acquire(path, url)
    # flock is per open file: a second acquisition in this process conflicts like another
    # process's would.
    with pytest.raises(TuneError) as info:
        StorageLock.acquire(path, url)
    assert info.value.usage and f"pid {os.getpid()} " in str(info.value)
    assert "--wait" in str(info.value) and url in str(info.value)
    released = threading.Event()

    def release_first() -> None:
        released.set()
        first.release()

    threading.Timer(0.3, release_first).start()
    second = StorageLock.acquire(path, url, wait=True)  # returns once the first is released
    assert released.is_set()
    assert os.path.exists(path) and f"pid {os.getpid()} " in Path(path).read_text()
    second.release()
    assert not os.path.exists(path)


def test_storage_lock_waits_up_to_its_seconds(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``tune --wait SECONDS``: waits that long for the holder, then refuses saying so;
    released within them, it takes the lock."""
    path = str(tmp_path / "p.db.lock")
    url = "sqlite:///" + str(tmp_path / "p.db")
    first = StorageLock.acquire(path, url)
    with pytest.raises(TuneError, match=r"after waiting 0\.2 s: .*--wait \[SECONDS\]"):
        StorageLock.acquire(path, url, wait=0.2)
    assert "waiting up to 0.2 s for the run holding" in capsys.readouterr().err
    threading.Timer(0.2, first.release).start()
    second = StorageLock.acquire(path, url, wait=30.0)  # returns once the first is released
    second.release()


def test_a_stale_lock_file_does_not_block(tmp_path: Path) -> None:
    """A killed run leaves its lock file, but not its lock: the next run takes it."""
    path = tmp_path / "p.db.lock"
    path.write_text("pid 999999 on elsewhere since long ago\n")
    held = StorageLock.acquire(str(path), "sqlite:///p.db")
    assert "999999" not in path.read_text()
    held.release()
    assert not path.exists()


def test_storage_in_a_missing_folder_is_refused_once(tmp_path: Path) -> None:
    """The lock file cannot be made where the database cannot be either: exit 2, one
    line from rank 0 (the ranks are launched: the storage is opened under MPI)."""
    url = f"sqlite:///{tmp_path}/missing/p.db"
    res = subprocess.run([*RINGTUNE, "tune", "-np", "2", "--out", str(tmp_path / "p.yaml"),
                          "--buckets", "1K", "--storage", url, "--no-progress"],
                         env=_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("ringtune:")]
    assert len(errors) == 1 and f"--storage {url}: cannot create the lock file" in errors[0]
    assert sorted(f.name for f in tmp_path.iterdir()) == []
