"""``skip_steps`` with a global batch size other than the stored one, in later epochs.

A skipped range names *global* steps, ``epoch * len(loader) + step``, where ``len(loader)`` is
counted in steps of ``global_batch_size`` samples, not in stored batches. Whatever the global
batch size (a multiple of the stored one: steps of several stored batches; a divisor: several
steps per stored batch), the served sequence must be the uninterrupted run with exactly the
skipped steps removed, in epochs 2 and 3 as in epoch 0, for every rank, from a restored state,
and across worker splits. A loader that counted skips in stored batches, or in the epoch's own
steps, would drop other steps or keep skipped ones; these tests compare tokens step by step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import records
from zerobatch_core import BatchNativeLoader
from zerobatch_core.datasets.build import write_sharded_dataset

B, T = 8, 4
STORED = 15
"""Stored batches: with shards of 4, the last shard is short."""
EPOCHS = 4


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    write_sharded_dataset(out, [records(STORED * B, T)], batch_size=B, seq_len=T, shard_batches=4)
    return out


def _epochs(loader: BatchNativeLoader, epochs: int) -> list[list[np.ndarray]]:
    """The items of ``epochs`` epochs, epoch by epoch."""
    out: list[list[np.ndarray]] = []
    for e in range(epochs):
        loader.set_epoch(e)
        out.append([np.array(item) for item in loader])
    return out


def _numbered(epochs: list[list[np.ndarray]], n: int) -> list[tuple[int, np.ndarray]]:
    """``(global step, item)`` of an uninterrupted run: every epoch holds its ``n`` steps."""
    assert all(len(items) == n for items in epochs)
    return [(e * n + i, x) for e, items in enumerate(epochs) for i, x in enumerate(items)]


def _without(
    full: list[tuple[int, np.ndarray]], skips: list[tuple[int, int]]
) -> list[tuple[int, np.ndarray]]:
    return [(g, x) for g, x in full if not any(a <= g < b for a, b in skips)]


def _same(got: list[np.ndarray], expected: list[tuple[int, np.ndarray]]) -> bool:
    return len(got) == len(expected) and all(
        np.array_equal(x, y) for x, (_, y) in zip(got, expected, strict=True)
    )


def _skips(n: int) -> list[tuple[int, int]]:
    """Ranges in epochs 2 and 3 (and one across the end of epoch 2), none in epoch 0."""
    return [(2 * n + 1, 2 * n + 3), (3 * n - 1, 3 * n + 2), (3 * n + n // 2, 3 * n + n // 2 + 1)]


@pytest.mark.parametrize("global_batch", [2 * B, 3 * B, B // 2, B // 4])
@pytest.mark.parametrize("world", [1, 2])
def test_skipped_global_steps_of_later_epochs_are_exactly_the_ones_removed(
    dataset: Path, global_batch: int, world: int
) -> None:
    for rank in range(world):
        kw: dict[str, Any] = {
            "rank": rank,
            "world_size": world,
            "global_batch_size": global_batch,
            "seed": 5,
            "block_size": 3,
        }
        n = len(BatchNativeLoader(dataset, **kw))
        assert n == STORED * B // global_batch
        full = _numbered(_epochs(BatchNativeLoader(dataset, **kw), EPOCHS), n)
        skips = _skips(n)
        skipping = BatchNativeLoader(dataset, skip_steps=skips, **kw)
        epochs = _epochs(skipping, EPOCHS)
        assert len(epochs[0]) == len(epochs[1]) == n  # nothing skipped in epochs 0 and 1
        got = [x for items in epochs for x in items]
        assert _same(got, _without(full, skips)), (global_batch, rank)


@pytest.mark.parametrize("global_batch", [2 * B, B // 2])
def test_a_state_saved_in_epoch_two_resumes_with_its_skips(
    dataset: Path, global_batch: int
) -> None:
    kw: dict[str, Any] = {"global_batch_size": global_batch, "seed": 8, "rank": 1, "world_size": 2}
    n = len(BatchNativeLoader(dataset, **kw))
    skips = _skips(n)
    expected = _without(_numbered(_epochs(BatchNativeLoader(dataset, **kw), EPOCHS), n), skips)
    first = BatchNativeLoader(dataset, skip_steps=skips, **kw)
    first.set_epoch(2)
    it = iter(first)
    served = [np.array(next(it)) for _ in range(2)]  # epoch 2, steps 0 and 3 (1-2 skipped)
    state = first.state_dict()
    assert state["skip_steps"] == [list(r) for r in skips]
    # A fresh loader without skips of its own takes them from the state.
    resumed = BatchNativeLoader(dataset, **kw)
    resumed.load_state_dict(state)
    rest: list[np.ndarray] = []
    while True:
        for item in resumed:
            rest.append(np.array(item))
        if resumed.epoch >= EPOCHS:
            break
    later = [x for g, x in expected if g >= 2 * n]
    assert len(served) + len(rest) == len(later)
    assert all(np.array_equal(a, b) for a, b in zip(served + rest, later, strict=True))


@pytest.mark.parametrize("global_batch", [2 * B, B // 2])
def test_worker_splits_of_a_skipping_loader_serve_the_remaining_steps_round_robin(
    dataset: Path, global_batch: int
) -> None:
    kw: dict[str, Any] = {"global_batch_size": global_batch, "seed": 3, "epoch": 2}
    n = len(BatchNativeLoader(dataset, **kw))
    skips = _skips(n)
    whole = BatchNativeLoader(dataset, skip_steps=skips, **kw)
    expected = [np.array(x) for x in whole]  # epoch 2 with its skips
    workers = []
    for w in range(3):
        loader = BatchNativeLoader(dataset, skip_steps=skips, **kw)
        loader.split_workers(w, 3)
        workers.append([np.array(x) for x in loader])
    merged = [workers[i % 3][i // 3] for i in range(sum(len(w) for w in workers))]
    assert len(merged) == len(expected) == n - 3  # steps 1, 2 and the last of epoch 2
    assert all(np.array_equal(a, b) for a, b in zip(merged, expected, strict=True))
