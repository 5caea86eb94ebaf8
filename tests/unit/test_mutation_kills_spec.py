"""Format-reference (``zerobatch_spec``) behaviours that mutation testing found unpinned
(tests/README.md)."""

from __future__ import annotations

import dataclasses

import pytest
from zerobatch_spec import HEADER_SIZE, RESERVED_OFFSET, Header, build_header
from zerobatch_spec.rules import ErrorCode, Violation, find_violation


def test_a_header_is_an_immutable_value() -> None:
    header = Header(batch_size=4, seq_len=8, num_batches=2, seed=1, total_records=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        header.seed = 2  # type: ignore[misc]


def valid_header() -> bytes:
    return build_header(Header(batch_size=4, seq_len=8, num_batches=1, seed=1, total_records=4))


def test_a_violation_is_an_immutable_value() -> None:
    violation = Violation(ErrorCode.BAD_MAGIC, "magic", "detail")
    with pytest.raises(dataclasses.FrozenInstanceError):
        violation.field = "other"  # type: ignore[misc]


def test_a_whole_header_in_a_file_too_short_for_it_is_a_truncated_header() -> None:
    found = find_violation(valid_header(), 100)
    assert found is not None and (found.code, found.detail) == (
        ErrorCode.TRUNCATED_HEADER,
        f"file is 100 bytes; the header alone needs {HEADER_SIZE}",
    )


def test_nonzero_reserved_names_the_byte_and_the_reserved_range() -> None:
    data = bytearray(valid_header())
    data[RESERVED_OFFSET + 5] = 1
    found = find_violation(bytes(data), HEADER_SIZE + 4096)
    assert found is not None and found.detail == (
        f"byte {RESERVED_OFFSET + 5} is 0x01; bytes {RESERVED_OFFSET}..4095 must be zero"
    )
