"""Which emulated host failed first: a thread that counts the processes of each host's
namespace while the command runs.

When one host's processes all vanish while the others' still run (its ranks were killed, the
host "crashed"), Hydra's message may name no host at all (when the proxy died too). The
monitor remembers which host emptied first, so ``ringtune emulate`` can name it and its
ranks when the command fails. Reads ``/proc`` only (no subprocess): cheap at 4 Hz.
"""

from __future__ import annotations

import os
import socket
import struct
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

    def __init__(self, hosts: Sequence[Host], interval: float = 0.05,
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
        try:
            events = _exit_events()
        except OSError:
            return  # no proc connector (not root, old kernel): the failure line lists hosts
        known: list[set[int]] = [set() for _ in self.hosts]
        seen = [False] * len(self.hosts)
        next_scan = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() >= next_scan:
                    # Only ever add: a process leaves ``known`` by its exit event, in the
                    # kernel's order, however late this thread gets to read it.
                    for host, pids in enumerate(pids_by_namespace(self._inodes)):
                        known[host] |= pids
                    seen = [s or bool(k) for s, k in zip(seen, known)]
                    next_scan = time.monotonic() + self.rescan
                for pid in _read_exits(events, self.interval):
                    for k in known:
                        k.discard(pid)
                    empty = [i for i, k in enumerate(known) if not k]
                    if all(seen) and empty and len(empty) < len(known):
                        self.first_lost = self.hosts[empty[0]]
                        self.lost_at = time.monotonic()
                        return
        finally:
            events.close()


# -- the kernel's process connector: one event per process exit, queued in order ------------

_NETLINK_CONNECTOR, _CN_IDX_PROC, _CN_VAL_PROC = 11, 1, 1
_PROC_CN_MCAST_LISTEN, _PROC_EVENT_EXIT = 1, 0x80000000


def _exit_events() -> socket.socket:
    """A netlink socket subscribed to process events (needs CAP_NET_ADMIN: root)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_CONNECTOR)
    try:
        sock.bind((0, _CN_IDX_PROC))
        op = struct.pack("=I", _PROC_CN_MCAST_LISTEN)
        cn = struct.pack("=IIIIHH", _CN_IDX_PROC, _CN_VAL_PROC, 0, 0, len(op), 0) + op
        sock.send(struct.pack("=IHHII", 16 + len(cn), 3, 0, 0, os.getpid()) + cn)  # NLMSG_DONE
    except OSError:
        sock.close()
        raise
    return sock


def _read_exits(sock: socket.socket, timeout: float) -> list[int]:
    """Process ids (thread-group leaders) that exited, in order; waits up to ``timeout``."""
    sock.settimeout(timeout)
    out = []
    try:
        while True:
            data = sock.recv(65536)
            sock.settimeout(0)  # drain what is queued, then return
            # nlmsghdr (16) + cn_msg (20) + proc_event: what, cpu, timestamp, pid, tgid, …
            if len(data) >= 16 + 20 + 24:
                what, _cpu, _ts, pid, tgid = struct.unpack_from("=IIQII", data, 36)
                if what == _PROC_EVENT_EXIT and pid == tgid:
                    out.append(pid)
    except (TimeoutError, BlockingIOError, InterruptedError):
        pass
    return out
