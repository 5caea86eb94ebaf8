"""Slicing, dataset and provenance behaviours that mutation testing found unpinned
(tests/README.md, "Mutation testing")."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import os
import re
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec.dataset import CHECKSUMS_NAME, MANIFEST_NAME, DatasetCode, Source, shard_seed

from tests.helpers import records
from tests.unit.test_odd_inputs import promptly
from zerobatch_core import (
    BatchFileReader,
    DatasetError,
    DatasetReader,
    FormatError,
    WriteError,
    create_dataset,
    trace_step,
    validate_dataset,
    write_batch_file,
    write_sharded_dataset,
)
from zerobatch_core.datasets import build as dataset_build
from zerobatch_core.datasets import replace as dataset_replace
from zerobatch_core.datasets.dataset import _opener
from zerobatch_core.delivery.provenance import RowOrigin, TraceError, TracePiece
from zerobatch_core.delivery.slicing import Slicing
from zerobatch_core.errors import ZeroBatchIOError

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


# -- dataset reader ----------------------------------------------------------------------------


def _one_slot_shards(directory: Path, shards: int) -> Path:
    """A dataset of ``shards`` shards of one slot each (4 records of 2 tokens a slot)."""
    write_sharded_dataset(
        directory, [records(4 * shards, 2)], batch_size=4, seq_len=2, shard_batches=1, seed=9
    )
    return directory


def _open_shard_numbers(directory: Path) -> set[int]:
    """Numbers of the shards of ``directory`` this process holds open once every queued
    background open and close has run and no read-ahead hint still holds a descriptor."""
    gc.collect()
    _opener().submit(lambda: None).result()  # one thread, in order: every queued task is done

    def shards_open() -> set[int]:
        found = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = Path(os.readlink(f"/proc/self/fd/{fd}"))
                if target.parent == directory.resolve() and target.name.startswith("shard-"):
                    found.add(int(target.name[len("shard-") : -len(".batch")]))
        return found

    now, deadline = shards_open(), time.monotonic() + 5.0
    while time.monotonic() < deadline:
        time.sleep(0.05)
        later = shards_open()
        if later == now:
            break
        now = later
    return now


@pytest.fixture
def dataset3(tmp_path: Path) -> Path:
    """A dataset of 4 shards of 3 slots (4 records of 2 tokens a slot)."""
    path = tmp_path / "ds3"
    write_sharded_dataset(path, [records(48, 2)], batch_size=4, seq_len=2, shard_batches=3, seed=9)
    return path


class _RecordingDataset(DatasetReader):
    """A dataset that logs the shards it opens and the read-ahead ranges it asks them for."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        self.opened: list[int] = []
        self.hints: list[tuple[int, int, int]] = []
        super().__init__(path, **kwargs)

    def _open_shard(self, shard: int) -> BatchFileReader:
        reader = super()._open_shard(shard)
        self.opened.append(shard)
        hint = reader.read_ahead

        def read_ahead(start: int, stop: int) -> None:
            self.hints.append((shard, start, stop))
            hint(start, stop)

        reader.read_ahead = read_ahead  # type: ignore[method-assign]
        return reader


def test_a_dataset_keeps_32_shards_open_by_default_as_the_readme_says(tmp_path: Path) -> None:
    """README, "Limitations": "A dataset keeps at most `max_open` shards open (32 by default)"."""
    path = _one_slot_shards(tmp_path / "ds", 34)
    with DatasetReader(path, verify="off") as ds:
        for i in range(34):
            ds.read_batch(i)
        assert _open_shard_numbers(path) == set(range(2, 34))


@pytest.mark.parametrize("max_open", [True, 0, -1, 1.5, "2"])
def test_max_open_must_be_a_positive_integer(tmp_path: Path, max_open: Any) -> None:
    path = _one_slot_shards(tmp_path / "ds", 2)
    with pytest.raises(ValueError, match="max_open must be a positive integer"):
        DatasetReader(path, max_open=max_open)


def test_a_max_open_of_one_keeps_only_the_shard_last_read(tmp_path: Path) -> None:
    path = _one_slot_shards(tmp_path / "ds", 3)
    tokens = records(12, 2)
    with DatasetReader(path, max_open=1) as ds:
        for i in range(3):
            assert sorted(ds.read_batch(i).tolist()) == sorted(tokens[4 * i : 4 * i + 4].tolist())
        assert _open_shard_numbers(path) == {2}


def test_the_least_recently_used_shards_are_closed_past_max_open(tmp_path: Path) -> None:
    path = _one_slot_shards(tmp_path / "ds", 4)
    with DatasetReader(path, max_open=2, verify="off") as ds:
        for i in (0, 1, 2):
            ds.read_batch(i)
        assert _open_shard_numbers(path) == {1, 2}
        ds.read_batch(1)  # now 2 is the least recently used
        ds.read_batch(3)
        assert _open_shard_numbers(path) == {1, 3}


def test_read_ahead_opens_at_most_the_next_two_shards_as_the_readme_says(tmp_path: Path) -> None:
    """README, "Limitations": at most `max_open` shards open "plus the next two, which a background
    thread opens": reading six shards ahead with max_open=1 leaves the last three open, the
    earlier ones opened and closed in order."""
    path = _one_slot_shards(tmp_path / "ds", 6)
    tokens = records(24, 2)
    with DatasetReader(path, max_open=1) as ds:
        ds.read_ahead(0, 6)
        assert _open_shard_numbers(path) == {3, 4, 5}
        for i in range(6):
            assert sorted(ds.read_batch(i).tolist()) == sorted(tokens[4 * i : 4 * i + 4].tolist())


def test_a_shard_opened_ahead_and_not_read_is_closed_before_shards_in_use(tmp_path: Path) -> None:
    """Shard 0 is in use; shards 1..3 are opened ahead; reading shard 2 pushes past max_open=2,
    and the shard that goes is 1 (opened ahead, never read), not 0."""
    path = _one_slot_shards(tmp_path / "ds", 4)
    with DatasetReader(path, max_open=2, verify="off") as ds:
        ds.read_batch(0)
        ds.read_ahead(1, 4)
        ds.read_batch(2)
        assert _open_shard_numbers(path) == {0, 2, 3}


def test_bytes_read_starts_at_zero_and_counts_each_verified_slot_once(tmp_path: Path) -> None:
    path = _one_slot_shards(tmp_path / "ds", 2)
    with DatasetReader(path) as ds:
        assert ds.bytes_read == 0
        ds.read_batch(1)
        slot = ds.shard(1).padded_batch_bytes
        assert ds.bytes_read == slot
        ds.read_batch(1)  # "first": checked once
        ds.read_batch(0)
        assert ds.bytes_read == 2 * slot


@pytest.mark.parametrize("index", [-1, 3])
def test_slots_outside_the_dataset_are_refused(tmp_path: Path, index: int) -> None:
    path = _one_slot_shards(tmp_path / "ds", 3)
    with DatasetReader(path) as ds:
        with pytest.raises(IndexError, match=f"slot {index} out of range for 3"):
            ds.locate(index)
        with pytest.raises(IndexError):
            ds.read_batch(index)


def test_check_size_checks_the_shard_of_slot_zero_by_default(tmp_path: Path) -> None:
    path = _one_slot_shards(tmp_path / "ds", 3)
    with DatasetReader(path) as ds:
        ds.read_batch(0)
        ds.read_batch(1)
        ds.check_size()  # intact
        first = path / ds.shards[0].name
        os.truncate(first, first.stat().st_size - 1)
        ds.check_size(1)  # shard 1 is intact
        with pytest.raises(FormatError, match="truncated"):
            ds.check_size()


def test_a_closed_dataset_reads_nothing_and_holds_no_shard_open(tmp_path: Path) -> None:
    path = _one_slot_shards(tmp_path / "ds", 3)
    ds = DatasetReader(path)
    ds.read_batch(0)
    ds.close()
    assert ds.closed
    with pytest.raises(ValueError, match="reader is closed"):
        ds.read_batch(1)
    with pytest.raises(ValueError, match="reader is closed"):
        ds.read_batch(0)
    assert _open_shard_numbers(path) == set()


def test_close_waits_for_and_closes_the_shards_being_opened_ahead(tmp_path: Path) -> None:
    """The shard-opening thread is held busy, so the two shards asked for ahead are still to
    be opened when ``close`` is called: it returns only once they are opened and closed."""
    path = _one_slot_shards(tmp_path / "ds", 3)
    ds = _RecordingDataset(path)
    gate = threading.Event()
    _opener().submit(gate.wait, 10.0)
    ds.read_ahead(0, 2)
    timer = threading.Timer(0.2, gate.set)
    timer.start()
    ds.close()
    opened_before_close_returned = list(ds.opened)
    timer.join()
    assert opened_before_close_returned == [0, 1]
    assert _open_shard_numbers(path) == set()


def test_a_shard_that_cannot_be_looked_up_is_a_named_dataset_error(tmp_path: Path) -> None:
    """A shard replaced by a symbolic link to itself (``stat`` fails with ELOOP, not ENOENT)."""
    path = _one_slot_shards(tmp_path / "ds", 2)
    with DatasetReader(path) as ds:
        shard = path / ds.shards[1].name
        shard.unlink()
        shard.symlink_to(shard.name)
        ds.read_batch(0)
        with pytest.raises(DatasetError, match="cannot be read") as e:
            ds.read_batch(1)
        assert e.value.code is DatasetCode.SHARD_MISSING


def test_reading_ahead_over_a_missing_shard_raises_only_when_it_is_read(tmp_path: Path) -> None:
    path = _one_slot_shards(tmp_path / "ds", 4)
    (path / "shard-00000.batch").unlink()
    with DatasetReader(path) as ds:
        ds.read_ahead(0, 4)  # shard 0's open fails on the opening thread: nobody asked yet
        assert ds.read_batch(3).shape == (4, 2)
        with pytest.raises(DatasetError, match="not found"):
            ds.read_batch(0)


def test_read_ahead_asks_each_shard_for_exactly_its_part_of_the_range(dataset3: Path) -> None:
    """Shards of 3 slots: a range inside one shard, and one spanning three shards, asked of
    shards already open and of shards opened ahead."""
    with _RecordingDataset(dataset3, verify="off") as ds:
        ds.read_batch(0)
        ds.read_batch(3)
        ds.read_ahead(1, 2)
        ds.read_ahead(4, 11)
        _opener().submit(lambda: None).result()
        assert ds.hints == [(0, 1, 2), (1, 1, 3), (2, 0, 3), (3, 0, 2)]


def test_read_ahead_from_a_shard_not_open_asks_for_the_rest_of_the_range(dataset3: Path) -> None:
    with _RecordingDataset(dataset3, verify="off") as ds:
        ds.read_ahead(2, 4)
        _opener().submit(lambda: None).result()
        assert ds.hints == [(0, 2, 3), (1, 0, 1)]


def test_a_process_reading_datasets_has_one_shard_opening_thread(tmp_path: Path) -> None:
    """README, "Limitations": "A process reading a dataset has one such thread"."""
    a, b = _one_slot_shards(tmp_path / "a", 6), _one_slot_shards(tmp_path / "b", 6)
    with DatasetReader(a) as da, DatasetReader(b) as db:
        for _ in range(3):
            da.read_ahead(0, 6)
            db.read_ahead(0, 6)
        threads = [t for t in threading.enumerate() if t.name.startswith("zerobatch-shards")]
        assert len(threads) == 1


def test_a_long_pass_keeps_no_record_of_shards_closed_long_ago(tmp_path: Path) -> None:
    """Each shard left behind past max_open is closed in the background; once that close is
    done, nothing of it is kept, so a pass over any number of shards holds bounded memory."""
    path = _one_slot_shards(tmp_path / "ds", 60)

    def futures_alive() -> int:
        gc.collect()
        return sum(isinstance(o, Future) for o in gc.get_objects())

    with DatasetReader(path, max_open=1, verify="off") as ds:
        before = futures_alive()
        for i in range(60):
            ds.read_batch(i)
            _opener().submit(lambda: None).result()  # the shard left behind is now closed
        assert futures_alive() - before <= 2


class _ClosedWhileAdopting(DatasetReader):
    """A dataset that another thread closes just as ``read_ahead`` takes in a shard it had
    opened ahead (the shard's open is done, the dataset closed before it is kept)."""

    def _adopt(self, shard: int, pending: Future[BatchFileReader]) -> None:
        pending.result()
        closer = threading.Thread(target=self.close)
        closer.start()
        closer.join()
        super()._adopt(shard, pending)


def test_a_dataset_closed_during_read_ahead_keeps_no_shard_open(tmp_path: Path) -> None:
    path = _one_slot_shards(tmp_path / "ds", 3)
    ds = _ClosedWhileAdopting(path)
    ds.read_ahead(0, 3)  # shards 0 and 1 opened ahead; shard 2 makes room by taking in 0
    assert ds.closed
    assert _open_shard_numbers(path) == set()
    with pytest.raises(ValueError, match="reader is closed"):
        ds.read_batch(0)


def test_a_manifest_of_64_mib_opens_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    """SPEC.md 12.1 and README "Limitations": a dataset's manifest.json may be at most 64 MiB
    (here a real manifest padded with JSON whitespace); a larger one is refused unread."""
    path = _one_slot_shards(tmp_path / "ds", 1)
    manifest = path / MANIFEST_NAME
    with open(manifest, "ab") as f:
        f.write(b" " * ((64 << 20) - manifest.stat().st_size))
    with DatasetReader(path) as ds:
        assert ds.num_batches == 1
    with open(manifest, "ab") as f:
        f.write(b" ")
    with pytest.raises(ZeroBatchIOError, match="more than the 67,108,864 this file may have") as e:
        DatasetReader(path)
    assert e.value.errno == errno.EFBIG


# -- dataset building --------------------------------------------------------------------------


def _batch_files(directory: Path, count: int, seeds: tuple[int, ...] = ()) -> Path:
    """``directory`` holding ``part-<i>.batch`` for ``i < count``: 8 records of 2 tokens in
    batches of 4 each, file ``i`` with seed ``seeds[i]`` (default ``i``)."""
    directory.mkdir()
    for i in range(count):
        seed = seeds[i] if seeds else i
        write_batch_file(directory / f"part-{i}.batch", records(8, 2), batch_size=4, seed=seed)
    return directory


def test_create_dataset_refuses_a_path_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_text("not a directory")
    with pytest.raises(WriteError, match="exists and is not a directory"):
        create_dataset(path)
    assert path.read_text() == "not a directory"


@pytest.mark.parametrize(
    ("count", "shown", "tail"),
    [
        (1, 1, "1 shard name breaks the manifest's name rule"),
        (10, 10, "10 shard names break the manifest's name rule"),
        (11, 10, ", and 1 more; rename the files"),
        (12, 10, ", and 2 more; rename the files"),
    ],
)
def test_create_dataset_names_the_first_ten_bad_names_and_counts_the_rest(
    tmp_path: Path, count: int, shown: int, tail: str
) -> None:
    names = [f"bad {i:02d}.batch" for i in range(count)]
    with pytest.raises(WriteError) as caught:
        create_dataset(tmp_path / "data", names)
    text = str(caught.value)
    assert tail in text
    assert [repr(n) in text for n in names] == [i < shown for i in range(count)]
    assert ("more;" in text) == (count > 10)
    assert os.listdir(tmp_path / "data") == []


@pytest.mark.parametrize("names", [None, []])
def test_create_dataset_refuses_a_directory_without_batch_files(
    tmp_path: Path, names: list[str] | None
) -> None:
    """Given no names, and with no ``*.batch`` file to take by default: nothing to describe."""
    path = tmp_path / "data"
    path.mkdir()
    (path / "notes.txt").write_text("mine")
    with pytest.raises(WriteError, match=r"no LLMBATCH files to describe \(\*\.batch\)"):
        create_dataset(path, names)
    assert os.listdir(path) == ["notes.txt"]


def test_create_dataset_takes_the_first_listed_shards_seed_by_default(tmp_path: Path) -> None:
    """SPEC.md 12.4: ``create_dataset`` takes the first shard's header seed unless told."""
    path = _batch_files(tmp_path / "data", 3, seeds=(7, 8, 9))
    assert create_dataset(path, ["part-1.batch", "part-2.batch", "part-0.batch"]).seed == 8


@pytest.mark.parametrize(("seed", "ok"), [(0, True), (-1, False)])
def test_create_dataset_takes_any_seed_from_zero(tmp_path: Path, seed: int, ok: bool) -> None:
    path = _batch_files(tmp_path / "data", 1)
    if ok:
        assert create_dataset(path, seed=seed).seed == seed
    else:
        with pytest.raises(ValueError, match="seed must be at least 0, got -1"):
            create_dataset(path, seed=seed)
        assert not (path / MANIFEST_NAME).exists()


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ({"batch_size": 0}, r"batch_size must be in \[1, "),
        ({"seq_len": 0}, r"seq_len must be in \[1, "),
        ({"shard_batches": 0}, r"shard_batches must be in \[1, 2147483647\], got 0"),
        ({"shard_batches": 2**31}, r"shard_batches must be in \[1, 2147483647\], got 2147483648"),
        ({"seed": -1}, r"seed must be in \[0, "),
    ],
)
def test_sharded_writer_arguments_out_of_range_are_refused_before_anything_is_written(
    tmp_path: Path, argument: dict[str, int], message: str
) -> None:
    """SPEC.md 12.4: ``batch_size`` and ``seq_len`` from 1, ``shard_batches`` from 1 with
    ``shard_batches * batch_size <= 2^32 - 1`` (here ``batch_size=2``), a seed from 0."""
    kw: dict[str, Any] = {"batch_size": 2, "seq_len": 1, "shard_batches": 1, "seed": 0} | argument
    with pytest.raises(WriteError, match=message):
        write_sharded_dataset(tmp_path / "ds", [records(4, 1)], **kw)
    assert not (tmp_path / "ds").exists()


def test_sharded_writer_takes_the_smallest_arguments(tmp_path: Path) -> None:
    """One token a record, one record a batch, one batch a shard: a shard per record."""
    manifest = write_sharded_dataset(
        tmp_path / "ds", [records(3, 1)], batch_size=1, seq_len=1, shard_batches=1, seed=0
    )
    assert [s.records for s in manifest.shards] == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize(
    ("shape", "shown"), [((2, 3), (2, 3)), ((1, 2, 1), (1, 2, 1)), ((), ()), ((3,), (1, 3))]
)
def test_sharded_writer_refuses_blocks_not_of_seq_len_records(
    tmp_path: Path, shape: tuple[int, ...], shown: tuple[int, ...]
) -> None:
    """Records are ``[k, seq_len]`` blocks or single ``[seq_len]`` records; anything else is
    named with its shape (a single record as a block of one), and the shards already written
    are removed."""
    bad = np.zeros(shape, dtype=np.uint32)
    with pytest.raises(WriteError, match=re.escape(f"[k, seq_len=2] blocks, got shape {shown}")):
        write_sharded_dataset(
            tmp_path / "ds", [records(8, 2), bad], batch_size=4, seq_len=2, shard_batches=1
        )
    assert os.listdir(tmp_path / "ds") == []


@pytest.mark.parametrize(("count", "words"), [(1, "1 record is"), (3, "3 records are")])
def test_a_stream_that_fills_no_batch_is_refused_counting_its_records(
    tmp_path: Path, count: int, words: str
) -> None:
    with pytest.raises(WriteError, match=f"0 batches: {words} fewer than batch_size=4"):
        write_sharded_dataset(
            tmp_path / "ds", [records(count, 2)], batch_size=4, seq_len=2, shard_batches=1
        )
    assert os.listdir(tmp_path / "ds") == []


def test_a_stream_of_exactly_one_batch_is_a_dataset(tmp_path: Path) -> None:
    manifest = write_sharded_dataset(
        tmp_path / "ds", [records(4, 2)], batch_size=4, seq_len=2, shard_batches=2
    )
    assert manifest.num_batches == 1 and validate_dataset(tmp_path / "ds", deep=True).valid


def test_an_overwrite_finishes_a_write_killed_before_its_manifest(tmp_path: Path) -> None:
    """Shards and checksums without a manifest (a writer killed between the two): with
    ``overwrite=True`` the directory ends holding exactly the new dataset."""
    path = _one_slot_shards(tmp_path / "ds", 5)
    (path / MANIFEST_NAME).unlink()
    (path / "notes.txt").write_text("mine")
    write_sharded_dataset(
        path, [records(8, 2)], batch_size=4, seq_len=2, shard_batches=1, overwrite=True
    )
    assert sorted(os.listdir(path)) == [
        CHECKSUMS_NAME,
        MANIFEST_NAME,
        "notes.txt",
        "shard-00000.batch",
        "shard-00001.batch",
    ]
    assert validate_dataset(path, deep=True).valid


@pytest.mark.parametrize("bad", [(0, 17), (-1, 4), (5, 4)])
def test_sources_outside_the_streams_records_are_refused_before_the_manifest(
    tmp_path: Path, bad: tuple[int, int]
) -> None:
    """A source's ``[first, last)`` must lie within the 16 records of the stream: nothing is
    left behind, neither a manifest nor the shards already written."""
    first, last = bad
    message = f"a.bin: records [{first}, {last}) are outside the dataset's 16 input records"
    with pytest.raises(WriteError, match=re.escape(message)):
        write_sharded_dataset(
            tmp_path / "ds", [records(16, 2)], batch_size=4, seq_len=2, shard_batches=2,
            sources=[Source("a.bin", bad)],
        )  # fmt: skip
    assert os.listdir(tmp_path / "ds") == []


def test_an_interrupt_before_the_manifest_leaves_no_shard_or_checksums(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after the checksums file is written and before the manifest removes what the
    call wrote, so no shard listed by no manifest blocks the next write."""
    path = tmp_path / "ds"
    write = dataset_build.write_bytes_atomic

    def interrupted(target: str, data: bytes, **kwargs: Any) -> None:
        if os.path.basename(target) == MANIFEST_NAME:
            assert os.path.exists(os.path.join(path, CHECKSUMS_NAME))
            raise KeyboardInterrupt
        write(target, data, **kwargs)

    monkeypatch.setattr(dataset_build, "write_bytes_atomic", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_sharded_dataset(path, [records(16, 2)], batch_size=4, seq_len=2, shard_batches=2)
    assert os.listdir(path) == []
    monkeypatch.undo()
    write_sharded_dataset(path, [records(16, 2)], batch_size=4, seq_len=2, shard_batches=2)
    assert sorted(os.listdir(path)) == sorted(
        [CHECKSUMS_NAME, MANIFEST_NAME, "shard-00000.batch", "shard-00001.batch"]
    )


def test_a_failing_sources_function_raises_its_own_error_after_removing_the_shards(
    tmp_path: Path,
) -> None:
    """The shards this call wrote are removed, even when one is already gone, and the error
    the caller sees is the one that stopped the write."""
    path = tmp_path / "ds"

    def sources() -> list[Source]:
        (path / "shard-00001.batch").unlink()
        raise KeyError("the input went away")

    with pytest.raises(KeyError, match="the input went away"):
        write_sharded_dataset(
            path, [records(16, 2)], batch_size=4, seq_len=2, shard_batches=1, sources=sources
        )
    assert os.listdir(path) == []


@pytest.mark.parametrize(
    ("where", "name", "refused"),
    [
        ("output", "shard-00003.batch", True),
        ("output", CHECKSUMS_NAME, True),
        ("output", "tokens.bin", False),
        ("elsewhere", "shard-00000.batch", False),
        ("elsewhere", MANIFEST_NAME, False),
    ],
)
def test_only_inputs_the_write_would_replace_are_refused(
    tmp_path: Path, where: str, name: str, refused: bool
) -> None:
    """An input in the output directory under a name the dataset writes is refused, before
    anything is written; the same name elsewhere, or another name there, is an input like any."""
    out = tmp_path / "ds"
    out.mkdir()
    (tmp_path / "elsewhere").mkdir()
    item = (out if where == "output" else tmp_path / "elsewhere") / name
    item.write_bytes(b"input")
    kw: dict[str, Any] = {"batch_size": 4, "seq_len": 2, "shard_batches": 1, "inputs": [item]}
    if refused:
        with pytest.raises(WriteError, match="input file would be replaced by the dataset"):
            write_sharded_dataset(out, [records(8, 2)], **kw)
        assert os.listdir(out) == [name]
    else:
        assert write_sharded_dataset(out, [records(8, 2)], **kw).num_batches == 2
    assert item.read_bytes() == b"input"


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_first_sharded_write_goes_beside_a_subdirectory(tmp_path: Path, overwrite: bool) -> None:
    """Only replacing a dataset stages it (and refuses entries it cannot carry over): the
    first dataset written into a directory holding a subdirectory is written in place."""
    out = tmp_path / "ds"
    (out / "logs").mkdir(parents=True)
    write_sharded_dataset(
        out, [records(8, 2)], batch_size=4, seq_len=2, shard_batches=1, overwrite=overwrite
    )
    assert (out / "logs").is_dir() and validate_dataset(out, deep=True).valid


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_first_create_dataset_goes_beside_a_subdirectory(tmp_path: Path, overwrite: bool) -> None:
    """As for the sharded writer: describing files that are not a dataset yet writes the
    manifest in place, whatever else the directory holds."""
    out = _batch_files(tmp_path / "data", 2)
    (out / "logs").mkdir()
    create_dataset(out, overwrite=overwrite)
    assert (out / "logs").is_dir() and validate_dataset(out, deep=True).valid


class _ShardReplacedAfterCarry(dataset_replace.StagedReplacement):
    """A staged ``create_dataset`` overwrite during which another process replaces
    ``part-1.batch`` (a new file renamed over it) once the shards are linked into staging."""

    def carry(self) -> None:
        super().carry()
        victim = os.path.join(self.target, "part-1.batch")
        write_batch_file(victim + ".new", records(8, 2), batch_size=4, seed=99)
        os.replace(victim + ".new", victim)


def test_a_shard_replaced_during_a_create_overwrite_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new manifest would describe the staged link, no longer the file at the path: the
    overwrite is refused, naming the shard, and the old dataset stays as it was."""
    out = _batch_files(tmp_path / "data", 2)
    old = create_dataset(out)
    monkeypatch.setattr(dataset_build, "StagedReplacement", _ShardReplacedAfterCarry)
    with pytest.raises(WriteError, match=r"part-1\.batch was replaced while the dataset"):
        create_dataset(out, overwrite=True)
    assert DatasetReader(out).manifest == old
    assert [n for n in os.listdir(tmp_path) if n != "data"] == []


def test_a_dataset_whose_manifest_is_a_fifo_is_replaced_without_waiting_on_it(
    tmp_path: Path,
) -> None:
    """The sharded writer reads the old manifest to learn which shards to drop; a FIFO is
    never opened for a blocking read: the overwrite goes on and replaces it."""
    out = _one_slot_shards(tmp_path / "ds", 2)
    manifest = out / MANIFEST_NAME
    manifest.unlink()
    os.mkfifo(manifest)
    promptly(
        lambda: write_sharded_dataset(
            out, [records(4, 2)], batch_size=4, seq_len=2, shard_batches=1, overwrite=True
        ),
        manifest,
    )
    assert manifest.is_file() and validate_dataset(out, deep=True).valid


def test_an_empty_stream_with_allow_empty_is_a_dataset_of_no_shard(tmp_path: Path) -> None:
    """SPEC.md 12.4: ``count = 0`` gives no shard (and an empty checksums file)."""
    manifest = write_sharded_dataset(
        tmp_path / "ds", [], batch_size=4, seq_len=2, shard_batches=1, allow_empty=True
    )
    assert manifest.shards == () and (tmp_path / "ds" / CHECKSUMS_NAME).read_bytes() == b""
    assert validate_dataset(tmp_path / "ds", deep=True).valid


def test_shard_file_names_lists_the_writers_shards_sorted(tmp_path: Path) -> None:
    """``shard_file_names``: the names ``write_sharded_dataset`` gives, sorted; none for a
    directory that does not exist."""
    out = _one_slot_shards(tmp_path / "ds", 2)
    (out / "shard-100000.batch").write_bytes(b"")
    (out / "shard-1.batch").write_bytes(b"")
    assert dataset_build.shard_file_names(str(out)) == [
        "shard-00000.batch",
        "shard-00001.batch",
        "shard-100000.batch",
    ]
    assert dataset_build.shard_file_names(str(tmp_path / "missing")) == []


def test_an_overwrite_drops_the_shards_of_an_old_manifest_of_64_mib(tmp_path: Path) -> None:
    """SPEC.md 12.1: a manifest may have up to 64 MiB (here a real one padded with JSON
    whitespace). The sharded writer reads an old manifest of any such size to learn its
    shards, so the files ``create_dataset`` listed go with the dataset they belonged to."""
    out = _batch_files(tmp_path / "data", 2)
    create_dataset(out)
    manifest = out / MANIFEST_NAME
    with open(manifest, "ab") as f:
        f.write(b" " * ((64 << 20) - manifest.stat().st_size))
    write_sharded_dataset(
        out, [records(4, 2)], batch_size=4, seq_len=2, shard_batches=1, overwrite=True
    )
    assert sorted(n for n in os.listdir(out) if n.endswith(".batch")) == ["shard-00000.batch"]


def test_empty_blocks_in_the_record_stream_make_no_shard(tmp_path: Path) -> None:
    """Blocks of no record are skipped wherever they come, a trailing one included."""
    empty = np.zeros((0, 2), dtype=np.uint32)
    manifest = write_sharded_dataset(
        tmp_path / "ds",
        [empty, records(4, 2), empty, records(4, 2) + 8, empty],
        batch_size=4,
        seq_len=2,
        shard_batches=1,
    )
    assert [s.records for s in manifest.shards] == [(0, 4), (4, 8)]


def test_a_dataset_whose_manifest_is_a_dangling_link_is_replaced(tmp_path: Path) -> None:
    """A manifest that cannot be read still makes the directory a dataset; replacing it drops
    the sharded writer's own names and keeps the rest."""
    out = _one_slot_shards(tmp_path / "ds", 3)
    (out / MANIFEST_NAME).unlink()
    (out / MANIFEST_NAME).symlink_to("gone.json")
    write_sharded_dataset(
        out, [records(4, 2)], batch_size=4, seq_len=2, shard_batches=1, overwrite=True
    )
    assert sorted(os.listdir(out)) == [CHECKSUMS_NAME, MANIFEST_NAME, "shard-00000.batch"]
    assert validate_dataset(out, deep=True).valid


def test_an_old_manifest_over_256_mib_is_not_read_to_learn_its_shards(tmp_path: Path) -> None:
    """``dataset_build._OLD_MANIFEST_LIMIT``: an old manifest larger than 256 MiB (a real one
    padded with JSON whitespace, so its first 256 MiB would parse) is not read; its
    replacement drops only the sharded writer's own names, and the files it listed stay."""
    out = _batch_files(tmp_path / "data", 2)
    create_dataset(out)
    manifest = out / MANIFEST_NAME
    left = (256 << 20) + 1 - manifest.stat().st_size
    with open(manifest, "ab") as f:
        chunk = b" " * (16 << 20)
        while left:
            left -= f.write(chunk[:left])
    write_sharded_dataset(
        out, [records(4, 2)], batch_size=4, seq_len=2, shard_batches=1, overwrite=True
    )
    assert sorted(n for n in os.listdir(out) if n.endswith(".batch")) == [
        "part-0.batch",
        "part-1.batch",
        "shard-00000.batch",
    ]


@pytest.mark.parametrize(
    "write",
    [
        lambda path: dataset_build.check_dataset_output(path),
        lambda path: write_sharded_dataset(
            path, [records(4, 2)], batch_size=4, seq_len=2, shard_batches=1
        ),
        lambda path: create_dataset(path),
    ],
    ids=["check_dataset_output", "write_sharded_dataset", "create_dataset"],
)
def test_an_existing_dataset_is_refused_unless_overwrite_is_asked(
    tmp_path: Path, write: Any
) -> None:
    path = _one_slot_shards(tmp_path / "ds", 2)
    before = (path / MANIFEST_NAME).read_bytes()
    with pytest.raises(WriteError, match=r"already a dataset .* pass overwrite=True"):
        write(path)
    assert (path / MANIFEST_NAME).read_bytes() == before


def test_the_sharded_writers_seed_defaults_to_zero(tmp_path: Path) -> None:
    manifest = write_sharded_dataset(
        tmp_path / "ds", [records(8, 2)], batch_size=4, seq_len=2, shard_batches=1
    )
    assert manifest.seed == 0
    assert [s.seed for s in manifest.shards] == [shard_seed(0, 0), shard_seed(0, 1)]


def test_shards_left_without_a_manifest_are_refused_naming_the_first(tmp_path: Path) -> None:
    path = _one_slot_shards(tmp_path / "ds", 3)
    (path / MANIFEST_NAME).unlink()
    with pytest.raises(WriteError, match=r"holds shard files \(shard-00000\.batch, \.\.\.\)"):
        write_sharded_dataset(path, [records(4, 2)], batch_size=4, seq_len=2, shard_batches=1)


def test_a_shard_of_another_shape_is_named_against_the_first(tmp_path: Path) -> None:
    path = _batch_files(tmp_path / "data", 2)
    write_batch_file(path / "odd.batch", records(8, 3), batch_size=4)
    message = (
        "odd.batch has batch_size, seq_len = (4, 3); the first shard, part-0.batch, has (4, 2)"
    )
    with pytest.raises(WriteError, match=re.escape(message)):
        create_dataset(path, ["part-0.batch", "part-1.batch", "odd.batch"])
    assert not (path / MANIFEST_NAME).exists()
