"""The construct declaration: parse, build and size agree, and the slot arithmetic is exact."""

from __future__ import annotations

import pytest
from zerobatch_spec import (
    HEADER_SIZE,
    HEADER_STRUCT,
    MAGIC,
    Header,
    batch_offset,
    build_header,
    expected_file_size,
    padded_batch_bytes,
    parse_header,
    raw_batch_bytes,
)
from zerobatch_spec.layout import FIELD_OFFSETS


def test_header_struct_is_one_page() -> None:
    assert HEADER_STRUCT.sizeof() == HEADER_SIZE == 4096


def test_build_parse_round_trip() -> None:
    h = Header(batch_size=32, seq_len=512, num_batches=3275, seed=42, total_records=104829)
    data = build_header(h)
    assert len(data) == 4096
    assert parse_header(data) == h
    assert data[:8] == MAGIC
    assert data[40:] == bytes(4056)


def test_field_offsets_match_seed_table() -> None:
    h = Header(batch_size=0x11, seq_len=0x22, num_batches=0x33, seed=0x44, total_records=0x55)
    data = build_header(h)
    assert data[FIELD_OFFSETS["version"]] == 1
    assert data[FIELD_OFFSETS["batch_size"]] == 0x11
    assert data[FIELD_OFFSETS["seq_len"]] == 0x22
    assert int.from_bytes(data[20:28], "little") == 0x33
    assert data[FIELD_OFFSETS["dtype"]] == 0
    assert data[FIELD_OFFSETS["seed"]] == 0x44
    assert data[FIELD_OFFSETS["total_records"]] == 0x55


def test_parse_keeps_reserved_bytes_so_they_can_be_checked() -> None:
    data = bytearray(build_header(Header(1, 1, 0, 0, 0)))
    data[4000] = 9
    assert HEADER_STRUCT.parse(bytes(data)).reserved[4000 - 40] == 9


@pytest.mark.parametrize(
    ("b", "t", "raw", "padded"),
    [
        (32, 512, 65536, 65536),
        (3, 5, 60, 4096),
        (4, 256, 4096, 4096),
        (5, 300, 6000, 8192),
        (1, 1, 4, 4096),
        (1, 1025, 4100, 8192),
    ],
)
def test_slot_arithmetic(b: int, t: int, raw: int, padded: int) -> None:
    assert raw_batch_bytes(b, t) == raw
    assert padded_batch_bytes(b, t) == padded
    assert batch_offset(2, b, t) == 4096 + 2 * padded
    assert expected_file_size(b, t, 7) == 4096 + 7 * padded


def test_seed_example_file_size() -> None:
    # 104,829 records of [32, 512]: 3275 batches. (The seed document prints 214,643,796, a
    # transposition of the correct 214,634,496.)
    assert expected_file_size(32, 512, 104829 // 32) == 4096 + 3275 * 65536 == 214_634_496
