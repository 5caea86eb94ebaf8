"""Writers: argument and value checks before the destination is touched, atomicity, identity."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import expected_batches, records
from zerobatch_core import BatchFileReader, WriteError, write_batch_dataset, write_batch_file
from zerobatch_core import writer as writer_module


def read_all(path: Path) -> np.ndarray:
    with BatchFileReader(path) as r:
        return np.array(r.read_batches(0, len(r)))


def test_write_then_read_gives_the_seed_permuted_input(tmp_path: Path) -> None:
    src = records(103, 6)
    n = write_batch_file(tmp_path / "a.batch", src, batch_size=8, seed=3)
    assert n == 12
    np.testing.assert_array_equal(read_all(tmp_path / "a.batch"), expected_batches(src, 8, 3))


def test_same_input_and_seed_give_identical_bytes_and_seed_matters(tmp_path: Path) -> None:
    src = records(64, 16)
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        write_batch_file(tmp_path / f"{name}.batch", src, batch_size=4, seed=seed)
    a, b, c = ((tmp_path / f"{x}.batch").read_bytes() for x in "abc")
    assert a == b and a != c


def test_streaming_writer_gives_the_same_bytes(tmp_path: Path) -> None:
    src = records(77, 5)
    write_batch_file(tmp_path / "a.batch", src, batch_size=4, seed=9)
    rows = (row for row in src)
    write_batch_dataset(tmp_path / "b.batch", rows, 77, batch_size=4, seq_len=5, seed=9)
    blocks = (src[i : i + 10] for i in range(0, 77, 10))  # 2-D blocks are accepted too
    write_batch_dataset(tmp_path / "c.batch", blocks, 77, batch_size=4, seq_len=5, seed=9)
    a = (tmp_path / "a.batch").read_bytes()
    assert a == (tmp_path / "b.batch").read_bytes() == (tmp_path / "c.batch").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["a.batch", "b.batch", "c.batch"]  # no spill left


@pytest.mark.parametrize("total", [0, 3, 64, 301, 1000])
@pytest.mark.parametrize("known", [True, False])
def test_streaming_windows_and_stages_give_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, total: int, known: bool
) -> None:
    """Tiny windows and stages: many windows, many stage flushes, blocks split across stages."""
    src = records(total, 24)
    write_batch_file(tmp_path / "a.batch", src, batch_size=3, seed=4)
    monkeypatch.setattr(writer_module, "WINDOW_BYTES", 4096 * 3)  # 3 batch slots per window
    monkeypatch.setattr(writer_module, "STAGE_BYTES", 24 * 4 * 7)  # 7 records per stage
    monkeypatch.setattr(writer_module, "POSITIONS_AHEAD", 5)
    blocks = (src[i : i + 11] for i in range(0, total, 11))
    write_batch_dataset(
        tmp_path / "b.batch", blocks, total if known else None, batch_size=3, seq_len=24, seed=4
    )
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_wider_integer_inputs_in_range_are_accepted(tmp_path: Path) -> None:
    src = records(20, 4)
    write_batch_file(tmp_path / "u.batch", src, 4, seed=1)
    for dtype in (np.int64, np.uint64, np.int32, np.uint16):
        write_batch_file(tmp_path / "w.batch", src.astype(dtype), 4, seed=1)
        assert (tmp_path / "w.batch").read_bytes() == (tmp_path / "u.batch").read_bytes()


def test_memmap_input(tmp_path: Path) -> None:
    src = records(50, 8)
    np.save(tmp_path / "src.npy", src)
    mm = np.load(tmp_path / "src.npy", mmap_mode="r")
    write_batch_file(tmp_path / "m.batch", mm, 5, seed=4)
    np.testing.assert_array_equal(read_all(tmp_path / "m.batch"), expected_batches(src, 5, 4))


BAD_ARRAYS = [
    (np.zeros((4, 4), dtype=np.float32), "integer dtype"),
    (np.zeros(16, dtype=np.uint32), "shape"),
    (np.zeros((4, 4, 1), dtype=np.uint32), "shape"),
    (np.zeros((4, 0), dtype=np.uint32), "0 tokens"),
    (np.array([[1, 2], [3, -1]], dtype=np.int64), "record 1, token 1: value -1"),
    (np.array([[1, 2**32]], dtype=np.int64), "value 4294967296"),
    ([[1, 2]], "numpy array"),
]


@pytest.mark.parametrize(("array", "message"), BAD_ARRAYS)
def test_bad_arrays_are_rejected_and_destination_untouched(
    tmp_path: Path, array: object, message: str
) -> None:
    dest = tmp_path / "keep.batch"
    dest.write_bytes(b"previous contents")
    with pytest.raises(WriteError, match=message):
        write_batch_file(dest, array, batch_size=1)  # type: ignore[arg-type]
    assert dest.read_bytes() == b"previous contents"
    assert os.listdir(tmp_path) == ["keep.batch"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": -3}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"batch_size": 2**32}, "batch_size"),
        ({"batch_size": 2, "seed": -1}, "seed"),
        ({"batch_size": 2, "seed": 2**32}, "seed"),
        ({"batch_size": 2, "seq_len": 5}, "seq_len=5"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(WriteError, match=message):
        write_batch_file(tmp_path / "x.batch", records(8, 4), **kwargs)  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


def test_bad_destinations(tmp_path: Path) -> None:
    with pytest.raises(WriteError, match="directory"):
        write_batch_file(tmp_path, records(4, 4), 2)
    with pytest.raises(WriteError, match="does not exist"):
        write_batch_file(tmp_path / "missing" / "x.batch", records(4, 4), 2)


def test_streaming_count_and_shape_checks(tmp_path: Path) -> None:
    dest = tmp_path / "s.batch"
    src = records(10, 4)
    with pytest.raises(WriteError, match="yielded 9 records"):
        write_batch_dataset(dest, iter(src[:9]), 10, 2, 4)
    with pytest.raises(WriteError, match="more than total_records"):
        write_batch_dataset(dest, iter(src), 9, 2, 4)
    with pytest.raises(WriteError, match="expected shape"):
        write_batch_dataset(dest, iter([np.zeros(5, np.uint32)]), 1, 1, 4)
    with pytest.raises(WriteError, match="outside the uint32 range"):
        write_batch_dataset(dest, iter([np.full(4, -2)]), 1, 1, 4)
    with pytest.raises(WriteError, match="total_records"):
        write_batch_dataset(dest, iter([]), -1, 1, 4)
    assert os.listdir(tmp_path) == []


def test_failure_mid_stream_leaves_nothing(tmp_path: Path) -> None:
    def rows() -> Iterator[np.ndarray]:
        yield from records(5, 4)
        raise RuntimeError("source died")

    with pytest.raises(RuntimeError, match="source died"):
        write_batch_dataset(tmp_path / "x.batch", rows(), 10, 2, 4)
    assert os.listdir(tmp_path) == []


def test_crash_before_rename_leaves_no_valid_looking_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(writer_module.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        write_batch_file(tmp_path / "x.batch", records(8, 4), 2)
    assert os.listdir(tmp_path) == []


def test_header_is_written_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bytes] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        seen.append(os.pread(fd, 8, 0) if os.path.isfile(f"/proc/self/fd/{fd}") else b"dir")
        real_fsync(fd)

    monkeypatch.setattr(writer_module.os, "fsync", spy)
    # a tiny chunk size forces several data writes before the header
    monkeypatch.setattr(writer_module, "CHUNK_BYTES", 4096)
    write_batch_file(tmp_path / "x.batch", records(40, 4), 2)
    assert seen[0] == b"LLMBATCH"  # header in place only by the time of the final fsync


def test_streaming_header_is_written_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    headers: list[bytes] = []
    real_pwrite = writer_module.os.pwrite

    def spy(fd: int, data: object, offset: int) -> int:
        headers.append(os.pread(fd, 8, 0))
        return real_pwrite(fd, data, offset)  # type: ignore[arg-type]

    monkeypatch.setattr(writer_module.os, "pwrite", spy)
    monkeypatch.setattr(writer_module, "WINDOW_BYTES", 4096)
    src = records(40, 4)
    write_batch_dataset(tmp_path / "x.batch", iter(src), 40, batch_size=2, seq_len=4)
    assert len(headers) > 20 and set(headers) == {bytes(8)}  # no magic before the last write
    assert (tmp_path / "x.batch").read_bytes()[:8] == b"LLMBATCH"


def test_streaming_peak_memory_does_not_grow_with_the_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunk = 256 * 1024
    for name in ("CHUNK_BYTES", "WINDOW_BYTES", "STAGE_BYTES"):
        monkeypatch.setattr(writer_module, name, chunk)
    monkeypatch.setattr(writer_module, "POSITIONS_AHEAD", 1024)

    def peak(n_records: int) -> int:
        rows = (np.full((64, 256), i, dtype=np.uint32) for i in range(n_records // 64))
        tracemalloc.start()
        write_batch_dataset(tmp_path / "p.batch", rows, n_records, 16, 256, seed=1)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    small, large = peak(4096), peak(4096 * 8)  # 4 MiB vs 32 MiB of tokens: 16 vs 128 chunks
    assert large < small * 1.25 + 64 * 1024
    assert large < 4 * chunk


def test_streaming_count_may_be_left_open(tmp_path: Path) -> None:
    src = records(37, 3)
    write_batch_file(tmp_path / "a.batch", src, 4, seed=2)
    assert write_batch_dataset(tmp_path / "b.batch", iter(src), None, 4, 3, seed=2) == 9
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()
