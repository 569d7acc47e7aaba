"""Single-copy reads and writes of a peer process's memory: Linux cross-memory attach (CMA).

Use ``CmaReader`` where ranks of one host already share a segment (``Segment``) and each
knows its peers' process ids: ``reader.read(pid, local_address, remote_address, nbytes)``
copies ``nbytes`` from the peer's address space into this process's with one
``process_vm_readv``, ``reader.write(...)`` the other way with ``process_vm_writev`` — one
pass over memory, where a shared segment needs two (the owner's copy in, the reader's copy
out). Open MPI's ``smsc/cma`` does the same.

Why it may be refused, and what then: the kernel allows it only where this process may
ptrace the peer (same user, and ``kernel.yama.ptrace_scope`` 0, or 1 with the peer our
descendant; a container may also need ``CAP_SYS_PTRACE`` or a seccomp profile that lets the
call through). ``probe(comm, pids)`` finds out once per segment, collectively: every rank
reads a known word from every peer, the outcomes are gathered, and every rank alike uses
CMA only where every read succeeded — otherwise it returns the reason (``EPERM`` …) for the
caller to log, and the shared segment's copies are used instead. Nothing is left behind
either way: CMA needs no file, no mapping, no state in the peer.

Importing this module imports nothing beyond the standard library and NumPy; on a system
without ``process_vm_readv`` (not Linux) ``available()`` says why.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
from typing import Any

import numpy as np


class CmaError(OSError):
    """A cross-memory read failed (the peer ended, or the kernel refused it)."""


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _bind() -> tuple[Any, str]:
    """``process_vm_readv`` from libc, or (None, why not)."""
    if not sys.platform.startswith("linux"):
        return None, f"process_vm_readv is Linux-only (this is {sys.platform})"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError) as exc:  # pragma: no cover - glibc < 2.15
        return None, f"libc has no process_vm_readv ({exc})"
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                   ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
    return fn, ""


_READV, _WHY_NOT = _bind()
_WRITEV = None
if _READV is not None:
    _WRITEV = ctypes.CDLL(ctypes.util.find_library("c") or None,
                          use_errno=True).process_vm_writev
    _WRITEV.restype = ctypes.c_ssize_t
    _WRITEV.argtypes = _READV.argtypes


def available() -> str:
    """'' where ``process_vm_readv`` can be called at all, else why not."""
    return _WHY_NOT


class CmaReader:
    """Copies from peers' memory into this process's; one per schedule (it keeps its two
    ``iovec`` structures, so a read allocates nothing)."""

    def __init__(self) -> None:
        if _READV is None:
            raise CmaError(errno.ENOSYS, _WHY_NOT)
        self._local = _Iovec()
        self._remote = _Iovec()
        self._lp = ctypes.byref(self._local)
        self._rp = ctypes.byref(self._remote)

    def read(self, pid: int, local: int, remote: int, nbytes: int) -> None:
        """Copy ``nbytes`` at address ``remote`` of process ``pid`` to ``local`` of this
        one. ``CmaError`` (with the errno) on any failure or short read."""
        self._call(_READV, "process_vm_readv from", pid, local, remote, nbytes)

    def write(self, pid: int, local: int, remote: int, nbytes: int) -> None:
        """Copy ``nbytes`` at ``local`` of this process to address ``remote`` of process
        ``pid``. ``CmaError`` (with the errno) on any failure or short write."""
        self._call(_WRITEV, "process_vm_writev to", pid, local, remote, nbytes)

    def _call(self, fn: Any, what: str, pid: int, local: int, remote: int,
              nbytes: int) -> None:
        self._local.iov_base = local
        self._local.iov_len = nbytes
        self._remote.iov_base = remote
        self._remote.iov_len = nbytes
        got = fn(pid, self._lp, 1, self._rp, 1, 0)
        if got != nbytes:
            err = ctypes.get_errno() if got < 0 else errno.EFAULT
            raise CmaError(err, f"{what} pid {pid}: "
                           f"{os.strerror(err) if got < 0 else f'{got} of {nbytes} bytes'}")


def probe(comm: Any, pids: Any) -> str:
    """Whether every rank of ``comm`` can read and write every peer's memory: '' if so,
    else the first failure as one line (the same answer on every rank). Collective.
    ``pids``: the process id of every rank of ``comm``, in rank order."""
    rank, size = comm.Get_rank(), comm.Get_size()
    # A known value per rank to read, then a word per peer for it to write into.
    word = np.zeros(1 + size, dtype=np.int64)
    word[0] = 0x52494E47 + rank
    addresses = comm.allgather(int(word.ctypes.data))
    outcome = ""
    if _READV is None:
        outcome = _WHY_NOT
    else:
        got = np.zeros(1, dtype=np.int64)
        reader = CmaReader()
        for q in range(size):
            if q == rank:
                continue
            try:
                reader.read(int(pids[q]), int(got.ctypes.data), int(addresses[q]), 8)
                reader.write(int(pids[q]), int(got.ctypes.data),
                             int(addresses[q]) + 8 * (1 + rank), 8)
            except CmaError as exc:
                outcome = (f"rank {rank} cannot read or write rank {q}'s memory "
                           f"({errno.errorcode.get(exc.errno or 0, exc.errno)}: "
                           f"{exc.strerror}); ptrace permission is needed "
                           "(kernel.yama.ptrace_scope=0, or CAP_SYS_PTRACE in a container)")
                break
            if int(got[0]) != 0x52494E47 + q:
                outcome = f"rank {rank} read a wrong value from rank {q}'s memory"
                break
    outcomes = comm.allgather(outcome)
    del word  # kept alive until every peer has read it (the allgather above)
    failed = [o for o in outcomes if o]
    return failed[0] if failed else ""
