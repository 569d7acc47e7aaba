"""The CLI prints the project's warnings as one line each, like its errors; other
packages' warnings keep Python's format."""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from ringtune.errors import one_line_warnings


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    out = io.StringIO()

    def python_format(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, file: Any = None, line: str | None = None) -> None:
        out.write(warnings.formatwarning(message, category, filename, lineno, line))

    monkeypatch.setattr(warnings, "showwarning", python_format)
    one_line_warnings()
    yield out


def test_own_warnings_are_one_line(shown: io.StringIO) -> None:
    warnings.showwarning("ringtune: Intel MPI 2021.18.1 runs its default only",
                         RuntimeWarning, "/x/collectives/natives/base.py", 12, shown)
    warnings.showwarning("p.yaml: tuned with MPICH 4.1\nre-tune", RuntimeWarning,
                         "/x/autotune/choose.py", 5, shown)
    assert shown.getvalue() == ("ringtune: Intel MPI 2021.18.1 runs its default only\n"
                                "ringtune: warning: p.yaml: tuned with MPICH 4.1 re-tune\n")


def test_other_packages_keep_pythons_format(shown: io.StringIO) -> None:
    warnings.showwarning("deprecated", DeprecationWarning, "/x/site-packages/optuna/a.py", 7,
                         shown)
    assert "optuna/a.py:7: DeprecationWarning: deprecated" in shown.getvalue()


def test_installing_again_adds_no_layer(shown: io.StringIO) -> None:
    once = warnings.showwarning
    one_line_warnings()  # main() called again in the same process
    assert warnings.showwarning is once
