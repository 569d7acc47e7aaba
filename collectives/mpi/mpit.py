"""MPI_T control variables through ctypes, for any MPI library.

mpi4py (4.1) has no MPI_T API, hence ctypes into the library mpi4py links: ``bound()`` is
the binding (variables' info, scope, ``MPI_T_enum`` items; read and write), ``Selector``
sets an integer variable around one call and restores it. Which library mpi4py loaded
(``collectives.natives.library``) and which variables mean what is each library's
business: its module in
``collectives.natives`` reads its own through this binding (MPICH's algorithm and
composition per call, Open MPI's ``coll/tuned`` and ``coll/han`` on a new communicator).
Everything is lazy: nothing here runs (no ctypes, no ``MPI_T_init_thread``) until a native
algorithm other than the library's own selection is asked for.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

#: ``MPI_T_SCOPE_*`` in the standard's order; each library numbers them from its own base
#: (``NativeLibrary.mpit_scope_base``).
_SCOPE_NAMES = ("constant", "readonly", "local", "group", "group_eq", "all", "all_eq")
_WRITABLE_SCOPES = ("local", "group", "group_eq", "all", "all_eq")


class MpitError(RuntimeError):
    """An MPI_T call failed or a variable is missing (message names the call and variable)."""


class _Mpit:
    """The MPI_T calls this module needs, bound to one library through ctypes."""

    def __init__(self, lib: Any) -> None:
        c_int, ptr, vp = ctypes.c_int, ctypes.POINTER, ctypes.c_void_p
        self.lib = lib
        self.set_scope_base(0)
        lib.MPI_T_enum_get_info.argtypes = [vp, ptr(c_int), ctypes.c_char_p, ptr(c_int)]
        lib.MPI_T_enum_get_item.argtypes = [vp, c_int, ptr(c_int), ctypes.c_char_p,
                                            ptr(c_int)]
        lib.MPI_T_init_thread.argtypes = [c_int, ptr(c_int)]
        lib.MPI_T_cvar_get_index.argtypes = [ctypes.c_char_p, ptr(c_int)]
        lib.MPI_T_cvar_get_info.argtypes = [c_int, ctypes.c_char_p, ptr(c_int), ptr(c_int),
                                            vp, ptr(vp), ctypes.c_char_p, ptr(c_int),
                                            ptr(c_int), ptr(c_int)]
        lib.MPI_T_cvar_handle_alloc.argtypes = [c_int, vp, ptr(vp), ptr(c_int)]
        lib.MPI_T_cvar_read.argtypes = [vp, vp]
        lib.MPI_T_cvar_write.argtypes = [vp, vp]
        provided = c_int()
        self._check(lib.MPI_T_init_thread(0, ctypes.byref(provided)), "MPI_T_init_thread", "")
        self._handles: dict[str, tuple[int, Any, int]] = {}

    def set_scope_base(self, base: int) -> None:
        """The library's ``MPI_T_SCOPE_CONSTANT`` (``NativeLibrary.mpit_scope_base``)."""
        self.scopes = {base + i: n for i, n in enumerate(_SCOPE_NAMES)}

    @staticmethod
    def _check(rc: int, call: str, name: str) -> None:
        if rc != 0:
            raise MpitError(f"{call}({name}) returned MPI error {rc}")

    def info(self, name: str) -> tuple[str, str, bool, int]:
        """(description, scope, writable, datatype handle) of control variable ``name``."""
        desc, scope, writable, handle, _ = self.info_enum(name)
        return desc, scope, writable, handle

    def info_enum(self, name: str) -> tuple[str, str, bool, int, dict[str, int]]:
        """``info`` and the variable's ``MPI_T_enum`` items (name -> value; empty when the
        library gives the variable no enum, as MPICH does)."""
        idx = self.index(name)
        buf, desc = ctypes.create_string_buffer(256), ctypes.create_string_buffer(16384)
        nlen, dlen = ctypes.c_int(256), ctypes.c_int(16384)
        verb, bind, scope = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        dtype = ctypes.create_string_buffer(16)  # MPI_Datatype: int or pointer, by ABI
        enum = ctypes.c_void_p()
        self._check(self.lib.MPI_T_cvar_get_info(
            idx, buf, ctypes.byref(nlen), ctypes.byref(verb), dtype, ctypes.byref(enum),
            desc, ctypes.byref(dlen), ctypes.byref(bind), ctypes.byref(scope)),
            "MPI_T_cvar_get_info", name)
        sc = self.scopes.get(scope.value, str(scope.value))
        handle = int.from_bytes(dtype.raw[:ctypes.sizeof(ctypes.c_void_p)], sys.byteorder)
        items = self._enum_items(enum, name) if enum.value else {}
        return desc.value.decode("utf-8", "replace"), sc, sc in _WRITABLE_SCOPES, handle, items

    def _enum_items(self, enum: Any, name: str) -> dict[str, int]:
        num, nlen = ctypes.c_int(), ctypes.c_int(256)
        buf = ctypes.create_string_buffer(256)
        self._check(self.lib.MPI_T_enum_get_info(enum, ctypes.byref(num), buf,
                                                 ctypes.byref(nlen)),
                    "MPI_T_enum_get_info", name)
        out: dict[str, int] = {}
        for i in range(num.value):
            value, ilen = ctypes.c_int(), ctypes.c_int(256)
            item = ctypes.create_string_buffer(256)
            self._check(self.lib.MPI_T_enum_get_item(enum, i, ctypes.byref(value), item,
                                                     ctypes.byref(ilen)),
                        "MPI_T_enum_get_item", name)
            out[item.value.decode("utf-8", "replace")] = value.value
        return out

    def index(self, name: str) -> int:
        idx = ctypes.c_int()
        rc = self.lib.MPI_T_cvar_get_index(name.encode(), ctypes.byref(idx))
        if rc != 0:
            raise MpitError(f"this MPI has no control variable {name} (MPI_T_cvar_get_index "
                            f"returned {rc})")
        return idx.value

    def handle(self, name: str) -> tuple[Any, int]:
        """The MPI_T handle of control variable ``name`` (allocated once, kept) and its
        element count: for reading or writing it through ``lib`` directly, as a per-call
        ``Selector`` does without a lookup."""
        if name not in self._handles:
            idx = self.index(name)
            new, num = ctypes.c_void_p(), ctypes.c_int()
            self._check(self.lib.MPI_T_cvar_handle_alloc(idx, None, ctypes.byref(new),
                                                         ctypes.byref(num)),
                        "MPI_T_cvar_handle_alloc", name)
            self._handles[name] = (idx, new, num.value)
        _, handle, count = self._handles[name]
        return handle, count

    def read_int(self, name: str) -> int:
        handle, _ = self.handle(name)
        val = ctypes.c_int()
        self._check(self.lib.MPI_T_cvar_read(handle, ctypes.byref(val)), "MPI_T_cvar_read",
                    name)
        return val.value

    def read_str(self, name: str) -> str:
        handle, count = self.handle(name)
        buf = ctypes.create_string_buffer(max(count, 1) + 1)
        self._check(self.lib.MPI_T_cvar_read(handle, buf), "MPI_T_cvar_read", name)
        return buf.value.decode("utf-8", "replace")

    def write_int(self, name: str, value: int) -> None:
        handle, _ = self.handle(name)
        val = ctypes.c_int(value)
        self._check(self.lib.MPI_T_cvar_write(handle, ctypes.byref(val)), "MPI_T_cvar_write",
                    name)


@functools.lru_cache(maxsize=1)
def bound() -> tuple[_Mpit | None, str]:
    """The bound MPI_T of the library mpi4py links, whichever it is, or (None, why not).
    Each library's module (``collectives.natives``) reads its own variables through it
    (``natives.base.binding``, which sets the library's scope numbering)."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        return None, f"mpi4py is not importable ({exc})"
    try:
        lib = ctypes.CDLL(str(MPI.__file__))  # dlsym through it also searches its libmpi
        if not hasattr(lib, "MPI_T_cvar_write"):
            return None, f"{MPI.__file__} exports no MPI_T_cvar_write"
        return _Mpit(lib), ""
    except (OSError, MpitError) as exc:
        return None, f"MPI_T is not usable: {exc}"


class Selector:
    """Sets the integer control variable ``cvar`` to ``value`` around one call and restores
    the value the library had (the hot path: two ``MPI_T_cvar_write`` calls, no
    allocation). ``name`` is what the value means, for messages."""

    def __init__(self, name: str, cvar: str, value: int, mpit: _Mpit | None = None) -> None:
        self.name = name
        self.cvar = cvar
        if mpit is None:
            mpit, why = bound()
            if mpit is None:
                raise MpitError(why)
        self._mpit = mpit
        self._value = value
        self._handle, _ = mpit.handle(cvar)
        self._new = ctypes.c_int(value)
        self._old = ctypes.c_int()
        self._read = mpit.lib.MPI_T_cvar_read
        self._write = mpit.lib.MPI_T_cvar_write

    def enter(self) -> None:
        self._read(self._handle, ctypes.byref(self._old))
        if self._write(self._handle, ctypes.byref(self._new)) != 0:
            raise MpitError(f"MPI_T_cvar_write({self.cvar}={self.name}) failed")

    def exit(self) -> None:
        self._write(self._handle, ctypes.byref(self._old))


def read_cvar(mpit: _Mpit, name: str) -> int | str:
    """The current value of a control variable (int or string)."""
    from mpi4py import MPI

    dtype = mpit.info(name)[3]
    if dtype == MPI.CHAR.handle:
        return mpit.read_str(name)
    if dtype == MPI.INT.handle:
        return mpit.read_int(name)
    raise MpitError(f"{name}: neither an int nor a string control variable")


def nccl_version() -> str | None:
    """NCCL's version as ``2.21.5`` where CuPy's NCCL binding loads, else None (GPU
    profiles record it; imports CuPy, so call it only for GPU work)."""
    try:
        from cupy.cuda import nccl

        v = int(nccl.get_version())
    except Exception:  # noqa: BLE001 - no CuPy, no libnccl: nothing to record
        return None
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000 else (
        f"{v // 1000}.{v % 1000 // 100}.{v % 100}")
