"""``validate_dataset``: every failure of a dataset, named by shard and slot, in the core and CLI.

The shallow check covers the manifest, the checksums file and every shard against the manifest
(present, size, file rules 1-8, header fields and digest), plus ``extra_shard``; ``deep`` adds
every slot's checksum and padding. Failures are listed, not just the first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from zerobatch_spec import HEADER_SIZE, padded_batch_bytes, raw_batch_bytes
from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME

from tests.helpers import records
from zerobatch_core import (
    DatasetError,
    DatasetReader,
    DatasetReport,
    ZeroBatchIOError,
    validate_dataset,
    write_batch_file,
    write_sharded_dataset,
)
from zerobatch_core.cli import main

B, T = 4, 5  # 80 token bytes in a 4096-byte slot: padding to corrupt
SLOT = padded_batch_bytes(B, T)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """4 shards of 3 batches: 12 slots."""
    out = tmp_path / "ds"
    write_sharded_dataset(out, [records(48, T)], batch_size=B, seq_len=T, shard_batches=3, seed=2)
    return out


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


def codes(report: DatasetReport) -> list[tuple[str, str | None, int | None]]:
    return [(f.code, f.shard, f.slot) for f in report.failures]


def test_a_valid_dataset(dataset: Path) -> None:
    for deep in (False, True):
        report = validate_dataset(dataset, deep=deep)
        assert report.valid and report.failures == () and report.shards_checked == 4
        assert report.slots_checked == (12 if deep else 0)
        assert report.as_dict()["dataset"]["num_batches"] == 12


def test_deep_lists_every_corrupted_slot_and_padding_byte(dataset: Path) -> None:
    flip(dataset / "shard-00001.batch", HEADER_SIZE + 2 * SLOT + 7)  # slot 2 tokens
    flip(dataset / "shard-00003.batch", HEADER_SIZE + 0 * SLOT + 3)  # slot 0 tokens
    flip(dataset / "shard-00003.batch", HEADER_SIZE + 1 * SLOT + raw_batch_bytes(B, T) + 9)
    assert validate_dataset(dataset).valid  # the shallow check reads no slot
    report = validate_dataset(dataset, deep=True)
    assert codes(report) == [
        ("checksum_mismatch", "shard-00001.batch", 2),
        ("checksum_mismatch", "shard-00003.batch", 0),
        ("nonzero_padding", "shard-00003.batch", 1),
        ("checksum_mismatch", "shard-00003.batch", 1),  # the checksum covers the padding
    ]
    assert [f.dataset_slot for f in report.failures] == [5, 9, 10, 10]
    pad = report.failures[2]
    assert f"slot byte {raw_batch_bytes(B, T) + 9}" in pad.detail
    assert "shard-00003.batch slot 1 (dataset slot 10): nonzero_padding" in str(pad)


def test_shard_failures_each_name_their_shard(dataset: Path, tmp_path: Path) -> None:
    (dataset / "shard-00000.batch").unlink()
    resized = dataset / "shard-00001.batch"
    resized.write_bytes(resized.read_bytes()[:-100])
    write_batch_file(dataset / "shard-00002.batch", records(12, T), B, seed=1, overwrite=True)
    flip(dataset / "shard-00003.batch", 0)  # the magic
    write_batch_file(dataset / "stray.batch", records(4, T), B)
    report = validate_dataset(dataset)
    assert codes(report) == [
        ("shard_missing", "shard-00000.batch", None),
        ("shard_size_mismatch", "shard-00001.batch", None),
        ("size_mismatch", "shard-00001.batch", None),  # the file's own rule 7, too
        ("shard_header_mismatch", "shard-00002.batch", None),
        ("bad_magic", "shard-00003.batch", None),
        ("extra_shard", "stray.batch", None),
    ]
    assert report.shards_checked == 0 and not report.valid
    assert validate_dataset(dataset, deep=True).failures == report.failures  # nothing to read


def test_a_broken_checksums_file_still_checks_padding(dataset: Path) -> None:
    path = dataset / CHECKSUMS_NAME
    path.write_bytes(path.read_bytes()[:-8])
    flip(dataset / "shard-00002.batch", HEADER_SIZE + raw_batch_bytes(B, T) + 1)
    assert codes(validate_dataset(dataset)) == [("checksums_mismatch", None, None)]
    assert codes(validate_dataset(dataset, deep=True)) == [
        ("checksums_mismatch", None, None),
        ("nonzero_padding", "shard-00002.batch", 0),
    ]
    path.unlink()
    path.mkdir()  # not a file at all: the same failure, not an OSError
    (failure,) = validate_dataset(dataset).failures
    assert (failure.code, failure.where) == ("checksums_mismatch", CHECKSUMS_NAME)


def test_a_broken_manifest_is_the_one_failure(dataset: Path, tmp_path: Path) -> None:
    manifest = json.loads((dataset / MANIFEST_NAME).read_text())
    manifest["shards"][1]["size"] = 5
    (dataset / MANIFEST_NAME).write_text(json.dumps(manifest))
    report = validate_dataset(dataset, deep=True)
    assert [(f.code, f.where) for f in report.failures] == [
        ("manifest_bad_field", "shards[1].size")
    ]
    assert report.manifest is None and report.as_dict()["valid"] is False
    with pytest.raises(ZeroBatchIOError, match=r"no manifest\.json"):
        validate_dataset(tmp_path)
    with pytest.raises(ZeroBatchIOError, match="not a dataset directory"):
        validate_dataset(dataset / MANIFEST_NAME)


def test_the_cli_prints_every_failure_and_exits_1(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(dataset), "--deep"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK {dataset}: dataset of 4 shards, 12 batches of [{B}, {T}]")
    flip(dataset / "shard-00001.batch", HEADER_SIZE + 4)
    flip(dataset / "shard-00002.batch", HEADER_SIZE + SLOT + 4)
    assert main(["validate", str(dataset)]) == 0
    capsys.readouterr()
    assert main(["validate", "--deep", str(dataset)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"INVALID {dataset}: 2 failures"
    assert lines[1].startswith("  shard-00001.batch slot 0 (dataset slot 3): checksum_mismatch")
    assert lines[2].startswith("  shard-00002.batch slot 1 (dataset slot 7): checksum_mismatch")
    assert main(["validate", "--deep", "--json", str(dataset)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(f["shard"], f["slot"]) for f in report["failures"]] == [
        ("shard-00001.batch", 0),
        ("shard-00002.batch", 1),
    ]
    assert report["valid"] is False and report["slots_checked"] == 12
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["validate", str(empty)]) == 2
    assert "zerobatch dataset create" in capsys.readouterr().err


def test_what_validate_finds_the_loader_refuses(dataset: Path) -> None:
    flip(dataset / "shard-00002.batch", HEADER_SIZE + SLOT + 4)
    failure = validate_dataset(dataset, deep=True).failures[0]
    assert (failure.shard, failure.slot, failure.dataset_slot) == ("shard-00002.batch", 1, 7)
    reader = DatasetReader(dataset, verify="always")
    with (
        reader,
        pytest.raises(DatasetError, match=r"shard-00002\.batch.*checksum_mismatch.*slot 1"),
    ):
        reader.read_batch(7)
