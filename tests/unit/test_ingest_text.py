"""Raw text to LLMBATCH records: readers, tokenizers, parallel tokenization, packing.

The acceptance test trains a byte-level BPE model on a parquet corpus, converts the corpus to
an LLMBATCH file with ``write_batch_dataset(total_records=None)``, reads it back, undoes the
writer's permutation with ``record_source``, and decodes the original documents again.
"""

from __future__ import annotations

import base64
import itertools
import json
import pickle
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from zerobatch_spec import record_source

from tests.helpers import require
from zerobatch_core import BatchFileReader, write_batch_dataset
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest.packing import (
    PackingStats,
    make_records,
    pack_records,
    pad_records,
)
from zerobatch_core.ingest.source import RecordSource
from zerobatch_core.ingest.text import (
    TextSource,
    read_documents,
    read_jsonl,
    read_parquet,
    read_text,
)
from zerobatch_core.ingest.tokenizers import (
    TIKTOKEN_STANDARD,
    ByteLevelTokenizer,
    HFTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    load_tokenizer,
    make_spec,
    parse_spec,
    tiktoken_cache_path,
    tokenize_documents,
)
from zerobatch_core.tokenizer import pack_documents

pa = require("pyarrow")
pq = require("pyarrow.parquet")
hf = require("tokenizers")
tiktoken = require("tiktoken")

BOS = "<|bos|>"
SEQ_LEN = 64
SEED = 1234


def _corpus() -> list[str]:
    """Deterministic documents: words, Unicode, whitespace runs, an empty document, a literal
    BOS string (which must stay text), and a few documents longer than a record."""
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "mat", "data", "token", "batch", "zero", "naïve"]
    words += ["café", "日本語", "テキスト", "🎉", "—", "x1", "42"]
    docs = []
    for i in range(240):
        n = rng.choice([1, 3, 8, 20, 60]) if i % 50 else 400
        sep = rng.choice([" ", " ", "  ", "\n", "\t"])
        docs.append(sep.join(rng.choice(words) for _ in range(n)))
    docs[7] = ""
    docs[11] = f"a literal {BOS} marker and <|endoftext|> inside the text"
    docs[12] = " leading and trailing spaces "
    return docs


CORPUS = _corpus()


@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The corpus in two parquet files of several row groups each, with an extra column."""
    root = tmp_path_factory.mktemp("parquet")
    half = len(CORPUS) // 2
    paths = []
    for i, part in enumerate((CORPUS[:half], CORPUS[half:])):
        path = root / f"shard_{i:05d}.parquet"
        table = pa.table({"id": list(range(len(part))), "text": part})
        pq.write_table(table, path, row_group_size=25)
        assert pq.ParquetFile(path).num_row_groups > 3
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def bpe_spec(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A byte-level BPE model trained on the corpus in the test, saved as tokenizer.json."""
    tok = hf.Tokenizer(hf.models.BPE())
    tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = hf.decoders.ByteLevel()
    trainer = hf.trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=[BOS],
        initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return f"hf:{path}?bos={BOS}"


def _smallest_divisor_batch(n: int) -> int:
    """A batch size in 8..2 that divides ``n`` (else 1): no record is dropped by the writer."""
    return next((b for b in range(8, 1, -1) if n % b == 0), 1)


# --- acceptance ----------------------------------------------------------------------------


def test_parquet_bpe_roundtrip_through_llmbatch(
    parquet_files: list[Path], bpe_spec: str, tmp_path: Path
) -> None:
    assert list(read_parquet(parquet_files, batch_rows=10)) == CORPUS
    tok = load_tokenizer(bpe_spec)
    ids = tokenize_documents(read_parquet(parquet_files), bpe_spec, workers=1, batch_docs=32)
    packed = pack_records(ids, SEQ_LEN, tok.bos_id, chunk_records=16)
    blocks = list(packed)
    stats = packed.stats
    n = sum(b.shape[0] for b in blocks)
    assert n == stats.records and max(b.shape[0] for b in blocks) == 16
    assert stats.documents == len(CORPUS) and stats.padding_tokens == 0
    assert n * SEQ_LEN + stats.dropped_tail_tokens == stats.documents + stats.tokens
    assert 0 <= stats.dropped_tail_tokens < SEQ_LEN

    batch = _smallest_divisor_batch(n)
    out = tmp_path / "text.batch"
    nb = write_batch_dataset(out, iter(blocks), None, batch, SEQ_LEN, seed=SEED)
    assert nb == n // batch

    # Undo the permutation: output position p holds input record record_source(p, N, seed).
    records = np.full((n, SEQ_LEN), -1, dtype=np.int64)
    with BatchFileReader(out) as reader:
        assert reader.total_records == n and reader.seed == SEED
        for b in range(reader.num_batches):
            for r, row in enumerate(reader.read_batch(b)):
                records[record_source(b * batch + r, n, SEED)] = row
    assert (records >= 0).all()
    assert np.array_equal(records, np.concatenate(blocks))

    # Concatenate in input order, split on BOS: the documents, the dropped tail excepted.
    stream = records.ravel()
    starts = np.flatnonzero(stream == tok.bos_id)
    assert starts[0] == 0
    pieces = np.split(stream, starts)[1:]
    complete, last = pieces[:-1], pieces[-1][1:]
    assert 0 < len(complete) < len(CORPUS)
    for i, piece in enumerate(complete):
        assert tok.decode(piece) == CORPUS[i], i
    expected_last = tok.encode_batch([CORPUS[len(complete)]])[0]
    assert np.array_equal(last, expected_last[: last.size])
    # The literal "<|bos|>" in document 11 was tokenized as text, not as the BOS id.
    assert len(pieces) == np.count_nonzero(stream == tok.bos_id)


def test_worker_count_does_not_change_the_file(
    parquet_files: list[Path], bpe_spec: str, tmp_path: Path
) -> None:
    outputs = []
    for workers in (1, 4):
        src = TextSource(parquet_files, bpe_spec, SEQ_LEN, workers=workers, batch_docs=9)
        out = tmp_path / f"w{workers}.batch"
        write_batch_dataset(out, src.iter_blocks(), src.num_records, 4, src.seq_len, seed=SEED)
        assert src.stats is not None and src.stats.documents == len(CORPUS)
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


# --- tokenizers ----------------------------------------------------------------------------


def test_byte_tokenizer_roundtrip_and_pickle() -> None:
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteLevelTokenizer) and isinstance(tok, Tokenizer)
    assert (tok.bos_id, tok.eos_id, tok.vocab_size, tok.name) == (256, None, 257, "byte")
    texts = ["héllo 🎉", "", "plain"]
    ids = tok.encode_batch(texts)
    assert all(a.dtype == np.uint32 for a in ids)
    assert [tok.decode(a) for a in ids] == texts
    assert tok.decode(np.concatenate([[256], ids[0]])) == texts[0]
    again = pickle.loads(pickle.dumps(tok))
    assert all(np.array_equal(a, b) for a, b in zip(again.encode_batch(texts), ids, strict=True))
    with pytest.raises(IngestError, match="document 1 of the batch"):
        tok.encode_batch(["ok", "\ud800"])


def test_hf_tokenizer_specials_and_pickle(bpe_spec: str) -> None:
    tok = load_tokenizer(bpe_spec)
    assert isinstance(tok, HFTokenizer) and tok.name == bpe_spec and tok.eos_id is None
    text = f"x {BOS} y"
    (ids,) = tok.encode_batch([text])
    assert tok.bos_id not in ids.tolist() and tok.decode(ids) == text
    again = pickle.loads(pickle.dumps(tok))
    assert np.array_equal(again.encode_batch([text])[0], ids)
    path = parse_spec(bpe_spec)[1]
    assert HFTokenizer.from_file(path, bos=BOS).name == bpe_spec  # the name is the spec
    with_eos = load_tokenizer(f"hf:{path}?bos={BOS}&eos={BOS}")
    assert with_eos.eos_id == tok.bos_id
    with pytest.raises(IngestError, match="needs its BOS token"):
        load_tokenizer(f"hf:{path}")
    with pytest.raises(IngestError, match="'<s>' is not in the vocabulary"):
        load_tokenizer(f"hf:{path}?bos=<s>")
    with pytest.raises(IngestError, match="does not exist"):
        load_tokenizer("hf:/nonexistent/tokenizer.json?bos=<s>")


def _tiny_ranks() -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    for merge in (b"th", b"the", b" t", b" the", b"at", b"cat"):
        ranks[merge] = len(ranks)
    return ranks


def test_tiktoken_from_local_file_never_downloads(tmp_path: Path) -> None:
    ranks = _tiny_ranks()
    path = tmp_path / "tiny.tiktoken"
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    tok = load_tokenizer(f"tiktoken:{path}?pattern=cl100k_base")
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
    again = pickle.loads(pickle.dumps(tok))
    assert [a.tolist() for a in again.encode_batch(texts)] == [a.tolist() for a in ids]

    custom = TiktokenTokenizer(
        ranks, pat_str=r"\s*\S+", special_tokens={"<|bos|>": 300}, bos="<|bos|>"
    )
    assert custom.bos_id == 300 and custom.vocab_size == 301
    assert custom.decode(custom.encode_batch(["the cat"])[0]) == "the cat"

    with pytest.raises(IngestError, match=r"add \?pattern=NAME"):
        load_tokenizer(f"tiktoken:{path}")
    with pytest.raises(IngestError, match="not a special token"):
        load_tokenizer(f"tiktoken:{path}?pattern=r50k_base&bos=<s>")
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"dGhl 1\nnot-base64! 2\n")
    with pytest.raises(IngestError, match="line 2"):
        load_tokenizer(f"tiktoken:{bad}?pattern=r50k_base")


def test_tiktoken_named_encoding_only_from_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(IngestError, match=r"not in the local cache.*never downloads"):
        load_tokenizer("tiktoken:cl100k_base")
    Path(tiktoken_cache_path("cl100k_base")).write_bytes(b"dGhl 0\n")
    with pytest.raises(IngestError, match="cache is corrupt"):
        load_tokenizer("tiktoken:cl100k_base")
    with pytest.raises(IngestError, match="unknown tiktoken encoding"):
        TiktokenTokenizer.from_cache("gpt5")


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


def test_parallel_tokenization_order_and_errors() -> None:
    docs = [f"document {i}: " + "é" * (i % 13) for i in range(300)]
    serial = list(tokenize_documents(docs, "byte", workers=1, batch_docs=7))
    parallel = list(tokenize_documents(iter(docs), "byte", workers=2, batch_docs=7))
    assert len(parallel) == len(docs)
    assert all(np.array_equal(a, b) for a, b in zip(serial, parallel, strict=True))
    # A worker's failure reaches the caller; a non-string fails before any work.
    with pytest.raises(IngestError, match="not encodable"):
        list(tokenize_documents([*docs[:20], "\udc80"], "byte", workers=2, batch_docs=7))
    with pytest.raises(IngestError, match="document 1: expected a str"):
        list(tokenize_documents(["a", b"b"], "byte"))  # type: ignore[list-item]
    with pytest.raises(IngestError, match="workers must be in"):
        tokenize_documents(docs, "byte", workers=0)


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
    assert [ByteLevelTokenizer().decode(a) for a in first] == [f"doc {i}" for i in range(12)]
    assert consumed <= (2 * workers + 3) * 5


# --- packing -------------------------------------------------------------------------------


def _docs(rng: np.random.Generator, n: int, vocab: int = 1000) -> list[npt.NDArray[np.uint32]]:
    lengths = rng.choice([0, 1, 5, 30, 200], size=n)
    return [rng.integers(0, vocab, size=int(k), dtype=np.uint32) for k in lengths]


@pytest.mark.parametrize(("seq_len", "chunk"), [(16, 3), (7, 1), (64, None), (1, 5)])
def test_pack_matches_pack_documents(seq_len: int, chunk: int | None) -> None:
    docs = _docs(np.random.default_rng(seq_len), 120)
    packed = pack_records(docs, seq_len, 1000, chunk_records=chunk)
    blocks = list(packed)
    assert all(b.dtype == np.uint32 and b.flags.c_contiguous for b in blocks)
    if chunk is not None:
        assert all(b.shape[0] <= chunk for b in blocks)
    got = np.concatenate(blocks)
    want = np.stack(list(pack_documents(docs, seq_len, bos_id=1000)))
    assert np.array_equal(got, want)
    st = packed.stats
    assert st.records == got.shape[0] and st.documents == len(docs)
    assert st.tokens == sum(d.size for d in docs)
    assert st.records * seq_len + st.dropped_tail_tokens == st.documents + st.tokens
    assert st.padding_fraction == 0.0 and st.truncated_documents == 0


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
    st = padded.stats
    assert (st.documents, st.tokens, st.records) == (5, 39, 5)
    assert (st.padding_tokens, st.truncated_documents, st.truncated_tokens) == (11, 2, 15)
    assert st.padding_fraction == pytest.approx(11 / 40)
    assert st.dropped_tail_tokens == 0
    assert st.records * 8 == st.documents + st.tokens - st.truncated_tokens + st.padding_tokens
    assert json.loads(json.dumps(st.to_dict()))["padding_fraction"] == pytest.approx(0.275)


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


# --- readers -------------------------------------------------------------------------------


def test_jsonl_reader(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    a.write_bytes(
        "\ufeff".encode()
        + b'{"text": "first", "n": 1}\n\n'
        + json.dumps({"text": "caf\u00e9 \U0001f389\n2"}).encode()
        + b"\r\n   \n"
        + b'{"body": "other field", "text": ""}'  # no final newline
    )
    b = tmp_path / "b.jsonl"
    b.write_text('{"body": "x", "text": "second file"}\n')
    assert list(read_jsonl([a, b])) == ["first", "café 🎉\n2", "", "second file"]
    assert list(read_jsonl(b, field="body")) == ["x"]
    assert list(read_jsonl(str(tmp_path / "*.jsonl"))) == list(read_jsonl([a, b]))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"text": "ok"}\n{"text": "x",}\n', r"line 2, column 14: invalid JSON"),
        (b'{"text": "ok"}\n\n["text"]\n', r"line 3: expected a JSON object, got list"),
        (b'{"text": "ok"}\n{"body": "x"}\n', r"line 2: no field 'text' \(fields: body\)"),
        (b'{"text": null}\n', r"line 1: field 'text' is null"),
        (b'{"text": 3}\n', r"line 1: field 'text' is int"),
        (b'{"text": "ok"}\n{"text": "\xff"}\n', r"line 2, byte offset 25: invalid UTF-8"),
        (b'{"text": "a\\ud800b"}\n', r"line 1: field 'text': character 1 is a lone surrogate"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(IngestError, match=f"bad.jsonl: {message}"):
        list(read_jsonl(path))


def test_text_reader(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_bytes("\ufeffsecond\r\nfile\n".encode())
    (tmp_path / "a.txt").write_bytes("first file\n\nwith ünïcode".encode())
    files = str(tmp_path / "*.txt")
    assert list(read_text(files)) == ["first file\n\nwith ünïcode", "second\r\nfile\n"]
    assert list(read_text(files, per_line=True)) == [
        "first file",
        "with ünïcode",
        "second",
        "file",
    ]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line\nbad \xe9 line\n")
    with pytest.raises(IngestError, match=r"bad.txt: byte offset 14: invalid UTF-8"):
        list(read_text(bad))
    with pytest.raises(IngestError, match=r"bad.txt: line 2, byte offset 14: invalid UTF-8"):
        list(read_text(bad, per_line=True))
    with pytest.raises(IngestError, match="does not exist"):
        read_text(tmp_path / "missing.txt")  # fails at the call, before any document


def test_read_documents_mixes_formats_in_order(parquet_files: list[Path], tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text('{"text": "from jsonl"}\n')
    (tmp_path / "y.md").write_text("from markdown")
    docs = list(read_documents([tmp_path / "y.md", parquet_files[1], tmp_path / "x.jsonl"]))
    assert docs == ["from markdown", *CORPUS[len(CORPUS) // 2 :], "from jsonl"]
    with pytest.raises(IngestError, match="format must be"):
        read_documents(tmp_path / "y.md", format="csv")  # type: ignore[arg-type]


def _corrupt_row_group(path: Path, out: Path, row_group: int) -> None:
    """Overwrite one row group's column chunk of ``path`` with junk bytes."""
    meta = pq.ParquetFile(path).metadata
    chunk = meta.row_group(row_group).column(1)  # the "text" column
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + chunk.total_compressed_size] = b"\xab" * chunk.total_compressed_size
    out.write_bytes(bytes(data))


def test_parquet_errors_name_file_and_position(parquet_files: list[Path], tmp_path: Path) -> None:
    good = parquet_files[0]
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(IngestError, match=r"truncated\.parquet: not a readable parquet file"):
        list(read_parquet(truncated))

    corrupt = tmp_path / "corrupt.parquet"
    _corrupt_row_group(good, corrupt, 2)
    docs: list[str] = []
    with pytest.raises(IngestError, match=r"corrupt.parquet: row group 2 .*cannot read column"):
        docs.extend(read_parquet(corrupt))
    assert docs == CORPUS[:50]  # row groups 0 and 1 (25 rows each) came through intact

    with pytest.raises(IngestError, match=r"no column 'body' \(columns: id, text\)"):
        list(read_parquet(good, "body"))
    with pytest.raises(IngestError, match="column 'id' has type int64"):
        list(read_parquet(good, "id"))

    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c", None, "e"]}), nulls, row_group_size=2)
    with pytest.raises(IngestError, match=r"nulls.parquet: row group 1, row 1: .* is null"):
        list(read_parquet(nulls))


def test_text_source_pad_mode_with_eos_padding(tmp_path: Path, bpe_spec: str) -> None:
    (tmp_path / "d.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in ["short", "a much longer document " * 9])
    )
    path = parse_spec(bpe_spec)[1]
    spec = f"hf:{path}?bos={BOS}&eos={BOS}"
    src = TextSource(tmp_path / "d.jsonl", spec, 16, mode="pad")
    assert isinstance(src, RecordSource) and src.num_records is None
    blocks: list[Any] = list(src.iter_blocks())
    assert src.stats is not None
    assert (src.stats.records, src.stats.truncated_documents) == (2, 1)
    assert blocks[0].shape == (2, 16) and src.stats.padding_tokens > 0
    with pytest.raises(IngestError, match="no EOS"):
        TextSource(tmp_path / "d.jsonl", "byte", 16, mode="pad")
