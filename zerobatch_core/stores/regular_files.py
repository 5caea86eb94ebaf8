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

from ..errors import ZeroBatchIOError

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC

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
    ``EFBIG``) before a byte is read, so a caller can bound what a metadata file may cost. The
    file is read for the size ``fstat`` reports on the opened descriptor, never a size a claim
    gives; a file that grows or shrinks while it is read (written in place, not replaced by a
    rename as every ZeroBatch writer does) is refused (``EIO``) rather than returned half old.
    """
    shown = os.fspath(path)
    with open(open_regular_file(shown), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if limit is not None and size > limit:
            raise ZeroBatchIOError(
                errno.EFBIG, f"{size:,} bytes, more than the {limit:,} this file may have", shown
            )
        data = f.read(size)  # reads until it has ``size`` bytes or the file ends
        if len(data) != size or f.peek():
            raise ZeroBatchIOError(
                errno.EIO,
                f"changed size while it was read ({size:,} bytes when opened): it is being "
                "written in place",
                shown,
            )
        return data


def read_regular_head(path: str | os.PathLike[str], length: int) -> tuple[bytes, int]:
    """The first ``length`` bytes of the regular file ``path`` (fewer if it is shorter) and
    its size, both from the opened descriptor."""
    fd = open_regular_file(path)
    try:
        size = os.fstat(fd).st_size
        return _pread_all(fd, min(length, size), 0), size
    finally:
        os.close(fd)


def read_regular_range(path: str | os.PathLike[str], start: int, length: int) -> bytes:
    """``length`` bytes of the regular file ``path`` from byte ``start`` (fewer where the file
    ends first): one range of a metadata file, read without reading the rest."""
    fd = open_regular_file(path)
    try:
        return _pread_all(fd, length, start)
    finally:
        os.close(fd)


def _pread_all(fd: int, length: int, start: int) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < length:
        part = os.pread(fd, length - got, start + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)
