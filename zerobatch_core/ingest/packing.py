"""Tokenized documents to fixed-length records, as ``uint32 [k, seq_len]`` blocks.

Two modes, both marking every document start with BOS:

``pack`` (the default; nanochat's and most pre-training pipelines' choice)
    ``[bos, *doc0, bos, *doc1, ...]`` cut every ``seq_len`` tokens: documents run across record
    boundaries, nothing is padded, and the final partial record is dropped. :func:`pack_records`
    yields blocks of a few MiB (what ``write_batch_dataset`` wants) and statistics;
    :func:`pack_documents` yields the same records one read-only row at a time, as soon as each
    is complete.
``pad``
    One record per document: ``[bos, *doc]`` truncated to ``seq_len`` or padded with ``pad_id``
    up to it. Document boundaries and record boundaries coincide, at the cost of padding.

Both are vectorised: the Python work is per document (list appends) and per block (one
concatenation or one masked assignment), never per token. Memory is bounded by about one block
plus the largest document. The :class:`PackingStats` of a :class:`RecordBlocks` are complete
once it is exhausted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..arguments import U32_MAX, int_arg
from ..errors import IngestError
from ..tokenization.byte import BOS_ID
from .source import U32Block, check_chunk_records, check_seq_len

Mode = Literal["pack", "pad"]


@dataclass
class PackingStats:
    """What packing or padding did, for logs and dataset cards.

    ``tokens`` counts document tokens (BOS excluded). Every record token is a BOS, a document
    token or padding, so ``records * seq_len == documents + tokens - truncated_tokens -
    dropped_tail_tokens + padding_tokens`` in ``pad`` mode, and in ``pack`` mode (no padding,
    no truncation) ``records * seq_len + dropped_tail_tokens == documents + tokens``, where
    ``dropped_tail_tokens`` (BOS included) is the final partial record.
    """

    mode: Mode
    seq_len: int
    documents: int = 0
    tokens: int = 0
    records: int = 0
    padding_tokens: int = 0
    truncated_documents: int = 0
    truncated_tokens: int = 0
    dropped_tail_tokens: int = 0

    @property
    def record_tokens(self) -> int:
        """Tokens in the records produced: ``records * seq_len``."""
        return self.records * self.seq_len

    @property
    def padding_fraction(self) -> float:
        """Share of record tokens that are padding (0.0 when there are no records)."""
        return self.padding_tokens / self.record_tokens if self.records else 0.0

    def to_dict(self) -> dict[str, int | float | str]:
        """Every field plus ``record_tokens`` and ``padding_fraction``, JSON-serialisable."""
        out: dict[str, int | float | str] = dict(asdict(self))
        out["record_tokens"] = self.record_tokens
        out["padding_fraction"] = self.padding_fraction
        return out


class RecordBlocks(Iterator[U32Block]):
    """An iterator of ``uint32 [k, seq_len]`` record blocks that keeps its ``stats`` up to date.

    Each block is a fresh C-contiguous array the caller may keep; ``stats`` is final once the
    iterator is exhausted.
    """

    def __init__(self, blocks: Iterator[U32Block], stats: PackingStats) -> None:
        self._blocks = blocks
        self.stats = stats

    @property
    def seq_len(self) -> int:
        """Tokens per record."""
        return self.stats.seq_len

    def __iter__(self) -> RecordBlocks:
        return self

    def __next__(self) -> U32Block:
        return next(self._blocks)


def _as_u32(doc: npt.ArrayLike, index: int) -> npt.NDArray[np.uint32]:
    """A document as 1-D uint32 ids, or an ``IngestError`` naming the document."""
    arr = np.asarray(doc)
    if arr.dtype == np.uint32 and arr.ndim == 1:
        return arr
    if arr.ndim != 1:
        raise IngestError(f"document {index}: expected a 1-D array of ids, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.uint32)
    if arr.dtype.kind not in "ui":
        raise IngestError(f"document {index}: ids must be integers, got dtype {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) > U32_MAX:
        raise IngestError(f"document {index}: ids must be in [0, 2**32 - 1]")
    return arr.astype(np.uint32)


def pack_records(
    docs: Iterable[npt.ArrayLike],
    seq_len: int,
    bos_id: int,
    *,
    chunk_records: int | None = None,
) -> RecordBlocks:
    """BOS-prefixed documents concatenated and cut into full ``seq_len`` records (no padding).

    Blocks hold ``chunk_records`` records (default: about 4 MiB), the last one fewer; the final
    partial record is dropped and counted in ``stats.dropped_tail_tokens``.
    """
    n = check_seq_len(seq_len)
    bos = int_arg("bos_id", bos_id, 0, U32_MAX, IngestError)
    k = check_chunk_records(chunk_records, n)
    stats = PackingStats(mode="pack", seq_len=n)
    return RecordBlocks(_pack(docs, n, bos, k, stats), stats)


def pack_documents(
    docs: Iterable[npt.ArrayLike], seq_len: int, *, bos_id: int = BOS_ID
) -> Iterator[npt.NDArray[np.uint32]]:
    """Pack documents into ``[seq_len]`` uint32 rows, each document prefixed with ``bos_id``.

    The ``pack`` mode of :func:`pack_records` one row at a time: the rows are the concatenation
    ``[bos, *doc0, bos, *doc1, ...]`` cut every ``seq_len`` tokens; documents run across row
    boundaries and the final partial row is dropped. The default ``bos_id`` is
    ``ByteTokenizer``'s. The input is consumed lazily, a row is yielded as soon as it is
    complete, and memory stays bounded by about ``2 * seq_len`` plus the largest document. Rows
    are read-only views that stay valid after the iterator moves on. Bad arguments raise
    ``IngestError`` at the call, a bad document when it is reached.

    >>> rows = pack_documents([np.array([97, 98, 99]), np.array([100, 101])], seq_len=3)
    >>> [r.tolist() for r in rows]
    [[256, 97, 98], [99, 256, 100]]
    """
    return _rows(pack_records(docs, seq_len, bos_id, chunk_records=1))


def _rows(blocks: Iterable[U32Block]) -> Iterator[npt.NDArray[np.uint32]]:
    for block in blocks:
        block.flags.writeable = False
        yield from block


def _pack(
    docs: Iterable[npt.ArrayLike], n: int, bos_id: int, k: int, stats: PackingStats
) -> Iterator[U32Block]:
    bos = np.array([bos_id], dtype=np.uint32)
    want = k * n
    pending: list[npt.NDArray[np.uint32]] = []
    pending_len = 0
    for index, doc in enumerate(docs):
        arr = _as_u32(doc, index)
        stats.documents += 1
        stats.tokens += arr.size
        pending += [bos, arr]
        pending_len += 1 + arr.size
        if pending_len >= want:
            buf = np.concatenate(pending)
            full = pending_len // n * n
            for r0 in range(0, full, want):
                block = buf[r0 : min(r0 + want, full)].reshape(-1, n)
                stats.records += block.shape[0]
                yield block
            tail = buf[full:].copy()  # don't keep the whole buffer alive for a short tail
            pending, pending_len = [tail], tail.size
    full = pending_len // n * n
    if full:  # fewer than k records: one last block
        buf = np.concatenate(pending)
        stats.records += full // n
        yield buf[:full].reshape(-1, n)
    stats.dropped_tail_tokens = pending_len - full


def pad_records(
    docs: Iterable[npt.ArrayLike],
    seq_len: int,
    bos_id: int,
    pad_id: int,
    *,
    chunk_records: int | None = None,
) -> RecordBlocks:
    """One record per document: ``[bos, *doc]`` truncated to ``seq_len`` or padded with ``pad_id``.

    A document longer than ``seq_len - 1`` tokens loses its end (``stats.truncated_documents``,
    ``stats.truncated_tokens``); padding is counted in ``stats.padding_tokens``. Choose a
    ``pad_id`` the loss can mask (often EOS, or an id outside the vocabulary).
    """
    n = check_seq_len(seq_len)
    bos = int_arg("bos_id", bos_id, 0, U32_MAX, IngestError)
    pad = int_arg("pad_id", pad_id, 0, U32_MAX, IngestError)
    k = check_chunk_records(chunk_records, n)
    stats = PackingStats(mode="pad", seq_len=n)
    return RecordBlocks(_pad(docs, n, bos, pad, k, stats), stats)


def _pad(
    docs: Iterable[npt.ArrayLike], n: int, bos: int, pad: int, k: int, stats: PackingStats
) -> Iterator[U32Block]:
    group: list[npt.NDArray[np.uint32]] = []
    for index, doc in enumerate(docs):
        group.append(_as_u32(doc, index))
        if len(group) == k:
            yield _pad_block(group, n, bos, pad, stats)
            group = []
    if group:
        yield _pad_block(group, n, bos, pad, stats)


def _pad_block(
    group: list[npt.NDArray[np.uint32]], n: int, bos: int, pad: int, stats: PackingStats
) -> U32Block:
    """``[len(group), n]`` records: BOS, the kept tokens, then padding; stats updated."""
    room = n - 1
    lengths = np.fromiter((a.size for a in group), dtype=np.int64, count=len(group))
    kept = np.minimum(lengths, room)
    block = np.full((len(group), n), pad, dtype=np.uint32)
    block[:, 0] = bos
    if room:
        # Row-major boolean assignment fills each row's first kept[i] slots in order, which is
        # exactly the concatenation of the truncated documents.
        mask = np.arange(room) < kept[:, None]
        block[:, 1:][mask] = np.concatenate([a[:room] for a in group])
    stats.documents += len(group)
    stats.tokens += int(lengths.sum())
    stats.records += len(group)
    stats.padding_tokens += int((room - kept).sum())
    stats.truncated_documents += int((lengths > room).sum())
    stats.truncated_tokens += int((lengths - kept).sum())
    return block


def make_records(
    docs: Iterable[npt.ArrayLike],
    seq_len: int,
    *,
    bos_id: int,
    mode: Mode = "pack",
    pad_id: int | None = None,
    chunk_records: int | None = None,
) -> RecordBlocks:
    """``pack_records`` or ``pad_records`` by ``mode``; ``pad`` needs ``pad_id``."""
    if mode == "pack":
        if pad_id is not None:
            raise IngestError("pad_id applies only to mode='pad'; 'pack' never pads")
        return pack_records(docs, seq_len, bos_id, chunk_records=chunk_records)
    if mode == "pad":
        if pad_id is None:
            raise IngestError("mode='pad' needs a pad_id")
        return pad_records(docs, seq_len, bos_id, pad_id, chunk_records=chunk_records)
    raise IngestError(f"mode must be 'pack' or 'pad', got {mode!r}")
