"""What every ingestion source offers, so that a converter can treat them all alike.

A source cuts some external data (nanoGPT ``.bin`` shards, ``.npy`` arrays, tokenized text) into
records of ``seq_len`` tokens and yields them as ``uint32`` blocks ``[k, seq_len]``, which is
exactly what ``write_batch_dataset`` consumes::

    write_batch_dataset(out, src.iter_blocks(), src.num_records, batch_size, src.seq_len, seed)

``num_records`` is ``None`` when the count is only known once the data has been read (text
sources); the writer accepts ``total_records=None``. Blocks are bounded (a few MiB), so a
converter's memory never depends on the dataset size.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from zerobatch_spec import TOKEN_BYTES

from ..arguments import U32_MAX, int_arg
from ..errors import IngestError

U32Block = npt.NDArray[np.uint32]
"""A block of records: ``uint32 [k, seq_len]``, C-contiguous, owned by the caller."""

PathLike = str | os.PathLike[str]
Patterns = PathLike | Sequence[PathLike]
"""A glob pattern or path, or a sequence of them."""

DEFAULT_BLOCK_BYTES = 4 * 2**20
"""Target size of one yielded block: large enough to amortise Python, small enough to bound
memory (the streaming writer spills each block straight to disk)."""


@runtime_checkable
class RecordSource(Protocol):
    """A stream of fixed-length records, as blocks ready for ``write_batch_dataset``."""

    @property
    def seq_len(self) -> int:
        """Tokens per record."""
        ...

    @property
    def num_records(self) -> int | None:
        """How many records ``iter_blocks`` yields, or ``None`` if unknown before reading."""
        ...

    def iter_blocks(self) -> Iterator[U32Block]:
        """Yield every record once, in source order, as ``uint32 [k, seq_len]`` blocks."""
        ...


def default_chunk_records(seq_len: int, block_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
    """Records per block so that one ``uint32`` block is about ``block_bytes`` (at least 1)."""
    return max(1, block_bytes // (TOKEN_BYTES * seq_len))


def check_seq_len(seq_len: object) -> int:
    """``seq_len`` as an int in ``[1, 2**32 - 1]``, or an ``IngestError`` naming it."""
    return int_arg("seq_len", seq_len, 1, U32_MAX, IngestError)


def check_chunk_records(chunk_records: object | None, seq_len: int) -> int:
    """``chunk_records`` validated, or the default for ``seq_len`` when it is ``None``."""
    if chunk_records is None:
        return default_chunk_records(seq_len)
    return int_arg("chunk_records", chunk_records, 1, None, IngestError)


def expand_paths(patterns: Patterns, what: str = "input") -> list[str]:
    """Expand glob patterns and paths into a list of existing files.

    A single pattern gives its matches sorted (shard names are numbered, so sorting restores
    their order); a sequence keeps the order given, each entry's matches sorted. An entry with
    no glob characters must name an existing file. A pattern that matches nothing, a path that
    is not a regular file, and a file listed twice (it would be ingested twice) are errors.
    """
    items = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
    if not items:
        raise IngestError(f"no {what} files given")
    out: list[str] = []
    seen: set[str] = set()
    for item in items:
        pattern = os.fspath(item)
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
            if not matches:
                raise IngestError(f"{pattern}: no {what} file matches this pattern")
        else:
            if not os.path.isfile(pattern):
                state = "is not a regular file" if os.path.exists(pattern) else "does not exist"
                raise IngestError(f"{pattern}: {what} file {state}")
            matches = [pattern]
        for path in matches:
            key = os.path.realpath(path)
            if key in seen:
                raise IngestError(f"{path}: {what} file listed twice; it would be ingested twice")
            seen.add(key)
            out.append(path)
    return out
