"""Writers: records in, one atomically written, seed-permuted LLMBATCH file out.

Output record position ``p`` holds input record ``permute(p, total_records, seed)``
(``SPEC.md``, "Record permutation"); the last ``total_records % batch_size`` positions are the
dropped remainder. ``write_batch_file`` (an array, random access) produces the output in file
order, a few MiB at a time, by gathering the records each chunk needs; ``write_batch_dataset``
(a stream) sends each record towards its output window as it arrives and permutes each window
in memory at the end (``_WindowedOutput``). Either way memory is bounded by a few chunks and
windows, never by the dataset.

How the output appears (``_atomic_output``), and what a killed writer leaves behind:

- The output path never holds a partial file. It keeps its previous state (absent, or the old
  file when ``overwrite=True``) until the new file is complete and fsynced, then holds the new
  file; the directory is fsynced after the change.
- On Linux the file is written unnamed (``O_TMPFILE`` in the destination directory): a writer
  killed at any point leaves nothing at all, since the kernel frees an unnamed file when its
  last descriptor closes. The complete file is then linked into the directory
  (``linkat(AT_SYMLINK_FOLLOW)`` of ``/proc/self/fd/N``): straight to the output path when it
  does not exist (a link never replaces anything, so an output that appeared meanwhile is not
  clobbered), or, to replace an existing output, under a hidden temporary name that is then
  renamed over it. Only in that last case does a name other than the output ever exist, and
  only between the link and the rename (two system calls): a writer killed exactly there leaves
  a complete, fsynced copy of its output under the hidden name, never a partial file.
- Where ``O_TMPFILE`` is unavailable (another OS, or a file system that refuses it, such as
  NFS) the file is written under a hidden temporary name and renamed (or, without
  ``overwrite``, linked) into place; its header stays zero until the data is complete, so a
  leftover never carries the magic unless it is complete.
- Hidden temporaries are named ``.NAME.PID.RAND.tmp`` and locked (``flock``) by their writer.
  Every write first removes those of dead writers from the destination directory: the name
  must match (``RAND`` is 8 characters of ``[a-z0-9_]``), the pid must not be running on this
  machine, and the lock must be free; anything else is left alone. (On a file system shared
  between machines the pid says nothing about another machine's writers; the lock still
  protects them where the file system supports ``flock``.)
- The output gets the mode of any newly created file, ``0o666 & ~umask`` (and the directory's
  default ACL, if it has one), whichever way it was written; replacing a file does not keep the
  old file's mode or owner.

Operating-system errors while writing (disk full, quota, permissions, I/O errors) raise
``ZeroBatchIOError``, an ``OSError`` naming the output path; for a full disk it also says how
many bytes the write needs.

Token dtype (``dtype=``): every writer stores its tokens as ``"uint32"`` (dtype code 0, the
default) or ``"uint16"`` (code 1, half the bytes, for vocabularies of at most 65,536 ids); the
slot arithmetic is the spec's for that code. Inputs may be any integer dtype: a token that the
output dtype cannot hold (negative, or above its maximum) is refused with a ``WriteError``
naming the value, its record and its place in the record, and nothing is written. The record
permutation does not depend on the dtype, so the same records and seed written as uint16 and
as uint32 give files that hold the same batches, value for value. ``dtype="auto"`` writes
uint16 when every token of the input fits, else uint32: ``write_batch_file`` learns it while
it checks the array's values (an array of a 16-bit or narrower unsigned dtype needs no look),
and the streaming writer from the records as they pass on their way to its scratch file, so
neither reads its input twice. The price of ``"auto"`` in the streaming writer is a scratch
file (and spill file) of uint32 records, twice the bytes of a uint16 one, plus one maximum per
input block (within run-to-run noise of a forced uint16 write; ``ingest.dtypes`` gives a
measurement).
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
import secrets
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
from zerobatch_spec import (
    DOMAIN_RECORDS,
    DTYPE_NAMES,
    DTYPE_UINT16,
    DTYPE_UINT32,
    HEADER_SIZE,
    U32_MAX,
    Header,
    build_header,
    dtype_code,
    permute_array,
    token_bytes,
    token_dtype,
    token_max,
    unpermute_array,
)

from ..arguments import int_arg
from ..errors import WriteError, ZeroBatchIOError
from .pages import discard, release_pages, start_writeback

if sys.platform != "win32":
    import fcntl

CHUNK_BYTES = 8 * 2**20
"""Target size of one output write; large writes also leave the page cache fast to map."""

PathLike = str | os.PathLike[str]

TEMP_SUFFIX = ".tmp"
"""Hidden temporaries are ``.NAME.PID.RAND.tmp`` (``NAME`` cut to ``TEMP_NAME_BYTES``)."""
TEMP_NAME_BYTES = 160
"""The output name's share of a temporary's name, so that it stays under ``NAME_MAX``."""
TEMP_RANDOM_CHARS = 8
"""Length of ``RAND``: 8 lowercase hex digits (earlier versions: 8 of ``[a-z0-9_]``)."""
_TEMP_RANDOM_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789_"


# --- errors that name the output -------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    """A file the writer writes, for error messages: which output it serves, and its role."""

    path: str
    """The output path every error names."""
    what: str
    """The file in words: "the output", "the sorting scratch file beside the output"."""
    needed: int | None
    """Bytes the whole write needs free in the output's directory, where known."""

    def error(self, e: OSError, doing: str) -> ZeroBatchIOError:
        """``e`` as a ``ZeroBatchIOError`` naming the output path (and, when full, the bytes)."""
        if isinstance(e, ZeroBatchIOError):
            return e
        code = e.errno if e.errno is not None else errno.EIO
        message = f"{e.strerror or e} while {doing} {self.what}"
        if code in (errno.ENOSPC, errno.EDQUOT) and self.needed is not None:
            directory = os.path.dirname(os.path.abspath(self.path))
            message += (
                f"; this write needs about {self.needed:,} bytes "
                f"({self.needed / 2**20:,.1f} MiB) free in {directory}"
            )
        return ZeroBatchIOError(code, message, self.path)

    @contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """Turn an ``OSError`` raised in the block into ``self.error``."""
        try:
            yield
        except OSError as e:
            raise self.error(e, doing) from e


def _write_all(
    fd: int, data: npt.NDArray[np.unsignedinteger] | bytes, offset: int, target: _Target
) -> None:
    """``data`` (C-contiguous) written at ``offset`` of ``fd``, however many calls it takes.

    Every byte the writers put on disk goes through here, so a failing write always becomes a
    ``ZeroBatchIOError`` naming the output (``target``).
    """
    view = memoryview(data if isinstance(data, bytes) else data.reshape(-1).view(np.uint8).data)
    while len(view):
        try:
            n = os.pwrite(fd, view, offset)
        except OSError as e:
            raise target.error(e, f"writing {len(view):,} bytes at offset {offset:,} of") from e
        if n <= 0:
            raise target.error(OSError(errno.EIO, f"write returned {n}"), "writing")
        view, offset = view[n:], offset + n


# --- where the output goes: checks before anything is written ---------------------------------


def mapped_file(array: object) -> str | None:
    """The file behind ``array`` when it is (a view of) an ``np.memmap``, else ``None``.

    ``np.load(path, mmap_mode=...)`` returns such an array; slices, ``np.asarray`` and
    ``.view`` keep the ``np.memmap`` in their ``.base`` chain.
    """
    obj = array
    for _ in range(64):  # a view's base chain is short; bound it anyway
        if obj is None:
            return None
        if isinstance(obj, np.memmap):
            name: object = getattr(obj, "filename", None)
            if isinstance(name, (str, os.PathLike)):
                return os.fspath(name)
        obj = getattr(obj, "base", None)
    return None


def _file_key(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of ``path`` (symlinks followed), or ``None`` if it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _refuse_same_file(path: str, key: tuple[int, int] | None, source: str) -> None:
    if key is not None and _file_key(source) == key:
        raise WriteError(
            f"{path}: the output path is the input file {source} (same device and inode); "
            f"writing it would destroy the input: write to another path"
        )


def check_output(
    output_path: PathLike, *, overwrite: bool = False, inputs: Iterable[PathLike] = ()
) -> str:
    """``output_path`` as a string, after the checks every writer makes before writing.

    Refused with a ``WriteError`` naming the path: a directory; a missing parent directory; a
    path that is the same file (device and inode) as one of ``inputs``, always; an existing
    path that is not a regular file; and any existing path unless ``overwrite``. The writers
    check again when the file appears (a link never replaces a file), so an output created
    meanwhile by someone else is not clobbered either.
    """
    path = os.fspath(output_path)
    if os.path.isdir(path):
        raise WriteError(f"{path}: output path is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise WriteError(f"{path}: output directory {parent} does not exist")
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _Target(path, "the output path", None).error(e, "inspecting") from e
    if st is not None:
        key = (st.st_dev, st.st_ino)
        for source in inputs:
            _refuse_same_file(path, key, os.fspath(source))
        if not stat.S_ISREG(st.st_mode):
            raise WriteError(f"{path}: output path exists and is not a regular file")
    if (st is not None or os.path.lexists(path)) and not overwrite:
        raise WriteError(_exists_message(path))
    return path


def _exists_message(path: str) -> str:
    return (
        f"{path}: output file already exists; pass overwrite=True (--overwrite on the command "
        f"line) to replace it"
    )


def _empty_message(path: str, records: int, batch_size: int) -> str:
    return (
        f"{path}: the output would hold 0 batches: {records:,} "
        f"{'record is' if records == 1 else 'records are'} fewer than batch_size={batch_size}; "
        f"pass allow_empty=True (--allow-empty on the command line) to write a file without "
        f"batches"
    )


# --- hidden temporaries: unnamed where possible, named and locked otherwise --------------------


def _temp_path(path: str) -> str:
    """A fresh ``.NAME.PID.RAND.tmp`` beside ``path``."""
    directory, name = os.path.split(os.path.abspath(path))
    short = os.fsdecode(os.fsencode(name)[:TEMP_NAME_BYTES])
    return os.path.join(directory, f".{short}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def _temp_owner(name: str) -> int | None:
    """The writer pid in a name of the form ``.NAME.PID.RAND.tmp``, else ``None``."""
    if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
        return None
    parts = name[1 : -len(TEMP_SUFFIX)].rsplit(".", 2)
    if len(parts) != 3 or not parts[0]:
        return None
    pid, rand = parts[1], parts[2]
    if not (pid.isascii() and pid.isdigit()):
        return None
    if len(rand) != TEMP_RANDOM_CHARS or rand.strip(_TEMP_RANDOM_ALPHABET):
        return None
    return int(pid)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (owned by anyone)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # alive and someone else's, or not a pid this system can have: keep it
    return True


def _lock(fd: int, blocking: bool) -> bool:
    """Take the writer's exclusive ``flock`` on ``fd``; ``False`` if another holds it."""
    if sys.platform == "win32":
        return True  # no advisory locks there: the pid check decides alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:
        return True  # no locks on this file system: the pid check decides alone
    return True


def _remove_if_stale(directory: str, name: str) -> None:
    """Delete the temporary ``name`` if its writer is dead; see the module docstring."""
    pid = _temp_owner(name)
    if pid is None or _running(pid):
        return
    full = os.path.join(directory, name)
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return  # vanished, a symlink, or not ours to read
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not _lock(fd, blocking=False):
            return
        with suppress(FileNotFoundError):
            os.unlink(full)
    except OSError:
        return
    finally:
        os.close(fd)


_SWEPT: ContextVar[frozenset[str]] = ContextVar("zerobatch_swept", default=frozenset())
"""Directories swept by an enclosing ``swept_once``: writes inside it skip the sweep."""


@contextmanager
def swept_once(directory: PathLike) -> Iterator[None]:
    """Remove ``directory``'s stale temporaries now, and not again at each write inside the
    block: a writer of many files into one directory (a dataset's shards) would otherwise list
    the directory once per file, which grows with the square of the file count (an hour of
    listings for 100,000 shards)."""
    d = os.path.abspath(os.fspath(directory))
    remove_stale_temporaries(d)
    token = _SWEPT.set(_SWEPT.get() | {d})
    try:
        yield
    finally:
        _SWEPT.reset(token)


def remove_stale_temporaries(directory: PathLike) -> None:
    """Delete the hidden temporaries that dead writers left in ``directory``.

    Every writer calls this before it writes, except inside ``swept_once`` for the directory;
    it can also be called on its own. Errors (a directory that cannot be listed, a file that
    cannot be removed) leave things as they are.
    """
    d = os.fspath(directory)
    if os.path.abspath(d) in _SWEPT.get():
        return
    try:
        names = os.listdir(d)
    except OSError:
        return
    for name in names:
        if name.endswith(TEMP_SUFFIX) and name.startswith("."):
            _remove_if_stale(d, name)


def _open_unnamed(directory: str) -> int | None:
    """An unnamed file in ``directory`` (``O_TMPFILE``) that can be linked in later, or ``None``.

    ``None`` where the platform or the file system has no unnamed files, or ``/proc`` (through
    which the file is linked) is missing; the caller then uses a named temporary. Real errors
    (a read-only or full file system, no permission) surface there too.
    """
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None:
        return None
    try:
        fd = os.open(directory, flag | os.O_RDWR | os.O_CLOEXEC, 0o666)
    except OSError:
        return None
    if not os.path.exists(f"/proc/self/fd/{fd}"):
        os.close(fd)
        return None
    return fd


def _open_named(path: str) -> tuple[int, str]:
    """A new hidden ``.NAME.PID.RAND.tmp`` beside ``path``, created ``0o666 & ~umask``."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    while True:
        temp = _temp_path(path)
        try:
            return os.open(temp, flags, 0o666), temp
        except FileExistsError:
            continue


def _scratch_file(path: str, target: _Target) -> int:
    """An anonymous read-write file beside ``path`` for the writer's own use, freed on close."""
    directory = os.path.dirname(os.path.abspath(path))
    fd = _open_unnamed(directory)
    if fd is not None:
        return fd
    with target.errors("creating"):
        fd, temp = _open_named(path)
        _lock(fd, blocking=True)
        os.unlink(temp)  # named only for this instant; a leftover is removed as stale
    return fd


def _link_under_temp(source: str, path: str, dir_fd: int) -> str:
    """Link ``source`` to a fresh hidden temporary beside ``path``; return its name."""
    while True:
        temp = os.path.basename(_temp_path(path))
        try:
            os.link(source, temp, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except FileExistsError:
            continue
        return temp


def _publish(fd: int, temp: str | None, path: str, overwrite: bool, dir_fd: int) -> None:
    """Give the complete, fsynced file its name ``path`` (see the module docstring).

    Names are resolved in ``dir_fd``, the destination directory. ``temp`` is the named
    temporary's name there, or ``None`` for an unnamed file, linked through ``/proc`` (an
    absolute path: ``src_dir_fd`` only makes ``os.link`` call ``linkat`` with
    ``AT_SYMLINK_FOLLOW``, which links the file the descriptor refers to).
    """
    name = os.path.basename(path)
    source = temp if temp is not None else f"/proc/self/fd/{fd}"
    try:
        os.link(source, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # never replaces anything
    except FileExistsError:
        if not overwrite:
            raise WriteError(
                f"{path}: output file appeared while it was being written; nothing was replaced "
                f"(pass overwrite=True to replace it)"
            ) from None
        linked = temp if temp is not None else _link_under_temp(source, path, dir_fd)
        try:
            os.replace(linked, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with suppress(OSError):
                os.unlink(linked, dir_fd=dir_fd)
            raise
        return
    except OSError as e:
        if temp is None or e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        # A file system without hard links: rename, after a last check for an existing file.
        if os.path.lexists(path) and not overwrite:
            raise WriteError(_exists_message(path)) from None
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return
    if temp is not None:
        os.unlink(temp, dir_fd=dir_fd)  # the output's second name; a leftover is removed as stale


@contextmanager
def _atomic_output(path: str, overwrite: bool, target: _Target) -> Iterator[int]:
    """A descriptor for the new file, which appears at ``path`` only if the block completes.

    The caller writes the header last, so no partial file ever carries the magic. After the
    block: fsync, then the file gets its name (``_publish``), then the directory is fsynced.
    """
    directory = os.path.dirname(os.path.abspath(path))
    remove_stale_temporaries(directory)
    with target.errors("opening the directory of"):
        dir_fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    temp: str | None = None
    fd = _open_unnamed(directory)
    try:
        if fd is None:
            with target.errors("creating a temporary file for"):
                fd, full = _open_named(path)
            temp = os.path.basename(full)
        _lock(fd, blocking=True)
        yield fd
        with target.errors("flushing to disk"):
            os.fsync(fd)
        with target.errors("moving into place"):
            _publish(fd, temp, path, overwrite, dir_fd)
            temp = None
        with target.errors("syncing the directory of"):
            os.fsync(dir_fd)
    finally:
        if fd is not None:
            os.close(fd)
        if temp is not None:
            with suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
        os.close(dir_fd)


# --- input checks ------------------------------------------------------------------------------


DtypeArg = str | int
"""A token dtype as the writers take it: ``"uint32"`` or ``"uint16"``, or a dtype code (0, 1);
``"auto"`` where the writer may choose (module docstring)."""

AUTO = "auto"
"""The ``dtype`` that lets a writer choose: uint16 when every token fits, else uint32."""


def token_dtype_code(dtype: object, *, auto: bool = False) -> int | None:
    """The dtype code ``dtype`` names, or ``None`` for ``"auto"`` (accepted only with
    ``auto``); anything else is a ``WriteError`` naming what is accepted."""
    if auto and dtype == AUTO:
        return None
    if isinstance(dtype, str):
        with suppress(ValueError):
            return dtype_code(dtype)
    elif (
        isinstance(dtype, (int, np.integer))
        and not isinstance(dtype, bool)
        and dtype in DTYPE_NAMES
    ):
        return int(dtype)
    names = ", ".join(repr(n) for n in [*DTYPE_NAMES.values(), *([AUTO] if auto else [])])
    codes = ", ".join(str(c) for c in DTYPE_NAMES)
    raise WriteError(f"dtype must be one of {names}, or a dtype code ({codes}); got {dtype!r}")


def _range_text(dtype: int) -> str:
    """The values dtype code ``dtype`` holds, as messages write them."""
    return "[0, 2**32 - 1]" if dtype == DTYPE_UINT32 else f"[0, {token_max(dtype)}]"


def _check_token_dtype(dtype: np.dtype[np.generic], what: str) -> None:
    if dtype.kind not in "ui":
        raise WriteError(f"{what}: tokens must be an integer dtype, got {dtype}")


def _to_tokens(
    rows: npt.NDArray[np.integer], what: str, first_record: int, dtype: int = DTYPE_UINT32
) -> npt.NDArray[np.unsignedinteger]:
    """Rows as tokens of dtype code ``dtype``, or a ``WriteError`` naming the first record with
    a token outside that dtype's range (its value, record and position in the record)."""
    out = token_dtype(dtype)
    if rows.dtype == out or rows.size == 0:
        return rows.astype(out, copy=False)
    if rows.dtype.kind == "u" and rows.dtype.itemsize <= out.itemsize:
        return rows.astype(out)
    top = token_max(dtype)
    if (rows.dtype.kind == "i" and int(rows.min()) < 0) or int(rows.max()) > top:
        bad = (rows < 0) | (rows > top)
        r, c = (int(x[0]) for x in np.nonzero(bad))
        raise WriteError(
            f"{what}: record {first_record + r}, token {c}: value {int(rows[r, c])} is outside "
            f"the {DTYPE_NAMES[dtype]} range {_range_text(dtype)}"
        )
    return rows.astype(out)


class _Largest:
    """The largest token of the records that went by, for ``dtype="auto"``."""

    def __init__(self) -> None:
        self.value = -1

    def note(self, rows: npt.NDArray[np.integer]) -> None:
        if rows.size:
            self.value = max(self.value, int(rows.max()))

    def code(self) -> int:
        """uint16 when every token seen fits (also when there was none), else uint32."""
        return DTYPE_UINT16 if self.value <= token_max(DTYPE_UINT16) else DTYPE_UINT32


class RecordFile:
    """Records ``[n, seq_len]`` stored raw in a file, gathered with positioned reads.

    The writer reads each output chunk's records from all over its source. Through a memory map
    those reads would leave the whole file in the process's resident set (the kernel maps page
    cache in blocks of up to 2 MiB per touch); ``pread`` copies just the records and keeps the
    resident set at one chunk, whatever the file size. ``path`` names the file in errors.
    """

    def __init__(
        self,
        fd: int,
        offset: int,
        shape: tuple[int, int],
        dtype: np.dtype[np.integer],
        path: str = "source file",
    ) -> None:
        self.fd, self.offset, self.shape, self.dtype = fd, offset, shape, dtype
        self.row_bytes = shape[1] * dtype.itemsize
        self.path = path

    def gather(self, indices: npt.NDArray[np.int64]) -> npt.NDArray[np.integer]:
        """Rows ``indices`` (ascending), reading each run of consecutive rows at once."""
        out = np.empty((indices.size, self.shape[1]), dtype=self.dtype)
        if indices.size == 0:
            return out
        breaks = np.flatnonzero(np.diff(indices) != 1) + 1
        starts = np.concatenate([[0], breaks]).tolist()
        ends = np.concatenate([breaks, [indices.size]]).tolist()
        first = indices[starts].tolist()
        for a, b, row in zip(starts, ends, first, strict=True):
            want = (b - a) * self.row_bytes
            at = self.offset + row * self.row_bytes
            got = os.preadv(self.fd, [out[a:b].data], at)
            if got != want:
                raise WriteError(
                    f"{self.path}: truncated while reading: expected {want:,} bytes at offset "
                    f"{at:,}, got {got:,}"
                )
        return out


def _as_record_file(source: npt.NDArray[np.integer]) -> RecordFile | None:
    """A ``RecordFile`` over an unsliced, C-ordered ``np.memmap``, else ``None``."""
    base: object = getattr(source, "base", None)  # the mmap itself only when not a view
    if not isinstance(source, np.memmap) or not isinstance(base, mmap.mmap):
        return None
    if not source.flags.c_contiguous or source.filename is None:
        return None
    fd = os.open(source.filename, os.O_RDONLY | os.O_CLOEXEC)
    shape = (int(source.shape[0]), int(source.shape[1]))
    return RecordFile(fd, int(source.offset), shape, source.dtype, os.fspath(source.filename))


def _file_header(
    total: int, batch_size: int, seq_len: int, seed: int, dtype: int = DTYPE_UINT32
) -> Header:
    """The header of a file of ``total`` records: the remainder past whole batches is dropped."""
    return Header(
        batch_size=batch_size,
        seq_len=seq_len,
        num_batches=total // batch_size,
        seed=seed,
        total_records=total,
        dtype=dtype,
    )


def _write_permuted(
    path: str,
    source: npt.NDArray[np.integer] | RecordFile,
    batch_size: int,
    seed: int,
    what: str,
    overwrite: bool,
    dtype: int = DTYPE_UINT32,
) -> int:
    """Write ``source`` ([N, T]) as an LLMBATCH file of dtype code ``dtype`` at ``path``;
    return the batch count. The values were checked (``_check_values``)."""
    total, seq_len = int(source.shape[0]), int(source.shape[1])
    if total > U32_MAX:
        raise WriteError(f"{what}: {total} records exceed the u32 total_records field")
    header = _file_header(total, batch_size, seq_len, seed, dtype)
    target = _Target(path, "the output", header.file_size)
    batch_words = batch_size * seq_len
    per_chunk = max(1, CHUNK_BYTES // header.padded_batch_bytes)
    # No buffer for a file without batches: its slot may be too large to allocate (2^64 bytes).
    rows_of_slots = min(per_chunk, header.num_batches)
    buf = np.zeros((rows_of_slots, header.slot_words if rows_of_slots else 0), header.token_dtype)
    with _atomic_output(path, overwrite, target) as fd:
        for b0 in range(0, header.num_batches, per_chunk):
            b1 = min(b0 + per_chunk, header.num_batches)
            m = b1 - b0
            positions = np.arange(b0 * batch_size, b1 * batch_size, dtype=np.uint64)
            wanted = permute_array(positions, total, seed, DOMAIN_RECORDS).astype(np.int64)
            order = np.argsort(wanted, kind="stable")  # read the source in ascending order
            ascending = wanted[order]
            picked = (
                source.gather(ascending)
                if isinstance(source, RecordFile)
                else np.asarray(source[ascending])
            )
            rows = _to_tokens(picked, what, 0, dtype)
            # Scatter straight into the slots' token area (a [m, B, T] view of the buffer).
            slots = buf[:m, :batch_words].reshape(m, batch_size, seq_len)
            slots[order // batch_size, order % batch_size] = rows
            if not isinstance(source, RecordFile):
                release_pages(source)  # a mapped source must not pile up in the resident set
            _write_all(fd, buf[:m], HEADER_SIZE + b0 * header.padded_batch_bytes, target)
        _write_header(fd, header, target)
    return header.num_batches


def _write_header(fd: int, header: Header, target: _Target) -> None:
    """The header, at offset 0, last: no magic until the data is complete (the file's size is
    then right too: a file without batches is the header alone)."""
    _write_all(fd, build_header(header), 0, target)


def _check_array(tokens: object, seq_len: int | None, what: str) -> npt.NDArray[np.integer]:
    if not isinstance(tokens, np.ndarray):
        raise WriteError(f"{what}: expected a numpy array, got {type(tokens).__name__}")
    _check_token_dtype(tokens.dtype, what)
    if tokens.ndim != 2:
        raise WriteError(f"{what}: expected shape [num_records, seq_len], got {tokens.shape}")
    if seq_len is not None and tokens.shape[1] != seq_len:
        raise WriteError(f"{what}: seq_len={seq_len} but records have {tokens.shape[1]} tokens")
    if tokens.shape[1] == 0:
        raise WriteError(f"{what}: records have 0 tokens; seq_len must be at least 1")
    return tokens


def _check_values(
    tokens: npt.NDArray[np.integer], what: str, dtype: int | None = DTYPE_UINT32
) -> int:
    """Reject tokens that dtype code ``dtype`` cannot hold anywhere in the input, including
    the dropped remainder, a chunk of records at a time; return the dtype code to write.

    ``dtype=None`` (``"auto"``) checks against uint32 and returns uint16 when the largest
    token fits it; an unsigned array of 16 bits or fewer is uint16 without a look.
    """
    kind, item = tokens.dtype.kind, tokens.dtype.itemsize
    if dtype is None and kind == "u" and item <= token_bytes(DTYPE_UINT16):
        return DTYPE_UINT16
    check = DTYPE_UINT32 if dtype is None else dtype
    if dtype is not None and kind == "u" and item <= token_bytes(check):
        return check
    largest = _Largest()
    step = max(1, CHUNK_BYTES // max(1, tokens.shape[1] * item))
    for r0 in range(0, tokens.shape[0], step):
        rows = _to_tokens(np.asarray(tokens[r0 : r0 + step]), what, r0, check)
        if dtype is None:
            largest.note(rows)
    return check if dtype is not None else largest.code()


def write_batch_file(
    output_path: PathLike,
    tokens_array: npt.NDArray[np.integer],
    batch_size: int,
    seq_len: int | None = None,
    seed: int = 0,
    *,
    overwrite: bool = False,
    allow_empty: bool = False,
    dtype: DtypeArg = "uint32",
) -> int:
    """Write a ``[num_records, seq_len]`` integer array as an LLMBATCH file; return num_batches.

    Records are permuted by ``seed`` (``SPEC.md``), grouped into batches of ``batch_size``, and
    the remainder is dropped. ``tokens_array`` may be a ``np.memmap``: it is read a chunk at a
    time. Tokens are stored as ``dtype``: ``"uint32"`` (the default), ``"uint16"`` (half the
    bytes; every token must be at most 65,535), a dtype code, or ``"auto"`` (uint16 when every
    token fits, else uint32; module docstring). The file appears atomically (module
    docstring), and the same input, seed and dtype always give the same bytes.

    Refused with a ``WriteError`` before anything is written: an unknown ``dtype``; an
    existing ``output_path`` unless ``overwrite=True``; an output that is the file behind a
    memory-mapped ``tokens_array`` (even with ``overwrite``); fewer records than
    ``batch_size`` (a file without batches) unless ``allow_empty=True``; and a token the dtype
    cannot hold, anywhere in the array (named with its value, record and position). OS errors
    while writing raise ``ZeroBatchIOError`` naming the output.

    >>> import numpy as np
    >>> write_batch_file("x.batch", np.arange(64, dtype=np.uint32).reshape(8, 8), 4, seed=1)
    ... # doctest: +SKIP
    2
    >>> write_batch_file("x16.batch", np.arange(64).reshape(8, 8), 4, dtype="uint16")
    ... # doctest: +SKIP
    2
    """
    code = token_dtype_code(dtype, auto=True)
    b = int_arg("batch_size", batch_size, 1, U32_MAX, WriteError)
    s = int_arg("seed", seed, 0, U32_MAX, WriteError)
    if seq_len is not None:
        seq_len = int_arg("seq_len", seq_len, 1, U32_MAX, WriteError)
    tokens = _check_array(tokens_array, seq_len, "tokens_array")
    backing = mapped_file(tokens)
    path = check_output(output_path, overwrite=overwrite, inputs=[backing] if backing else [])
    if tokens.shape[0] < b and not allow_empty:
        raise WriteError(_empty_message(path, int(tokens.shape[0]), b))
    written = _check_values(tokens, "tokens_array", code)
    records = _as_record_file(tokens)
    if records is None:
        return _write_permuted(path, tokens, b, s, "tokens_array", overwrite, written)
    try:
        return _write_permuted(path, records, b, s, "tokens_array", overwrite, written)
    finally:
        os.close(records.fd)


def retype_batch_file(
    input_path: PathLike, output_path: PathLike, dtype: DtypeArg, *, overwrite: bool = False
) -> Header:
    """Copy the LLMBATCH file ``input_path`` to ``output_path`` with its tokens stored as
    ``dtype``; return the new header.

    Batch for batch: the header keeps every field but the dtype, and each slot holds the same
    tokens, so the copy is the file the writers give for the same records, seed and
    ``dtype`` (the permutation does not depend on the dtype). Widening always works; narrowing
    refuses a token the dtype cannot hold with a ``WriteError`` naming it (its record is the
    position ``batch * batch_size + row`` in the file) and writes nothing. ``output_path`` may
    be ``input_path`` itself (with ``overwrite=True``): the new file replaces it atomically,
    as every output here (module docstring); the input is read through its own mapping.
    """
    from .reader import BatchFileReader  # the reader knows nothing of the writer

    code = token_dtype_code(dtype)
    assert code is not None
    src = os.fspath(input_path)
    with BatchFileReader(src) as reader:
        header = replace(reader.header, dtype=code)
        out = os.fspath(output_path)
        same = os.path.exists(out) and os.path.samefile(out, src)
        path = check_output(out, overwrite=overwrite, inputs=[] if same else [src])
        b, t, n = header.batch_size, header.seq_len, header.num_batches
        target = _Target(path, "the output", header.file_size)
        widest = max(header.padded_batch_bytes, reader.header.padded_batch_bytes)
        per_chunk = max(1, CHUNK_BYTES // widest)
        rows_of_slots = min(per_chunk, n)
        buf = np.zeros(
            (rows_of_slots, header.slot_words if rows_of_slots else 0), header.token_dtype
        )
        with _atomic_output(path, overwrite, target) as fd:
            for b0 in range(0, n, per_chunk):
                m = min(b0 + per_chunk, n) - b0
                tokens = reader.read_batches(b0, b0 + m).reshape(m * b, t)
                buf[:m, : b * t] = _to_tokens(tokens, src, b0 * b, code).reshape(m, b * t)
                _write_all(fd, buf[:m], HEADER_SIZE + b0 * header.padded_batch_bytes, target)
            _write_header(fd, header, target)
    return header


def write_bytes_atomic(output_path: PathLike, data: bytes, *, overwrite: bool = False) -> None:
    """Write ``data`` as the file ``output_path``, appearing atomically like every output here.

    For the small files that go with LLMBATCH files (a dataset's manifest and checksums): the
    same checks (``check_output``), the same unnamed-file-then-link path, mode and error
    handling as the writers (module docstring).
    """
    path = check_output(output_path, overwrite=overwrite)
    target = _Target(path, "the output", len(data))
    with _atomic_output(path, overwrite, target) as fd:
        _write_all(fd, data, 0, target)


class _StreamInputs:
    """Refuses stream items that are memory-mapped views of the output file itself."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.key = _file_key(path)  # None when the output does not exist: nothing to protect
        self.checked: set[str] = set()

    def check(self, item: object) -> None:
        if self.key is None or not isinstance(item, np.ndarray):
            return
        name = mapped_file(item)
        if name is not None and name not in self.checked:
            self.checked.add(name)
            _refuse_same_file(self.path, self.key, name)


def _record_blocks(
    tokens_iter: Iterable[npt.ArrayLike],
    total_records: int | None,
    seq_len: int,
    inputs: _StreamInputs,
    dtype: int = DTYPE_UINT32,
    largest: _Largest | None = None,
) -> Iterator[npt.NDArray[np.unsignedinteger]]:
    """Checked ``[k, seq_len]`` blocks of the stream as tokens of dtype code ``dtype`` (1-D
    items become one-row blocks); ``largest``, if given, notes every block.

    ``total_records=None`` accepts any count up to the u32 limit of the header field; otherwise
    the stream must yield exactly ``total_records`` records (checked when it ends).
    """
    limit = U32_MAX if total_records is None else total_records
    count = 0
    for item in tokens_iter:
        inputs.check(item)
        arr = np.asarray(item)
        what = f"tokens_iter item at record {count}"
        _check_token_dtype(arr.dtype, what)
        if arr.ndim == 1:
            arr = arr.reshape(1, -1)
        if arr.ndim != 2 or arr.shape[1] != seq_len:
            raise WriteError(
                f"{what}: expected shape ({seq_len},) or (k, {seq_len}), got {np.shape(item)}"
            )
        if count + arr.shape[0] > limit:
            raise WriteError(
                f"tokens_iter yields more than total_records={total_records} records"
                if total_records is not None
                else f"tokens_iter yields more than {U32_MAX} records, the u32 header limit"
            )
        block = np.ascontiguousarray(_to_tokens(arr, "tokens_iter", count, dtype))
        if largest is not None:
            largest.note(block)
        yield block
        count += arr.shape[0]
    if total_records is not None and count != total_records:
        raise WriteError(f"tokens_iter yielded {count} records, but total_records={total_records}")


WINDOW_BYTES = CHUNK_BYTES
"""Output bytes the streaming writer assembles in memory at once (one window of slots)."""

STAGE_BYTES = CHUNK_BYTES
"""Input bytes the streaming writer sorts by destination window before writing them out."""

STAGE_SHARE_DIRECT = 4
"""A block of at least ``1 / STAGE_SHARE_DIRECT`` of the stage is placed without staging."""


def _scatter_mapped(
    fd: int,
    offset: int,
    slots: npt.NDArray[np.unsignedinteger],
    order: npt.NDArray[np.intp],
    dtype: np.dtype[np.unsignedinteger],
) -> None:
    """``slots[order[i] // B, order[i] % B] = row i`` of the packed rows (of ``dtype``, which
    may be wider than the slots' when every value is known to fit) at ``offset`` in ``fd``.

    The rows are read through a temporary read-only mapping: one copy fewer than reading them
    into a buffer first, and the mapping leaves the resident set when it closes.
    """
    m, b, t = slots.shape
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    size = m * b * t * dtype.itemsize
    mm = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ, offset=offset)
    try:
        packed = np.frombuffer(mm, dtype=dtype).reshape(m * b, t)
        slots[order // b, order % b] = packed
        del packed
    finally:
        mm.close()


POSITIONS_AHEAD = 1 << 16
"""Input records whose output positions are computed at once (few large NumPy calls)."""


class _AheadPermutation:
    """The record permutation (or its inverse) over consecutive indices, computed in bulk.

    Each NumPy evaluation of the Feistel network costs a few dozen array operations whatever
    the array's length, so indices are evaluated ``POSITIONS_AHEAD`` at a time and served from
    that window; memory stays a few such arrays.
    """

    def __init__(
        self,
        fn: Callable[[npt.ArrayLike, int, int, int], npt.NDArray[np.uint64]],
        header: Header,
        limit: int,
    ) -> None:
        self.fn, self.header, self.limit = fn, header, limit
        self.values, self.first = np.empty(0, dtype=np.uint64), 0

    def get(self, first: int, k: int) -> npt.NDArray[np.uint64]:
        """Images of indices ``first .. first + k`` (all below ``limit``)."""
        end = first + k
        if not (self.first <= first and end <= self.first + self.values.size):
            n = min(max(k, POSITIONS_AHEAD), self.limit - first)
            ids = np.arange(first, first + n, dtype=np.uint64)
            h = self.header
            self.values, self.first = self.fn(ids, h.total_records, h.seed, DOMAIN_RECORDS), first
        return self.values[first - self.first : end - self.first]


class _IOThread:
    """One thread that runs file writes in submission order, at most ``depth`` in flight.

    Work and results travel through ``queue.SimpleQueue``s, whose ``put`` and ``get`` run in C
    and are never split by a signal handler. A ``ThreadPoolExecutor`` would hand work over
    through Python-level locks (its semaphore's and each ``Future``'s condition): a Ctrl-C that
    raises ``KeyboardInterrupt`` in the main thread just after one of them is acquired leaves it
    held for ever, the I/O thread blocks on it, and so does the writer's wait for that thread.
    Here an interrupt can only land between two whole hand-overs.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.in_flight = 0
        self.stopping = False  # set by ``close`` after an error: queued jobs are skipped
        self._jobs: queue.SimpleQueue[tuple[Callable[..., None], tuple[object, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        # A daemon: a thread left behind by an interrupt that landed before its owner could
        # close it (inside ``Thread.start``, which waits for the thread) holds no job and must
        # not keep the interpreter from exiting.
        self._thread = threading.Thread(target=self._run, name="zerobatch-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self.stopping:
                self._done.put(None)
                continue
            try:
                job[0](*job[1])
            except BaseException as error:  # handed to the writer's thread, which re-raises
                self._done.put(error)
            else:
                self._done.put(None)

    def submit(self, fn: Callable[..., None], *args: object) -> None:
        """Queue ``fn(*args)``, first waiting while ``depth`` jobs are in flight."""
        self.wait(self.depth - 1)
        self._jobs.put((fn, args))
        self.in_flight += 1

    def wait(self, keep: int = 0) -> None:
        """Wait until at most ``keep`` jobs are in flight; re-raise the first error of those
        finished."""
        while self.in_flight > keep:
            error = self._done.get()
            self.in_flight -= 1
            if error is not None:
                raise error

    def close(self) -> None:
        """Skip queued jobs, let the running one finish and end the thread (also after an error
        or an interrupt: the files must not be closed under it). A Ctrl-C meanwhile is held back
        until the thread has ended, then raised."""
        self.stopping = True
        self._jobs.put(None)
        interrupted = False
        while self._thread.is_alive():
            try:
                self._thread.join()
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            raise KeyboardInterrupt


class _WindowedOutput:
    """Places a stream of records at their permuted positions with large writes only.

    A random permutation sends consecutive input records all over the output, so writing each
    record where it belongs costs one small positioned write per record (several microseconds
    each in the page cache). Instead the output is cut into windows of ``WINDOW_BYTES``: as
    the stream arrives, records are sorted by the window they belong to and appended, packed,
    at the start of that window's byte range in an unlinked sorting file beside the output (one
    write per window per input block); at the end each window is mapped, its records are put
    in their slots in memory, and the window is written to the output in one piece, in file
    order. The output thus gets only large sequential writes, which also leaves its page cache
    in large folios that are cheap to map for the reader that follows; the sorting file lives
    in the page cache and is dropped with its last reference. File reads and writes run on one
    I/O thread, in submission order, while this thread computes the next block's or window's
    placement; at most two pieces of work are in flight, so memory is a few stages and windows
    whatever the dataset size.

    ``header`` describes the records as they are sorted (its dtype is the stage's, the dtype
    the stream's blocks come in); the output's dtype is given to ``finish`` and may be narrower
    (``dtype="auto"``, once the stream showed that every token fits). A window is a run of
    whole batches, the same in both: its byte range in the sorting file follows the stage's
    slot size, in the output the output's.
    """

    def __init__(
        self, out_fd: int, sort_fd: int, header: Header, out: _Target, sort: _Target
    ) -> None:
        self.out_fd, self.sort_fd, self.header = out_fd, sort_fd, header
        self.out_target, self.sort_target = out, sort
        b, t = header.batch_size, header.seq_len
        self.row_bytes = t * header.token_dtype.itemsize
        self.kept = header.num_batches * b
        self.window_batches = max(1, WINDOW_BYTES // header.padded_batch_bytes)
        self.window_records = self.window_batches * b
        n_windows = -(-header.num_batches // self.window_batches)
        window_bytes = self.window_batches * header.padded_batch_bytes
        self.starts = HEADER_SIZE + np.arange(n_windows, dtype=np.int64) * window_bytes
        self.cursors = self.starts.copy()
        stage_rows = max(1, min(STAGE_BYTES // self.row_bytes, max(self.kept, 1)))
        self.stage = np.empty((stage_rows, t), dtype=header.token_dtype)
        self.staged = 0
        self.placed = 0  # input records placed so far (the stream index of stage row 0)
        # Input record -> output position (phase 1), output position -> input record (phase 2).
        self.positions = _AheadPermutation(unpermute_array, header, header.total_records)
        self.sources = _AheadPermutation(permute_array, header, self.kept)
        self.io = _IOThread(depth=2)  # two jobs in flight bound the memory; errors re-raised

    def close(self) -> None:
        """Wait for the I/O thread (also after an error: the file must not close under it)."""
        self.io.close()

    def _submit(self, fn: Callable[..., None], *args: object) -> None:
        self.io.submit(fn, *args)

    def add(self, rows: npt.NDArray[np.unsignedinteger]) -> None:
        """Take the next input records, in stream order (tokens of the stage's dtype)."""
        if rows.shape[0] >= self.stage.shape[0] // STAGE_SHARE_DIRECT:  # place without staging
            self._flush()
            self._place(rows)
            return
        done = 0
        while done < rows.shape[0]:
            take = min(rows.shape[0] - done, self.stage.shape[0] - self.staged)
            self.stage[self.staged : self.staged + take] = rows[done : done + take]
            self.staged += take
            done += take
            if self.staged == self.stage.shape[0]:
                self._flush()

    def _flush(self) -> None:
        if self.staged:
            self._place(self.stage[: self.staged])
        self.staged = 0

    def _place(self, rows: npt.NDArray[np.unsignedinteger]) -> None:
        """Append the next ``len(rows)`` input records to their windows' packed areas."""
        k = rows.shape[0]
        pos = self.positions.get(self.placed, k).astype(np.int64)
        window = pos // self.window_records
        window[pos >= self.kept] = -1  # the dropped remainder is never written
        order = np.argsort(window, kind="stable")  # stable: input order within each window
        order = order[window[order] >= 0]
        self.placed += k
        if order.size == 0:
            return
        w_sorted = window[order]
        cuts = np.flatnonzero(np.diff(w_sorted)) + 1
        firsts = np.concatenate([[0], cuts])
        counts = np.diff(np.concatenate([firsts, [order.size]]))
        ws = w_sorted[firsts]
        offsets = self.cursors[ws].copy()
        self.cursors[ws] += counts * self.row_bytes
        # A copy (the caller may reuse ``rows`` once this returns), in the stage's dtype.
        packed = rows[order].astype(self.stage.dtype, copy=False)
        self._submit(self._write_pieces, packed, firsts.tolist(), offsets.tolist())

    def _write_pieces(
        self, packed: npt.NDArray[np.unsignedinteger], firsts: list[int], offsets: list[int]
    ) -> None:
        ends = [*firsts[1:], packed.shape[0]]
        for a, e, off in zip(firsts, ends, offsets, strict=True):
            _write_all(self.sort_fd, packed[a:e], off, self.sort_target)

    def _write_window(self, data: npt.NDArray[np.unsignedinteger], offset: int) -> None:
        _write_all(self.out_fd, data, offset, self.out_target)
        start_writeback(self.out_fd, offset, data.nbytes)  # final: let the disk start on them

    def finish(self, dtype: int | None = None) -> None:
        """Put every window's records in their slots and write the windows to the output, its
        tokens of dtype code ``dtype`` (default: the stage's; a narrower one only when every
        token fits it)."""
        self._flush()
        self.io.wait()  # every packed record must be written before it is read back
        h = self.header
        out = h if dtype is None else replace(h, dtype=dtype)
        b, t = h.batch_size, h.seq_len
        staged = self.stage.dtype
        self.stage = np.empty((0, t), dtype=staged)  # its memory is not needed any more
        for w in range(len(self.starts)):
            if int(self.cursors[w] - self.starts[w]) != self._window_records(w) * self.row_bytes:
                raise WriteError(f"internal: window {w} received the wrong number of records")
        window_bytes = self.window_batches * out.padded_batch_bytes  # in the output
        slots_shape = (self.window_batches, out.slot_words)
        bufs = [np.zeros(slots_shape, dtype=out.token_dtype) for _ in range(2)]
        for w, start in enumerate(self.starts.tolist()):
            m = self._window_records(w) // b
            sources = self.sources.get(w * self.window_records, m * b)
            order = np.argsort(sources, kind="stable")  # packed rows are in source order
            buf = bufs[w % 2]
            self.io.wait(keep=1)  # the write that last used ``buf`` must be done
            slots = buf[:m, : b * t].reshape(m, b, t)
            _scatter_mapped(self.sort_fd, start, slots, order, staged)
            discard(self.sort_fd, start, m * b * self.row_bytes)  # used: never written back
            self._submit(self._write_window, buf[:m], HEADER_SIZE + w * window_bytes)
        self.io.wait()

    def _window_records(self, w: int) -> int:
        """Records in window ``w`` (whole batches; only the last window may be short)."""
        return min(self.window_records, self.kept - w * self.window_records)


def _write_stream(
    path: str,
    blocks: Iterable[npt.NDArray[np.unsignedinteger]],
    total: int,
    batch_size: int,
    seq_len: int,
    seed: int,
    overwrite: bool,
    extra_bytes: int = 0,
    dtype: int = DTYPE_UINT32,
    decide: Callable[[], int] | None = None,
) -> int:
    """Write a stream of ``total`` records (known up front) as an LLMBATCH file at ``path``.

    ``blocks`` hold tokens of dtype code ``dtype``, which the file stores too, unless
    ``decide`` is given: it is called once the stream has ended and returns the dtype code of
    the output (``dtype="auto"``; every token must fit it). ``extra_bytes`` is what the caller
    already holds on the same file system (a spill file), for the bytes a full disk message
    says the write needs.
    """
    stage = _file_header(total, batch_size, seq_len, seed, dtype)
    size = stage.file_size  # the output's size, or more when ``decide`` narrows it
    needed = size + extra_bytes  # the sorting file shrinks as the output grows (``discard``)
    out_target = _Target(path, "the output", needed)
    sort_target = _Target(path, "the sorting scratch file beside the output", needed)
    if stage.num_batches == 0:  # the header alone; the stream is still read and checked
        with _atomic_output(path, overwrite, out_target) as fd:
            for _ in blocks:
                pass
            header = stage if decide is None else replace(stage, dtype=decide())
            _write_header(fd, header, out_target)
        return 0
    with _atomic_output(path, overwrite, out_target) as fd:
        sort_fd = _scratch_file(path, sort_target)
        try:
            with out_target.errors("sizing"):
                os.ftruncate(fd, size)
            with sort_target.errors("sizing"):
                os.ftruncate(sort_fd, size)
            out = _WindowedOutput(fd, sort_fd, stage, out_target, sort_target)
            try:
                for rows in blocks:
                    out.add(rows)
                header = stage if decide is None else replace(stage, dtype=decide())
                if header.file_size != size:  # "auto" chose a narrower dtype: a smaller file
                    with out_target.errors("sizing"):
                        os.ftruncate(fd, header.file_size)
                out.finish(header.dtype)
            finally:
                out.close()
        finally:
            os.close(sort_fd)
        _write_header(fd, header, out_target)
    return header.num_batches


def _spilled_blocks(
    spill_fd: int, n: int, seq_len: int, path: str, spilled: int, dtype: int
) -> Iterator[npt.NDArray[np.unsignedinteger]]:
    """The spilled records (tokens of dtype code ``spilled``) read back in order,
    ``CHUNK_BYTES`` at a time, as tokens of dtype code ``dtype`` (every token fits it)."""
    what = f"the spill file beside {path}"
    records = RecordFile(spill_fd, 0, (n, seq_len), token_dtype(spilled), what)
    per_read = max(1, CHUNK_BYTES // records.row_bytes)
    out = token_dtype(dtype)
    for r0 in range(0, n, per_read):
        rows = records.gather(np.arange(r0, min(r0 + per_read, n), dtype=np.int64))
        yield rows.astype(out, copy=False)


def write_batch_dataset(
    output_path: PathLike,
    tokens_iter: Iterable[npt.ArrayLike],
    total_records: int | None,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    *,
    overwrite: bool = False,
    allow_empty: bool = False,
    dtype: DtypeArg = "uint32",
) -> int:
    """Write a stream of records as an LLMBATCH file with bounded memory; return num_batches.

    ``tokens_iter`` yields records of ``seq_len`` tokens (1-D arrays) or blocks of records
    (2-D ``[k, seq_len]``), ``total_records`` in all. Records are sorted towards their output
    windows through an unlinked scratch file beside the output and each window is written
    once, permuted, in file order (``_WindowedOutput``), so the result is byte-identical to
    ``write_batch_file`` on the same records. ``total_records=None`` accepts a stream of
    unknown length: the permutation needs the count, so the stream is then first spilled to
    another unlinked file (``total_records * seq_len`` tokens) and read back in order.
    Peak memory is a block of the stream plus a few ``CHUNK_BYTES``,
    whatever the dataset size. The file appears atomically (module docstring).

    Tokens are stored as ``dtype``, as ``write_batch_file`` takes it; with ``"auto"`` the
    choice is made once the stream has ended, from the largest token it held (module
    docstring), and can be read back from the file's header.

    Refused with a ``WriteError``: an unknown ``dtype`` and an existing ``output_path`` unless
    ``overwrite=True`` (before the stream is touched); an item that is a memory-mapped view of
    the output file itself (even with ``overwrite``); a token the dtype cannot hold (named
    with its value, its record in the stream and its position; nothing is written); and an
    output without batches (fewer records than ``batch_size``) unless ``allow_empty=True``,
    checked before anything is read when ``total_records`` is given, else once the stream has
    ended, before the output is created. OS errors while writing raise ``ZeroBatchIOError``
    naming the output.
    """
    code = token_dtype_code(dtype, auto=True)
    b = int_arg("batch_size", batch_size, 1, U32_MAX, WriteError)
    t = int_arg("seq_len", seq_len, 1, U32_MAX, WriteError)
    s = int_arg("seed", seed, 0, U32_MAX, WriteError)
    expected = (
        None
        if total_records is None
        else int_arg("total_records", total_records, 0, U32_MAX, WriteError)
    )
    path = check_output(output_path, overwrite=overwrite)
    inputs = _StreamInputs(path)
    stage = DTYPE_UINT32 if code is None else code  # "auto" sorts uint32 records
    largest = _Largest() if code is None else None
    if expected is not None:
        if expected < b and not allow_empty:
            raise WriteError(_empty_message(path, expected, b))
        blocks = _record_blocks(tokens_iter, expected, t, inputs, stage, largest)
        decide = None if largest is None else largest.code
        return _write_stream(path, blocks, expected, b, t, s, overwrite, 0, stage, decide)
    spill_target = _Target(path, "the spill file beside the output", None)
    spill_fd = _scratch_file(path, spill_target)
    row_bytes = t * token_bytes(stage)
    try:
        n = 0
        for rows in _record_blocks(tokens_iter, None, t, inputs, stage, largest):
            _write_all(spill_fd, rows, n * row_bytes, spill_target)
            n += rows.shape[0]
        if n < b and not allow_empty:
            raise WriteError(_empty_message(path, n, b))
        written = stage if largest is None else largest.code()
        spilled = _spilled_blocks(spill_fd, n, t, path, stage, written)
        return _write_stream(path, spilled, n, b, t, s, overwrite, n * row_bytes, written)
    finally:
        os.close(spill_fd)
