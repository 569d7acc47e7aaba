"""What the links between two (emulated) hosts carry at best, with no allreduce on them:
the ceiling an allreduce's "% of the bound" is read against.

Run across two hosts with the same number of ranks each (rank 0 prints Markdown)::

    ringtune emulate --cluster profiles/clusters/emulated-2x2.yaml -- \\
        python benchmarks/link_ceiling.py --cluster profiles/clusters/emulated-2x2.yaml

Rank i of one host is paired with rank i of the other, and each pair moves S / ranks per
host, so each host's uplink carries S: the bytes an allreduce of S moves across it each
way (its bound is S / uplink rate). Two directions of traffic:

- ``one way``: the first host sends, the second receives (one direction of each uplink);
- ``both ways``: both at once, as every allreduce does (a reduce-scatter and an all-gather
  each send and receive S/2 through the uplink at the same time).

and two ways of moving it:

- ``tcp``: the kernel's own TCP sockets between the pair (``socket.sendall`` against a
  receiving thread), no MPI: what any application on these hosts can get;
- ``mpi``: one ``MPI_Sendrecv`` (``Send``/``Recv`` one way) per pair: what MPI's transport
  adds.

With ``--profile FILE`` and ``--pipeline P,...`` the same run also times allreduces of S
bytes (float32 sum) the same way: the profile's choice, and DDL's grid over the two tiers
(``hierarchical dims=[ranks per host, 2]``) in P pieces, to read against the ceiling
measured beside them.

Each figure is the median of ``--repeats`` timings, each from a barrier to the slowest
rank's end, shown as milliseconds and % of the bound, with the CPU time (user + system,
``getrusage``) of the rank that used the most, per transfer: on emulated hosts the system
part includes the kernel's work for the veth pairs, the switch namespace and tbf, which a
real host's NIC would do. The MTU's headers alone leave TCP
(MTU - 52) / (MTU + 14) of the shaped rate (95.6% at 1500, 99.3% at 9000; tbf counts whole
frames), printed as the ceiling.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import sys
import threading
import time
from functools import partial
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ringtune.emulate.spec import tcp_payload_share  # noqa: E402

Row = tuple[int, str, str, float, float, float]


def cpu_s() -> tuple[float, float]:
    """(user, system) CPU seconds of this process so far (every thread: the TCP rows'
    receiving thread too)."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime, use.ru_stime


class Samples:
    """Timed calls of one row: each from a barrier to the slowest rank's end, and this
    rank's CPU time during it."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.user = self.system = 0.0

    def take(self, world: Any, fn: Any, keep: bool = True) -> None:
        """Time ``fn()`` once (collective); ``keep=False``: a warm-up, not recorded."""
        from mpi4py import MPI

        world.Barrier()
        c0 = cpu_s()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        c1 = cpu_s()
        dt = world.allreduce(t1 - t0, op=MPI.MAX)
        if keep:
            self.times.append(dt)
            self.user += c1[0] - c0[0]
            self.system += c1[1] - c0[1]

    def row(self, world: Any, size: int, way: str, what: str) -> Row:
        """The row (collective): the median time and the per-call CPU of the rank that
        used the most."""
        n = len(self.times)
        user, system = max(world.allgather((self.user / n, self.system / n)), key=sum)
        return (size, way, what, statistics.median(self.times), user, system)


#: TCP port of pair k: ``PORT_BASE + k`` on the first host's rank of the pair.
PORT_BASE = 23100


class Layout:
    """The two hosts and this rank's pair: ``names`` (the hosts in rank order),
    ``per_host`` (ranks on each), ``peer`` (the rank of the other host with this rank's
    index there), ``k`` (that index), ``first`` (whether this rank is on the first host).
    SystemExit naming what is wrong where the ranks are not on 2 hosts, equally many each."""

    def __init__(self, rank: int, hosts_of: list[str]) -> None:
        self.names = list(dict.fromkeys(hosts_of))
        if len(self.names) != 2:
            raise SystemExit(f"link_ceiling: needs ranks on exactly 2 hosts, got "
                             f"{len(self.names)} ({', '.join(self.names)}); use a 2-host "
                             "cluster file")
        on = [[r for r, h in enumerate(hosts_of) if h == name] for name in self.names]
        if len(on[0]) != len(on[1]):
            raise SystemExit(f"link_ceiling: the hosts have {len(on[0])} and {len(on[1])} "
                             "ranks; needs the same number on each")
        self.per_host = len(on[0])
        self.first = hosts_of[rank] == self.names[0]
        mine, other = (on[0], on[1]) if self.first else (on[1], on[0])
        self.k = mine.index(rank)
        self.peer = other[self.k]


class TcpPair:
    """One TCP connection between a rank and its peer on the other host."""

    def __init__(self, world: Any, rank: int, where: Layout) -> None:
        from mpi4py import MPI

        addr = socket.gethostbyname(MPI.Get_processor_name())
        addrs = world.allgather(addr)
        peer, k = where.peer, where.k
        if where.first:
            ls = socket.socket()
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind((addrs[rank], PORT_BASE + k))
            ls.listen(1)
            world.Barrier()
            self.sock, _ = ls.accept()
            ls.close()
        else:
            world.Barrier()
            self.sock = socket.create_connection((addrs[peer], PORT_BASE + k), timeout=30)
            self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _recv(self, buf: bytearray) -> None:
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("link_ceiling: the peer closed the connection")
            got += n

    def move(self, data: bytes, buf: bytearray, send: bool, recv: bool) -> None:
        if send and recv:
            t = threading.Thread(target=self._recv, args=(buf,))
            t.start()
            self.sock.sendall(data)
            t.join()
        elif send:
            self.sock.sendall(data)
            self.sock.recv(1)  # the receiver's "all in": the time covers delivery
        else:
            self._recv(buf)
            self.sock.sendall(b"k")

    def close(self) -> None:
        self.sock.close()


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes % (1 << 20) == 0 else f"{nbytes / 1e6:g} MB"


def mpi_move(world: Any, peer: int, a: Any, b: Any, send: bool, recv: bool) -> None:
    """One pair's move over MPI: ``Sendrecv`` both ways, else ``Send`` or ``Recv``."""
    if send and recv:
        world.Sendrecv(a, peer, 7, b, peer, 7)
    elif send:
        world.Send(a, peer, 7)
    else:
        world.Recv(b, peer, 7)


def time_allreduces(world: Any, sizes: list[int], per_host: int, profile: str | None,
                    pipeline: str, repeats: int) -> list[Row]:
    """Rows for allreduces of each size (float32 sum): the profile's choice and the grid
    in each ``pipeline`` piece count, interleaved within a repeat."""
    import numpy as np

    from collectives import Communicator

    comm = Communicator(world.Dup(), profile=profile)
    grid: dict[str, Any] = {"dims": [per_host, 2]}
    runs: list[tuple[str, dict[str, Any] | None]] = []
    if profile:
        runs.append(("allreduce, the profile's choice", None))
    runs += [(f"allreduce, grid pipeline={p}", {**grid, "pipeline": int(p)})
             for p in pipeline.split(",") if p]
    rows: list[Row] = []
    for size in sizes:
        buf = np.ones(size // 4, np.float32)
        calls = {label: partial(comm.allreduce, buf) if params is None else
                 partial(comm.allreduce, buf, "sum", "hierarchical", **params)
                 for label, params in runs}
        samples = {label: Samples() for label, _ in runs}
        for i in range(repeats + 1):  # the first builds the plans
            for label, _ in runs:
                samples[label].take(world, calls[label], keep=i > 0)
        rows += [samples[label].row(world, size, "both ways", label) for label, _ in runs]
    comm.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", help="the emulated cluster's file (for the uplink rate "
                                      "and MTU); else --gbit and --mtu")
    ap.add_argument("--gbit", type=float, default=None, help="uplink rate, Gbit/s")
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--sizes", default="4194304,16777216,67108864",
                    help="bytes per host each way (an allreduce's S), comma-separated")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--transports", default="tcp,mpi")
    ap.add_argument("--profile", help="also time this profile's allreduce of S bytes")
    ap.add_argument("--pipeline", default="", metavar="P,P,...",
                    help="also time the two-tier grid pipelined in these many pieces")
    args = ap.parse_args()

    import numpy as np
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    hosts_of = world.allgather(MPI.Get_processor_name())
    where = Layout(rank, hosts_of)
    per_host = where.per_host
    mtu = args.mtu
    if args.cluster:
        from ringtune.emulate.spec import load_emulated

        spec = load_emulated(args.cluster)
        rate_bps = spec.tiers[0].rate_bps
        mtu = spec.mtu
    elif args.gbit:
        rate_bps = int(args.gbit * 1e9)
    else:
        raise SystemExit("link_ceiling: give --cluster FILE or --gbit RATE")
    sizes = [int(s) for s in args.sizes.split(",")]
    transports = [t for t in args.transports.split(",") if t]
    bad = [t for t in transports if t not in ("tcp", "mpi")]
    if bad:
        raise SystemExit(f"link_ceiling: --transports {bad[0]!r}: use tcp and/or mpi")

    pair = TcpPair(world, rank, where) if "tcp" in transports else None
    rows: list[Row] = []
    for size in sizes:
        each = size // per_host
        data = b"\x01" * each
        buf = bytearray(each)
        a = np.ones(each, np.uint8)
        b = np.empty_like(a)
        for way in ("one way", "both ways"):
            send = where.first or way == "both ways"
            recv = (not where.first) or way == "both ways"
            for transport in transports:
                if transport == "tcp":
                    assert pair is not None
                    move = partial(pair.move, data, buf, send, recv)
                else:
                    move = partial(mpi_move, world, where.peer, a, b, send, recv)
                samples = Samples()
                for i in range(args.repeats + 1):  # the first warms the connection up
                    samples.take(world, move, keep=i > 0)
                rows.append(samples.row(world, size, way, transport))
    if pair is not None:
        pair.close()
    rows += time_allreduces(world, sizes, per_host, args.profile, args.pipeline,
                            args.repeats)
    if rank == 0:
        share = tcp_payload_share(mtu)
        print(f"# link ceiling: hosts {where.names[0]} and {where.names[1]}, {per_host} "
              f"rank(s) each "
              f"(pairs of ranks, S / {per_host} per pair), uplink {rate_bps / 1e9:g} Gbit/s, "
              f"MTU {mtu}: TCP's headers leave {100 * share:.1f}% of the rate; medians of "
              f"{args.repeats}")
        print()
        print("| S per host each way | bound ms | direction | what moves it | ms | % of bound "
              "| CPU of the busiest rank, ms: user + system |")
        print("|---|---:|---|---|---:|---:|---:|")
        for size, way, transport, t, u, sy in sorted(rows, key=lambda row: row[0]):
            bound = size * 8 / rate_bps
            print(f"| {_size(size)} | {bound * 1e3:.1f} | {way} | {transport} | "
                  f"{t * 1e3:.1f} | {100 * bound / t:.0f}% | {u * 1e3:.1f} + {sy * 1e3:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
