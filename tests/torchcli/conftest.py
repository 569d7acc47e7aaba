"""Launcher tests of ringtune under torchrun: one plain pytest process (in the torch
environment) that starts ``torchrun`` jobs through ``subprocess`` and checks their exit
codes and output (``make torchbackend-test``). Skipped where torch is not installed."""

from __future__ import annotations

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["test_*.py"]
