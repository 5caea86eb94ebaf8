"""Every validation rule: its code, the field it names, and the order rules are applied in."""

from __future__ import annotations

from pathlib import Path

import pytest
from zerobatch_spec import (
    DTYPE_UINT16,
    DTYPE_UINT32,
    RULES,
    U32_MAX,
    Header,
    build_header,
    find_violation,
)

from zerobatch_core import BatchFileReader, ErrorCode, FormatError

GOOD = Header(batch_size=2, seq_len=4, num_batches=2, seed=1, total_records=5)
BODY = bytes(2 * 4096)


def mutate(offset: int, value: bytes, header: Header = GOOD) -> bytes:
    data = bytearray(build_header(header))
    data[offset : offset + len(value)] = value
    return bytes(data)


CASES = [
    (b"", ErrorCode.TRUNCATED_HEADER, "header"),
    (build_header(GOOD)[:4095], ErrorCode.TRUNCATED_HEADER, "header"),
    (mutate(0, b"LLMBATCX") + BODY, ErrorCode.BAD_MAGIC, "magic"),
    (mutate(8, (2).to_bytes(4, "little")) + BODY, ErrorCode.UNSUPPORTED_VERSION, "version"),
    (mutate(28, (2).to_bytes(4, "little")) + BODY, ErrorCode.UNSUPPORTED_DTYPE, "dtype"),
    (mutate(12, bytes(4)) + BODY, ErrorCode.INVALID_SHAPE, "batch_size"),
    (mutate(16, bytes(4)) + BODY, ErrorCode.INVALID_SHAPE, "seq_len"),
    (mutate(4095, b"\x01") + BODY, ErrorCode.NONZERO_RESERVED, "reserved"),
    (build_header(GOOD) + BODY[:-1], ErrorCode.SIZE_MISMATCH, "num_batches"),
    (build_header(GOOD) + BODY + b"\0", ErrorCode.SIZE_MISMATCH, "num_batches"),
    (mutate(20, (2**64 - 1).to_bytes(8, "little")) + BODY, ErrorCode.SIZE_MISMATCH, "num_batches"),
    (build_header(Header(2, 4, 2, 1, 3)) + BODY, ErrorCode.RECORD_COUNT_MISMATCH, "total_records"),
]


@pytest.mark.parametrize(("data", "code", "field"), CASES)
def test_each_rule_reports_its_code_and_field(
    tmp_path: Path, data: bytes, code: ErrorCode, field: str
) -> None:
    path = tmp_path / "broken.batch"
    path.write_bytes(data)
    with pytest.raises(FormatError) as info:
        BatchFileReader(path)
    err = info.value
    assert err.code is code
    assert err.field == field
    assert err.path == str(path)
    assert str(path) in str(err) and code.value in str(err) and field in str(err)


def test_every_header_rule_has_a_case() -> None:
    assert {c for _, c, _ in CASES} == set(RULES)


def test_valid_header_has_no_violation() -> None:
    assert find_violation(build_header(GOOD) + BODY, 4096 + len(BODY)) is None


def test_first_broken_rule_wins() -> None:
    # bad version, bad dtype, zero batch size, reserved byte, wrong size all at once
    data = bytearray(build_header(Header(0, 4, 9, 1, 0, version=3, dtype=5)))
    data[100] = 1
    v = find_violation(bytes(data), 4096)
    assert v is not None and v.code is ErrorCode.UNSUPPORTED_VERSION


def test_overflowing_count_that_wraps_to_the_real_size_is_rejected() -> None:
    wrap = (1 << 52) + 2  # wrap * 4096 == 2 * 4096 (mod 2**64)
    data = build_header(Header(2, 4, wrap, 1, 2**32 - 1)) + BODY
    v = find_violation(data, len(data))
    assert v is not None and v.code is ErrorCode.SIZE_MISMATCH


def test_messages_state_expected_and_actual() -> None:
    v = find_violation(build_header(GOOD) + BODY[:-1], 4096 + len(BODY) - 1)
    assert v is not None
    assert str(4096 + len(BODY) - 1) in v.detail and str(4096 + len(BODY)) in v.detail


# -- dtype 1 (uint16 tokens) --------------------------------------------------------------

# 2 x 2048 uint16 tokens: 8192 bytes, exactly two pages per slot (a uint32 slot would be four).
GOOD16 = Header(batch_size=2, seq_len=2048, num_batches=2, seed=1, total_records=5, dtype=1)
BODY16 = bytes(2 * 8192)


def mutate16(offset: int, value: bytes, header: Header = GOOD16) -> bytes:
    return mutate(offset, value, header)


CASES16 = [
    (build_header(GOOD16)[:4095], ErrorCode.TRUNCATED_HEADER, "header"),
    (mutate16(0, b"llmbatch") + BODY16, ErrorCode.BAD_MAGIC, "magic"),
    (mutate16(8, (0).to_bytes(4, "little")) + BODY16, ErrorCode.UNSUPPORTED_VERSION, "version"),
    (mutate16(16, bytes(4)) + BODY16, ErrorCode.INVALID_SHAPE, "seq_len"),
    (mutate16(40, b"\x01") + BODY16, ErrorCode.NONZERO_RESERVED, "reserved"),
    (build_header(GOOD16) + BODY16[:-1], ErrorCode.SIZE_MISMATCH, "num_batches"),
    # the same header over uint32-sized slots: four pages each, not two
    (build_header(GOOD16) + bytes(2 * 16384), ErrorCode.SIZE_MISMATCH, "num_batches"),
    # 2^64 / 8192 + 2 slots: the product with the slot size wraps to this file's 2 slots
    (
        build_header(Header(2, 2048, 2**51 + 2, 1, U32_MAX, dtype=1)) + BODY16,
        ErrorCode.SIZE_MISMATCH,
        "num_batches",
    ),
    (
        build_header(Header(2, 2048, 2, 1, 3, dtype=1)) + BODY16,
        ErrorCode.RECORD_COUNT_MISMATCH,
        "total_records",
    ),
]


@pytest.mark.parametrize(("data", "code", "field"), CASES16)
def test_each_rule_reports_its_code_and_field_for_uint16_files(
    tmp_path: Path, data: bytes, code: ErrorCode, field: str
) -> None:
    path = tmp_path / "broken.batch"
    path.write_bytes(data)
    with pytest.raises(FormatError) as info:
        BatchFileReader(path)
    assert (info.value.code, info.value.field) == (code, field)


def test_uint16_header_is_valid_at_its_own_size_only() -> None:
    assert find_violation(build_header(GOOD16) + BODY16, 4096 + len(BODY16)) is None
    # The uint32 header of the same shape needs twice the slot bytes.
    as_u32 = Header(2, 2048, 2, 1, 5, dtype=DTYPE_UINT32)
    v = find_violation(build_header(as_u32) + BODY16, 4096 + len(BODY16))
    assert v is not None and v.code is ErrorCode.SIZE_MISMATCH
    assert str(4096 + 2 * 16384) in v.detail
    assert find_violation(build_header(as_u32), 4096 + 2 * 16384) is None


@pytest.mark.parametrize("dtype", [DTYPE_UINT32, DTYPE_UINT16])
def test_defined_dtype_codes_pass_rule_4(dtype: int) -> None:
    header = Header(3, 5, 1, 0, 3, dtype=dtype)  # one page a slot for either code
    assert find_violation(build_header(header) + bytes(4096), 8192) is None


@pytest.mark.parametrize("dtype", [2, 3, 16, 2**31, U32_MAX - 1, U32_MAX])
def test_undefined_dtype_codes_fail_rule_4(dtype: int) -> None:
    header = Header(3, 5, 1, 0, 3, dtype=dtype)
    v = find_violation(build_header(header) + bytes(4096), 8192)
    assert v is not None and v.code is ErrorCode.UNSUPPORTED_DTYPE and v.field == "dtype"
    assert str(dtype) in v.detail and "uint16" in v.detail and "uint32" in v.detail


def test_uint16_rule_order_dtype_before_shape() -> None:
    # an undefined dtype and a zero batch_size: rule 4 comes first, with or without code 1 around
    v = find_violation(build_header(Header(0, 5, 1, 0, 3, dtype=2)), 4096)
    assert v is not None and v.code is ErrorCode.UNSUPPORTED_DTYPE
    v = find_violation(build_header(Header(0, 5, 1, 0, 3, dtype=1)), 4096)
    assert v is not None and v.code is ErrorCode.INVALID_SHAPE
