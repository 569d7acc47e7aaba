"""Emulated clusters on one machine: network namespaces as hosts, shaped veth links.

Use ``ringtune emulate --cluster FILE -- COMMAND…`` (``ringtune.commands.emulate``); the
pieces are ``spec`` (what to build, from a ``profiles/clusters/`` file), ``netns`` (building
and removing the namespaces, links and shaping, the lock, leftovers) and ``runner`` (the
launcher shim and running the command under Hydra). Needs root and ``ip``/``tc``/``unshare``.
"""

from __future__ import annotations

from .spec import EmulatedCluster, load_emulated

__all__ = ["EmulatedCluster", "load_emulated"]
