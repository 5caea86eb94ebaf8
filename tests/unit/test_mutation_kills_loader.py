"""BatchNativeLoader behaviours that mutation testing found unpinned (tests/README.md).

Each test names one behaviour; the comment under it says which kind of slip it catches.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec import HEADER_SIZE

from tests.helpers import records
from zerobatch_core import (
    BatchFileReader,
    BatchNativeLoader,
    DatasetError,
    StateError,
    write_batch_file,
    write_sharded_dataset,
)
from zerobatch_core.delivery.documents import document_layout
from zerobatch_core.delivery.loader import Position, normalize_skips


def test_skip_ranges_start_at_step_zero_and_not_before() -> None:
    assert normalize_skips([(0, 1)]) == ((0, 1),)
    with pytest.raises(ValueError, match="skip_steps first step must be at least 0"):
        normalize_skips([(-1, 1)])


def test_skip_range_errors_name_the_end_step_or_the_empty_range() -> None:
    with pytest.raises(ValueError, match="skip_steps end step must be at least 0"):
        normalize_skips([(0, -1)])
    with pytest.raises(ValueError, match=r"skip_steps range \(0, 0\) is empty"):
        normalize_skips([(0, 0)])


def test_a_skip_range_inside_the_last_merged_one_keeps_its_end() -> None:
    # Merging compares with the last merged range, not another one: (7, 8) lies inside (6, 10).
    ranges = [(0, 1), (3, 4), (6, 10), (7, 8)]
    assert normalize_skips(ranges) == ((0, 1), (3, 4), (6, 10))


def test_block_size_one_is_the_smallest_and_is_the_loaders_own_check(
    make_file: Callable[..., Path],
) -> None:
    path = make_file(n=40, batch_size=4)
    assert sorted(int(b[0, 0]) for b in BatchNativeLoader(path, block_size=1)) == sorted(
        int(b[0, 0]) for b in BatchFileReader(path)
    )
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        BatchNativeLoader(path, block_size=0)


def test_a_failed_constructor_leaves_the_callers_reader_open(
    make_file: Callable[..., Path],
) -> None:
    reader = BatchFileReader(make_file(n=40, seq_len=8, batch_size=4))
    with pytest.raises(ValueError, match="global_batch_size"):
        BatchNativeLoader(reader, global_batch_size=0)
    assert reader.read_batch(0).shape == (4, 8)  # still usable: not the loader's to close


def test_worker_and_num_workers_are_plain_attributes(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=80, batch_size=4))
    loader.split_workers(1, 3)
    assert (loader.worker, loader.num_workers) == (1, 3)


def test_global_step_counts_whole_epochs_then_steps(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))  # 10 steps per epoch
    assert loader.global_step(Position(2, 3)) == 23


def test_every_block_is_read_ahead_and_size_checked_before_it_is_served(
    make_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4), block_size=3)  # blocks 3, 3, 3, 1
    reader = loader.reader
    events: list[tuple[Any, ...]] = []
    read_ahead, check_size = reader.read_ahead, reader.check_size

    def spy_read_ahead(start: int, stop: int) -> None:
        events.append(("ahead", start, stop))
        read_ahead(start, stop)

    def spy_check_size(index: int = 0) -> None:
        events.append(("check",))
        check_size(index)

    monkeypatch.setattr(reader, "read_ahead", spy_read_ahead)
    monkeypatch.setattr(reader, "check_size", spy_check_size)
    served = [int(b[0, 0]) for b in loader]
    assert len(served) == 10
    starts = [e[1] for e in events if e[0] == "ahead"]
    assert sorted(starts) == [0, 3, 6, 9]  # each block once
    assert events.count(("check",)) == 4  # each block's file check


def test_served_subtracts_the_skipped_steps(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4), skip_steps=[(5, 7)])
    assert loader.served(Position(0, 2)) == 10 - 2 - 2


def test_state_origin_is_the_split_step_in_its_epoch_only(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    it = iter(loader)
    for _ in range(3):
        next(it)
    loader.split_workers(0, 2)
    assert loader.state_dict()["origin"] == 3
    assert loader.state_dict(Position(1, 0))["origin"] == 0


def test_a_state_with_a_zero_global_batch_size_is_a_state_error(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    with pytest.raises(StateError, match="global_batch_size 0 is invalid"):
        loader.load_state_dict(dict(loader.state_dict(), global_batch_size=0))


def test_a_two_worker_state_must_be_on_one_of_its_workers_steps(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    state = dict(loader.state_dict(), num_workers=2, worker=0, origin=0, step=1)
    with pytest.raises(StateError, match="step 1 is not one of worker 0's steps"):
        loader.load_state_dict(state)


def test_next_token_inputs_are_views_of_the_file(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4), next_token=True)
    inputs, _ = next(iter(loader))
    assert inputs.dtype == np.uint32 and not inputs.flags.owndata


def test_malformed_state_skip_steps_are_a_state_error(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    with pytest.raises(StateError, match=r"state skip_steps: skip_steps range \(3, 1\) is empty"):
        loader.load_state_dict(dict(loader.state_dict(), skip_steps=[[3, 1]]))


def test_a_bad_block_size_is_refused_before_the_file_is_opened(
    make_file: Callable[..., Path],
) -> None:
    path = make_file(n=40, batch_size=4)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError, match="block_size") as info:
        BatchNativeLoader(path, block_size=0)
    assert len(os.listdir("/proc/self/fd")) == before, info.traceback  # nothing left open


def test_resuming_onto_a_newly_skipped_step_serves_the_next_unskipped_one(
    make_file: Callable[..., Path],
) -> None:
    path = make_file(n=40, batch_size=4)
    saved = BatchNativeLoader(path, shuffle=False).state_dict(Position(0, 3))
    resumed = BatchNativeLoader(path, shuffle=False, skip_steps=[(3, 5)])
    resumed.load_state_dict(saved)
    first = next(iter(resumed))
    np.testing.assert_array_equal(first, resumed.reader.read_batch(5))


def test_item_of_a_stored_batch_is_that_batch(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    np.testing.assert_array_equal(loader.item(3), loader.reader.read_batch(3))


def test_a_global_batch_of_two_stored_batches_serves_both(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4), shuffle=False, global_batch_size=8)
    first = next(iter(loader))
    want = np.concatenate([loader.reader.read_batch(0), loader.reader.read_batch(1)])
    np.testing.assert_array_equal(first, want)


def test_the_cursor_after_an_epoch_is_its_length_even_if_the_next_epoch_skips_its_start(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4), skip_steps=[(10, 11)])
    it = iter(loader)
    for _ in range(10):
        next(it)
    assert loader.position == Position(0, 10)


def test_after_steps_over_skipped_steps(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4), skip_steps=[(3, 5)])
    assert loader.after(Position(0, 2)) == Position(0, 5)


def test_seek_ends_the_pass_in_progress(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    it = iter(loader)
    next(it)
    loader.seek(Position(0, 5))
    assert next(it, None) is None


def test_set_epoch_ends_the_pass_in_progress(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    it = iter(loader)
    next(it)
    loader.set_epoch(3)
    assert next(it, None) is None


def test_a_new_pass_ends_the_previous_one(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    old = iter(loader)
    next(old)
    iter(loader)
    assert next(old, None) is None


def test_a_state_without_worker_keys_resumes_as_the_only_worker(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    state = loader.state_dict()
    for key in ("num_workers", "worker", "origin"):
        del state[key]
    loader.load_state_dict(state)
    assert (loader.num_workers, loader.worker, loader.state_dict()["origin"]) == (1, 0, 0)


def test_a_negative_state_epoch_is_refused(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    with pytest.raises(StateError, match="state epoch -1 is not an integer"):
        loader.load_state_dict(dict(loader.state_dict(), epoch=-1))


def test_a_negative_state_worker_is_outside_the_workers(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    state = dict(loader.state_dict(), num_workers=2, worker=-1)
    with pytest.raises(StateError, match="state worker -1 is outside num_workers 2"):
        loader.load_state_dict(state)


def test_the_default_block_size_is_the_documented_256(make_file: Callable[..., Path]) -> None:
    # README: ``Adapter(source, *, block_size=256, ...)``, the loader's default too.
    assert BatchNativeLoader(make_file(n=40, batch_size=4)).block_size == 256


def test_token_zero_may_be_the_bos_id(make_file: Callable[..., Path]) -> None:
    assert BatchNativeLoader(make_file(n=40, batch_size=4), bos_id=0).bos_id == 0


def test_a_negative_bos_id_is_refused(make_file: Callable[..., Path]) -> None:
    with pytest.raises(ValueError, match="bos_id must be in"):
        BatchNativeLoader(make_file(n=40, batch_size=4), bos_id=-1)


def test_a_worker_split_counts_from_its_origin_in_that_epoch_only(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    it = iter(loader)
    for _ in range(3):
        next(it)
    loader.split_workers(0, 2)  # worker 0 of 2 from step 3: steps 3, 5, 7, 9
    assert loader.after(Position(0, 3)) == Position(0, 5)
    assert loader.after(Position(1, 0)) == Position(1, 2)  # later epochs split from step 0


def test_a_worker_index_equal_to_the_worker_count_is_refused(
    make_file: Callable[..., Path],
) -> None:
    with pytest.raises(ValueError, match="worker 2 is outside num_workers 2"):
        BatchNativeLoader(make_file(n=40, batch_size=4)).split_workers(2, 2)


def test_nothing_is_served_from_the_end_of_an_epoch(make_file: Callable[..., Path]) -> None:
    assert BatchNativeLoader(make_file(n=40, batch_size=4)).served(Position(0, 10)) == 0


def test_skips_in_another_epoch_do_not_reduce_this_epochs_steps(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4), skip_steps=[(15, 17)])
    assert loader.served(Position(0, 2)) == 8


def test_int64_items_reuse_a_released_pooled_array(make_file: Callable[..., Path]) -> None:
    # BufferPool: an int64 array is handed out again once nothing outside the pool holds it.
    loader = BatchNativeLoader(make_file(n=40, batch_size=4), dtype="int64")
    first = weakref.ref(loader.item(0))
    second = loader.item(1)
    assert second is first()


def test_a_seek_before_the_first_item_ends_the_pass(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    it = iter(loader)
    loader.seek(Position(0, 5))
    assert next(it, None) is None


@pytest.mark.parametrize("origin", [3, "x"], ids=["after-step", "not-an-integer"])
def test_a_state_origin_after_its_step_or_not_an_integer_is_refused(
    make_file: Callable[..., Path], origin: object
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    state = dict(loader.state_dict(Position(0, 2)), origin=origin)
    with pytest.raises(StateError, match=r"state origin .* is outside"):
        loader.load_state_dict(state)


def test_next_token_needs_two_tokens_per_record(make_file: Callable[..., Path]) -> None:
    assert BatchNativeLoader(make_file(n=40, seq_len=2, batch_size=4), next_token=True)
    with pytest.raises(ValueError, match="next_token needs seq_len >= 2"):
        BatchNativeLoader(
            make_file(n=40, seq_len=1, batch_size=4, name="one.batch"), next_token=True
        )


@pytest.mark.parametrize("workers", [0, "2"])
def test_a_state_without_a_whole_positive_worker_count_is_refused(
    make_file: Callable[..., Path], workers: object
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    state = dict(loader.state_dict(), num_workers=workers, worker=0)
    with pytest.raises(StateError, match=f"state num_workers={workers!r}, worker=0 are invalid"):
        loader.load_state_dict(state)


def test_a_state_worker_must_be_below_the_worker_count(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    state = dict(loader.state_dict(), num_workers=2, worker=2)
    with pytest.raises(StateError, match="state worker 2 is outside num_workers 2"):
        loader.load_state_dict(state)


def _int64_against_uint32(
    path: Path,
    *,
    block_size: int,
    seed: int | None = None,
    skip_steps: list[tuple[int, int]] | None = None,
    split: tuple[int, int] | None = None,
) -> int:
    """Assert the int64 items of a loader are its uint32 items widened; return how many."""

    def items(dtype: str) -> list[np.ndarray]:
        loader = BatchNativeLoader(
            path,
            block_size=block_size,
            dtype=dtype,  # type: ignore[arg-type]
            seed=seed,
            skip_steps=skip_steps or [],
        )
        if split is not None:
            loader.split_workers(*split)
        return [np.array(item, dtype=np.int64) for item in loader]

    wide, narrow = items("int64"), items("uint32")
    assert len(wide) == len(narrow)
    for a, b in zip(wide, narrow, strict=True):
        np.testing.assert_array_equal(a, b)
    return len(wide)


@pytest.mark.parametrize("split", ["skip_steps", "workers"])
def test_int64_items_of_a_strided_pass_are_the_uint32_items_widened(
    make_file: Callable[..., Path], split: str
) -> None:
    # Skipped steps or a worker split serve evenly spaced stored batches, which the int64
    # stage groups into runs; each run must hold exactly the batches served.
    path = make_file(n=80, batch_size=4)
    if split == "skip_steps":
        assert _int64_against_uint32(path, block_size=3, skip_steps=[(2, 4), (9, 10)]) > 2
    else:
        assert _int64_against_uint32(path, block_size=3, split=(1, 3)) > 2


def test_adjacent_skip_ranges_merge_into_one() -> None:
    assert normalize_skips([(2, 4), (0, 2)]) == ((0, 4),)


def test_a_global_batch_of_one_record_serves_one_record_per_step(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4), global_batch_size=1)
    assert len(loader) == 40
    assert next(iter(loader)).shape == (1, 8)


def test_a_state_origin_before_step_zero_is_refused(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    with pytest.raises(StateError, match=r"state origin -1 is outside \[0, step\]"):
        loader.load_state_dict(dict(loader.state_dict(), origin=-1))


def _periodic_file(path: Path, batch_size: int = 4, seq_len: int = 9) -> Path:
    # Tokens 0..6 over and over: document starts (token 0) fall at varying columns.
    tokens = (np.arange(48 * seq_len) % 7).reshape(48, seq_len).astype(np.uint32)
    write_batch_file(path, tokens, batch_size, seed=3)
    return path


def _uint32_items(path: Path | str, **kw: Any) -> list[Any]:
    return [
        tuple(np.array(a) for a in item) if isinstance(item, tuple) else np.array(item)
        for item in BatchNativeLoader(path, dtype="uint32", label_dtype="uint32", seed=5, **kw)
    ]


@pytest.mark.parametrize("global_batch_size", [4, 2, 8])  # one batch per step, parts, several
@pytest.mark.parametrize("source", ["file", "dataset"])
@pytest.mark.parametrize("dtype", ["uint32", "int32", "int64"])
@pytest.mark.parametrize("label_dtype", ["uint32", "int64", None])  # None: no labels
@pytest.mark.parametrize("bos_id", [None, 0])
def test_every_output_dtype_serves_the_uint32_tokens_with_the_dtypes_asked_for(
    tmp_path: Path,
    global_batch_size: int,
    source: str,
    dtype: str,
    label_dtype: str | None,
    bos_id: int | None,
) -> None:
    # Each conversion path (chunked int64 stage, per-step conversion, views) against the
    # plain uint32 items: same tokens, the dtypes asked for, document layouts of the inputs.
    path: Path | str = _periodic_file(tmp_path / "f.batch")
    if source == "dataset":
        reader = BatchFileReader(path)
        rows = reader.read_batches(0, reader.num_batches).reshape(-1, reader.seq_len)
        write_sharded_dataset(
            tmp_path / "d", [rows], batch_size=4, seq_len=reader.seq_len, shard_batches=5
        )
        reader.close()
        path = tmp_path / "d"
    next_token = label_dtype is not None
    common: dict[str, Any] = {"next_token": next_token, "global_batch_size": global_batch_size}
    expected = _uint32_items(path, **common)
    loader = BatchNativeLoader(
        path,
        dtype=dtype,  # type: ignore[arg-type]
        label_dtype=label_dtype or "int64",  # type: ignore[arg-type]
        bos_id=bos_id,
        seed=5,
        **common,
    )
    got = list(loader)
    assert len(got) == len(expected) > 0
    for step, (item, want) in enumerate(zip(got, expected, strict=True)):
        if bos_id is not None:
            assert isinstance(item, dict), step
            tokens = item["inputs"] if next_token else item["tokens"]
            layout = document_layout(want[0] if next_token else want, bos_id)
            np.testing.assert_array_equal(item["segment_ids"], layout.segment_ids)
            np.testing.assert_array_equal(item["positions"], layout.positions)
            np.testing.assert_array_equal(item["cu_seqlens"], layout.cu_seqlens)
            labels = item.get("labels")
        elif next_token:
            tokens, labels = item
        else:
            tokens, labels = item, None
        inputs = want[0] if next_token else want
        assert tokens.dtype == np.dtype(dtype), step
        np.testing.assert_array_equal(tokens, inputs.astype(np.int64))
        if next_token:
            assert labels is not None and labels.dtype == np.dtype(label_dtype), step
            np.testing.assert_array_equal(labels, want[1].astype(np.int64))


@pytest.mark.parametrize(
    "ranks",
    [
        {"context_rank": 1, "context_size": 2},
        {"context_rank": 0, "context_size": 2, "zigzag": True},
        {"rank": 1, "world_size": 2},
        {"rank": 1, "world_size": 2, "bos_id": 0},  # document layouts need whole rows
    ],
    ids=["context", "zigzag", "data", "data-documents"],
)
@pytest.mark.parametrize("source", ["file", "dataset"])
@pytest.mark.parametrize("label_dtype", ["uint32", "int64"])
def test_a_ranks_int64_items_are_its_uint32_items_widened(
    tmp_path: Path, ranks: dict[str, Any], source: str, label_dtype: str
) -> None:
    ranks = dict(ranks)
    bos_id = ranks.pop("bos_id", None)
    path: Path = _periodic_file(tmp_path / "f.batch", seq_len=17)
    if source == "dataset":
        with BatchFileReader(path) as reader:
            rows = reader.read_batches(0, reader.num_batches).reshape(-1, reader.seq_len)
        write_sharded_dataset(tmp_path / "d", [rows], batch_size=4, seq_len=17, shard_batches=5)
        path = tmp_path / "d"
    expected = _uint32_items(path, next_token=True, **ranks)
    got = list(
        BatchNativeLoader(
            path,
            dtype="int64",
            label_dtype=label_dtype,  # type: ignore[arg-type]
            next_token=True,
            bos_id=bos_id,
            seed=5,
            **ranks,
        )
    )
    assert len(got) == len(expected) > 0
    for item, (inputs, labels) in zip(got, expected, strict=True):
        if bos_id is not None:
            np.testing.assert_array_equal(
                item["segment_ids"], document_layout(inputs, bos_id).segment_ids
            )
            item = (item["inputs"], item["labels"])
        assert item[0].dtype == np.int64 and item[1].dtype == np.dtype(label_dtype)
        np.testing.assert_array_equal(item[0], inputs)
        np.testing.assert_array_equal(item[1], labels)


def test_int64_items_of_one_batch_steps_come_from_shared_chunk_buffers(
    make_file: Callable[..., Path],
) -> None:
    # The int64 stage converts several steps with one copy (README, "Speed"): consecutive
    # items of a chunk are views of one pooled buffer, not one conversion each.
    items = list(BatchNativeLoader(make_file(n=80, batch_size=4), dtype="int64", seed=1))
    assert len(items) == 20 and all(item.base is not None for item in items)
    assert items[0].base is items[1].base


def test_an_ended_pass_does_not_forget_the_chunk_stage_of_the_pass_after_it(
    make_file: Callable[..., Path],
) -> None:
    # Closing an older pass must leave the newer pass's stage to the loader, which stops it
    # when the cursor moves: no converting thread outlives the pass it served.
    loader = BatchNativeLoader(make_file(n=400, batch_size=4), dtype="int64", seed=1)
    first = iter(loader)
    next(first)
    second = iter(loader)
    next(second)
    first.close()
    loader.seek(Position(0, 0))  # ends the second pass: its stage stops here
    deadline = time.monotonic() + 10
    while any(t.name == "zerobatch-chunks" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the second pass's chunk stage is still running"
        time.sleep(0.01)
    second.close()


@pytest.mark.parametrize("dtype", ["int64", "uint32"])
def test_the_cursor_after_each_item_is_the_step_after_it(
    make_file: Callable[..., Path], dtype: str
) -> None:
    path = make_file(n=80, batch_size=4)
    loader = BatchNativeLoader(path, dtype=dtype, seed=1)  # type: ignore[arg-type]
    everything = [np.array(item) for item in BatchNativeLoader(path, dtype=dtype, seed=1)]  # type: ignore[arg-type]
    for k, _ in enumerate(loader, start=1):
        assert loader.position == Position(0, k) or k == 20, k
        if k in (1, 7, 9):  # within and across chunks: a resumed loader serves the rest
            again = BatchNativeLoader(path, dtype=dtype, seed=1)  # type: ignore[arg-type]
            again.load_state_dict(loader.state_dict())
            rest = [np.array(item) for item in again]
            assert len(rest) == 20 - k
            assert all(np.array_equal(a, b) for a, b in zip(rest, everything[k:], strict=True))


def test_served_counts_the_skipped_steps_of_its_own_epoch_only(
    make_file: Callable[..., Path],
) -> None:
    # 10 steps per epoch; global steps 3-4 (epoch 0), 12-14 and 18 (epoch 1), 25 (epoch 2).
    loader = BatchNativeLoader(
        make_file(n=40, batch_size=4), skip_steps=[(3, 5), (12, 15), (18, 19), (25, 26)]
    )
    assert loader.served(Position(0, 0)) == 10 - 2
    assert loader.served(Position(1, 0)) == 10 - 4
    assert loader.served(Position(1, 3)) == 7 - 3  # step 13 on: 13, 14 and 18 skipped
    assert loader.served(Position(1, 5)) == 5 - 1  # step 15 on: only 18
    assert loader.served(Position(2, 4)) == 6 - 1
    assert loader.served(Position(2, 6)) == 4
    assert loader.served(Position(1, 10)) == 0


def test_a_state_with_the_largest_worker_count_loads(make_file: Callable[..., Path]) -> None:
    path = make_file(n=40, batch_size=4)
    state = BatchNativeLoader(path, seed=2).state_dict()
    state.update(num_workers=2**64 - 1, worker=0)
    loader = BatchNativeLoader(path, seed=2)
    loader.load_state_dict(state)  # worker 0 of 2**64 - 1 serves step 0 and nothing after
    assert len(list(loader)) == 1
    state.update(num_workers=2**64)
    with pytest.raises(StateError, match="num_workers"):
        loader.load_state_dict(state)


def test_an_ended_epoch_resumed_with_a_smaller_global_batch_stays_ended(
    make_file: Callable[..., Path],
) -> None:
    # 5 batches of 4: two steps of 8 samples end the epoch with 4 samples unserved; at 4 a
    # step, the same state must not serve them.
    path = make_file(n=20, batch_size=4)
    big = BatchNativeLoader(path, global_batch_size=8, seed=1)
    steps = iter(big)
    next(steps), next(steps)
    state = big.state_dict()
    assert state["step"] == 2
    small = BatchNativeLoader(path, global_batch_size=4, seed=1)
    small.load_state_dict(state)
    assert small.position == Position(0, 5) and list(small) == []


def _corrupt_remote_slot(directory: Path, slot: int, row: int, seq_len: int) -> None:
    path = directory / "shard-00000.batch"
    data = bytearray(path.read_bytes())
    with BatchFileReader(path) as reader:
        slot_bytes = reader.header.padded_batch_bytes
    data[HEADER_SIZE + slot * slot_bytes + row * seq_len * 4 + 5] ^= 0xFF
    path.write_bytes(bytes(data))


def test_one_remote_rank_with_steps_smaller_than_a_slot_checks_every_slot(
    tmp_path: Path,
) -> None:
    # One rank reads every row of a slot over consecutive steps: it fetches the slot whole
    # and checks it (README, "Object storage"), so a corrupted row is never served.
    write_sharded_dataset(
        tmp_path / "ds", [records(80, 16)], batch_size=8, seq_len=16, shard_batches=5
    )
    _corrupt_remote_slot(tmp_path / "ds", slot=3, row=6, seq_len=16)
    loader = BatchNativeLoader(f"file://{tmp_path / 'ds'}", global_batch_size=4, shuffle=False)
    served = []
    with pytest.raises(DatasetError, match="checksum_mismatch"):
        for item in loader:
            served.append(item)
    assert len(served) == 6  # slots 0 to 2, two steps each
    loader.source.close()


@pytest.mark.parametrize("dtype", ["uint32", "int64"])  # int64 converts on the caller, too
def test_remote_ranks_that_share_slots_fetch_only_their_rows(tmp_path: Path, dtype: str) -> None:
    write_sharded_dataset(
        tmp_path / "ds", [records(80, 16)], batch_size=8, seq_len=16, shard_batches=5
    )
    _corrupt_remote_slot(tmp_path / "ds", slot=3, row=6, seq_len=16)  # rank 1's rows only
    loader = BatchNativeLoader(
        f"file://{tmp_path / 'ds'}",
        rank=0,
        world_size=2,
        shuffle=False,
        dtype=dtype,  # type: ignore[arg-type]
    )
    assert len(list(loader)) == 10
    loader.source.close()


@pytest.mark.parametrize("dtype", ["uint32", "int32", "int64"])  # views, and the int64 chunks
def test_a_worker_of_a_plain_file_serves_only_its_share_of_the_views(
    make_file: Callable[..., Path], dtype: str
) -> None:
    # The whole-file view path serves every step in order; a worker's share must not take it.
    path = make_file(n=40, batch_size=4)
    everything = [np.array(i) for i in BatchNativeLoader(path, dtype=dtype, seed=3)]  # type: ignore[arg-type]
    for worker in (0, 1):
        loader = BatchNativeLoader(path, dtype=dtype, seed=3)  # type: ignore[arg-type]
        loader.split_workers(worker, 2)
        got = [np.array(i) for i in loader]
        assert len(got) == 5
        assert all(np.array_equal(a, b) for a, b in zip(got, everything[worker::2], strict=True))


def test_a_loader_keeps_one_chunk_pool_per_process(make_file: Callable[..., Path]) -> None:
    # Chunk buffers are reused across the passes of a process (bounded memory), and a forked
    # worker makes its own pool rather than sharing its parent's.
    loader = BatchNativeLoader(make_file(n=80, batch_size=4), dtype="int64", seed=1)
    for _ in loader:
        pass
    (pool,) = loader._pools()
    for _ in loader:
        pass
    assert loader._pools()[0] is pool and 0 < len(pool) <= pool.capacity


@pytest.mark.parametrize("source", ["file", "dataset"])
def test_ranks_whose_rows_cross_a_stored_batch_serve_their_rows_of_each_step(
    tmp_path: Path, source: str
) -> None:
    # 12 samples a step over batches of 4, two ranks of 6: rank 1's rows start in the middle
    # of a stored batch and end in the next one.
    path: Path = _periodic_file(tmp_path / "f.batch")
    if source == "dataset":
        with BatchFileReader(path) as reader:
            rows = reader.read_batches(0, reader.num_batches).reshape(-1, reader.seq_len)
        write_sharded_dataset(tmp_path / "d", [rows], batch_size=4, seq_len=9, shard_batches=5)
        path = tmp_path / "d"
    whole = [np.array(i) for i in BatchNativeLoader(path, global_batch_size=12, seed=2)]
    halves = [
        [
            np.array(i)
            for i in BatchNativeLoader(path, global_batch_size=12, seed=2, rank=r, world_size=2)
        ]
        for r in (0, 1)
    ]
    assert len(whole) == len(halves[0]) == len(halves[1]) == 4
    for step, item in enumerate(whole):
        assert halves[0][step].shape == halves[1][step].shape == (6, 9)
        np.testing.assert_array_equal(np.concatenate([halves[0][step], halves[1][step]]), item)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("worker", "workers"), [(0, 2), (1, 2), (2, 3)])
def test_int64_items_of_any_worker_split_are_the_uint32_items_widened(
    make_file: Callable[..., Path], seed: int, worker: int, workers: int
) -> None:
    # Runs of the int64 stage hold stored batches evenly spaced by the spacing of their first
    # two; over many seeds and short blocks, gaps of every size follow each other.
    path = make_file(n=160, batch_size=4)
    served = _int64_against_uint32(
        path, block_size=2, seed=seed, skip_steps=[(5, 7)], split=(worker, workers)
    )
    assert served > 10


@pytest.mark.parametrize("entry", ["ab", b"ab", "abc"])
def test_a_skip_entry_that_is_text_is_refused_whatever_its_length(entry: Any) -> None:
    with pytest.raises(ValueError, match="skip_steps entries must be"):
        normalize_skips([entry])


@pytest.mark.parametrize(
    "ranks",
    [
        {},
        {"context_rank": 1, "context_size": 2},
        {"context_rank": 0, "context_size": 2, "zigzag": True},
    ],
    ids=["whole", "context", "zigzag"],
)
@pytest.mark.parametrize("dtype", ["uint32", "int64"])
def test_the_batch_shape_is_the_shape_of_every_item(
    make_file: Callable[..., Path], ranks: dict[str, Any], dtype: str
) -> None:
    loader = BatchNativeLoader(make_file(n=40, seq_len=16, batch_size=4), dtype=dtype, **ranks)  # type: ignore[arg-type]
    shapes = {np.shape(item) for item in loader}
    assert shapes == {loader.batch_shape}


@pytest.mark.parametrize(
    "options", [{}, {"global_batch_size": 2}, {"dtype": "int64"}], ids=["views", "pieces", "chunks"]
)
def test_a_pass_superseded_before_its_first_item_serves_nothing(
    make_file: Callable[..., Path], options: dict[str, Any]
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4), seed=2, **options)
    older = iter(loader)
    newer = iter(loader)  # ends the older pass, which had not started
    assert next(older, None) is None
    assert loader.position == Position(0, 0)
    assert len(list(newer)) == loader.steps_per_epoch


def test_a_step_of_part_of_a_stored_batch_is_a_view_of_the_file(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4), global_batch_size=2, seed=2)
    assert all(not item.flags.owndata for item in loader)  # no copy: rows of the mapped batch


@pytest.mark.parametrize("context_rank", [0, 1])  # the first columns, and the last
@pytest.mark.parametrize("next_token", [False, True])  # labels reach one token further
def test_a_remote_context_rank_fetches_just_its_columns(
    tmp_path: Path, next_token: bool, context_rank: int
) -> None:
    # Planned fetches (RemoteSource.ahead) must be the regions read, or each is fetched twice.
    seq_len = 17 if next_token else 16  # 16 inputs' columns to split between the two ranks
    write_sharded_dataset(
        tmp_path / "ds", [records(80, seq_len)], batch_size=8, seq_len=seq_len, shard_batches=5
    )
    loader = BatchNativeLoader(
        f"file://{tmp_path / 'ds'}",
        context_rank=context_rank,
        context_size=2,
        verify="off",
        shuffle=False,
        next_token=next_token,
    )
    before = loader.source.store.stats.snapshot()["bytes_read"]
    items = list(loader)
    after = loader.source.store.stats.snapshot()["bytes_read"]
    width = (items[0][0] if next_token else items[0]).shape[1]
    columns = width + 1 if next_token else width  # the labels' extra token is read too
    assert len(items) == 10 and columns < seq_len
    # Two shards' headers, then ten steps of 8 rows of the rank's columns, each fetched once.
    assert after - before == 2 * HEADER_SIZE + 10 * 8 * columns * 4
    loader.source.close()


def test_a_file_has_one_identity_read_locally_or_from_a_store(
    make_file: Callable[..., Path],
) -> None:
    # A state saved over a local file loads into a loader of the same file at a URL (and back):
    # a file's identity is its size, header and sampled tokens wherever it is read from.
    path = make_file(n=40, batch_size=4)
    local = BatchNativeLoader(path, seed=2)
    next(iter(local))
    remote = BatchNativeLoader(f"file://{path}", seed=2)
    assert remote.identity() == local.identity()
    remote.load_state_dict(local.state_dict())
    assert remote.position == local.position == Position(0, 1)
    local.load_state_dict(remote.state_dict())
    remote.source.close()


def test_a_negative_worker_is_refused(make_file: Callable[..., Path]) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    with pytest.raises(ValueError, match="worker -1 is outside num_workers 2"):
        loader.split_workers(-1, 2)


def test_a_state_before_step_zero_is_refused_naming_the_step(
    make_file: Callable[..., Path],
) -> None:
    loader = BatchNativeLoader(make_file(n=40, batch_size=4))
    state = loader.state_dict()
    state.update(step=-1)
    with pytest.raises(StateError, match="state step -1 is outside"):
        loader.load_state_dict(state)


@pytest.mark.parametrize(
    ("global_batch_size", "skip"),
    [(2, (10, 5990)), (1, (10, 11000))],  # one batch a step, and half a batch a step
    ids=["whole-batches", "half-batches"],
)
def test_a_skip_far_past_the_restart_gap_serves_the_steps_after_it(
    tmp_path: Path, global_batch_size: int, skip: tuple[int, int]
) -> None:
    # Past RESTART_GAP positions the walk starts the order anew where the next step is: the
    # steps after a long skipped range are the batches the order puts there.
    path = tmp_path / "long.batch"
    write_batch_file(path, records(12000, 8), 2, seed=5)  # 6000 batches of 2 rows
    everything = [
        np.array(item)
        for item in BatchNativeLoader(
            path, seed=1, block_size=8, global_batch_size=global_batch_size
        )
    ]
    loader = BatchNativeLoader(
        path, seed=1, block_size=8, global_batch_size=global_batch_size, skip_steps=[skip]
    )
    got = [np.array(item) for item in loader]
    served = [s for s in range(len(everything)) if not skip[0] <= s < skip[1]]
    assert len(got) == len(served)
    assert all(np.array_equal(got[k], everything[s]) for k, s in enumerate(served))


@pytest.mark.parametrize(
    ("batches", "skips", "workers", "served"),
    [
        # 10 steps an epoch; epoch 1's steps 3-4 and 7 skipped: 5, 6, 8, 9 served from step 5.
        (40, [(13, 15), (17, 18)], 2, 4),
        # 20 steps an epoch; epoch 1's steps 1, 7-8 and 13 skipped (step 1 before the origin
        # must not count): 12 served from step 5.
        (80, [(21, 22), (27, 29), (33, 34)], 3, 12),
    ],
)
def test_workers_split_at_a_later_epochs_middle_share_its_served_steps(
    make_file: Callable[..., Path],
    batches: int,
    skips: list[tuple[int, int]],
    workers: int,
    served: int,
) -> None:
    # The split's origin is step 5 of epoch 1: the workers deal out the served steps from there.
    path = make_file(n=batches, batch_size=4)
    single = BatchNativeLoader(path, seed=4, skip_steps=skips)
    single.seek(Position(1, 5))
    everything = [np.array(i) for i in single]
    assert len(everything) == served
    for worker in range(workers):
        loader = BatchNativeLoader(path, seed=4, skip_steps=skips)
        loader.seek(Position(1, 5))
        loader.split_workers(worker, workers)
        got = [np.array(i) for i in loader]
        expected = everything[worker::workers]
        assert len(got) == len(expected)
        assert all(np.array_equal(x, y) for x, y in zip(got, expected, strict=True))


@pytest.mark.parametrize("seed", range(8))
def test_int64_runs_over_a_shuffled_order_of_short_blocks_hold_the_batches_served(
    make_file: Callable[..., Path], seed: int
) -> None:
    # Blocks of two batches: the stored indices of consecutive steps go up by one, then jump
    # at random, so the int64 stage's runs must end wherever the spacing of their first two
    # breaks (whatever the jump happens to equal). The skipped step sends the served steps
    # through the general walk.
    path = make_file(n=400, batch_size=4)
    assert _int64_against_uint32(path, block_size=2, seed=seed, skip_steps=[(3, 4)]) == 99


def test_the_core_loader_builds_the_registered_kind_for_its_sources(
    make_file: Callable[..., Path],
) -> None:
    from zerobatch_core import Mixture, MixtureLoader

    path = make_file()
    assert type(BatchNativeLoader(Mixture([("a", path, 1)]))) is MixtureLoader
    assert type(BatchNativeLoader(path)) is BatchNativeLoader

    class Plain(BatchNativeLoader):
        pass

    assert type(Plain(path)) is Plain  # a subclass named by the caller is built as itself
