"""``.npy`` array sources: 2-D record arrays and flat token arrays, read in blocks, checked."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from tests.helpers import expected_batches
from zerobatch_core import BatchFileReader, write_batch_dataset
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest.arrays import (
    ArrayFile,
    ArraySource,
    count_records,
    expand_arrays,
    iter_records,
)
from zerobatch_core.ingest.source import RecordSource


def collect(blocks: Iterable[npt.NDArray[np.uint32]], seq_len: int) -> npt.NDArray[np.uint32]:
    out = list(blocks)
    for b in out:
        assert b.dtype == np.uint32 and b.ndim == 2 and b.shape[1] == seq_len
        assert b.flags.c_contiguous and b.flags.writeable
    return np.concatenate(out) if out else np.zeros((0, seq_len), dtype=np.uint32)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32, np.uint32, np.int64, np.uint64])
def test_2d_records_are_read_as_they_are(tmp_path: Path, dtype: type) -> None:
    top = min(int(np.iinfo(dtype).max), 2**32 - 1)
    rng = np.random.default_rng(3)
    src: npt.NDArray[np.integer] = rng.integers(0, top, size=(37, 12), endpoint=True).astype(dtype)
    np.save(tmp_path / "r.npy", src)
    assert count_records(tmp_path / "r.npy", 12) == 37
    for chunk in (1, 5, None):
        got = collect(iter_records(tmp_path / "r.npy", 12, chunk_records=chunk), 12)
        np.testing.assert_array_equal(got, src.astype(np.uint32))
    sizes = [b.shape[0] for b in iter_records(tmp_path / "r.npy", 12, chunk_records=10)]
    assert sizes == [10, 10, 10, 7]


def test_flat_arrays_are_cut_contiguously_per_file(tmp_path: Path) -> None:
    a = np.arange(1000, dtype=np.uint16)
    b = np.arange(5000, 5071, dtype=np.int64)
    np.save(tmp_path / "t_000.npy", a)
    np.save(tmp_path / "t_001.npy", b)
    pattern = str(tmp_path / "t_*.npy")
    want = np.concatenate([a[:990].reshape(-1, 30), b[:60].reshape(-1, 30)]).astype(np.uint32)
    assert count_records(pattern, 30) == 33 + 2  # remainders dropped per file, never joined
    np.testing.assert_array_equal(collect(iter_records(pattern, 30, chunk_records=4), 30), want)


def mapped_paths() -> set[str]:
    """Files this process has memory-mapped now (Linux ``/proc/self/maps``)."""
    with open("/proc/self/maps") as f:
        return {line.split(maxsplit=5)[5].strip() for line in f if len(line.split()) == 6}


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_files_are_read_with_positioned_reads_never_mapped(tmp_path: Path) -> None:
    np.save(tmp_path / "m.npy", np.arange(64 * 8, dtype=np.uint32).reshape(64, 8))
    f = ArrayFile(tmp_path / "m.npy")
    assert f.shape == (64, 8) and f.dtype == np.uint32 and "shape=[64, 8]" in repr(f)
    blocks = []
    for block in f.iter_blocks(8, chunk_records=10):
        assert str(tmp_path / "m.npy") not in mapped_paths()
        blocks.append(block)
    np.testing.assert_array_equal(np.concatenate(blocks), np.arange(512).reshape(64, 8))


@pytest.mark.parametrize("dtype", [">u4", ">i8", "<u2", "<i4"])
def test_fortran_order_and_byte_order_are_read_as_numpy_reads_them(
    tmp_path: Path, dtype: str
) -> None:
    rows = np.arange(37 * 6).reshape(37, 6).astype(dtype)
    np.save(tmp_path / "f.npy", np.asfortranarray(rows))
    np.save(tmp_path / "c.npy", rows)
    for name in ("f.npy", "c.npy"):
        got = collect(iter_records(tmp_path / name, 6, chunk_records=5), 6)
        np.testing.assert_array_equal(got, np.load(tmp_path / name).astype(np.uint32))


def test_truncated_array_is_named_at_open(tmp_path: Path) -> None:
    np.save(tmp_path / "t.npy", np.arange(100, dtype=np.uint32))
    os.truncate(tmp_path / "t.npy", os.path.getsize(tmp_path / "t.npy") - 8)
    with pytest.raises(IngestError, match=r"t\.npy: field shape: \[100\] uint32 needs a file of"):
        ArrayFile(tmp_path / "t.npy")


def test_record_source_protocol(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(200, dtype=np.int32).reshape(20, 10))
    np.save(tmp_path / "b.npy", np.arange(95, dtype=np.int32))
    src = ArraySource([tmp_path / "a.npy", tmp_path / "b.npy"], 10, chunk_records=6)
    assert isinstance(src, RecordSource)
    assert src.num_records == 29 and src.seq_len == 10
    assert src.paths == [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")]
    got = collect(src.iter_blocks(), 10)
    assert len(got) == 29
    np.testing.assert_array_equal(got[20:], np.arange(90).reshape(9, 10))


def test_wrong_seq_len_dtype_or_shape(tmp_path: Path) -> None:
    np.save(tmp_path / "r.npy", np.zeros((4, 16), dtype=np.uint16))
    with pytest.raises(IngestError, match=r"r\.npy: field shape: expected \[num_records, 8\]"):
        count_records(tmp_path / "r.npy", 8)
    for name, arr in [
        ("f.npy", np.zeros(10, dtype=np.float32)),
        ("b.npy", np.zeros(10, dtype=bool)),
    ]:
        np.save(tmp_path / name, arr)
        with pytest.raises(IngestError, match=rf"{name}: field dtype: expected an integer"):
            ArrayFile(tmp_path / name)
    np.save(tmp_path / "c.npy", np.zeros((2, 3, 4), dtype=np.int32))
    with pytest.raises(IngestError, match=r"c\.npy: field shape: .* got \[2, 3, 4\]"):
        ArrayFile(tmp_path / "c.npy")


def test_unreadable_files(tmp_path: Path) -> None:
    np.save(tmp_path / "o.npy", np.array([1, "x"], dtype=object), allow_pickle=True)
    with pytest.raises(IngestError, match=r"o\.npy: field dtype: expected an integer dtype"):
        ArrayFile(tmp_path / "o.npy")
    (tmp_path / "p.npy").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(IngestError, match=r"p\.npy: not a readable \.npy array"):
        ArrayFile(tmp_path / "p.npy")
    np.savez(tmp_path / "z.npz", a=np.arange(4))
    with pytest.raises(IngestError, match=r"z\.npz: expected a single \.npy array, got a \.npz"):
        ArrayFile(tmp_path / "z.npz")
    with pytest.raises(IngestError, match=r"missing\.npy: array file does not exist"):
        count_records(tmp_path / "missing.npy", 4)
    with pytest.raises(IngestError, match="no array file matches"):
        expand_arrays(str(tmp_path / "none_*.npy"))


def test_out_of_range_values_name_the_file_and_record(tmp_path: Path) -> None:
    rows = np.arange(60, dtype=np.int64).reshape(10, 6)
    rows[7, 4] = -1
    np.save(tmp_path / "neg.npy", rows)
    with pytest.raises(IngestError, match=r"neg\.npy: record 7, token 4: value -1 is outside"):
        list(iter_records(tmp_path / "neg.npy", 6, chunk_records=3))
    flat = np.arange(100, dtype=np.uint64)
    flat[53] = 2**32
    np.save(tmp_path / "big.npy", flat)
    match = r"big\.npy: record 5, token 3 \(element 53\): value 4294967296 is outside"
    with pytest.raises(IngestError, match=match):
        list(iter_records(tmp_path / "big.npy", 10))
    flat[53] = 2**32 - 1  # the top of the range is fine
    np.save(tmp_path / "top.npy", flat)
    assert int(collect(iter_records(tmp_path / "top.npy", 10), 10).max()) == 2**32 - 1


def test_argument_errors(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(10))
    with pytest.raises(IngestError, match="seq_len"):
        iter_records(tmp_path / "a.npy", 0)
    with pytest.raises(IngestError, match="chunk_records"):
        iter_records(tmp_path / "a.npy", 2, chunk_records=0)
    with pytest.raises(IngestError, match="listed twice"):
        count_records([tmp_path / "a.npy", str(tmp_path / "a.npy")], 2)


def test_end_to_end_through_the_streaming_writer(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    np.save(tmp_path / "a.npy", rng.integers(0, 2**20, size=(41, 16), dtype=np.int64))
    np.save(tmp_path / "b.npy", rng.integers(0, 2**16, size=16 * 23 + 5, dtype=np.uint16))
    src = ArraySource(str(tmp_path / "*.npy"), 16, chunk_records=8)
    records = collect(src.iter_blocks(), 16)
    out = tmp_path / "out.batch"
    nb = write_batch_dataset(out, src.iter_blocks(), src.num_records, 6, 16, seed=77)
    assert src.num_records == len(records) == 64 and nb == 10
    with BatchFileReader(out) as reader:
        got = np.array(reader.read_batches(0, len(reader)))
    np.testing.assert_array_equal(got, expected_batches(records, 6, 77))
