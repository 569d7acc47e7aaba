"""Show a profile as a table: one row per rule, with the busbw measured when it was tuned
and the speed-up over native.

example:
  ringtune show profiles/local.yaml
"""

from __future__ import annotations

import argparse

HELP = "print a profile's rules with speed-up over native"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", metavar="PROFILE", help="profile file (YAML)")


def run(args: argparse.Namespace) -> int:
    from autotune.report import profile_heading, rule_table
    from collectives.profile import load_profile

    # A ProfileError is a ValueError: the CLI reports it as bad input (exit 2).
    prof = load_profile(args.profile)
    data = dict(prof.raw)
    print(profile_heading(data, args.profile))
    fp = (data.get("topology") or {}).get("fingerprint")
    if fp:
        print(f"topology fingerprint {fp}")
    print(rule_table(data))
    return 0
