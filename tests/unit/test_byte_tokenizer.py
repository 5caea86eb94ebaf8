"""ByteTokenizer: UTF-8 round trips, BOS, errors, and its place among the tokenizers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerobatch_core import ByteTokenizer
from zerobatch_core.errors import IngestError
from zerobatch_core.tokenization import Tokenizer, load_tokenizer, tokenizer_from_json
from zerobatch_core.tokenization.byte import BOS_ID

TOK = ByteTokenizer()


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


def test_is_the_byte_spec_tokenizer() -> None:
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and isinstance(tok, Tokenizer)
    assert (tok.bos_id, tok.eos_id, tok.vocab_size, tok.name) == (256, None, 257, "byte")
    assert ByteTokenizer.vocab_size == 257  # readable without an instance


def test_encode_batch() -> None:
    texts = ["héllo 🎉", "", "plain"]
    ids = TOK.encode_batch(texts)
    assert all(a.dtype == np.uint32 and a.ndim == 1 for a in ids)
    assert [a.tolist() for a in ids] == [TOK.encode(t).tolist() for t in texts]
    assert [TOK.decode(a) for a in ids] == texts
    with pytest.raises(IngestError, match="document 1 of the batch: not encodable"):
        TOK.encode_batch(["ok", "\ud800"])
    with pytest.raises(UnicodeEncodeError):
        TOK.encode("\ud800")


def test_json_description_round_trip() -> None:
    text = TOK.to_json()
    assert json.loads(text) == {"kind": "byte"}
    again = tokenizer_from_json(text)
    assert isinstance(again, ByteTokenizer)
    assert again.encode_batch(["abc"])[0].tolist() == [97, 98, 99]
