"""``convert``'s token dtype: ``"auto"`` for every input kind and tokenizer, forced dtypes,
refusals that name the token, sharded datasets, the summary and the command line.

Expected batches come from the spec's permutation over the records cut independently here
(``expected_batches``); the dtype is read back from the raw header bytes.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from zerobatch_spec import (
    DTYPE_UINT16,
    DTYPE_UINT32,
    HEADER_SIZE,
    expected_file_size,
    parse_header,
)
from zerobatch_spec.dataset import MANIFEST_NAME, parse_manifest, shard_seed

from tests.fuzz.fuzz_megatron import write_dataset
from tests.helpers import expected_batches
from zerobatch_core import BatchFileReader
from zerobatch_core.datasets.build import create_dataset
from zerobatch_core.errors import IngestError, WriteError
from zerobatch_core.files.writer import write_batch_file
from zerobatch_core.ingest.convert import convert
from zerobatch_core.tokenization import ByteTokenizer

LEGACY, NEW = 20240520, 278895051


def write_shard(path: Path, tokens: npt.ArrayLike, itemsize: int = 2) -> Path:
    """A nanoGPT shard: uint16 (legacy magic) or uint32 tokens (new magic, header[3] = 4)."""
    header = np.zeros(256, dtype=np.int32)
    toks = np.asarray(tokens, dtype=np.uint16 if itemsize == 2 else np.uint32)
    header[0], header[1], header[2] = (LEGACY if itemsize == 2 else NEW), 1, toks.size
    header[3] = 0 if itemsize == 2 else 4
    path.write_bytes(header.tobytes() + toks.tobytes())
    return path


def file_dtype(path: Path) -> int:
    return parse_header(path.read_bytes()[:HEADER_SIZE]).dtype


def batches(path: Path) -> npt.NDArray[np.int64]:
    with BatchFileReader(path) as r:
        return np.array(r.read_batches(0, r.num_batches), dtype=np.int64)


def corpus(n: int, high: int = 50_257, seed: int = 0) -> npt.NDArray[np.int64]:
    """A GPT-2-sized token stream with both ends of the uint16 range present."""
    out = np.random.default_rng(seed).integers(0, high, size=n, dtype=np.int64)
    out[:2] = 0, high - 1
    return out


T, B = 512, 4  # a batch is 4096 uint16 bytes: two slots of uint32, one of uint16


# --- nanoGPT: the acceptance case ----------------------------------------------------------------


def test_a_nanogpt_uint16_corpus_converts_to_half_the_bytes_by_default(tmp_path: Path) -> None:
    tokens = corpus(20 * T + 7)
    write_shard(tmp_path / "a.bin", tokens[: 9 * T + 3])
    write_shard(tmp_path / "b.bin", tokens[9 * T + 3 :])
    pattern = str(tmp_path / "*.bin")
    auto = convert([pattern], str(tmp_path / "auto.batch"), seq_len=T, batch_size=B, seed=3)
    wide = convert(
        [pattern], str(tmp_path / "u32.batch"), seq_len=T, batch_size=B, seed=3, dtype="uint32"
    )
    assert (auto.dtype, auto.dtype_reason) == ("uint16", "uint16 inputs")
    assert (wide.dtype, wide.dtype_reason) == ("uint32", "asked for")
    assert "  tokens stored as uint16 (uint16 inputs)" in auto.lines()
    assert file_dtype(tmp_path / "auto.batch") == DTYPE_UINT16
    size16, size32 = auto.output_bytes, wide.output_bytes
    assert size16 == expected_file_size(B, T, 5, DTYPE_UINT16)
    assert size32 == expected_file_size(B, T, 5, DTYPE_UINT32)
    assert size16 - HEADER_SIZE == (size32 - HEADER_SIZE) // 2
    a, b = tokens[: 9 * T + 3], tokens[9 * T + 3 :]
    records = np.concatenate([a[: 9 * T].reshape(9, T), b[: 11 * T].reshape(11, T)])
    want = expected_batches(records, B, 3)
    np.testing.assert_array_equal(batches(tmp_path / "auto.batch"), want)
    np.testing.assert_array_equal(batches(tmp_path / "u32.batch"), want)


def test_uint32_shards_are_uint16_when_their_largest_id_fits(tmp_path: Path) -> None:
    write_shard(tmp_path / "a.bin", corpus(8 * T), itemsize=4)
    s = convert([str(tmp_path / "a.bin")], str(tmp_path / "o.batch"), seq_len=T, batch_size=B)
    assert s.dtype == "uint16" and file_dtype(tmp_path / "o.batch") == DTYPE_UINT16
    assert s.dtype_reason == "largest id 50,256 of the uint32 inputs fits"
    big = corpus(8 * T)
    big[5 * T + 9] = 100_000
    write_shard(tmp_path / "b.bin", big, itemsize=4)
    s = convert([str(tmp_path / "b.bin")], str(tmp_path / "p.batch"), seq_len=T, batch_size=B)
    assert s.dtype == "uint32" and file_dtype(tmp_path / "p.batch") == DTYPE_UINT32
    assert s.dtype_reason == "largest id 100,000 of the uint32 inputs is above 65,535"
    np.testing.assert_array_equal(
        batches(tmp_path / "p.batch"), expected_batches(big.reshape(8, T), B, 0)
    )


@pytest.mark.parametrize("shard_batches", [None, 1])
def test_forcing_uint16_names_the_token_that_does_not_fit_and_leaves_nothing(
    tmp_path: Path, shard_batches: int | None
) -> None:
    write_shard(tmp_path / "a.bin", corpus(4 * T, seed=1), itemsize=4)
    big = corpus(4 * T, seed=2)
    big[3 * T + 17] = 65_536
    write_shard(tmp_path / "b.bin", big, itemsize=4)
    out = tmp_path / "out"
    with pytest.raises(IngestError) as info:
        convert(
            [str(tmp_path / "*.bin")],
            str(out),
            seq_len=T,
            batch_size=B,
            dtype="uint16",
            shard_batches=shard_batches,
        )
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'b.bin'}: token 1,553 of the shard (record 3, ")
    assert "id 65,536 does not fit uint16" in message and "dtype='uint32'" in message
    assert not out.exists() or os.listdir(out) == []
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"] + (["out"] if out.exists() else [])


def test_forcing_uint32_on_uint16_shards_widens(tmp_path: Path) -> None:
    tokens = corpus(4 * T)
    write_shard(tmp_path / "a.bin", tokens)
    s = convert(
        [str(tmp_path / "a.bin")],
        str(tmp_path / "o.batch"),
        seq_len=T,
        batch_size=B,
        dtype="uint32",
    )
    assert s.dtype == "uint32" and file_dtype(tmp_path / "o.batch") == DTYPE_UINT32
    np.testing.assert_array_equal(
        batches(tmp_path / "o.batch"), expected_batches(tokens.reshape(4, T), B, 0)
    )


def test_an_unknown_dtype_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    write_shard(tmp_path / "a.bin", corpus(4 * T))
    with pytest.raises(IngestError, match="dtype must be one of 'auto', 'uint16', 'uint32'"):
        convert([str(tmp_path / "a.bin")], str(tmp_path / "o"), seq_len=T, batch_size=B, dtype="u8")
    assert not (tmp_path / "o").exists()


# --- .npy arrays ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "high", "written", "reason"),
    [
        (np.uint16, 2**16, "uint16", "uint16 inputs"),
        (np.int16, 2**15, "uint16", "int16 inputs"),
        (np.int64, 2**16, "uint16", "largest id 65,535 of the int64 inputs fits"),
        (np.int32, 2**16 + 1, "uint32", "largest id 65,536 of the int32 inputs is above 65,535"),
    ],
)
def test_npy_arrays_choose_by_their_dtype_then_their_largest_id(
    tmp_path: Path, dtype: type, high: int, written: str, reason: str
) -> None:
    src = corpus(12 * 8, high=high).reshape(12, 8).astype(dtype)
    np.save(tmp_path / "a.npy", src)
    s = convert([str(tmp_path / "a.npy")], str(tmp_path / "o.batch"), seq_len=8, batch_size=3)
    assert (s.dtype, s.dtype_reason) == (written, reason)
    np.testing.assert_array_equal(batches(tmp_path / "o.batch"), expected_batches(src, 3, 0))


def test_forcing_uint16_on_an_array_names_its_row_or_element(tmp_path: Path) -> None:
    src = corpus(40).reshape(5, 8)
    src[3, 6] = 70_000
    np.save(tmp_path / "rows.npy", src)
    np.save(tmp_path / "flat.npy", src.reshape(-1))
    for name, where in [("rows", "record (row) 3, token 6"), ("flat", "element 30 (record 3")]:
        with pytest.raises(IngestError, match=rf"{name}\.npy: {re.escape(where)}"):
            convert(
                [str(tmp_path / f"{name}.npy")],
                str(tmp_path / "o.batch"),
                seq_len=8,
                batch_size=1,
                dtype="uint16",
            )
        assert not (tmp_path / "o.batch").exists()


# --- other systems' token files -------------------------------------------------------------------


def _megatron(prefix: Path, docs: list[list[int]], code: int) -> str:
    index = list(range(len(docs) + 1))
    idx, data = write_dataset(docs, index, code)
    Path(f"{prefix}.idx").write_bytes(idx)
    Path(f"{prefix}.bin").write_bytes(data)
    return str(prefix)


@pytest.mark.parametrize(
    ("code", "high", "written", "reason"),
    [
        (8, 2**16, "uint16", "uint16 inputs"),  # Megatron's uint16 (small vocabularies)
        (4, 2**16, "uint16", "largest id 65,535 of the int32 inputs fits"),
        (4, 2**17, "uint32", "of the int32 inputs is above 65,535"),
    ],
)
def test_megatron_files_choose_by_their_dtype_then_their_largest_id(
    tmp_path: Path, code: int, high: int, written: str, reason: str
) -> None:
    docs = [corpus(30, high=high, seed=k).tolist() for k in range(6)]
    prefix = _megatron(tmp_path / "mega", docs, code)
    s = convert([prefix], str(tmp_path / "o.batch"), seq_len=10, batch_size=2)
    assert s.dtype == written and s.dtype_reason.endswith(reason)
    flat = np.concatenate([np.asarray(d) for d in docs]).reshape(-1, 10)
    np.testing.assert_array_equal(batches(tmp_path / "o.batch"), expected_batches(flat, 2, 0))


def test_hugging_face_int64_columns_are_uint16_when_their_ids_fit(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [corpus(25, seed=k).tolist() for k in range(8)]
    pq.write_table(
        pa.table({"input_ids": pa.array(rows, pa.list_(pa.int64()))}), tmp_path / "t.parquet"
    )
    s = convert([str(tmp_path / "t.parquet")], str(tmp_path / "o.batch"), seq_len=20, batch_size=2)
    assert (s.kind, s.dtype) == ("hf", "uint16")
    assert s.dtype_reason == "largest id 50,256 of the int64 inputs fits"
    flat = np.concatenate([np.asarray(r) for r in rows]).reshape(-1, 20)
    np.testing.assert_array_equal(batches(tmp_path / "o.batch"), expected_batches(flat, 2, 0))


# --- text and tokenizers ------------------------------------------------------------------------


class WideTokenizer(ByteTokenizer):
    """Byte ids, but a vocabulary (or a BOS id) beyond uint16, as large modern tokenizers have."""

    name = "wide"

    def __init__(self, vocab_size: int = 100_277, bos_id: int = 256) -> None:
        self.vocab_size, self.bos_id = vocab_size, bos_id


class UnsizedTokenizer:
    """A third-party tokenizer that does not know its vocabulary size (byte ids)."""

    name, bos_id, eos_id, vocab_size = "unsized", 256, None, None

    def encode_batch(self, texts: list[str]) -> list[npt.NDArray[np.uint32]]:
        return ByteTokenizer().encode_batch(texts)

    def decode(self, ids: npt.ArrayLike) -> str:
        return ByteTokenizer().decode(ids)

    def to_json(self) -> str:
        return ByteTokenizer().to_json()


def text_file(tmp_path: Path) -> str:
    path = tmp_path / "docs.jsonl"
    docs = [{"text": f"document {i} " + "abc " * (i % 7)} for i in range(40)]
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return str(path)


def test_the_byte_tokenizer_writes_uint16(tmp_path: Path) -> None:
    s = convert([text_file(tmp_path)], str(tmp_path / "o.batch"), seq_len=16, batch_size=2)
    assert (s.dtype, s.dtype_reason) == ("uint16", "vocabulary 257 ids")
    assert file_dtype(tmp_path / "o.batch") == DTYPE_UINT16


@pytest.mark.parametrize(
    ("tokenizer", "pad", "written", "reason"),
    [
        (WideTokenizer(), None, "uint32", "vocabulary 100,277 ids, more than uint16's 65,536"),
        (WideTokenizer(65_536), None, "uint16", "vocabulary 65,536 ids"),
        (WideTokenizer(300, bos_id=65_536), None, "uint32", "BOS id 65,536"),
        (WideTokenizer(300), 65_536, "uint32", "pad id 65,536"),
        (UnsizedTokenizer(), None, "uint32", "'unsized' does not say its vocabulary size"),
    ],
)
def test_auto_follows_every_id_the_tokenizer_can_write(
    tmp_path: Path, tokenizer: Any, pad: int | None, written: str, reason: str
) -> None:
    options: dict[str, Any] = {"mode": "pad", "pad_id": pad} if pad is not None else {}
    s = convert(
        [text_file(tmp_path)],
        str(tmp_path / "o.batch"),
        seq_len=16,
        batch_size=2,
        tokenizer=tokenizer,
        **options,
    )
    assert s.dtype == written and reason in s.dtype_reason
    assert file_dtype(tmp_path / "o.batch") == (DTYPE_UINT16 if written == "uint16" else 0)


def test_forcing_uint16_with_a_larger_vocabulary_is_refused_before_anything(
    tmp_path: Path,
) -> None:
    with pytest.raises(IngestError) as info:
        convert(
            [text_file(tmp_path)],
            str(tmp_path / "o.batch"),
            seq_len=16,
            batch_size=2,
            tokenizer=WideTokenizer(),
            dtype="uint16",
        )
    assert str(info.value) == (
        "dtype='uint16' cannot hold every id of tokenizer 'wide': vocabulary 100,277 ids, and "
        "uint16 holds ids up to 65,535; write dtype='uint32', or 'auto'"
    )
    assert not (tmp_path / "o.batch").exists()


def test_uint16_text_is_the_same_bytes_for_any_number_of_workers(tmp_path: Path) -> None:
    src = text_file(tmp_path)
    for workers in (1, 4):
        convert(
            [src],
            str(tmp_path / f"w{workers}"),
            seq_len=16,
            batch_size=2,
            workers=workers,
            shard_batches=3,
        )
    one, four = tmp_path / "w1", tmp_path / "w4"
    assert sorted(os.listdir(one)) == sorted(os.listdir(four))
    for name in os.listdir(one):
        assert (one / name).read_bytes() == (four / name).read_bytes(), name
    manifest = parse_manifest((one / MANIFEST_NAME).read_bytes())
    assert not isinstance(manifest, Exception) and getattr(manifest, "dtype", None) == 1


# --- sharded datasets -----------------------------------------------------------------------------


def _dataset_files(path: Path) -> dict[str, bytes]:
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path))}


@pytest.mark.parametrize("big_at", [None, 0, 5 * T + 1, 8 * T + 3, 9 * T + 2])
def test_a_sharded_auto_dataset_is_the_dataset_its_dtype_would_give(
    tmp_path: Path, big_at: int | None
) -> None:
    # Shards of 4 records: a big id in shard 0, in shard 1 (shard 0 is rewritten), in the last
    # shard's dropped remainder (both are rewritten), or in the tail no record holds (uint16).
    tokens = corpus(9 * T + 5)
    if big_at is not None:
        tokens[big_at] = 2**16 + 7
    np.save(tmp_path / "a.npy", tokens)
    src = [str(tmp_path / "a.npy")]
    auto = convert(src, str(tmp_path / "auto"), seq_len=T, batch_size=2, shard_batches=2)
    want = "uint16" if big_at in (None, 9 * T + 2) else "uint32"
    forced = convert(
        src, str(tmp_path / "forced"), seq_len=T, batch_size=2, shard_batches=2, dtype=want
    )
    assert auto.dtype == forced.dtype == want and auto.shards == 3
    files = _dataset_files(tmp_path / "auto")
    assert files == _dataset_files(tmp_path / "forced")
    manifest = json.loads(files[MANIFEST_NAME])
    assert manifest.get("dtype", 0) == (DTYPE_UINT16 if want == "uint16" else DTYPE_UINT32)
    assert ("dtype" in manifest) == (want == "uint16")  # uint32 manifests stay as they were
    records = tokens[: 9 * T].reshape(9, T)
    for i, name in enumerate(sorted(n for n in files if n.endswith(".batch"))):
        np.testing.assert_array_equal(
            batches(tmp_path / "auto" / name),
            expected_batches(records[4 * i : 4 * i + 4], 2, shard_seed(0, i)),
        )


def test_create_dataset_records_the_dtype_and_refuses_mixed_files(tmp_path: Path) -> None:
    src = corpus(64).reshape(8, 8)
    write_batch_file(tmp_path / "a.batch", src, 2, dtype="uint16")
    write_batch_file(tmp_path / "b.batch", src, 2, seed=1, dtype="uint16")
    manifest = create_dataset(tmp_path)
    assert manifest.dtype == DTYPE_UINT16
    assert json.loads((tmp_path / MANIFEST_NAME).read_bytes())["dtype"] == DTYPE_UINT16
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_batch_file(mixed / "a.batch", src, 2, dtype="uint16")
    write_batch_file(mixed / "b.batch", src, 2, dtype="uint32")
    with pytest.raises(
        WriteError, match=r"b\.batch holds uint32 tokens; the first shard, a\.batch"
    ):
        create_dataset(mixed)
    assert sorted(os.listdir(mixed)) == ["a.batch", "b.batch"]


# --- the command line ---------------------------------------------------------------------------


def test_the_cli_says_which_dtype_it_wrote_and_takes_dtype(tmp_path: Path, run: Any) -> None:
    write_shard(tmp_path / "a.bin", corpus(4 * T))
    r = run("convert", tmp_path / "a.bin", tmp_path / "o.batch", "--seq-len", T, "--batch-size", B)
    assert r.status == 0 and "tokens stored as uint16 (uint16 inputs)" in r.out
    r = run(
        "convert",
        tmp_path / "a.bin",
        tmp_path / "p.batch",
        "--seq-len",
        T,
        "--batch-size",
        B,
        "--dtype",
        "uint32",
        "--json",
    )
    assert r.status == 0 and json.loads(r.out)["dtype"] == "uint32"
    assert file_dtype(tmp_path / "p.batch") == DTYPE_UINT32


def test_the_cli_names_the_flag_when_uint16_cannot_hold_a_token(tmp_path: Path, run: Any) -> None:
    big = corpus(4 * T)
    big[7] = 70_000
    write_shard(tmp_path / "a.bin", big, itemsize=4)
    r = run(
        "convert",
        tmp_path / "a.bin",
        tmp_path / "o.batch",
        "--seq-len",
        T,
        "--batch-size",
        B,
        "--dtype",
        "uint16",
    )
    assert r.status != 0 and "id 70,000 does not fit uint16" in r.err
    assert "--dtype uint32" in r.err and not (tmp_path / "o.batch").exists()
    with pytest.raises(SystemExit) as exit_info:
        run(
            "convert",
            tmp_path / "a.bin",
            tmp_path / "o.batch",
            "--seq-len",
            T,
            "--batch-size",
            B,
            "--dtype",
            "int8",
        )
    assert exit_info.value.code == 2


def test_a_hugging_face_vocabulary_size_is_one_more_than_its_largest_id() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from zerobatch_core.ingest.dtypes import plan_text_dtype, tokenizer_ids
    from zerobatch_core.tokenization import HFTokenizer

    vocab = {chr(c): c - 97 for c in range(97, 123)} | {"<s>": 26, "[UNK]": 65_536}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok = HFTokenizer(model, bos="<s>")
    assert tok.vocab_size == 65_537  # 28 ids, the largest 65,536: not the count
    plan = plan_text_dtype(tokenizer_ids(tok, None), "auto", tok.name)
    assert (plan.code, plan.reason) == (0, "vocabulary 65,537 ids, more than uint16's 65,536")
