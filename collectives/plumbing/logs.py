"""``RINGTUNE_LOG``: what the runtime logs, on rank 0, to stderr (``ringtune: …`` lines).

``info``: one line per new plan: the message size, the rule and algorithm the profile chose
and the busbw it measured. ``debug``: also the profile in use when a ``Communicator`` is
built (or why it was set aside), each plan's filled-in parameters and transport, and one
line per ``allreduce`` call; the CLI adds the traceback of an error. Unset or empty: quiet.

Use ``log_level()`` to read the variable (``ValueError`` naming it and the allowed values
for anything else: ``Communicator`` and the ``ringtune`` command refuse an unknown level
instead of ignoring it), and ``configure()`` once at import to attach the handler.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

#: The levels ``RINGTUNE_LOG`` accepts, least to most detail.
LOG_LEVELS = ("info", "debug")

log = logging.getLogger("ringtune")


def log_level(environ: Mapping[str, str] | None = None) -> str | None:
    """``info``, ``debug``, or ``None`` (unset or empty); ``ValueError`` otherwise."""
    raw = (os.environ if environ is None else environ).get("RINGTUNE_LOG", "")
    level = raw.strip().lower()
    if not level:
        return None
    if level not in LOG_LEVELS:
        raise ValueError(f"RINGTUNE_LOG={raw!r}: unknown log level; use one of "
                         f"{', '.join(LOG_LEVELS)} (or unset it for no log)")
    return level


def configure() -> None:
    """Attach a ``ringtune: …`` stderr handler at the level ``RINGTUNE_LOG`` names. An
    unknown level configures nothing here: importing must not fail, and the
    ``Communicator`` built next raises the error."""
    try:
        level = log_level()
    except ValueError:
        return
    if level and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("ringtune: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.DEBUG if level == "debug" else logging.INFO)
