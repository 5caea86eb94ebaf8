"""BufferPool: reuse only arrays nobody holds; int64 loader paths never overwrite a held batch."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from zerobatch_core import BatchFileReader, BatchNativeLoader
from zerobatch_core.delivery.buffers import BufferPool, convert_into
from zerobatch_core.delivery.loader import CHUNK_DEPTH, CHUNK_SPARE


def test_a_dropped_array_is_handed_out_again() -> None:
    pool = BufferPool((4, 8), np.int64)
    a = pool.take()
    address = a.ctypes.data
    del a
    b = pool.take()
    assert b.ctypes.data == address and b.shape == (4, 8) and b.dtype == np.int64
    assert len(pool) == 1


@pytest.mark.parametrize(
    "hold",
    [
        lambda a: a,
        lambda a: a[1:],
        lambda a: a.view(np.uint64),
        lambda a: a.reshape(-1),
        lambda a: memoryview(a),
    ],
    ids=["array", "slice", "view", "reshape", "memoryview"],
)
def test_a_held_array_or_anything_made_from_it_is_never_reused(hold: Callable) -> None:
    pool = BufferPool((4, 8), np.int64)
    a = pool.take()
    kept = hold(a)
    address = a.ctypes.data
    del a
    b = pool.take()
    assert b.ctypes.data != address
    del kept, b
    assert pool.take().ctypes.data == address


def test_capacity_bounds_the_pool_and_extra_arrays_are_fresh() -> None:
    pool = BufferPool((2, 2), np.int64, capacity=2)
    held = [pool.take() for _ in range(5)]
    assert len(pool) == 2
    assert len({h.ctypes.data for h in held}) == 5


def test_convert_into_falls_back_for_other_shapes() -> None:
    pool = BufferPool((2, 3), np.int64)
    src = np.arange(6, dtype=np.uint32).reshape(2, 3)
    out = convert_into(pool, src, np.int64)
    assert out.dtype == np.int64 and np.array_equal(out, src)
    other = convert_into(pool, src[:, :2], np.int64)
    assert np.array_equal(other, src[:, :2]) and len(pool) == 1


@pytest.mark.parametrize("next_token", [False, True])
@pytest.mark.parametrize("bos", [None, 3])
def test_int64_batches_kept_by_the_caller_stay_intact(
    make_file: Callable[..., Path], next_token: bool, bos: int | None
) -> None:
    path = make_file(n=64, seq_len=8, batch_size=4)
    kept = list(BatchNativeLoader(path, dtype="int64", next_token=next_token, bos_id=bos))
    order = BatchNativeLoader(path).epoch_order()
    with BatchFileReader(path) as reader:
        for item, index in zip(kept, order, strict=True):
            tokens = reader.read_batch(int(index)).astype(np.int64)
            if bos is not None:
                item = (item["inputs"], item["labels"]) if next_token else item["tokens"]
            if next_token:
                assert np.array_equal(item[0], tokens[:, :-1])
                assert np.array_equal(item[1], tokens[:, 1:])
            else:
                assert np.array_equal(item, tokens)


def test_int64_loader_reuses_buffers_when_batches_are_dropped(
    make_file: Callable[..., Path],
) -> None:
    path = make_file(n=64, seq_len=8, batch_size=4)
    chunked = BatchNativeLoader(path, dtype="int64", block_size=4)  # one chunk per block
    bases = {batch.base.ctypes.data for batch in chunked}
    assert len(bases) <= CHUNK_DEPTH + CHUNK_SPARE < 16
    per_step = BatchNativeLoader(path, dtype="int64", global_batch_size=8)  # loop-thread path
    addresses = {batch.ctypes.data for batch in per_step}
    assert len(addresses) <= 2  # the loop variable holds one while the next is made


def test_take_is_safe_from_several_threads() -> None:
    pool = BufferPool((2, 2), np.int64, capacity=4)
    held: list[list[np.ndarray]] = [[] for _ in range(4)]

    def grab(mine: list[np.ndarray]) -> None:
        for _ in range(200):
            mine.append(pool.take())
            if len(mine) > 2:
                mine.pop(0)

    threads = [threading.Thread(target=grab, args=(h,)) for h in held]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    addresses = [a.ctypes.data for h in held for a in h]
    assert len(addresses) == len(set(addresses))  # no array handed to two holders at once
