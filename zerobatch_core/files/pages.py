"""Page-cache hints: read mapped files ahead for readers, release and write back for writers.

Every function here only advises the kernel: it never changes what a read returns or what a file
holds, and where a call is missing on the platform it does nothing.

Read-ahead (``Readahead``, for readers). The loader knows which block it will read next long
before it reads it. A background thread asks the kernel to populate that block's page tables
(``madvise(MADV_POPULATE_READ)``, Linux 5.14+): pages not yet cached are read from disk and
every page is mapped, so the training loop's thread neither waits for the disk nor takes a page
fault on first touch. On older kernels it falls back to ``posix_fadvise(WILLNEED)``, which
starts the disk reads only. The hints run off-thread because they block while the kernel works;
issued from the training loop's thread they would serialise disk and compute instead of
overlapping them. Both calls release the GIL (``ctypes`` and ``os`` drop it around the system
call).

Waking the thread is not free: populating a block that is already mapped still walks its page
tables and takes the GIL from the training loop for a moment, which shows in the latency of the
batches made meanwhile. A file that fits comfortably in RAM stays cached once read, so for such
a file each range is requested once per mapping; from the second epoch on the thread sleeps. A
larger file is requested every time, since its pages are evicted between epochs.

Releasing pages (``release_pages``, for converters). Pages of a mapped file that a process has
touched stay in its resident set (and in ``ru_maxrss``) for as long as the mapping lives, so a
converter that streams a 100 GiB corpus through a memory map would look as if it held 100 GiB.
Dropping the process's references to pages already read (``madvise(MADV_DONTNEED)`` on a read-
only file mapping) keeps the resident set at the size of the work in flight; the data stays in
the kernel's page cache, and a later read simply maps it again. It never changes what a read
returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt


def _find_mmap(array: Any) -> mmap.mmap | None:
    obj = array
    for _ in range(64):  # the base chain of a view is short; bound it anyway
        if obj is None:
            return None
        if isinstance(obj, mmap.mmap):
            return obj
        inner = getattr(obj, "_mmap", None)  # np.memmap keeps its mmap here
        if isinstance(inner, mmap.mmap):
            return inner
        obj = getattr(obj, "base", None)
    return None


def release_pages(array: Any) -> bool:
    """Drop this process's resident pages of the file mapping behind ``array``, if any.

    Returns whether a mapping was found and released. Arrays not backed by a file mapping are
    left alone. Views of the mapping stay valid: their pages are mapped again on the next read.
    """
    mm = _find_mmap(array)
    if mm is None or not hasattr(mmap, "MADV_DONTNEED") or mm.closed:
        return False
    with contextlib.suppress(OSError, ValueError):
        mm.madvise(mmap.MADV_DONTNEED)
        return True
    return False


SYNC_FILE_RANGE_WRITE = 2


def libc_function(name: str, argtypes: list[Any]) -> Callable[..., int] | None:
    """A libc function through ``ctypes`` (it releases the GIL while it runs), or ``None``."""
    if os.name != "posix":
        return None
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    found: Callable[..., int] = fn
    return found


_sync_file_range = libc_function(
    "sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``[offset, offset + length)`` of ``fd`` to disk now.

    A writer whose bytes are final calls this so the disk works while it computes the next
    part, and the closing ``fsync`` has less left to wait for. It neither waits nor drops the
    pages from the page cache, and where the call is missing it does nothing: durability still
    comes from that ``fsync``.
    """
    if _sync_file_range is not None and length > 0:
        _sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE)


FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2


_fallocate = libc_function(
    "fallocate", [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
)


def discard(fd: int, offset: int, length: int) -> None:
    """Free ``[offset, offset + length)`` of a scratch file ``fd``: its pages and blocks go now.

    For temporary files whose bytes have been used: the page cache drops them without writing
    them back, so they never cost disk bandwidth or memory pressure. Where the file system or
    platform cannot punch holes this does nothing (the file is freed when it is closed).
    """
    if _fallocate is not None and length > 0:
        _fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length)


# -- read-ahead for readers ------------------------------------------------------------------

HINT_BYTES = 16 << 20  # one call per default block: each call costs the loop a GIL hand-back
MIN_HINT_BYTES = 1 << 20
"""Smaller requests are dropped: handing one to the worker costs the loop more (a GIL hand-back,
hundreds of microseconds on a busy machine) than the kernel's own read-ahead leaves to gain."""
MADV_POPULATE_READ = 22  # linux/mman.h


_MADVISE = (
    libc_function("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])
    if sys.platform.startswith("linux")  # MADV_POPULATE_READ's value is Linux's
    else None
)


def _ram_bytes() -> int:
    """Physical memory, or 0 where it cannot be read (then every request goes through)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 0


class Readahead:
    """Reads byte ranges of one mapped file ahead, in request order, on a shared thread.

    ``mapping`` is the whole file's mapping as bytes, ``fd`` its descriptor, which this object
    owns from now on and closes in ``close`` (or, if a hint for it is running then, right after
    that hint). Purely advisory: errors end the hint, never the caller.

    One worker thread per process serves every reader (a forked process starts its own on its
    first request), so opening and closing a reader costs no thread start or join: a dataset
    that enters a new shard every few batches pays for the hints, not for threads.
    """

    def __init__(self, fd: int, mapping: npt.NDArray[np.uint8]) -> None:
        self._fd: int | None = fd
        self._remember = mapping.size <= _ram_bytes() // 2
        self._requested: set[tuple[int, int]] = set()
        self._mapping: npt.NDArray[np.uint8] | None = mapping
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._busy = False  # a hint for this file is running on the worker
        self._closed = False

    @staticmethod
    def available() -> bool:
        """Whether this platform can read ahead (Linux can; elsewhere requests are ignored)."""
        return _MADVISE is not None or hasattr(os, "posix_fadvise")

    def request(self, offset: int, length: int) -> None:
        """Have ``length`` bytes at ``offset`` read (and mapped) soon; returns at once."""
        if length < MIN_HINT_BYTES or self._closed or self._mapping is None:
            return
        if not self.available():
            return
        if self._pid != os.getpid():  # a forked process maps the pages anew
            self._pid, self._requested = os.getpid(), set()
        if self._remember:
            if (offset, length) in self._requested:
                return  # populated in this mapping already, and the file stays cached
            self._requested.add((offset, length))
        _worker().put((self, offset, length))

    def _run(self, offset: int, length: int) -> None:
        """On the worker: hint ``[offset, offset + length)``, unless closed meanwhile."""
        with self._lock:
            mapping, fd = self._mapping, self._fd
            if self._closed or mapping is None or fd is None:
                return
            self._busy = True
        try:
            base, end = mapping.ctypes.data, min(offset + length, mapping.size)
            while offset < end and not self.closed:
                n = min(HINT_BYTES, end - offset)
                if not _hint(fd, base, offset, n):
                    break
                offset += n
        finally:
            with self._lock:
                self._busy = False
                if self.closed:  # closed while the hint ran: the descriptor is ours to close
                    self._release()

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called (read afresh: another thread may set it)."""
        return self._closed

    def close(self) -> None:
        """Stop hinting this file and close its descriptor (after a hint still running)."""
        with self._lock:
            self._closed = True
            if not self._busy:
                self._release()

    def _release(self) -> None:
        self._mapping = None
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


_POPULATE = [_MADVISE is not None]  # cleared once if the kernel has no MADV_POPULATE_READ


def _hint(fd: int, base: int, offset: int, n: int) -> bool:
    """One chunk: populate its mapping, or (if the kernel cannot) start its disk reads."""
    if _POPULATE[0] and _MADVISE is not None:
        address = base + offset
        aligned = address - address % mmap.PAGESIZE  # madvise wants a page-aligned start
        if _MADVISE(aligned, n + address - aligned, MADV_POPULATE_READ) == 0:
            return True
        if ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS):
            return False  # e.g. EFAULT: the pages could not be read; the caller will see
        _POPULATE[0] = False  # kernel older than 5.14
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        os.posix_fadvise(fd, offset, n, os.POSIX_FADV_WILLNEED)
    except OSError:
        return False
    return True


_Request = tuple[Readahead, int, int]
_WORKER: dict[int, queue.SimpleQueue[_Request]] = {}
_WORKER_LOCK = threading.Lock()


def _worker() -> queue.SimpleQueue[_Request]:
    """This process's read-ahead queue, its daemon thread started on first use."""
    pid = os.getpid()
    requests = _WORKER.get(pid)
    if requests is None:
        with _WORKER_LOCK:
            requests = _WORKER.get(pid)
            if requests is None:
                requests = queue.SimpleQueue()
                thread = threading.Thread(
                    target=_serve, args=(requests,), name="zerobatch-readahead", daemon=True
                )
                thread.start()
                _WORKER.clear()  # a forked process's copy names its parent's dead thread
                _WORKER[pid] = requests
    return requests


def _serve(requests: queue.SimpleQueue[_Request]) -> None:
    while True:
        readahead, offset, length = requests.get()
        with contextlib.suppress(Exception):  # advisory: one bad hint must not end the worker
            readahead._run(offset, length)
