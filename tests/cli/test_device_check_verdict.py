"""``tests/gpu/verdict.sh``: how ``device_check.sh`` labels a step. A benchmark that ran
but missed its target is BELOW-TARGET (reported, exit status unaffected), never PASS; a
failed command is FAIL whether it was a test or a benchmark (only a test's FAIL changes
the exit status)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

VERDICT = Path(__file__).resolve().parents[1] / "gpu" / "verdict.sh"

KERNEL_MISS = ("sum float32 (16-byte vectors)     1.2   380.0   0.71\n"
               "# float32 sum at 71% of copy bandwidth: misses the 80% target\n")
KERNEL_MEET = "# float32 sum at 93% of copy bandwidth: meets the 80% target\n"
TESTS = "12 passed, 2 skipped in 3.1s\n"


def verdict(kind: str, rc: int, log: str, tmp_path: Path) -> str:
    path = tmp_path / "step.log"
    path.write_text(log)
    res = subprocess.run(["bash", "-c", f'. "$0" && step_verdict {kind} {rc} "$1"',
                          str(VERDICT), str(path)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.mark.parametrize("kind, rc, log, want", [
    ("bench", 0, KERNEL_MISS, "BELOW-TARGET"),
    ("bench", 0, KERNEL_MEET, "PASS"),
    ("bench", 0, "# Avg bus bandwidth    : 12.5\n", "PASS"),
    ("bench", 1, KERNEL_MEET, "FAIL"),
    ("bench", 124, "", "FAIL"),
    ("test", 0, TESTS, "PASS"),
    ("test", 1, "1 failed, 11 passed\n", "FAIL"),
    # A test log that happens to mention a target is still judged by its exit status.
    ("test", 0, TESTS + "misses the 80% target\n", "PASS"),
])
def test_step_verdict(kind: str, rc: int, log: str, want: str, tmp_path: Path) -> None:
    assert verdict(kind, rc, log, tmp_path) == want


def test_device_check_uses_the_verdict_for_its_labels() -> None:
    script = (VERDICT.parent / "device_check.sh").read_text()
    assert 'step_verdict "$kind" "$rc"' in script
    assert 'log "PASS $name' not in script, "a hard-coded PASS label would hide a miss"
