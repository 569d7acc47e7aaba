"""Entry point of the ``ringtune`` command: one sub-command module per verb.

Each module in ``ringtune.commands`` provides ``HELP`` (one line), ``add_arguments(parser)``
and ``run(args) -> int``; modules import heavy dependencies inside ``run`` so that
``ringtune --help`` stays fast. Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad
input — one line on stderr, printed once (by rank 0 under mpiexec).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import __version__
from .errors import CommandFailed, UsageError, one_line_warnings, report_error
from .launch import launch_rank

#: verb -> module; the order is the order of ``ringtune --help``.
COMMANDS: dict[str, str] = {
    "probe": "ringtune.commands.probe",
    "bench": "ringtune.commands.bench",
    "tune": "ringtune.commands.tune",
    "show": "ringtune.commands.show",
    "validate": "ringtune.commands.validate",
    "simulate": "ringtune.commands.simulate",
    "export": "ringtune.commands.export",
    "emulate": "ringtune.commands.emulate",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (from rank 0) and exit code 2.
    It keeps, in public, what the unknown-flag line needs: its flags (``flags``) and, for
    the top-level parser, each verb's parser (``verbs``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.flags: list[str] = []  # before argparse adds -h through add_argument
        self.verbs: dict[str, argparse.ArgumentParser] = {}
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.flags.extend(action.option_strings)
        return action

    def error(self, message: str) -> None:  # type: ignore[override]
        # No "ringtune:" here: report_error prints the one "ringtune: error:" prefix.
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """argparse's, except for a flag the verb does not have: argparse lets the
        top-level parser refuse it (``unrecognized arguments … (see `ringtune --help`)``),
        which names neither the verb nor the flag meant; here the verb's parser answers,
        with the closest flag it has (``unknown_flag``)."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            verb = self.verbs.get(getattr(ns, "verb", None) or "", self)
            raise UsageError(unknown_flag(verb.prog, getattr(verb, "flags", []), extras))
        return ns


def unknown_flag(prog: str, known: Sequence[str], extras: Sequence[str]) -> str:
    """One line for arguments the verb ``prog`` (whose flags are ``known``) does not take:
    the first unknown flag, the verb's closest flag to it (``difflib``: a typo,
    ``--budjet``, or another verb's spelling, ``--algorithms``), and where its usage is."""
    flags = [x for x in extras if x.startswith("-") and not _is_number(x)]
    usage = f"(usage: `{prog} --help`)"
    if not flags:
        return f"`{prog}` takes no argument {extras[0]!r} here {usage}"
    name = flags[0].split("=", 1)[0]
    # Compared without the dashes, which would make any two long flags look alike; a
    # flag one is the start of the other (`--algorithms`, `--algo`) is close too.
    bare = {k.lstrip("-"): k for k in known}
    word = name.lstrip("-")
    close = difflib.get_close_matches(word, list(bare), n=1, cutoff=0.6) or [
        k for k in bare if min(len(k), len(word)) >= 3 and
        (k.startswith(word) or word.startswith(k))][:1]
    meant = f": did you mean {bare[close[0]]}?" if close else ""
    return f"`{prog}` has no flag {name}{meant} {usage}"


def _is_number(text: str) -> bool:
    """A negative number is a value (``--seed -1``), not a flag."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ringtune", description="Topology-aware allreduce autotuner.")
    parser.add_argument("--version", action="version", version=f"ringtune {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    sub.required = True
    for verb, modname in COMMANDS.items():
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name != modname:
                raise
            continue  # a verb not built into this installation
        p = sub.add_parser(verb, help=mod.HELP, description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        parser.verbs[verb] = p
        bound_numbers(p)
        p.set_defaults(cli_run=mod.run)
    return parser


#: A numeric flag's bounds where the generic ones are not right: ``dest`` -> (lowest,
#: highest); ``None``: left to the command, which checks it with its own message (``-n must
#: be >= 1``, ``-f must be greater than 1``). A value is always finite.
FLAG_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "trials": (1, 1_000_000),
    "seed": (0, 2**32 - 1),
    "iters": (None, 10_000_000),
    "warmup_iters": (None, 10_000_000),
    "repetitions": (None, 100_000),
    "stepfactor": (None, 1024.0),
    "margin": (0.0, 1.0),
}
#: The bounds of any other integer flag (a count: never beyond 32 bits) and float flag
#: (seconds or a factor: 1e9 s is 31 years).
INT_BOUNDS: tuple[float, float] = (-(2**31), 2**31 - 1)
FLOAT_BOUNDS: tuple[float, float] = (0.0, 1e9)


class NumberFlag:
    """The ``type=`` of every numeric flag (``bound_numbers`` puts it in place of
    ``int``/``float``): ``safefiles.numbers.parse_number`` with the flag's bounds, so ``inf``,
    ``nan``, ``1e400`` and a huge or out-of-range value are one usage line naming the flag
    and the value (exit 2). ``__name__`` is the type's, so text that is no number keeps
    argparse's line (``--trials: invalid int value: 'many'``)."""

    def __init__(self, kind: type, lo: float | None, hi: float | None, flag: str) -> None:
        self.kind, self.lo, self.hi, self.flag = kind, lo, hi, flag
        self.__name__ = kind.__name__

    def __call__(self, text: str) -> int | float:
        from safefiles.numbers import NumberError, parse_number

        try:
            self.kind(text)  # not a number at all: argparse's own "invalid int value"
        except ValueError:
            raise
        except OverflowError:
            pass
        try:
            return parse_number(text, self.flag, kind=self.kind, lo=self.lo, hi=self.hi)
        except NumberError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace(f"{self.flag}=", "", 1)
                                             ) from None


class SizeFlag:
    """The ``type=`` of every byte-size flag (a ``dest`` ending in ``bytes``):
    ``safefiles.numbers.parse_size``, so ``-b inf``, ``-e 1e400`` and ``infK`` are one usage
    line naming the flag."""

    __name__ = "size"

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __call__(self, text: str | int) -> int:
        from safefiles.numbers import NumberError, parse_size

        try:
            return parse_size(text, self.flag)
        except NumberError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace(f"{self.flag}=", "", 1)
                                             ) from None


class OutputFlag:
    """The ``type=`` of every output-file flag (``--out FILE``, ``--json FILE``): the path
    as given, after ``safefiles.outfile.check_output`` looked at it, so a directory, a
    dangling link or an unwritable place is one usage line before any probing, tuning or
    launching (``-`` is stdout). Nothing is created or opened."""

    __name__ = "output file"

    def __init__(self, flag: str, noun: str = "output") -> None:
        self.flag, self.noun = flag, noun

    def __call__(self, text: str) -> str:
        from safefiles.outfile import OutputError, check_output

        if text == "-":
            return text
        try:
            check_output(text, "")
        except OutputError as exc:
            raise argparse.ArgumentTypeError(f"{text}: cannot write {self.noun}: "
                                             f"{exc.reason or exc}") from None
        return text


#: What each verb's output file is, for the line that refuses its path.
OUTPUT_NOUNS = {"tune": "profile", "probe": "topology", "export": "the exported file",
                "bench": "JSON", "simulate": "JSON"}


def bound_numbers(parser: argparse.ArgumentParser) -> None:
    """Give every numeric flag of ``parser`` its bounded type: ``type=int``/``float``
    becomes a ``NumberFlag`` (bounds from ``FLAG_BOUNDS``, else the generic ones), a
    size flag (``dest`` ending in ``bytes``) a ``SizeFlag``, an output file (``--out``,
    ``--json FILE``) an ``OutputFlag``. Done here, once
    for every verb, so a flag added tomorrow is bounded (and fuzzed: tests/unit/
    test_hostile_inputs.py) the day it is added."""
    # argparse has no public list of a parser's actions (checked on Python 3.11.7).
    for action in parser._actions:  # noqa: SLF001
        flag = "/".join(action.option_strings) or action.dest
        if action.type in (int, float):
            kind = action.type
            generic = INT_BOUNDS if kind is int else FLOAT_BOUNDS
            lo, hi = FLAG_BOUNDS.get(action.dest, generic)
            action.type = NumberFlag(kind, lo, hi, flag)
        elif action.option_strings and action.type is None and (
                action.dest == "out" or (action.dest == "json" and action.metavar == "FILE")):
            verb = parser.prog.split()[-1]
            action.type = OutputFlag(flag, OUTPUT_NOUNS.get(verb, "output"))
        elif action.option_strings and action.dest.endswith("bytes"):
            # Also in place of a command's own size parser: one reading of sizes, bounded.
            action.type = SizeFlag(flag)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    one_line_warnings()
    try:
        if os.environ.get("RINGTUNE_LOG"):
            from collectives.plumbing.logs import log_level

            log_level()  # an unknown level: one line and exit 2, before anything runs
        from probes.environment import check_environment

        # Every RINGTUNE_* variable, before anything is launched or searched: a typo is one
        # line now, not a tune thrown away at its end (probes/environment.py).
        check_environment()
        if os.environ.get("RINGTUNE_PLUGINS"):
            from collectives.plugins import load as load_plugins

            load_plugins()  # a plug-in that does not import: one line, exit 2, up front
        args = build_parser().parse_args(args_list)
        args.cli_argv = args_list  # the verb and its flags, for relaunching under mpiexec
        code = args.cli_run(args)
        return int(code or 0)
    except KeyboardInterrupt:
        report_error("interrupted", rank=launch_rank(), before_abort=_in_mpi_world())
        # A rank blocked inside MPI never sees its SIGINT: end it rather than leave it.
        _abort_world(130)
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure becomes one clear line + code
        rank = launch_rank()
        code = report_error(exc, rank=rank, before_abort=_in_mpi_world())
        if code != 2:
            _abort_world(code, exc)
        elif rank != 0:
            _let_rank_0_speak()
        return code


#: Seconds a rank other than 0 waits before leaving with bad input that only rank 0 prints:
#: a launcher (torchrun's agent, Hydra) ends every rank when the first one exits, and the
#: first to exit must be rank 0, after its line (seen: rank 1 out first, rank 0 killed
#: before it printed, an error with no line). Bounded: the launcher ends this rank as soon
#: as rank 0 has exited.
USAGE_EXIT_GRACE_S = 5.0


def _let_rank_0_speak() -> None:
    from collectives.mpi.launcher import job_world_size

    found = job_world_size()
    if found is not None and found[0] > 1:
        time.sleep(USAGE_EXIT_GRACE_S)


def _in_mpi_world() -> bool:
    """Whether this process is a rank of a running MPI job of more than one rank (where a
    failure ends every rank with ``_abort_world``)."""
    mpi_mod = sys.modules.get("mpi4py.MPI")
    if mpi_mod is None:
        return False
    MPI = mpi_mod
    return bool(MPI.Is_initialized() and not MPI.Is_finalized()
                and MPI.COMM_WORLD.Get_size() > 1)


def _abort_world(code: int, exc: BaseException | None = None) -> None:
    """A runtime failure may strike one rank while the others wait in a collective: end
    them all (as ``python -m mpi4py`` would; ``collectives.plumbing.abort``). Rank 0 has printed
    the error; another rank prints its own, naming itself, unless it is a
    ``CommandFailed`` (raised alike on every rank, e.g. by the tuner's lockstep). Bad
    input (exit 2) is detected on every rank before any communication, so those ranks
    simply exit together without the abort."""
    if _in_mpi_world():
        from mpi4py import MPI

        from collectives.plumbing.abort import abort_world, rank_line

        world = MPI.COMM_WORLD
        line = None
        if exc is not None and world.Get_rank() != 0 and not isinstance(exc, CommandFailed):
            line = rank_line(world, f"error: {type(exc).__name__}: {exc}")
        abort_world(world, line, code)


if __name__ == "__main__":
    sys.exit(main())
