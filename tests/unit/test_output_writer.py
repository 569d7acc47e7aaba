"""The one output writer (safefiles/outfile.py, collectives/plumbing/atomic.py): what each
kind of path becomes, and that nothing replaces a device node or a symlink (issue 35).

Each case uses a private path under ``tmp_path``: a device node is made with ``mknod``
(``c 1 3``, the null device's numbers; root only, else skipped with the reason), never the
system's ``/dev/null``. A FIFO is read by a thread of this process; without a reader the
wait is bounded (``FIFO_WAIT_S`` shortened).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest

import safefiles.outfile as outfile
from collectives.plumbing.atomic import atomic_path, write_text_atomic
from safefiles.outfile import OutputError, check_output, write_text

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False
needs_root = pytest.mark.skipif(not ROOT, reason="mknod of a device node needs root")


def _device(tmp_path: Path, name: str = "null") -> Path:
    node = tmp_path / name
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return node


def _no_temporaries(folder: Path) -> None:
    assert not [p for p in folder.iterdir() if ".tmp" in p.name], list(folder.iterdir())


def test_missing_path_is_created(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    assert write_text_atomic(out, "a: 1\n") == str(out)
    assert out.read_text() == "a: 1\n"
    _no_temporaries(tmp_path)


def test_regular_file_is_replaced_whole(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    out.write_text("old\n")
    inode = out.stat().st_ino
    write_text(out, "new\n", "--out")
    assert out.read_text() == "new\n"
    assert out.stat().st_ino != inode  # renamed over, not rewritten in place
    _no_temporaries(tmp_path)


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    out.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_path(out) as tmp:
        Path(tmp).write_text("half")
        raise RuntimeError("the writer failed")
    assert out.read_text() == "old\n"
    _no_temporaries(tmp_path)


def test_symlink_to_a_regular_file_replaces_the_target_and_keeps_the_link(tmp_path: Path
                                                                          ) -> None:
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = real_dir / "t.yaml"
    target.write_text("old\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    write_text_atomic(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"
    _no_temporaries(real_dir)
    _no_temporaries(tmp_path)


@needs_root
def test_device_node_is_written_through_not_replaced(tmp_path: Path) -> None:
    node = _device(tmp_path)
    before = os.stat(node)
    write_text_atomic(node, "into the null device\n")
    after = os.lstat(node)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert after.st_ino == before.st_ino
    _no_temporaries(tmp_path)


@needs_root
def test_symlink_to_a_device_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    node = _device(tmp_path)
    link = tmp_path / "stdout"
    link.symlink_to(node)
    with atomic_path(link) as tmp:  # the savefig-style writer
        Path(tmp).write_bytes(b"x" * 100_000)
    assert link.is_symlink() and os.readlink(link) == str(node)
    assert stat.S_ISCHR(os.lstat(node).st_mode)


def test_fifo_with_a_reader_gets_the_bytes(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as fh:
            got.append(fh.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    text = "line\n" * 50_000  # more than a pipe holds: the writer waits for room
    write_text_atomic(fifo, text)
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert got == [text.encode()]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    _no_temporaries(tmp_path)


def test_fifo_without_a_reader_is_one_line_within_the_wait(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setattr(outfile, "FIFO_WAIT_S", 0.3)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(OutputError, match=r"--json .*pipe: a FIFO with no reader for 0.3 s; "
                                          "start the reader first") as info:
        write_text(fifo, "x\n", "--json")
    assert time.monotonic() - start < 10
    assert "\n" not in str(info.value)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    _no_temporaries(tmp_path)


def test_fifo_whose_reader_stops_reading_is_one_line(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outfile, "FIFO_WAIT_S", 0.3)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # A reader that opens and never reads: the pipe fills, the wait for room is bounded.
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(OutputError, match="the reader took nothing for 0.3 s"):
            write_text(fifo, "x" * (4 << 20), "--out")
    finally:
        os.close(fd)


@pytest.mark.parametrize("case", ["directory", "dangling link", "link loop", "missing folder",
                                  "not a folder", "socket", "empty"])
def test_what_cannot_hold_output_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    path: Path | str = tmp_path / "x"
    if case == "directory":
        (tmp_path / "x").mkdir()
        needle = "is a directory"
    elif case == "dangling link":
        (tmp_path / "x").symlink_to(tmp_path / "nowhere")
        needle = "which does not exist; remove the link"
    elif case == "link loop":
        (tmp_path / "x").symlink_to(tmp_path / "y")
        (tmp_path / "y").symlink_to(tmp_path / "x")
        needle = "a loop of symbolic links"
    elif case == "missing folder":
        path = tmp_path / "no" / "such" / "x.yaml"
        needle = "does not exist; create it first"
    elif case == "not a folder":
        (tmp_path / "f").write_text("")
        path = tmp_path / "f" / "x.yaml"
        needle = "not a folder"
    elif case == "socket":
        import socket

        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(tmp_path / "x"))
        sock.close()
        needle = "socket"
    else:
        path = ""  # Path("") would be "."
        needle = "empty path"
    before = sorted(p.name for p in tmp_path.iterdir())
    for call in (lambda: check_output(path, "--out"),
                 lambda: write_text_atomic(path, "x\n", "--out")):
        with pytest.raises(OutputError) as info:
            call()
        line = str(info.value)
        assert needle in line and "\n" not in line and line.startswith("--out"), line
        assert isinstance(info.value, ValueError) and isinstance(info.value, OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created
    if case == "dangling link":
        assert (tmp_path / "x").is_symlink()


def test_unwritable_place_is_refused_in_one_line() -> None:
    """Root passes permission checks, so the unwritable place is one the kernel refuses
    for everyone: a read-only file system (/sys, in most containers and hosts) or /proc,
    where no file can be created."""
    for folder in ("/proc/self", "/sys/kernel"):
        if os.path.isdir(folder):
            break
    else:
        pytest.skip("neither /proc nor /sys here")
    path = os.path.join(folder, "ringtune-out.yaml")
    with pytest.raises(OutputError) as info:
        write_text_atomic(path, "x\n", "--out")
    line = str(info.value)
    assert line.startswith(f"--out {path}: ") and "writable" in line and "\n" not in line
    assert not os.path.exists(path)


@pytest.mark.skipif(ROOT, reason="root writes through a chmod'ed folder's permissions")
def test_folder_without_write_permission_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(OutputError, match="is not writable; choose a writable place"):
            write_text_atomic(folder / "x.yaml", "x\n")
    finally:
        folder.chmod(0o700)


@pytest.mark.skipif(ROOT, reason="root may write a read-only file")
def test_read_only_file_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    out.write_text("keep\n")
    out.chmod(0o444)
    with pytest.raises(OutputError, match="read-only; make it writable"):
        write_text_atomic(out, "x\n")
    assert out.read_text() == "keep\n"


def test_online_tuning_lock_sits_beside_the_target_and_never_in_dev(tmp_path: Path) -> None:
    """RINGTUNE_TUNE_OUT's lock (collectives/online/lock.py): beside a link's target, so two
    links to one file share it; none for a FIFO or device, which are written through."""
    from collectives.online.lock import TuneOutLock

    real_dir = tmp_path / "real"
    real_dir.mkdir()
    link = tmp_path / "link.yaml"
    link.symlink_to(real_dir / "p.yaml")
    (real_dir / "p.yaml").write_text("x\n")
    lock = TuneOutLock(str(link))
    lock.acquire()
    try:
        assert (real_dir / "p.yaml.lock").exists() and not (tmp_path / "link.yaml.lock").exists()
        with pytest.raises(ValueError, match="is being written by another job"):
            TuneOutLock(str(real_dir / "p.yaml")).acquire()
    finally:
        lock.release()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    through = TuneOutLock(str(fifo))
    through.acquire()
    through.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.yaml", "pipe", "real"]
