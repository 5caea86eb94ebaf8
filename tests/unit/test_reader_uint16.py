"""``BatchFileReader`` on uint16 (dtype 1) files: views of the stored tokens, exact widened
reads, the padding view, the identity a loader state records, and a file without batches."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import DTYPE_UINT16, Header, build_header

from tests.helpers import expected_batches
from tests.narrow import narrow_file
from zerobatch_core import BatchFileReader, ZeroBatchError, write_batch_file

B, T = 3, 7
U16 = np.dtype("<u2")


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    """A uint32 file and its uint16 twin of ids up to 65,535 (the top of uint16 included)."""
    rows = (np.arange(60 * T).reshape(60, T) * 4099 + 60_000) % 65_536
    rows[0, 0] = 65_535
    wide, narrow = tmp_path / "w.batch", tmp_path / "n.batch"
    write_batch_file(wide, rows, B, seed=4)
    narrow_file(wide, narrow)
    return wide, narrow, expected_batches(rows, B, 4)


def test_reads_are_views_of_uint16_tokens(pair: tuple[Path, Path, np.ndarray]) -> None:
    _, narrow, want = pair
    with BatchFileReader(narrow) as r:
        assert (r.dtype, r.token_dtype, r.raw_batch_bytes, r.padded_batch_bytes) == (
            1, U16, B * T * 2, 4096,
        )  # fmt: skip
        every = r.read_batches(0, r.num_batches)
        assert every.dtype == U16 and not every.flags.writeable
        np.testing.assert_array_equal(every, want)
        one = r.read_batch(2)
        assert one.dtype == U16 and np.shares_memory(one, every)
        pad = r.slot_padding(0, r.num_batches)
        assert pad.dtype == U16 and pad.shape == (20, 4096 // 2 - B * T) and not pad.any()
        assert "dtype=uint16" in repr(r)


def test_widened_reads_are_exact(pair: tuple[Path, Path, np.ndarray]) -> None:
    _, narrow, want = pair
    with BatchFileReader(narrow) as r:
        for i in range(r.num_batches):
            as32 = r.read_batch_int32(i)
            assert as32.dtype == np.int32 and int(as32.min()) >= 0  # ids >= 32,768 stay positive
            np.testing.assert_array_equal(as32, want[i])
            np.testing.assert_array_equal(r.read_batch_int64(i), want[i].astype(np.int64))
        out = np.empty((B, T), np.int64)
        assert r.read_batch_int64(0, out=out) is out and int(out[0].max()) <= 65_535
        assert int(want.max()) == 65_535


def test_a_twin_file_has_its_own_identity(pair: tuple[Path, Path, np.ndarray]) -> None:
    wide, narrow, _ = pair
    with BatchFileReader(wide) as w, BatchFileReader(narrow) as n, BatchFileReader(narrow) as m:
        assert n.identity() == m.identity() != w.identity()
        assert n.identity()["file"]["size"] == n.file_size


def test_an_empty_file_of_an_unrepresentable_shape_names_uint16(tmp_path: Path) -> None:
    path = tmp_path / "e.batch"
    h = Header(2**32 - 1, 2**32 - 1, 0, 0, 0)
    path.write_bytes(build_header(dataclasses.replace(h, dtype=DTYPE_UINT16)))
    with BatchFileReader(path) as r:
        assert r.num_batches == 0 and r.token_dtype == U16
        with pytest.raises(ZeroBatchError, match=r"empty \[0, 4294967295, 4294967295\] uint16"):
            r.read_batches(0, 0)
