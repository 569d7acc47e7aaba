"""One POSIX shared-memory segment per communicator of ranks on one host.

Use ``attach_segment(comm, nbytes)`` — collective over ``comm``, whose ranks must share a
host — to get a ``Segment``: the same ``nbytes`` of memory mapped by every rank, with a
header of per-rank counters (``collectives.shm.sync.Flags``).

Why a file under ``/dev/shm`` opened and mapped by hand, not ``MPI_Win_allocate_shared``
or ``multiprocessing.shared_memory``: one mechanism serves both engines (torchrun has no
MPI), and before Python 3.13 ``multiprocessing.shared_memory`` registers every attached
segment with the process's resource tracker, which unlinks it at that process's exit and
warns of leaks in the others. An MPI window would also tie the segment's life to MPI's.

Life of a segment, and why nothing is ever left behind:

1. Rank 0 of ``comm`` (the host's first rank) creates ``/dev/shm/NAME`` with ``O_CREAT |
   O_EXCL | O_NOFOLLOW``, mode 0600. NAME joins the job's identity, the creating rank's
   pid, a per-process sequence number (two communicators of one job) and 64 random bits:
   no other job or user can guess it, and ``O_EXCL`` never opens a file that was there
   (a collision is retried under a fresh name).
2. It checks that ``/dev/shm`` has the room (``statvfs``) and reserves it
   (``posix_fallocate``): a container's 64 MB ``/dev/shm`` is one line naming the size and
   the fix at set-up, never SIGBUS in the middle of a step.
3. It writes a header (a magic number and the random token) and tells the others the name
   (``comm.allgather``). Each opens it without ``O_CREAT``, checks owner, mode, size and
   token, and maps it.
4. An ``allgather`` of every rank's outcome: then every rank unlinks the name (the first
   succeeds), whatever the outcome; rank 0 also unlinks it when the set-up fails (a peer
   gone before it attached). The mappings stay valid; the memory is freed when the last
   rank unmaps it or ends, however it ends. Only a job whose every rank is killed between
   1 and 4 — a few milliseconds of its set-up — could leave the file.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import re
import secrets
import stat
from typing import Any

import numpy as np

from ..errors import RingtuneError
from .sync import STRIDE, Flags, affinity, cpu_each

#: Where POSIX shared memory lives on Linux.
SHM_DIR = "/dev/shm"
#: First word of every segment ("ringtune" in ASCII, little-endian).
MAGIC = int.from_bytes(b"ringtune", "little")
#: Bytes of the header before the counters: magic, token, size, ranks (int64 each), padded
#: to a cache line.
PREAMBLE = 64
#: Data starts on this boundary (a page): copies into it are aligned.
ALIGN = 4096

#: ``MAP_POPULATE`` where the platform has it (Linux), else nothing.
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)

_SEQUENCE = itertools.count()
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class ShmUnavailable(RingtuneError):
    """Shared memory cannot be used here (no ``/dev/shm``, too little room, a segment that
    cannot be created or checked). The message says why and what to do."""


def job_identity(environ: Any = None) -> str:
    """The job's identity for segment names: the batch system's or torchrun's job id where
    one is set, else ``local`` (the pid and the random token still keep jobs apart)."""
    env = os.environ if environ is None else environ
    for var in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "FLUX_JOB_ID",
                "TORCHELASTIC_RUN_ID"):
        value = str(env.get(var, "")).strip()
        if value and value != "none":
            return _UNSAFE.sub("_", value)[:32]
    return "local"


def header_words(size: int) -> int:
    """int64 words of the counter area for ``size`` ranks (counters, then pids)."""
    return size * STRIDE + size


def data_offset(size: int) -> int:
    """Byte offset of the data area for ``size`` ranks."""
    raw = PREAMBLE + 8 * header_words(size)
    return -(-raw // ALIGN) * ALIGN


def room_line(needed: int, free: int) -> str:
    """The one line for a ``/dev/shm`` too small for a segment."""
    mib = 1 << 20
    return (f"shared memory: {SHM_DIR} has {free / mib:.1f} MiB free, the shm allreduce "
            f"needs {needed / mib:.1f} MiB: give the container more (docker run "
            "--shm-size=1g, or --ipc=host; Kubernetes: an emptyDir volume with medium: "
            "Memory at /dev/shm), or use another algorithm (RINGTUNE_PROFILE, or the "
            "profile's rule for this size)")


class Segment:
    """``nbytes`` of data shared by the ``size`` ranks of one host, plus their ``flags``.

    ``data`` is a ``uint8`` NumPy view of the data area; ``view(dtype, offset, count)``
    gives a typed window of it. ``close()`` unmaps (only once nothing uses the views).
    ``slot_bytes``: the bytes of one rank's slot, for a user that cuts the data area into
    per-rank slots (the ``shm`` algorithm: ``2 * size`` of them); 0 where none does.
    ``cma_refused``: '' where every rank may read every peer's memory directly
    (``collectives.shm.cma``), else why not; ``None`` until ``probe_cma()`` asked."""

    def __init__(self, mapping: mmap.mmap, name: str, rank: int, size: int, nbytes: int,
                 names: Any = None, slot_bytes: int = 0, own_cpus: bool | None = None) -> None:
        self.name = name
        self.rank, self.size, self.nbytes = rank, size, nbytes
        self.slot_bytes = slot_bytes
        self.cma_refused: str | None = None
        self._map = mapping
        words = np.frombuffer(mapping, dtype=np.int64, count=header_words(size),
                              offset=PREAMBLE)
        self.flags = Flags(words, rank, size, names, own_cpus)
        start = data_offset(size)
        self.data = np.frombuffer(mapping, dtype=np.uint8, count=nbytes, offset=start)
        #: Steps this rank has finished on the segment (every rank runs the same sequence
        #: of collectives on a communicator, so the counts agree).
        self.steps = 0

    def probe_cma(self, comm: Any) -> str:
        """Ask once (collective over ``comm``, the segment's ranks) whether single-copy
        reads of peers' memory work here; '' if they do, else why not."""
        if self.cma_refused is None:
            from .cma import probe

            self.cma_refused = probe(comm, [int(p) for p in self.flags.pids])
        return self.cma_refused

    def view(self, dtype: Any, offset: int, count: int) -> np.ndarray:
        """``count`` elements of ``dtype`` from byte ``offset`` of the data area."""
        return self.data[offset: offset + count * np.dtype(dtype).itemsize].view(dtype)

    def close(self) -> None:
        """Unmap the segment (the name is long gone). Views must not be used after."""
        self.flags = None  # type: ignore[assignment]
        self.data = None  # type: ignore[assignment]
        try:
            self._map.close()
        except BufferError:
            pass  # a view still exists somewhere: the mapping goes with it


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _create(total: int) -> tuple[int, str, int]:
    """Create the segment file; (fd, name, token). Raises ``ShmUnavailable``."""
    if not os.path.isdir(SHM_DIR):
        raise ShmUnavailable(f"shared memory: {SHM_DIR} does not exist on this host; use "
                             "another algorithm (the shm allreduce needs Linux's /dev/shm)")
    free = _free_bytes(SHM_DIR)
    if free < total:
        raise ShmUnavailable(room_line(total, free))
    job = job_identity()
    for _ in range(4):
        token = secrets.randbits(63)
        name = f"ringtune-{job}-{os.getpid()}-{next(_SEQUENCE)}-{token:016x}"
        try:
            fd = os.open(os.path.join(SHM_DIR, name),
                         os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except FileExistsError:
            continue  # somebody else's (or a stale) file: never ours, take a fresh name
        except OSError as exc:
            raise ShmUnavailable(f"shared memory: cannot create {SHM_DIR}/{name}: "
                                 f"{exc.strerror}; use another algorithm") from None
        break
    else:  # pragma: no cover - 4 collisions of 63 random bits
        raise ShmUnavailable(f"shared memory: no free segment name in {SHM_DIR}")
    try:
        os.fchmod(fd, 0o600)  # whatever the umask did
        os.posix_fallocate(fd, 0, total)
    except OSError as exc:
        os.close(fd)
        os.unlink(os.path.join(SHM_DIR, name))
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise ShmUnavailable(room_line(total, _free_bytes(SHM_DIR))) from None
        raise ShmUnavailable(f"shared memory: cannot reserve {total} bytes in "
                             f"{SHM_DIR}/{name}: {exc.strerror}") from None
    return fd, name, token


def _open_checked(name: str, token: int, total: int) -> int:
    """Open a peer's segment, refusing anything that is not exactly what it made."""
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ShmUnavailable(f"shared memory: {path} is not a regular file of this user")
        if st.st_mode & 0o077:
            raise ShmUnavailable(f"shared memory: {path} is readable by others "
                                 f"(mode {st.st_mode & 0o777:o})")
        if st.st_size != total:
            raise ShmUnavailable(f"shared memory: {path} has {st.st_size} bytes, "
                                 f"expected {total}")
        head = np.frombuffer(os.pread(fd, 16, 0), dtype=np.int64)
        if int(head[0]) != MAGIC or int(head[1]) != token:
            raise ShmUnavailable(f"shared memory: {path} is not this job's segment")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unlink(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass  # another rank was first


def attach_segment(comm: Any, nbytes: int, names: Any = None,
                   slot_bytes: int = 0) -> Segment:
    """A segment of ``nbytes`` data bytes shared by every rank of ``comm`` (ranks of one
    host). Collective. Raises ``ShmUnavailable`` on every rank alike when any rank cannot
    create or map it; ``names`` are the ranks as messages name them (world ranks);
    ``slot_bytes`` is recorded on the segment (``Segment.slot_bytes``)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    total = data_offset(size) + max(nbytes, 1)
    fd = -1
    name = ""
    mapping = None
    try:
        if rank == 0:
            try:
                fd, name, token = _create(total)
                header = np.zeros(PREAMBLE // 8, dtype=np.int64)
                header[:4] = (MAGIC, token, nbytes, size)
                os.pwrite(fd, header.tobytes(), 0)
                offer: tuple[str, Any, Any] = ("ok", name, token)
            except ShmUnavailable as exc:
                offer = ("error", str(exc), None)
            offers = comm.allgather(offer)
        else:
            offers = comm.allgather(None)
        kind, text, token = offers[0]
        if kind != "ok":
            raise ShmUnavailable(text)
        outcome = "ok"
        try:
            if rank != 0:
                fd = _open_checked(text, token, total)
            # MAP_POPULATE: the pages (reserved by posix_fallocate) are mapped now, not on
            # first touch inside the first allreduce (measured: ~550 minor faults and
            # nearly twice the time of a later call for a 4 MiB segment).
            mapping = mmap.mmap(fd, total, mmap.MAP_SHARED | _POPULATE,
                                mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ShmUnavailable) as exc:
            outcome = f"rank {rank}: {exc}"
        # With each rank's CPUs: whether waits may spin is judged from all of them.
        gathered = comm.allgather((outcome, affinity()))
        outcomes = [o for o, _ in gathered]
        # Every rank has mapped it (or failed to): every rank unlinks, so that the name
        # goes even if rank 0 is killed right now.
        _unlink(text)
    finally:
        if fd >= 0:
            os.close(fd)  # the mapping keeps the memory; the descriptor is not needed
        if name:
            _unlink(name)  # rank 0, also when the set-up failed (a peer gone before it)
    failed = [o for o in outcomes if o != "ok"]
    if failed:
        if mapping is not None:
            mapping.close()
        raise ShmUnavailable(f"shared memory: {failed[0]}")
    assert mapping is not None
    seg = Segment(mapping, str(offers[0][1]), rank, size, nbytes, names, slot_bytes,
                  cpu_each([cpus for _, cpus in gathered]))
    seg.flags.register_pid()
    # Every pid is written before anyone waits on a peer: the first wait of the first
    # step already knows whom it waits for.
    comm.allgather(None)
    return seg
