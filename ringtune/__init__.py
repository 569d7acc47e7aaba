"""The ``ringtune`` command line (``ringtune probe|bench|tune|show|validate|simulate``)."""

__version__ = "0.1.0"
