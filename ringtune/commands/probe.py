"""Detect the topology (hosts, GPUs, PCIe/NVLink, NUMA, NICs, rank layout), optionally
measure the links between ranks, print a summary and write it as YAML or JSON.

    ringtune probe                          # this process alone (no mpiexec needed)
    ringtune probe -np 4 --measure          # launches 4 ranks itself; rank 0 prints
    mpiexec -n 4 ringtune probe --measure   # all ranks; rank 0 prints
    ringtune probe --out topo.yaml          # save it (JSON with --json or a .json name)
    ringtune probe --topology topo.yaml     # show a saved or hand-written topology

A file given with ``--topology`` (or ``$RINGTUNE_TOPOLOGY``) replaces detection, for VMs and
containers that hide the hardware; a malformed one exits with code 2 and one line naming
the file and the key.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..engine import add_engine_argument
from ..flags import add_iters, add_ranks

HELP = "detect the topology (GPUs, PCIe, NVLink, NUMA, NICs, ranks), print it, save it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--measure", action="store_true",
                        help="also measure bandwidth and latency between every pair of ranks")
    parser.add_argument("--out", metavar="FILE",
                        help="write the topology to FILE (YAML; JSON with --json or *.json)")
    parser.add_argument("--json", action="store_true",
                        help="JSON instead of YAML; without --out, print JSON instead of "
                             "the table")
    parser.add_argument("--topology", metavar="FILE",
                        help="load this topology file instead of detecting (also "
                             "$RINGTUNE_TOPOLOGY)")
    # Its type is the CLI's one size reader (ringtune.cli.bound_numbers: a flag whose
    # dest ends in "bytes"), as for every size flag.
    parser.add_argument("--measure-bytes", metavar="N", default=1 << 22,
                        help="message size of the bandwidth measurement (default 4M)")
    add_iters(parser, 5, "timed ping-pongs per pair of ranks; the median is kept",
              aliases=["--repetitions"], dest="repetitions")
    add_ranks(parser)
    add_engine_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ringtune.errors import UsageError
    from ringtune.launch import check_ranks, relaunch, under_mpiexec

    if args.repetitions < 1:
        raise UsageError(f"-n/--iters: expected at least 1, got {args.repetitions}")
    from ringtune.engine import close_world, engine_world, resolve_engine

    check_ranks(args.np, args.oversubscribe)
    engine = resolve_engine(args)
    if (engine.self_launches and args.np is not None and args.np > 1 and not under_mpiexec()
            and not os.environ.get("RINGTUNE_LAUNCHED")):
        # -np N: every rank probes (the rank layout; --measure: every pair's links), as
        # under `mpiexec -n N`; without it, this process alone, no MPI needed.
        return relaunch(getattr(args, "cli_argv", sys.argv[1:]), args.np, args.oversubscribe)
    if args.measure and not engine.measures_links:
        raise UsageError(f"--measure is not supported with --engine {engine.name} yet (its "
                         "ping-pongs are MPI's): measure under mpiexec, or drop --measure")
    comm = None
    if not engine.self_launches or under_mpiexec():
        # Without its launcher a self-launching engine (mpi) probes this process alone.
        comm = engine_world(engine)  # no MPI, or another library's launcher: one line
    try:
        return _probe(args, comm)
    finally:
        close_world(engine)


def _probe(args: argparse.Namespace, comm: Any) -> int:
    import probes
    from collectives.plumbing.atomic import write_text_atomic

    topo = probes.detect(comm, measure=args.measure, topology_file=args.topology,
                         message_bytes=args.measure_bytes, repetitions=args.repetitions)
    if comm is not None and comm.Get_rank() != 0:
        return 0
    as_json = args.json or (args.out or "").endswith(".json")
    if args.json and not args.out:
        print(topo.to_json(), end="")
        return 0
    print(render(topo, measure_asked=args.measure and comm is None))
    if args.out:
        write_text_atomic(args.out, topo.to_json() if as_json else topo.to_yaml())
        print(f"wrote {args.out}")
    return 0


# -- the table ----------------------------------------------------------------------------


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
            for r in rows]


def _opt(v: Any, unit: str = "") -> str:
    return "?" if v is None else f"{v}{unit}"


def _gib(b: int | None) -> str:
    return "?" if b is None else f"{b / (1 << 30):.1f} GiB"


def _speed(mbps: int | None) -> str:
    if mbps is None:
        return "?"
    return f"{mbps / 1000:g} Gb/s" if mbps >= 1000 else f"{mbps} Mb/s"


def _pcie(gen: int | None, width: int | None) -> str:
    return f"gen{_opt(gen)} x{_opt(width)}"


def render(topo: Any, measure_asked: bool = False) -> str:
    """The human summary of a ``Topology`` (what ``ringtune probe`` prints)."""
    from probes.pci import pcie_level
    from probes.sysfs import format_cpulist

    out = [f"ringtune probe: {topo.summary()}",
           f"fingerprint: {topo.fingerprint()}   source: {topo.source}"]
    for hi, h in enumerate(topo.hosts):
        out.append("")
        sockets = f"{_opt(h.sockets)} socket{'s' if h.sockets != 1 else ''}"
        out.append(f"host {hi}: {h.name or '?'}: {h.cpu_model or 'CPU model unknown'}, "
                   f"{sockets}, {_opt(h.cores)} cores, {_opt(h.cpus)} CPUs")
        if h.numa:
            out.append("  NUMA: " + "; ".join(
                f"node{n.id} cpus {format_cpulist(n.cpus) or '?'} (distances "
                f"{' '.join(map(str, n.distances)) or '?'})" for n in h.numa))
        else:
            out.append("  NUMA: unknown (no /sys/devices/system/node)")
        if h.gpus:
            rows = [["GPU", "name", "memory", "bus id", "NUMA", "PCIe now", "PCIe max",
                     "CPU affinity"]]
            for i, g in enumerate(h.gpus):
                rows.append([f"GPU{i}", g.name or "?", _gib(g.memory_bytes), g.bus_id or "?",
                             _opt(g.numa_node), _pcie(g.pcie_gen, g.pcie_width),
                             _pcie(g.pcie_max_gen, g.pcie_max_width),
                             format_cpulist(g.cpus) or "?"])
            out.append(f"  GPUs ({h.gpu_source or '?'}):")
            out.extend(_table(rows, "    "))
            out.append("  topology (as nvidia-smi topo -m):")
            out.extend(_topo_matrix(h, pcie_level))
        else:
            out.append(f"  GPUs: none ({h.gpu_source or 'not probed'})")
        if h.nics:
            rows = [["NIC", "name", "kind", "speed", "state", "mtu", "pci", "NUMA", "netdev"]]
            for i, n in enumerate(h.nics):
                rows.append([f"NIC{i}", n.name, n.kind, _speed(n.speed_mbps),
                             _opt(n.state), _opt(n.mtu), n.pci or "-", _opt(n.numa_node),
                             n.netdev or "-"])
            out.append("  NICs:")
            out.extend(_table(rows, "    "))
        else:
            out.append("  NICs: none found (virtual interfaces are not listed)")
    out.append("")
    rows = [["rank", "host", "local", "GPU", "NUMA"]]
    for p in topo.ranks:
        rows.append([str(p.rank), str(p.host), str(p.local_rank),
                     "-" if p.gpu is None else f"GPU{p.gpu}", _opt(p.numa_node)])
    out.append("ranks:")
    out.extend(_table(rows))
    if topo.links is not None:
        lk = topo.links
        n = len(topo.ranks)
        for title, m, fmt in (
                (f"measured bandwidth GB/s ({lk.message_bytes} B messages, median of "
                 f"{lk.repetitions})", lk.bandwidth_gbps, "{:.2f}"),
                (f"measured latency us ({lk.small_bytes} B messages)", lk.latency_us,
                 "{:.1f}")):
            out.append(title + ":")
            rows = [[""] + [f"r{j}" for j in range(n)]]
            for i in range(n):
                rows.append([f"r{i}"] + ["-" if m[i][j] is None else fmt.format(m[i][j])
                                         for j in range(n)])
            out.extend(_table(rows))
    elif measure_asked:
        out.append("links: not measured (1 rank; run under `mpiexec -n N ringtune probe "
                   "--measure`)")
    return "\n".join(out)


def _topo_matrix(h: Any, pcie_level: Any) -> list[str]:
    from probes.sysfs import format_cpulist

    gpus, nics = h.gpus, h.nics
    names = [f"GPU{i}" for i in range(len(gpus))] + [f"NIC{i}" for i in range(len(nics))]
    gm = h.gpu_matrix()
    devs = [h.pci_device(g.bus_id) for g in gpus] + [h.pci_device(n.pci) for n in nics]
    rows = [[""] + names + ["CPU Affinity", "NUMA Affinity"]]
    for i, name in enumerate(names):
        row = [name]
        for j in range(len(names)):
            if i == j:
                row.append("X")
            elif i < len(gpus) and j < len(gpus):
                row.append(gm[i][j])
            else:
                row.append(pcie_level(devs[i], devs[j]) or "?")
        if i < len(gpus):
            row += [format_cpulist(gpus[i].cpus) or "?", _opt(gpus[i].numa_node)]
        else:
            row += ["", ""]
        rows.append(row)
    return _table(rows, "    ")
