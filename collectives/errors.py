"""Exceptions of the runtime. Every one carries a message that names the value and the fix."""

from __future__ import annotations


class RingtuneError(Exception):
    """Base class of ringtune's own errors."""


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
