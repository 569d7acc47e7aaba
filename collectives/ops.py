"""Reduction ops and element types the runtime supports, and their validation.

Use these names (``OPS``, ``DTYPES``) wherever an op or dtype crosses an API boundary, so
that every entry point rejects the same things with the same message.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Reduction ops, in the order the CLI lists them.
OPS: tuple[str, ...] = ("sum", "prod", "min", "max", "avg")

#: Element types every backend supports (bfloat16 is added by the CuPy backend where its
#: kernel supports it).
DTYPES: tuple[str, ...] = ("float16", "float32", "float64", "int32", "int64")


def check_op(op: Any) -> str:
    """Return ``op`` if it is a supported reduction op name, else raise ``ValueError``."""
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"unsupported op {op!r}: use one of {', '.join(OPS)}")
    return op


def dtype_name(dtype: Any) -> str:
    """The canonical name of a dtype (``numpy.dtype``, type or string)."""
    return str(np.dtype(dtype)) if not isinstance(dtype, str) or dtype != "bfloat16" else dtype


def itemsize(dtype: Any) -> int:
    """Bytes per element of ``dtype`` (a name, ``numpy.dtype`` or type); ``bfloat16`` is 2
    whether or not NumPy knows the type (ml_dtypes)."""
    name = dtype_name(dtype)
    return 2 if name == "bfloat16" else int(np.dtype(name).itemsize)


def check_dtype(dtype: Any, extra: tuple[str, ...] = ()) -> str:
    """Return the canonical dtype name if supported, else raise ``TypeError``."""
    try:
        name = dtype_name(dtype)
    except TypeError:
        name = str(dtype)
    if name not in DTYPES and name not in extra:
        allowed = ", ".join(DTYPES + extra)
        raise TypeError(f"unsupported dtype {name}: use one of {allowed}")
    return name


def is_integer(dtype_str: str) -> bool:
    """True for the integer dtypes (whose results must be exact)."""
    return dtype_str.startswith("int") or dtype_str.startswith("uint")


def busbw_factor(n: int) -> float:
    """``2(n−1)/n``: bus bandwidth per algorithm bandwidth for allreduce."""
    return 2.0 * (n - 1) / n if n > 0 else 0.0


def busbw(nbytes: float, time_us: float, n: int) -> float:
    """nccl-tests' bus bandwidth in GB/s of an allreduce of ``nbytes`` taking ``time_us`` on
    ``n`` ranks (0 for a time that is not positive)."""
    if time_us <= 0:
        return 0.0
    return float(nbytes) / (float(time_us) * 1e-6) / 1e9 * busbw_factor(n)
