"""Rank rows, worker steps and next-token pairs: every row of an epoch exactly once."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from zerobatch_core import BatchNativeLoader, StateError
from zerobatch_core.delivery.distributed import env_rank_world, rank_rows, resolve_rank_world


def rows_of(item: np.ndarray) -> list[int]:
    return [int(r[0]) for r in item]


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_row_once_per_epoch_over_ranks_and_workers(
    make_file: Callable[..., Path], world: int, workers: int
) -> None:
    path = make_file(n=8 * 13, seq_len=4, batch_size=8)  # 13 batches of 8 rows
    seen: Counter[int] = Counter()
    per_step: dict[int, list[int]] = {}
    for rank in range(world):
        for w in range(workers):
            loader = BatchNativeLoader(path, block_size=3, rank=rank, world_size=world)
            loader.split_workers(w, workers)
            steps = range(w, 13, workers)
            for step, item in zip(steps, loader, strict=True):
                assert item.shape == (8 // world, 4)
                seen.update(rows_of(item))
                per_step.setdefault(step, []).extend(rows_of(item))
            assert loader.epoch == 1 and loader.step == w
    assert len(seen) == 13 * 8 and set(seen.values()) == {1}
    whole = BatchNativeLoader(path, block_size=3)
    for step, batch in enumerate(whole):
        assert sorted(per_step[step]) == sorted(rows_of(batch))  # a step is one file batch


def test_rank_rows_rules() -> None:
    assert rank_rows(8, 3, 4) == slice(6, 8)
    with pytest.raises(ValueError, match="does not split evenly"):
        rank_rows(6, 0, 4)
    with pytest.raises(ValueError, match="outside"):
        rank_rows(8, 4, 4)
    with pytest.raises(ValueError):
        rank_rows(8, -1, 4)


def test_env_rank_world() -> None:
    assert env_rank_world({}) is None
    assert env_rank_world({"RANK": "2", "WORLD_SIZE": "4"}) == (2, 4)
    with pytest.raises(ValueError, match="outside"):
        env_rank_world({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="integers"):
        env_rank_world({"RANK": "x", "WORLD_SIZE": "4"})
    assert resolve_rank_world(1, 2) == (1, 2)
    assert resolve_rank_world(None, None, (3, 4)) == (3, 4)
    with pytest.raises(ValueError, match="both"):
        resolve_rank_world(1, None)


def test_next_token_pairs(make_file: Callable[..., Path]) -> None:
    path = make_file(n=16, seq_len=6, batch_size=4)
    plain = list(BatchNativeLoader(path, dtype="int64"))
    for dtype in ("uint32", "int32", "int64"):
        pairs = list(BatchNativeLoader(path, dtype=dtype, next_token=True))  # type: ignore[arg-type]
        for batch, (inputs, labels) in zip(plain, pairs, strict=True):
            assert inputs.dtype == np.dtype(dtype) and labels.dtype == np.int64
            np.testing.assert_array_equal(inputs, batch[:, :-1])
            np.testing.assert_array_equal(labels, batch[:, 1:])


def test_worker_state_resumes_the_worker(make_file: Callable[..., Path]) -> None:
    path = make_file(n=4 * 20, batch_size=4)
    ref = BatchNativeLoader(path, block_size=3)
    ref.split_workers(1, 3)
    want = [rows_of(b) for b in ref]
    a = BatchNativeLoader(path, block_size=3)
    a.split_workers(1, 3)
    it = iter(a)
    got = [rows_of(next(it)) for _ in range(3)]
    state = json.loads(json.dumps(a.state_dict()))
    assert (state["num_workers"], state["worker"], state["step"]) == (3, 1, 10)
    b = BatchNativeLoader(path, block_size=3)
    b.load_state_dict(state)
    b.split_workers(1, 3)  # what an adapter does in the worker: a no-op here
    got += [rows_of(x) for x in b]
    assert got == want
    with pytest.raises(StateError):
        b.split_workers(0, 2)
    with pytest.raises(StateError, match="not one of worker"):
        BatchNativeLoader(path, block_size=3).load_state_dict(dict(state, step=11))


def test_resume_with_a_different_world_size(make_file: Callable[..., Path]) -> None:
    path = make_file(n=8 * 10, batch_size=8)
    two = [BatchNativeLoader(path, rank=r, world_size=2) for r in range(2)]
    its = [iter(x) for x in two]
    first = [sorted(rows_of(next(its[0])) + rows_of(next(its[1]))) for _ in range(4)]
    state = two[0].state_dict()
    four = [BatchNativeLoader(path, rank=r, world_size=4) for r in range(4)]
    for x in four:
        x.load_state_dict(state)
    rest = [sorted(r for b in step for r in rows_of(b)) for step in zip(*four, strict=True)]
    whole = [sorted(rows_of(b)) for b in BatchNativeLoader(path)]
    assert first + rest == whole
