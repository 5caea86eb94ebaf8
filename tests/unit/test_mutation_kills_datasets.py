"""Slicing, dataset and provenance behaviours that mutation testing found unpinned
(tests/README.md, "Mutation testing")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec.dataset import Source

from tests.helpers import records
from zerobatch_core import trace_step, write_batch_file, write_sharded_dataset
from zerobatch_core.provenance import RowOrigin, TraceError, TracePiece
from zerobatch_core.slicing import Slicing

# -- slicing -----------------------------------------------------------------------------------


def test_the_default_slicing_is_one_reader_serving_every_column() -> None:
    assert Slicing() == Slicing(
        dp_rank=0, dp_size=1, cp_rank=0, cp_size=1, cp_count=1, zigzag=False
    )


def test_a_world_size_of_zero_is_refused_as_such() -> None:
    with pytest.raises(ValueError, match="world_size must be at least 1, got 0"):
        Slicing(dp_size=0)


def test_a_rank_equal_to_the_world_size_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 2 is outside world_size 2"):
        Slicing(dp_rank=2, dp_size=2)


def test_a_negative_context_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="context_rank must be at least 0, got -1"):
        Slicing(cp_rank=-1, cp_size=2)


def test_serving_no_context_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="context ranks served must be at least 1, got 0"):
        Slicing(cp_count=0, cp_size=2)


def test_context_ranks_past_the_context_size_are_named() -> None:
    with pytest.raises(ValueError, match=r"context ranks 1\.\.2 are outside context_size 2"):
        Slicing(cp_rank=1, cp_count=2, cp_size=2)


def test_an_uneven_global_batch_size_suggests_the_stored_size_and_its_double() -> None:
    with pytest.raises(ValueError, match=r"\(e\.g\. 4 or 8\)"):
        Slicing().check(3, 4, 8)


def test_a_slicing_is_an_immutable_value() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Slicing().dp_rank = 1  # type: ignore[misc]


def test_a_negative_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="rank must be at least 0, got -1"):
        Slicing(dp_rank=-1)


def test_a_context_size_of_zero_is_refused_as_such() -> None:
    with pytest.raises(ValueError, match="context_size must be at least 1, got 0"):
        Slicing(cp_size=0)


def test_zigzag_columns_are_not_whole_rows() -> None:
    assert Slicing().whole_rows
    assert not Slicing(zigzag=True).whole_rows


def test_zigzag_merges_only_chunks_adjacent_to_the_last_range() -> None:
    """Both context ranks of two, zigzag: chunks 0 and 3 for rank 0, then 1 and 2 for rank 1;
    only 1 and 2 are adjacent in serving order."""
    s = Slicing(cp_rank=0, cp_count=2, cp_size=2, zigzag=True)
    assert s.columns(8) == [(0, 2), (6, 8), (2, 6)]


def test_each_data_parallel_rank_reads_its_share_of_a_step() -> None:
    """The JAX adapter sizes a rank's part of the global array by this."""
    assert Slicing(dp_rank=1, dp_size=4).samples_per_step(32) == 8


# -- provenance --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A single file: 4 batches of 4 records of 3 tokens."""
    path = tmp_path_factory.mktemp("trace") / "one.batch"
    write_batch_file(path, records(16, 3), batch_size=4, seq_len=3, seed=5)
    return path


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset of 2 shards of 2 batches of 4 records of 5 tokens."""
    path = tmp_path_factory.mktemp("trace") / "ds"
    write_sharded_dataset(path, [records(16, 5)], batch_size=4, seq_len=5, shard_batches=2, seed=5)
    return path


def test_a_row_origin_is_an_immutable_value() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RowOrigin(0, 0, None, None, None).row = 1  # type: ignore[misc]


def test_a_trace_piece_is_an_immutable_value() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        TracePiece(None, 0, 0, 0, (0, 1), ()).slot = 1  # type: ignore[misc]


def test_the_global_step_counts_the_earlier_epochs_steps(one_file: Path) -> None:
    trace = trace_step(one_file, 1, epoch=2)
    assert trace.global_step == 2 * 4 + 1


def test_a_single_file_is_shard_number_zero(one_file: Path) -> None:
    trace = trace_step(one_file, 3)
    assert [p.shard_index for p in trace.pieces] == [0]


def test_a_trace_of_one_row_a_step_is_allowed(one_file: Path) -> None:
    trace = trace_step(one_file, 0, global_batch_size=1, max_rows=1)
    assert len(trace.pieces[0].origins) == 1


def test_a_step_of_one_row_starting_a_stored_batch_is_traced(one_file: Path) -> None:
    """Global batch 1 of stored batches of 4: step 4 is row 0 of the epoch's second batch."""
    trace = trace_step(one_file, 4, global_batch_size=1, shuffle=False)
    assert [(p.slot, p.rows) for p in trace.pieces] == [(1, (0, 1))]


def test_the_default_row_bound_is_65536(tmp_path: Path) -> None:
    path = tmp_path / "wide.batch"
    write_batch_file(path, np.zeros((1 << 17, 1), dtype=np.uint32), batch_size=1 << 16)
    assert len(trace_step(path, 0, shuffle=False).pieces[0].origins) == 1 << 16
    with pytest.raises(TraceError, match="131072 rows"):
        trace_step(path, 0, shuffle=False, global_batch_size=1 << 17)


def test_the_trace_text_names_zigzag_labels_and_row_ranges(sharded: Path) -> None:
    trace = trace_step(
        sharded, 0, world_size=2, rank=1, context_size=2, zigzag=True, next_token=True
    )
    head = trace.lines()[2]
    assert "context rank 0 of 2 (zig-zag)" in head and head.endswith("(+1 for labels)")
    assert ", rows [2, 4):" in trace.lines()[3]


def test_the_trace_text_says_nothing_of_zigzag_or_labels_without_them(sharded: Path) -> None:
    head = trace_step(sharded, 0, context_size=1).lines()[2]
    assert "zig-zag" not in head and "labels" not in head


def test_a_step_trace_is_an_immutable_value(one_file: Path) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        trace_step(one_file, 0).step = 1  # type: ignore[misc]


def test_rows_name_their_input_record(one_file: Path) -> None:
    """A single file's records are its input records, and each row's line says which."""
    assert " = input record " in "\n".join(trace_step(one_file, 0).lines())


def test_a_max_rows_of_zero_is_refused(one_file: Path) -> None:
    with pytest.raises(ValueError, match="max_rows must be at least 1, got 0"):
        trace_step(one_file, 0, max_rows=0)


def test_records_outside_every_source_and_empty_sources_name_no_file(tmp_path: Path) -> None:
    """Readers check only the sources' types and ranges (SPEC.md 12.2): a record in a gap
    between sources has no file, and an empty source never claims a record."""
    sources = [Source("a.bin", (0, 6)), Source("empty.bin", (2, 2)), Source("c.bin", (8, 16))]
    path = tmp_path / "ds"
    write_sharded_dataset(
        path, [records(16, 2)], batch_size=4, seq_len=2, shard_batches=2, seed=3, sources=sources
    )
    seen = {}
    for step in range(4):
        for piece in trace_step(path, step).pieces:
            for o in piece.origins:
                seen[o.record] = (o.file, o.file_record)
    expected = {r: ("a.bin", r) for r in range(6)} | {6: (None, None), 7: (None, None)}
    expected |= {r: ("c.bin", r - 8) for r in range(8, 16)}
    assert seen == expected


def test_the_trace_text_says_whether_the_order_is_shuffled(one_file: Path) -> None:
    assert trace_step(one_file, 0).lines()[1].endswith("shuffled")
    assert trace_step(one_file, 0, shuffle=False).lines()[1].endswith("storage order")
