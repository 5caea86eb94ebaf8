"""``BatchFileReader``: validated, read-only, memory-mapped access to one LLMBATCH file."""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import mmap
import operator
import os
import stat
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import xxhash
from zerobatch_spec import (
    DTYPE_NAMES,
    HEADER_SIZE,
    TOKEN_DTYPE,
    ErrorCode,
    Header,
    Violation,
    build_header,
    check_header,
)

from ..closing import Closing
from ..errors import FormatError, ZeroBatchError, ZeroBatchIOError
from ..order import BlockOrder
from .pages import Readahead

_SIGNED_TOKEN_DTYPE = np.dtype(np.int32).newbyteorder(TOKEN_DTYPE.byteorder)
"""The token words reinterpreted as int32, in the tokens' byte order (``read_batch_int32``)."""

U32Array = npt.NDArray[np.uint32]
I32Array = npt.NDArray[np.int32]
I64Array = npt.NDArray[np.int64]
S = TypeVar("S")

FINGERPRINT_SLOTS = 16
"""Slots sampled (their first tokens) for a file's identity in a loader state."""
FINGERPRINT_TOKENS = 1024
"""Tokens of each sampled slot that enter a file's identity."""


def file_identity(header: Header, read_batch: Callable[[int], U32Array]) -> dict[str, Any]:
    """What a loader state records about a single file, so that it loads into that file only.

    Its size, its header's XXH3-64 and the XXH3-64 of the first ``FINGERPRINT_TOKENS`` tokens
    of ``FINGERPRINT_SLOTS`` evenly spaced slots (a few pages, read once). A local copy and a
    remote copy of one file (``read_batch`` of either) have the same identity.
    """
    n = header.num_batches
    sample = xxhash.xxh3_64()
    for i in sorted({i * n // FINGERPRINT_SLOTS for i in range(FINGERPRINT_SLOTS)} if n else ()):
        first = read_batch(i).reshape(-1)[:FINGERPRINT_TOKENS]
        sample.update(np.ascontiguousarray(first).tobytes())
    return {
        "file": {
            "size": header.file_size,
            "header_xxh3": f"{xxhash.xxh3_64_intdigest(build_header(header)):016x}",
            "sample_xxh3": sample.hexdigest(),
        }
    }


class LocalSlots:
    """The part of the loader's surface (``delivery.sources.BatchSource``) that every reader of
    local, memory-mapped files shares: slots are views of a mapping, never fetched."""

    fetches = False
    """Reads are page faults on a mapping, not fetches: conversions run in the background."""

    def read_batch(self, index: int) -> U32Array:
        raise NotImplementedError

    def read_region(self, index: int, r0: int, r1: int, lo: int, hi: int) -> U32Array:
        """Rows ``r0..r1``, columns ``lo..hi`` of slot ``index``: a view of its mapping."""
        return self.read_batch(index)[r0:r1, lo:hi]

    def view_batches(self, start: int, stop: int) -> U32Array | None:
        """Slots ``start..stop`` as one ``[n, batch_size, seq_len]`` view, where one mapping
        holds them all; ``None`` where they lie in several (the caller reads slot by slot)."""
        return None

    def ahead(
        self,
        steps: Iterator[S],
        regions: Callable[[S], Sequence[tuple[int, int, int, int, int]]],
        *,
        whole_rows: bool = False,
    ) -> Iterator[S]:
        """``steps`` unchanged: mapped files need no regions announced (``read_ahead`` has
        blocks paged in instead)."""
        return steps


class BatchFileReader(LocalSlots, Closing):
    """Open an LLMBATCH file, validate it (rules 1-8 of ``SPEC.md``) and serve zero-copy batches.

    Validation happens before the file is mapped, so a truncated or oversized file is rejected
    with a ``FormatError`` naming the file, the rule and the field, instead of faulting later.
    Batches are read-only views into the mapping: ``read_batch`` costs an index computation,
    not a copy.

    A path that is not a regular file (a directory, a FIFO, a device) raises
    ``ZeroBatchIOError``, an ``OSError`` like the one a missing or unreadable path raises.

    LLMBATCH files are meant to be immutable once written. If another process truncates the
    file while it is mapped, touching the lost pages raises SIGBUS, which no Python code can
    catch. ``check_size`` detects the shrunk file for the cost of one ``fstat`` (the loader
    calls it at every block start), and the first reader of a process enables Python's
    ``faulthandler`` unless the program has set it up itself, so a SIGBUS that still arrives
    prints "Fatal Python error: Bus error" and the Python traceback rather than ending the
    process silently.

    >>> with BatchFileReader("train.batch") as r:  # doctest: +SKIP
    ...     first = r.read_batch(0)  # [batch_size, seq_len] uint32 (uint16: dtype 1), no copy
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                code = errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL
                raise ZeroBatchIOError(code, "not a regular file", self.path)
            prefix = os.pread(fd, HEADER_SIZE, 0)
            checked = check_header(prefix, st.st_size)
            self.header_bytes = bytes(prefix[:HEADER_SIZE])
            """The header's 4096 bytes as read (a valid header is exactly its fields' bytes)."""
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
        _enable_fault_handler()
        self._fd = fd
        self._tokens, self._padding, self._empty_unrepresentable = _views(self._mmap, self.header)
        # uint32 tokens read as int32 are a bit-cast view; narrower tokens are widened per read.
        wide = self._tokens.dtype == TOKEN_DTYPE
        self._tokens_i32: I32Array | None = self._tokens.view(_SIGNED_TOKEN_DTYPE) if wide else None
        # The descriptor stays open for read-ahead hints, so they always reach this inode; it
        # is closed by ``close`` or, for a reader that is just dropped, by the finalizer.
        self._readahead = Readahead(fd, np.frombuffer(self._mmap, dtype=np.uint8))
        # The read-ahead owns the descriptor and closes it (``close``, or this finalizer for
        # a reader that is just dropped), after any hint still using it.
        self._release = weakref.finalize(self, self._readahead.close)
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
        """Token dtype code (0: uint32, 1: uint16)."""
        return self.header.dtype

    @property
    def token_dtype(self) -> np.dtype[np.unsignedinteger]:
        """NumPy dtype of the stored tokens: what ``read_batch`` views have."""
        return self.header.token_dtype

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
        """Batch ``index`` as a read-only ``[batch_size, seq_len]`` view of the stored tokens
        (uint32, or uint16 for a dtype 1 file; no copy)."""
        i = self._index(index)  # first: raises if closed, before the views are touched
        batch: U32Array = self._tokens[i]
        return batch

    __getitem__ = read_batch

    def read_batch_int32(self, index: int) -> I32Array:
        """Batch ``index`` as int32: a read-only view of uint32 tokens (no copy), or a new
        array widened from uint16 tokens (exact).

        For uint32 tokens it is exact only for ids below 2**31; larger ids read as negative
        numbers. Use ``read_batch_int64`` when the vocabulary may exceed that.
        """
        i = self._index(index)  # first: raises if closed, before the views are touched
        if self._tokens_i32 is None:
            widened: I32Array = self._tokens[i].astype(np.int32)
            return widened
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
        """Batches ``start..stop`` as one read-only ``[n, batch_size, seq_len]`` view (no copy).

        The one range NumPy cannot express is the empty range of a file without batches whose
        ``batch_size * seq_len * token bytes`` exceeds NumPy's array size limit (2**63 bytes): that
        raises ``ZeroBatchError``, since an empty array of that shape does not exist in NumPy.
        """
        if self._closed:
            raise ValueError(f"{self.path}: reader is closed")
        n = self.header.num_batches
        if not 0 <= start <= stop <= n:
            raise IndexError(f"{self.path}: batch range {start}..{stop} out of range for {n}")
        if self._empty_unrepresentable:
            h = self.header
            raise ZeroBatchError(
                f"{self.path}: the file holds no batches, and NumPy cannot represent an empty "
                f"[0, {h.batch_size}, {h.seq_len}] {DTYPE_NAMES[h.dtype]} array (a batch of "
                f"{h.raw_batch_bytes} bytes exceeds its size limit)"
            )
        return self._tokens[start:stop]

    def slot_padding(self, start: int, stop: int) -> U32Array:
        """The padding words of slots ``start..stop`` (``[n, pad_words]`` view; may be empty)."""
        if self._closed:
            raise ValueError(f"{self.path}: reader is closed")
        return self._padding[start:stop]

    def check_size(self, index: int = 0) -> None:
        """Raise ``FormatError`` (``size_mismatch``) if the file no longer has its validated size
        (``index``, the slot about to be read, names the file in a dataset; one file here).

        Costs one ``fstat`` of the open descriptor. A file truncated while it is mapped turns
        every touch of a lost page into SIGBUS; callers that iterate for a long time (the
        loader, once per block) call this first, so a file shrunk between two calls is reported
        by name instead of killing the process. A truncation that lands between this check and
        the next touch of a lost page still raises SIGBUS: no check can close that window.
        """
        if self._closed:
            raise ValueError(f"{self.path}: reader is closed")
        size = os.fstat(self._fd).st_size
        required = self.header.file_size
        if size != required:
            change = "truncated" if size < required else "extended"
            raise FormatError(
                self.path,
                Violation(
                    ErrorCode.SIZE_MISMATCH,
                    "num_batches",
                    f"file is {size} bytes now; its header requires {required}: it was "
                    f"{change} while mapped (LLMBATCH files must not change once written)",
                ),
            )

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

    # -- the loader's surface (``delivery.sources.BatchSource``) --------------------------
    def view_batches(self, start: int, stop: int) -> U32Array:
        """``read_batches``: one mapping holds every batch, so a run of them is one view."""
        return self.read_batches(start, stop)

    def order(self, block_size: int, seed: int, shuffle: bool) -> BlockOrder:
        """The file's serving order (``SPEC.md`` section 8) with these parameters."""
        return BlockOrder(self.num_batches, block_size, seed, shuffle)

    def identity(self) -> dict[str, Any]:
        """What a loader state records to refuse another file (``file_identity``)."""
        return file_identity(self.header, self.read_batch)

    def slot_file(self, index: int) -> tuple[BatchFileReader, int]:
        """``(self, index)``: the mapped file holding batch ``index``, and its slot there."""
        return self, self._index(index) % self.num_batches

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
        del self._tokens, self._tokens_i32, self._padding
        # If the caller still holds views, the mapping is unmapped when the last one goes:
        # the views keep the mmap object alive, and nothing here refers to it any more.
        with contextlib.suppress(BufferError):
            self._mmap.close()
        del self._mmap

    def __reduce__(self) -> tuple[type[BatchFileReader], tuple[str]]:
        # Worker processes reopen the file by path rather than shipping the mapping.
        return (BatchFileReader, (self.path,))

    def __repr__(self) -> str:
        h = self.header
        return (
            f"BatchFileReader({self.path!r}, num_batches={h.num_batches}, "
            f"batch_size={h.batch_size}, seq_len={h.seq_len}, dtype={DTYPE_NAMES[h.dtype]})"
        )


def _views(data: mmap.mmap, h: Header) -> tuple[U32Array, U32Array, bool]:
    """The token view ``[num_batches, B, T]`` and the padding view ``[num_batches, pad_words]``.

    Only a validated file reaches here. With at least one batch, the mapping holds every slot,
    so both shapes describe real bytes and fit NumPy's limits. A file without batches has
    nothing to view, and its shape may exceed what NumPy can represent (``batch_size = seq_len
    = 2**32 - 1`` is valid); its views are built empty, never reshaped from the mapping. The
    flag says whether the empty token view had to drop its true shape.
    """
    words = h.batch_size * h.seq_len
    pad_words = h.slot_words - words
    dtype = h.token_dtype
    if h.num_batches == 0:
        padding = np.empty((0, pad_words), dtype=dtype)
        try:
            tokens = np.empty((0, h.batch_size, h.seq_len), dtype=dtype)
            unrepresentable = False
        except ValueError:  # "array is too big": B * T * itemsize exceeds NumPy's size limit
            tokens = np.empty((0, 0, 0), dtype=dtype)
            unrepresentable = True
        tokens.flags.writeable = padding.flags.writeable = False
        return tokens, padding, unrepresentable
    flat = np.frombuffer(data, dtype=dtype, offset=HEADER_SIZE)
    slots = flat.reshape(h.num_batches, h.slot_words)
    tokens = slots[:, :words].reshape(h.num_batches, h.batch_size, h.seq_len)
    return tokens, slots[:, words:], False


_fault_handler_offered = False


def _enable_fault_handler() -> None:
    """Enable ``faulthandler`` once per process, unless the program has enabled it already.

    A mapped file truncated by another process turns the next touch of a lost page into SIGBUS.
    With the handler, the process still dies, but first prints "Fatal Python error: Bus error"
    and the Python traceback of every thread to standard error. A program that set
    ``faulthandler`` up itself (``-X faulthandler``, ``PYTHONFAULTHANDLER``, its own ``enable``
    call, pytest) keeps its setup, and one that wants no handler can call
    ``faulthandler.disable()`` after opening its first reader. Where standard error has no file
    descriptor (an embedded interpreter), nothing is enabled.
    """
    global _fault_handler_offered
    if _fault_handler_offered:
        return
    _fault_handler_offered = True
    if faulthandler.is_enabled():
        return
    with contextlib.suppress(AttributeError, ValueError, RuntimeError, OSError):
        faulthandler.enable()
