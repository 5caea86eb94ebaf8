"""ByteTokenizer and pack_documents: round trips, BOS placement and packing as concatenation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch_core import BatchFileReader, ByteTokenizer, pack_documents, write_batch_dataset
from zerobatch_core.tokenizer import BOS_ID

TOK = ByteTokenizer()


def reference_pack(
    docs: list[npt.NDArray[np.uint32]], seq_len: int, bos: int = BOS_ID
) -> list[list[int]]:
    """The definition: BOS + doc for every doc, concatenated, cut into full rows."""
    stream: list[int] = []
    for doc in docs:
        stream += [bos, *doc.tolist()]
    full = len(stream) // seq_len * seq_len
    return [stream[i : i + seq_len] for i in range(0, full, seq_len)]


# -- ByteTokenizer --------------------------------------------------------------------------


def test_vocab_and_bos() -> None:
    assert TOK.vocab_size == 257
    assert TOK.bos_id == 256 == BOS_ID


@pytest.mark.parametrize(
    "text",
    ["", "hello, world", "naïve café", "日本語のテキスト", "emoji 🙂🚀", "tab\tnew\nline\x00nul"],
)
def test_round_trip(text: str) -> None:
    ids = TOK.encode(text)
    assert ids.dtype == np.uint32
    assert ids.ndim == 1
    assert ids.tolist() == list(text.encode("utf-8"))
    assert TOK.decode(ids) == text


def test_encode_is_utf8_bytes() -> None:
    assert TOK.encode("é").tolist() == [0xC3, 0xA9]
    assert int(TOK.encode("a\U0001f642").max()) < 256


def test_add_bos() -> None:
    ids = TOK.encode("ab", add_bos=True)
    assert ids.dtype == np.uint32
    assert ids.tolist() == [256, 97, 98]
    assert TOK.decode(ids) == "ab"


def test_decode_skips_bos_anywhere() -> None:
    ids = np.array([256, 104, 105, 256, 256, 33, 256], dtype=np.uint32)
    assert TOK.decode(ids) == "hi!"


def test_decode_accepts_lists_and_other_int_dtypes() -> None:
    assert TOK.decode([72, 105]) == "Hi"
    assert TOK.decode(np.array([72, 105], dtype=np.int64)) == "Hi"
    assert TOK.decode(np.array([], dtype=np.int64)) == ""


def test_decode_replaces_invalid_utf8() -> None:
    # A multi-byte character cut in half, as at a record boundary.
    assert TOK.decode(TOK.encode("é")[:1]) == "\ufffd"
    assert TOK.decode([0xFF, 97]) == "\ufffda"


@pytest.mark.parametrize("bad", [[257], [-1], [1 << 20]])
def test_decode_rejects_ids_outside_vocab(bad: list[int]) -> None:
    with pytest.raises(ValueError, match="must be in"):
        TOK.decode(bad)


def test_decode_rejects_2d_and_floats() -> None:
    with pytest.raises(ValueError, match="1-D"):
        TOK.decode(np.zeros((2, 2), dtype=np.uint32))
    with pytest.raises(ValueError, match="integers"):
        TOK.decode(np.array([1.0, 2.0]))


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_property(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates have no UTF-8 form
        return
    assert TOK.decode(TOK.encode(text)) == text
    assert TOK.decode(TOK.encode(text, add_bos=True)) == text


# -- pack_documents -------------------------------------------------------------------------


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
    docs = [np.array([1, 2, 3], dtype=np.int64), np.array([4], dtype=np.uint8)]
    rows = list(pack_documents(docs, seq_len=3, bos_id=9))
    assert [r.tolist() for r in rows] == [[9, 1, 2], [3, 9, 4]]
    assert all(r.dtype == np.uint32 for r in rows)


def test_pack_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        list(pack_documents([TOK.encode("a")], seq_len=0))
    with pytest.raises(TypeError, match="integer"):
        list(pack_documents([TOK.encode("a")], seq_len=2.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1-D"):
        list(pack_documents([np.zeros((2, 2), dtype=np.uint32)], seq_len=2))
    with pytest.raises(ValueError, match="uint32"):
        list(pack_documents([np.array([-1, 2], dtype=np.int64)], seq_len=2))
    with pytest.raises(ValueError, match="integers"):
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
