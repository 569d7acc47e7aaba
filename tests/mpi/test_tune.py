"""``autotune.tuning.tune`` in process, at any world size: every rank gets the same profile,
the file is valid for this world, and a second run resumes without redoing buckets."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import pytest

from autotune.tuning import TuneError, TuneOptions, tune
from collectives.profile import load_profile

from .conftest import WORLD, agree

N = WORLD.Get_size()
RANK = WORLD.Get_rank()


@pytest.fixture()
def folder() -> Any:
    path = WORLD.bcast(tempfile.mkdtemp(prefix="ringtune-tune-") if RANK == 0 else None)
    yield path
    WORLD.Barrier()
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)


def options(folder: str, **kw: Any) -> TuneOptions:
    base = dict(out=os.path.join(folder, "p.yaml"), buckets=[1024, 16384], trials=3,
                budget_s=60.0, sampler="random", seed=1, trial_timeout_s=120.0,
                algorithms=["native", "rhd", "multiring"], progress=False)
    base.update(kw)
    return TuneOptions(**base)  # type: ignore[arg-type]


def test_tune_gives_every_rank_the_same_valid_profile(folder: str) -> None:
    result = tune(WORLD, options(folder))
    everyone = WORLD.allgather(result.profile["rules"])
    fails = []
    if any(r != everyone[0] for r in everyone):
        fails.append("ranks built different rules")
    prof = load_profile(os.path.join(folder, "p.yaml"), world_size=N)
    if prof.rules[0].min_bytes != 0 or prof.rules[-1].max_bytes is not None:
        fails.append("rules do not cover every size")
    if [s.evaluated for s in result.buckets] != [3, 3] and N > 1:
        fails.append(f"trials per bucket {[s.evaluated for s in result.buckets]}")
    for c in result.choices:
        if c.algorithm != "native" and c.time_us * 1.03 > c.native_time_us:
            fails.append(f"{c.nbytes} B: {c.algorithm} adopted without beating native by 3%")
    agree(fails)

    with open(os.path.join(folder, "p.yaml"), "rb") as fh:
        first_bytes = fh.read()
    again = tune(WORLD, options(folder))
    fails = []
    if [s.evaluated for s in again.buckets] != [s.evaluated for s in result.buckets]:
        fails.append("a resumed run searched finished buckets again")
    if [s.reason for s in again.buckets] != [s.reason for s in result.buckets]:
        fails.append("finished reasons changed on resume")
    # Nothing new to measure: the recorded A/B choices are reused, the profile is the same
    # mapping on every rank and the same bytes on disk, and the file is not rewritten.
    if again.profile != result.profile:
        fails.append("a rerun of a finished tune built a different profile")
    if again.added != 0 or result.added != sum(s.evaluated for s in result.buckets):
        fails.append(f"trials added: first run {result.added}, rerun {again.added}")
    if RANK == 0:
        with open(os.path.join(folder, "p.yaml"), "rb") as fh:
            if fh.read() != first_bytes:
                fails.append("a rerun of a finished tune changed the profile's bytes")
        if again.rewritten:
            fails.append("a rerun rewrote an unchanged profile")
    agree(fails)


def test_bad_storage_raises_the_same_on_every_rank(folder: str) -> None:
    try:
        tune(WORLD, options(folder, storage="nosuchdb://nowhere"))
        result = "ok"
    except TuneError as exc:
        result = f"usage={exc.usage}: {exc}"
    everyone = WORLD.allgather(result)
    fails = [] if result.startswith("usage=True") and "nosuchdb" in result else [result]
    if len(set(everyone)) != 1:
        fails.append(f"ranks disagree: {everyone}")
    agree(fails)
