"""Order, reader and validation behaviours that mutation testing found unpinned
(tests/README.md)."""

from __future__ import annotations

import dataclasses
import errno
import faulthandler
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec import HEADER_SIZE, ErrorCode, Violation
from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME

from tests.helpers import records
from zerobatch_core import (
    BatchFileReader,
    DatasetReader,
    validate_dataset,
    validate_file,
    write_sharded_dataset,
)
from zerobatch_core.errors import FormatError
from zerobatch_core.files import validation as validation_module
from zerobatch_core.files.validation import ValidationReport
from zerobatch_core.order import BlockOrder, ShardedBlockOrder, Span, sharded_order

# -- order -----------------------------------------------------------------------------------


def test_a_block_order_is_an_immutable_value() -> None:
    order = BlockOrder(10, 3, seed=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        order.seed = 2  # type: ignore[misc]


def test_a_span_is_an_immutable_value() -> None:
    span = BlockOrder(10, 3, seed=1).spans(0).__next__()
    with pytest.raises(dataclasses.FrozenInstanceError):
        span.stop = 0  # type: ignore[misc]
    assert hash(span) == hash(Span(span.start, span.stop))


def test_a_negative_batch_count_is_refused() -> None:
    assert BlockOrder(0, 3, seed=1).epoch_order(0).size == 0
    with pytest.raises(ValueError, match="num_batches must be non-negative, got -1"):
        BlockOrder(-1, 3, seed=1)


def test_a_block_order_refuses_empty_blocks() -> None:
    assert BlockOrder(10, 1, seed=1).block_size == 1
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        BlockOrder(10, 0, seed=1)


@pytest.mark.parametrize("seed", range(8))
def test_spans_are_never_empty_from_any_start(seed: int) -> None:
    # The loader reads ahead and checks the file once per span.
    order = BlockOrder(11, 3, seed=seed)  # blocks 3, 3, 3 and a short one of 2
    for start in range(11):
        assert all(s.stop > s.start for s in order.spans(0, start)), start


@pytest.mark.parametrize("shuffle", [True, False])
def test_spans_from_the_end_of_the_epoch_are_none(shuffle: bool) -> None:
    for n in (9, 10, 11):  # full blocks only, and a short last block of 1 or 2
        assert list(BlockOrder(n, 3, seed=1, shuffle=shuffle).spans(0, n)) == [], n


def test_unshuffled_spans_resumed_mid_block_keep_to_block_boundaries() -> None:
    # The loader reads ahead one span at a time: a resumed epoch keeps the blocks' edges.
    spans = list(BlockOrder(10, 3, seed=1, shuffle=False).spans(0, 5))
    assert spans == [Span(5, 6), Span(6, 9), Span(9, 10)]


def test_a_sharded_order_with_a_filled_cache_equals_a_fresh_one() -> None:
    used, fresh = sharded_order([3, 2, 4], 2, seed=5), sharded_order([3, 2, 4], 2, seed=5)
    used.epoch_order(0)
    assert used == fresh and hash(used) == hash(fresh)


@pytest.mark.parametrize("shuffle", [True, False])
def test_sharded_indices_resume_from_any_position(shuffle: bool) -> None:
    order = sharded_order([3, 2, 4], 2, seed=5, shuffle=shuffle)
    full = order.epoch_order(1).tolist()
    for start in range(10):
        assert list(order.indices(1, start)) == full[start:], start


def test_an_unshuffled_sharded_order_is_the_slot_order() -> None:
    assert sharded_order([3, 2, 4], 2, seed=5, shuffle=False).epoch_order(3).tolist() == list(
        range(9)
    )


def test_a_sharded_order_is_shuffled_by_default() -> None:
    assert sharded_order([3, 2, 4], 2, seed=5).shuffle is True


def test_a_sharded_block_order_made_directly_is_shuffled_by_default() -> None:
    assert ShardedBlockOrder((3, 2, 4), 2, seed=5) == sharded_order([3, 2, 4], 2, seed=5)


def test_a_sharded_orders_repr_leaves_out_its_cache() -> None:
    order = sharded_order([3, 2, 4], 2, seed=5)
    order.epoch_order(0)
    assert "_cache" not in repr(order)


def test_a_sharded_orders_repr_shows_only_what_it_was_made_from() -> None:
    # The block layout is derived state: per-shard arrays that would repeat the shard list.
    assert repr(ShardedBlockOrder((3, 2, 4), 2, seed=5)) == (
        "ShardedBlockOrder(shard_batches=(3, 2, 4), block_size=2, seed=5, shuffle=True)"
    )


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_sharded_spans_from_any_start_are_never_empty_and_start_there(
    shuffle: bool, seed: int
) -> None:
    # The loader reads ahead and checks the shard once per span, so a resumed epoch must not
    # begin with an empty or inverted span before the one that holds its first position.
    order = sharded_order([5, 2, 7, 1, 4], 3, seed=seed, shuffle=shuffle)
    full = order.epoch_order(2).tolist()
    for start in range(len(full) + 1):
        spans = list(order.spans(2, start))
        assert all(s.stop > s.start for s in spans), (start, spans)
        assert [i for s in spans for i in range(s.start, s.stop)] == full[start:], start
        if start < len(full):
            assert spans[0].start == full[start], start


@pytest.mark.parametrize("shard_batches", [(), (0,), (0, 0, 0)])
def test_a_sharded_order_without_slots_is_empty_and_warns_of_nothing(
    shard_batches: tuple[int, ...],
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division by a zero block size on the way
        order = ShardedBlockOrder(shard_batches, 4, seed=1)
        assert order.num_batches == 0
        assert list(order.spans(0)) == [] and order.epoch_order(0).tolist() == []


def test_a_sharded_order_checks_its_block_size_when_made() -> None:
    assert sharded_order([3], 1, seed=1).block_size == 1
    with pytest.raises(ValueError, match="block_size must be at least 1, got 0"):
        sharded_order([3], 0, seed=1)


@pytest.mark.parametrize("shuffle", [True, False])
def test_block_spans_start_at_the_first_position_by_default(shuffle: bool) -> None:
    order = BlockOrder(10, 3, seed=1, shuffle=shuffle)
    assert sorted(i for s in order.spans(0) for i in range(s.start, s.stop)) == list(range(10))


def test_sharded_spans_start_at_the_first_position_by_default() -> None:
    order = sharded_order([3, 2, 4], 2, seed=5)
    assert sum(s.stop - s.start for s in order.spans(0)) == 9


# -- reader ----------------------------------------------------------------------------------


def test_the_fault_handler_is_offered_once_per_process(make_file: Callable[..., Path]) -> None:
    # A program that disables faulthandler after its first reader keeps it disabled.
    path = make_file()
    was_enabled = faulthandler.is_enabled()
    BatchFileReader(path).close()
    faulthandler.disable()
    try:
        BatchFileReader(path).close()
        assert not faulthandler.is_enabled()
    finally:
        if was_enabled:
            faulthandler.enable()


class Requests:
    """Records the byte ranges a reader asks its read-ahead worker for."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def request(self, offset: int, length: int) -> None:
        self.calls.append((offset, length))


@pytest.mark.parametrize(("start", "first"), [(0, 0), (-3, 0), (1, 1)])
def test_read_ahead_asks_for_exactly_the_batches_clamped_to_the_file(
    make_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, start: int, first: int
) -> None:
    reader = BatchFileReader(make_file(n=40, seq_len=8, batch_size=4))
    requests = Requests()
    monkeypatch.setattr(reader, "_readahead", requests)
    reader.read_ahead(start, 3)
    monkeypatch.undo()
    reader.close()
    pb = reader.padded_batch_bytes
    assert requests.calls == [(HEADER_SIZE + first * pb, (3 - first) * pb)]


def test_read_ahead_of_an_empty_range_asks_for_nothing(
    make_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = BatchFileReader(make_file(n=40, seq_len=8, batch_size=4))
    requests = Requests()
    monkeypatch.setattr(reader, "_readahead", requests)
    reader.read_ahead(2, 2)
    monkeypatch.undo()
    reader.close()
    assert requests.calls == []


def test_read_ahead_of_a_closed_reader_asks_for_nothing(
    make_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = BatchFileReader(make_file(n=40, seq_len=8, batch_size=4))
    reader.close()
    requests = Requests()
    monkeypatch.setattr(reader, "_readahead", requests, raising=False)
    reader.read_ahead(0, 2)
    assert requests.calls == []


def test_a_batch_range_cannot_start_before_the_first_batch(
    make_file: Callable[..., Path],
) -> None:
    with BatchFileReader(make_file(n=40, batch_size=4)) as reader, pytest.raises(IndexError):
        reader.read_batches(-1, 2)


def test_closed_is_a_plain_attribute(make_file: Callable[..., Path]) -> None:
    reader = BatchFileReader(make_file())
    assert reader.closed is False
    reader.close()
    assert reader.closed is True


def test_the_most_negative_batch_index_is_the_first_batch(make_file: Callable[..., Path]) -> None:
    with BatchFileReader(make_file(n=40, batch_size=4)) as reader:
        np.testing.assert_array_equal(reader.read_batch(-len(reader)), reader.read_batch(0))


# -- validation ------------------------------------------------------------------------------


def padded_file(make_file: Callable[..., Path]) -> Path:
    """10 batches of [4, 8] tokens: 128 token bytes in each 4096-byte slot."""
    return make_file(n=40, seq_len=8, batch_size=4)


def set_byte(path: Path, offset: int, value: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] = value
    path.write_bytes(bytes(data))


def test_a_validation_report_is_an_immutable_value(make_file: Callable[..., Path]) -> None:
    report = validate_file(padded_file(make_file))
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.valid = False  # type: ignore[misc]


def test_a_report_is_not_deep_unless_said() -> None:
    assert ValidationReport("x.batch", True).deep is False


def test_the_deep_read_of_a_small_file_is_one_chunk(
    make_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # DEEP_CHUNK_BYTES (64 MiB) at a time: 10 slots of 4096 bytes are one chunk, one size check.
    path = padded_file(make_file)
    checks: list[int] = []
    check_size = BatchFileReader.check_size

    def counted(self: BatchFileReader) -> None:
        checks.append(1)
        check_size(self)

    monkeypatch.setattr(BatchFileReader, "check_size", counted)
    assert validate_file(path, deep=True).valid
    assert len(checks) == 1


def test_slots_larger_than_a_deep_chunk_are_read_one_at_a_time(
    make_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = padded_file(make_file)
    set_byte(path, HEADER_SIZE + 7 * 4096 + 200, 1)
    monkeypatch.setattr(validation_module, "DEEP_CHUNK_BYTES", 100)  # below one slot
    report = validate_file(path, deep=True)
    assert (report.code, report.detail) == (
        ErrorCode.NONZERO_PADDING,
        "batch 7: slot byte 200 is 0x01; slot bytes 128..4095 must be zero",
    )


def test_the_first_nonzero_padding_byte_is_reported(make_file: Callable[..., Path]) -> None:
    path = padded_file(make_file)
    set_byte(path, HEADER_SIZE + 5 * 4096 + 128, 2)  # batch 5, first padding word
    set_byte(path, HEADER_SIZE + 2 * 4096 + 132, 1)  # batch 2, second padding word: first
    assert validate_file(path, deep=True).detail == (
        "batch 2: slot byte 132 is 0x01; slot bytes 128..4095 must be zero"
    )


def test_a_file_that_changes_during_the_deep_read_is_invalid(
    make_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = padded_file(make_file)

    def shrunk(self: BatchFileReader) -> None:
        violation = Violation(ErrorCode.SIZE_MISMATCH, "num_batches", "file is 4096 bytes now")
        raise FormatError(str(path), violation)

    monkeypatch.setattr(BatchFileReader, "check_size", shrunk)
    report = validate_file(path, deep=True)
    assert (report.valid, report.code) == (False, ErrorCode.SIZE_MISMATCH)


def test_the_deep_check_reads_nothing_when_slots_have_no_padding(
    make_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_file(n=8, seq_len=256, batch_size=4)  # 4 * 256 * 4 bytes: exactly one page
    checks: list[int] = []
    monkeypatch.setattr(BatchFileReader, "check_size", lambda self: checks.append(1))
    assert validate_file(path, deep=True).valid
    assert checks == []


def test_the_first_nonzero_padding_word_of_a_slot_is_reported(
    make_file: Callable[..., Path],
) -> None:
    path = padded_file(make_file)
    set_byte(path, HEADER_SIZE + 3 * 4096 + 140, 7)  # batch 3, fourth padding word
    set_byte(path, HEADER_SIZE + 3 * 4096 + 133, 1)  # batch 3, second padding word: first
    assert validate_file(path, deep=True).detail == (
        "batch 3: slot byte 133 is 0x01; slot bytes 128..4095 must be zero"
    )


def small_dataset(tmp_path: Path) -> Path:
    """4 shards of 3 batches of 4 records of 5 tokens (80 token bytes in 4096-byte slots)."""
    out = tmp_path / "ds"
    write_sharded_dataset(out, [records(48, 5)], batch_size=4, seq_len=5, shard_batches=3, seed=2)
    return out


def test_a_dataset_report_without_a_manifest_checked_nothing(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path)
    (dataset / MANIFEST_NAME).write_text("{}")
    report = validate_dataset(dataset, deep=True)
    assert report.manifest is None and not report.valid
    assert (report.shards_checked, report.slots_checked) == (0, 0)


def test_a_checksum_mismatch_names_the_slot_in_the_shard_and_in_the_dataset(
    tmp_path: Path,
) -> None:
    dataset = small_dataset(tmp_path)
    set_byte(dataset / "shard-00002.batch", HEADER_SIZE + 1 * 4096 + 10, 0xFF)  # dataset slot 7
    (failure,) = validate_dataset(dataset, deep=True).failures
    assert failure.code == "checksum_mismatch"
    assert failure.detail.startswith("slot 1 (dataset slot 7): xxh3 ")


def test_the_deep_dataset_check_names_padding_slots_beyond_the_first_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = small_dataset(tmp_path)
    set_byte(dataset / "shard-00001.batch", HEADER_SIZE + 2 * 4096 + 90, 1)  # slot 2 padding
    monkeypatch.setattr(validation_module, "DEEP_CHUNK_BYTES", 4096)  # one slot per chunk
    first = validate_dataset(dataset, deep=True).failures[0]
    assert (first.code, first.shard, first.slot) == ("nonzero_padding", "shard-00001.batch", 2)


def test_a_shard_that_breaks_a_file_rule_does_not_stop_the_check(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path)
    set_byte(dataset / "shard-00000.batch", 0, 0)  # the magic
    (dataset / "shard-00002.batch").unlink()
    report = validate_dataset(dataset)
    assert [(f.code, f.shard) for f in report.failures] == [
        ("bad_magic", "shard-00000.batch"),
        ("shard_missing", "shard-00002.batch"),
    ]
    assert report.shards_checked == 2


def test_the_deep_check_of_a_one_batch_file_reads_its_padding(
    make_file: Callable[..., Path],
) -> None:
    path = make_file(n=4, seq_len=8, batch_size=4)  # one slot: 128 token bytes, then padding
    set_byte(path, HEADER_SIZE + 200, 3)
    assert validate_file(path, deep=True).detail == (
        "batch 0: slot byte 200 is 0x03; slot bytes 128..4095 must be zero"
    )


def test_the_deep_dataset_check_reads_a_chunk_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Memory stays one chunk: with one slot per chunk, the 12 slots are 12 reads (and checks).
    dataset = small_dataset(tmp_path)
    monkeypatch.setattr(validation_module, "DEEP_CHUNK_BYTES", 4096)
    checks: list[int] = []
    check_size = BatchFileReader.check_size

    def counted(self: BatchFileReader) -> None:
        checks.append(1)
        check_size(self)

    monkeypatch.setattr(BatchFileReader, "check_size", counted)
    assert validate_dataset(dataset, deep=True).valid
    assert len(checks) == 12


def test_a_dataset_report_is_an_immutable_value(tmp_path: Path) -> None:
    report = validate_dataset(small_dataset(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.deep = True  # type: ignore[misc]


def test_a_shard_that_shrinks_during_the_deep_dataset_check_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = small_dataset(tmp_path)

    def shrunk(self: BatchFileReader) -> None:
        violation = Violation(ErrorCode.SIZE_MISMATCH, "num_batches", "file is 4096 bytes now")
        raise FormatError(self.path, violation)

    monkeypatch.setattr(BatchFileReader, "check_size", shrunk)
    failures = validate_dataset(dataset, deep=True).failures
    assert [(f.code, f.shard) for f in failures] == [
        ("size_mismatch", f"shard-0000{i}.batch") for i in range(4)
    ]


def test_a_dataset_failure_is_an_immutable_value(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path)
    (dataset / "shard-00001.batch").unlink()
    (failure,) = validate_dataset(dataset).failures
    with pytest.raises(dataclasses.FrozenInstanceError):
        failure.detail = "fine"  # type: ignore[misc]


def test_slots_larger_than_a_deep_chunk_are_checked_one_at_a_time_in_a_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = small_dataset(tmp_path)
    set_byte(dataset / "shard-00003.batch", HEADER_SIZE + 1 * 4096 + 300, 9)  # dataset slot 10
    monkeypatch.setattr(validation_module, "DEEP_CHUNK_BYTES", 100)  # below one slot
    failures = validate_dataset(dataset, deep=True).failures
    assert [(f.code, f.dataset_slot) for f in failures] == [
        ("nonzero_padding", 10),
        ("checksum_mismatch", 10),
    ]


def test_without_checksums_every_slots_padding_is_still_checked(tmp_path: Path) -> None:
    dataset = small_dataset(tmp_path)
    (dataset / CHECKSUMS_NAME).write_bytes(b"")  # broken: no checksums to compare
    set_byte(dataset / "shard-00001.batch", HEADER_SIZE + 2 * 4096 + 100, 1)  # its last slot
    failures = validate_dataset(dataset, deep=True).failures
    assert [(f.code, f.shard, f.slot) for f in failures] == [
        ("checksums_mismatch", None, None),
        ("nonzero_padding", "shard-00001.batch", 2),
    ]


def test_a_file_opens_where_the_os_has_no_o_nonblock(
    make_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_file(n=40, seq_len=8, batch_size=4)
    monkeypatch.delattr(os, "O_NONBLOCK")
    with BatchFileReader(path) as reader:
        assert reader.read_batch(0).shape == (4, 8)


def test_a_file_with_slots_larger_than_a_deep_chunk_is_checked_a_slot_at_a_time(
    make_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = padded_file(make_file)  # 10 slots
    monkeypatch.setattr(validation_module, "DEEP_CHUNK_BYTES", 100)  # below one slot
    checks: list[int] = []
    check_size = BatchFileReader.check_size

    def counted(self: BatchFileReader) -> None:
        checks.append(1)
        check_size(self)

    monkeypatch.setattr(BatchFileReader, "check_size", counted)
    assert validate_file(path, deep=True).valid
    assert len(checks) == 10


def test_an_os_error_reading_the_checksums_is_a_checksums_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DatasetReader reports a missing or unreadable file itself; any other OSError on the way
    # (here injected) still becomes the checksums file's failure, not a traceback.
    dataset = small_dataset(tmp_path)

    def failing(self: DatasetReader) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(DatasetReader, "checksums", failing)
    (failure,) = validate_dataset(dataset).failures
    assert (failure.code, failure.where) == ("checksums_mismatch", CHECKSUMS_NAME)
    assert failure.detail == "cannot be read as the checksums file: Permission denied"
