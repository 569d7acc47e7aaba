"""``ringtune tune`` when the Optuna storage cannot grow: the run ends with exit 2 and one
line that names the storage file, the cause and the free space, and the profile written by
an earlier run is left as it was (issue 14, item 12).

Two ways to make the storage "full" mid-tune, both real SQLite failures under a real tune
(``mpiexec -n 2``): SQLite's ``PRAGMA max_page_count`` set on every connection of the ranks
(a ``sitecustomize`` on their ``PYTHONPATH``; runs anywhere), and, where this process may
make a private mount namespace (root, ``unshare -m``), the storage on a tmpfs just large
enough for what is already stored: a genuinely full disk, ``ENOSPC``. The namespace ends
with the command, so nothing stays mounted.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

RINGTUNE = [sys.executable, "-m", "ringtune.cli"]
#: Small and quick: the first run stores a few trials; the second adds a bucket, so it must
#: create a study and trials, which need new database pages.
FIRST = ["--buckets", "1K", "--trials", "3", "--algorithms", "native,rhd", "--no-progress"]
SECOND = ["--buckets", "1K,64K", "--trials", "20", "--algorithms", "native,rhd",
          "--no-progress"]

SITECUSTOMIZE = '''\
import os
_pages = os.environ.get("RINGTUNE_TEST_MAX_PAGES")
if _pages:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _limit(dbapi_conn, record):  # every connection of this process, as SQLite allows
        dbapi_conn.execute(f"PRAGMA max_page_count = {int(_pages)}")
'''


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_"))}
    env.pop("RINGTUNE_LAUNCHED", None)
    env.update(extra)
    return env


def _pages(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        return int(con.execute("PRAGMA page_count").fetchone()[0])
    finally:
        con.close()


def _intact(db: Path) -> int:
    """The storage passes SQLite's integrity check; returns its number of trials."""
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return int(con.execute("SELECT COUNT(*) FROM trials").fetchone()[0])
    finally:
        con.close()


@pytest.fixture()
def tuned(tmp_path: Path) -> tuple[Path, Path, bytes, int]:
    """A finished small tune: (profile, storage, profile bytes, trials stored)."""
    out, db = tmp_path / "p.yaml", tmp_path / "p.db"
    res = subprocess.run([*RINGTUNE, "tune", "-np", "2", "--out", str(out), *FIRST],
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return out, db, out.read_bytes(), _intact(db)


def _check_refusal(res: subprocess.CompletedProcess[str], db: Path, cause: str) -> str:
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    line = lines[0]
    assert line.startswith("ringtune: error: cannot write the Optuna storage file "
                           f"{db}:"), line
    assert cause in line, line
    assert "MiB free on its file system" in line and "--storage" in line, line
    assert "Traceback" not in res.stderr and "StorageInternalError" not in res.stderr
    return line


def test_size_limit_of_the_database(tuned: tuple[Path, Path, bytes, int],
                                    tmp_path: Path) -> None:
    out, db, before, trials = tuned
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    res = subprocess.run([*RINGTUNE, "tune", "-np", "2", "--out", str(out), *SECOND],
                         env=_env(PYTHONPATH=path, RINGTUNE_TEST_MAX_PAGES=str(_pages(db))),
                         capture_output=True, text=True, timeout=300)
    # Plenty of disk here, so it says that a limit was reached rather than "disk full".
    _check_refusal(res, db, "the database reached a size limit")
    assert out.read_bytes() == before  # the old profile, untouched
    assert _intact(db) >= trials  # nothing stored before is lost
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not _can_mount(), reason="needs root and unshare -m for a private tmpfs")
def test_full_disk_under_the_storage(tuned: tuple[Path, Path, bytes, int],
                                     tmp_path: Path) -> None:
    out, db, before, trials = tuned
    mnt = tmp_path / "small"
    mnt.mkdir()
    full_db = mnt / "p.db"
    # A tmpfs that holds the stored database and 8 KiB more: the second run's new study and
    # trials (and SQLite's journal) do not fit.
    size = db.stat().st_size + (8 << 10)
    tune = [*RINGTUNE, "tune", "-np", "2", "--out", str(out), "--storage",
            f"sqlite:///{full_db}", *SECOND]
    script = (f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(mnt))} && "
              f"cp {shlex.quote(str(db))} {shlex.quote(str(full_db))} && "
              f"{shlex.join(tune)}; rc=$?; "
              f"cp {shlex.quote(str(full_db))} {shlex.quote(str(tmp_path / 'after.db'))}; "
              f"umount {shlex.quote(str(mnt))}; exit $rc")
    res = subprocess.run(["unshare", "-m", "sh", "-c", script], env=_env(),
                         capture_output=True, text=True, timeout=300)
    line = _check_refusal(res, full_db, "the disk is full")
    assert " 0 MiB free" in line, line
    assert out.read_bytes() == before
    assert _intact(tmp_path / "after.db") >= trials
    assert not os.listdir(mnt)  # unmounted with the namespace: the empty folder again
