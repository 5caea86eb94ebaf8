"""``produce``'s token dtype: ``"auto"`` from the tokenizer (or 16-bit token files) for a new
live dataset and the dataset's own for an existing one, recorded in ``producer.json``; a
restart with another dtype is refused like any other change, and records written before
dtypes existed still resume."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec import DTYPE_UINT16, parse_header
from zerobatch_spec.live import DESCRIPTOR_NAME

from tests.produce_corpus import PAD, committed_documents, producer_streams
from tests.unit.test_convert_dtype import WideTokenizer, write_shard
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest.produce import ProduceError, produce
from zerobatch_core.live.producer import LiveProducer
from zerobatch_core.live.production import ProducerRecord, ProductionError, record_key

T, B = 16, 2
ARGS: dict[str, Any] = {"seq_len": T, "batch_size": B, "pad_id": PAD, "batches_per_object": 2}


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[str, list[str]]:
    texts = [f"document {i}: " + "words " * (i % 9) for i in range(30)]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path), texts


def descriptor(url: str) -> dict[str, Any]:
    return json.loads((Path(url) / DESCRIPTOR_NAME).read_bytes())


def record(url: str, producer: str = "p0") -> dict[str, Any]:
    return json.loads((Path(url) / record_key(producer)).read_bytes())


def test_the_byte_tokenizer_produces_uint16_batches_equal_to_uint32_ones(
    corpus: tuple[str, list[str]], tmp_path: Path
) -> None:
    path, texts = corpus
    narrow, wide = str(tmp_path / "u16"), str(tmp_path / "u32")
    s16 = produce(path, narrow, producer_id="p0", epochs=1, **ARGS)
    s32 = produce(path, wide, producer_id="p0", epochs=1, dtype="uint32", **ARGS)
    assert (s16.dtype, s32.dtype) == ("uint16", "uint32")
    assert "tokens stored as uint16" in s16.lines()[1]
    assert descriptor(narrow)["dtype"] == DTYPE_UINT16 and "dtype" not in descriptor(wide)
    assert (record(narrow)["dtype"], record(wide)["dtype"]) == ("uint16", "uint32")
    a, b = producer_streams(narrow)["p0"], producer_streams(wide)["p0"]
    assert [x.dtype.itemsize for x in a[:1]] == [2] and len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.astype(np.int64), y.astype(np.int64))
    assert committed_documents(narrow) == collections.Counter(texts)
    objects = sorted((Path(narrow) / "batches").rglob("*"))
    headers = [parse_header(p.read_bytes()) for p in objects if p.is_file()]
    assert headers and {h.dtype for h in headers} == {DTYPE_UINT16}


def test_a_restart_with_another_dtype_is_refused_naming_it(
    corpus: tuple[str, list[str]], tmp_path: Path
) -> None:
    path, _ = corpus
    url = str(tmp_path / "live")
    produce(path, url, producer_id="p0", epochs=1, **ARGS)
    with pytest.raises(ProduceError, match=r"dtype='uint16' \(now 'uint32'\)"):
        produce(path, url, producer_id="p0", epochs=1, dtype="uint32", **ARGS)
    summary = produce(path, url, producer_id="p0", epochs=1, dtype="uint16", **ARGS)
    assert summary.finished and summary.batches == 0  # resumed where it ended: nothing left


def test_a_record_without_a_dtype_stands_for_its_datasets(
    corpus: tuple[str, list[str]], tmp_path: Path
) -> None:
    path, _ = corpus
    url = str(tmp_path / "live")
    stopped = produce(path, url, producer_id="p0", dtype="uint32", stop=lambda: True, **ARGS)
    assert not stopped.finished
    key = Path(url) / record_key("p0")
    old = json.loads(key.read_bytes())
    del old["dtype"]  # as producers wrote it before dtypes were recorded
    key.write_text(json.dumps(old, indent=1) + "\n")
    with pytest.raises(ProduceError, match=r"dtype='uint32' \(now 'uint16'\)"):
        produce(path, url, producer_id="p0", epochs=1, dtype="uint16", **ARGS)
    resumed = produce(path, url, producer_id="p0", epochs=1, **ARGS)  # auto: the dataset's
    assert resumed.finished and resumed.dtype == "uint32" and resumed.resumed_at > 0


def test_auto_joins_an_existing_dataset_in_its_dtype(
    corpus: tuple[str, list[str]], tmp_path: Path
) -> None:
    path, _ = corpus
    url = str(tmp_path / "live")
    LiveProducer(url, "other", batch_size=B, seq_len=T).close()  # a uint32 dataset
    summary = produce(path, url, producer_id="p0", epochs=1, **ARGS)
    assert summary.dtype == "uint32" and record(url)["dtype"] == "uint32"
    with pytest.raises(Exception, match="holds uint32 tokens, not uint16"):
        produce(path, url, producer_id="p1", epochs=1, dtype="uint16", **ARGS)


def test_a_vocabulary_beyond_uint16_is_uint32_or_refused_up_front(
    corpus: tuple[str, list[str]], tmp_path: Path
) -> None:
    path, _ = corpus
    url = str(tmp_path / "live")
    with pytest.raises(IngestError, match="cannot hold every id of tokenizer 'wide'"):
        produce(
            path, url, producer_id="p0", epochs=1, tokenizer=WideTokenizer(), dtype="uint16", **ARGS
        )
    assert not (tmp_path / "live" / DESCRIPTOR_NAME).exists()
    s = produce(path, url, producer_id="p0", epochs=1, tokenizer=WideTokenizer(), **ARGS)
    assert s.dtype == "uint32" and "dtype" not in descriptor(url)
    uint16 = str(tmp_path / "u16")
    LiveProducer(uint16, "other", batch_size=B, seq_len=T, dtype="uint16").close()
    with pytest.raises(ProduceError, match=r"holds uint16 tokens .* vocabulary 100,277 ids"):
        produce(path, uint16, producer_id="p0", epochs=1, tokenizer=WideTokenizer(), **ARGS)


def test_token_files_choose_by_their_dtype_and_name_a_token_that_does_not_fit(
    tmp_path: Path,
) -> None:
    narrow = write_shard(tmp_path / "a.bin", np.arange(40 * T) % 50_000)
    s = produce(
        str(narrow), str(tmp_path / "n"), producer_id="p0", epochs=1, seq_len=T, batch_size=B
    )
    assert s.dtype == "uint16"
    tokens = np.arange(40 * T) % 50_000
    tokens[7 * T + 3] = 70_000
    (tmp_path / "wide").mkdir()
    wide = write_shard(tmp_path / "wide" / "b.bin", tokens, itemsize=4)
    s = produce(str(wide), str(tmp_path / "w"), producer_id="p0", epochs=1, seq_len=T, batch_size=B)
    assert s.dtype == "uint32"
    with pytest.raises(ProduceError, match=r"b\.bin.*id 70,000 does not fit this uint16"):
        produce(
            str(wide),
            str(tmp_path / "f"),
            producer_id="p0",
            epochs=1,
            seq_len=T,
            batch_size=B,
            dtype="uint16",
        )


def test_a_record_with_an_unknown_dtype_is_refused_naming_the_field() -> None:
    base = ProducerRecord(
        producer="p0",
        producers=1,
        index=0,
        inputs=(),
        tokenizer="byte",
        tokenizer_xxh3="0",
        mode="pack",
        bos_id=256,
        pad_id=None,
        text_field="text",
        per_line=False,
        align="contiguous",
        bos_token=None,
        unit_records=0,
        seq_len=T,
        batch_size=B,
        seed=0,
        batches_per_object=1,
        dtype="uint16",
    )
    data = json.loads(base.to_json())
    assert ProducerRecord.from_json(base.to_json(), "x") == base
    data["dtype"] = "int8"
    with pytest.raises(ProductionError, match="x: field 'dtype' is 'int8', not one of"):
        ProducerRecord.from_json(json.dumps(data).encode(), "x")
    del data["dtype"]
    assert ProducerRecord.from_json(json.dumps(data).encode(), "x").dtype is None


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        (["--dtype", "uint32"], "--dtype uint16 (now 'uint32')"),
        (["--seed", "7"], "--seed 0 (now 7)"),
        (["--seq-len", str(2 * T)], f"--seq-len {T} (now {2 * T})"),
    ],
)
def test_the_command_line_names_the_flag_a_restart_changes_and_exits_2(
    corpus: tuple[str, list[str]],
    tmp_path: Path,
    change: list[str],
    shown: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from zerobatch_core.cli.main import main

    path, _ = corpus
    url = str(tmp_path / "live")
    base = [
        "produce", path, url, "--producer-id", "p0", "--seq-len", str(T),
        "--batch-size", str(B), "--pad-id", str(PAD), "--epochs", "1",
    ]  # fmt: skip
    assert status(main, base) == 0
    again = [*base, *change] if change[0] != "--seq-len" else [*base[:5], *base[7:], *change]
    capsys.readouterr()
    assert status(main, again) == 2
    err = capsys.readouterr().err
    assert "producer p0 was started with another configuration" in err and shown in err


def status(main: Any, argv: list[str]) -> int:
    """``main``'s exit status, returned or raised."""
    try:
        return int(main(argv))
    except SystemExit as e:
        return int(e.code or 0)
