"""BatchFileReader: zero-copy read-only views, dtype variants, bounds, lifetime, odd paths."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import expected_batches, records
from zerobatch_core import BatchFileReader, ZeroBatchError


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
    from zerobatch_core import write_batch_file

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


def test_zero_batch_file(make_file: Callable[..., Path]) -> None:
    with BatchFileReader(make_file(n=3, batch_size=4)) as r:
        assert len(r) == 0 and r.total_records == 3
        assert r.read_batches(0, 0).shape == (0, 4, 8)
        with pytest.raises(IndexError):
            r.read_batch(0)


def test_not_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(ZeroBatchError, match="not a regular file"):
        BatchFileReader(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ZeroBatchError, match="not a regular file"):
        BatchFileReader(fifo)  # must not block waiting for a writer


def test_missing_file_raises_oserror_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.batch"):
        BatchFileReader(tmp_path / "nope.batch")


def test_pickles_by_path_for_worker_processes(make_file: Callable[..., Path]) -> None:
    with BatchFileReader(make_file()) as r:
        clone = pickle.loads(pickle.dumps(r))
        np.testing.assert_array_equal(clone.read_batch(2), r.read_batch(2))
        clone.close()


def test_read_ahead_is_harmless(make_file: Callable[..., Path]) -> None:
    with BatchFileReader(make_file()) as r:
        r.read_ahead(0, len(r))
        r.read_ahead(5, 100)
        r.read_ahead(3, 3)
