"""Online tuning's settings at construction: each rank reads its own
(``prepare_settings``, which takes the output lock on rank 0), the ranks agree on them in
the construction's allgather (``agree_settings``), and a profile set aside for this shape
is refused (``refuse_set_aside``). Errors are raised on every rank together, before the
first step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .lock import TuneOutLock
from .options import OUT_ENV, TUNE_ENV, OnlineOptions, resolve_mode, resolve_options, resolve_out


def prepare_settings(rank: int, tune: str | None, tune_out: str | os.PathLike[str] | None,
                     options: Mapping[str, Any] | OnlineOptions | None,
                     take_lock: bool = True) -> tuple[Any, TuneOutLock | None]:
    """This rank's tuning settings as a plain record for the construction agreement
    (``("online", options, out)``, ``("off",)``, or ``("error", line)``), and on rank 0 the
    output lock it took (unless ``take_lock`` is false: a tuner already holds it). Never
    raises: errors are agreed on first, then raised together."""
    lock = None
    try:
        if not resolve_mode(tune):
            return ("off",), None
        opts = resolve_options(options)
        out = resolve_out(tune_out)
        if out is not None and rank == 0 and take_lock:
            from ..errors import ProfileError
            from ..profile import check_writable

            try:
                check_writable(out)
            except ProfileError as exc:
                raise ValueError(f"{OUT_ENV}: {exc}") from None
            lock = TuneOutLock(out)
            lock.acquire()
        return ("online", tuple(sorted(opts.record().items())), out), lock
    except ValueError as exc:
        if lock is not None:
            lock.release()
        return ("error", f"rank {rank}: {exc}"), None


def agree_settings(everyone: Sequence[Any], rank: int) -> tuple[OnlineOptions, str | None] | None:
    """From every rank's ``prepare_settings`` record: the options in force (``None``: off),
    or ``ValueError`` on every rank naming the first rank in error or the ranks that differ."""
    from ..errors import AgreementError

    errors = [e for e in everyone if e and e[0] == "error"]
    if errors:
        raise ValueError(errors[0][1])
    kinds = {repr(e) for e in everyone}
    if len(kinds) > 1:
        groups: dict[str, list[int]] = {}
        for r, e in enumerate(everyone):
            text = "off" if e[0] == "off" else (
                f"online {dict(e[1])} out={e[2]}")
            groups.setdefault(text, []).append(r)
        detail = "; ".join(f"ranks {v}: {k}" for k, v in groups.items())
        raise AgreementError(
            f"rank {rank}: ranks set different tuning options ({detail}): set "
            f"{TUNE_ENV}, {OUT_ENV} and RINGTUNE_TUNE_* (or tune=/tune_out=/tune_options=) "
            "the same on every rank")
    mine = everyone[rank]
    if mine[0] == "off":
        return None
    return OnlineOptions(**dict(mine[1])), mine[2]


def refuse_set_aside(comm: Any) -> None:
    """Online tuning over a loaded profile that does not fit this world (set aside for the
    built-in defaults): what it wrote would mix two shapes. ``TopologyMismatchError`` on
    every rank (the decision is alike everywhere), before the first step."""
    from ..errors import TopologyMismatchError

    if comm.set_aside and comm.online is not None and comm.online.out is not None:
        raise TopologyMismatchError(
            f"rank {comm.rank}: {comm.set_aside}; online tuning would write {comm.online.out}"
            " for this shape from it: load a profile for this shape (or none), or write "
            f"another {OUT_ENV}")
