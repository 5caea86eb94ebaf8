"""Rank slices of every step: data-parallel samples, context-parallel chunks, zig-zag, elastic.

``D x C`` ranks are simulated in one process. For a whole epoch: the union of all ranks' tokens
at each step is exactly that step's global batch, DP shares are disjoint, CP chunks reassemble
the rows (zig-zag included), tensor/pipeline-parallel duplicates (a second loader with the same
coordinates) are identical, and each rank reads exactly its share of bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import records
from zerobatch_core import BatchNativeLoader, StateError, write_batch_file

MakeFile = Callable[..., Path]
B, T, N = 8, 17, 11  # 17 tokens: 16-token next-token pairs split into 2C = 4 chunks
ORDER: dict[str, Any] = {"block_size": 3, "seed": 4}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    out = tmp_path / "steps.batch"
    write_batch_file(out, records(B * N, T), batch_size=B, seed=5)
    return out


def global_steps(path: Path, **kw: Any) -> list[np.ndarray]:
    """The epoch's global batches, whole rows, as the core serves them to one rank."""
    return [np.array(b) for b in BatchNativeLoader(path, **ORDER, **kw)]


def reassemble(parts: dict[tuple[int, int], Any], d: int, c: int, zigzag: bool) -> np.ndarray:
    """Rows from DP shares, columns from CP chunks (zig-zag chunks put back in place)."""
    rows = []
    for r in range(d):
        chunks = [np.asarray(parts[r, k]) for k in range(c)]
        if not zigzag:
            rows.append(np.concatenate(chunks, axis=1))
            continue
        half = chunks[0].shape[1] // 2
        ordered = [None] * (2 * c)
        for k, chunk in enumerate(chunks):
            ordered[k], ordered[2 * c - 1 - k] = chunk[:, :half], chunk[:, half:]
        rows.append(np.concatenate(ordered, axis=1))
    return np.concatenate(rows, axis=0)


@pytest.mark.parametrize("zigzag", [False, True])
@pytest.mark.parametrize("next_token", [False, True])
def test_d4_c2_ranks_cover_every_step_exactly(
    tmp_path: Path, zigzag: bool, next_token: bool
) -> None:
    d, c = 4, 2
    width = 16  # 16 tokens, or 17 for 16-token next-token pairs: 2C = 4 chunks either way
    seq_len = width + 1 if next_token else width
    path = tmp_path / "dc.batch"
    write_batch_file(path, records(B * N, seq_len), batch_size=B, seed=5)
    whole = global_steps(path, next_token=next_token)
    loaders = {
        (r, k): BatchNativeLoader(
            path,
            rank=r,
            world_size=d,
            context_rank=k,
            context_size=c,
            zigzag=zigzag,
            next_token=next_token,
            **ORDER,
        )
        for r in range(d)
        for k in range(c)
    }
    twins = {
        key: BatchNativeLoader(path, **ORDER, **_coords(loader)) for key, loader in loaders.items()
    }
    steps = {key: list(loader) for key, loader in loaders.items()}
    for step in range(N):
        if next_token:
            inputs = reassemble({k: v[step][0] for k, v in steps.items()}, d, c, zigzag)
            labels = reassemble({k: v[step][1] for k, v in steps.items()}, d, c, zigzag)
            np.testing.assert_array_equal(inputs, whole[step][0])
            np.testing.assert_array_equal(labels, whole[step][1])
            # a chunk's labels run one token past it: the next chunk's first token included
            inp, lab = (np.asarray(x) for x in steps[0, 0][step])
            halves = 2 if zigzag else 1  # zig-zag: two ranges, each with its own next token
            for part_in, part_lab in zip(
                np.split(inp, halves, axis=1), np.split(lab, halves, axis=1), strict=True
            ):
                np.testing.assert_array_equal(part_lab[:, :-1], part_in[:, 1:])
        else:
            np.testing.assert_array_equal(
                reassemble({k: v[step] for k, v in steps.items()}, d, c, zigzag), whole[step]
            )
    rows = {
        r: {int(x) for s in steps[r, 0] for x in np.asarray(s[0] if next_token else s)[:, 0]}
        for r in range(d)
    }
    for a in range(d):
        for b in range(a + 1, d):
            assert not rows[a] & rows[b]  # DP shares are disjoint
    for key, twin in twins.items():  # TP/PP ranks with the same coordinates: identical data
        for mine, other in zip(steps[key], twin, strict=True):
            for x, y in zip(
                mine if next_token else (mine,), other if next_token else (other,), strict=True
            ):
                np.testing.assert_array_equal(x, y)
    for (r, k), loader in loaders.items():
        # one extra label token per contiguous range (zig-zag rank C-1's two chunks touch)
        ranges = 2 if zigzag and k != c - 1 else 1
        share = (B // d) * (width // c + (ranges if next_token else 0))
        assert loader.bytes_read == N * share * 4, (r, k)  # each rank read its share only
    whole_bytes = N * B * seq_len * 4
    total = sum(loader.bytes_read for loader in loaders.values())
    assert total == whole_bytes if not next_token else whole_bytes < total < 1.2 * whole_bytes


def _coords(loader: BatchNativeLoader) -> dict[str, Any]:
    s = loader.slicing
    return {
        "rank": s.dp_rank,
        "world_size": s.dp_size,
        "context_rank": s.cp_rank,
        "context_size": s.cp_size,
        "zigzag": s.zigzag,
        "next_token": loader.next_token,
    }


def test_layouts_that_cannot_work_say_what_would(path: Path) -> None:
    with pytest.raises(ValueError, match="does not split evenly over world_size 3"):
        BatchNativeLoader(path, rank=0, world_size=3)
    with pytest.raises(ValueError, match="does not split into context_size = 2"):
        BatchNativeLoader(path, context_rank=0, context_size=2)  # 17 tokens
    with pytest.raises(ValueError, match=r"2 \* context_size = 4"):
        BatchNativeLoader(path, context_size=2, zigzag=True)
    with pytest.raises(ValueError, match="context_rank 2 is outside context_size 2"):
        BatchNativeLoader(path, next_token=True, context_rank=2, context_size=2)
    with pytest.raises(ValueError, match="multiple or a divisor"):
        BatchNativeLoader(path, global_batch_size=12)
    with pytest.raises(ValueError, match="bos_id needs whole rows"):
        BatchNativeLoader(path, next_token=True, context_size=2, bos_id=3)


def sample_sequence(items: list[Any]) -> list[int]:
    """Every served sample's first token, step by step, row by row."""
    return [int(row[0]) for item in items for row in np.asarray(item)]


def test_elastic_resume_d4_to_d2_d8_and_a_doubled_global_batch(tmp_path: Path) -> None:
    path = tmp_path / "elastic.batch"
    write_batch_file(path, records(8 * 24, 4), batch_size=8, seed=9)  # 24 batches of 8
    whole = sample_sequence(list(BatchNativeLoader(path, **ORDER)))  # one rank, all samples
    k = 6
    four = [BatchNativeLoader(path, rank=r, world_size=4, **ORDER) for r in range(4)]
    its = [iter(x) for x in four]
    head = [np.concatenate([next(it) for it in its]) for _ in range(k)]
    state = json.loads(json.dumps(four[0].state_dict()))
    assert state["samples"] == k * 8 and state["global_batch_size"] == 8
    for world in (2, 8):  # a new DP size continues the same global sequence
        if 8 % world:
            continue
        ranks = [BatchNativeLoader(path, rank=r, world_size=world, **ORDER) for r in range(world)]
        for loader in ranks:
            loader.load_state_dict(state)
        rest = [np.concatenate(parts) for parts in zip(*ranks, strict=True)]
        assert sample_sequence(head + rest) == whole
    doubled = [
        BatchNativeLoader(path, rank=r, world_size=4, global_batch_size=16, **ORDER)
        for r in range(4)
    ]
    for loader in doubled:
        loader.load_state_dict(state)
        assert loader.step == k // 2
    rest = [np.concatenate(parts) for parts in zip(*doubled, strict=True)]
    assert all(step.shape == (16, 4) for step in rest)
    assert sample_sequence(head + rest) == whole
    odd = dict(state, step=5, samples=40)
    with pytest.raises(StateError, match="not a whole number of steps"):
        doubled[0].load_state_dict(odd)


def test_a_halved_global_batch_splits_each_stored_batch(path: Path) -> None:
    whole = sample_sequence(global_steps(path))
    halves = BatchNativeLoader(path, global_batch_size=4, **ORDER)
    assert len(halves) == 2 * N
    got = list(halves)
    assert all(np.asarray(x).shape == (4, T) for x in got)
    assert sample_sequence(got) == whole


def test_distinct_batches_give_each_rank_whole_stored_batches(path: Path) -> None:
    whole = global_steps(path)
    d = 2
    ranks = [
        BatchNativeLoader(path, rank=r, world_size=d, global_batch_size=d * B, **ORDER)
        for r in range(d)
    ]
    assert len(ranks[0]) == N // d
    for step, parts in enumerate(zip(*ranks, strict=True)):
        for r, part in enumerate(parts):
            np.testing.assert_array_equal(part, whole[step * d + r])  # every D-th batch


def test_skip_steps_skip_only_those_steps(path: Path) -> None:
    whole = global_steps(path)
    loader = BatchNativeLoader(path, skip_steps=[(3, 5), (N + 1, N + 2)], **ORDER)
    e0 = list(loader)
    assert len(e0) == N - 2
    for got, want in zip(e0, whole[:3] + whole[5:], strict=True):
        np.testing.assert_array_equal(got, want)
    it = iter(loader)
    first = next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["skip_steps"] == [[3, 5], [N + 1, N + 2]]
    resumed = BatchNativeLoader(path, **ORDER)
    resumed.load_state_dict(state)  # the skips travel with the state
    e1 = [first, *resumed]
    assert len(e1) == N - 1
    e1_whole = global_steps(path, epoch=1)
    for got, want in zip(e1, e1_whole[:1] + e1_whole[2:], strict=True):
        np.testing.assert_array_equal(got, want)


def test_workers_split_the_served_steps_with_skips(path: Path) -> None:
    served = [int(b[0, 0]) for b in BatchNativeLoader(path, skip_steps=[(2, 4)], **ORDER)]
    per_worker = []
    for w in range(3):
        loader = BatchNativeLoader(path, skip_steps=[(2, 4)], **ORDER)
        loader.split_workers(w, 3)
        per_worker.append([int(b[0, 0]) for b in loader])
    merged = [
        x
        for group in zip(*[p + [None] * (4 - len(p)) for p in per_worker], strict=True)
        for x in group
        if x is not None
    ]
    assert merged == served  # round-robin over workers is the single-process order
