"""validate_file: reports instead of raising, and the deep padding check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from zerobatch_core import ErrorCode, validate_file


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
