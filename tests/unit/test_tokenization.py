"""Tokenizers by spec string and by JSON description, and tokenization across worker processes.

Byte-level and spec-parsing tests need nothing optional; the Hugging Face and tiktoken tests
import their library through ``tests.helpers.require`` (skipped locally, a failure in CI).
"""

from __future__ import annotations

import base64
import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from tests.helpers import require
from tests.unit.bpe import train_bpe
from zerobatch_core import ByteTokenizer
from zerobatch_core.errors import IngestError
from zerobatch_core.tokenization import (
    TIKTOKEN_STANDARD,
    HFTokenizer,
    TiktokenTokenizer,
    load_tokenizer,
    make_spec,
    parse_spec,
    tokenize_documents,
    tokenizer_from_json,
)
from zerobatch_core.tokenization.tiktoken_files import (
    format_tiktoken_ranks,
    parse_tiktoken_ranks,
    tiktoken_cache_path,
)

BOS = "<|bos|>"


def _texts() -> list[str]:
    """Words, Unicode, whitespace runs, an empty text and literal special-token strings."""
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "mat", "naïve", "café", "日本語", "🎉", "42", "x1"]
    seps = [" ", "  ", "\n", "\t"]
    texts = [
        rng.choice(seps).join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        for _ in range(120)
    ]
    texts[3] = ""
    texts[5] = f"a literal {BOS} and <|endoftext|> inside the text"
    return texts


TEXTS = _texts()


def _same(a: list[npt.NDArray[np.uint32]], b: list[npt.NDArray[np.uint32]]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def bpe_spec(tmp_path_factory: pytest.TempPathFactory) -> str:
    hf = require("tokenizers")
    return train_bpe(hf, TEXTS, tmp_path_factory.mktemp("bpe") / "tokenizer.json", BOS)


def _tiny_ranks() -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    for merge in (b"th", b"the", b" t", b" the", b"at", b"cat"):
        ranks[merge] = len(ranks)
    return ranks


@pytest.fixture
def tiny_tiktoken(tmp_path: Path) -> Path:
    ranks = _tiny_ranks()
    path = tmp_path / "tiny.tiktoken"
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    return path


# --- spec strings --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sentencepiece:/x.model", "unknown kind"),
        ("byte:x", "takes no argument"),
        ("hf:", "needs a path"),
        ("hf:/x.json?bos=<s>&bos=<s>", "repeated option"),
        ("hf:/x.json?pattern=x", "unknown or malformed option"),
        ("tiktoken:cl100k_base?pattern=r50k_base", "only to a local file"),
    ],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(IngestError, match=message):
        load_tokenizer(spec)


def test_spec_options_are_percent_decoded() -> None:
    assert parse_spec("hf:/t.json?bos=%3Cs%3E&eos=a%26b") == (
        "hf",
        "/t.json",
        {"bos": "<s>", "eos": "a&b"},
    )
    spec = make_spec("hf", "/t.json", bos="<|a=b&c|>", eos=None)
    assert spec == "hf:/t.json?bos=<|a%3Db%26c|>"
    assert parse_spec(spec) == ("hf", "/t.json", {"bos": "<|a=b&c|>"})


# --- JSON descriptions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"name": "x"}', "field 'kind' is None"),
        ('{"kind": "sentencepiece"}', "field 'kind' is 'sentencepiece', expected one of"),
        ('{"kind": "hf", "bos": "<s>", "eos": null, "name": "m"}', "hf .*'model' is missing"),
        ('{"kind": "hf", "model": 3, "bos": "<s>", "eos": null, "name": "m"}', "'model' is int"),
        ('{"kind": "hf", "model": "{}", "bos": null, "eos": null, "name": "m"}', "'bos' is null"),
    ],
)
def test_bad_descriptions_name_the_field(text: str, message: str) -> None:
    with pytest.raises(IngestError, match=message):
        tokenizer_from_json(text)


def test_bad_tiktoken_descriptions(tiny_tiktoken: Path) -> None:
    require("tiktoken")
    desc = json.loads(load_tokenizer(f"tiktoken:{tiny_tiktoken}?pattern=r50k_base").to_json())
    assert set(desc) == {"kind", "name", "bos", "eos", "pat_str", "special_tokens", "ranks"}
    for key, value, message in [
        ("special_tokens", {"<|endoftext|>": True}, "maps to bool, expected int"),
        ("special_tokens", [], "'special_tokens' is list, expected dict"),
        ("ranks", "dGhl 0\nnot-base64! 2\n", "field 'ranks': line 2"),
        ("ranks", "", "field 'ranks': no tiktoken ranks"),
        ("bos", "<s>", "BOS token '<s>' is not a special token"),
    ]:
        with pytest.raises(IngestError, match=message):
            tokenizer_from_json(json.dumps({**desc, key: value}))


def test_tiktoken_rank_text_round_trip() -> None:
    ranks = {**_tiny_ranks(), b"\xff\x00 \n": 400}
    text = format_tiktoken_ranks(ranks)
    assert text.isascii() and text.endswith("\n")
    assert parse_tiktoken_ranks(text.encode(), "x") == ranks


# --- Hugging Face --------------------------------------------------------------------------


def test_hf_tokenizer_specials_and_description(bpe_spec: str) -> None:
    tok = load_tokenizer(bpe_spec)
    assert isinstance(tok, HFTokenizer) and tok.name == bpe_spec and tok.eos_id is None
    text = f"x {BOS} y"
    (ids,) = tok.encode_batch([text])
    assert tok.bos_id not in ids.tolist() and tok.decode(ids) == text
    again = tokenizer_from_json(tok.to_json())
    assert isinstance(again, HFTokenizer) and again.name == bpe_spec
    assert (again.bos_id, again.eos_id, again.vocab_size) == (tok.bos_id, None, tok.vocab_size)
    assert _same(again.encode_batch(TEXTS), tok.encode_batch(TEXTS))
    path = parse_spec(bpe_spec)[1]
    assert HFTokenizer.from_file(path, bos=BOS).name == bpe_spec  # the name is the spec
    with_eos = load_tokenizer(f"hf:{path}?bos={BOS}&eos={BOS}")
    assert with_eos.eos_id == tok.bos_id
    assert tokenizer_from_json(with_eos.to_json()).eos_id == tok.bos_id
    with pytest.raises(IngestError, match="needs its BOS token"):
        load_tokenizer(f"hf:{path}")
    with pytest.raises(IngestError, match="'<s>' is not in the vocabulary"):
        load_tokenizer(f"hf:{path}?bos=<s>")
    with pytest.raises(IngestError, match="does not exist"):
        load_tokenizer("hf:/nonexistent/tokenizer.json?bos=<s>")
    with pytest.raises(IngestError, match="not a tokenizers model"):
        HFTokenizer('{"model": 1}', bos=BOS, name="broken")


# --- tiktoken ------------------------------------------------------------------------------


def test_tiktoken_from_local_file_never_downloads(tiny_tiktoken: Path) -> None:
    tiktoken = require("tiktoken")
    ranks = _tiny_ranks()
    tok = load_tokenizer(f"tiktoken:{tiny_tiktoken}?pattern=cl100k_base")
    reference = tiktoken.Encoding(
        "ref",
        pat_str=TIKTOKEN_STANDARD["cl100k_base"].pat_str,
        mergeable_ranks=ranks,
        special_tokens=dict(TIKTOKEN_STANDARD["cl100k_base"].special_tokens),
    )
    texts = ["the cat sat on the mat", "naïve 🎉", "<|endoftext|> is text here"]
    ids = tok.encode_batch(texts)
    assert [a.tolist() for a in ids] == reference.encode_ordinary_batch(texts)
    assert ids[0].size < len(texts[0])  # merges were applied
    assert [tok.decode(a) for a in ids] == texts
    assert tok.bos_id == 100257 and tok.vocab_size == reference.n_vocab
    assert tok.bos_id not in ids[2].tolist()
    assert tok.decode(np.concatenate([[tok.bos_id], ids[0]])) == texts[0]
    again = tokenizer_from_json(tok.to_json())
    assert isinstance(again, TiktokenTokenizer) and again.name == tok.name
    assert (again.bos_id, again.vocab_size) == (tok.bos_id, tok.vocab_size)
    assert _same(again.encode_batch(TEXTS), tok.encode_batch(TEXTS))

    custom = TiktokenTokenizer(
        ranks, pat_str=r"\s*\S+", special_tokens={"<|bos|>": 300}, bos="<|bos|>"
    )
    assert custom.bos_id == 300 and custom.vocab_size == 301
    assert custom.decode(custom.encode_batch(["the cat"])[0]) == "the cat"

    with pytest.raises(IngestError, match=r"add \?pattern=NAME"):
        load_tokenizer(f"tiktoken:{tiny_tiktoken}")
    with pytest.raises(IngestError, match="not a special token"):
        load_tokenizer(f"tiktoken:{tiny_tiktoken}?pattern=r50k_base&bos=<s>")
    bad = tiny_tiktoken.with_name("bad.tiktoken")
    bad.write_bytes(b"dGhl 1\nnot-base64! 2\n")
    with pytest.raises(IngestError, match=r"bad\.tiktoken: line 2"):
        load_tokenizer(f"tiktoken:{bad}?pattern=r50k_base")


def test_tiktoken_named_encoding_only_from_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("tiktoken")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(IngestError, match=r"not in the local cache.*never downloads"):
        load_tokenizer("tiktoken:cl100k_base")
    Path(tiktoken_cache_path("cl100k_base")).write_bytes(b"dGhl 0\n")
    with pytest.raises(IngestError, match="cache is corrupt"):
        load_tokenizer("tiktoken:cl100k_base")
    with pytest.raises(IngestError, match="unknown tiktoken encoding"):
        TiktokenTokenizer.from_cache("gpt5")


# --- parallel tokenization -----------------------------------------------------------------


def test_parallel_tokenization_order_and_errors() -> None:
    docs = [f"document {i}: " + "é" * (i % 13) for i in range(300)]
    serial = list(tokenize_documents(docs, "byte", workers=1, batch_docs=7))
    parallel = list(tokenize_documents(iter(docs), "byte", workers=2, batch_docs=7))
    assert _same(serial, parallel) and len(parallel) == len(docs)
    # A worker's failure reaches the caller; a non-string fails before any work.
    with pytest.raises(IngestError, match="not encodable"):
        list(tokenize_documents([*docs[:20], "\udc80"], "byte", workers=2, batch_docs=7))
    with pytest.raises(IngestError, match="document 1: expected a str"):
        list(tokenize_documents(["a", b"b"], "byte"))  # type: ignore[list-item]
    with pytest.raises(IngestError, match="workers must be"):
        tokenize_documents(docs, "byte", workers=0)
    with pytest.raises(IngestError, match="unknown kind"):
        tokenize_documents(docs, "bpe:x", workers=2)  # a bad spec fails here, not in a worker
    with pytest.raises(IngestError, match="a spec string or a Tokenizer, got int"):
        tokenize_documents(docs, 3, workers=2)  # type: ignore[arg-type]


def test_workers_rebuild_a_tokenizer_object_from_its_description() -> None:
    """A class local to this test cannot be imported by name in a worker: it works with
    workers because only its JSON description crosses to them."""

    class Local(ByteTokenizer):
        pass

    docs = [f"doc {i}" for i in range(50)]
    parallel = list(tokenize_documents(docs, Local(), workers=2, batch_docs=4))
    assert _same(parallel, ByteTokenizer().encode_batch(docs))


def test_workers_refuse_a_tokenizer_they_cannot_rebuild() -> None:
    class Custom(ByteTokenizer):
        name = "custom"

        def to_json(self) -> str:
            return json.dumps({"kind": "custom"})

    with pytest.raises(IngestError, match="'custom' cannot be rebuilt in worker processes"):
        tokenize_documents(["a"], Custom(), workers=2)
    (ids,) = tokenize_documents(["a"], Custom(), workers=1)
    assert ids.tolist() == [97]


@pytest.mark.parametrize("kind", ["hf", "tiktoken"])
def test_parallel_tokenization_by_spec_and_by_description(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Workers given the spec string and workers given the object's JSON agree with serial."""
    if kind == "hf":
        spec: str = request.getfixturevalue("bpe_spec")
    else:
        require("tiktoken")
        spec = f"tiktoken:{request.getfixturevalue('tiny_tiktoken')}?pattern=o200k_base"
    tok = load_tokenizer(spec)
    serial = list(tokenize_documents(TEXTS, tok, workers=1, batch_docs=16))
    assert any(a.size < len(t.encode()) for a, t in zip(serial, TEXTS, strict=True))
    by_spec = list(tokenize_documents(TEXTS, spec, workers=2, batch_docs=16))
    by_description = list(tokenize_documents(TEXTS, tok, workers=2, batch_docs=16))
    assert _same(serial, by_spec) and _same(serial, by_description)


@pytest.mark.parametrize("workers", [1, 2])
def test_tokenization_reads_its_input_lazily(workers: int) -> None:
    """At most ``2 * workers`` batches in flight: an endless stream is fine."""
    consumed = 0

    def endless() -> Iterator[str]:
        nonlocal consumed
        for i in itertools.count():
            consumed += 1
            yield f"doc {i}"

    out = tokenize_documents(endless(), "byte", workers=workers, batch_docs=5)
    first = list(itertools.islice(out, 12))
    out.close()  # stops the workers
    assert [ByteTokenizer().decode(a) for a in first] == [f"doc {i}" for i in range(12)]
    assert consumed <= (2 * workers + 3) * 5


def test_tiktoken_batches_on_threads_equal_encode_ordinary(tiny_tiktoken: Path) -> None:
    """``encode_batch`` on its thread pool gives ``encode_ordinary``'s ids in order, for any
    thread count; a pickled copy starts its own pool."""
    import pickle

    tiktoken = require("tiktoken")
    tok = load_tokenizer(f"tiktoken:{tiny_tiktoken}?pattern=cl100k_base")
    assert isinstance(tok, TiktokenTokenizer)
    reference = tiktoken.Encoding(
        "ref",
        pat_str=TIKTOKEN_STANDARD["cl100k_base"].pat_str,
        mergeable_ranks=_tiny_ranks(),
        special_tokens=dict(TIKTOKEN_STANDARD["cl100k_base"].special_tokens),
    )
    texts = [f"doc {i}: the cat <|endoftext|> sat " * (i % 7) for i in range(101)]
    want = [reference.encode_ordinary(t) for t in texts]
    for threads in (1, 2, 3, 8, 200):
        tok.num_threads = threads
        got = tok.encode_batch(texts)
        assert [a.tolist() for a in got] == want
        assert all(a.dtype == np.uint32 for a in got)
    assert tok.encode_batch([]) == []
    copy = pickle.loads(pickle.dumps(tok))
    assert [a.tolist() for a in copy.encode_batch(texts)] == want
