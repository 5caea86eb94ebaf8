"""The writers' token dtype: uint16 files (dtype code 1), ``"auto"``, refusals and atomicity.

Expectations are computed independently: the spec's record permutation (``record_source``)
gives the batches, ``zerobatch_spec`` gives the slot arithmetic, and raw bytes are decoded with
NumPy, never with the reader under test alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from zerobatch_spec import (
    DTYPE_UINT16,
    DTYPE_UINT32,
    HEADER_SIZE,
    TOKEN_DTYPES,
    expected_file_size,
    parse_header,
    slot_words,
)

import zerobatch_core.files.writer as writer_module
from tests.helpers import expected_batches, records
from zerobatch_core.errors import WriteError
from zerobatch_core.files.reader import BatchFileReader
from zerobatch_core.files.writer import (
    retype_batch_file,
    token_dtype_code,
    write_batch_dataset,
    write_batch_file,
)

U16 = TOKEN_DTYPES[DTYPE_UINT16]


def small_ids(n: int, t: int, dtype: type = np.int64, seed: int = 0) -> npt.NDArray[Any]:
    """Random ids in [0, 65535] (both ends included) as ``dtype``."""
    rng = np.random.default_rng(seed)
    out = rng.integers(0, 2**16, size=(n, t), dtype=np.int64)
    out[0, 0], out[-1, -1] = 0, 2**16 - 1
    return out.astype(dtype)


def raw_slots(path: Path) -> tuple[Any, npt.NDArray[Any]]:
    """The header and the ``[num_batches, slot_words]`` slots, decoded from the bytes alone."""
    data = path.read_bytes()
    h = parse_header(data)
    words = slot_words(h.batch_size, h.seq_len, h.dtype)
    body = np.frombuffer(data, dtype=TOKEN_DTYPES[h.dtype], offset=HEADER_SIZE)
    return h, body.reshape(h.num_batches, words)


def blocks_of(a: npt.NDArray[Any], k: int) -> list[npt.NDArray[Any]]:
    return [a[i : i + k] for i in range(0, a.shape[0], k)]


WRITERS = {
    "array": lambda p, a, b, s, **kw: write_batch_file(p, a, b, seed=s, **kw),
    "stream": lambda p, a, b, s, **kw: write_batch_dataset(
        p, iter(blocks_of(a, 7)), a.shape[0], b, a.shape[1], s, **kw
    ),
    "spilled": lambda p, a, b, s, **kw: write_batch_dataset(
        p, iter(blocks_of(a, 7)), None, b, a.shape[1], s, **kw
    ),
}


@pytest.mark.parametrize("writer", WRITERS)
def test_uint16_files_hold_the_spec_batches_in_half_the_slot_bytes(
    tmp_path: Path, writer: str
) -> None:
    src = small_ids(101, 512)  # a batch of 8 x 512 uint16 tokens is exactly 2 slots of 4096
    out = tmp_path / "x.batch"
    n = WRITERS[writer](out, src, 8, 5, dtype="uint16")
    h, slots = raw_slots(out)
    assert n == h.num_batches == 12 and h.dtype == DTYPE_UINT16 and h.total_records == 101
    assert out.stat().st_size == expected_file_size(8, 512, 12, DTYPE_UINT16)
    assert out.stat().st_size - HEADER_SIZE == (expected_file_size(8, 512, 12) - HEADER_SIZE) // 2
    want = expected_batches(src, 8, 5)
    np.testing.assert_array_equal(slots[:, : 8 * 512].reshape(12, 8, 512), want)
    with BatchFileReader(out) as r:
        assert r.token_dtype == U16
        np.testing.assert_array_equal(r.read_batches(0, 12), want)


@pytest.mark.parametrize("writer", WRITERS)
def test_the_same_records_as_uint16_and_uint32_hold_equal_batches(
    tmp_path: Path, writer: str
) -> None:
    src = small_ids(77, 13)
    WRITERS[writer](tmp_path / "a.batch", src, 4, 9, dtype="uint32")
    WRITERS[writer](tmp_path / "b.batch", src, 4, 9, dtype="uint16")
    ha, a = raw_slots(tmp_path / "a.batch")
    hb, b = raw_slots(tmp_path / "b.batch")
    assert (ha.dtype, hb.dtype) == (DTYPE_UINT32, DTYPE_UINT16)
    assert ha.as_dict() | {"dtype": 0} == hb.as_dict() | {"dtype": 0}
    np.testing.assert_array_equal(a[:, : 4 * 13], b[:, : 4 * 13])
    assert not a[:, 4 * 13 :].any() and not b[:, 4 * 13 :].any()  # padding stays zero


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int16, np.uint32, np.int64])
def test_every_integer_input_dtype_gives_the_same_uint16_file(
    tmp_path: Path, writer: str, dtype: type
) -> None:
    src = small_ids(40, 6, seed=3) % (100 if dtype in (np.uint8, np.int16) else 2**16)
    WRITERS[writer](tmp_path / "ref.batch", src.astype(np.int64), 4, 1, dtype="uint16")
    WRITERS[writer](tmp_path / "x.batch", src.astype(dtype), 4, 1, dtype=DTYPE_UINT16)
    assert (tmp_path / "x.batch").read_bytes() == (tmp_path / "ref.batch").read_bytes()


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize(("bad", "shown"), [(2**16, "65536"), (-1, "-1"), (2**32, "4294967296")])
def test_a_token_uint16_cannot_hold_is_refused_naming_it_and_nothing_is_left(
    tmp_path: Path, writer: str, bad: int, shown: str
) -> None:
    src = small_ids(30, 5)
    src[23, 4] = bad  # in the last block of the stream
    out = tmp_path / "x.batch"
    pattern = rf"record 23, token 4: value {shown} is outside the uint16 range \[0, 65535\]"
    with pytest.raises(WriteError, match=pattern):
        WRITERS[writer](out, src, 4, 0, dtype="uint16")
    assert os.listdir(tmp_path) == []  # no output, no temporary


@pytest.mark.parametrize("writer", WRITERS)
def test_a_refused_uint16_write_leaves_the_file_it_would_replace_as_it_was(
    tmp_path: Path, writer: str
) -> None:
    out = tmp_path / "x.batch"
    write_batch_file(out, records(8, 4), 2)
    before = out.read_bytes()
    src = small_ids(30, 5)
    src[29, 0] = 70_000  # the dropped remainder is checked too
    with pytest.raises(WriteError, match="record 29, token 0: value 70000"):
        WRITERS[writer](out, src, 4, 0, dtype="uint16", overwrite=True)
    assert out.read_bytes() == before and os.listdir(tmp_path) == ["x.batch"]


def test_uint32_inputs_are_narrowed_a_chunk_of_records_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 64-byte chunks of 4-token uint32 records: four records per check, never the whole input.
    monkeypatch.setattr(writer_module, "CHUNK_BYTES", 64)
    checked: list[tuple[int, int, int]] = []
    to_tokens = writer_module._to_tokens

    def spy(rows: np.ndarray, what: str, first: int, dtype: int = 0) -> np.ndarray:
        checked.append((first, rows.shape[0], dtype))
        return to_tokens(rows, what, first, dtype)

    monkeypatch.setattr(writer_module, "_to_tokens", spy)
    assert writer_module._check_values(records(10, 4), "t", DTYPE_UINT16) == DTYPE_UINT16
    assert checked == [(0, 4, 1), (4, 4, 1), (8, 2, 1)]
    checked.clear()  # uint16 (or narrower) inputs need no look at all
    assert writer_module._check_values(records(10, 4, np.uint16), "t", DTYPE_UINT16) == 1
    assert writer_module._check_values(records(10, 4, np.uint8), "t", None) == DTYPE_UINT16
    assert checked == []


@pytest.mark.parametrize("writer", WRITERS)
def test_auto_writes_uint16_exactly_when_every_token_fits(tmp_path: Path, writer: str) -> None:
    src = small_ids(50, 9)
    WRITERS[writer](tmp_path / "auto.batch", src, 4, 2, dtype="auto")
    WRITERS[writer](tmp_path / "u16.batch", src, 4, 2, dtype="uint16")
    assert (tmp_path / "auto.batch").read_bytes() == (tmp_path / "u16.batch").read_bytes()
    src[49, 8] = 2**16  # one token above, in the dropped remainder: uint32
    WRITERS[writer](tmp_path / "auto32.batch", src, 4, 2, dtype="auto")
    WRITERS[writer](tmp_path / "u32.batch", src, 4, 2, dtype="uint32")
    assert (tmp_path / "auto32.batch").read_bytes() == (tmp_path / "u32.batch").read_bytes()
    assert parse_header((tmp_path / "auto32.batch").read_bytes()).dtype == DTYPE_UINT32


@pytest.mark.parametrize("total", [40, None])
def test_auto_narrows_windows_smaller_than_a_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, total: int | None
) -> None:
    # The scratch file holds uint32 records while the output gets uint16 slots: a window is a
    # run of whole batches in both, each at its own offsets.
    monkeypatch.setattr(writer_module, "WINDOW_BYTES", 100)
    monkeypatch.setattr(writer_module, "STAGE_BYTES", 64)
    src = small_ids(40, 700, seed=4)  # 2 x 700 x 4 bytes: a 8192-byte uint32 slot, 4096 as uint16
    out = tmp_path / "x.batch"
    write_batch_dataset(out, iter(blocks_of(src, 3)), total, 2, 700, 6, dtype="auto")
    h, slots = raw_slots(out)
    assert h.dtype == DTYPE_UINT16 and out.stat().st_size == HEADER_SIZE + 20 * 4096
    np.testing.assert_array_equal(slots[:, :1400].reshape(20, 2, 700), expected_batches(src, 2, 6))


def test_auto_on_an_empty_output_still_reads_and_checks_the_stream(tmp_path: Path) -> None:
    src = small_ids(3, 4)
    src[2, 1] = 2**16
    write_batch_dataset(tmp_path / "x.batch", iter([src]), 3, 4, 4, dtype="auto", allow_empty=True)
    h, _ = raw_slots(tmp_path / "x.batch")
    assert (h.num_batches, h.total_records, h.dtype) == (0, 3, DTYPE_UINT32)


@pytest.mark.parametrize(
    ("dtype", "code"),
    [("uint32", 0), ("uint16", 1), (0, 0), (1, 1), (np.int64(1), 1), ("auto", None)],
)
def test_dtype_names_and_codes_are_accepted(dtype: object, code: int | None) -> None:
    assert token_dtype_code(dtype, auto=True) == code


@pytest.mark.parametrize("dtype", ["uint8", "int32", "UINT16", 2, -1, True, 1.0, None, "auto"])
def test_other_dtypes_are_refused_before_anything_is_written(tmp_path: Path, dtype: Any) -> None:
    auto = dtype == "auto"
    with pytest.raises(WriteError, match="dtype must be one of 'uint32', 'uint16'"):
        token_dtype_code(dtype)
    if auto:
        return
    for name, write in WRITERS.items():
        with pytest.raises(WriteError, match="dtype must be one of"):
            write(tmp_path / f"{name}.batch", records(8, 4), 2, 0, dtype=dtype)
    assert os.listdir(tmp_path) == []


def test_retype_widens_and_narrows_batch_for_batch(tmp_path: Path) -> None:
    src = small_ids(300, 40, seed=8)
    write_batch_file(tmp_path / "u16.batch", src, 16, seed=3, dtype="uint16")
    write_batch_file(tmp_path / "u32.batch", src, 16, seed=3, dtype="uint32")
    header = retype_batch_file(tmp_path / "u16.batch", tmp_path / "w.batch", "uint32")
    assert header.dtype == DTYPE_UINT32
    assert (tmp_path / "w.batch").read_bytes() == (tmp_path / "u32.batch").read_bytes()
    retype_batch_file(tmp_path / "w.batch", tmp_path / "w.batch", 1, overwrite=True)  # in place
    assert (tmp_path / "w.batch").read_bytes() == (tmp_path / "u16.batch").read_bytes()


def test_retype_refuses_a_token_that_does_not_fit_and_writes_nothing(tmp_path: Path) -> None:
    src = records(8, 4)
    src[5, 2] = 70_000
    write_batch_file(tmp_path / "u32.batch", src, 2, seed=0)
    position = [
        record
        for record in range(8)
        if expected_batches(src, 2, 0).reshape(8, 4)[record, 2] == 70_000
    ]
    with pytest.raises(WriteError, match=rf"record {position[0]}, token 2: value 70000"):
        retype_batch_file(tmp_path / "u32.batch", tmp_path / "u16.batch", "uint16")
    assert sorted(os.listdir(tmp_path)) == ["u32.batch"]
    with pytest.raises(WriteError, match="already exists"):
        retype_batch_file(tmp_path / "u32.batch", tmp_path / "u32.batch", "uint32")
