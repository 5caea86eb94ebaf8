"""Replacing a directory atomically: stage the new contents beside it, then swap the two.

A dataset directory has two fixed metadata names (``manifest.json``, ``checksums.xxh3``) and its
writer's shard names repeat from one write to the next, so rewriting a dataset in place always
has an instant at which the manifest does not describe the files beside it (``SPEC.md`` 12.4,
"Replacing a dataset"). Instead the replacement is staged in a sibling directory
``.NAME.zerobatch-new-RAND`` (same parent, hence the same file system), fsynced, and swapped with
``NAME`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``): the path holds the old contents or
the new ones at every instant, a kill or Ctrl-C included. The old directory's files that the
replacement does not drop are carried over as hard links, so the user's own files survive.

This module knows nothing of manifests: the caller says which names the replacement drops.
``build.py`` (``write_sharded_dataset``, ``create_dataset``) and ``ingest/ray_convert.py`` use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable

from ..errors import WriteError, ZeroBatchIOError
from ..files.writer import _temp_owner

if sys.platform != "win32":
    import fcntl

PathLike = str | os.PathLike[str]


STAGING_TAG = ".zerobatch-new-"
"""``.NAME.zerobatch-new-RAND`` beside dataset ``NAME``: a replacement being staged (or, after
the swap, the replaced dataset being removed). Never the only copy of a committed dataset: the
next write to ``NAME`` removes one whose writer is gone."""

ASIDE_TAG = ".zerobatch-old-"
"""``.NAME.zerobatch-old-RAND`` beside dataset ``NAME``: the old dataset, moved aside by the
fallback swap. It can be the only copy of it, so it is never removed automatically: a write to
``NAME`` is refused while one exists, naming it."""

WORK_DIR_NAMES = frozenset({".zerobatch-ray"})  # ray_convert.WORK_DIR_NAME
"""Work directories a writer keeps inside the dataset directory while it runs (``ray_convert``);
an overwrite neither carries nor refuses them."""

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_NO_EXCHANGE = frozenset(
    {errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.EBUSY, errno.ENOTSUP, errno.EOPNOTSUPP}
)


def _libc_renameat2() -> Callable[..., int] | None:
    """libc's ``renameat2``, or ``None`` off Linux or where the C library lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    result: Callable[..., int] = fn
    return result


_RENAMEAT2 = _libc_renameat2()


def exchange_paths(a: str, b: str) -> bool:
    """Swap the directories ``a`` and ``b`` in one step (``renameat2(RENAME_EXCHANGE)``).

    ``False``, with nothing changed, where the system cannot (not Linux, an old kernel or C
    library, a file system or mount point that refuses it); the caller then falls back to two
    renames. Other errors raise ``OSError``.
    """
    fn = _RENAMEAT2
    if fn is None:
        return False  # not Linux, or a C library without renameat2
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), a, None, b)


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock_directory(path: str) -> int | None:
    """An open descriptor of directory ``path`` holding its exclusive ``flock``; ``None`` if
    another process holds it (a live writer's staging directory) or it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        pass  # no locks on this file system
    return fd


def _siblings(target: str, tag: str) -> list[str]:
    """The ``.NAME<tag>*`` entries beside ``target`` (its real path), sorted."""
    parent, name = os.path.split(target)
    prefix = f".{name}{tag}"
    try:
        return sorted(os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(prefix))
    except OSError:
        return []


def refuse_aside(path: str) -> None:
    """A ``WriteError`` if an interrupted overwrite left the old dataset beside ``path``."""
    aside = _siblings(os.path.realpath(path), ASIDE_TAG)
    if aside:
        raise WriteError(
            f"{path}: an earlier overwrite was interrupted and left the dataset it replaced at "
            f"{', '.join(aside)} (possibly its only copy): rename it back to {path} if {path} "
            "is missing or not the dataset you want, or remove it, then write again"
        )


def remove_stale_staging(path: PathLike) -> None:
    """Remove the staging directories (``.NAME.zerobatch-new-*``) that dead writers left
    beside dataset ``path``; one whose writer still holds its lock is left alone. Never the
    only copy of a committed dataset (``STAGING_TAG``), so removing one loses nothing."""
    for stale in _siblings(os.path.realpath(os.fspath(path)), STAGING_TAG):
        fd = _lock_directory(stale)
        if fd is None:
            continue
        try:
            shutil.rmtree(stale, ignore_errors=True)
        finally:
            os.close(fd)


def _carried_entries(path: str, dropped: Callable[[str], bool]) -> list[tuple[str, int]]:
    """The entries of dataset directory ``path`` an overwrite keeps: ``(name, st_mode)`` of
    every entry ``dropped`` does not claim, other than writer temporaries and work
    directories. Regular files and symbolic links are carried; anything else (a
    subdirectory, a FIFO, a socket, a device) makes the overwrite refuse, naming them."""
    kept: list[tuple[str, int]] = []
    refused: list[str] = []
    for name in sorted(os.listdir(path)):
        if dropped(name) or name in WORK_DIR_NAMES or _temp_owner(name) is not None:
            continue
        mode = os.lstat(os.path.join(path, name)).st_mode
        if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
            kept.append((name, mode))
        else:
            refused.append(name + ("/" if stat.S_ISDIR(mode) else ""))
    if refused:
        listed = ", ".join(refused[:5]) + (", ..." if len(refused) > 5 else "")
        raise WriteError(
            f"{path}: cannot replace this dataset: it holds {listed}, which an overwrite cannot "
            "carry over (only regular files and symbolic links are kept); move them out of "
            "the directory and write again"
        )
    return kept


def check_replaceable(path: str, dropped: Callable[[str], bool]) -> None:
    """A ``WriteError`` unless the dataset in ``path`` can be replaced by staging and swapping:
    not a mount point, and nothing kept that an overwrite cannot carry (``_carried_entries``)."""
    if os.path.ismount(os.path.realpath(path)):
        raise WriteError(
            f"{path}: is a mount point; replacing a dataset stages the new one beside it and "
            "swaps the two directories, which a mount point cannot do: write into a directory "
            "inside it, or remove the old dataset first"
        )
    _carried_entries(path, dropped)


class StagedReplacement:
    """A new dataset staged beside the one at ``target`` (its real path), then swapped in.

    ``path`` is the staging directory (``.NAME.zerobatch-new-RAND`` in the same parent, hence
    the same file system), locked by this process and given the old directory's permission
    bits. ``commit`` carries the old directory's other files over (hard links, symbolic links
    recreated), fsyncs, swaps the two directories in one step (``exchange_paths``) and removes
    the replaced one; ``discard`` removes the staging directory and leaves the old dataset as
    it was. At every instant ``target`` holds the whole old dataset or the whole new one,
    except in the fallback (no ``RENAME_EXCHANGE``): two renames, between which ``target`` is
    missing and the old dataset is whole at ``.NAME.zerobatch-old-RAND`` beside it.
    """

    def __init__(self, target: str, dropped: Callable[[str], bool]) -> None:
        self.target = os.path.realpath(target)
        self.dropped = dropped
        parent, name = os.path.split(self.target)
        check_replaceable(target, dropped)
        try:
            self.path = tempfile.mkdtemp(prefix=f".{name}{STAGING_TAG}", dir=parent)
        except OSError as e:
            raise ZeroBatchIOError(
                e.errno if e.errno is not None else errno.EIO,
                f"{e.strerror or e} while creating the staging directory beside {target} in "
                f"{parent} (replacing a dataset stages the new one there, then swaps the two)",
                target,
            ) from e
        self.lock = _lock_directory(self.path)
        try:
            os.chmod(self.path, stat.S_IMODE(os.stat(self.target).st_mode))
        except BaseException:  # no staging directory is left behind
            self.discard()
            raise

    def carry(self) -> None:
        """Give the staged directory the old one's other files (see the class docstring)."""
        for name, mode in _carried_entries(self.target, self.dropped):
            old, new = os.path.join(self.target, name), os.path.join(self.path, name)
            if os.path.lexists(new):
                continue  # the new dataset's own file of that name wins
            if stat.S_ISLNK(mode):
                os.symlink(os.readlink(old), new)
            else:
                try:
                    os.link(old, new, follow_symlinks=False)
                except OSError as e:  # a file system without hard links
                    if e.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP):
                        raise
                    shutil.copy2(old, new, follow_symlinks=False)  # no hard links here

    def commit(self) -> None:
        """Carry the old directory's files over, then swap the staged dataset into place."""
        self.carry()
        _fsync_directory(self.path)
        parent, name = os.path.split(self.target)
        if exchange_paths(self.path, self.target):
            _fsync_directory(parent)  # committed: self.path now holds the replaced dataset
            self._remove(self.path)
            return
        aside = os.path.join(parent, f".{name}{ASIDE_TAG}{os.path.basename(self.path)[-8:]}")
        try:
            os.rename(self.target, aside)
            os.rename(self.path, self.target)
        except BaseException:
            if not os.path.lexists(self.target):
                with contextlib.suppress(OSError):  # aside too is missing if the first failed
                    os.rename(aside, self.target)  # back as it was
            raise
        _fsync_directory(parent)
        os.rename(aside, self.path)  # removable from now on (STAGING_TAG)
        self._remove(self.path)

    def _remove(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)
        self.close()
        with contextlib.suppress(OSError):
            _fsync_directory(os.path.dirname(path))

    def discard(self) -> None:
        """Remove the staging directory; the old dataset stays as it was. (``rmtree`` removes
        nothing through a symbolic link put in its place, and a missing directory is no
        error.)"""
        shutil.rmtree(self.path, ignore_errors=True)
        self.close()

    def close(self) -> None:
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


__all__ = [
    "ASIDE_TAG",
    "STAGING_TAG",
    "WORK_DIR_NAMES",
    "StagedReplacement",
    "check_replaceable",
    "exchange_paths",
    "refuse_aside",
    "remove_stale_staging",
]
