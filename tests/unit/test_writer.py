"""Writers: argument and value checks before the destination is touched, atomicity, identity,
refused outputs, leftovers of dead writers, file mode and OS errors."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec import HEADER_SIZE, MAGIC

from tests.helpers import expected_batches, records
from zerobatch_core import (
    BatchFileReader,
    WriteError,
    validate_file,
    write_batch_dataset,
    write_batch_file,
)
from zerobatch_core.errors import ZeroBatchIOError
from zerobatch_core.files import writer as writer_module


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
    write_batch_file(tmp_path / "a.batch", src, batch_size=3, seed=4, allow_empty=True)
    monkeypatch.setattr(writer_module, "WINDOW_BYTES", 4096 * 3)  # 3 batch slots per window
    monkeypatch.setattr(writer_module, "STAGE_BYTES", 24 * 4 * 7)  # 7 records per stage
    monkeypatch.setattr(writer_module, "POSITIONS_AHEAD", 5)
    blocks = (src[i : i + 11] for i in range(0, total, 11))
    n = total if known else None
    write_batch_dataset(tmp_path / "b.batch", blocks, n, 3, 24, seed=4, allow_empty=True)
    assert (tmp_path / "a.batch").read_bytes() == (tmp_path / "b.batch").read_bytes()


def test_wider_integer_inputs_in_range_are_accepted(tmp_path: Path) -> None:
    src = records(20, 4)
    write_batch_file(tmp_path / "u.batch", src, 4, seed=1)
    for dtype in (np.int64, np.uint64, np.int32, np.uint16):
        write_batch_file(tmp_path / "w.batch", src.astype(dtype), 4, seed=1, overwrite=True)
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
        write_batch_file(dest, array, batch_size=1, overwrite=True)  # type: ignore[arg-type]
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


@pytest.mark.parametrize("unnamed", [True, False])
@pytest.mark.parametrize("existing", [False, True])
def test_crash_before_the_file_is_named_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unnamed: bool, existing: bool
) -> None:
    """Interrupted where the complete file would get its name: nothing new, the old file kept."""
    if not unnamed:
        monkeypatch.setattr(writer_module, "_open_unnamed", lambda directory: None)
    dest = tmp_path / "x.batch"
    if existing:
        dest.write_bytes(b"previous contents")

    def crash(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "link", crash)  # the writer's os module: the same object
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        write_batch_file(dest, records(8, 4), 2, overwrite=existing)
    assert os.listdir(tmp_path) == (["x.batch"] if existing else [])
    if existing:
        assert dest.read_bytes() == b"previous contents"


def first_page_at_each_write(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> list[tuple[int, bytes, list[str]]]:
    """Spy on every write to the output: ``(offset, first page before it, directory listing)``.

    The first page is read through the descriptor being written, so it is the unnamed (or
    temporary) file itself, observed while it is written.
    """
    seen: list[tuple[int, bytes, list[str]]] = []
    real = writer_module._write_all

    def spy(fd: int, data: Any, offset: int, target: Any) -> None:
        if target.what == "the output":
            seen.append((offset, os.pread(fd, HEADER_SIZE, 0), sorted(os.listdir(tmp_path))))
        real(fd, data, offset, target)

    monkeypatch.setattr(writer_module, "_write_all", spy)
    return seen


@pytest.mark.parametrize("unnamed", [True, False])
@pytest.mark.parametrize("how", ["array", "stream", "stream-unknown-count"])
def test_first_page_stays_zero_until_the_data_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, unnamed: bool
) -> None:
    """The header is written last: a killed writer's file never carries the magic.

    Small chunks and windows give many data writes; before every one of them the first
    ``HEADER_SIZE`` bytes of the file being written are all zero, and the very last write is the
    header at offset 0. With unnamed files nothing appears in the directory until the end.
    """
    for name in ("CHUNK_BYTES", "WINDOW_BYTES"):
        monkeypatch.setattr(writer_module, name, HEADER_SIZE * 2)
    monkeypatch.setattr(writer_module, "STAGE_BYTES", 16 * 4 * 5)
    if not unnamed:
        monkeypatch.setattr(writer_module, "_open_unnamed", lambda directory: None)
    seen = first_page_at_each_write(monkeypatch, tmp_path)
    src = records(60, 16)
    out = tmp_path / "x.batch"
    if how == "array":
        write_batch_file(out, src, batch_size=2, seed=3)
    else:
        total = 60 if how == "stream" else None
        write_batch_dataset(out, iter(src), total, batch_size=2, seq_len=16, seed=3)
    *data, (last_offset, last_page, _) = seen
    assert len(data) >= 10  # 30 batches, two per chunk or window
    assert all(offset >= HEADER_SIZE for offset, _, _ in data)
    assert all(not page.strip(b"\0") for _, page, _ in data)
    assert last_offset == 0 and not last_page.strip(b"\0")
    assert out.read_bytes()[: len(MAGIC)] == MAGIC
    listings = {tuple(listing) for _, _, listing in seen}
    if unnamed:
        assert listings == {()}  # nothing had a name while it was written
    else:
        assert all(len(x) == 1 and x[0].startswith(".x.batch.") for x in listings)
    assert os.listdir(tmp_path) == ["x.batch"]


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
        write_batch_dataset(tmp_path / "p.batch", rows, n_records, 16, 256, 1, overwrite=True)
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


# --- the uint32 range ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_uint32_upper_bound_is_accepted_and_one_more_is_refused(
    tmp_path: Path, stream: bool
) -> None:
    """Token 2**32 - 1 is the largest a file holds; 2**32 is refused naming record and token."""
    top = np.array([[0, 2**32 - 1, 5], [2**32 - 1, 1, 2**32 - 2]], dtype=np.int64)

    def write(path: Path, rows: np.ndarray) -> int:
        if stream:
            return write_batch_dataset(path, iter(rows), len(rows), 1, 3, seed=2)
        return write_batch_file(path, rows, 1, seed=2)

    assert write(tmp_path / "top.batch", top) == 2
    got = read_all(tmp_path / "top.batch")
    np.testing.assert_array_equal(got, expected_batches(top, 1, 2))
    assert int(got.max()) == 2**32 - 1
    over = top.copy()
    over[1, 2] = 2**32
    message = r"record 1, token 2: value 4294967296 is outside the uint32 range"
    with pytest.raises(WriteError, match=message):
        write(tmp_path / "over.batch", over)
    assert sorted(os.listdir(tmp_path)) == ["top.batch"]


# --- refused outputs: existing files, the input itself, no batches ---------------------------

WRITERS = ["file", "stream", "stream-unknown-count"]


def write_with(how: str, path: Path, rows: Iterator[np.ndarray] | np.ndarray, **kw: Any) -> int:
    """Write ``rows`` (16 or fewer records of 4 tokens) with one of the writers, batch size 4."""
    if how == "file":
        assert isinstance(rows, np.ndarray)
        return write_batch_file(path, rows, 4, seed=1, **kw)
    items = list(rows) if isinstance(rows, np.ndarray) else rows
    total = (len(items) if isinstance(items, list) else 16) if how == "stream" else None
    return write_batch_dataset(path, iter(items), total, 4, 4, 1, **kw)


@pytest.mark.parametrize("how", WRITERS)
def test_existing_output_is_replaced_only_with_overwrite(tmp_path: Path, how: str) -> None:
    dest = tmp_path / "x.batch"
    dest.write_bytes(b"previous contents")
    rows = iter(records(16, 4))
    message = r"x\.batch: output file already exists; pass overwrite=True \(--overwrite"
    with pytest.raises(WriteError, match=message):
        write_with(how, dest, records(16, 4) if how == "file" else rows)
    assert dest.read_bytes() == b"previous contents" and os.listdir(tmp_path) == ["x.batch"]
    assert len(list(rows)) == 16  # refused before the stream was touched
    assert write_with(how, dest, records(16, 4), overwrite=True) == 4
    assert validate_file(dest, deep=True).valid
    assert os.listdir(tmp_path) == ["x.batch"]


@pytest.mark.parametrize("unnamed", [True, False])
def test_output_created_meanwhile_is_not_clobbered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unnamed: bool
) -> None:
    """Without ``overwrite``, the finished file is linked, never renamed, over the path."""
    if not unnamed:
        monkeypatch.setattr(writer_module, "_open_unnamed", lambda directory: None)
    dest = tmp_path / "x.batch"

    def rows() -> Iterator[np.ndarray]:
        yield from records(8, 4)
        dest.write_bytes(b"someone else's")
        yield from records(8, 4)

    with pytest.raises(WriteError, match=r"x\.batch: output file appeared while it was being"):
        write_batch_dataset(dest, rows(), 16, 4, 4)
    assert dest.read_bytes() == b"someone else's" and os.listdir(tmp_path) == ["x.batch"]


def test_output_that_is_the_mapped_input_is_refused_even_with_overwrite(tmp_path: Path) -> None:
    src = tmp_path / "src.npy"
    np.save(src, records(40, 8))
    before = src.read_bytes()
    os.symlink(src, tmp_path / "alias.npy")
    os.link(src, tmp_path / "hard.npy")
    mm = np.load(src, mmap_mode="r")
    for name in ("src.npy", "alias.npy", "hard.npy"):
        for array in (mm, mm[2:], np.asarray(mm), mm.view(np.ndarray)):
            with pytest.raises(WriteError, match=r"is the input file .*src\.npy \(same device"):
                write_batch_file(tmp_path / name, array, 4, overwrite=True)
        with pytest.raises(WriteError, match="is the input file"):
            write_batch_dataset(tmp_path / name, iter(mm), 40, 4, 8, overwrite=True)
        with pytest.raises(WriteError, match="is the input file"):
            write_batch_dataset(tmp_path / name, iter(mm[:5]), None, 4, 8, overwrite=True)
    del mm
    assert src.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["alias.npy", "hard.npy", "src.npy"]


@pytest.mark.parametrize("how", WRITERS)
def test_output_without_batches_is_refused_unless_allowed(tmp_path: Path, how: str) -> None:
    dest = tmp_path / "x.batch"
    message = (
        r"x\.batch: the output would hold 0 batches: 3 records are fewer than batch_size=4; "
        r"pass allow_empty=True"
    )
    with pytest.raises(WriteError, match=message):
        write_with(how, dest, records(3, 4))
    assert os.listdir(tmp_path) == []
    assert write_with(how, dest, records(3, 4), allow_empty=True) == 0
    report = validate_file(dest, deep=True)
    assert report.valid and report.header is not None and report.header.num_batches == 0
    assert dest.stat().st_size == HEADER_SIZE


def test_known_empty_stream_is_refused_before_it_is_read(tmp_path: Path) -> None:
    class Never:
        def __iter__(self) -> Never:
            return self

        def __next__(self) -> np.ndarray:
            raise AssertionError("the stream was read")

    with pytest.raises(WriteError, match="0 batches"):
        write_batch_dataset(tmp_path / "x.batch", Never(), 3, 4, 4)
    assert os.listdir(tmp_path) == []


# --- what a file gets, and what dead writers leave ---------------------------------------------


@pytest.mark.parametrize("unnamed", [True, False])
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_output_mode_is_that_of_any_new_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unnamed: bool, umask: int
) -> None:
    """``0o666 & ~umask``, new or replacing a file of another mode, array or stream."""
    if not unnamed:
        monkeypatch.setattr(writer_module, "_open_unnamed", lambda directory: None)
    old = tmp_path / "b.batch"
    old.write_bytes(b"old")
    old.chmod(0o600)
    previous = os.umask(umask)
    try:
        (tmp_path / "plain").write_bytes(b"")  # how Python creates any new file
        write_batch_file(tmp_path / "a.batch", records(8, 4), 2)
        write_batch_file(old, records(8, 4), 2, overwrite=True)
        write_batch_dataset(tmp_path / "c.batch", iter(records(8, 4)), None, 2, 4)
    finally:
        os.umask(previous)
    want = 0o666 & ~umask
    for name in ("plain", "a.batch", "b.batch", "c.batch"):
        assert (tmp_path / name).stat().st_mode & 0o7777 == want, name


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def test_stale_temporaries_of_dead_writers_are_removed_from_the_directory(tmp_path: Path) -> None:
    dead, live = dead_pid(), os.getppid()
    keep = {
        f".x.batch.{live}.0a1b2c3d.tmp": "a running writer's",
        f".locked.{dead}.0a1b2c3d.tmp": "locked by a running process",
        f".x.batch.{dead}.0a1b2c3d.txt": "not .tmp",
        f".x.batch.{dead}.0a1b2c.tmp": "random part too short",
        f".x.batch.{dead}.0A1B2C3D.tmp": "random part not lowercase",
        f"x.batch.{dead}.0a1b2c3d.tmp": "not hidden",
        f".notes.{dead}.tmp": "no random part",
        ".x.batch.1x.0a1b2c3d.tmp": "no pid",
    }
    remove = [f".other.batch.{dead}.0a1b2c3d.tmp", f".x.batch.{dead}.abc_defg.tmp"]
    for name in [*keep, *remove]:
        (tmp_path / name).write_bytes(b"\0" * 100)
    holder = os.open(tmp_path / f".locked.{dead}.0a1b2c3d.tmp", os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another open file: the writer's flock must fail
    try:
        write_batch_file(tmp_path / "new.batch", records(8, 4), 2)
    finally:
        os.close(holder)
    assert set(os.listdir(tmp_path)) == {*keep, "new.batch"}
    writer_module.remove_stale_temporaries(tmp_path)  # the lock is gone now
    assert f".locked.{dead}.0a1b2c3d.tmp" not in os.listdir(tmp_path)


def test_write_bytes_atomic(tmp_path: Path) -> None:
    dest = tmp_path / "manifest.json"
    writer_module.write_bytes_atomic(dest, b'{"a": 1}')
    with pytest.raises(WriteError, match="already exists"):
        writer_module.write_bytes_atomic(dest, b"{}")
    writer_module.write_bytes_atomic(dest, b"{}", overwrite=True)
    assert dest.read_bytes() == b"{}" and os.listdir(tmp_path) == ["manifest.json"]


# --- operating-system errors -------------------------------------------------------------------


def test_disk_full_names_the_output_and_the_bytes_needed(tmp_path: Path) -> None:
    """A real ``ENOSPC`` (a write to ``/dev/full``) through the writers' one write helper."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    out = str(tmp_path / "out.batch")
    target = writer_module._Target(out, "the output", 123_456_789)
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        with pytest.raises(ZeroBatchIOError) as info:
            writer_module._write_all(fd, np.ones(HEADER_SIZE, np.uint32), 0, target)
    finally:
        os.close(fd)
    e = info.value
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC and e.filename == out
    text = str(e)
    assert "No space left on device while writing 16,384 bytes at offset 0 of the output" in text
    assert f"needs about 123,456,789 bytes (117.7 MiB) free in {tmp_path}" in text


def test_other_write_errors_name_the_output(tmp_path: Path) -> None:
    out = str(tmp_path / "out.batch")
    (tmp_path / "ro").write_bytes(b"")
    fd = os.open(tmp_path / "ro", os.O_RDONLY)  # writing to it fails with EBADF
    try:
        with pytest.raises(ZeroBatchIOError) as info:
            writer_module._write_all(fd, b"x", 0, writer_module._Target(out, "the output", 9))
    finally:
        os.close(fd)
    assert info.value.errno == errno.EBADF and info.value.filename == out
    assert "needs about" not in str(info.value)  # the byte count is for a full disk only


FULL_DISK = r"""
import json, os, sys
import numpy as np
from zerobatch_core import write_batch_dataset, write_batch_file
from zerobatch_core.files import writer
from zerobatch_core.errors import ZeroBatchIOError
from zerobatch_core.ingest.convert import convert

directory, source = sys.argv[1], sys.argv[2]
rows = np.arange(1024 * 256, dtype=np.uint32).reshape(1024, 256)  # 1 MiB: twice the space
results = []
for unnamed in (True, False):
    if not unnamed:
        writer._open_unnamed = lambda d: None
    for how in ("file", "stream", "stream-unknown-count", "convert"):
        out = os.path.join(directory, "out.batch")
        try:
            if how == "file":
                write_batch_file(out, rows, 4)
            elif how == "stream":
                write_batch_dataset(out, iter(rows), 1024, 4, 256)
            elif how == "stream-unknown-count":
                write_batch_dataset(out, iter(rows), None, 4, 256)
            else:
                convert([source], out, seq_len=256, batch_size=4)
            results.append({"how": how, "errno": None})
        except ZeroBatchIOError as e:
            results.append({
                "how": how, "unnamed": unnamed, "errno": e.errno, "filename": e.filename,
                "message": str(e), "left": os.listdir(directory),
            })
print(json.dumps(results))
"""


def test_full_file_system_raises_zerobatch_io_error_and_leaves_nothing(tmp_path: Path) -> None:
    """Every writer on a real 512 KiB tmpfs (mounted in a user namespace, where allowed)."""
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        pytest.skip("needs Linux and unshare(1) for a small private file system")
    small = tmp_path / "small"
    small.mkdir()
    np.save(tmp_path / "src.npy", np.arange(1024 * 256, dtype=np.uint32).reshape(1024, 256))
    mount = 'mount -t tmpfs -o size=512k zerobatch "$1" || exit 97; shift; exec "$@"'
    cmd = [unshare, "-Urm", "sh", "-c", mount, "sh", str(small)]
    cmd += [sys.executable, "-c", FULL_DISK, str(small), str(tmp_path / "src.npy")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode == 97 or (proc.returncode != 0 and "unshare" in proc.stderr):
        pytest.skip(f"no private mount here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert len(results) == 8
    for r in results:
        assert r["errno"] == errno.ENOSPC, r
        assert r["filename"] == str(small / "out.batch"), r
        assert "No space left on device" in r["message"], r
        if r["how"] != "stream-unknown-count":  # the spill's size is unknown while it grows
            assert "needs about" in r["message"] and "bytes" in r["message"], r
        assert r["left"] == [], r  # no output, no temporary, no scratch file
