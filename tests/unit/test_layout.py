"""The construct declaration: parse, build and size agree, and the slot arithmetic is exact."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from zerobatch_spec import (
    DTYPE_NAMES,
    DTYPE_UINT16,
    DTYPE_UINT32,
    FIELD_OFFSETS,
    HEADER_SIZE,
    HEADER_STRUCT,
    MAGIC,
    RESERVED_OFFSET,
    SLOT_ALIGNMENT,
    TOKEN_BYTES,
    TOKEN_DTYPE,
    TOKEN_DTYPES,
    U32_MAX,
    U64_MAX,
    Header,
    batch_offset,
    build_header,
    dtype_code,
    expected_file_size,
    find_violation,
    padded_batch_bytes,
    parse_header,
    raw_batch_bytes,
    slot_words,
    token_bytes,
    token_dtype,
    token_max,
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


# -- token dtypes -------------------------------------------------------------------------

ELEMENT_BYTES = {0: 4, 1: 2}
"""Bytes per token of each defined dtype code, as SPEC.md section 2's table states them."""


def test_dtype_codes_are_the_spec_table() -> None:
    assert (DTYPE_UINT32, DTYPE_UINT16) == (0, 1)
    assert {0: np.dtype("<u4"), 1: np.dtype("<u2")} == TOKEN_DTYPES
    assert DTYPE_NAMES == {0: "uint32", 1: "uint16"}
    assert TOKEN_DTYPE == token_dtype(0) == token_dtype()
    for code, size in ELEMENT_BYTES.items():
        assert token_bytes(code) == token_dtype(code).itemsize == size
        assert token_dtype(code).byteorder in ("<", "=") and token_dtype(code).kind == "u"
    assert token_max(0) == 2**32 - 1 and token_max(1) == 65535
    assert dtype_code("uint32") == 0 and dtype_code("uint16") == 1


@pytest.mark.parametrize("code", [2, -1, U32_MAX, "1", None])
def test_undefined_dtype_codes_raise(code: object) -> None:
    with pytest.raises(ValueError, match="not defined"):
        token_dtype(code)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        token_bytes(code)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["int32", "uint8", "UINT16", "u2", "<u2", ""])
def test_unknown_dtype_names_raise(name: str) -> None:
    with pytest.raises(ValueError, match="uint16"):
        dtype_code(name)


@pytest.mark.parametrize(
    ("b", "t", "raw", "padded"),
    [
        (32, 512, 32768, 32768),
        (3, 5, 30, 4096),
        (4, 256, 2048, 4096),  # a uint32 slot of this shape has no padding; a uint16 one has
        (8, 256, 4096, 4096),
        (2, 1024, 4096, 4096),
        (5, 300, 3000, 4096),
        (1, 1, 2, 4096),
        (1, 2049, 4098, 8192),
        (2, 2048, 8192, 8192),
    ],
)
def test_slot_arithmetic_uint16(b: int, t: int, raw: int, padded: int) -> None:
    assert raw_batch_bytes(b, t, DTYPE_UINT16) == raw
    assert padded_batch_bytes(b, t, DTYPE_UINT16) == padded
    assert slot_words(b, t, DTYPE_UINT16) * 2 == padded
    h = Header(b, t, 7, 0, 7 * b, dtype=DTYPE_UINT16)
    assert (h.raw_batch_bytes, h.padded_batch_bytes) == (raw, padded)
    assert h.slot_words == slot_words(b, t, DTYPE_UINT16)
    assert h.token_dtype == np.dtype("<u2")
    assert batch_offset(2, b, t, DTYPE_UINT16) == 4096 + 2 * padded
    assert expected_file_size(b, t, 7, DTYPE_UINT16) == h.file_size == 4096 + 7 * padded


def test_uint16_slots_are_half_whenever_uint32_ones_are_full_pages() -> None:
    # B * T a multiple of 2048: neither code pads, and the uint16 slot is exactly half.
    for b, t in ((32, 512), (8, 1024), (1, 2048), (64, 2048)):
        assert padded_batch_bytes(b, t, 1) * 2 == padded_batch_bytes(b, t, 0) == b * t * 4


def test_uint16_header_round_trips_with_its_dtype() -> None:
    h = Header(batch_size=8, seq_len=1024, num_batches=3, seed=7, total_records=30, dtype=1)
    data = build_header(h)
    assert int.from_bytes(data[28:32], "little") == 1
    assert parse_header(data) == h


def _u64_rule7(file_size: int, b: int, t: int, n: int, code: int) -> bool:
    """SPEC.md section 4's u64-only size check, asserting that no value leaves the u64 range."""
    u64 = 2**64
    body = file_size - 4096
    words = b * t
    per = 4096 // ELEMENT_BYTES[code]
    assert 0 <= body < u64 and words < u64 and words + per - 1 < u64
    pages = (words + per - 1) // per
    pages_in_body = body // 4096
    return body % 4096 == 0 and pages_in_body % pages == 0 and pages_in_body // pages == n


u32s = st.one_of(st.sampled_from((1, 2, 3, 1023, 1024, 1025, 2047, 2048, 2049, U32_MAX)),
                 st.integers(1, U32_MAX))  # fmt: skip
u64s = st.one_of(st.sampled_from((0, 1, 2, 2**51 + 2, 2**52 + 2, 2**63, U64_MAX)),
                 st.integers(0, U64_MAX))  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(
    b=u32s,
    t=u32s,
    n=u64s,
    code=st.sampled_from((0, 1)),
    pick=st.integers(0, 5),
    noise=st.integers(0, U64_MAX - 4096),
)
@example(b=2, t=4, n=2**52 + 2, code=0, pick=4, noise=0)  # vector size-overflow-wraps
@example(b=2, t=2048, n=2**51 + 2, code=1, pick=4, noise=0)  # vector u16-size-overflow-wraps
@example(b=U32_MAX, t=U32_MAX, n=1, code=1, pick=4, noise=0)
@example(b=U32_MAX, t=U32_MAX, n=0, code=1, pick=0, noise=0)
def test_rule_7_is_exact_for_both_dtypes(
    b: int, t: int, n: int, code: int, pick: int, noise: int
) -> None:
    """The spec's u64-only check, ``expected_file_size`` and rule 7 agree with a big-integer
    computation of ``4096 + n * ceil(b * t * token_bytes / 4096) * 4096`` at every size tried:
    the true size, one byte or one page off, the size wrapped modulo 2^64, and any size."""
    slot = -(-b * t * ELEMENT_BYTES[code] // 4096) * 4096
    true = 4096 + n * slot
    assert expected_file_size(b, t, n, code) == true
    candidates = [true, true + 1, true - 1, true + 4096, 4096 + (n * slot) % 2**64, 4096 + noise]
    size = candidates[pick]
    if not 4096 <= size < 2**64:
        return  # not a size a file can have (rule 1 covers shorter ones)
    assert _u64_rule7(size, b, t, n, code) == (size == true)
    header = Header(b, t, n, 0, U32_MAX, dtype=code)
    v = find_violation(build_header(header), size)
    if size == true:
        assert v is None or v.code.value == "record_count_mismatch"
    else:
        assert v is not None and v.code.value == "size_mismatch"
