"""``BatchFileReader``: validated, read-only, memory-mapped access to one LLMBATCH file."""

from __future__ import annotations

import contextlib
import mmap
import operator
import os
import stat
import weakref
from types import TracebackType

import numpy as np
import numpy.typing as npt
from zerobatch_spec import (
    HEADER_SIZE,
    TOKEN_DTYPE,
    ErrorCode,
    Header,
    Violation,
    check_header,
)

from .errors import FormatError, ZeroBatchError
from .pages import Readahead

_SIGNED_TOKEN_DTYPE = np.dtype(np.int32).newbyteorder(TOKEN_DTYPE.byteorder)
"""The token words reinterpreted as int32, in the tokens' byte order (``read_batch_int32``)."""

U32Array = npt.NDArray[np.uint32]
I32Array = npt.NDArray[np.int32]
I64Array = npt.NDArray[np.int64]


class BatchFileReader:
    """Open an LLMBATCH file, validate it (rules 1-8 of ``SPEC.md``) and serve zero-copy batches.

    Validation happens before the file is mapped, so a truncated or oversized file is rejected
    with a ``FormatError`` naming the file, the rule and the field, instead of faulting later.
    Batches are read-only views into the mapping: ``read_batch`` costs an index computation,
    not a copy. (If another process truncates the file while it is mapped, touching the lost
    pages raises SIGBUS; LLMBATCH files are meant to be immutable once written.)

    >>> with BatchFileReader("train.batch") as r:  # doctest: +SKIP
    ...     first = r.read_batch(0)  # uint32 [batch_size, seq_len], no copy
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ZeroBatchError(f"{self.path}: not a regular file")
            prefix = os.pread(fd, HEADER_SIZE, 0)
            checked = check_header(prefix, st.st_size)
            if isinstance(checked, Violation):
                raise FormatError(self.path, checked)
            self.header: Header = checked
            # The mapping is re-checked against the header: the file may have changed since fstat.
            self._mmap = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        if len(self._mmap) != self.header.file_size:
            size = len(self._mmap)
            self._mmap.close()
            os.close(fd)
            raise FormatError(
                self.path,
                Violation(
                    ErrorCode.SIZE_MISMATCH,
                    "num_batches",
                    f"file changed while opening: mapped {size} bytes, header requires "
                    f"{self.header.file_size}",
                ),
            )
        h = self.header
        flat = np.frombuffer(self._mmap, dtype=TOKEN_DTYPE, offset=HEADER_SIZE)
        # [num_batches, words per slot] -> drop slot padding -> [num_batches, B, T], all views.
        self._slots: U32Array = flat.reshape(h.num_batches, h.slot_words)
        self._tokens: U32Array = self._slots[:, : h.batch_size * h.seq_len].reshape(
            h.num_batches, h.batch_size, h.seq_len
        )
        self._tokens_i32: I32Array = self._tokens.view(_SIGNED_TOKEN_DTYPE)
        # The descriptor stays open for read-ahead hints, so they always reach this inode; it
        # is closed by ``close`` or, for a reader that is just dropped, by the finalizer.
        self._readahead = Readahead(fd, np.frombuffer(self._mmap, dtype=np.uint8))
        self._release = weakref.finalize(self, _release_descriptor, self._readahead, fd)
        self._closed = False

    # -- header fields -------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Format version (always 1 for files this reader accepts)."""
        return self.header.version

    @property
    def batch_size(self) -> int:
        """Records per batch."""
        return self.header.batch_size

    @property
    def seq_len(self) -> int:
        """Tokens per record."""
        return self.header.seq_len

    @property
    def num_batches(self) -> int:
        """Batches in the file."""
        return self.header.num_batches

    @property
    def dtype(self) -> int:
        """Token dtype code (0: uint32)."""
        return self.header.dtype

    @property
    def seed(self) -> int:
        """Seed of the writer's record permutation."""
        return self.header.seed

    @property
    def total_records(self) -> int:
        """Records the writer was given, before the remainder was dropped."""
        return self.header.total_records

    @property
    def padded_batch_bytes(self) -> int:
        """Slot size of one batch in bytes (a multiple of 4096)."""
        return self.header.padded_batch_bytes

    @property
    def raw_batch_bytes(self) -> int:
        """Token bytes in one batch."""
        return self.header.raw_batch_bytes

    @property
    def file_size(self) -> int:
        """Size of the file in bytes."""
        return self.header.file_size

    # -- batch access --------------------------------------------------------------------
    def __len__(self) -> int:
        return self.header.num_batches

    def _index(self, index: int) -> int:
        if self._closed:
            raise ValueError(f"{self.path}: reader is closed")
        i = operator.index(index)
        n = self.header.num_batches
        if not -n <= i < n:
            raise IndexError(f"{self.path}: batch index {i} out of range for {n} batches")
        return i

    def read_batch(self, index: int) -> U32Array:
        """Batch ``index`` as a read-only uint32 ``[batch_size, seq_len]`` view (no copy)."""
        i = self._index(index)  # first: raises if closed, before the views are touched
        batch: U32Array = self._tokens[i]
        return batch

    __getitem__ = read_batch

    def read_batch_int32(self, index: int) -> I32Array:
        """Batch ``index`` as a read-only int32 view (no copy).

        Exact only for token ids below 2**31; larger ids read as negative numbers. Use
        ``read_batch_int64`` when the vocabulary may exceed that.
        """
        i = self._index(index)  # first: raises if closed, before the views are touched
        batch: I32Array = self._tokens_i32[i]
        return batch

    def read_batch_int64(self, index: int, out: I64Array | None = None) -> I64Array:
        """Batch ``index`` converted to int64: a new array, or written into ``out`` if given."""
        i = self._index(index)
        view: U32Array = self._tokens[i]
        if out is None:
            return view.astype(np.int64)
        if out.shape != view.shape or out.dtype != np.int64:
            raise ValueError(f"out must be int64 {view.shape}, got {out.dtype} {out.shape}")
        np.copyto(out, view, casting="safe")
        return out

    def read_batches(self, start: int, stop: int) -> U32Array:
        """Batches ``start..stop`` as one read-only ``[n, batch_size, seq_len]`` view (no copy)."""
        if self._closed:
            raise ValueError(f"{self.path}: reader is closed")
        n = self.header.num_batches
        if not 0 <= start <= stop <= n:
            raise IndexError(f"{self.path}: batch range {start}..{stop} out of range for {n}")
        return self._tokens[start:stop]

    def slot_padding(self, start: int, stop: int) -> U32Array:
        """The padding words of slots ``start..stop`` (``[n, pad_words]`` view; may be empty)."""
        if self._closed:
            raise ValueError(f"{self.path}: reader is closed")
        return self._slots[start:stop, self.header.batch_size * self.header.seq_len :]

    def read_ahead(self, start: int, stop: int) -> None:
        """Have batches ``start..stop`` read and mapped in the background (``pages.Readahead``).

        Returns at once; a background thread reads while the caller works on earlier batches.
        """
        if self._closed or stop <= start:
            return
        pb = self.header.padded_batch_bytes
        start = max(start, 0)
        length = (min(stop, self.header.num_batches) - start) * pb
        self._readahead.request(HEADER_SIZE + start * pb, length)

    # -- lifetime ------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._closed

    def close(self) -> None:
        """Release the mapping. Views still held by the caller keep it alive until dropped."""
        if self._closed:
            return
        self._closed = True
        self._release()
        del self._tokens, self._tokens_i32, self._slots
        # If the caller still holds views, the mapping is unmapped when the last one goes:
        # the views keep the mmap object alive, and nothing here refers to it any more.
        with contextlib.suppress(BufferError):
            self._mmap.close()
        del self._mmap

    def __enter__(self) -> BatchFileReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __reduce__(self) -> tuple[type[BatchFileReader], tuple[str]]:
        # Worker processes reopen the file by path rather than shipping the mapping.
        return (BatchFileReader, (self.path,))

    def __repr__(self) -> str:
        h = self.header
        return (
            f"BatchFileReader({self.path!r}, num_batches={h.num_batches}, "
            f"batch_size={h.batch_size}, seq_len={h.seq_len})"
        )


def _release_descriptor(readahead: Readahead, fd: int) -> None:
    """Stop read-ahead, then close its descriptor (kept open if a hint is still running)."""
    if readahead.close():
        os.close(fd)
