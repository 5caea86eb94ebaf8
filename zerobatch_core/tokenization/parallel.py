"""Deterministic tokenization of a document stream, in this process or in ``spawn`` workers.

:func:`tokenize_documents` tokenizes documents in batches and yields the id arrays in document
order, so its output does not depend on the worker count. A worker process receives its
tokenizer as text: the spec string when the caller gave one (the worker reads the same files),
or the tokenizer's JSON description (``Tokenizer.to_json()``) for a tokenizer object, so that
the worker rebuilds exactly the caller's tokenizer from plain data.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from multiprocessing.pool import AsyncResult
from typing import Any

import numpy as np
import numpy.typing as npt

from ..arguments import int_arg
from ..errors import IngestError
from .descriptions import read_description
from .protocol import Tokenizer, U32Array
from .resolve import load_tokenizer, tokenizer_from_json
from .tiktoken_files import TiktokenTokenizer

DEFAULT_BATCH_DOCS = 256
"""Documents per tokenization task: enough to amortise inter-process transfer."""

_worker: dict[str, Any] = {}
"""Per worker process: the tokenizer's spec or description, and the tokenizer once built."""


def _worker_init(payload: str) -> None:
    """Store the tokenizer's spec or description; the first task builds the tokenizer, so that
    a failure reaches the parent as that task's exception (a failing Pool initializer respawns
    workers forever)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process: workers scale
    _worker.clear()
    _worker["payload"] = payload


def _rebuild(payload: str) -> Tokenizer:
    """The tokenizer a worker payload names: a JSON description starts with ``{``, which no
    spec string does (a spec starts with its kind)."""
    tok = tokenizer_from_json(payload) if payload.startswith("{") else load_tokenizer(payload)
    if isinstance(tok, TiktokenTokenizer):
        tok.num_threads = 1  # the processes are the parallelism
    return tok


def _worker_encode(texts: list[str]) -> tuple[U32Array, npt.NDArray[np.int64]]:
    """Tokenize one batch in a worker: all ids in one array plus per-document lengths."""
    tok = _worker.get("tokenizer")
    if tok is None:
        tok = _worker["tokenizer"] = _rebuild(_worker["payload"])
    arrays = tok.encode_batch(texts)
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    flat = np.concatenate(arrays) if arrays else np.empty(0, dtype=np.uint32)
    return flat.astype(np.uint32, copy=False), lengths


def _split(result: tuple[U32Array, npt.NDArray[np.int64]]) -> list[U32Array]:
    flat, lengths = result
    return np.split(flat, np.cumsum(lengths)[:-1])


def _batches(docs: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for index, doc in enumerate(docs):
        if not isinstance(doc, str):
            raise IngestError(f"document {index}: expected a str, got {type(doc).__name__}")
        batch.append(doc)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _resolve(tokenizer: str | Tokenizer) -> Tokenizer:
    """A spec string loaded (here, so a bad spec fails at once), or a tokenizer as it is."""
    if isinstance(tokenizer, str):
        return load_tokenizer(tokenizer)
    if not isinstance(tokenizer, Tokenizer):
        raise IngestError(
            f"tokenizer must be a spec string or a Tokenizer, got {type(tokenizer).__name__}"
        )
    return tokenizer


def _payload(given: str | Tokenizer, tok: Tokenizer) -> str:
    """What workers rebuild ``tok`` from: the spec string given, else ``tok``'s description.

    A description whose kind no worker can rebuild raises ``IngestError`` here, before any
    process starts.
    """
    if isinstance(given, str):
        return given
    description = tok.to_json()
    try:
        read_description(description)
    except IngestError as e:
        raise IngestError(
            f"tokenizer {tok.name!r} cannot be rebuilt in worker processes ({e}); pass a "
            f"spec string or use workers=1"
        ) from e
    return description


def tokenize_documents(
    docs: Iterable[str],
    tokenizer: str | Tokenizer,
    workers: int = 1,
    batch_docs: int = DEFAULT_BATCH_DOCS,
) -> Generator[U32Array, None, None]:
    """Token ids of each document (a 1-D ``uint32`` array each), in document order.

    Documents are tokenized ``batch_docs`` at a time; with ``workers > 1`` the batches go to
    that many ``spawn``-ed processes, each building the tokenizer once from its spec string or
    JSON description (a spec string is loaded here
    first, so a bad spec fails at once). Results come back in submission order, so the
    output is identical whatever ``workers``. At most ``2 * workers`` batches are in flight:
    memory is bounded by about that many batches, whatever the corpus size (``Pool.imap`` is
    not used because its feeder thread drains the whole input as fast as it can). With
    ``workers == 1`` everything runs in this process. ``close()`` the generator to stop the
    workers before the end (they also stop when it is garbage-collected). Scripts using
    ``workers > 1`` need the usual ``if __name__ == "__main__":`` guard, as with any ``spawn``
    pool.
    """
    w = int_arg("workers", workers, 1, None, IngestError)
    size = int_arg("batch_docs", batch_docs, 1, None, IngestError)
    tok = _resolve(tokenizer)
    if w == 1:
        return _tokenize_here(docs, tok, size)
    return _tokenize_pool(docs, _payload(tokenizer, tok), w, size)


def _tokenize_here(
    docs: Iterable[str], tok: Tokenizer, size: int
) -> Generator[U32Array, None, None]:
    for batch in _batches(docs, size):
        yield from tok.encode_batch(batch)


def _tokenize_pool(
    docs: Iterable[str], payload: str, workers: int, size: int
) -> Generator[U32Array, None, None]:
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(workers, initializer=_worker_init, initargs=(payload,))
    try:
        pending: deque[AsyncResult[tuple[U32Array, npt.NDArray[np.int64]]]] = deque()
        for batch in _batches(docs, size):
            pending.append(pool.apply_async(_worker_encode, (batch,)))
            if len(pending) >= 2 * workers:
                yield from _split(pending.popleft().get())
        while pending:
            yield from _split(pending.popleft().get())
    finally:
        pool.terminate()
        pool.join()
