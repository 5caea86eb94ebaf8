"""``.npy`` token arrays as a record source.

Two layouts are accepted:

- ``[N, seq_len]``: one record per row, as it is; the second dimension must equal ``seq_len``.
- ``[num_tokens]``: a flat token stream (nanoGPT's ``train.bin`` saved with ``np.save``, for
  example), cut into consecutive non-overlapping ``seq_len`` windows; the last
  ``num_tokens % seq_len`` tokens are dropped. Records never straddle two files, for the same
  reasons as nanoGPT shards (``nanogpt.py``).

The ``.npy`` header (format 1.0 or 2.0) is parsed here and the data read a block at a time with
positioned reads (``SourceFile``), never memory-mapped and never whole: a file truncated during a
conversion gives an ``IngestError`` naming it ("truncated while reading"), not a ``SIGBUS``.
C-ordered and Fortran-ordered arrays are both read. The dtype must be an integer type (not
bool); values are checked block by block against the uint32 range and a bad one is reported
with the file, record and token (the writer checks too, but it cannot name the source file).
Types that cannot hold an out-of-range value (uint8, uint16, uint32) are not checked.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..arguments import U32_MAX
from ..errors import IngestError
from .source import (
    Drop,
    PathLike,
    Patterns,
    SourceFile,
    U32Block,
    check_chunk_records,
    check_seq_len,
    expand_paths,
)

IntArray = npt.NDArray[np.integer[Any]]


NPZ_MAGIC = b"PK\x03\x04"
"""A ``.npz`` archive is a zip file."""


class ArrayFile:
    """One ``.npy`` integer array of shape ``[N, T]`` or ``[tokens]``, read with positioned reads.

    Opening parses the header only and checks that the file holds all the data it declares.
    """

    def __init__(self, path: PathLike) -> None:
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as f:
                if f.read(len(NPZ_MAGIC)) == NPZ_MAGIC:
                    raise IngestError(
                        f"{self.path}: expected a single .npy array, got a .npz archive"
                    )
                f.seek(0)
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    raise IngestError(
                        f"{self.path}: .npy format version {version[0]}.{version[1]} is not "
                        f"supported for token arrays (1.0 or 2.0)"
                    )
                self.offset = f.tell()
                file_size = os.fstat(f.fileno()).st_size
        except (OSError, ValueError, EOFError) as e:
            if isinstance(e, IngestError):
                raise
            raise IngestError(f"{self.path}: not a readable .npy array: {e}") from e
        self._dtype: np.dtype[Any] = dtype
        self._shape = tuple(int(d) for d in shape)
        self.fortran_order = bool(fortran) and len(self._shape) > 1
        if dtype.kind not in "ui":
            raise IngestError(f"{self.path}: field dtype: expected an integer dtype, got {dtype}")
        if len(self._shape) not in (1, 2):
            raise IngestError(
                f"{self.path}: field shape: expected [num_records, seq_len] or [num_tokens], "
                f"got {list(self._shape)}"
            )
        self.size = math.prod(self._shape)
        expected = self.offset + self.size * dtype.itemsize
        if file_size < expected:
            raise IngestError(
                f"{self.path}: field shape: {list(self._shape)} {dtype} needs a file of "
                f"{expected:,} bytes ({self.offset}-byte header included), got {file_size:,} "
                f"bytes (truncated array)"
            )

    @property
    def dtype(self) -> np.dtype[Any]:
        """The array's dtype, as stored."""
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape, as stored."""
        return self._shape

    def _check_layout(self, seq_len: int) -> int:
        """``seq_len`` checked against a 2-D array's rows."""
        t = check_seq_len(seq_len)
        if len(self._shape) == 2 and self._shape[1] != t:
            raise IngestError(
                f"{self.path}: field shape: expected [num_records, {t}] for seq_len={t}, got "
                f"{list(self._shape)}"
            )
        return t

    def count_records(self, seq_len: int) -> int:
        """Rows of a 2-D array, or ``num_tokens // seq_len`` for a flat one."""
        t = self._check_layout(seq_len)
        n = self._shape[0]
        return n if len(self._shape) == 2 else n // t

    def iter_blocks(
        self,
        seq_len: int,
        chunk_records: int | None = None,
        *,
        records: tuple[int, int] | None = None,
    ) -> Iterator[U32Block]:
        """This file's records (``records = (first, stop)``: those only) as ``uint32 [k,
        seq_len]`` blocks of ``chunk_records`` records."""
        t = self._check_layout(seq_len)
        k = check_chunk_records(chunk_records, t)
        n = self.count_records(t)
        first, stop = (0, n) if records is None else records
        if not 0 <= first <= stop <= n:
            raise IngestError(f"{self.path}: records [{first}, {stop}) are not within [0, {n})")
        return self._blocks(t, k, first, stop)

    def unused_tokens(self, seq_len: int) -> int:
        """Tokens no record holds: a flat array's last ``num_tokens % seq_len`` (else 0)."""
        return self.size - self.count_records(seq_len) * check_seq_len(seq_len)

    def _blocks(self, t: int, k: int, first: int, stop: int) -> Iterator[U32Block]:
        n = self.count_records(t)
        flat = len(self._shape) == 1
        item = self._dtype.itemsize
        with SourceFile(self.path) as src:
            for r0 in range(first, stop, k):
                m = min(r0 + k, stop) - r0
                if self.fortran_order:  # column c of rows [r0, r0 + m) is contiguous
                    columns = np.empty((t, m), dtype=self._dtype)
                    for c in range(t):
                        src.read_into(self.offset + (c * n + r0) * item, columns[c])
                    rows = columns.T
                else:
                    rows = np.empty((m, t), dtype=self._dtype)
                    src.read_into(self.offset + r0 * t * item, rows)
                yield self._to_u32(rows, r0, flat)

    def _to_u32(self, rows: IntArray, first: int, flat: bool) -> U32Block:
        """``rows`` as uint32, or an ``IngestError`` naming the first out-of-range token."""
        dt = rows.dtype
        if not (dt.kind == "u" and dt.itemsize <= 4) and rows.size:
            low = dt.kind == "i" and int(rows.min()) < 0
            if low or int(rows.max()) > U32_MAX:
                bad = (rows < 0) | (rows > U32_MAX) if dt.kind == "i" else rows > U32_MAX
                r, c = (int(x[0]) for x in np.nonzero(bad))
                where = f"record {first + r}, token {c}"
                if flat:
                    where += f" (element {(first + r) * rows.shape[1] + c})"
                raise IngestError(
                    f"{self.path}: {where}: value {int(rows[r, c])} is outside the uint32 range "
                    f"[0, 2**32 - 1]"
                )
        return rows.astype(np.uint32, order="C", copy=False)  # ``rows`` is this block's own

    def __repr__(self) -> str:
        return f"ArrayFile({self.path!r}, shape={list(self.shape)}, dtype={self.dtype})"


ArrayLike = PathLike | ArrayFile
Arrays = ArrayLike | Sequence[ArrayLike]
"""A glob pattern or path, an ``ArrayFile``, or a sequence of them."""


def expand_arrays(patterns: Patterns) -> list[str]:
    """``.npy`` paths from a glob pattern or path, or a sequence of them (``expand_paths``)."""
    return expand_paths(patterns, what="array")


def _resolve(arrays: Arrays) -> list[ArrayFile | str]:
    if isinstance(arrays, (ArrayFile, str, os.PathLike)):
        arrays = [arrays]
    out: list[ArrayFile | str] = []
    seen: set[str] = set()
    for item in arrays:
        items: list[ArrayFile | str] = (
            [item] if isinstance(item, ArrayFile) else list(expand_arrays(item))
        )
        for a in items:
            name = a.path if isinstance(a, ArrayFile) else a
            key = os.path.realpath(name)
            if key in seen:
                raise IngestError(f"{name}: array file listed twice; it would be ingested twice")
            seen.add(key)
            out.append(a)
    if not out:
        raise IngestError("no array files given")
    return out


def _open(a: ArrayFile | str) -> ArrayFile:
    return a if isinstance(a, ArrayFile) else ArrayFile(a)


def count_records(arrays: Arrays, seq_len: int) -> int:
    """How many records ``iter_records`` yields: shape arithmetic, no token is read."""
    t = check_seq_len(seq_len)
    return sum(_open(a).count_records(t) for a in _resolve(arrays))


def iter_records(
    arrays: Arrays, seq_len: int, chunk_records: int | None = None
) -> Iterator[U32Block]:
    """Yield the arrays' records, file by file, as ``uint32 [k, seq_len]`` blocks.

    Arguments are checked and patterns expanded before the first block is asked for; files are
    opened one at a time.
    """
    t = check_seq_len(seq_len)
    k = check_chunk_records(chunk_records, t)
    resolved = _resolve(arrays)

    def blocks() -> Iterator[U32Block]:
        for a in resolved:
            yield from _open(a).iter_blocks(t, k)

    return blocks()


class ArraySource:
    """``.npy`` arrays as a ``RecordSource``; the count is known from the shapes alone."""

    def __init__(self, arrays: Arrays, seq_len: int, chunk_records: int | None = None) -> None:
        self._seq_len = check_seq_len(seq_len)
        self.chunk_records = check_chunk_records(chunk_records, self._seq_len)
        self._arrays = _resolve(arrays)
        self._count: int | None = None

    @property
    def paths(self) -> list[str]:
        """The array files, in the order their records are yielded."""
        return [a.path if isinstance(a, ArrayFile) else a for a in self._arrays]

    @property
    def seq_len(self) -> int:
        """Tokens per record."""
        return self._seq_len

    @property
    def num_records(self) -> int:
        """Records ``iter_blocks`` yields (from the shapes; computed once)."""
        if self._count is None:
            self._count = count_records(self._arrays, self._seq_len)
        return self._count

    def iter_blocks(self) -> Iterator[U32Block]:
        """Every record once, file by file, as ``uint32 [k, seq_len]`` blocks."""
        return iter_records(self._arrays, self._seq_len, self.chunk_records)

    @property
    def source_tokens(self) -> int:
        """Tokens in all the arrays (from their headers)."""
        return sum(_open(a).size for a in self._arrays)

    def input_dtypes(self) -> list[np.dtype[Any]]:
        """The dtype of each array, from its header."""
        return [_open(a).dtype for a in self._arrays]

    def locate(self, record: int, token: int) -> str:
        """The array holding token ``token`` of the stream's record ``record``, and where."""
        first = 0
        for a in self._arrays:
            f = _open(a)
            n = f.count_records(self._seq_len)
            if record < first + n:
                k = record - first
                if len(f.shape) == 2:
                    return f"{f.path}: record (row) {k:,}, token {token}"
                at = k * self._seq_len + token
                return f"{f.path}: element {at:,} (record {k:,}, token {token})"
            first += n
        return f"record {record:,} (past the arrays' {first:,} records), token {token}"

    def drops(self) -> list[Drop]:
        """The flat arrays' tails, which no record holds (records never straddle two files)."""
        t = self._seq_len
        tokens = sum(_open(a).unused_tokens(t) for a in self._arrays)
        if not tokens:
            return []
        detail = f"the last num_tokens % {t} tokens of each flat array (records never span files)"
        return [Drop("array_tails", 0, tokens, detail)]

    def __repr__(self) -> str:
        return f"ArraySource({len(self._arrays)} files, seq_len={self._seq_len})"
