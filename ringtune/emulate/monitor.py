"""Which emulated host failed first: a thread that counts the processes of each host's
namespace while the command runs.

When one host's processes all vanish while the others' still run (its ranks were killed, the
host "crashed"), Hydra's message may name no host at all (when the proxy died too). The
monitor remembers which host emptied first, so ``ringtune emulate`` can name it and its
ranks when the command fails. Reads ``/proc`` only (no subprocess): cheap at 4 Hz.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Sequence

from .netns import Host


def _ns_inode(namespace: str) -> int:
    return os.stat(f"/run/netns/{namespace}").st_ino


def _alive(pid: int) -> bool:
    """Running, not a zombie (a killed process stays one until its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def pids_by_namespace(inodes: dict[int, int]) -> list[set[int]]:
    """Process ids per host index, for namespace inode -> host index ``inodes``."""
    found: list[set[int]] = [set() for _ in inodes]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ino = os.stat(f"/proc/{entry}/ns/net").st_ino
        except OSError:
            continue  # gone, or not ours to read
        host = inodes.get(ino)
        if host is not None and _alive(int(entry)):
            found[host].add(int(entry))
    return found


class HostMonitor:
    """Start with ``start()`` once the command runs; ``stop()`` before teardown; then
    ``first_lost`` is the host whose processes all ended while another host's still ran."""

    def __init__(self, hosts: Sequence[Host], interval: float = 0.1,
                 rescan: float = 0.5) -> None:
        self.hosts = list(hosts)
        self.interval = interval
        self.rescan = rescan
        self.first_lost: Host | None = None
        self.lost_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="emulate-monitor",
                                        daemon=True)
        self._inodes = {_ns_inode(h.namespace): h.index for h in self.hosts}

    def start(self) -> None:
        if len(self.hosts) > 1:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _loop(self) -> None:
        # One pidfd per known process: poll() wakes the moment any of them exits, before
        # Hydra (which learns it from a closed socket) has killed the other hosts'.
        fds: dict[int, tuple[int, int]] = {}  # fd -> (host, pid)
        poller = select.poll()
        seen = [False] * len(self.hosts)
        try:
            while not self._stop.is_set():
                for host, pids in enumerate(pids_by_namespace(self._inodes)):
                    for pid in pids - {p for _, p in fds.values()}:
                        try:
                            fd = os.pidfd_open(pid)
                        except OSError:
                            continue
                        fds[fd] = (host, pid)
                        poller.register(fd, select.POLLIN)
                deadline = time.monotonic() + self.rescan
                while not self._stop.is_set() and time.monotonic() < deadline:
                    if not poller.poll(self.interval * 1000):
                        continue
                    counts = [0] * len(self.hosts)
                    for _fd, (host, pid) in fds.items():
                        counts[host] += _alive(pid)
                    seen = [s or c > 0 for s, c in zip(seen, counts)]
                    empty = [i for i, c in enumerate(counts) if c == 0]
                    if all(seen) and empty and len(empty) < len(counts):
                        self.first_lost = self.hosts[empty[0]]
                        self.lost_at = time.monotonic()
                        return
                    for fd in [f for f, (_, pid) in fds.items() if not _alive(pid)]:
                        poller.unregister(fd)
                        os.close(fd)
                        del fds[fd]
                    if not fds:
                        break
        finally:
            for fd in fds:
                os.close(fd)
