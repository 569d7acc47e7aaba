"""Build and remove an emulated cluster's network: namespaces, veth pairs, bridges, shaping.

Use ``Network(spec, run_id).build()`` inside ``run_lock()`` and always ``teardown()`` (it is
idempotent and removes whatever part was built). Layout, every name prefixed
``rtemu-<run_id>-`` so that nothing collides with namespaces of anyone else:

- ``h<i>``: one namespace per host, its ``eth0`` the host's uplink (address ``10.<n>.0.<i+1>``
  in a /16 that no interface on the machine uses);
- ``sw<r>``: the switch of rack ``r`` (one switch when there are no racks), a bridge with
  one port per host; ``core``: with racks, the switch joining the rack uplinks.

Every uplink is shaped in both directions with ``tc … tbf`` (egress on each end of the veth
pair); netem is not assumed (this machine's kernel lacks it), so latency is the veth's own.
All veths live inside the namespaces: deleting the namespaces removes them.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from ringtune.errors import CommandFailed

from .spec import DEFAULT_MTU, EmulatedCluster

PREFIX = "rtemu"
#: Lock file and per-run files (shim, hostfile); /run is a tmpfs, gone at reboot like netns.
STATE_DIR = "/run/ringtune-emulate"
#: ``ip netns exec NS`` bind-mounts ``/etc/netns/NS/hosts`` over ``/etc/hosts``: every host
#: resolves every other's hostname (Hydra and its messages then use hostnames).
ETC_NETNS = "/etc/netns"
_OURS = re.compile(rf"^{PREFIX}-(\d+)-")
_TOOLS = ("ip", "tc", "unshare")


class EmulationUnavailable(Exception):
    """This machine cannot emulate (not root, no netns, missing tools): skip, with the
    reason."""


def preflight() -> None:
    """``EmulationUnavailable`` naming the reason when namespaces cannot be built here."""
    if os.geteuid() != 0:
        raise EmulationUnavailable("needs root (network namespaces and tc); run as root")
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        raise EmulationUnavailable(f"{', '.join(missing)} not found (install iproute2 and "
                                   f"util-linux)")
    if not os.path.exists("/proc/self/ns/net") or not os.path.exists("/proc/self/ns/uts"):
        raise EmulationUnavailable("the kernel has no network/UTS namespaces")
    probe = run_shielded(["ip", "netns", "list"], check=False)
    if probe.returncode != 0:
        raise EmulationUnavailable(f"`ip netns` fails: {probe.stderr.strip()}")


#: The signals that tear an emulation down (``runner.install_signal_handlers`` raises on
#: them); ``run_shielded`` holds them while a set-up command runs.
TEARDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_shielded(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    # The teardown signals are blocked while the command runs and delivered when it has
    # ended: their handlers raise, and an exception raised inside subprocess's wait can
    # leave Popen's internal waitpid lock held, so that Popen.__exit__ then waits on it for
    # ever (seen once in five CI runs: SIGTERM during set-up, emulate hung, its namespace
    # left). The command itself is bounded (30 s) and the signal is handled one step later.
    blocked = threading.current_thread() is threading.main_thread()
    if blocked:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, TEARDOWN_SIGNALS)
    try:
        res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    if check and res.returncode != 0:
        raise CommandFailed(f"emulate: `{' '.join(cmd)}` failed: "
                            f"{(res.stderr or res.stdout).strip()}")
    return res


def namespaces() -> list[str]:
    """Every network namespace on the machine, by name."""
    out = run_shielded(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def ours(names: Sequence[str] | None = None) -> list[str]:
    """The namespaces an emulation made (any run's)."""
    return [n for n in (namespaces() if names is None else names) if _OURS.match(n)]


def used_subnets() -> set[int]:
    """Second octets of every 10.x address on the machine: the root namespace's and every
    other namespace's."""
    texts = [run_shielded(["ip", "-o", "addr"]).stdout]
    for ns in namespaces():
        texts.append(run_shielded(["ip", "-n", ns, "-o", "addr"], check=False).stdout)
    texts.append(run_shielded(["ip", "-o", "route"], check=False).stdout)
    return {int(m) for t in texts for m in re.findall(r"\b10\.(\d{1,3})\.\d{1,3}\.\d{1,3}", t)}


def pick_subnet() -> int:
    """A 10.<n>.0.0/16 in use nowhere on the machine."""
    used = used_subnets()
    for n in (*range(213, 255), *range(100, 213)):
        if n not in used:
            return n
    raise CommandFailed("emulate: every 10.100-254.0.0/16 is in use on this machine")


def ns_inode(namespace: str) -> int:
    """The nsfs inode of namespace ``namespace``: what :func:`process_ns_inode` gives for a
    process inside it, also after its name is deleted."""
    return os.stat(f"/run/netns/{namespace}").st_ino


def process_ns_inode(pid: int) -> int | None:
    """The inode of process ``pid``'s network namespace; ``None`` when it is gone or a
    zombie (whose link is unreadable)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _pids_in(inodes: set[int]) -> set[int]:
    """Processes whose network namespace is one of ``inodes``, found through /proc (so also
    those of a namespace whose name is already deleted)."""
    return {int(e) for e in os.listdir("/proc")
            if e.isdigit() and process_ns_inode(int(e)) in inodes}


def kill_namespace_processes(inodes: set[int], timeout: float = 3.0) -> int:
    """SIGKILL every process inside the namespaces of ``inodes`` (namespaces this tool made)
    until two passes 50 ms apart find none (bounded by ``timeout``); returns how many kills
    were sent. A killed process counts as gone once it is a zombie."""
    killed, quiet = 0, 0
    deadline = time.monotonic() + timeout
    while inodes and quiet < 2 and time.monotonic() < deadline:
        pids = _pids_in(inodes)
        quiet = 0 if pids else quiet + 1
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return killed


def remove_namespaces(names: Sequence[str]) -> None:
    """Kill what runs in ``names``, delete them (their veths go with them), then kill what
    entered one of them meanwhile.

    Why twice: a process can enter a namespace after the first pass looked (a launcher
    shim's ``ip netns exec`` under way when the job was stopped; seen in CI under load as
    two orphaned ``hydra_pmi_proxy``). Deleting the name does not end it, and it keeps the
    namespace alive with no name, where ``ip netns list`` no longer shows it; by inode the
    second pass still finds it."""
    inodes = set()
    for ns in names:
        try:
            inodes.add(ns_inode(ns))
        except OSError:
            pass  # already gone
    kill_namespace_processes(inodes)
    errors = []
    for ns in names:
        res = run_shielded(["ip", "netns", "del", ns], check=False)
        if res.returncode != 0 and ns in namespaces():
            errors.append(f"{ns}: {res.stderr.strip()}")
    kill_namespace_processes(inodes)
    if errors:
        raise CommandFailed(f"emulate: could not delete namespace {errors[0]}; run "
                            f"`ringtune emulate --cleanup`")


def remove_hosts_files(names: Sequence[str]) -> None:
    """Remove ``/etc/netns/NS`` of ``names`` (and ``/etc/netns`` itself once empty)."""
    for ns in names:
        shutil.rmtree(os.path.join(ETC_NETNS, ns), ignore_errors=True)
    try:
        os.rmdir(ETC_NETNS)
    except OSError:
        pass  # absent, or holds someone else's files


def cleanup_leftovers() -> list[str]:
    """Remove every namespace and run directory an emulation left (call it holding the lock:
    then no live run owns any of them). Returns the namespaces removed."""
    left = ours()
    remove_namespaces(left)
    if os.path.isdir(ETC_NETNS):
        remove_hosts_files([n for n in os.listdir(ETC_NETNS) if _OURS.match(n)])
    if os.path.isdir(STATE_DIR):
        for entry in os.listdir(STATE_DIR):
            path = os.path.join(STATE_DIR, entry)
            if entry.isdigit() and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
    return left


@contextmanager
def run_lock(wait: float = 0.0, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """One emulation at a time on the machine. A second one waits up to ``wait`` seconds
    (``inf``: no limit) for the first to end (saying once that it waits, naming the first
    one's process id), then gets a clear error naming it. The lock is released by the
    kernel if the holder dies."""
    os.makedirs(STATE_DIR, exist_ok=True)
    path = os.path.join(STATE_DIR, "lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + max(0.0, wait)
    told = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            if time.monotonic() >= deadline:
                waited = f" after waiting {wait:g} s" if wait > 0 else ""
                raise CommandFailed(f"emulate: another `ringtune emulate` (pid {holder}) is "
                                    f"running on this machine{waited}; wait for it to end "
                                    f"(--wait SECONDS) or stop it (kill {holder})") from None
            if say is not None and not told:
                upto = "" if wait == float("inf") else f" up to {wait:g} s"
                say(f"waiting{upto} for another `ringtune emulate` (pid {holder}) to end")
                told = True
            # Polled, not a blocking flock: a blocking one could not give up at the deadline.
            time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing drops the flock


@dataclass(frozen=True)
class Host:
    index: int
    namespace: str
    hostname: str
    address: str


@dataclass
class Network:
    """The namespaces and links of one emulated cluster (see the module docstring)."""

    spec: EmulatedCluster
    run_id: int
    subnet: int
    hostname_prefix: str | None = None
    hosts: list[Host] = field(default_factory=list)
    #: Namespaces created so far, in order (teardown removes exactly these).
    created: list[str] = field(default_factory=list)

    def ns(self, suffix: str) -> str:
        return f"{PREFIX}-{self.run_id}-{suffix}"

    def _add_ns(self, suffix: str) -> str:
        name = self.ns(suffix)
        # Recorded before it exists: a signal that ends `ip netns add` (timeout and Ctrl-C
        # signal the whole process group) or arrives just after it would otherwise leave a
        # namespace that teardown does not know of. Deleting one never made is harmless.
        self.created.append(name)
        run_shielded(["ip", "netns", "add", name])
        run_shielded(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def _shape(self, ns: str, dev: str, rate_bps: int) -> None:
        burst = self.spec.burst_for(rate_bps)
        run_shielded(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
              f"{rate_bps}bit", "burst", f"{burst}b", "latency", "20ms"])

    def _bridge(self, ns: str) -> None:
        run_shielded(["ip", "-n", ns, "link", "add", "br0", "type", "bridge"])
        run_shielded(["ip", "-n", ns, "link", "set", "br0", "up"])

    def _port(self, sw: str, port: str, peer_ns: str, peer_dev: str, rate_bps: int,
              bridged_peer: bool = False) -> None:
        """A veth from switch ``sw`` (port ``port`` on its bridge) to ``peer_ns``, shaped
        at ``rate_bps`` on both ends."""
        run_shielded(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name",
                      peer_dev, "netns", peer_ns])
        if self.spec.mtu != DEFAULT_MTU:
            # Both ends; a bridge takes its ports' smallest MTU, so it follows.
            run_shielded(["ip", "-n", sw, "link", "set", port, "mtu", str(self.spec.mtu)])
            run_shielded(["ip", "-n", peer_ns, "link", "set", peer_dev, "mtu", str(self.spec.mtu)])
        run_shielded(["ip", "-n", sw, "link", "set", port, "master", "br0", "up"])
        if bridged_peer:
            run_shielded(["ip", "-n", peer_ns, "link", "set", peer_dev, "master", "br0"])
        run_shielded(["ip", "-n", peer_ns, "link", "set", peer_dev, "up"])
        self._shape(sw, port, rate_bps)
        self._shape(peer_ns, peer_dev, rate_bps)

    def build(self) -> None:
        """Create everything; on failure the caller's ``teardown()`` removes what was made."""
        spec = self.spec
        names = spec.hostnames(self.hostname_prefix)
        host_tier = spec.tiers[0]
        racks = spec.racks
        if len(spec.tiers) > 1:
            core = self._add_ns("core")
            self._bridge(core)
        switches = []
        for r in range(racks):
            sw = self._add_ns(f"sw{r}")
            self._bridge(sw)
            switches.append(sw)
            if len(spec.tiers) > 1:
                self._port(core, f"r{r}", sw, "uplink", spec.tiers[1].rate_bps, bridged_peer=True)
        for i in range(spec.hosts):
            ns = self._add_ns(f"h{i}")
            address = f"10.{self.subnet}.{i // 250}.{i % 250 + 1}"
            self._port(switches[i // spec.hosts_per_rack], f"h{i}", ns, "eth0",
                       host_tier.rate_bps)
            run_shielded(["ip", "-n", ns, "addr", "add", f"{address}/16", "dev", "eth0"])
            self.hosts.append(Host(i, ns, names[i], address))
        table = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.hostname}\n"
                                                  for h in self.hosts)
        for h in self.hosts:
            folder = os.path.join(ETC_NETNS, h.namespace)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "hosts"), "w", encoding="utf-8") as f:
                f.write(table)

    def teardown(self) -> None:
        """Remove every namespace this network created (and so its veths and processes),
        with SIGINT/SIGTERM/SIGHUP held back until it is done: a second signal must not cut
        it short. Also removes any other namespace of this run's prefix (belt and braces:
        the prefix holds this process's id, so no live run owns another one of them)."""
        held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            made, self.created = list(self.created), []
            mine = f"{PREFIX}-{self.run_id}-"
            present = namespaces()
            made += [n for n in present if n.startswith(mine) and n not in made]
            try:
                remove_namespaces([n for n in made[::-1] if n in present])
            finally:
                stale = [n for n in os.listdir(ETC_NETNS) if n.startswith(mine)] \
                    if os.path.isdir(ETC_NETNS) else []
                remove_hosts_files(sorted({h.namespace for h in self.hosts} | set(stale)))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
