"""``collectives.mpit``: the installed MPICH's allreduce algorithm list and its numbering.

The numbering (a choice's position in the variable's description) is checked against the
value MPICH itself sets when the choice is given in the environment at launch, for every
listed algorithm; and ``import collectives`` must not touch MPI_T."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from collectives import mpit

pytestmark = pytest.mark.skipif(bool(mpit.unavailable_reason()),
                                reason=mpit.unavailable_reason() or "MPICH")

PROBE = "from collectives import mpit; print(mpit.current())"


def _clean_env(**extra: str) -> dict[str, str]:
    # A launcher's PMI variables would make the child try to join this process's job.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA"))}
    env.update(extra)
    return env


def test_list_comes_from_the_library() -> None:
    names = mpit.native_algorithms()
    assert "ring" in names and "auto" not in names
    assert len(names) == len(set(names))


def test_numbering_matches_what_mpich_reads_from_the_environment() -> None:
    for name in mpit.native_algorithms():
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                             timeout=60, env=_clean_env(**{mpit.ALGORITHM_CVAR: name}))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == name


def test_import_collectives_stays_light() -> None:
    code = ("import sys, collectives; "
            "print(int('collectives.mpit' in sys.modules or 'mpi4py.MPI' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=_clean_env())
    assert out.stdout.strip() == "0", out.stderr


def test_another_mpi_has_only_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from collectives.algorithms import get_algorithm
    from collectives.algorithms import native as native_mod

    mpit._mpit.cache_clear()
    mpit._table.cache_clear()
    monkeypatch.setattr(mpit, "library", lambda: ("Open MPI", "5.0.6"))
    monkeypatch.setattr(native_mod, "_warned", set())
    try:
        assert mpit.native_algorithms() == []
        assert "Open MPI 5.0.6 is not MPICH" in mpit.unavailable_reason()
        cls = get_algorithm("native")
        assert cls.search_space(None, 4, 1 << 20) == {}  # the trial is never asked
        assert cls.check_params({"impl": "ring"}, 4) == {"impl": "ring"}
        with pytest.warns(RuntimeWarning, match="running the library's default"):
            assert native_mod._selector("ring", "mpi") is None
    finally:
        mpit._mpit.cache_clear()
        mpit._table.cache_clear()
