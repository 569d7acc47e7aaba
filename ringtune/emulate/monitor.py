"""Which emulated host failed first: a thread that watches each host's rank processes
while the command runs.

When a host's ranks are killed (the host "crashed") or one of them fails, neither Hydra's
message nor MPI's names the host reliably. The monitor remembers on which host a rank
process ended first, so ``ringtune emulate`` can name that host and its ranks when the
command fails. A scan of ``/proc`` every ``rescan`` seconds finds the hosts' processes; the
kernel's process connector (netlink) queues every exit in order, so the first is known
even when this thread gets a core only after Hydra has killed the other hosts.
"""

from __future__ import annotations

import errno
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


#: The process that starts a host's ranks, by its ``comm``: Hydra's proxy (mpiexec) or the
#: torchrun agent (``ringtune emulate --launcher torchrun``; torch renames its process
#: ``pt_elastic``).
RANK_PARENTS = (b"hydra_pmi_proxy", b"torchrun", b"pt_elastic")


def _is_rank(pid: int, parents: tuple[bytes, ...] = RANK_PARENTS) -> bool:
    """A rank: a process a launcher (``parents``) started (not the launcher itself, not
    what a rank started)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        with open(f"/proc/{ppid}/comm", "rb") as f:
            return f.read().strip() in parents
    except (OSError, IndexError, ValueError):
        return False


def rank_of(pid: int) -> int | None:
    """The world rank the launcher gave process ``pid`` (``PMI_RANK`` from Hydra, ``RANK``
    from torchrun), from its environment; ``None`` when unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return None
    for name in (b"PMI_RANK", b"RANK"):
        if env.get(name, b"").isdigit():
            return int(env[name])
    return None


def pids_by_namespace(inodes: dict[int, int]) -> list[set[int]]:
    """The ranks' process ids per host index, for namespace inode -> host index
    ``inodes``."""
    found: list[set[int]] = [set() for _ in inodes]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ino = os.stat(f"/proc/{entry}/ns/net").st_ino
        except OSError:
            continue  # gone, or not ours to read
        host = inodes.get(ino)
        if host is not None and _alive(int(entry)) and _is_rank(int(entry)):
            found[host].add(int(entry))
    return found


class HostMonitor:
    """Start with ``start()`` once the command runs; ``stop()`` before teardown; then
    ``first_lost`` is the host where a rank process ended first (``None``: none ended)."""

    def __init__(self, hosts: Sequence[Host], interval: float = 0.05,
                 rescan: float = 0.2) -> None:
        self.hosts = list(hosts)
        self.interval = interval
        self.rescan = rescan
        self.first_lost: Host | None = None
        #: The world rank of the process that ended first, when its environment said.
        self.first_rank: int | None = None
        self._ranks: dict[int, int | None] = {}
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
            while True:
                # Once stopped, read what is queued one last time: the job may have ended
                # while this thread was scanning, with the decisive exits still unread.
                last = self._stop.is_set()
                if not last and time.monotonic() >= next_scan:
                    # Exits are read in the kernel's order, however late this thread runs.
                    for i, pids in enumerate(pids_by_namespace(self._inodes)):
                        for pid in pids - known[i]:
                            self._ranks[pid] = rank_of(pid)
                        known[i] |= pids
                    seen = [s or bool(k) for s, k in zip(seen, known)]
                    next_scan = time.monotonic() + self.rescan
                for pid in _read_exits(events, 0.0 if last else self.interval):
                    host = next((i for i, k in enumerate(known) if pid in k), None)
                    if host is not None and all(seen):
                        # The first rank to end: a killed host's (a SIGKILLed process may
                        # take a while to finish exiting, so "all ended" would come late),
                        # or the rank that failed and made Hydra end the others.
                        self.first_lost = self.hosts[host]
                        self.first_rank = self._ranks.get(pid)
                        self.lost_at = time.monotonic()
                        return
                if last:
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
        # Every process event of the machine arrives here (forks and execs of other work
        # too): a large buffer, so a busy machine does not overflow it before we read.
        try:
            sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
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
    sock.settimeout(timeout if timeout > 0 else 0)
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
    except OSError as exc:
        if exc.errno != errno.ENOBUFS:
            raise
        # Events were dropped: the order is no longer known for sure, keep reading.
    return out
