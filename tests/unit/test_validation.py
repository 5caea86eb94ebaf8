"""validate_file: reports instead of raising, and the deep padding check."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import records
from zerobatch_core import ErrorCode, validate_file, write_batch_file
from zerobatch_core.files import validation


def test_valid_report(make_file: Callable[..., Path]) -> None:
    report = validate_file(make_file(), deep=True)
    assert report.valid and report.code is None and report.header is not None
    d = report.as_dict()
    assert d["valid"] and d["header"]["num_batches"] == 10 and d["deep"]


def test_shallow_misses_padding_deep_finds_it(make_file: Callable[..., Path]) -> None:
    path = make_file(n=12, seq_len=5, batch_size=3)  # 60-byte batches in 4096-byte slots
    data = bytearray(path.read_bytes())
    data[4096 + 3 * 4096 + 60 + 17] = 0x42  # batch 3, slot byte 77
    path.write_bytes(bytes(data))
    assert validate_file(path).valid
    report = validate_file(path, deep=True)
    assert not report.valid and report.code is ErrorCode.NONZERO_PADDING
    assert report.detail is not None and "batch 3" in report.detail and "byte 77" in report.detail


def test_invalid_file_is_a_report(tmp_path: Path) -> None:
    p = tmp_path / "x.batch"
    p.write_bytes(b"LLMBATCH")
    report = validate_file(p)
    assert not report.valid and report.code is ErrorCode.TRUNCATED_HEADER
    assert report.as_dict()["error"]["code"] == "truncated_header"


def test_unreadable_path_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        validate_file(tmp_path / "missing.batch")


@pytest.mark.parametrize(
    ("bad_batch", "chunk_batches"),
    [(9, 2), (10, 2), (11, 2), (7, 3), (0, 2), (11, 1)],
)
def test_deep_check_names_the_batch_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad_batch: int, chunk_batches: int
) -> None:
    """With chunks much smaller than the file, the reported batch is the file's batch index.

    12 batches of 4096-byte slots scanned ``chunk_batches`` at a time: a batch number taken
    relative to its chunk (the chunk base dropped) would name a batch of the first chunk.
    """
    monkeypatch.setattr(validation, "DEEP_CHUNK_BYTES", chunk_batches * 4096)
    path = tmp_path / "late.batch"
    write_batch_file(path, records(36, 5), batch_size=3, seed=1)  # 60 token bytes per slot
    data = bytearray(path.read_bytes())
    assert len(data) == 4096 * 13
    data[4096 * (1 + bad_batch) + 60 + 33] = 0x07
    path.write_bytes(bytes(data))
    report = validate_file(path, deep=True)
    assert not report.valid and report.code is ErrorCode.NONZERO_PADDING
    assert report.detail is not None
    assert report.detail.startswith(f"batch {bad_batch}: slot byte 93 is 0x07"), report.detail


SHRINKING_DEEP_READ = r"""
import os, sys
from zerobatch_core import BatchFileReader, validate_file
from zerobatch_core.files import validation
validation.DEEP_CHUNK_BYTES = 2 * 4096  # 8 batches of one page each: four chunks
original = BatchFileReader.slot_padding

def shrink_after_first_chunk(self, start, stop):
    if start == 0:
        os.truncate(self.path, 4096 * 5)  # batches 0..3 stay, 4..7 are gone
    return original(self, start, stop)

BatchFileReader.slot_padding = shrink_after_first_chunk
report = validate_file(sys.argv[1], deep=True)
print(report.code)
print(report.detail)
"""


def test_deep_check_reports_a_file_that_shrinks_during_the_read(tmp_path: Path) -> None:
    """A file truncated between two chunks of the deep read is ``size_mismatch``, not a crash.

    The truncation happens while the first chunk is being scanned (through a wrapper around
    the reader's own ``slot_padding``) and keeps that chunk's pages, so only the size check
    before the next chunk can notice it; without it the scan touches a lost page (SIGBUS),
    which is why this runs in a child process.
    """
    path = tmp_path / "shrinks.batch"
    write_batch_file(path, records(24, 5), batch_size=3, seed=1)  # 8 batches
    proc = subprocess.run(
        [sys.executable, "-c", SHRINKING_DEEP_READ, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    code, detail = proc.stdout.splitlines()[:2]
    assert code == "size_mismatch"
    assert "20480 bytes now" in detail and f"requires {4096 * 9}" in detail


def test_not_a_regular_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="not a regular file"):
        validate_file(tmp_path)
