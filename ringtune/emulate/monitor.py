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
from collections.abc import Callable, Sequence

from .netns import Host, ns_inode, process_ns_inode


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


def rank_host(pid: int, inodes: dict[int, int]) -> int | None:
    """The host index of process ``pid`` when it is a running rank in one of the hosts'
    namespaces (namespace inode -> host index ``inodes``), else ``None``. A rank: started
    by a launcher, with its world rank in its environment (a launcher's other children,
    short-lived helpers a torchrun agent runs, have none)."""
    ino = process_ns_inode(pid)
    host = inodes.get(ino) if ino is not None else None  # None: gone, or not ours to read
    if host is None or not _alive(pid) or not _is_rank(pid) or rank_of(pid) is None:
        return None
    return host


def pids_by_namespace(inodes: dict[int, int]) -> list[set[int]]:
    """The ranks' process ids per host index, for namespace inode -> host index
    ``inodes``."""
    found: list[set[int]] = [set() for _ in inodes]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            host = rank_host(int(entry), inodes)
            if host is not None:
                found[host].add(int(entry))
    return found


class HostMonitor:
    """Start with ``start()`` once the command runs; ``stop()`` before teardown; then
    ``first_lost`` is the host where a rank process ended first (``None``: none ended, or
    not known: ``why`` says why)."""

    #: How long ``stop()`` waits for the thread to read what is queued (a loaded machine
    #: may give it a core late; it only waits that long when the thread is still busy).
    STOP_WAIT_S = 5.0

    def __init__(self, hosts: Sequence[Host], interval: float = 0.05,
                 rescan: float = 0.2) -> None:
        self.hosts = list(hosts)
        self.interval = interval
        self.rescan = rescan
        self.first_lost: Host | None = None
        #: The world rank of the process that ended first, when its environment said.
        self.first_rank: int | None = None
        self.lost_at: float | None = None
        #: Why ``first_lost`` is ``None`` after ``stop()`` (``""``: no rank ended).
        self.why = ""
        self._order = ExitOrder(len(self.hosts))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="emulate-monitor",
                                        daemon=True)
        self._inodes = {ns_inode(h.namespace): h.index for h in self.hosts}

    def start(self) -> None:
        if len(self.hosts) > 1:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.STOP_WAIT_S)
            if self._thread.is_alive() and self.first_lost is None and not self.why:
                self.why = (f"the monitor had not read the process exits {self.STOP_WAIT_S:g} s "
                            "after the command ended (machine overloaded?)")

    def _learn(self, pid: int) -> None:
        """A process that just ran ``exec``: a rank of one of the hosts? Learnt at once,
        so a rank that ends before the next scan is still known."""
        host = rank_host(pid, self._inodes)
        if host is not None:
            self._order.add(host, pid)

    def _loop(self) -> None:
        try:
            events = _process_events()
        except OSError as exc:
            # Not root, an old kernel: the failure line lists the hosts.
            self.why = f"no process events from the kernel ({exc.strerror or exc})"
            return
        next_scan = 0.0
        try:
            while self._order.first is None:
                # Once stopped, read what is queued one last time: the job may have ended
                # while this thread was scanning, with the decisive exits still unread.
                last = self._stop.is_set()
                if not last and time.monotonic() >= next_scan:
                    for i, pids in enumerate(pids_by_namespace(self._inodes)):
                        for pid in pids:
                            self._order.add(i, pid)
                    # Until every host's ranks are found, look again soon.
                    next_scan = time.monotonic() + (
                        self.rescan if self._order.all_seen else self.interval)
                read, lost = _read_events(events, 0.0 if last else self.interval)
                for what, pid, status in read:
                    if what == _PROC_EVENT_EXEC:
                        self._learn(pid)
                    elif self._order.ended(pid, failed=status != 0):
                        break
                if lost and self._order.first is None:
                    self._order.dropped(_alive)
                if last:
                    break
        finally:
            events.close()
        if self._order.first is not None:
            host, pid = self._order.first
            self.first_lost = self.hosts[host]
            self.first_rank = self._order.ranks.get(pid)
            self.lost_at = time.monotonic()
        else:
            self.why = self._order.why([h.hostname for h in self.hosts], _alive)


class ExitOrder:
    """Which host's rank process ended first, from process exits in the kernel's order.

    A rank is ``add``-ed when found (a scan, or its ``exec``); ``ended(pid, failed)`` for
    each exit in order. The first failed exit (a status other than 0, or a signal) of a
    known rank decides, once every host's ranks have been found: an exit of a host not yet
    found could not be told from another process's. A rank that ends with 0 (done early,
    as a job's ranks do at different moments) decides nothing."""

    def __init__(self, hosts: int) -> None:
        self.known: list[set[int]] = [set() for _ in range(hosts)]
        self.ranks: dict[int, int | None] = {}
        #: (host index, pid) of the first rank to end, once decided.
        self.first: tuple[int, int] | None = None
        #: The kernel dropped process events (its queue was full): the order may be wrong.
        self.lost = False
        #: Ranks that ended with status 0.
        self.clean: set[int] = set()

    @property
    def all_seen(self) -> bool:
        return all(self.known)

    def add(self, host: int, pid: int, rank: int | None = None) -> None:
        """Rank process ``pid`` runs on ``host`` (its world ``rank``: read from its
        environment when not given)."""
        if pid not in self.known[host]:
            self.known[host].add(pid)
            self.ranks[pid] = rank if rank is not None else rank_of(pid)

    def ended(self, pid: int, failed: bool = True) -> bool:
        """Process ``pid`` exited (``failed``: not with status 0); ``True`` once the first
        rank to fail is known."""
        host = next((i for i, k in enumerate(self.known) if pid in k), None)
        if host is None:
            return False
        if not failed:
            self.clean.add(pid)
            return False
        if not self.all_seen or self.lost:
            return False
        self.first = (host, pid)
        return True

    def dropped(self, alive: Callable[[int], bool]) -> None:
        """The kernel dropped events, perhaps a rank's exit: rank processes no longer
        ``alive`` ended unread. None: nothing that matters was lost. All on one host (every
        host's ranks found): that host's ended first. Else the order is lost."""
        gone = [(i, pid) for i, k in enumerate(self.known) for pid in sorted(k - self.clean)
                if not alive(pid)]
        if not gone:
            return
        if len({i for i, _ in gone}) == 1 and self.all_seen:
            self.first = gone[0]
        else:
            self.lost = True

    def why(self, names: Sequence[str], alive: Callable[[int], bool]) -> str:
        """Why no host was named (``""``: no rank ended while watched); ``alive`` tells
        the rank processes still running."""
        if not self.all_seen:
            unseen = [n for n, k in zip(names, self.known) if not k]
            return f"the ranks of {', '.join(unseen)} were never seen running"
        if self.lost:
            return "the kernel dropped process events"
        gone = [pid for k in self.known for pid in sorted(k - self.clean) if not alive(pid)]
        if gone:
            return (f"no exit event arrived for rank process(es) {', '.join(map(str, gone))}"
                    " (a kernel or container that hides process events?)")
        return ""


# -- the kernel's process connector: one event per process exec and exit, queued in order --

_NETLINK_CONNECTOR, _CN_IDX_PROC, _CN_VAL_PROC = 11, 1, 1
_PROC_CN_MCAST_LISTEN = 1
_PROC_EVENT_EXEC, _PROC_EVENT_EXIT = 0x00000002, 0x80000000


def _process_events() -> socket.socket:
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


def _read_events(sock: socket.socket,
                 timeout: float) -> tuple[list[tuple[int, int, int]], bool]:
    """(event, process id, wait status: 0 for an exec) of the execs and exits (of
    thread-group leaders) queued, in order, waiting up to ``timeout`` for the first; and
    whether the kernel dropped some (its queue for this socket was full: ``ENOBUFS``)."""
    sock.settimeout(timeout if timeout > 0 else 0)
    out: list[tuple[int, int, int]] = []
    lost = False
    while True:
        try:
            data = sock.recv(65536)
        except (TimeoutError, BlockingIOError, InterruptedError):
            return out, lost
        except OSError as exc:
            if exc.errno != errno.ENOBUFS:
                raise
            lost = True  # reported once; what is still queued is read on
            sock.settimeout(0)
            continue
        sock.settimeout(0)  # drain what is queued, then return
        # nlmsghdr (16) + cn_msg (20) + proc_event: what, cpu, timestamp, then for an exec
        # pid, tgid; for an exit pid, tgid, exit_code (the wait status), exit_signal, …
        if len(data) >= 16 + 20 + 28:
            what, _cpu, _ts, pid, tgid, status = struct.unpack_from("=IIQIII", data, 36)
            if what == _PROC_EVENT_EXEC and pid == tgid:
                out.append((what, pid, 0))
            elif what == _PROC_EVENT_EXIT and pid == tgid:
                out.append((what, pid, status))
