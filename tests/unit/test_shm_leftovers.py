"""``tests/shm_leftovers.py``: only MPICH segments of the run, old enough, mapped by nobody."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests import shm_leftovers


def test_only_old_unmapped_segments_of_the_run_are_chosen(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(shm_leftovers, "SHM", tmp_path)
    monkeypatch.setattr(shm_leftovers, "mapped", lambda: {"mpich_shm_live_0"})
    old = time.time() - 2 * shm_leftovers.MIN_AGE_S
    for name in ("mpich_shm_dead_0", "mpich_shm_live_0", "mpich_shm_new_0",
                 "sm_segment.vm.0.1.0", "ringtune-x", "other"):
        (tmp_path / name).write_bytes(b"")
        if name != "mpich_shm_new_0":
            os.utime(tmp_path / name, (old, old))
    found = shm_leftovers.leftovers(since=0)
    assert sorted(p.name for p in found) == ["mpich_shm_dead_0", "sm_segment.vm.0.1.0"]
    # Created before the run began: not this run's to remove.
    assert shm_leftovers.leftovers(since=time.time() + 10) == []
