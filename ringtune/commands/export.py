"""Write a profile's tuned choice as the native library's own tuning file, for jobs that
never import ringtune:

  mpich  MPICH collective-selection JSON: MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE=FILE
         (+ FILE.ch4.json for native compositions:
          MPIR_CVAR_CH4_COLL_SELECTION_TUNING_JSON_FILE=FILE.ch4.json)
  nccl   NCCL example tuner-plugin CSV:   NCCL_TUNER_PLUGIN=... NCCL_TUNER_CONFIG_FILE=FILE
  ompi   Open MPI coll/tuned rules:       --mca coll_tuned_use_dynamic_rules 1
                                          --mca coll_tuned_dynamic_rules_filename FILE

Without --format: the format of the MPI library the profile was tuned with (its module in
collectives.natives names it). Rules of ringtune's own algorithms are exported as the best
native candidate measured for
each bucket; every substitution is said per rule (comments, or stderr for JSON). The MPICH
file is checked by starting the installed MPICH with it before it is written.

example:
  ringtune export profiles/local.yaml --format mpich --out tuning.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..flags import add_profile

HELP = "write a profile as MPICH / NCCL / Open MPI's own tuning file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_profile(p)
    p.add_argument("--format", metavar="mpich|nccl|ompi",
                   help="the library whose file to write (default: the format of the MPI "
                        "library the profile records)")
    p.add_argument("--out", metavar="FILE", help="file to write (default: stdout)")


def run(args: argparse.Namespace) -> int:
    import importlib

    from collectives.plumbing.atomic import write_text_atomic
    from collectives.profile import check_writable, load_profile
    from collectives.profile.shapes import tuned_sizes
    from ringtune.errors import UsageError
    from ringtune.export import FORMATS, format_of, plan

    if args.out:
        check_writable(args.out)
    prof = load_profile(args.profile)
    if args.format is None:
        args.format = format_of(prof)
    if args.format not in FORMATS:
        raise UsageError(f"--format {args.format!r}: unknown; use one of {', '.join(FORMATS)}")
    shapes = [(prof, plan(prof))]  # the main shape must have something to export
    _check_library(args, prof, shapes[0][1])
    for w in sorted(set(tuned_sizes(prof.document)) - {prof.world_size}):
        sec = load_profile(args.profile, world_size=w)
        try:
            shapes.append((sec, plan(sec)))
        except ValueError:
            print(f"ringtune export: the {w}-rank section has nothing native to export; "
                  "that shape gets the file's largest-shape choices", file=sys.stderr)
    # Smallest first: MPICH's branches are comm_size<=N in order, the largest takes the rest.
    shapes.sort(key=lambda ps: ps[0].world_size or 0)
    mod = importlib.import_module(f"ringtune.export.{args.format}")
    text, notes = mod.render(shapes)
    ch4 = mod.render_ch4(shapes) if args.format == "mpich" else None
    if ch4 is not None and not args.out:
        raise UsageError("--format mpich: the profile names MPICH compositions, which go to "
                         "a second file (ch4's selection) next to --out: give --out FILE")
    if ch4 is not None:
        from safefiles.outfile import target_of

        # Written through a device (--out /dev/stdout), the second file would land in /dev.
        if target_of(args.out, "--out")[1]:
            raise UsageError(f"--out {args.out}: the profile names MPICH compositions, which "
                             "go to a second file next to --out: give --out a regular file")
    if args.format == "mpich":
        mod.check_with_library(text, ch4_text=ch4[0] if ch4 else None)
    if args.format != "mpich":
        from collectives.natives import libraries

        owner = {c: lib.name for lib in libraries() for c in lib.compositions}
        notes += [f"rules[{s.rule}]: composition {s.composition} is "
                  f"{owner.get(s.composition, 'another library')}'s; {args.format} "
                  "has no such choice: not exported" for _, segs in shapes for s in segs
                  if s.composition != "auto"]
    for note in notes + (ch4[1] if ch4 else []):
        print(f"ringtune export: {note}", file=sys.stderr)
    if args.out:
        write_text_atomic(args.out, text)
        print(f"wrote {args.out} ({args.format})", file=sys.stderr)
        if ch4 is not None:
            path = mod.ch4_path(args.out)
            write_text_atomic(path, ch4[0])
            print(f"wrote {path} (MPICH ch4 compositions): run jobs with "
                  f"{mod.ENV_FILE}={args.out} {mod.CH4_ENV_FILE}={path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _check_library(args: argparse.Namespace, prof: object, segments: Sequence[object]) -> None:
    """``UsageError`` when the profile names algorithms (``impl``) of another MPI library
    than the format's and the format cannot translate them (a file for another library)."""
    import importlib

    from ringtune.errors import UsageError

    mod = importlib.import_module(f"ringtune.export.{args.format}")
    own = getattr(mod, "LIBRARY", "")
    lib = getattr(prof, "library", None)  # the validated record (Profile.library)
    tuned = str(lib.name) if lib is not None else ""
    if not own or not tuned or tuned == own or tuned in getattr(mod, "TRANSLATES", ()):
        return
    impls = sorted({str(getattr(s, "impl", "auto")) for s in segments} - {"auto"})
    if impls:
        from collectives.natives import for_name

        theirs = for_name(tuned).export_format
        fix = f"use --format {theirs}" if theirs else f"there is no {tuned} format"
        raise UsageError(f"{args.profile}: tuned with {tuned} (impl {', '.join(impls)}); "
                         f"--format {args.format} writes {own}'s file, which has no such "
                         f"algorithms: {fix}, or re-tune with {own}")
