"""Retention behaviours that mutation testing found unpinned (tests/README.md, "Mutation
testing")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from zerobatch_spec.live import segment_name

from tests.remote.live_worker import B, T, batch, identify
from zerobatch_core import BatchNativeLoader
from zerobatch_core.live import LiveProducer
from zerobatch_core.live_manifests import LiveError, ManifestChain
from zerobatch_core.live_source import LiveSource
from zerobatch_core.retention import (
    RECLAIM_WRITER,
    REPORTED_KEYS,
    ChainError,
    LiveNotFoundError,
    ReclaimReport,
    WatermarkError,
    _descriptor,
    reclaim,
    record_watermark,
    watermark,
)
from zerobatch_core.storage import LocalStore


def _live(tmp_path: Path, batches: int = 10) -> str:
    url = str(tmp_path / "live")
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=2) as p:
        for i in range(batches):
            p.append(batch(0, i))
    return url


def _state(url: str, step: int) -> dict[str, Any]:
    with LiveSource(url, timeout=5) as source:
        return BatchNativeLoader(source, dtype="uint32").state_dict((0, step))  # type: ignore[arg-type]


def test_reclaim_that_loses_the_race_for_a_version_trims_the_winner(tmp_path: Path) -> None:
    """A producer commits the version reclaim was about to write: reclaim's create fails, and
    it trims on top of the producer's version instead of acting on the one it never wrote."""
    url = _live(tmp_path)
    record_watermark(url, "c-1", _state(url, 6))

    class RacedStore(LocalStore):
        raced = False

        def create(self, key: str, data: bytes) -> bool:
            if key.startswith("manifests/") and not RacedStore.raced:
                RacedStore.raced = True
                with LiveProducer(url, "p-1", batch_size=B, seq_len=T, cadence=1) as p:
                    p.append(batch(1, 0))
            return super().create(key, data)

    store = RacedStore(url)
    report = reclaim(store)
    assert RacedStore.raced
    chain = ManifestChain(store, _descriptor(store))
    newest = chain.read(max(chain.versions()))
    assert newest is not None
    assert (report.version, newest.writer, newest.start) == (newest.version, RECLAIM_WRITER, 6)
    with LiveSource(url) as source:
        assert [identify(source.read_batch(g)) for g in range(6, 11)] == [
            *((0, i) for i in range(6, 10)),
            (1, 0),
        ]


@pytest.mark.parametrize("value", [True, 1.0, "6"])
def test_a_state_whose_step_is_not_an_integer_is_refused(tmp_path: Path, value: object) -> None:
    url = _live(tmp_path, 4)
    state = _state(url, 2)
    state["step"] = value
    with pytest.raises(WatermarkError, match="not a loader state of a live dataset"):
        record_watermark(url, "c-1", state)


def test_a_segment_at_the_new_start_that_no_version_lists_is_kept(tmp_path: Path) -> None:
    """A segment object starting where the trimmed version starts, and listed by no version, is
    a producer's pending seal, not one the trim dropped: reclaim leaves it."""
    url = _live(tmp_path)
    record_watermark(url, "c-1", _state(url, 10))
    start = reclaim(url).start
    store = LocalStore(url)
    pending = segment_name(start)
    assert pending not in store.list_keys("segments/")
    store.write(pending, b"{}")
    assert reclaim(url).start == start
    assert pending in store.list_keys("segments/")


def test_the_warning_about_ignored_keys_counts_those_not_shown() -> None:
    report = ReclaimReport(None, 1, 0, ignored_keys=["a", "b"], ignored_count=5)
    assert report.warnings()[-1].endswith(": a, b and 3 more")
    shown_all = ReclaimReport(None, 1, 0, ignored_keys=["a", "b"], ignored_count=2)
    assert shown_all.warnings()[-1].endswith(": a, b")


def test_a_checkpoint_below_the_newest_start_is_named_in_the_refusal(tmp_path: Path) -> None:
    url = _live(tmp_path)
    record_watermark(url, "c-1", _state(url, 10))
    start = reclaim(url).start
    record_watermark(url, "c-2", _state(url, 2))
    expected = f"starts at global batch {start}, but the live checkpoint of watermarks/c-2/"
    with pytest.raises(ChainError, match=expected):
        reclaim(url)


@pytest.mark.parametrize("which", [0, -1], ids=["first", "last"])
def test_a_leftover_whose_listed_twin_has_a_wrong_header_is_kept(
    tmp_path: Path, which: int
) -> None:
    """The listed object of a committed offset is its size but not its header: it does not
    match its entry, so the unlisted copy of that offset may be the only good one (whether the
    entry is the producer's first listed one or its last)."""
    url = _live(tmp_path, 4)
    store = LocalStore(url)
    chain = ManifestChain(store, _descriptor(store))
    real = chain.entries(chain.latest())[which]
    leftover = real.name[:-7] + ("0" if real.name[-7] != "0" else "1") + real.name[-6:]
    data = store.read(real.name)
    store.write(leftover, data)
    store.write(real.name, bytes([data[0] ^ 0xFF]) + data[1:])
    report = reclaim(url)
    assert "does not match its entry" in report.kept_batches[leftover]
    assert store.exists(leftover)


def test_a_version_committed_after_the_listing_is_checked_against_the_newest(
    tmp_path: Path,
) -> None:
    """A producer commits while reclaim reads the chain: the version the listing missed is
    checked to follow from the newest one read, and counts."""
    url = _live(tmp_path)

    class CommitAfterListing(LocalStore):
        committed = False

        def list_keys(self, prefix: str = "") -> list[str]:
            keys = super().list_keys(prefix)
            if prefix == "manifests/" and not CommitAfterListing.committed:
                CommitAfterListing.committed = True
                with LiveProducer(url, "p-1", batch_size=B, seq_len=T, cadence=1) as p:
                    p.append(batch(1, 0))
            return keys

    report = reclaim(CommitAfterListing(url), dry_run=True)
    assert CommitAfterListing.committed
    assert report.committed == 11


def test_a_state_with_a_batch_size_of_zero_is_refused() -> None:
    with pytest.raises(WatermarkError, match="batch_size is 0, expected an integer of at least 1"):
        watermark({"samples": 4, "batch_size": 0})


def test_a_state_of_another_sequence_length_is_refused(tmp_path: Path) -> None:
    url = _live(tmp_path, 4)
    state = _state(url, 2)
    state["seq_len"] = T + 1
    with pytest.raises(WatermarkError, match="are not this dataset's"):
        record_watermark(url, "c-1", state)


def test_a_state_of_a_negative_step_is_refused_as_such(tmp_path: Path) -> None:
    url = _live(tmp_path, 4)
    state = _state(url, 2)
    state["step"] = -1
    with pytest.raises(WatermarkError, match="step is -1, expected an integer of at least 0"):
        record_watermark(url, "c-1", state)


def test_a_recorded_watermark_is_trusted(tmp_path: Path) -> None:
    url = _live(tmp_path)
    record_watermark(url, "c-1", _state(url, 6))
    report = reclaim(url, dry_run=True)
    assert (report.watermark, report.unverified_watermarks) == (6, {})


def test_trimmed_batches_of_every_producer_are_reclaimed(tmp_path: Path) -> None:
    """Producer p-1's batches all lie below the watermark; p-0's listed ones come first in
    key order: reclaim still goes on to p-1's."""
    url = str(tmp_path / "live")
    with LiveProducer(url, "p-1", batch_size=B, seq_len=T, cadence=1, segment_size=2) as p:
        for i in range(4):
            p.append(batch(1, i))
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=2) as p:
        for i in range(10):
            p.append(batch(0, i))
    record_watermark(url, "c-1", _state(url, 10))
    reclaim(url)
    assert LocalStore(url).list_keys("batches/p-1/") == []


def test_a_stray_key_among_the_batches_does_not_stop_reclaim(tmp_path: Path) -> None:
    """A key under ``batches/`` that is no batch name is left alone and reported; the batch
    objects after it in key order are still reclaimed."""
    url = _live(tmp_path)
    store = LocalStore(url)
    store.write("batches/README", b"not a batch")
    record_watermark(url, "c-1", _state(url, 10))
    report = reclaim(url)
    assert report.ignored_keys == ["batches/README"]
    assert report.deleted["batches"] == 8
    assert store.exists("batches/README")


def test_a_stray_key_among_a_consumers_watermarks_does_not_stop_rotation(
    tmp_path: Path,
) -> None:
    url = _live(tmp_path)
    store = LocalStore(url)
    store.write("watermarks/c-1/-notes", b"notes")  # sorts before every watermark
    record_watermark(url, "c-1", _state(url, 4), keep=1)
    record_watermark(url, "c-1", _state(url, 6), keep=1)
    assert store.list_keys("watermarks/c-1/") == [
        "watermarks/c-1/-notes",
        "watermarks/c-1/00000000000000000006.json",
    ]


def test_a_directory_that_is_no_live_dataset_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(LiveError, match="not a live dataset") as caught:
        reclaim(str(tmp_path))
    assert not isinstance(caught.value, LiveNotFoundError)


def test_at_most_reported_keys_stray_keys_are_named(tmp_path: Path) -> None:
    url = _live(tmp_path, 2)
    store = LocalStore(url)
    for i in range(REPORTED_KEYS + 1):
        store.write(f"batches/stray-{i:02d}", b"")
    report = reclaim(url, dry_run=True)
    assert (len(report.ignored_keys), report.ignored_count) == (REPORTED_KEYS, REPORTED_KEYS + 1)


@pytest.mark.parametrize("keep", [1, 3])
def test_reclaim_keeps_exactly_the_newest_versions_asked_for(tmp_path: Path, keep: int) -> None:
    url = _live(tmp_path)
    store = LocalStore(url)
    report = reclaim(url, keep_versions=keep)
    versions = ManifestChain(store, _descriptor(store)).versions()
    assert versions == list(range(report.version - keep + 1, report.version + 1))


def test_a_broken_listed_object_does_not_protect_trimmed_batches(tmp_path: Path) -> None:
    """Batches below the trimmed start are reclaimed even when a listed object of their
    producer does not match its entry: only leftovers at offsets that object holds are in
    doubt."""
    url = _live(tmp_path)
    store = LocalStore(url)
    record_watermark(url, "c-1", _state(url, 10))
    last = ManifestChain(store, _descriptor(store)).latest().tail[-1]
    data = store.read(last.name)
    store.write(last.name, bytes([data[0] ^ 0xFF]) + data[1:])
    report = reclaim(url)
    assert (report.deleted["batches"], report.kept_batches) == (8, {})


def test_a_watermark_deleted_while_reclaim_reads_it_is_ignored(tmp_path: Path) -> None:
    """A consumer releases its watermark between reclaim's listing and its read: the
    watermark no longer counts (a release is no finding to report), and reclaim goes on."""
    url = _live(tmp_path)
    record_watermark(url, "c-1", _state(url, 4))
    record_watermark(url, "c-2", _state(url, 6))

    class ReleasedWhileRead(LocalStore):
        def read(self, key: str) -> bytes:
            if key.startswith("watermarks/c-1/"):
                super().delete(key)
            return super().read(key)

    report = reclaim(ReleasedWhileRead(url), dry_run=True)
    assert (report.watermark, report.ignored_watermarks) == (6, {})


def test_an_object_deleted_by_another_reclaim_meanwhile_is_not_counted(tmp_path: Path) -> None:
    url = _live(tmp_path)
    record_watermark(url, "c-1", _state(url, 10))

    class DeletedMeanwhile(LocalStore):
        def size(self, key: str) -> int:
            if key.startswith("batches/"):
                super().delete(key)
            return super().size(key)

    report = reclaim(DeletedMeanwhile(url))
    assert "batches" not in report.deleted
    assert LocalStore(url).list_keys("batches/") != []


def test_a_checkpoint_at_step_zero_is_a_watermark_at_zero(tmp_path: Path) -> None:
    url = _live(tmp_path, 4)
    assert record_watermark(url, "c-1", _state(url, 0)) == 0


def test_a_state_of_a_global_batch_of_one_sample_is_accepted(tmp_path: Path) -> None:
    """Global batch 1 of stored batches of B: step 2 * B has read two stored batches."""
    url = _live(tmp_path, 4)
    with LiveSource(url, timeout=5) as source:
        loader = BatchNativeLoader(source, dtype="uint32", global_batch_size=1)  # type: ignore[arg-type]
        state = loader.state_dict((0, 2 * B))
    assert record_watermark(url, "c-1", state) == 2


def test_a_state_without_an_epoch_is_taken_as_epoch_zero(tmp_path: Path) -> None:
    url = _live(tmp_path, 4)
    state = _state(url, 2)
    del state["epoch"]
    assert record_watermark(url, "c-1", state) == 2
