"""Keep memory-mapped reads out of the process's resident set once they have been used.

Pages of a mapped file that a process has touched stay in its resident set (and in ``ru_maxrss``)
for as long as the mapping lives, so a converter that streams a 100 GiB corpus through a memory
map would look as if it held 100 GiB. Dropping the process's references to pages already read
(``madvise(MADV_DONTNEED)`` on a read-only file mapping) keeps the resident set at the size of
the work in flight; the data stays in the kernel's page cache, and a later read simply maps it
again. It never changes what a read returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from collections.abc import Callable
from typing import Any


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
