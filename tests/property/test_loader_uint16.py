"""Property: a uint16 file or dataset serves exactly the uint32 twin's values, in every output.

For random shapes, seeds, block sizes, output and label dtypes, next-token pairs, document
layouts, data- and context-parallel coordinates and global batch sizes, the loader over a
uint16 source (``tests/narrow.py``: the spec twin of a uint32 one) and over the uint32 source
must serve items of the same values in the same order, of the same dtype wherever the output
and label dtypes are named (``native`` serves each source's own). Arguments the loader refuses
are refused for both, with the same message.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.narrow import narrow_dataset, narrow_file
from zerobatch_core import BatchNativeLoader, write_batch_file, write_sharded_dataset

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _arrays(item: Any) -> list[np.ndarray]:
    if isinstance(item, dict):
        return [np.asarray(item[k]) for k in sorted(item)]
    return [np.asarray(x) for x in item] if isinstance(item, tuple) else [np.asarray(item)]


def _serve(path: Path, kw: dict[str, Any], epochs: int) -> list[Any] | str:
    """Every item of ``epochs`` passes, or the refusal's message without the path."""
    try:
        loader = BatchNativeLoader(path, **kw)
    except ValueError as e:
        return str(e).replace(str(path), "<path>")
    with loader.source:
        return [_arrays(item) for _ in range(epochs) for item in loader]


@SETTINGS
@given(
    n=st.integers(1, 90),
    seq_len=st.integers(2, 12),
    batch_size=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    shard_batches=st.one_of(st.none(), st.integers(1, 4)),
    dtype=st.sampled_from(["native", "uint32", "int32", "int64"]),
    label_dtype=st.sampled_from(["int64", "uint32", "native"]),
    next_token=st.booleans(),
    bos=st.booleans(),
    block_size=st.integers(1, 5),
    shuffle=st.booleans(),
    world_size=st.sampled_from([1, 2, 3]),
    context_size=st.sampled_from([1, 2]),
    zigzag=st.booleans(),
    scale=st.sampled_from([None, "double", "half"]),
    data=st.data(),
)
def test_a_uint16_source_serves_the_uint32_twins_values(
    n: int,
    seq_len: int,
    batch_size: int,
    seed: int,
    shard_batches: int | None,
    dtype: str,
    label_dtype: str,
    next_token: bool,
    bos: bool,
    block_size: int,
    shuffle: bool,
    world_size: int,
    context_size: int,
    zigzag: bool,
    scale: str | None,
    data: st.DataObject,
) -> None:
    # Small ids (a few repeat, so documents start often) or ids near the top of uint16.
    top = data.draw(st.sampled_from([5, 65_536]))
    rows = np.random.default_rng(seed).integers(max(0, top - 1000), top, size=(n, seq_len))
    g = {"double": 2 * batch_size, "half": max(1, batch_size // 2), None: None}[scale]
    kw: dict[str, Any] = {
        "dtype": dtype,
        "label_dtype": label_dtype,
        "next_token": next_token,
        "bos_id": int(rows[0, 0]) if bos else None,
        "block_size": block_size,
        "shuffle": shuffle,
        "seed": seed % 1000,
        "rank": data.draw(st.integers(0, world_size - 1)),
        "world_size": world_size,
        "context_rank": data.draw(st.integers(0, context_size - 1)),
        "context_size": context_size,
        "zigzag": zigzag,
        "global_batch_size": g,
    }
    with tempfile.TemporaryDirectory() as tmp:
        wide, narrow = Path(tmp) / "w", Path(tmp) / "n"
        if shard_batches is None:
            written = write_batch_file(wide, rows, batch_size, seed=seed, allow_empty=True)
            if written:
                narrow_file(wide, narrow)
        else:
            written = write_sharded_dataset(
                wide,
                [rows],
                batch_size=batch_size,
                seq_len=seq_len,
                shard_batches=shard_batches,
                seed=seed,
                allow_empty=True,
            )
            if written:
                narrow_dataset(wide, narrow)
        if not written:
            return
        a, b = _serve(wide, kw, 2), _serve(narrow, kw, 2)
    if isinstance(a, str):
        assert b == a
        return
    assert not isinstance(b, str) and len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert len(x) == len(y)
        for p, q in zip(x, y, strict=True):
            np.testing.assert_array_equal(p, q)
            assert p.shape == q.shape
            if "native" not in (dtype, label_dtype):
                assert p.dtype == q.dtype
