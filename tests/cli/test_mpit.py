"""``collectives.natives.mpich``: the installed MPICH's allreduce algorithms and numbering.

The numbering (a choice's position in the variable's description) is checked against the
value MPICH itself sets when the choice is given in the environment at launch, for every
listed algorithm; and ``import collectives`` must not touch MPI_T."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from collectives.natives import mpich

pytestmark = pytest.mark.skipif(bool(mpich.unavailable_reason()),
                                reason=mpich.unavailable_reason() or "MPICH")

PROBE = "from collectives.natives import mpich; print(mpich.current_algorithm())"


def _clean_env(**extra: str) -> dict[str, str]:
    # A launcher's PMI variables would make the child try to join this process's job.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA"))}
    env.update(extra)
    return env


def test_list_comes_from_the_library() -> None:
    names = mpich.native_algorithms()
    assert "ring" in names and "auto" not in names
    assert len(names) == len(set(names))


def test_numbering_matches_what_mpich_reads_from_the_environment() -> None:
    for name in mpich.native_algorithms():
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                             timeout=60, env=_clean_env(**{mpich.ALGORITHM_CVAR: name}))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == name


def test_import_collectives_stays_light() -> None:
    code = ("import sys, collectives; "
            "print(int('collectives.mpi.mpit' in sys.modules or 'mpi4py.MPI' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=_clean_env())
    assert out.stdout.strip() == "0", out.stderr


def test_another_mpi_has_only_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A library ringtune does not know: MPICH's algorithms are not offered, native's
    space is empty, an ``impl`` is a ValueError naming what the library has (as the README
    promises), and a warning says once that only the default runs."""
    from collectives import natives
    from collectives.algorithms import get_algorithm
    from collectives.natives import base

    mpich._mpit.cache_clear()
    mpich._table.cache_clear()
    base.current.cache_clear()
    monkeypatch.setattr(base, "library", lambda: ("Foo MPI", "1.2"))
    monkeypatch.setattr(base, "_warned", set())
    try:
        assert mpich.native_algorithms() == []
        assert "Foo MPI 1.2 is not MPICH" in mpich.unavailable_reason()
        with pytest.warns(RuntimeWarning, match="Foo MPI 1.2 is an MPI library ringtune "
                                                "does not know.*impl=auto"):
            lib = natives.current()
        assert lib.algorithms() == []
        cls = get_algorithm("native")
        assert cls.search_space(None, 4, 1 << 20) == {}  # the trial is never asked
        assert cls.check_params({"impl": "auto"}, 4) == {"impl": "auto"}
        with pytest.raises(ValueError, match=r"impl: 'ring' is not an allreduce algorithm "
                                             r"of Foo MPI 1.2 \(it has auto;"):
            cls.check_params({"impl": "ring"}, 4)
    finally:
        mpich._mpit.cache_clear()
        mpich._table.cache_clear()
        base.current.cache_clear()
