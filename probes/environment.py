"""The one table of ringtune's own environment variables (``RINGTUNE_*``): name, kind,
allowed values, default and meaning, and the check of them all at once.

Use ``check_environment()`` at the start of anything that acts: every CLI verb
(``ringtune.cli.main``) and every ``Communicator`` construction call it before any launch,
search or message, so a typo (``RINGTUNE_TIMING_CHECK=bogus``) is one line naming the
variable, its value and what it accepts — not a tune thrown away at its end because the
value was read only then. The modules that use a variable still parse it where they use it
(``collectives.online``, ``collectives.plumbing.stall``, …); this table is what they accept,
checked early, and the source of docs/environment.md's rows for them (``python -m
probes.environment`` prints them, ``--write`` puts them in the page (``make docs``);
``tests/unit/test_environment.py`` holds the page, the
code and the modules' own parsers to the table).

A new variable is a row of ``VARIABLES``: the unit tests then find it undocumented until
the page is regenerated, and feed it hostile values (``tests/unit/test_hostile_inputs.py``).
An empty value means unset for every kind (the default applies).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from safefiles.numbers import NumberError, parse_number
from safefiles.outfile import OutputError, check_output

#: What a flag accepts, case-insensitively: on, then off.
FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("0", "false", "no", "off")
#: Longest value of a path or text variable: PATH_MAX.
MAX_TEXT = 4096
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class EnvValueError(ValueError):
    """A ``RINGTUNE_*`` variable whose value is not one the table allows; one line
    ``NAME='value': what is wrong; the fix``."""


@dataclass(frozen=True)
class Variable:
    """One ``RINGTUNE_*`` variable. ``kind``: ``flag`` (``FLAG_ON``/``FLAG_OFF``),
    ``choice`` (one of ``choices``), ``int``/``float``/``seconds`` (a finite number in
    ``lo``..``hi``), ``file`` (an existing regular file to read), ``out`` (a file to write:
    ``safefiles.outfile.check_output``), ``modules`` (comma-separated Python module names),
    ``command`` (an executable, a path or a name on ``PATH``), ``pid`` (a process id, set by
    ringtune) or ``text`` (any one line, set by ringtune)."""

    name: str
    kind: str
    default: str
    meaning: str
    choices: tuple[str, ...] = ()
    lo: float | None = None
    hi: float | None = None
    #: Set by ringtune for the processes it starts (documented; a user need not set it).
    internal: bool = False
    #: What an unknown choice is called in the line (the owning module's own word: ``unknown
    #: tuning mode``), so the early check and the module say the same.
    unknown: str = "value"

    def accepts(self, markdown: bool = False) -> str:
        """What the variable accepts, in words: for the error lines, or (``markdown``) for
        the docs' column."""
        if self.kind == "flag":
            return f"{'/'.join(FLAG_ON)} or {'/'.join(FLAG_OFF)}"
        if self.kind == "choice":
            if markdown:
                return ", ".join(f"`{c}`" for c in self.choices)
            return "one of " + ", ".join(self.choices)
        if self.kind in ("int", "float", "seconds"):
            noun = {"int": "an integer", "float": "a number",
                    "seconds": "seconds"}[self.kind]
            if self.lo is not None and self.hi is not None:
                return f"{noun}, {_g(self.lo)}..{_g(self.hi)}"
            return f"{noun} >= {_g(self.lo or 0)}"
        return {"file": "a readable file", "out": "a writable file, device or FIFO",
                "modules": "module names, comma-separated", "command": "an executable",
                "pid": "a process id", "text": "one line of text"}[self.kind]


def _g(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


_ONLINE = "Online tuning (`RINGTUNE_TUNE=online`): "

#: Every RINGTUNE_* variable the product reads, in the order of docs/environment.md.
VARIABLES: tuple[Variable, ...] = (
    Variable("RINGTUNE_PROFILE", "file", "none: the built-in defaults",
             "The profile a `Communicator` (and the DDP hook, and `ringtune bench` without "
             "`--profile`) loads when none is passed. One that cannot be read or validated "
             "raises `ProfileError` on every rank."),
    Variable("RINGTUNE_STRICT", "flag", "off",
             "A profile tuned for another shape (world size, hosts, fingerprint) raises "
             "`TopologyMismatchError` on every rank instead of warning once and falling "
             "back to the built-in defaults."),
    Variable("RINGTUNE_CHECK", "flag", "off",
             "Before every call, the ranks compare size, dtype, op and choice: a mismatch "
             "(which would hang) becomes the same error on every rank. Costs one small "
             "collective per call."),
    Variable("RINGTUNE_TOPOLOGY", "file", "detect",
             "A topology file (`ringtune probe --out`) used instead of detection, for VMs "
             "and containers that hide the hardware."),
    Variable("RINGTUNE_LOG", "choice", "warnings only",
             "`info`: which rule and algorithm each size gets, once per plan; `debug`: "
             "also the profile in use, each plan's parameters, one line per call, "
             "tracebacks of CLI errors.", choices=("info", "debug"), unknown="log level"),
    Variable("RINGTUNE_ON_ERROR", "choice", "abort",
             "`abort`: a failure once communication may have begun prints `ringtune: "
             "rank R: …` and ends every rank; `raise`: the exception goes to the caller.",
             choices=("abort", "raise"), unknown="error mode"),
    Variable("RINGTUNE_STALL_TIMEOUT", "seconds",
             "0: off for MPI waits (forever, as MPI does); 1800 for `shm` waits",
             "Seconds without progress after which a wait ends with `StallError` naming "
             "the rank and the peers it waited on (a dead peer, a link that is down). "
             "`shm` waits also name a peer whose process has ended within 0.2 s.",
             lo=0, hi=1e9),
    Variable("RINGTUNE_NAME_EXITS", "flag", "on",
             "`0` turns off the line a rank writes when it leaves through `os._exit` (so "
             "the user sees which rank ended first even when the launcher kills the "
             "others)."),
    Variable("RINGTUNE_SHM_HUGE_PAGES", "flag", "on",
             "`shm`'s single copy asks the kernel for huge pages under a buffer the second "
             "time it meets it (`madvise` `MADV_HUGEPAGE`, `MADV_COLLAPSE`; once per "
             "buffer, only its whole 2 MiB pages; `collectives/shm/pages.py`): on a torch "
             "tensor's 4 KiB pages the peers' reads and writes of it took up to 1.4x "
             "longer. `0` leaves every buffer's pages as they are."),
    Variable("RINGTUNE_CUDA_AWARE", "flag", "detect",
             "`1`/`0`: whether MPI may be given GPU buffers, overriding the detection "
             "(`MPIX_Query_cuda_support`)."),
    Variable("RINGTUNE_PLUGINS", "modules", "none",
             "Plug-in modules imported on every rank the first time a registry is asked "
             "for a name it does not know or for its list (`collectives/plugins.py`): a "
             "site's own algorithms, backends, transports, engines or MPI libraries. One "
             "that does not import is an error naming the variable and the module (the "
             "CLI: one line, exit 2)."),
    Variable("RINGTUNE_MPIEXEC", "command",
             "the `mpiexec` next to the Python executable, else the one on `PATH`",
             "The `mpiexec` that `ringtune tune`/`bench` use to launch themselves."),
    Variable("RINGTUNE_MAX_RANKS", "int", "the machine's bound (`ringtune/launch.py`)",
             "The most ranks `ringtune tune`/`bench -np N` may launch on this machine, "
             "replacing the bound that follows from its cores, PID limits and memory "
             "(16 per core, PID headroom, 200 MiB of available memory per rank): the "
             "explicit way past it.", lo=1, hi=1_000_000),
    Variable("RINGTUNE_EMULATE_WAIT", "seconds", "0: refuse at once, naming the running one",
             "Seconds `ringtune emulate` waits for another emulation on this machine to "
             "end (one runs at a time) before refusing; `--wait` wins.", lo=0, hi=1e9),
    Variable("RINGTUNE_LAUNCHED", "pid", "unset",
             "Set by ringtune's self-launch to its own PID for the ranks it starts, so a "
             "rank does not launch again and the storage lock names the launching "
             "process. Internal: do not set it.", internal=True),
    Variable("RINGTUNE_EMULATED", "text", "unset",
             "Set by `ringtune emulate` for every rank: the name of the emulated cluster. "
             "Internal: do not set it.", internal=True),
    Variable("RINGTUNE_TUNE", "choice", "off",
             "`online`: the job's own allreduce calls try candidates of the tuner's search "
             "space per message size (its buckets) and settle on the fastest; `off`, "
             "`none`, `0`, `no`, `false` or unset: the profile's choice only. Same as "
             "`Communicator(..., tune=\"online\")`.",
             choices=("online", "off", "none", "0", "no", "false"), unknown="tuning mode"),
    Variable("RINGTUNE_TUNE_OUT", "out", "none",
             "Where online tuning writes the settled choices as a profile for this shape "
             "(at `close()`, at exit, or on `save_tuning()`), as every output is written "
             "(`safefiles/outfile.py`); a second job writing the same file is refused at its "
             "start."),
    Variable("RINGTUNE_TUNE_CALLS", "int", "32",
             _ONLINE + "exploring calls per size class before it settles on the best so "
             "far.", lo=1, hi=1_000_000),
    Variable("RINGTUNE_TUNE_SAMPLES", "int", "3",
             _ONLINE + "calls per candidate still in contention (its score is the median "
             "of their slowest-rank times).", lo=1, hi=1000),
    Variable("RINGTUNE_TUNE_SHARE", "float", "0.1",
             _ONLINE + "an exploring call runs only when exploring's cost so far beyond "
             "the best candidate's, plus the call's predicted extra, fits in this share of "
             "the job's time; otherwise the best so far runs.", lo=0.0, hi=1.0),
    Variable("RINGTUNE_TUNE_CANDIDATES", "int", "8", _ONLINE + "candidates per size class.",
             lo=1, hi=1000),
    Variable("RINGTUNE_TUNE_MARGIN", "float", "0.03",
             _ONLINE + "a challenger replaces the incumbent only when faster by this "
             "fraction.", lo=0.0, hi=0.9),
    Variable("RINGTUNE_TUNE_PRUNE", "float", "1.25",
             _ONLINE + "a candidate whose first call takes more than this many times the "
             "best's first call is dropped, and only candidates within it of the best are "
             "called again.", lo=1.0, hi=1e6),
    Variable("RINGTUNE_TUNE_SEED", "int", "0", _ONLINE + "seed of rank 0's random draws.",
             lo=0, hi=2**31),
    Variable("RINGTUNE_TUNE_WARMUP", "int", "1",
             _ONLINE + "first calls of each message size that run the profile's choice "
             "untimed (the job's own warm-up).", lo=0, hi=1000),
    Variable("RINGTUNE_TUNE_CONFIRM", "int", "6",
             _ONLINE + "calls each of the two fastest candidates gets, alternately, before "
             "a message size settles (0 or at most `RINGTUNE_TUNE_SAMPLES`: no final "
             "round).", lo=0, hi=1000),
    Variable("RINGTUNE_TIMING_CHECK", "choice", "stop",
             "`ringtune tune`: what happens when the A/B stage's re-measurement of a "
             "candidate disagrees with the same run's search by more than 10x twice "
             "(unpinned or oversubscribed ranks): `stop` ends the tune with one line naming "
             "the likely cause and writes nothing; `warn` says so and goes on.",
             choices=("stop", "warn"), unknown="timing check"),
)

#: name -> row.
TABLE: dict[str, Variable] = {v.name: v for v in VARIABLES}


def _refuse(var: Variable, raw: str, problem: str) -> EnvValueError:
    shown = raw if len(raw) <= 200 else raw[:200] + "..."
    return EnvValueError(f"{var.name}={shown!r}: {problem}; expected {var.accepts()} "
                             f"(or unset it: {var.default})")


def check_value(var: Variable, raw: str) -> Any:
    """``raw`` (the variable's text) checked against its row: the parsed value (``None``
    for empty, i.e. unset), or ``EnvValueError`` naming the variable, the value and what
    it accepts. Looks only: nothing is created, opened or imported."""
    text = raw.strip()
    if not text:
        return None
    if "\0" in raw or "\n" in text or len(raw) > MAX_TEXT:
        raise _refuse(var, raw, "not one line of text")
    kind = var.kind
    if kind == "flag":
        low = text.lower()
        if low in FLAG_ON or low in FLAG_OFF:
            return low in FLAG_ON
        raise _refuse(var, raw, "not a flag")
    if kind == "choice":
        if text.lower() in var.choices:
            return text.lower()
        raise _refuse(var, raw, f"unknown {var.unknown}")
    if kind in ("int", "float", "seconds"):
        try:
            return parse_number(text, var.name, kind=int if kind == "int" else float,
                                lo=var.lo, hi=var.hi)
        except NumberError as exc:
            raise EnvValueError(f"{exc} (or unset it: {var.default})") from None
    if kind == "pid":
        if text.isdigit() and 0 < int(text) < 1 << 32:
            return int(text)
        raise _refuse(var, raw, "not a process id (set by ringtune; unset it)")
    if kind == "file":
        try:
            st = os.stat(text)
        except OSError as exc:
            raise _refuse(var, raw, f"cannot read it ({exc.strerror or exc})") from None
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(var, raw, "not a regular file")
        return text
    if kind == "out":
        try:
            check_output(text, f"{var.name}=")
        except OutputError as exc:
            raise EnvValueError(str(exc)) from None
        return text
    if kind == "modules":
        names = [m.strip() for m in text.split(",") if m.strip()]
        bad = [m for m in names if not _MODULE.match(m)]
        if bad:
            raise _refuse(var, raw, f"{bad[0]!r} is not a module name")
        return names
    if kind == "command":
        found = shutil.which(text)
        if found is None:
            raise _refuse(var, raw, "not an executable file, nor a command on PATH")
        return found
    return text  # text: any one line


def check_environment(environ: Mapping[str, str] | None = None,
                      skip: Collection[str] = ()) -> dict[str, Any]:
    """Check every ``RINGTUNE_*`` variable of the table that is set (but those in
    ``skip``): ``{name: value}`` of the set ones, or ``EnvValueError`` (one line) for the
    first bad one. Call it before anything is launched, searched or communicated."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for var in VARIABLES:
        if var.name in skip:
            continue
        raw = env.get(var.name)
        if raw is not None:
            out[var.name] = check_value(var, raw)
    return out


def markdown_rows() -> str:
    """The rows docs/environment.md has for the table, one per variable."""
    lines = ["| name | accepts | what it does | default |", "|---|---|---|---|"]
    for v in VARIABLES:
        lines.append(f"| `{v.name}` | {v.accepts(markdown=True)} | {v.meaning} | "
                     f"{v.default} |")
    return "\n".join(lines) + "\n"


#: The page whose generated block holds ``markdown_rows()``, and the block's markers.
PAGE = os.path.join("docs", "environment.md")
BEGIN = "<!-- generated from probes/environment.py (python -m probes.environment): do not edit -->"
END = "<!-- end of the generated table -->"


def render_page(page: str) -> str:
    """``page`` (docs/environment.md's text) with its generated block replaced by
    ``markdown_rows()``; ``ValueError`` when the markers are missing."""
    head, sep, rest = page.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise ValueError(f"{PAGE}: the markers of the generated table are missing")
    return f"{head}{BEGIN}\n{markdown_rows()}{END}{tail}"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write"]:  # make docs
        from safefiles.outfile import write_text

        with open(PAGE, encoding="utf-8") as fh:
            write_text(PAGE, render_page(fh.read()))
    else:
        print(markdown_rows(), end="")
