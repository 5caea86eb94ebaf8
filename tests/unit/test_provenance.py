"""Provenance: ``trace_step`` names exactly the rows, columns and input records the loader serves.

Records are ``tests.helpers.records``: row ``i`` holds ``i * T + arange(T)``, so every served row
says which input record it is, and the trace's claim can be checked token for token against
the loader for every step of an epoch, every DP/CP rank, zig-zag, next-token pairs and global
batches larger and smaller than the stored batch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec.dataset import Source

from tests.helpers import records
from zerobatch_core import (
    BatchFileReader,
    BatchNativeLoader,
    DatasetReader,
    StepTrace,
    create_dataset,
    trace_step,
    write_batch_file,
    write_sharded_dataset,
)

B, T, N = 8, 17, 93  # shards of 24 records: 3 + 3 + 3 + 2 batches, 5 records dropped
SOURCES = [Source("a.bin", (0, 30)), Source("b.bin", (30, 50)), Source("c.bin", (50, N))]
ORDER: dict[str, Any] = {"block_size": 2, "seed": 9}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prov") / "ds"
    data = records(N, T)
    write_sharded_dataset(
        out,
        (data[i : i + 10] for i in range(0, N, 10)),
        batch_size=B,
        seq_len=T,
        shard_batches=3,
        seed=21,
        sources=SOURCES,
    )
    return out


def expected_item(trace: StepTrace, source: np.ndarray) -> Any:
    """What the loader must serve, built from the trace alone: its rows' input records,
    stacked piece by piece, restricted to its columns (and shifted by one for labels)."""
    rows = np.concatenate(
        [source[[o.record for o in p.origins]] for p in trace.pieces], axis=0
    ).astype(np.int64)
    for piece in trace.pieces:
        assert [o.row for o in piece.origins] == list(range(*piece.rows))
    inputs = np.concatenate([rows[:, lo:hi] for lo, hi in trace.columns], axis=1)
    if not trace.next_token:
        return inputs
    labels = np.concatenate([rows[:, lo + 1 : hi + 1] for lo, hi in trace.columns], axis=1)
    return inputs, labels


def same(item: Any, want: Any) -> bool:
    if isinstance(want, tuple):
        return all(np.array_equal(np.asarray(a), b) for a, b in zip(item, want, strict=True))
    return np.array_equal(np.asarray(item), want)


LAYOUTS = [
    # world_size, context_size, zigzag, global batch, next_token
    (1, 1, False, None, False),
    (2, 1, False, None, False),
    (4, 2, False, None, True),
    (4, 2, True, None, True),
    (2, 2, True, 2 * B, True),  # a step spans two stored batches
    (2, 1, False, B // 2, False),  # a stored batch serves two steps
    (4, 1, False, 3 * B, False),  # pieces that straddle stored batches
]


@pytest.mark.parametrize(("d", "c", "zigzag", "g", "next_token"), LAYOUTS)
def test_every_rank_and_step_of_an_epoch_matches_the_loader(
    dataset: Path, d: int, c: int, zigzag: bool, g: int | None, next_token: bool
) -> None:
    source = records(N, T)
    layout: dict[str, Any] = {
        "world_size": d,
        "context_size": c,
        "zigzag": zigzag,
        "global_batch_size": g,
        "next_token": next_token,
    }
    with DatasetReader(dataset) as reader:
        for epoch in (0, 3):
            for rank in range(d):
                for cp in range(c):
                    coords = {**layout, "rank": rank, "context_rank": cp, "epoch": epoch}
                    loader = BatchNativeLoader(dataset, **ORDER, **coords)
                    served = 0
                    for step, item in enumerate(loader):
                        trace = trace_step(reader, step, **ORDER, **coords)
                        assert (trace.rank, trace.context_rank, trace.epoch) == (rank, cp, epoch)
                        assert same(item, expected_item(trace, source)), (step, coords)
                        served += 1
                    assert served == trace.steps_per_epoch == len(loader)


def test_pieces_name_the_shard_slot_and_file_record(dataset: Path) -> None:
    with DatasetReader(dataset) as reader:
        first = reader.manifest.first_batches()
        for step in range(len(BatchNativeLoader(reader, **ORDER))):
            trace = trace_step(dataset, step, **ORDER)
            assert trace.global_step == step and len(trace.pieces) == 1
            piece = trace.pieces[0]
            assert piece.rows == (0, B)
            shard = reader.shards[piece.shard_index]
            assert piece.shard == shard.name
            assert piece.dataset_slot == int(first[piece.shard_index]) + piece.slot
            assert reader.locate(piece.dataset_slot) == (piece.shard_index, piece.slot)
            for o in piece.origins:
                assert shard.records is not None
                assert o.record == shard.records[0] + o.shard_record
                src = next(s for s in SOURCES if s.records[0] <= o.record < s.records[1])
                assert (o.file, o.file_record) == (src.path, o.record - src.records[0])


def test_defaults_are_the_loaders(dataset: Path) -> None:
    trace = trace_step(dataset, 0)
    loader = BatchNativeLoader(dataset)
    assert (trace.block_size, trace.seed, trace.shuffle) == (256, 21, True)
    assert (trace.global_batch_size, trace.columns) == (B, ((0, T),))
    assert same(next(iter(loader)), expected_item(trace, records(N, T)))
    text = "\n".join(trace.lines())
    assert str(trace.pieces[0].shard) in text and re.search(r"= [abc]\.bin record \d+$", text, re.M)
    assert json.loads(json.dumps(trace.as_dict()))["pieces"][0]["rows"] == [0, B]


def test_a_single_file_and_a_described_dataset(tmp_path: Path) -> None:
    data = records(40, T)
    path = tmp_path / "f.batch"
    write_batch_file(path, data, batch_size=B, seed=3)
    for step, item in enumerate(BatchNativeLoader(path, **ORDER, rank=1, world_size=2)):
        trace = trace_step(path, step, **ORDER, rank=1, world_size=2)
        assert trace.pieces[0].shard is None and trace.pieces[0].rows == (B // 2, B)
        assert all(o.record == o.shard_record and o.file is None for o in trace.pieces[0].origins)
        assert same(item, expected_item(trace, data))
    made = tmp_path / "made"
    made.mkdir()
    parts = [records(24, T) + 1000 * i for i in range(3)]
    for i, part in enumerate(parts):
        write_batch_file(made / f"p{i}.batch", part, batch_size=B, seed=i)
    create_dataset(made)
    with DatasetReader(made) as reader:
        for step, item in enumerate(BatchNativeLoader(reader, **ORDER)):
            piece = trace_step(reader, step, **ORDER).pieces[0]
            assert all(o.record is None and o.file is None for o in piece.origins)
            part = parts[piece.shard_index]
            rows = part[[o.shard_record for o in piece.origins]]
            np.testing.assert_array_equal(item, rows)
            with BatchFileReader(made / f"p{piece.shard_index}.batch") as f:
                np.testing.assert_array_equal(f.read_batch(piece.slot), rows)


def test_bad_steps_and_layouts_are_refused(dataset: Path) -> None:
    steps = len(BatchNativeLoader(dataset))
    with pytest.raises(IndexError, match=rf"step must be in \[0, {steps}\)"):
        trace_step(dataset, steps)
    with pytest.raises(ValueError, match="step"):
        trace_step(dataset, -1)
    with pytest.raises(ValueError, match="world_size"):
        trace_step(dataset, 0, world_size=3)
    with pytest.raises(ValueError, match="context_size"):
        trace_step(dataset, 0, context_size=2, zigzag=True)
