"""What an emulated cluster consists of, read from a ``profiles/clusters/`` file.

The file is the one ``ringtune simulate`` reads (``autotune.cluster``): levels innermost
first; the levels inside a host (``ranks_per_host``) run over the host's shared memory, each
level above is a tier of the network. The first network level is the host uplink, a second
one (optional) groups hosts into racks behind a rack uplink. A group's uplink rate is its
share of the level's links: ``bandwidth_gbs × links_per_rank × ranks in the group`` (a
1 Gbit/s NIC shared by 2 ranks: ``bandwidth_gbs: 0.125, links_per_rank: 0.5``).

An optional ``emulate:`` mapping adds what only emulation needs:

- ``hostname_prefix``: hosts are named ``<prefix>0``, ``<prefix>1``… (default ``host``);
- ``oversubscribe``: allow more than ``MAX_RANKS_PER_CORE`` ranks per CPU core (default
  false: such a run measures the scheduler, not the network);
- ``burst_kb``: the token bucket's burst (default: 1 ms at the link rate, at least 128 KiB:
  twice a 64 KiB GSO packet, see ``MIN_BURST``);
- ``mtu``: the links' MTU in bytes (default 1500, Ethernet's; 9000 for the jumbo frames of
  many cluster networks). It sets how much of a shaped link TCP's payload can use: tbf
  counts whole frames, and each 1448-byte segment at MTU 1500 carries 66 bytes of headers
  (a ceiling of 95.6% of the rate), each 8948-byte one at 9000 the same 66 (99.3%);
- ``progress``: how MPICH's ranks wait: ``spin`` (the default: MPICH's busy polling, as on
  a cluster) or ``throttle`` (``collectives.training.exchange.QUIET_PROGRESS_ENV``: back off and
  yield the core after empty polls; variables already set in the environment win). On a
  real cluster each host has its own cores and a NIC that moves the bytes; here every
  emulated host's ranks *and* the kernel's TCP, veth and tbf work share this machine's
  cores, and ranks that spin take the core the kernel needs to move their data: with more
  ranks than cores, ``throttle`` lets the links carry more (BENCHMARKS.md). It also makes a
  blocking wait wake late, so the probe's small-message latency then measures the wake-up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# The emulate: keys are checked where the cluster file is read (autotune.cluster); the
# names stay importable from here.
from autotune.cluster import DEFAULT_MTU as DEFAULT_MTU
from autotune.cluster import HOSTNAME_PREFIX as HOSTNAME_PREFIX
from autotune.cluster import MTU_RANGE as MTU_RANGE
from autotune.cluster import PROGRESS_MODES as PROGRESS_MODES

#: More ranks than this per CPU core and the emulated network is no longer what is measured.
MAX_RANKS_PER_CORE = 4
#: Tiers of network an emulation builds: host uplinks, and rack uplinks above them.
MAX_NETWORK_LEVELS = 2
#: Smallest default burst. The veths hand tbf GSO packets of up to 64 KiB; a bucket smaller
#: than that (1 ms is 62.5 KB at 0.5 Gbit/s) made TCP across the 0.5 Gbit/s rack uplinks of
#: emulated-2r2x1 run at 23-30 MB/s each way when both ways were loaded (an allreduce's
#: exchanges), against 57-58 MB/s with 128 KiB (and 57-60 MB/s one way either way).
MIN_BURST = 128 << 10


def tcp_payload_share(mtu: int) -> float:
    """The share of a tbf-shaped link's rate that TCP's payload can use at ``mtu``: tbf
    counts whole frames, and each carries 14 Ethernet + 20 IP + 32 TCP bytes (with
    timestamps) of headers, MTU - 52 of payload (1448/1514 at 1500, 8948/9014 at 9000)."""
    return (mtu - 52) / (mtu + 14)




@dataclass(frozen=True)
class Tier:
    """One network tier: ``groups`` switches' worth of uplinks, each ``rate_bps`` bits/s."""

    name: str
    rate_bps: int
    #: How many units of the tier below (hosts, or racks) share one switch of this tier.
    fanout: int


@dataclass(frozen=True)
class EmulatedCluster:
    """Hosts, ranks per host and the shaped tiers of one emulated cluster."""

    name: str
    path: str
    hosts: int
    ranks_per_host: int
    #: Network tiers, host uplink first; one tier: every host on one switch.
    tiers: tuple[Tier, ...]
    hostname_prefix: str = "host"
    oversubscribe: bool = False
    burst_bytes: int = 0
    mtu: int = DEFAULT_MTU
    #: How MPICH's ranks wait (``PROGRESS_MODES``).
    progress: str = "spin"

    @property
    def ranks(self) -> int:
        return self.hosts * self.ranks_per_host

    @property
    def hosts_per_rack(self) -> int:
        """Hosts behind one rack switch (all of them with a single tier)."""
        return self.tiers[0].fanout if len(self.tiers) > 1 else self.hosts

    @property
    def racks(self) -> int:
        return self.hosts // self.hosts_per_rack

    def hostnames(self, prefix: str | None = None) -> list[str]:
        p = prefix or self.hostname_prefix
        return [f"{p}{i}" for i in range(self.hosts)]

    def burst_for(self, rate_bps: int) -> int:
        """The token bucket's burst: the file's, else 1 ms at ``rate_bps``, >= ``MIN_BURST``."""
        return self.burst_bytes or max(MIN_BURST, rate_bps // 8 // 1000)

    @property
    def throttled(self) -> bool:
        """Whether the ranks' MPICH waits are throttled (``progress``)."""
        return self.progress == "throttle"

    def progress_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The MPICH variables ``progress`` adds to ``environ`` (those it already has win)."""
        if not self.throttled:
            return {}
        from collectives.training.exchange import QUIET_PROGRESS_ENV

        return {k: v for k, v in QUIET_PROGRESS_ENV.items() if k not in environ}

    def describe(self) -> str:
        tiers = ", ".join(f"{t.name} {_rate(t.rate_bps)}" for t in self.tiers)
        racks = f" in {self.racks} racks" if len(self.tiers) > 1 else ""
        return (f"{self.name}: {self.hosts} hosts{racks} x {self.ranks_per_host} ranks "
                f"({tiers})")


def _rate(bps: int) -> str:
    for unit, div in (("Gbit/s", 10**9), ("Mbit/s", 10**6), ("kbit/s", 10**3)):
        if bps >= div:
            return f"{bps / div:g} {unit}"
    return f"{bps} bit/s"


def load_emulated(path: str, cores: int | None = None) -> EmulatedCluster:
    """Validate ``path`` for emulation; ``ValueError`` naming the file and key otherwise
    (the CLI's exit code 2). ``cores``: CPU cores the ranks share (default: this process's)."""
    from autotune.cluster import load_cluster

    cluster = load_cluster(path)  # the simulate format: keys, sizes, positive bandwidths
    # The emulate: section was checked with the rest of the file (autotune.cluster).
    emu = cluster.emulate
    prefix, over, mtu = emu["hostname_prefix"], emu["oversubscribe"], emu["mtu"]
    burst_kb, progress = emu["burst_kb"], emu["progress"]

    net = cluster.levels[cluster.host_levels:]
    if not net:
        raise ValueError(f"{path}: levels: every level is inside one host (ranks_per_host "
                         f"{cluster.ranks_per_host} = ranks); emulation needs a network level")
    if len(net) > MAX_NETWORK_LEVELS:
        raise ValueError(f"{path}: levels: {len(net)} network levels; emulation builds at most "
                         f"{MAX_NETWORK_LEVELS} (host uplinks and rack uplinks)")
    tiers = []
    group = cluster.ranks_per_host  # ranks behind one uplink of the tier being read
    for i, lv in enumerate(net):
        rate = lv.bandwidth_gbs * lv.links_per_rank * group * 8e9
        if rate < 1e6:
            raise ValueError(f"{path}: levels[{cluster.host_levels + i}]: uplink "
                             f"{rate:.0f} bit/s (bandwidth_gbs x links_per_rank x {group} "
                             f"ranks); emulation needs at least 1 Mbit/s")
        tiers.append(Tier(lv.name, int(rate), lv.size))
        group *= lv.size
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1)
    if cluster.ranks > MAX_RANKS_PER_CORE * cores and not over:
        raise ValueError(f"{path}: ranks: {cluster.ranks} ranks on {cores} CPU core(s) is more "
                         f"than {MAX_RANKS_PER_CORE} per core; use fewer ranks or set "
                         f"emulate.oversubscribe: true")
    return EmulatedCluster(
        name=cluster.name, path=path, hosts=cluster.hosts,
        ranks_per_host=cluster.ranks_per_host, tiers=tuple(tiers), hostname_prefix=prefix,
        oversubscribe=over, burst_bytes=int(burst_kb * 1024), mtu=mtu, progress=progress)
