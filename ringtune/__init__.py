"""The ``ringtune`` command line: ``ringtune probe|bench|tune|show|validate|simulate|emulate|
export`` (one module per verb under ``ringtune/commands``)."""

from collectives import __version__  # the one place the version is written

__all__ = ["__version__"]
