"""Cutting records out of a stream of tokens: document-aligned starts and windowed reads.

Shared by nanoGPT shards (``nanogpt.py``, BOS positions for document starts) and other systems'
token files (``token_files.py``, their documents' starts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from .source import U32Block

I64Array = npt.NDArray[np.int64]


def locate_record(files: Iterable[tuple[str, I64Array]], record: int, token: int, what: str) -> str:
    """Where token ``token`` of record ``record`` of a stream lies: the file and the token's
    position there. ``files`` are each file's path and record starts, in stream order; ``what``
    names a file in the message (``"shard"``, ``"file"``). For error messages."""
    first = 0
    for path, starts in files:
        if record < first + starts.size:
            k = record - first
            at = int(starts[k]) + token
            return f"{path}: token {at:,} of the {what} (record {k:,}, token {token})"
        first += int(starts.size)
    return f"record {record:,} (past the {what}s' {first:,} records), token {token}"


def bos_record_starts(bos: I64Array, seq_len: int, num_tokens: int) -> I64Array:
    """Record starts aligned to ``bos`` (ascending document starts): a record starts at the
    first start at or after the end of the one before, and takes ``seq_len`` tokens; computed
    by pointer doubling instead of a per-record loop.

    ``nxt[j]`` is the first BOS at or after ``bos[j] + seq_len``, so the starts are the chain
    ``0, nxt(0), nxt(nxt(0)), ...``. With ``jump`` = ``nxt`` composed ``2**r`` times, the chain
    known so far (its first ``2**r`` links) extended by ``jump`` of itself gives the first
    ``2**(r+1)``: O(n log(records)) vectorised work for ``n`` BOS tokens. ``n`` is the
    sentinel "no further BOS", mapped to itself.
    """
    n = int(bos.size)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    jump = np.empty(n + 1, dtype=np.int64)
    jump[:n] = np.searchsorted(bos, bos + seq_len, side="left")
    jump[n] = n
    chain = np.zeros(1, dtype=np.int64)
    while True:
        ahead = jump[chain]
        ahead = ahead[ahead < n]
        if ahead.size == 0:
            break
        chain = np.concatenate([chain, ahead])
        jump = jump[jump]
    starts = bos[chain]
    return starts[starts + seq_len <= num_tokens]  # only the last can run past the end


def gather_records(
    starts: I64Array,
    seq_len: int,
    chunk_records: int,
    window: int,
    read: Callable[[int, int], npt.NDArray[np.integer[Any]]],
) -> Iterator[U32Block]:
    """Records of ``seq_len`` tokens at ``starts`` (ascending, non-overlapping), in ``uint32``
    blocks of ``chunk_records`` records. ``read(lo, hi)`` returns tokens ``[lo, hi)``.

    Each read covers the records that end within one window of ``window`` tokens (at least
    one record) from the first of them, up to the end of the last: a run of nearby records is
    one read, and the gaps between far-apart records are never read.
    """
    t = seq_len
    for i in range(0, starts.size, chunk_records):
        part = starts[i : i + chunk_records]
        block = np.empty((part.size, t), dtype=np.uint32)
        j = 0
        while j < part.size:
            lo = int(part[j])
            # records [j, e) end within tokens [lo, lo + window)
            e = max(j + 1, int(np.searchsorted(part, lo + window - t, side="right")))
            chunk = read(lo, int(part[e - 1]) + t)
            block[j:e] = sliding_window_view(chunk, t)[part[j:e] - lo]
            j = e
        yield block
