"""The construct declaration: parse, build and size agree, and the slot arithmetic is exact."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import (
    FIELD_OFFSETS,
    HEADER_SIZE,
    HEADER_STRUCT,
    MAGIC,
    RESERVED_OFFSET,
    SLOT_ALIGNMENT,
    TOKEN_BYTES,
    TOKEN_DTYPE,
    U32_MAX,
    U64_MAX,
    Header,
    batch_offset,
    build_header,
    expected_file_size,
    padded_batch_bytes,
    parse_header,
    raw_batch_bytes,
    slot_words,
)
from zerobatch_spec.layout import HEADER_FIELDS, RESERVED_SIZE

SPEC_MD = Path(__file__).resolve().parents[2] / "spec" / "SPEC.md"


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


def test_field_offsets_are_spec_table() -> None:
    assert FIELD_OFFSETS == {
        "magic": 0,
        "version": 8,
        "batch_size": 12,
        "seq_len": 16,
        "num_batches": 20,
        "dtype": 28,
        "seed": 32,
        "total_records": 36,
        "reserved": 40,
    }
    assert RESERVED_OFFSET == 40 and RESERVED_SIZE == 4056


def _spec_header_table() -> list[tuple[int, int, str, str]]:
    """(offset, size, type, name) of each row of SPEC.md's section 2 header table."""
    text = SPEC_MD.read_text(encoding="utf-8")
    section = text[text.index("## 2. Header") : text.index("## 3. Slots")]
    row = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\w+)\s*\|\s*`(\w+)`", re.MULTILINE)
    return [(int(o), int(n), t, name) for o, n, t, name in row.findall(section)]


def test_struct_matches_spec_md_table() -> None:
    # Offsets, sizes and integer widths of the declaration against SPEC.md's own table.
    table = _spec_header_table()
    assert [name for _, _, _, name in table] == [sub.name for sub in HEADER_STRUCT.subcons]
    widths = {"u32": 4, "u64": 8}
    for offset, size, kind, name in table:
        sub = next(s for s in HEADER_STRUCT.subcons if s.name == name)
        assert FIELD_OFFSETS[name] == offset, name
        assert sub.sizeof() == size, name
        assert kind == "bytes" or widths[kind] == size, name


def test_header_dataclass_has_exactly_the_struct_fields() -> None:
    assert tuple(n for n in FIELD_OFFSETS if n not in ("magic", "reserved")) == HEADER_FIELDS
    assert {f.name for f in dataclasses.fields(Header)} == set(HEADER_FIELDS)
    h = Header(batch_size=3, seq_len=5, num_batches=7, seed=11, total_records=23)
    assert list(h.as_dict()) == list(HEADER_FIELDS)  # on-disk order


@pytest.mark.parametrize("name", HEADER_FIELDS)
def test_each_field_is_built_at_its_offset(name: str) -> None:
    # A distinct value per field, read back at the derived offset with the field's width.
    values = {n: 0x0102 + i for i, n in enumerate(HEADER_FIELDS)}
    data = build_header(Header(**values))
    width = next(s for s in HEADER_STRUCT.subcons if s.name == name).sizeof()
    at = FIELD_OFFSETS[name]
    assert int.from_bytes(data[at : at + width], "little") == values[name]


def test_token_and_bound_constants() -> None:
    assert np.dtype("<u4") == TOKEN_DTYPE
    assert TOKEN_BYTES == TOKEN_DTYPE.itemsize == 4
    assert SLOT_ALIGNMENT == HEADER_SIZE == 4096
    assert np.iinfo(np.uint32).max == U32_MAX and np.iinfo(np.uint64).max == U64_MAX


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
    assert slot_words(b, t) * 4 == padded
    assert Header(b, t, 7, 0, 7 * b).slot_words == slot_words(b, t)
    assert batch_offset(2, b, t) == 4096 + 2 * padded
    assert expected_file_size(b, t, 7) == 4096 + 7 * padded


def test_seed_example_file_size() -> None:
    # 104,829 records of [32, 512]: 3275 batches. (The seed document prints 214,643,796, a
    # transposition of the correct 214,634,496.)
    assert expected_file_size(32, 512, 104829 // 32) == 4096 + 3275 * 65536 == 214_634_496


def test_parse_header_equals_the_construct_declaration_on_any_bytes() -> None:
    """``parse_header`` runs a ``struct`` format derived from ``HEADER_STRUCT``: same fields."""
    from zerobatch_spec.layout import HEADER_FIELDS, HEADER_STRUCT, parse_header

    rng = np.random.default_rng(7)
    for _ in range(200):
        data = rng.integers(0, 256, size=4096, dtype=np.uint8).tobytes()
        obj = HEADER_STRUCT.parse(data)
        header = parse_header(data)
        assert header.as_dict() == {name: obj[name] for name in HEADER_FIELDS}
