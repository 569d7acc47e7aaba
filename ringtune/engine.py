"""Which distributed engine a CLI verb runs over, and its world.

``ringtune tune|bench|probe`` run with MPI under mpiexec (or launch themselves under it)
and with ``torch.distributed`` under torchrun::

    torchrun --nproc-per-node 2 --no-python ringtune bench -b 1K -e 1M

Every answer comes from the engine registry (``collectives.engines``), so an engine a
plug-in registers (``RINGTUNE_PLUGINS``) is a choice like the built-in ones. Use
``add_engine_argument`` for the verb's ``--engine auto|<registered engines>`` flag
(``auto``, the default: the first engine, in claim order, whose launcher started this
process, ``Engine.detect``; else the first that launches its own ranks, ``mpi``),
``resolve_engine`` to decide before anything starts (bad combinations are one line, exit
2: ``Engine.cli_refusal``), and ``engine_world`` for the world communicator the verb then
hands to ``Communicator``/``tune`` (``Engine.world``: ``MPI.COMM_WORLD``, or a
``TorchComm`` over ``torch.distributed``'s default group made here from torchrun's
environment). ``close_world`` ends what ``engine_world`` started.
"""

from __future__ import annotations

import argparse
from typing import Any

from collectives.engines import Engine, engine_names, get_engine

from .errors import CommandFailed, UsageError


def engine_choices() -> list[str]:
    """``--engine`` values: ``auto`` (follows the launcher), then every registered engine
    by name."""
    return ["auto", *sorted(engine_names())]


def _auto_help(engines: list[Engine]) -> str:
    launched = [f"{e.name} under {e.launcher}" for e in engines
                if e.launcher and not e.self_launches]
    fallback = next((e.name for e in engines if e.self_launches), None)
    return ", ".join(launched + ([f"else {fallback}"] if fallback else []))


def add_engine_argument(p: argparse.ArgumentParser) -> None:
    engines = [get_engine(n) for n in engine_names()]
    each = [get_engine(n).cli_help or n for n in sorted(engine_names())]
    p.add_argument("--engine", default="auto", choices=engine_choices(),
                   help=f"distributed engine: {', '.join(each)}, or auto (default: "
                   f"{_auto_help(engines)})")


def auto_engine() -> Engine:
    """The engine ``--engine auto`` takes: the first (claim order) whose launcher started
    this process, else the first that launches its own ranks."""
    engines = [get_engine(n) for n in engine_names()]
    for engine in engines:
        if engine.detect():
            return engine
    for engine in engines:
        if engine.self_launches:
            return engine
    raise UsageError("--engine auto: no launcher of a registered engine started this "
                     f"process; name one: --engine {'|'.join(engine_names())}")


def resolve_engine(args: argparse.Namespace) -> Engine:
    """The engine of this run; ``UsageError`` for combinations that cannot work (checked
    on every rank alike, before any communication)."""
    asked = getattr(args, "engine", "auto") or "auto"
    engine = auto_engine() if asked == "auto" else get_engine(asked)
    refusal = engine.cli_refusal(getattr(args, "verb", "bench"), getattr(args, "np", None))
    if refusal:
        raise UsageError(refusal)
    return engine


def engine_world(engine: Engine, gpu: bool = False) -> Any:
    """The world communicator object of ``engine`` (``Engine.world``): no library (e.g. no
    MPI) is ``CommandFailed`` naming what to install, a launcher of another world one line
    and exit 2."""
    from collectives.errors import WorldMismatchError

    try:
        return engine.world(gpu=gpu)
    except WorldMismatchError as exc:
        raise UsageError(str(exc)) from None
    except ImportError as exc:
        raise CommandFailed(str(exc)) from None


def close_world(engine: Engine) -> None:
    """End what ``engine_world`` started (torch: the default process group)."""
    engine.close_world()
