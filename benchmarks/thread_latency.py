"""A thread's scheduler slice and timer slack (Linux), for the overlap experiments of
``bench_training.py overlap --variants``: whether a short slice or a small timer slack on
the communication thread hides more of an exchange behind backward.

This is an experiment, not a runtime setting: measured side by side, a 100 µs slice was not
a clear gain (+3 and −18 points of overlap in two runs: preempting backward more often costs
backward too), so ringtune's exchange thread keeps the kernel's settings. Use
``set_thread_latency`` on the thread whose settings should change, e.g. through
``Exchanger.submit``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading


class _SchedAttr(ctypes.Structure):
    """Linux's ``struct sched_attr`` (``sched_setattr(2)``)."""

    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32),
                ("sched_flags", ctypes.c_uint64), ("sched_nice", ctypes.c_int32),
                ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
                ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64),
                ("sched_util_min", ctypes.c_uint32), ("sched_util_max", ctypes.c_uint32)]


#: The C library has no sched_setattr wrapper: the raw syscall, by architecture.
_SYS_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}
_PR_SET_TIMERSLACK = 29


def set_thread_latency(slice_us: float | None = None,
                       slack_us: float | None = None) -> list[str]:
    """On the calling thread (Linux): ask for a scheduler slice of ``slice_us`` (``0``: the
    kernel's default; on Linux ≥ 6.12, EEVDF with ``PREEMPT_SHORT``, a waking thread whose
    slice is shorter preempts the running one) and a timer slack of ``slack_us`` (how late
    the kernel may end this thread's sleeps, e.g. MPICH's throttled ``usleep(1)`` between
    polls; the kernel's default is 50 µs). ``None`` leaves a setting as it is. Returns what
    could not be set (empty when all was)."""
    problems: list[str] = []
    if not sys.platform.startswith("linux"):
        return [f"thread scheduling settings are Linux-only (here: {sys.platform})"]
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as exc:
        return [f"no C library to call ({exc})"]
    if slice_us is not None:
        nr = _SYS_SCHED_SETATTR.get(platform.machine())
        if nr is None:
            problems.append(f"sched_setattr: unknown syscall number on {platform.machine()}")
        else:
            # SCHED_OTHER at the thread's own nice value: only the slice changes.
            nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            attr = _SchedAttr(size=ctypes.sizeof(_SchedAttr), sched_policy=0,
                              sched_nice=nice, sched_runtime=int(slice_us * 1000))
            if libc.syscall(nr, 0, ctypes.byref(attr), 0) != 0:
                err = ctypes.get_errno()
                problems.append(f"sched_setattr(slice {slice_us} µs): {os.strerror(err)}")
    if slack_us is not None:
        # 0 would mean "the process's default", not "no slack": 1 ns is the least.
        if libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(max(1, int(slack_us * 1000))),
                      0, 0, 0) != 0:
            problems.append(f"prctl(PR_SET_TIMERSLACK): {os.strerror(ctypes.get_errno())}")
    return problems
