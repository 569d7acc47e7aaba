"""The profile format's constants: its name and version, the values a few keys take, and the
caps of a file. Plain values, light to import (``import collectives`` reads them):
``collectives.profile`` re-exports them and ``collectives.profile.records`` declares the file's
records with them.
"""

from __future__ import annotations

FORMAT = "ringtune-profile"
VERSION = 1

PROFILE_DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")
PROFILE_OPS = ("sum", "prod", "min", "max", "avg")
#: Range bounds: a world of 4 M ranks and messages of 4 EiB are beyond any machine; larger
#: values are typing errors that would overflow later (in plans, in NumPy sizes).
MAX_RULE_BYTES = 1 << 62
#: Size caps of a profile, checked before anything in it is converted: a tuned profile has
#: a handful of rules (one per size range where the winner changes), so these leave room
#: for hand-made tables and keep loading and refusing well under a second.
MAX_PROFILE_BYTES = 1 << 20
MAX_RULES = 1024
#: Largest figure under ``measured`` (GB/s, µs, ratios): finite and readable back.
MAX_MEASURED = 1e18

#: ``shapes``: its sections' sources, how many a profile may have (one per job shape a
#: cluster runs; ``MAX_RULES`` bounds each), and the largest world size of a profile: 4 M
#: ranks is beyond any machine; a larger value is a typing error that would overflow later.
SOURCES = ("tuned", "predicted")
MAX_SHAPES = 64
MAX_WORLD_SIZE = 1 << 22
