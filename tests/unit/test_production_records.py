"""Production records (SPEC.md section 22): shares and unit orders, record round trips, and
every malformed field named with its record."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec.shuffle import DOMAIN_BLOCKS, permute

from zerobatch_core.live.production import (
    DOMAIN_UNITS,
    PADDING,
    BatchesRecord,
    Cursor,
    InputEntry,
    ProducerRecord,
    ProductionError,
    batches_key,
    create_record,
    parse_batches_key,
    read_batches,
    read_record,
    record_key,
    write_batches,
)
from zerobatch_core.stores.store import LocalStore

RECORD = ProducerRecord(
    producer="p-1",
    producers=3,
    index=1,
    inputs=(
        InputEntry("/data/a.parquet", "parquet", 1000, 4),
        InputEntry("/data/b.jsonl", "jsonl", 20, 1),
        InputEntry("/data/c.parquet", "parquet", 300, 5),
    ),
    tokenizer="byte",
    tokenizer_xxh3="0123456789abcdef",
    mode="pack",
    bos_id=256,
    pad_id=None,
    text_field="text",
    per_line=False,
    align="contiguous",
    bos_token=None,
    unit_records=0,
    seq_len=64,
    batch_size=8,
    seed=5,
    batches_per_object=16,
)


def test_shares_are_disjoint_cover_the_units_and_each_epoch_permutes_its_own() -> None:
    shares = [replace(RECORD, index=i).share() for i in range(3)]
    assert shares[1].tolist() == [1, 4, 7]
    assert sorted(np.concatenate(shares).tolist()) == list(range(RECORD.units))
    for epoch in range(4):
        order = RECORD.order(epoch)
        n = shares[1].size
        expected = [shares[1][permute(k, n, RECORD.seed ^ epoch, DOMAIN_UNITS)] for k in range(n)]
        assert order.tolist() == expected
        assert sorted(order.tolist()) == shares[1].tolist()
    assert DOMAIN_UNITS not in (1, 2, 3) and DOMAIN_BLOCKS == 2
    assert replace(RECORD, producers=20, index=19).order(0).size == 0


def test_locate_maps_units_to_files_and_parts() -> None:
    assert [RECORD.locate(u) for u in (0, 3, 4, 5, 9)] == [
        (RECORD.inputs[0], 0),
        (RECORD.inputs[0], 3),
        (RECORD.inputs[1], -1),
        (RECORD.inputs[2], 0),
        (RECORD.inputs[2], 4),
    ]
    with pytest.raises(ProductionError, match="unit 10 is not one of the 10 units"):
        RECORD.locate(10)


def test_records_round_trip_and_differences_name_each_field(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    assert read_record(store, "p-1") is None
    assert create_record(store, RECORD) == RECORD
    other = replace(RECORD, seq_len=128, tokenizer="hf:x.json")
    assert create_record(store, other) == RECORD  # the first one stays
    assert RECORD.differences(other) == [
        "tokenizer='byte' (now 'hf:x.json')",
        "seq_len=64 (now 128)",
    ]
    same_name = replace(RECORD, tokenizer_xxh3="fedcba9876543210")
    assert RECORD.differences(same_name) == [
        "tokenizer 'byte' (now another tokenizer of that name)"
    ]
    files = replace(
        RECORD, inputs=(*RECORD.inputs[:2], InputEntry("/data/c.parquet", "parquet", 301, 5))
    )
    assert RECORD.differences(files) == [
        "inputs: /data/c.parquet (300 bytes, 5 units) (now /data/c.parquet, 301 bytes, 5 units)"
    ]
    assert RECORD.differences(replace(RECORD, inputs=RECORD.inputs[:1])) == [
        "inputs: 3 files (now 1)"
    ]
    rows = np.array([[0, 4, 2, 7], [PADDING] * 4], dtype=np.int64)
    written = BatchesRecord("p-1", 3, 5, Cursor(1, 2, 3, 4), np.repeat(rows, 8, axis=0))
    write_batches(store, written)
    found = read_batches(store, "p-1", 5, 8)
    assert found is not None and (found.first, found.end, found.next) == (3, 5, Cursor(1, 2, 3, 4))
    assert np.array_equal(found.rows, written.rows)
    assert read_batches(store, "p-1", 6, 8) is None
    with pytest.raises(ProductionError, match=r"holds 64 integers, expected 32"):
        read_batches(store, "p-1", 5, 4)


def test_object_record_keys_parse_back() -> None:
    assert parse_batches_key(batches_key("p-1", 42)) == ("p-1", 42)
    for key in (
        record_key("p-1"),
        "production/p-1/42.json",
        "production/p 1/00000000000000000042.json",
        "production/p-1/00000000000000000042.json.tmp",
        "batches/p-1/00000000000000000042.json",
        "production/p-1/x/00000000000000000042.json",
        "production/p-1/0000000000000000004x.json",
    ):
        assert parse_batches_key(key) is None, key


def _record_doc() -> dict[str, Any]:
    return json.loads(RECORD.to_json())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "x"}, "field 'format' is 'x', not 'zerobatch.produce'"),
        ({"version": 2}, "field 'version' is 2; this reader knows version 1"),
        ({"producers": 0}, r"field 'producers' is 0, not in \[1, 2\*\*64\)"),
        ({"index": 3}, r"field 'index' is 3, not below 'producers' \(3\)"),
        ({"seq_len": "64"}, "field 'seq_len' is str, expected int"),
        ({"per_line": 0}, "field 'per_line' is int, expected bool"),
        ({"seed": True}, "field 'seed' is bool, expected int"),
        ({"pad_id": -1}, r"field 'pad_id' is -1, not in \[0, 2\*\*64\)"),
        ({"inputs": [1]}, r"inputs\[0\] is not an object"),
        (
            {"inputs": [{"path": "a", "format": "parquet", "bytes": 1}]},
            r"inputs\[0\]: field 'units' is missing",
        ),
        ({"tokenizer": None}, "field 'tokenizer' is NoneType, expected str"),
    ],
)
def test_a_malformed_producer_record_is_named(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    store = LocalStore(str(tmp_path))
    doc = {**_record_doc(), **change}
    store.write(record_key("p-1"), json.dumps(doc).encode())
    with pytest.raises(ProductionError, match=rf"producer\.json: {message}"):
        read_record(store, "p-1")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff", "not JSON"),
        (b"[1]", "expected a JSON object, got list"),
        (b"[" * 100_000, "not JSON: nested too deeply"),
        (b'{"format": "zerobatch.produce", "version": 1}', "field 'inputs' is missing"),
    ],
)
def test_unreadable_records_are_named(tmp_path: Path, data: bytes, message: str) -> None:
    store = LocalStore(str(tmp_path))
    store.write(record_key("p-1"), data)
    with pytest.raises(ProductionError, match=message):
        read_record(store, "p-1")


def test_a_record_of_another_producer_or_offset_is_refused(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    store.write(record_key("p-2"), RECORD.to_json())
    with pytest.raises(ProductionError, match="field 'producer' is 'p-1', not 'p-2'"):
        read_record(store, "p-2")
    rows = np.zeros((8, 4), dtype=np.int64)
    store.write(
        batches_key("p-1", 9), BatchesRecord("p-1", 3, 4, Cursor(0, 0, 0, 0), rows).to_json()
    )
    with pytest.raises(ProductionError, match="up to offset 4, not 'p-1' up to 9"):
        read_batches(store, "p-1", 9, 8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"first": 5}, r"'end' \(5\) is not after 'first' \(5\)"),
        ({"next": [0, 0, 0]}, "field 'next' is not four integers >= 0"),
        ({"next": [0, 0, -1, 0]}, "field 'next' is not four integers >= 0"),
        ({"rows": [0] * 31 + [-2]}, "a value that is not an integer >= -1"),
        ({"rows": [0] * 31 + [True]}, "a value that is not an integer >= -1"),
        ({"format": "zerobatch.produce"}, "not 'zerobatch.produce.batches'"),
    ],
)
def test_a_malformed_object_record_is_named(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    store = LocalStore(str(tmp_path))
    rows = np.zeros((8, 4), dtype=np.int64)
    doc = json.loads(BatchesRecord("p-1", 4, 5, Cursor(0, 0, 0, 0), rows).to_json())
    store.write(batches_key("p-1", 5), json.dumps({**doc, **change}).encode())
    with pytest.raises(ProductionError, match=message):
        read_batches(store, "p-1", 5, 8)


def test_an_oversized_record_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: Any) -> None:
    from zerobatch_core.live import production

    store = LocalStore(str(tmp_path))
    store.write(record_key("p-1"), RECORD.to_json())
    monkeypatch.setattr(production, "MAX_RECORD_BYTES", 100)
    with pytest.raises(ProductionError, match="more than the 100 a production record may hold"):
        read_record(store, "p-1")


def test_pinned_values_of_the_records() -> None:
    """The values SPEC.md section 22 fixes: the domain tag, the record limit, the start."""
    from zerobatch_core.live.production import MAX_RECORD_BYTES, START

    assert DOMAIN_UNITS == 4 and MAX_RECORD_BYTES == 64 * 2**20
    assert Cursor(0, 0, 0, 0) == START
    whole = replace(RECORD, producers=1, index=0)  # seed 5, units 0..9
    assert whole.order(0).tolist() == [7, 3, 8, 5, 4, 2, 0, 9, 6, 1]
    assert whole.order(1).tolist() == [7, 1, 3, 5, 4, 2, 8, 0, 6, 9]


def test_records_are_values() -> None:
    import dataclasses

    rows = np.zeros((1, 4), dtype=np.int64)
    for value, name in (
        (RECORD, "seed"),
        (RECORD.inputs[0], "path"),
        (Cursor(0, 0, 0, 0), "token"),
        (BatchesRecord("p", 0, 1, Cursor(0, 0, 0, 0), rows), "end"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, 1)


def test_the_producer_record_bytes_are_fixed() -> None:
    """Two lives of a producer write the same ``producer.json``: one layout, UTF-8 kept."""
    record = replace(RECORD, inputs=(InputEntry("/data/é.parquet", "parquet", 1, 1),))
    data = record.to_json()
    assert data.startswith(b'{\n "format": "zerobatch.produce",\n "version": 1,\n')
    assert '"path": "/data/é.parquet"'.encode() in data and data.endswith(b"}\n")


@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [
        ("seq_len", 0, False),
        ("seq_len", 1, True),
        ("batch_size", 0, False),
        ("batch_size", 1, True),
        ("batches_per_object", 0, False),
        ("batches_per_object", 1, True),
        ("seed", 2**64 - 1, True),
        ("seed", 2**64, False),
    ],
)
def test_field_bounds(tmp_path: Path, field: str, value: int, ok: bool) -> None:
    store = LocalStore(str(tmp_path))
    store.write(record_key("p-1"), json.dumps({**_record_doc(), field: value}).encode())
    if ok:
        found = read_record(store, "p-1")
        assert found is not None and getattr(found, field) == value
    else:
        with pytest.raises(ProductionError, match=rf"field '{field}' is {value}, not in"):
            read_record(store, "p-1")


def test_the_record_limit_is_inclusive(tmp_path: Path, monkeypatch: Any) -> None:
    from zerobatch_core.live import production

    store = LocalStore(str(tmp_path))
    data = RECORD.to_json()
    store.write(record_key("p-1"), data)
    monkeypatch.setattr(production, "MAX_RECORD_BYTES", len(data))
    assert read_record(store, "p-1") == RECORD
    monkeypatch.setattr(production, "MAX_RECORD_BYTES", len(data) - 1)
    with pytest.raises(ProductionError, match="more than the"):
        read_record(store, "p-1")


def test_a_short_rows_field_says_what_it_should_hold(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    rows = np.zeros((3 * 8, 4), dtype=np.int64)
    doc = json.loads(BatchesRecord("p-1", 4, 7, Cursor(0, 0, 0, 0), rows).to_json())
    store.write(batches_key("p-1", 7), json.dumps({**doc, "rows": doc["rows"][:-4]}).encode())
    with pytest.raises(ProductionError, match=r"expected 96 \(4 per row of 3 batches of 8 rows\)"):
        read_batches(store, "p-1", 7, 8)
