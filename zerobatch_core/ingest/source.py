"""What every ingestion source offers, so that a converter can treat them all alike.

A source cuts some external data (nanoGPT ``.bin`` shards, ``.npy`` arrays, tokenized text) into
records of ``seq_len`` tokens and yields them as ``uint32`` blocks ``[k, seq_len]``, which is
exactly what ``write_batch_dataset`` consumes::

    write_batch_dataset(out, src.iter_blocks(), src.num_records, batch_size, src.seq_len, seed)

``num_records`` is ``None`` when the count is only known once the data has been read (text
sources); the writer accepts ``total_records=None``. Blocks are bounded (a few MiB), so a
converter's memory never depends on the dataset size.

Sources that read files of their own (nanoGPT shards, ``.npy`` arrays) read them with positioned
reads into NumPy buffers (``SourceFile``), never through a memory map: a file truncated while it
is being converted then gives an ``IngestError`` naming the file and offset, where a mapped read
would end the process with ``SIGBUS``.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from zerobatch_spec import TOKEN_BYTES

from ..arguments import U32_MAX, int_arg
from ..closing import Closing
from ..errors import IngestError, ZeroBatchIOError

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


@dataclass(frozen=True)
class Drop:
    """Input that did not reach the output, and why (for a conversion's summary)."""

    reason: str
    """A stable key: ``batch_remainder``, ``shard_tails``, ``bos_alignment``, ``array_tails``,
    ``final_partial_record``, ``truncated_documents``."""
    records: int
    """Whole records dropped (0 for tokens that never became a record)."""
    tokens: int
    """Source tokens dropped."""
    detail: str
    """What was dropped, in words."""


@runtime_checkable
class CountsTokens(Protocol):
    """A source that can tell how many tokens it holds and which it did not cut into records."""

    @property
    def source_tokens(self) -> int:
        """Tokens in the source files."""
        ...

    def drops(self) -> list[Drop]:
        """Source tokens that no record holds, by reason (empty if every token is in a record)."""
        ...


@runtime_checkable
class TokenInputs(Protocol):
    """A source of token files that can say what its files store and where a token lies: what
    ``convert`` needs to choose the output's token dtype and to name a token that does not fit
    it (``ingest.dtypes``)."""

    def input_dtypes(self) -> list[np.dtype[Any]]:
        """The dtype of each input file's tokens, as stored, in reading order."""
        ...

    def locate(self, record: int, token: int) -> str:
        """Where token ``token`` of record ``record`` of the stream lies: the file and the
        token's position in it, in words."""
        ...


class SourceFile(Closing):
    """A source file opened for positioned reads (``os.preadv``) into NumPy buffers.

    Never a memory map: a mapped file that shrinks under its reader kills the process with
    ``SIGBUS``, while a short read here raises an ``IngestError`` that names the file, the offset
    and the bytes expected and got. Use as a context manager, or ``close`` it.
    """

    def __init__(self, path: PathLike) -> None:
        self.path = os.fspath(path)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise ZeroBatchIOError(
                e.errno or 0, f"cannot open source file: {e.strerror or e}", self.path
            ) from e

    def size(self) -> int:
        """The file's size now, in bytes."""
        return os.fstat(self.fd).st_size

    def read_into(self, offset: int, out: npt.NDArray[Any]) -> None:
        """Fill ``out`` (C-contiguous) with the file's bytes from ``offset``.

        A file that ends before ``out`` is full raises an ``IngestError`` ("truncated while
        reading"); an OS error (``EIO``) a ``ZeroBatchIOError`` naming the file.
        """
        view = memoryview(out.reshape(-1).view(np.uint8).data)
        want, done = len(view), 0
        while done < want:
            try:
                n = os.preadv(self.fd, [view[done:]], offset + done)
            except OSError as e:
                raise ZeroBatchIOError(
                    e.errno or 0,
                    f"cannot read {want:,} bytes at offset {offset:,}: {e.strerror or e}",
                    self.path,
                ) from e
            if n == 0:
                raise IngestError(
                    f"{self.path}: truncated while reading: expected {want:,} bytes at offset "
                    f"{offset:,}, got {done:,} (the file is now {self.size():,} bytes)"
                )
            done += n

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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
