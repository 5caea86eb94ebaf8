"""Packing token ids into records: ``pack_documents`` rows, ``pack_records``/``pad_records`` blocks.

NumPy only: these tests need none of the ``text`` extra's libraries.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch_core import BatchFileReader, ByteTokenizer, pack_documents, write_batch_dataset
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest.packing import PackingStats, make_records, pack_records, pad_records

TOK = ByteTokenizer()
BOS_ID = TOK.bos_id


def reference_pack(
    docs: list[npt.NDArray[np.uint32]], seq_len: int, bos: int = BOS_ID
) -> list[list[int]]:
    """The definition: BOS + doc for every doc, concatenated, cut into full rows."""
    stream: list[int] = []
    for doc in docs:
        stream += [bos, *doc.tolist()]
    full = len(stream) // seq_len * seq_len
    return [stream[i : i + seq_len] for i in range(0, full, seq_len)]


# -- pack_documents: rows --------------------------------------------------------------------


def test_pack_small_example() -> None:
    rows = list(pack_documents([TOK.encode("abc"), TOK.encode("de")], seq_len=3))
    assert [r.tolist() for r in rows] == [[256, 97, 98], [99, 256, 100]]  # "e" is dropped


def test_pack_rows_are_uint32_seq_len_and_read_only() -> None:
    docs = [TOK.encode("x" * n) for n in (0, 5, 17, 3)]
    rows = list(pack_documents(docs, seq_len=4))
    assert rows
    for r in rows:
        assert r.dtype == np.uint32
        assert r.shape == (4,)
        assert not r.flags.writeable


def test_pack_bos_placement() -> None:
    docs = [TOK.encode(s) for s in ("first doc", "second", "3")]
    flat = np.concatenate(list(pack_documents(docs, seq_len=6)))  # 19 tokens: 3 rows
    starts = np.flatnonzero(flat == BOS_ID).tolist()
    assert starts == [0, 10, 17]  # 1 + 9, then 1 + 6: each BOS right before its document
    assert TOK.decode(flat[1:10]) == "first doc"


def test_pack_empty_documents_still_get_bos() -> None:
    rows = list(pack_documents([np.array([], dtype=np.uint32)] * 4, seq_len=2))
    assert [r.tolist() for r in rows] == [[256, 256], [256, 256]]


def test_pack_drops_final_partial_row_and_handles_no_rows() -> None:
    assert list(pack_documents([TOK.encode("ab")], seq_len=4)) == []  # 3 tokens < 4
    assert list(pack_documents([], seq_len=4)) == []
    rows = list(pack_documents([TOK.encode("abc")], seq_len=4))  # exactly one row
    assert [r.tolist() for r in rows] == [[256, 97, 98, 99]]


def test_pack_document_longer_than_many_rows() -> None:
    doc = np.arange(1000, dtype=np.uint32) % 256
    rows = list(pack_documents([doc], seq_len=7))
    assert len(rows) == 1001 // 7
    assert np.array_equal(np.concatenate(rows)[1:], doc[: len(rows) * 7 - 1])


def test_pack_rows_survive_iteration() -> None:
    """Earlier rows are not overwritten by later ones (no reused buffer)."""
    docs = [np.full(5, i, dtype=np.uint32) for i in range(20)]
    rows = list(pack_documents(docs, seq_len=4))
    assert [r.tolist() for r in rows] == reference_pack(docs, 4)


def test_pack_is_lazy() -> None:
    consumed = 0

    def docs() -> Iterator[npt.NDArray[np.uint32]]:
        nonlocal consumed
        for _ in range(1000):
            consumed += 1
            yield np.zeros(9, dtype=np.uint32)

    it = pack_documents(docs(), seq_len=10)
    next(it)
    assert consumed == 1


def test_pack_custom_bos_and_int_dtypes() -> None:
    docs: list[npt.ArrayLike] = [np.array([1, 2, 3], dtype=np.int64), np.array([4], dtype=np.uint8)]
    rows = list(pack_documents(docs, seq_len=3, bos_id=9))
    assert [r.tolist() for r in rows] == [[9, 1, 2], [3, 9, 4]]
    assert all(r.dtype == np.uint32 for r in rows)


def test_pack_rejects_bad_input() -> None:
    # Arguments fail at the call, documents when they are reached; IngestError is a ValueError.
    with pytest.raises(IngestError, match="seq_len must be"):
        pack_documents([TOK.encode("a")], seq_len=0)
    with pytest.raises(IngestError, match="seq_len must be an integer, got float"):
        pack_documents([TOK.encode("a")], seq_len=2.0)  # type: ignore[arg-type]
    with pytest.raises(IngestError, match="bos_id must be"):
        pack_documents([], seq_len=2, bos_id=-1)
    with pytest.raises(ValueError, match="document 0: expected a 1-D array"):
        list(pack_documents([np.zeros((2, 2), dtype=np.uint32)], seq_len=2))
    with pytest.raises(ValueError, match=r"document 1: ids must be in \[0, 2\*\*32 - 1\]"):
        list(pack_documents([np.array([1]), np.array([-1, 2], dtype=np.int64)], seq_len=2))
    with pytest.raises(ValueError, match="document 0: ids must be integers"):
        list(pack_documents([np.array([1.5])], seq_len=2))


def test_pack_feeds_the_streaming_writer(tmp_path: Path) -> None:
    path = tmp_path / "packed.batch"
    texts = [f"document number {i}: " + "lorem ipsum " * i for i in range(40)]
    total = sum(len(t.encode()) + 1 for t in texts) // 16
    n = write_batch_dataset(
        path, pack_documents((TOK.encode(t) for t in texts), 16), total, 4, 16, seed=3
    )
    with BatchFileReader(path) as reader:
        assert reader.num_batches == n == total // 4
        assert int(reader.read_batch(0).max()) <= BOS_ID


@settings(max_examples=300, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 255), max_size=40), max_size=12),
    seq_len=st.integers(1, 33),
)
def test_pack_equals_reference_property(docs: list[list[int]], seq_len: int) -> None:
    arrays = [np.array(d, dtype=np.uint32) for d in docs]
    rows = list(pack_documents(iter(arrays), seq_len))
    assert [r.tolist() for r in rows] == reference_pack(arrays, seq_len)


# -- pack_records and pad_records: blocks and statistics --------------------------------------


def _docs(rng: np.random.Generator, n: int, vocab: int = 1000) -> list[npt.NDArray[np.uint32]]:
    lengths = rng.choice([0, 1, 5, 30, 200], size=n)
    return [rng.integers(0, vocab, size=int(k), dtype=np.uint32) for k in lengths]


@pytest.mark.parametrize(("seq_len", "chunk"), [(16, 3), (7, 1), (64, None), (1, 5)])
def test_pack_records_blocks_match_the_definition(seq_len: int, chunk: int | None) -> None:
    docs = _docs(np.random.default_rng(seq_len), 120)
    packed = pack_records(docs, seq_len, 1000, chunk_records=chunk)
    blocks = list(packed)
    assert all(b.dtype == np.uint32 and b.flags.c_contiguous for b in blocks)
    if chunk is not None:
        assert all(b.shape[0] <= chunk for b in blocks)
    got = np.concatenate(blocks)
    want = np.array(reference_pack(docs, seq_len, bos=1000), dtype=np.uint32)
    assert np.array_equal(got, want)
    stats = packed.stats
    assert stats.records == got.shape[0] and stats.documents == len(docs)
    assert stats.tokens == sum(d.size for d in docs)
    assert stats.records * seq_len + stats.dropped_tail_tokens == stats.documents + stats.tokens
    assert stats.padding_fraction == 0.0 and stats.truncated_documents == 0


def test_pack_too_little_data_gives_no_records() -> None:
    packed = pack_records([np.arange(3, dtype=np.uint32)], 8, 99)
    assert list(packed) == [] and packed.stats.dropped_tail_tokens == 4


def test_pad_mode_records_and_statistics() -> None:
    docs = [np.arange(1, 1 + k, dtype=np.int64) for k in (0, 3, 7, 9, 20)]
    padded = pad_records(docs, 8, bos_id=50, pad_id=0, chunk_records=2)
    blocks = list(padded)
    assert [b.shape for b in blocks] == [(2, 8), (2, 8), (1, 8)]
    got = np.concatenate(blocks)
    assert got.tolist() == [
        [50, 0, 0, 0, 0, 0, 0, 0],
        [50, 1, 2, 3, 0, 0, 0, 0],
        [50, 1, 2, 3, 4, 5, 6, 7],
        [50, 1, 2, 3, 4, 5, 6, 7],
        [50, 1, 2, 3, 4, 5, 6, 7],
    ]
    stats = padded.stats
    assert (stats.documents, stats.tokens, stats.records) == (5, 39, 5)
    assert (stats.padding_tokens, stats.truncated_documents, stats.truncated_tokens) == (11, 2, 15)
    assert stats.padding_fraction == pytest.approx(11 / 40)
    assert stats.dropped_tail_tokens == 0
    kept = stats.tokens - stats.truncated_tokens
    assert stats.records * 8 == stats.documents + kept + stats.padding_tokens
    assert json.loads(json.dumps(stats.to_dict()))["padding_fraction"] == pytest.approx(0.275)


def test_make_records_argument_errors() -> None:
    with pytest.raises(IngestError, match="needs a pad_id"):
        make_records([], 8, bos_id=1, mode="pad")
    with pytest.raises(IngestError, match="only to mode='pad'"):
        make_records([], 8, bos_id=1, pad_id=0)
    with pytest.raises(IngestError, match="mode must be"):
        make_records([], 8, bos_id=1, mode="chunk")  # type: ignore[arg-type]
    with pytest.raises(IngestError, match="document 1: ids must be integers"):
        list(pack_records([np.zeros(3, np.uint32), np.zeros(3)], 2, 1))
    with pytest.raises(IngestError, match=r"document 0: ids must be in"):
        list(pad_records([np.array([-1])], 2, 1, 0))
    with pytest.raises(IngestError, match="seq_len"):
        pack_records([], 0, 1)
    assert PackingStats(mode="pack", seq_len=4).padding_fraction == 0.0
