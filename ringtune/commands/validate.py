"""Validate a profile: format, version, keys, types, ranges, rule coverage, algorithm
names and parameters. With --against-topology (under mpiexec, or on this machine's default
ranks) also check that its topology fingerprint matches this world.

Exit code 0 when valid, 2 with one line naming the file and the key otherwise.

examples:
  ringtune validate profiles/local.yaml
  mpiexec -n 2 ringtune validate profiles/local.yaml --against-topology
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import UsageError
from ..flags import add_profile

HELP = "check a profile file (and optionally its fingerprint against this machine)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_profile(p)
    p.add_argument("--against-topology", action="store_true",
                   help="also compare its topology fingerprint and world size with this "
                        "world (launches itself under mpiexec with the profile's world size)")


def run(args: argparse.Namespace) -> int:
    from collectives.profile import load_profile

    # A ProfileError is a ValueError: the CLI reports it as bad input (exit 2).
    prof = load_profile(args.profile)
    if not args.against_topology:
        print(f"{args.profile}: valid ringtune profile (version 1, {len(prof.rules)} rules, "
              f"world size {prof.world_size})")
        return 0

    from ..launch import check_ranks, launch_rank, relaunch, under_mpiexec

    if not under_mpiexec() and not os.environ.get("RINGTUNE_LAUNCHED"):
        # Compare against a world of the size the profile was tuned for.
        check_ranks(prof.world_size, what=f"{args.profile}: topology.world_size "
                    f"{prof.world_size} (the ranks --against-topology launches)")
        return relaunch(getattr(args, "cli_argv", sys.argv[1:]), prof.world_size)

    from autotune.tuning import world_identity

    from ..launch import mpi_world

    comm = mpi_world()
    here = world_identity(comm)
    rank = launch_rank()
    problem = None
    if prof.world_size != comm.Get_size():
        problem = (f"{args.profile}: topology.world_size: profile was tuned for "
                   f"{prof.world_size} ranks, this world has {comm.Get_size()}")
    elif prof.fingerprint and prof.fingerprint != here["fingerprint"]:
        problem = (f"{args.profile}: topology.fingerprint: {prof.fingerprint} does not match "
                   f"this world's {here['fingerprint']} ({here['summary']}); re-tune here "
                   "with `ringtune tune`")
    elif not prof.fingerprint:
        problem = (f"{args.profile}: topology.fingerprint: missing, so it cannot be "
                   "compared with this world")
    if problem:
        raise UsageError(problem)
    if rank == 0:
        print(f"{args.profile}: valid, and its topology fingerprint matches this world "
              f"({here['summary']}, {comm.Get_size()} ranks)")
    return 0
