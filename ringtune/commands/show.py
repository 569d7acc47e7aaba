"""Show a profile as a table: one row per rule, with the busbw measured when it was tuned
and the speed-up over native; a rule whose A/B spread exceeded its gain is marked ``!``, and
a tune on a busy machine is said (``tuning.machine``).

example:
  ringtune show profiles/local.yaml
"""

from __future__ import annotations

import argparse

from ..flags import add_profile

HELP = "print a profile's rules with speed-up over native"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_profile(p)


def run(args: argparse.Namespace) -> int:
    from autotune.report import profile_heading, rule_table
    from collectives.profile import load_profile

    # A ProfileError is a ValueError: the CLI reports it as bad input (exit 2).
    prof = load_profile(args.profile)
    data = dict(prof.document)  # the file as written: what is shown
    print(profile_heading(data, args.profile))
    fp = (data.get("topology") or {}).get("fingerprint")
    if fp:
        print(f"topology fingerprint {fp}")
    print(rule_table(data))
    from autotune.machine import summary_line

    # Recorded by the tune (tuning.machine): the figures above were taken under load.
    busy = summary_line((data.get("tuning") or {}).get("machine"), whose="its")
    if busy:
        print(busy)
    for sec in data.get("shapes") or []:
        # Sections for other job shapes (ringtune tune --shapes): one table each.
        topo = sec.get("topology") or {}
        how = ("predicted by the cost model from the tuned "
               f"{sec.get('from_world_size')}-rank shape" if sec.get("source") == "predicted"
               else "tuned")
        print(f"\nsection: {topo.get('world_size')} ranks ({how})")
        print(rule_table({**data, "topology": topo, "rules": sec.get("rules") or []}))
    return 0
