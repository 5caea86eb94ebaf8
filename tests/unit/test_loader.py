"""BatchNativeLoader: coverage per epoch, the pinned order, the cursor, and its state."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import epoch_key, epoch_order

from zerobatch_core import BatchFileReader, BatchNativeLoader, StateError
from zerobatch_core.order import BlockOrder


def first_tokens(batches: list[np.ndarray]) -> list[int]:
    return [int(b[0, 0]) for b in batches]


def index_of(reader: BatchFileReader) -> dict[int, int]:
    return {int(reader.read_batch(i)[0, 0]): i for i in range(len(reader))}


def test_epoch_serves_each_batch_once_in_the_spec_order(make_file: Callable[..., Path]) -> None:
    path = make_file(n=4 * 37, batch_size=4)
    loader = BatchNativeLoader(path, block_size=5, seed=11)
    pos = index_of(loader.reader)
    served = [pos[t] for t in first_tokens(list(loader))]
    assert served == epoch_order(37, 5, epoch_key(11, 0)).tolist()
    assert sorted(served) == list(range(37))


def test_epochs_differ_and_plain_second_pass_is_next_epoch(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(n=400, batch_size=4), block_size=4)
    e0 = first_tokens(list(loader))
    assert loader.epoch == 1 and loader.step == 0
    e1 = first_tokens(list(loader))
    assert e0 != e1 and sorted(e0) == sorted(e1)
    loader.set_epoch(0)
    assert first_tokens(list(loader)) == e0


def test_default_seed_is_the_files_seed(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(seed=1234))
    assert loader.seed == 1234


def test_unshuffled_is_file_order(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=80, batch_size=4), shuffle=False, block_size=3)
    assert loader.epoch_order().tolist() == list(range(20))
    pos = index_of(loader.reader)
    assert [pos[t] for t in first_tokens(list(loader))] == list(range(20))


@pytest.mark.parametrize("dtype", ["uint32", "int32", "int64"])
def test_output_dtypes(make_file: Callable[..., Path], dtype: str) -> None:
    loader = BatchNativeLoader(make_file(), dtype=dtype)  # type: ignore[arg-type]
    batch = next(iter(loader))
    assert batch.dtype == np.dtype(dtype) and batch.shape == (4, 8)


def test_set_epoch_keeps_the_position_within_the_same_epoch(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(), block_size=2)
    it = iter(loader)
    next(it), next(it)
    loader.set_epoch(0)
    assert loader.step == 2
    loader.set_epoch(3)
    assert (loader.epoch, loader.step) == (3, 0)
    assert list(it) == []  # moving the cursor ended the old pass


def test_state_round_trip_resumes_exactly(make_file: Callable[..., Path]) -> None:
    path = make_file(n=4 * 23, batch_size=4)
    full = BatchNativeLoader(path, block_size=4)
    reference = first_tokens(list(full)) + first_tokens(list(full))
    for k in (0, 1, 7, 22, 23, 30):
        a = BatchNativeLoader(path, block_size=4)
        got: list[int] = []
        it = iter(a)
        for _ in range(k):
            try:
                got.append(int(next(it)[0, 0]))
            except StopIteration:
                it = iter(a)
                got.append(int(next(it)[0, 0]))
        state = json.loads(json.dumps(a.state_dict()))  # survives JSON
        b = BatchNativeLoader(path, block_size=4)
        b.load_state_dict(state)
        while len(got) < 46:
            got.extend(first_tokens(list(b)))
        assert got[:46] == reference, k


def test_state_after_last_batch_is_start_of_next_epoch(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=8, batch_size=4))
    list(loader)
    s = loader.state_dict()
    assert (s["epoch"], s["step"]) == (1, 0)
    s["epoch"], s["step"] = 0, 2  # an equivalent spelling of the same cursor
    loader.load_state_dict(s)
    assert (loader.epoch, loader.step) == (1, 0)


def test_epoch_after_the_last_u64_epoch_wraps_to_zero(make_file: Callable[..., Path]) -> None:
    last = 2**64 - 1
    loader = BatchNativeLoader(make_file(n=8, batch_size=4), epoch=last)
    list(loader)
    assert (loader.epoch, loader.step) == (0, 0)
    s = loader.state_dict()
    s["epoch"], s["step"] = last, 2  # a finished last epoch, spelled as the spec allows
    loader.load_state_dict(s)
    assert (loader.epoch, loader.step) == (0, 0)


def test_mismatched_states_are_rejected(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(), block_size=4)
    good = loader.state_dict()
    for key, value in (
        ("block_size", 8),
        ("seed", 1),
        ("num_batches", 3),
        ("shuffle", False),
        ("step", 11),
        ("step", -1),
        ("version", 2),
        ("format", "x"),
    ):
        bad = dict(good, **{key: value})
        with pytest.raises(StateError, match=key if key not in ("version", "format") else None):
            loader.load_state_dict(bad)
    with pytest.raises(StateError):
        loader.load_state_dict([])  # type: ignore[arg-type]


def test_argument_checks(make_file: Callable[..., Path]) -> None:
    path = make_file()
    with pytest.raises(ValueError, match="block_size"):
        BatchNativeLoader(path, block_size=0)
    with pytest.raises(ValueError, match="dtype"):
        BatchNativeLoader(path, dtype="float32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        BatchNativeLoader(path, seed=-1)
    with pytest.raises(ValueError, match="epoch"):
        BatchNativeLoader(path).set_epoch(2**64)


def test_zero_batch_file_iterates_nothing(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=3, batch_size=4))
    assert len(loader) == 0 and list(loader) == []


@pytest.mark.parametrize("n", [1, 9, 10, 11, 64])
@pytest.mark.parametrize("bs", [1, 3, 10, 100])
@pytest.mark.parametrize("shuffle", [True, False])
def test_block_order_spans_resume_from_any_step(n: int, bs: int, shuffle: bool) -> None:
    order = BlockOrder(n, bs, seed=5, shuffle=shuffle)
    full = order.epoch_order(2).tolist()
    for start in range(n + 1):
        assert list(order.indices(2, start)) == full[start:]
