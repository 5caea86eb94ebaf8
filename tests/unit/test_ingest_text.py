"""Raw text to LLMBATCH records: readers, and the whole text pipeline (``TextSource``).

The acceptance test trains a byte-level BPE model on a parquet corpus, converts the corpus to
an LLMBATCH file with ``write_batch_dataset(total_records=None)``, reads it back, undoes the
writer's permutation with ``record_source``, and decodes the original documents again.
Tokenizers are tested in ``test_tokenization.py``, packing in ``test_packing.py``. Only the
tests that read parquet need pyarrow, only those that use the BPE model need ``tokenizers``
(through the ``pa``/``pq``/``bpe_spec`` fixtures).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec import record_source

from tests.helpers import require
from tests.unit.bpe import train_bpe
from zerobatch_core import BatchFileReader, ByteTokenizer, write_batch_dataset
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest.packing import pack_records
from zerobatch_core.ingest.source import RecordSource
from zerobatch_core.ingest.text import (
    TextSource,
    read_documents,
    read_jsonl,
    read_parquet,
    read_text,
)
from zerobatch_core.tokenization import load_tokenizer, parse_spec, tokenize_documents

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
def pa() -> Any:
    return require("pyarrow")


@pytest.fixture(scope="module")
def pq() -> Any:
    return require("pyarrow.parquet")


@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory: pytest.TempPathFactory, pa: Any, pq: Any) -> list[Path]:
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
    hf = require("tokenizers")
    return train_bpe(hf, CORPUS, tmp_path_factory.mktemp("bpe") / "tokenizer.json", BOS)


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


def test_worker_count_does_not_change_the_file_byte_level(tmp_path: Path) -> None:
    """The same with JSONL and the byte tokenizer (given as an object): NumPy only."""
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    outputs = []
    for workers in (1, 3):
        src = TextSource(
            tmp_path / "d.jsonl", ByteTokenizer(), SEQ_LEN, workers=workers, batch_docs=11
        )
        out = tmp_path / f"w{workers}.batch"
        write_batch_dataset(out, src.iter_blocks(), src.num_records, 4, src.seq_len, seed=SEED)
        assert src.stats is not None and src.stats.documents == len(CORPUS)
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


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


def _corrupt_row_group(pq: Any, path: Path, out: Path, row_group: int) -> None:
    """Overwrite one row group's column chunk of ``path`` with junk bytes."""
    meta = pq.ParquetFile(path).metadata
    chunk = meta.row_group(row_group).column(1)  # the "text" column
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + chunk.total_compressed_size] = b"\xab" * chunk.total_compressed_size
    out.write_bytes(bytes(data))


def test_parquet_errors_name_file_and_position(
    parquet_files: list[Path], tmp_path: Path, pa: Any, pq: Any
) -> None:
    good = parquet_files[0]
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(IngestError, match=r"truncated\.parquet: not a readable parquet file"):
        list(read_parquet(truncated))

    corrupt = tmp_path / "corrupt.parquet"
    _corrupt_row_group(pq, good, corrupt, 2)
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
