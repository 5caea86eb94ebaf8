"""``.npy`` token arrays as a record source.

Two layouts are accepted:

- ``[N, seq_len]``: one record per row, as it is; the second dimension must equal ``seq_len``.
- ``[num_tokens]``: a flat token stream (nanoGPT's ``train.bin`` saved with ``np.save``, for
  example), cut into consecutive non-overlapping ``seq_len`` windows; the last
  ``num_tokens % seq_len`` tokens are dropped. Records never straddle two files, for the same
  reasons as nanoGPT shards (``nanogpt.py``).

Files are opened with ``np.load(path, mmap_mode="r")`` and read a block at
a time, never whole. The dtype must be an integer type (not bool); values are checked block by
block against the uint32 range and a bad one is reported with the file, record and token (the
writer checks too, but it cannot name the source file). Types that cannot hold an out-of-range
value (uint8, uint16, uint32) are not checked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..arguments import U32_MAX
from ..errors import IngestError
from ..pages import release_pages
from .source import (
    PathLike,
    Patterns,
    U32Block,
    check_chunk_records,
    check_seq_len,
    expand_paths,
)

IntArray = npt.NDArray[np.integer[Any]]


class ArrayFile:
    """One ``.npy`` integer array, memory-mapped read-only, of shape ``[N, T]`` or ``[tokens]``."""

    def __init__(self, path: PathLike) -> None:
        self.path = os.fspath(path)
        try:
            loaded: Any = np.load(self.path, mmap_mode="r")
        except (OSError, ValueError, EOFError) as e:
            raise IngestError(f"{self.path}: not a readable .npy array: {e}") from e
        if not isinstance(loaded, np.ndarray):  # an .npz archive
            close = getattr(loaded, "close", None)
            if close is not None:
                close()
            raise IngestError(
                f"{self.path}: expected a single .npy array, got {type(loaded).__name__}"
            )
        array: np.ndarray[Any, Any] = loaded
        if array.dtype.kind not in "ui":
            raise IngestError(
                f"{self.path}: field dtype: expected an integer dtype, got {array.dtype}"
            )
        if array.ndim not in (1, 2):
            raise IngestError(
                f"{self.path}: field shape: expected [num_records, seq_len] or [num_tokens], "
                f"got {list(array.shape)}"
            )
        self.array: IntArray = array

    @property
    def dtype(self) -> np.dtype[Any]:
        """The array's dtype, as stored."""
        return self.array.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape, as stored."""
        return tuple(int(d) for d in self.array.shape)

    def _check_layout(self, seq_len: int) -> int:
        """``seq_len`` checked against a 2-D array's rows."""
        t = check_seq_len(seq_len)
        if self.array.ndim == 2 and self.array.shape[1] != t:
            raise IngestError(
                f"{self.path}: field shape: expected [num_records, {t}] for seq_len={t}, got "
                f"{list(self.array.shape)}"
            )
        return t

    def count_records(self, seq_len: int) -> int:
        """Rows of a 2-D array, or ``num_tokens // seq_len`` for a flat one."""
        t = self._check_layout(seq_len)
        n = int(self.array.shape[0])
        return n if self.array.ndim == 2 else n // t

    def iter_blocks(self, seq_len: int, chunk_records: int | None = None) -> Iterator[U32Block]:
        """This file's records as ``uint32 [k, seq_len]`` blocks of ``chunk_records`` records."""
        t = self._check_layout(seq_len)
        k = check_chunk_records(chunk_records, t)
        return self._blocks(t, k)

    def _blocks(self, t: int, k: int) -> Iterator[U32Block]:
        n = self.count_records(t)
        flat = self.array.ndim == 1
        for r0 in range(0, n, k):
            r1 = min(r0 + k, n)
            rows = self.array[r0 * t : r1 * t].reshape(r1 - r0, t) if flat else self.array[r0:r1]
            block = self._to_u32(np.asarray(rows), r0, flat)
            release_pages(self.array)  # keep the resident set flat however big the array
            yield block

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
        return rows.astype(np.uint32)

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

    def __repr__(self) -> str:
        return f"ArraySource({len(self._arrays)} files, seq_len={self._seq_len})"
