"""Opening metadata files without blocking: only regular files are read.

``open(path, "rb")`` on a FIFO waits for a writer for ever, and on a device may read without
end. A name a dataset or a live dataset reads by convention (``manifest.json``,
``checksums.xxh3``, ``live.json``, ``manifests/...``) can be any of those, by accident or on
purpose, so these files are opened the way the reader opens shards (SPEC.md section 4, "A path
that is not a readable file"): non-blocking, then ``fstat`` on the opened descriptor, and
anything but a regular file is refused with ``ZeroBatchIOError`` naming the path, before a
byte is read. Checking the descriptor rather than the path leaves no window for the name to be
replaced between the check and the read.
"""

from __future__ import annotations

import errno
import os
import stat

from .errors import ZeroBatchIOError

_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _kind(mode: int) -> str:
    """What a file of ``mode`` is, in words, for a message."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular_file(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of ``path``, opened without blocking; ``ZeroBatchIOError`` (and
    nothing left open) if ``path`` is not a regular file. The caller closes the descriptor."""
    shown = os.fspath(path)
    fd = os.open(shown, _FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
            raise ZeroBatchIOError(code, f"not a regular file ({_kind(mode)})", shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_file(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (see the module docstring).

    With ``limit``, a file larger than ``limit`` bytes is refused (``ZeroBatchIOError``,
    ``EFBIG``) before it is read, and at most ``limit`` bytes are read even if it grows, so a
    caller can bound what a metadata file may cost.
    """
    shown = os.fspath(path)
    fd = open_regular_file(shown)
    try:
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise ZeroBatchIOError(
                errno.EFBIG, f"{size:,} bytes, more than the {limit:,} this file may have", shown
            )
        cap = size  # at most ``limit``: checked above
        chunks: list[bytes] = []
        got = 0
        while True:
            # Read what fstat reported, then on until end of file (the file may have grown),
            # never past ``limit``.
            want = max(cap - got, 1 << 16)  # what is there, never a buffer sized by a claim
            if limit is not None:
                want = min(want, limit + 1 - got)
            if want <= 0:
                break
            chunk = os.read(fd, want)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if limit is not None and got > limit:
            raise ZeroBatchIOError(
                errno.EFBIG, f"more than the {limit:,} bytes this file may have", shown
            )
        return b"".join(chunks)
    finally:
        os.close(fd)
