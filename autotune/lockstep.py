"""Keeping the ranks of a tuning run in step: rank 0 decides, every rank follows or fails
alike.

Use ``on_root`` for any decision that changes control flow (rank 0 computes it, every rank
gets the result or raises the same ``TuneError``), and ``abort`` when a rank cannot return
(a trial hung past ``--trial-timeout``) and the whole world must stop with one message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collectives.plumbing.abort import abort_world

from .records import TuneError
from .storage_errors import failure_text, storage_failure


def on_root(comm: Any, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 and broadcast its result; if it raised, every rank raises the
    same ``TuneError`` (so no rank is left waiting in the next collective)."""
    payload: Any = None
    if comm.Get_rank() == 0:
        try:
            payload = ("ok", fn())
        except TuneError as exc:
            payload = ("err", str(exc), exc.usage)
        except (ValueError, TypeError, OSError) as exc:
            payload = ("err", str(exc), True)
        except Exception as exc:  # noqa: BLE001 - every rank must learn about it
            # A full disk under the storage must say so, not "StorageInternalError"; it is
            # the user's to fix (free space, another --storage) like an unwritable --out,
            # so it is exit 2, and every rank raises it: no MPI_Abort.
            storage = storage_failure(exc)
            payload = ("err", storage or failure_text(exc), storage is not None)
    payload = comm.bcast(payload, root=0)
    if payload[0] == "err":
        raise TuneError(payload[1], usage=payload[2])
    return payload[1]


def abort(comm: Any, message: str) -> None:
    """End every rank with ``ringtune: error: message`` (``collectives.plumbing.abort``)."""
    abort_world(comm, f"ringtune: error: {message}", 1)
