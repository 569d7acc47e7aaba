"""Exceptions of the runtime. Every one carries a message that names the value and the fix."""

from __future__ import annotations

from collections.abc import Sequence


class RingtuneError(Exception):
    """Base class of ringtune's own errors."""


class PeerFailure(RingtuneError):
    """This rank's call failed because of a peer, which the message names: its process
    ended (killed, crashed), it stopped answering, or the link to it broke. The line that
    ends the job then points at that peer, not at the arguments of the call
    (``collectives.failures``)."""


class ProfileError(RingtuneError, ValueError):
    """A profile file cannot be read, does not validate, or does not fit this world.

    The message starts with the file name and the key path, e.g.
    ``local.yaml: rules[1].params.rings: expected an integer 1..16, got 'two'``.
    """


class TopologyMismatchError(RingtuneError):
    """A profile's topology fingerprint differs from this world's (raised when strict)."""


class AgreementError(RingtuneError, ValueError):
    """Ranks disagree on something that must be equal on all ranks (profile, size, dtype, op,
    backend). Raised identically on every rank so that none is left hanging."""


def require_agreement(values: Sequence[object], what: str, fix: str) -> None:
    """Raise ``AgreementError`` unless every rank's value is equal (``values[r]`` is rank r's,
    as an allgather returns them). Call it on every rank with the same gathered list: then
    every rank raises the same message, naming each rank's value, ``what`` differs and the
    ``fix``."""
    if len(set(values)) > 1:
        detail = "; ".join(f"rank {r}: {v}" for r, v in enumerate(values))
        raise AgreementError(f"{what} differ across ranks ({detail}): {fix}")


class WorldMismatchError(AgreementError):
    """The communicator's world is not the job's: e.g. ``MPI.COMM_WORLD`` is a 1-rank
    singleton in a job that torchrun (or another MPI's launcher) started with N ranks, or
    DDP's process group has N ranks where the communicator has M. Training on would never
    average a gradient, so it is refused on every rank before the first step."""
