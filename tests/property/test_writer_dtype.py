"""Property: the same records and seed written as uint16 and as uint32, by any writer path,
give files that hold the same batches value for value (the spec's permutation), and
``"auto"`` gives the uint16 file byte for byte when every token fits."""

from __future__ import annotations

import os
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zerobatch_spec import DTYPE_UINT16, DTYPE_UINT32, expected_file_size, parse_header

from tests.helpers import expected_batches
from zerobatch_core import BatchFileReader, write_batch_dataset, write_batch_file

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _write(path: str, how: str, src: np.ndarray, b: int, seed: int, dtype: str) -> None:
    n, t = src.shape
    if how == "array":
        write_batch_file(path, src, b, t, seed, allow_empty=True, dtype=dtype)
        return
    blocks = [src[i : i + 5] for i in range(0, n, 5)]
    total = n if how == "stream" else None
    write_batch_dataset(path, iter(blocks), total, b, t, seed, allow_empty=True, dtype=dtype)


@SETTINGS
@given(
    n=st.integers(0, 200),
    seq_len=st.integers(1, 40),
    batch_size=st.integers(1, 30),
    seed=st.integers(0, 2**32 - 1),
    how=st.sampled_from(["array", "stream", "spilled"]),
    input_dtype=st.sampled_from([np.uint16, np.uint32, np.int32, np.int64]),
)
def test_uint16_and_uint32_files_of_the_same_records_hold_equal_batches(
    n: int, seq_len: int, batch_size: int, seed: int, how: str, input_dtype: type
) -> None:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 2**16, size=(n, seq_len), dtype=np.int64).astype(input_dtype)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {d: os.path.join(tmp, f"{d}.batch") for d in ("uint16", "uint32", "auto")}
        for dtype, path in paths.items():
            _write(path, how, src, batch_size, seed, dtype)
        nb = n // batch_size
        with BatchFileReader(paths["uint16"]) as a, BatchFileReader(paths["uint32"]) as b:
            assert (a.dtype, b.dtype) == (DTYPE_UINT16, DTYPE_UINT32)
            assert (a.num_batches, a.total_records, a.seed) == (nb, n, seed)
            assert (b.num_batches, b.total_records, b.seed) == (nb, n, seed)
            assert a.file_size == expected_file_size(batch_size, seq_len, nb, DTYPE_UINT16)
            if nb:
                want = expected_batches(src, batch_size, seed)
                np.testing.assert_array_equal(a.read_batches(0, nb), want)
                np.testing.assert_array_equal(b.read_batches(0, nb), want)
        with open(paths["auto"], "rb") as fa, open(paths["uint16"], "rb") as fb:
            auto, u16 = fa.read(), fb.read()
        assert parse_header(auto).dtype == DTYPE_UINT16 and auto == u16
