"""Datasets of uint16 shards, checksums over uint16 slots, and what ``inspect``, ``validate``
and ``trace`` say about dtype 1 files and datasets.

The uint16 files and datasets are spec twins of uint32 ones (``tests/narrow.py``): their
shard sizes, header digests and slot checksums are computed from ``SPEC.md``'s layout.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import HEADER_SIZE, padded_batch_bytes, raw_batch_bytes

from tests.helpers import records
from tests.narrow import narrow_dataset, narrow_file
from tests.unit.conftest import Run
from zerobatch_core import (
    BatchFileReader,
    BatchNativeLoader,
    DatasetError,
    DatasetReader,
    write_batch_file,
    write_sharded_dataset,
)
from zerobatch_core.datasets.validation import validate_dataset
from zerobatch_core.delivery.provenance import trace_step
from zerobatch_core.files.validation import validate_file

B, T = 4, 8  # 64 token bytes in a 4096-byte slot: a uint32 shard has a uint16 shard's size
U16 = np.dtype("<u2")


@pytest.fixture
def datasets(tmp_path: Path) -> tuple[Path, Path]:
    wide = tmp_path / "ds32"
    write_sharded_dataset(wide, [records(50, T)], batch_size=B, seq_len=T, shard_batches=4, seed=6)
    return wide, narrow_dataset(wide, tmp_path / "ds16")


def test_a_dataset_of_uint16_shards_reads_as_uint16(datasets: tuple[Path, Path]) -> None:
    wide, narrow = datasets
    with DatasetReader(narrow, verify="always") as n16, DatasetReader(wide) as n32:
        assert (n16.dtype, n16.token_dtype, n32.dtype) == (1, U16, 0)
        assert "dtype=uint16" in repr(n16)
        for i in range(n32.num_batches):
            batch = n16.read_batch(i)
            assert batch.dtype == U16
            np.testing.assert_array_equal(batch, n32.read_batch(i))
    manifest = json.loads((narrow / "manifest.json").read_text())
    assert manifest["dtype"] == 1 and "dtype" not in json.loads(
        (wide / "manifest.json").read_text()
    )


def test_a_shard_of_another_dtype_is_refused_by_name(datasets: tuple[Path, Path]) -> None:
    wide, narrow = datasets
    # The uint32 shard has the uint16 shard's size (one 4096-byte slot per batch either way).
    assert (wide / "shard-00001.batch").stat().st_size == (
        narrow / "shard-00001.batch"
    ).stat().st_size
    shutil.copy(wide / "shard-00001.batch", narrow / "shard-00001.batch")
    with DatasetReader(narrow) as reader:
        reader.read_batch(0)  # shard 0 is fine
        with pytest.raises(DatasetError) as raised:
            reader.read_batch(4)
    e = raised.value
    assert e.code.value == "shard_header_mismatch" and e.where == "shard-00001.batch"
    assert "header dtype 0 (uint32); the manifest says 1 (uint16)" in str(e)
    report = validate_dataset(narrow)
    assert [(f.code, f.shard) for f in report.failures] == [
        ("shard_header_mismatch", "shard-00001.batch")
    ]


@pytest.mark.parametrize("where", ["tokens", "padding"])
def test_checksums_cover_a_uint16_slots_bytes(datasets: tuple[Path, Path], where: str) -> None:
    _, narrow = datasets
    shard = narrow / "shard-00002.batch"
    data = bytearray(shard.read_bytes())
    slot = HEADER_SIZE + 1 * padded_batch_bytes(B, T, 1)  # its slot 1: dataset slot 9
    offset = 7 if where == "tokens" else raw_batch_bytes(B, T, 1) + 3
    data[slot + offset] ^= 0x40
    shard.write_bytes(bytes(data))
    with DatasetReader(narrow, verify="first") as reader:
        reader.read_batch(8)
        with pytest.raises(DatasetError, match=r"checksum_mismatch: shard-00002\.batch: slot 1 "):
            reader.read_batch(9)
    with DatasetReader(narrow, verify="off") as reader:
        reader.read_batch(9)  # not checked: served as stored
    report = validate_dataset(narrow, deep=True)
    codes = [(f.code, f.shard, f.slot, f.dataset_slot) for f in report.failures]
    mismatch = ("checksum_mismatch", "shard-00002.batch", 1, 9)
    if where == "tokens":
        assert codes == [mismatch]
    else:
        assert codes == [("nonzero_padding", "shard-00002.batch", 1, 9), mismatch]
        detail = report.failures[0].detail
        assert f"slot byte {raw_batch_bytes(B, T, 1) + 3} is 0x40" in detail
        assert f"slot bytes {B * T * 2}..4095 must be zero" in detail


def test_deep_validation_of_a_uint16_file_names_the_padding_byte(tmp_path: Path) -> None:
    wide, narrow = tmp_path / "w.batch", tmp_path / "n.batch"
    write_batch_file(wide, records(40, 5), 3, seed=1)  # 30 token bytes of 4096 per slot
    narrow_file(wide, narrow)
    assert validate_file(narrow, deep=True).valid
    data = bytearray(narrow.read_bytes())
    data[HEADER_SIZE + 2 * 4096 + 30 + 11] = 0x7F
    narrow.write_bytes(bytes(data))
    report = validate_file(narrow, deep=True)
    assert not report.valid and report.code is not None and report.code.value == "nonzero_padding"
    assert report.detail == "batch 2: slot byte 41 is 0x7f; slot bytes 30..4095 must be zero"
    assert validate_file(narrow).valid  # padding is read only by the deep check


def test_inspect_and_validate_name_the_dtype(
    datasets: tuple[Path, Path], tmp_path: Path, run: Callable[..., Run]
) -> None:
    wide, narrow = datasets
    file16 = tmp_path / "f16.batch"
    narrow_file(wide / "shard-00000.batch", file16)
    for path in (file16, narrow):
        r = run("inspect", path)
        assert r.status == 0 and re.search(r"^dtype\s+1 \(uint16\)$", r.out, flags=re.M), r.out
        info = json.loads(run("inspect", path, "--json").out)
        assert (info["dtype"], info["dtype_name"], info["padded_batch_bytes"]) == (
            1,
            "uint16",
            4096,
        )
    assert json.loads(run("inspect", file16, "--json").out)["raw_batch_bytes"] == B * T * 2
    r = run("inspect", wide)
    assert re.search(r"^dtype\s+0 \(uint32\)$", r.out, flags=re.M), r.out
    r = run("validate", narrow, "--deep")
    assert r.status == 0 and f"of [{B}, {T}] uint16 (checked:" in r.out, r.out
    assert json.loads(run("validate", narrow, "--json").out)["dataset"]["dtype"] == 1
    r = run("validate", file16, "--deep")
    assert r.status == 0 and f"of [{B}, {T}] uint16 (header, size and padding" in r.out, r.out


def test_a_trace_names_the_stored_dtype(datasets: tuple[Path, Path]) -> None:
    wide, narrow = datasets
    a, b = trace_step(wide, 3, seed=1), trace_step(narrow, 3, seed=1)
    assert (a.dtype, b.dtype) == ("uint32", "uint16")
    assert a.as_dict()["dtype"] == "uint32" and b.as_dict()["dtype"] == "uint16"
    assert "global batch 4 of uint16 tokens" in b.lines()[0]
    assert [p.as_dict() for p in a.pieces] == [p.as_dict() for p in b.pieces]
    # The rows the trace names are the ones the loader serves at that step.
    loader = BatchNativeLoader(narrow, seed=1)
    with BatchFileReader(narrow / b.pieces[0].shard) as shard:  # type: ignore[operator]
        np.testing.assert_array_equal(list(loader)[3], shard.read_batch(b.pieces[0].slot))
