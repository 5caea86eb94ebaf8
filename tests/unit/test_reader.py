"""BatchFileReader: zero-copy read-only views, dtype variants, bounds, lifetime, odd paths."""

from __future__ import annotations

import errno
import os
import pickle
import platform
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import U32_MAX, Header, build_header

from tests.helpers import expected_batches, records
from zerobatch_core import (
    BatchFileReader,
    BatchNativeLoader,
    ErrorCode,
    FormatError,
    ZeroBatchError,
    validate_file,
    write_batch_file,
)


def test_header_fields_and_contents(make_file: Callable[..., Path]) -> None:
    path = make_file(n=42, seq_len=8, batch_size=4, seed=7)
    with BatchFileReader(path) as r:
        assert (r.version, r.batch_size, r.seq_len, r.num_batches) == (1, 4, 8, 10)
        assert (r.dtype, r.seed, r.total_records, len(r)) == (0, 7, 42, 10)
        assert r.padded_batch_bytes == 4096 and r.raw_batch_bytes == 128
        assert r.file_size == os.path.getsize(path)
        want = expected_batches(records(42, 8), 4, 7)
        for i in range(10):
            np.testing.assert_array_equal(r.read_batch(i), want[i])
        np.testing.assert_array_equal(r.read_batches(2, 5), want[2:5])


def test_read_batch_is_a_read_only_zero_copy_view(make_file: Callable[..., Path]) -> None:
    with BatchFileReader(make_file()) as r:
        a, b = r.read_batch(3), r.read_batch(3)
        assert a.dtype == np.uint32 and a.shape == (4, 8)
        assert not a.flags.writeable
        assert np.shares_memory(a, b)  # both views of the same mapped pages
        with pytest.raises(ValueError):
            a[0, 0] = 1


def test_int32_view_and_int64_copy(tmp_path: Path) -> None:
    src = np.array([[0, 1, 2**31 - 1, 2**31], [5, 6, 7, 2**32 - 1]], dtype=np.uint32)
    path = tmp_path / "x.batch"
    write_batch_file(path, src, batch_size=2, seed=0)
    with BatchFileReader(path) as r:
        u = r.read_batch(0)
        i32 = r.read_batch_int32(0)
        assert i32.dtype == np.int32 and np.shares_memory(u, i32)
        i64 = r.read_batch_int64(0)
        assert i64.dtype == np.int64 and not np.shares_memory(u, i64)
        np.testing.assert_array_equal(i64, u.astype(np.int64))
        assert int(i64.max()) == 2**32 - 1
        out = np.empty((2, 4), dtype=np.int64)
        assert r.read_batch_int64(0, out=out) is out
        np.testing.assert_array_equal(out, i64)
        with pytest.raises(ValueError):
            r.read_batch_int64(0, out=np.empty((2, 4), dtype=np.int32))


def test_index_bounds(make_file: Callable[..., Path]) -> None:
    with BatchFileReader(make_file()) as r:
        np.testing.assert_array_equal(r.read_batch(-1), r.read_batch(len(r) - 1))
        for bad in (len(r), -len(r) - 1):
            with pytest.raises(IndexError, match="out of range"):
                r.read_batch(bad)
        with pytest.raises(TypeError):
            r.read_batch(1.0)  # type: ignore[arg-type]
        with pytest.raises(IndexError):
            r.read_batches(3, 2)


def test_close_and_context_manager(make_file: Callable[..., Path]) -> None:
    r = BatchFileReader(make_file())
    kept = r.read_batch(0).copy()
    view = r.read_batch(0)
    r.close()
    r.close()  # idempotent
    assert r.closed
    np.testing.assert_array_equal(view, kept)  # an outstanding view stays valid
    with pytest.raises(ValueError, match="closed"):
        r.read_batch(0)


def test_zero_batch_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.batch"
    write_batch_file(path, records(3, 8), batch_size=4, seed=7, allow_empty=True)
    with BatchFileReader(path) as r:
        assert len(r) == 0 and r.total_records == 3
        assert r.read_batches(0, 0).shape == (0, 4, 8)
        with pytest.raises(IndexError):
            r.read_batch(0)


def test_not_a_regular_file(tmp_path: Path) -> None:
    """Like a missing path, a path that is not a regular file is an OSError naming it."""
    with pytest.raises(ZeroBatchError, match="not a regular file") as directory:
        BatchFileReader(tmp_path)
    assert isinstance(directory.value, OSError) and directory.value.errno == errno.EISDIR
    assert directory.value.filename == str(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file") as pipe:
        BatchFileReader(fifo)  # must not block waiting for a writer
    assert isinstance(pipe.value, ZeroBatchError) and pipe.value.filename == str(fifo)


def test_missing_file_raises_oserror_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.batch"):
        BatchFileReader(tmp_path / "nope.batch")


def test_pickles_by_path_for_worker_processes(make_file: Callable[..., Path]) -> None:
    with BatchFileReader(make_file()) as r:
        clone = pickle.loads(pickle.dumps(r))
        np.testing.assert_array_equal(clone.read_batch(2), r.read_batch(2))
        clone.close()


def _kernel_at_least(major: int, minor: int) -> bool:
    parts = platform.release().split(".")
    try:
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (IndexError, ValueError):
        return False


def _mapped_pages(base: int, first: int, count: int) -> list[bool]:
    """Whether each page of this process's mapping at ``base`` is in its page tables.

    Read from ``/proc/self/pagemap`` (bit 63 of each 8-byte entry: page present). This is what
    ``madvise(MADV_POPULATE_READ)`` changes, unlike page-cache residency, which a file just
    written already has.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/pagemap", "rb") as f:
        f.seek((base // page + first) * 8)
        entries = struct.unpack(f"{count}Q", f.read(8 * count))
    return [bool(e >> 63) for e in entries]


@pytest.mark.skipif(
    sys.platform != "linux" or not _kernel_at_least(5, 14),
    reason="MADV_POPULATE_READ (the read-ahead thread's call) needs Linux 5.14",
)
def test_read_ahead_maps_the_requested_batches(tmp_path: Path) -> None:
    """``read_ahead`` returns at once and a thread maps that range's pages soon after.

    1024 batches of one 4096-byte slot each. Nothing of the mapping is touched before the
    request (checked), so every page found mapped afterwards is the read-ahead thread's work.
    The kernel may map neighbours along with a requested page (fault-around, large folios:
    at most a 2 MiB-aligned run), so only batches more than 2 MiB away must stay unmapped.
    """
    path = tmp_path / "ra.batch"
    write_batch_file(path, records(4096, 256), batch_size=4, seed=3)
    page = os.sysconf("SC_PAGE_SIZE")
    with BatchFileReader(path) as r:
        assert r.padded_batch_bytes == page == 4096 and len(r) == 1024
        base = r.read_batches(0, 1).ctypes.data - 4096  # the mapping starts with the header
        assert base % page == 0
        pages = len(r) + 1
        assert not any(_mapped_pages(base, 0, pages))  # fresh mapping: nothing mapped yet
        r.read_ahead(700, 960)  # 260 slots: 1.02 MiB, at least MIN_HINT_BYTES
        r.read_ahead(3, 3)  # an empty range is ignored
        r.read_ahead(10, 20)  # 40 KiB: below MIN_HINT_BYTES, left to the kernel
        r.read_ahead(760, 5000)  # a range past the end is clipped to the file
        want = [*range(701, 961), *range(1000, 1025)]  # the page of batch i is page i + 1
        deadline = time.monotonic() + 10.0
        while not all(_mapped_pages(base, 0, pages)[p] for p in want):
            assert time.monotonic() < deadline, "read-ahead never mapped the requested pages"
            time.sleep(0.01)
        mapped = _mapped_pages(base, 0, pages)
        assert not any(mapped[:400]), [i for i, m in enumerate(mapped[:400]) if m]


@pytest.mark.parametrize(
    ("batch_size", "seq_len"),
    [(U32_MAX, U32_MAX), (2**31, 2**30), (U32_MAX - 1, 1203513306)],
    ids=["max-shape", "batch-of-2^63-bytes", "found-by-fuzzing"],
)
def test_huge_shape_without_batches_is_valid(tmp_path: Path, batch_size: int, seq_len: int) -> None:
    """A shape whose batch exceeds NumPy's size limit, with no batches, passes rules 1-8.

    ``batch_size = seq_len = 2**32 - 1`` makes one batch about 2**66 bytes; from 2**63 bytes on,
    NumPy cannot represent even an empty ``[0, B, T]`` view. The reader used to raise NumPy's
    "Maximum allowed dimension exceeded" for these files. Regression for vector
    ``valid-zero-batches-max-shape`` (the third shape is one the fuzzer found).
    """
    path = tmp_path / "huge.batch"
    path.write_bytes(build_header(Header(batch_size, seq_len, 0, 5, 0)))
    words = batch_size * seq_len
    assert words * 4 >= 2**63
    with BatchFileReader(path) as r:
        assert (len(r), r.batch_size, r.seq_len, r.file_size) == (0, batch_size, seq_len, 4096)
        assert r.padded_batch_bytes == 4096 * -(-words // 1024)
        assert r.slot_padding(0, 0).shape == (0, r.padded_batch_bytes // 4 - words)
        r.check_size()
        r.read_ahead(0, 10)
        with pytest.raises(IndexError):
            r.read_batch(0)
        with pytest.raises(ZeroBatchError, match="NumPy cannot represent"):
            r.read_batches(0, 0)
    report = validate_file(path, deep=True)
    assert report.valid and report.header is not None and report.header.num_batches == 0
    loader = BatchNativeLoader(path, dtype="int64", next_token=True)
    assert list(loader) == [] and loader.epoch == 1


@pytest.mark.parametrize(("batch_size", "seq_len"), [(1, U32_MAX), (2**31, 2**30 - 1)])
def test_representable_empty_shape_keeps_its_shape(
    tmp_path: Path, batch_size: int, seq_len: int
) -> None:
    path = tmp_path / "wide.batch"
    path.write_bytes(build_header(Header(batch_size, seq_len, 0, 0, 0)))
    with BatchFileReader(path) as r:
        empty = r.read_batches(0, 0)
        assert empty.shape == (0, batch_size, seq_len) and not empty.flags.writeable


def test_check_size_reports_a_file_changed_under_the_reader(
    make_file: Callable[..., Path],
) -> None:
    path = make_file(n=40, seq_len=8, batch_size=4)
    size = os.path.getsize(path)
    r = BatchFileReader(path)
    r.check_size()  # unchanged: no error
    os.truncate(path, size - 4096)
    with pytest.raises(FormatError) as info:
        r.check_size()
    e = info.value
    assert e.code is ErrorCode.SIZE_MISMATCH and e.path == str(path)
    assert f"{size - 4096} bytes now" in str(e) and f"requires {size}" in str(e)
    assert "truncated" in str(e) and str(path) in str(e)
    os.truncate(path, size + 1)
    with pytest.raises(FormatError, match="extended"):
        r.check_size()
    r.close()
    with pytest.raises(ValueError, match="closed"):
        r.check_size()


FAULT_CHILD = r"""
import faulthandler, sys
from zerobatch_core import BatchFileReader
if sys.argv[2] == "own":
    own = open(sys.argv[3], "w")
    faulthandler.enable(file=own)
before = faulthandler.is_enabled()
BatchFileReader(sys.argv[1]).close()
print(before, faulthandler.is_enabled(), flush=True)
faulthandler._read_null()  # a real SIGSEGV: the enabled handler reports it
"""


@pytest.mark.skipif(sys.platform != "linux", reason="fatal-signal reports checked on Linux")
def test_first_reader_enables_faulthandler_unless_the_program_did(
    make_file: Callable[..., Path], tmp_path: Path
) -> None:
    path = str(make_file())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    plain = subprocess.run(
        [sys.executable, "-c", FAULT_CHILD, path, "plain"], capture_output=True, env=env
    )
    assert plain.stdout.decode().split() == ["False", "True"]
    assert plain.returncode < 0 and "Fatal Python error" in plain.stderr.decode()
    own_log = tmp_path / "own.log"
    own = subprocess.run(
        [sys.executable, "-c", FAULT_CHILD, path, "own", str(own_log)],
        capture_output=True,
        env=env,
    )
    assert own.stdout.decode().split() == ["True", "True"]
    # The program's own handler (writing to its own file) is the one that reported the fault.
    assert "Fatal Python error" in own_log.read_text()
    assert "Fatal Python error" not in own.stderr.decode()
