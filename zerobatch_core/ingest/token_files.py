"""Token files with documents: the corpora other systems wrote, read as one kind of source.

Megatron-LM indexed datasets (``megatron.py``), Hugging Face Arrow datasets
(``hf_datasets.py``), MosaicML MDS shards (``mds.py``) and Atlas shards (``atlas.py``) all
hold, per input file, a sequence of documents of token ids. Each format module opens its files
as :class:`TokenFile`: the file's documents concatenated into one stream of ``num_tokens``
tokens, read by ranges (``read_tokens``), and the position in that stream where each document
starts (``document_starts``). Everything after that is shared here, and is what ``convert``
does with nanoGPT shards:

``layout="contiguous"``
    The stream cut into consecutive records of ``seq_len`` tokens; the last
    ``num_tokens % seq_len`` tokens of each file are dropped (records never span two files).
``layout="documents"``
    A record starts at the first document start at or after the current position and takes
    ``seq_len`` tokens (running on into the next documents if the document is shorter); the
    next record starts at the first document start at or after its end (nanoGPT's BOS
    alignment, with document starts for BOS positions). Documents shorter than what is left of
    a record are not padded: their tail is the next document's head.

Records of a file depend on that file alone, so per-file record counts are known before any
token is read (from the document starts), each input file's record range goes into a
dataset's manifest, and a trace names the file and the record. Reads are windowed
(``WINDOW_BYTES``) and ascending within a file, so a format whose tokens sit in compressed
blocks decompresses each block once, and memory stays bounded whatever the corpus size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ..arguments import U32_MAX
from ..errors import IngestError
from .records import I64Array, bos_record_starts, gather_records, locate_record
from .source import Drop, U32Block, check_chunk_records, check_seq_len

Layout = Literal["contiguous", "documents"]
LAYOUTS: tuple[Layout, ...] = ("contiguous", "documents")

IntArray = npt.NDArray[np.integer[Any]]

DEFAULT_COLUMN = "input_ids"
"""The column (or field) holding each document's token ids, where a format names one."""

WINDOW_BYTES = 4 * 2**20
"""Bytes of tokens read at once when gathering records."""


@runtime_checkable
class TokenFile(Protocol):
    """One input file of another system's format, as a stream of tokens with documents.

    ``path`` names the file in errors, manifests and traces. ``read_tokens(start, stop)``
    returns tokens ``[start, stop)`` of the stream (``0 <= start <= stop <= num_tokens``) as a
    fresh array of ``dtype`` (any unsigned or signed integer type; values outside
    ``[0, 2**32 - 1]`` are refused by the caller); calls come with ascending ranges. A format
    error found while reading raises ``IngestError`` naming the file and what is wrong.
    ``document_starts()`` is the ascending ``int64`` position of each document's first token
    (empty documents share their start with the next one).
    """

    @property
    def path(self) -> str: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    def read_tokens(self, start: int, stop: int) -> npt.NDArray[np.integer[Any]]: ...

    def document_starts(self) -> I64Array: ...

    def close(self) -> None: ...


def check_layout(layout: object) -> Layout:
    """``layout`` if it is ``contiguous`` or ``documents``, else an ``IngestError``."""
    if layout not in LAYOUTS:
        raise IngestError(f"layout must be 'contiguous' or 'documents', got {layout!r}")
    return layout


def record_starts(f: TokenFile, seq_len: int, layout: Layout) -> I64Array:
    """The stream position of each record of ``f`` (module docstring)."""
    t = check_seq_len(seq_len)
    if check_layout(layout) == "contiguous":
        return np.arange(f.num_tokens // t, dtype=np.int64) * t
    starts = np.asarray(f.document_starts(), dtype=np.int64)
    if starts.ndim != 1 or (starts.size and (starts[0] < 0 or starts[-1] > f.num_tokens)):
        raise IngestError(f"{f.path}: document starts outside the file's {f.num_tokens} tokens")
    if starts.size > 1 and bool((np.diff(starts) < 0).any()):
        raise IngestError(f"{f.path}: document starts are not ascending")
    starts = starts[starts < f.num_tokens]  # empty documents at the very end start no record
    if starts.size > 1:  # ascending: drop repeats (empty documents) by their neighbours
        starts = starts[np.concatenate([[True], starts[1:] != starts[:-1]])]
    return bos_record_starts(starts, t, f.num_tokens)


def record_blocks(
    f: TokenFile, starts: I64Array, seq_len: int, chunk_records: int | None = None
) -> Iterator[U32Block]:
    """The records of ``f`` at ``starts`` (ascending, non-overlapping) as ``uint32`` blocks.

    Each read covers the records that end within one window of ``WINDOW_BYTES`` (at least one
    record) from the first of them: runs of nearby records are one read, gaps between far-apart
    records are never read.
    """
    t = check_seq_len(seq_len)
    k = check_chunk_records(chunk_records, t)

    def read(lo: int, hi: int) -> npt.NDArray[np.uint32]:
        chunk = f.read_tokens(lo, hi)
        if chunk.shape != (hi - lo,):
            raise IngestError(f"{f.path}: tokens [{lo}, {hi}) came back as {chunk.shape[0]} tokens")
        return _as_u32(f, chunk, lo)

    return gather_records(starts, t, k, max(t, WINDOW_BYTES // max(1, f.dtype.itemsize)), read)


def _as_u32(
    f: TokenFile, chunk: npt.NDArray[np.integer[Any]], first: int
) -> npt.NDArray[np.uint32]:
    """``chunk`` as uint32, or an ``IngestError`` naming the first token out of range."""
    dt = chunk.dtype
    if dt.kind not in "ui":
        raise IngestError(f"{f.path}: tokens of dtype {dt}, expected integers")
    if not (dt.kind == "u" and dt.itemsize <= 4) and chunk.size:
        bad = np.flatnonzero((chunk < 0) | (chunk > U32_MAX))
        if bad.size:
            at = int(bad[0])
            raise IngestError(
                f"{f.path}: token {first + at} is {int(chunk[at])}, outside [0, 2**32 - 1]"
            )
    return chunk.astype(np.uint32, copy=False)


class TokenFileSource:
    """Token files as a ``RecordSource`` (``num_records``, ``iter_blocks``) that also counts
    its tokens and drops (``CountsTokens``) and each file's records (``record_counts``).

    Record starts are computed once per file and kept (8 bytes per record) between counting
    and reading, as ``NanoGPTSource`` does in BOS mode.
    """

    def __init__(
        self,
        files: Sequence[TokenFile],
        seq_len: int,
        layout: Layout = "contiguous",
        chunk_records: int | None = None,
        *,
        kind: str = "tokens",
    ) -> None:
        if not files:
            raise IngestError("no input files given")
        self.files = list(files)
        self._seq_len = check_seq_len(seq_len)
        self.layout = check_layout(layout)
        self.chunk_records = check_chunk_records(chunk_records, self._seq_len)
        self.kind = kind
        self._starts: list[I64Array] | None = None

    @property
    def paths(self) -> list[str]:
        """The input files, in reading order."""
        return [f.path for f in self.files]

    @property
    def seq_len(self) -> int:
        return self._seq_len

    def _all_starts(self) -> list[I64Array]:
        if self._starts is None:
            self._starts = [record_starts(f, self._seq_len, self.layout) for f in self.files]
        return self._starts

    def record_counts(self) -> list[int]:
        """Records of each input file, in reading order."""
        return [int(s.size) for s in self._all_starts()]

    @property
    def num_records(self) -> int:
        return sum(self.record_counts())

    def iter_blocks(self) -> Iterator[U32Block]:
        for f, starts in zip(self.files, self._all_starts(), strict=True):
            yield from record_blocks(f, starts, self._seq_len, self.chunk_records)

    @property
    def source_tokens(self) -> int:
        return sum(f.num_tokens for f in self.files)

    def input_dtypes(self) -> list[np.dtype[Any]]:
        """The dtype of each file's tokens, as the file stores them."""
        return [np.dtype(f.dtype) for f in self.files]

    def locate(self, record: int, token: int) -> str:
        """The file holding token ``token`` of the stream's record ``record``, and where."""
        paths = (f.path for f in self.files)
        return locate_record(zip(paths, self._all_starts(), strict=True), record, token, "file")

    def drops(self) -> list[Drop]:
        tokens = self.source_tokens - self.num_records * self._seq_len
        if not tokens:
            return []
        if self.layout == "contiguous":
            detail = (
                f"the last num_tokens % {self._seq_len} tokens of each file (records never "
                "span files)"
            )
            return [Drop("file_tails", 0, tokens, detail)]
        detail = (
            "tokens outside the records that start at a document: from each record's end to "
            "the next document's start, and at each file's end"
        )
        return [Drop("document_alignment", 0, tokens, detail)]

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __repr__(self) -> str:
        return (
            f"TokenFileSource({self.kind}, {len(self.files)} files, seq_len={self._seq_len}, "
            f"layout={self.layout!r})"
        )


__all__ = [
    "DEFAULT_COLUMN",
    "LAYOUTS",
    "WINDOW_BYTES",
    "Layout",
    "TokenFile",
    "TokenFileSource",
    "check_layout",
    "record_blocks",
    "record_starts",
]
