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
import mmap
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
