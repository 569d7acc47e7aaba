"""The CLI's one vocabulary: a flag for an idea is spelled the same on every verb that takes
it, after nccl-tests where it has a word for it.

Use these from a verb's ``add_arguments`` instead of ``add_argument`` for any of the ideas
below, so ``tune``, ``bench``, ``simulate`` and ``probe`` cannot drift apart again:

    ========================  =================================================
    ``-b/--minbytes``         smallest message size (K/M/G suffixes)
    ``-e/--maxbytes``         largest message size
    ``-f/--stepfactor``       size multiplication factor
    ``-d/--datatype``         element type
    ``-o/--op``               reduction op
    ``-n/--iters``            timed iterations (repetitions)
    ``-w/--warmup_iters``     warm-up iterations
    ``-c/--check``            check results, 0 or 1
    ``--algo``                algorithm(s): one name, or a list (comma-separated,
                              repeatable) where a verb takes several
    ``-np``                   ranks to launch, on every verb that launches itself
    ``--wait [SECONDS]``      when another run holds what the verb needs, wait for
                              it to end instead of refusing at once: up to
                              SECONDS, or without a limit when given alone
    ``PROFILE``               the profile file a verb reads (``show``,
                              ``validate``, ``export``)
    ========================  =================================================

A spelling a verb used before (``tune --min-bytes``, ``--dtype``, ``--algorithms``,
``probe --repetitions``) stays accepted, since scripts and cluster recipes outside the
repository call it: it is an alias of the flag, said in ``--help`` and marked in
docs/cli.md (``aliases_of``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

#: The attribute of an ``argparse.Action`` holding its former spellings.
_ALIASES = "ringtune_aliases"
#: ... and its help text before the note naming them was added.
_PLAIN_HELP = "ringtune_plain_help"


def add(p: argparse.ArgumentParser, *names: str, aliases: Sequence[str] = (),
        **kwargs: Any) -> argparse.Action:
    """``p.add_argument(*names, **kwargs)``, also accepting ``aliases`` (former
    spellings), which the help text names as such."""
    action = p.add_argument(*names, *aliases, **kwargs)
    if aliases:
        setattr(action, _ALIASES, tuple(aliases))
        setattr(action, _PLAIN_HELP, action.help or "")
        action.help = f"{action.help or ''} (alias: {', '.join(aliases)}, the former spelling)"
    return action


def aliases_of(action: argparse.Action) -> tuple[str, ...]:
    """The former spellings of ``action``'s flag (empty for most)."""
    return tuple(getattr(action, _ALIASES, ()))


def plain_help(action: argparse.Action) -> str:
    """``action``'s help without the note naming its aliases (docs/cli.md lists them in
    the flag's own column)."""
    return str(getattr(action, _PLAIN_HELP, action.help or ""))


def add_size_range(p: argparse.ArgumentParser, lo: str, hi: str, what: str = "size",
                   aliases: tuple[Sequence[str], Sequence[str]] = ((), ())) -> None:
    """``-b/--minbytes`` and ``-e/--maxbytes`` (text; the CLI gives them the bounded size
    type, ``ringtune.cli.bound_numbers``). ``dest`` stays ``min_bytes``/``max_bytes``
    where a verb had those, through ``aliases``' first spelling."""
    lo_dest = {"dest": "min_bytes"} if aliases[0] else {}
    hi_dest = {"dest": "max_bytes"} if aliases[1] else {}
    add(p, "-b", "--minbytes", aliases=aliases[0], default=lo, metavar="SIZE",
        help=f"smallest {what} (default {lo}; K/M/G suffixes)", **lo_dest)
    add(p, "-e", "--maxbytes", aliases=aliases[1], default=hi, metavar="SIZE",
        help=f"largest {what} (default {hi})", **hi_dest)


def add_stepfactor(p: argparse.ArgumentParser, default: float) -> None:
    add(p, "-f", "--stepfactor", type=float, default=default, metavar="F",
        help=f"size multiplication factor (default {default:g})")


def add_datatype(p: argparse.ArgumentParser, default: str = "float32",
                 aliases: Sequence[str] = (), what: str = "element type") -> None:
    add(p, "-d", "--datatype", aliases=aliases, default=default, metavar="TYPE",
        dest="dtype" if aliases else "datatype",
        help=f"{what}: float16 | float32 | float64 | int32 | int64 (bfloat16 on GPU; "
             f"default {default})")


def add_op(p: argparse.ArgumentParser, default: str = "sum", what: str = "reduction op") -> None:
    add(p, "-o", "--op", default=default, metavar="OP",
        help=f"{what}: sum | prod | min | max | avg (default {default})")


def add_iters(p: argparse.ArgumentParser, default: int, what: str = "timed iterations",
              aliases: Sequence[str] = (), dest: str = "iters") -> None:
    add(p, "-n", "--iters", aliases=aliases, type=int, default=default, metavar="N",
        dest=dest, help=f"{what} (default {default})")


def add_algos(p: argparse.ArgumentParser, what: str, aliases: Sequence[str] = (),
              dest: str = "algo") -> None:
    """``--algo`` for a verb that takes several: comma-separated, repeatable
    (``algo_list`` reads it)."""
    add(p, "--algo", aliases=aliases, action="append", metavar="LIST", dest=dest,
        help=f"{what} (comma-separated or repeated; default: all)")


def algo_list(values: Sequence[str] | None) -> list[str] | None:
    """The names given to ``add_algos``' flag, in order, each once (``None``: not given)."""
    if not values:
        return None
    names: list[str] = []
    for value in values:
        for name in value.split(","):
            if name.strip() and name.strip() not in names:
                names.append(name.strip())
    return names or None


def add_profile(p: argparse.ArgumentParser) -> None:
    """The positional ``PROFILE`` (``dest`` ``profile``) of a verb that reads a profile."""
    p.add_argument("profile", metavar="PROFILE", help="profile file (YAML)")


def add_ranks(p: argparse.ArgumentParser) -> None:
    """``-np`` and ``--oversubscribe``, on every verb that launches itself under mpiexec
    when started from a plain shell (``ringtune.launch.relaunch``)."""
    p.add_argument("-np", dest="np", type=int, default=None, metavar="N",
                   help="ranks to launch when started without mpiexec (at least 1; more "
                        "than 4 per CPU core needs --oversubscribe)")
    p.add_argument("--oversubscribe", action="store_true",
                   help="allow -np above 4 ranks per CPU core")


def wait_seconds(text: str) -> float:
    """``--wait``'s value: seconds >= 0 (``inf``: no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def add_wait(p: argparse.ArgumentParser, holder: str, default: str) -> argparse.Action:
    """``--wait [SECONDS]``, one meaning on every verb that takes it (``tune`` had it as an
    on/off switch, ``emulate`` with seconds; both former uses are spellings of this one):
    while ``holder`` (another run) holds what the verb needs, wait for it to end instead of
    refusing at once, up to SECONDS; alone, without a limit. ``dest`` ``wait``: ``None``
    when not given, ``math.inf`` for no limit."""
    return add(p, "--wait", nargs="?", const=math.inf, default=None, type=wait_seconds,
               metavar="SECONDS",
               help=f"while {holder}, wait up to SECONDS for it to end instead of refusing "
                    f"at once; --wait alone waits without a limit ({default})")
