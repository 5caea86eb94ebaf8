"""A small parquet corpus for producer tests, and the documents a live dataset's committed
batches hold, decoded back (byte tokenizer: BOS 256; padding ``PAD``)."""

from __future__ import annotations

import collections
import random
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tests.helpers import require
from zerobatch_core.live.source import LiveSource

BOS = 256
PAD = 257
"""A pad id outside the byte tokenizer's ids, so padding never reads as text."""


def write_corpus(
    root: Path, files: int = 3, docs: int = 300, row_group: int = 23, seed: int = 0
) -> list[str]:
    """``files`` parquet files of row groups of ``row_group`` rows; the documents, in order."""
    pa, pq = require("pyarrow"), require("pyarrow.parquet")
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "épsilon", "ζ", "η"]
    texts = [
        f"doc {i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(0, 50)))
        for i in range(docs)
    ]
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        table = pa.table({"text": texts[f::files]})
        pq.write_table(table, root / f"part-{f:02d}.parquet", row_group_size=row_group)
    return texts


def producer_streams(url: str) -> dict[str, list[npt.NDArray[np.uint32]]]:
    """Each producer's committed batches, in its stream order (offsets checked contiguous)."""
    with LiveSource(url) as source:
        found: dict[str, list[tuple[int, npt.NDArray[np.uint32]]]] = collections.defaultdict(list)
        for e in source.chain.entries(source.current):
            for g in range(e.first, e.end):
                found[e.producer].append((e.offset + g - e.first, np.array(source.read_batch(g))))
    out = {}
    for producer, items in found.items():
        items.sort(key=lambda x: x[0])
        assert [o for o, _ in items] == list(range(len(items))), producer
        out[producer] = [a for _, a in items]
    return out


def decode(stream: list[npt.NDArray[np.uint32]]) -> list[str]:
    """The documents of one producer's batches (byte tokenizer), in order."""
    if not stream:
        return []
    flat = np.concatenate([b.reshape(-1) for b in stream])
    flat = flat[flat != PAD]
    cuts = np.flatnonzero(flat == BOS)
    assert cuts.size == 0 or cuts[0] == 0, "a stream starts with a document"
    ends = [*cuts[1:].tolist(), flat.size]
    return [
        bytes(flat[a + 1 : b].astype(np.uint8)).decode() for a, b in zip(cuts, ends, strict=True)
    ]


def committed_documents(url: str) -> collections.Counter[str]:
    """The multiset of documents in every producer's committed batches."""
    found: collections.Counter[str] = collections.Counter()
    for stream in producer_streams(url).values():
        found.update(decode(stream))
    return found
