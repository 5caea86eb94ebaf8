"""Read-ahead on a background thread: the next block is read and mapped before it is served.

The loader knows which block it will read next long before it reads it. A background thread
asks the kernel to populate that block's page tables (``madvise(MADV_POPULATE_READ)``,
Linux 5.14+): pages not yet cached are read from disk and every page is mapped, so the
training loop's thread neither waits for the disk nor takes a page fault on first touch. On
older kernels it falls back to ``posix_fadvise(WILLNEED)``, which starts the disk reads only.
The hints run off-thread because they block while the kernel works; issued from the training
loop's thread they would serialise disk and compute instead of overlapping them. Both calls
release the GIL (``ctypes`` and ``os`` drop it around the system call).

Waking the thread is not free: populating a block that is already mapped still walks its
page tables and takes the GIL from the training loop for a moment, which shows in the latency
of the batches made meanwhile. A file that fits comfortably in RAM stays cached once read, so
for such a file each range is requested once per mapping; from the second epoch on the thread
sleeps. A larger file is requested every time, since its pages are evicted between epochs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import queue
import sys
import threading

import numpy as np
import numpy.typing as npt

from .pages import libc_function

CHUNK_BYTES = 16 << 20  # one call per default block: each call costs the loop a GIL hand-back
MADV_POPULATE_READ = 22  # linux/mman.h
_STOP = None


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
    """Reads byte ranges of one mapped file ahead, in request order, on a thread of its own.

    ``mapping`` is the whole file's mapping as bytes; the thread holds it, so the mapping
    outlives any call in flight. Purely advisory: errors end the hint, never the caller. The
    thread starts on the first request in each process (a forked worker gets its own) and ends
    at ``close``.
    """

    def __init__(self, fd: int, mapping: npt.NDArray[np.uint8]) -> None:
        self._fd = fd
        self._remember = mapping.size <= _ram_bytes() // 2
        self._requested: set[tuple[int, int]] = set()
        self._mapping: npt.NDArray[np.uint8] | None = mapping
        self._populate = _MADVISE is not None
        self._pid = -1
        self._queue: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @staticmethod
    def available() -> bool:
        """Whether this platform can read ahead (Linux can; elsewhere requests are ignored)."""
        return _MADVISE is not None or hasattr(os, "posix_fadvise")

    def request(self, offset: int, length: int) -> None:
        """Have ``length`` bytes at ``offset`` read (and mapped) soon; returns at once."""
        mapping = self._mapping
        if length <= 0 or mapping is None or self._stop.is_set() or not self.available():
            return
        if self._pid != os.getpid():  # first request here, or a fork inherited a dead thread
            self._pid = os.getpid()
            self._requested = set()  # a forked process maps the pages anew
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(
                target=self._run,
                args=(self._queue, mapping),
                name="zerobatch-readahead",
                daemon=True,
            )
            self._thread.start()
        if self._remember:
            if (offset, length) in self._requested:
                return  # populated in this mapping already, and the file stays cached
            self._requested.add((offset, length))
        self._queue.put((offset, length))

    def _run(
        self, requests: queue.SimpleQueue[tuple[int, int] | None], mapping: npt.NDArray[np.uint8]
    ) -> None:
        base, size = mapping.ctypes.data, mapping.size
        while (item := requests.get()) is not _STOP and not self._stop.is_set():
            offset, end = item[0], min(item[0] + item[1], size)
            while offset < end and not self._stop.is_set():
                n = min(CHUNK_BYTES, end - offset)
                if not self._hint(base, offset, n):
                    break
                offset += n

    def _hint(self, base: int, offset: int, n: int) -> bool:
        """One chunk: populate its mapping, or (if the kernel cannot) start its disk reads."""
        if self._populate and _MADVISE is not None:
            if _MADVISE(base + offset, n, MADV_POPULATE_READ) == 0:
                return True
            if ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS):
                return False  # e.g. EFAULT: the pages could not be read; the caller will see
            self._populate = False  # kernel older than 5.14
        if not hasattr(os, "posix_fadvise"):
            return False
        try:
            os.posix_fadvise(self._fd, offset, n, os.POSIX_FADV_WILLNEED)
        except OSError:
            return False
        return True

    def close(self) -> bool:
        """Stop the thread; ``True`` once it has ended (the file may then be closed)."""
        self._stop.set()
        self._mapping = None
        thread = self._thread
        if thread is None or self._pid != os.getpid():
            return True
        self._queue.put(_STOP)
        thread.join(timeout=5.0)
        return not thread.is_alive()
