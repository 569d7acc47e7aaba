"""Test-only algorithms, registered in the ranks of a tuning run by
``RINGTUNE_PLUGINS=tests.sleep_algorithm`` (with the repository on ``PYTHONPATH``).

``sleep``: sleeps ``seconds`` while its plan is built (once per candidate in the tuner,
since the check and the timing share the plan), then runs the native allreduce. With a
large ``seconds`` it is the deliberately hanging candidate the watchdog tests need; with a
small one it makes trials slow enough to interrupt a tuning run midway. Its search space
offers the values in ``$RINGTUNE_TEST_SLEEP`` (comma-separated seconds, default 3600).
``$RINGTUNE_TEST_SLEEP_CAP`` caps the actual delay without changing the configuration: the
same candidate that hung in one run completes in the next (a fault that went away).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from collectives.algorithms.base import Algorithm, Context
from collectives.algorithms.registry import register


@register
class Sleep(Algorithm):
    """Native allreduce after a deliberate delay in plan construction."""

    name = "sleep"
    param_names = ("seconds",)
    test_only = True

    @classmethod
    def check_params(cls, params: Mapping[str, Any], world_size: int) -> dict[str, Any]:
        p = super().check_params(params, world_size)
        sec = p.get("seconds", 0.0)
        if isinstance(sec, bool) or not isinstance(sec, (int, float)) or sec < 0:
            raise ValueError(f"seconds: expected a number ≥ 0, got {sec!r}")
        return {"seconds": float(sec)}

    @classmethod
    def search_space(cls, trial: Any, world_size: int, nbytes: int) -> dict[str, Any]:
        text = os.environ.get("RINGTUNE_TEST_SLEEP", "3600")
        choices = [float(x) for x in text.split(",") if x.strip()]
        return {"seconds": trial.suggest_categorical("sleep.seconds", choices)}

    def __init__(self, ctx: Context, count: int, dtype: str, op: str,
                 params: Mapping[str, Any]) -> None:
        super().__init__(ctx, count, dtype, op, params)
        cap = float(os.environ.get("RINGTUNE_TEST_SLEEP_CAP", "inf"))
        time.sleep(min(self.params["seconds"], cap))

    def run(self, buf: Any) -> None:
        if self.count == 0 or self.ctx.size == 1:
            return
        self.ctx.transport.native_allreduce(buf, self.op)
