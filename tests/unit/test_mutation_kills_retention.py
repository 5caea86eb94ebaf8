"""Retention behaviours that mutation testing found unpinned (tests/README.md, "Mutation
testing")."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from zerobatch_spec.live import Entry, batch_name, build_live_manifest, manifest_name, segment_name

from tests.remote.live_worker import B, T, batch, identify
from zerobatch_core import BatchNativeLoader
from zerobatch_core.live.manifests import LiveError, ManifestChain
from zerobatch_core.live.producer import LiveProducer
from zerobatch_core.live.retention import (
    RECLAIM_WRITER,
    REPORTED_KEYS,
    ChainError,
    LiveNotFoundError,
    ReclaimReport,
    WatermarkError,
    _descriptor,
    _stale_temporaries,
    reclaim,
    record_watermark,
    watermark,
)
from zerobatch_core.live.source import LiveSource
from zerobatch_core.stores.store import LocalStore


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


class _CommitAfterListing(LocalStore):
    """A store whose first listing of the manifest versions is followed at once by a producer
    committing ``appends`` batches (one version each): versions the listing missed."""

    def __init__(self, url: str, *, appends: int) -> None:
        super().__init__(url)
        self.url, self.appends, self.committed = url, appends, False

    def list_keys(self, prefix: str = "") -> list[str]:
        keys = super().list_keys(prefix)
        if prefix == "manifests/" and not self.committed:
            self.committed = True
            with LiveProducer(self.url, "p-1", batch_size=B, seq_len=T, cadence=1) as p:
                for i in range(self.appends):
                    p.append(batch(1, i))
        return keys


def test_a_version_committed_after_the_listing_is_checked_against_the_newest(
    tmp_path: Path,
) -> None:
    """A producer commits while reclaim reads the chain: the version the listing missed is
    checked to follow from the newest one read, and counts."""
    url = _live(tmp_path)
    store = _CommitAfterListing(url, appends=1)
    report = reclaim(store, dry_run=True)
    assert store.committed
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
        loader = BatchNativeLoader(source, dtype="uint32", global_batch_size=1)
        state = loader.state_dict((0, 2 * B))  # type: ignore[arg-type]
    assert record_watermark(url, "c-1", state) == 2


def test_a_state_without_an_epoch_is_taken_as_epoch_zero(tmp_path: Path) -> None:
    url = _live(tmp_path, 4)
    state = _state(url, 2)
    del state["epoch"]
    assert record_watermark(url, "c-1", state) == 2


# -- watermarks and loader states ------------------------------------------------------------


def test_a_state_of_negative_samples_is_refused() -> None:
    with pytest.raises(WatermarkError, match="samples is -1, expected an integer of at least 0"):
        watermark({"samples": -1, "batch_size": B})


@pytest.mark.parametrize(
    ("step", "field", "value", "message"),
    [
        # step 0 of a global batch of 0 samples: samples 0 is step * global_batch_size, but no
        # loader reads global batches of no sample
        (0, "global_batch_size", 0, "global_batch_size is 0, expected an integer of at"),
        # a live dataset has one unending epoch: a state that says epoch 1 was not saved
        # reading it, even when its samples agree with its step
        (2, "epoch", 1, "an inconsistent state"),
    ],
)
def test_a_state_no_live_loader_saves_is_refused(
    tmp_path: Path, step: int, field: str, value: int, message: str
) -> None:
    url = _live(tmp_path, 4)
    state = _state(url, step)
    state[field] = value
    with pytest.raises(WatermarkError, match=message):
        record_watermark(url, "c-1", state)


def test_keeping_no_watermark_is_refused(tmp_path: Path) -> None:
    url = _live(tmp_path, 4)
    with pytest.raises(ValueError, match="keep must be at least 1, got 0"):
        record_watermark(url, "c-1", _state(url, 2), keep=0)
    assert LocalStore(url).list_keys("watermarks/") == []


def test_rotation_keeps_every_watermark_while_fewer_than_keep(tmp_path: Path) -> None:
    url = _live(tmp_path)
    record_watermark(url, "c-1", _state(url, 4), keep=3)
    record_watermark(url, "c-1", _state(url, 6), keep=3)
    assert LocalStore(url).list_keys("watermarks/c-1/") == [
        "watermarks/c-1/00000000000000000004.json",
        "watermarks/c-1/00000000000000000006.json",
    ]


def test_a_stray_key_among_the_watermarks_does_not_hide_the_ones_after_it(tmp_path: Path) -> None:
    url = _live(tmp_path)
    LocalStore(url).write("watermarks/c-1/-notes", b"notes")  # sorts before every watermark
    record_watermark(url, "c-1", _state(url, 6))
    assert reclaim(url, dry_run=True).watermark == 6


def test_a_fifo_not_named_as_a_watermark_does_not_count(tmp_path: Path) -> None:
    url = _live(tmp_path)
    os.makedirs(os.path.join(url, "watermarks", "c-1"))
    os.mkfifo(os.path.join(url, "watermarks", "c-1", "notes"))
    report = reclaim(url, dry_run=True)
    assert (report.watermark, report.unverified_watermarks) == (None, {})


def test_a_fifo_named_as_a_watermark_at_the_committed_end_protects_it(tmp_path: Path) -> None:
    """A FIFO in place of the watermark at the committed end stands for a checkpoint that
    reads from there: it counts, unverified."""
    url = _live(tmp_path)
    os.makedirs(os.path.join(url, "watermarks", "c-1"))
    os.mkfifo(os.path.join(url, "watermarks", "c-1", "00000000000000000010.json"))
    report = reclaim(url, dry_run=True)
    assert report.watermark == 10
    assert report.unverified_watermarks == {
        "watermarks/c-1/00000000000000000010.json": "unverified: not a regular file"
    }


def test_a_dangling_link_named_as_a_watermark_does_not_count(tmp_path: Path) -> None:
    """A symbolic link to nothing where a watermark would be has no checkpoint behind it."""
    url = _live(tmp_path)
    os.makedirs(os.path.join(url, "watermarks", "c-1"))
    os.symlink(
        os.path.join(url, "gone"),
        os.path.join(url, "watermarks", "c-1", "00000000000000000004.json"),
    )
    report = reclaim(url, dry_run=True)
    assert (report.watermark, report.unverified_watermarks) == (None, {})


# -- reports ---------------------------------------------------------------------------------


def test_a_report_made_without_figures_is_of_a_real_run_that_found_nothing() -> None:
    assert ReclaimReport(None, 3, 0).as_dict() == {
        "watermark": None,
        "version": 3,
        "start": 0,
        "committed": 0,
        "deleted": {},
        "deleted_bytes": 0,
        "dry_run": False,
        "versions_checked": 0,
        "ignored_watermarks": {},
        "unverified_watermarks": {},
        "ignored_keys": [],
        "ignored_key_count": 0,
        "kept_batches": {},
    }


def test_a_run_that_deletes_nothing_reports_no_bytes(tmp_path: Path) -> None:
    url = _live(tmp_path, 2)
    report = reclaim(url)
    assert (report.deleted, report.deleted_bytes) == ({}, 0)


def test_the_warning_about_ignored_keys_counts_a_single_one_not_shown() -> None:
    report = ReclaimReport(None, 1, 0, ignored_keys=["a", "b"], ignored_count=3)
    assert report.warnings()[-1].endswith(": a, b and 1 more")


def test_a_report_names_twenty_ignored_keys_and_counts_the_rest(tmp_path: Path) -> None:
    """``REPORTED_KEYS``: a report names the first 20 keys it leaves alone."""
    url = _live(tmp_path, 2)
    store = LocalStore(url)
    for i in range(25):
        store.write(f"batches/stray-{i:02d}", b"")
    report = reclaim(url, dry_run=True)
    assert report.ignored_keys == [f"batches/stray-{i:02d}" for i in range(20)]
    assert report.ignored_count == 25


# -- reclaim's arguments ---------------------------------------------------------------------


def test_reclaim_keeps_four_versions_by_default(tmp_path: Path) -> None:
    """The default of ``keep_versions``, as ``zerobatch dataset reclaim --keep-versions``'s
    (README, "Command line")."""
    url = _live(tmp_path)
    report = reclaim(url)
    store = LocalStore(url)
    versions = ManifestChain(store, _descriptor(store)).versions()
    assert versions == list(range(report.version - 3, report.version + 1))


def test_keeping_no_manifest_version_is_refused(tmp_path: Path) -> None:
    url = _live(tmp_path, 2)
    with pytest.raises(ValueError, match="keep_versions must be at least 1, got 0"):
        reclaim(url, keep_versions=0)
    assert len(LocalStore(url).list_keys("manifests/")) == 3


def test_a_pending_append_of_a_producer_that_never_committed_does_not_stop_reclaim(
    tmp_path: Path,
) -> None:
    """Producer a-0 wrote a batch object and died before its first commit: the object is kept
    (a pending append), and the trimmed batches of p-0, after it in key order, are reclaimed."""
    url = _live(tmp_path)
    store = LocalStore(url)
    pending = "batches/a-0/00000000000000000000-0123456789abcdef.batch"
    store.write(pending, store.read(store.list_keys("batches/p-0/")[0]))
    record_watermark(url, "c-1", _state(url, 10))
    report = reclaim(url)
    assert report.deleted["batches"] == 8
    assert store.exists(pending)


# -- temporaries -----------------------------------------------------------------------------


def _temporary(url: str, age: float, directory: str = "manifests", tag: str = "0") -> str:
    path = os.path.join(url, directory, f".00000000000000000099.json.{tag * 12}.tmp")
    with open(path, "wb") as f:
        f.write(b"partial")
    t = time.time() - age
    os.utime(path, (t, t))
    return path


def test_a_temporary_just_under_an_hour_old_is_kept(tmp_path: Path) -> None:
    """SPEC.md section 19: temporaries older than an hour are removed; a younger one may
    belong to a writer still at work."""
    url = _live(tmp_path, 2)
    path = _temporary(url, 3600 - 0.9)
    report = reclaim(url)
    assert "temporaries" not in report.deleted
    assert os.path.exists(path)


def test_a_temporary_just_over_an_hour_old_is_removed(tmp_path: Path) -> None:
    """SPEC.md section 19: temporaries older than an hour are removed."""
    url = _live(tmp_path, 2)
    path = _temporary(url, 3600 + 0.1)
    report = reclaim(url)
    assert (report.deleted["temporaries"], report.deleted_bytes) == (1, len(b"partial"))
    assert not os.path.exists(path)


def test_a_temporary_among_other_objects_is_found(tmp_path: Path) -> None:
    """A stale temporary in a directory of batch objects is found whatever the order in which
    the directory lists its files."""
    url = _live(tmp_path)
    path = _temporary(url, 7200, "batches/p-0")
    for i in range(20):
        LocalStore(url).write(f"batches/p-0/notes-{i}", b"")
    assert reclaim(url).deleted["temporaries"] == 1
    assert not os.path.exists(path)


def test_a_temporary_modified_exactly_at_the_limit_is_not_stale(tmp_path: Path) -> None:
    """``_stale_temporaries`` lists files modified strictly before the time it is given."""
    url = _live(tmp_path, 2)
    path = _temporary(url, 0)
    os.utime(path, (1_000_000_000.0, 1_000_000_000.0))
    assert _stale_temporaries(url, 1_000_000_000.0) == []
    assert _stale_temporaries(url, 1_000_000_000.5) == [(path, len(b"partial"))]


_RACED: dict[str, set[str]] = {"targets": set()}


def _remove_first_target(event: str, args: tuple[Any, ...]) -> None:
    """An audit hook: when a process is about to remove one of ``_RACED["targets"]``, another
    run removes it first (once)."""
    if event == "os.remove" and args and args[0] in _RACED["targets"]:
        path = args[0]
        _RACED["targets"] = set()
        os.unlink(path)


sys.addaudithook(_remove_first_target)


def test_a_temporary_removed_by_another_run_meanwhile_is_not_counted(tmp_path: Path) -> None:
    """Another reclaim removes a stale temporary just before this one does: it is not counted
    here, and the other stale temporaries are still removed."""
    url = _live(tmp_path, 2)
    paths = [_temporary(url, 7200, tag=tag) for tag in "abc"]
    _RACED["targets"] = set(paths)
    try:
        report = reclaim(url)
        raced = not _RACED["targets"]
    finally:
        _RACED["targets"] = set()
    assert raced
    assert report.deleted["temporaries"] == 2
    assert not any(os.path.exists(p) for p in paths)


# -- the verified chain ----------------------------------------------------------------------


def test_a_segment_that_does_not_match_its_reference_stops_reclaim(tmp_path: Path) -> None:
    """A sealed segment object whose bytes are not the ones its version references: the
    version that seals it cannot be checked, so reclaim refuses (``ChainError``)."""
    url = _live(tmp_path)
    store = LocalStore(url)
    record_watermark(url, "c-1", _state(url, 10))
    store.write("segments/00000000000000000002.json", store.read(segment_name(0)))
    with pytest.raises(ChainError, match=r"xxh3 .* \(retention refuses to delete anything\)"):
        reclaim(url)


def test_a_version_that_does_not_parse_stops_reclaim(tmp_path: Path) -> None:
    url = _live(tmp_path)
    LocalStore(url).write("manifests/00000000000000000005.json", b"not a manifest")
    with pytest.raises(ChainError, match=r"\(retention refuses to delete anything\)"):
        reclaim(url, dry_run=True)


def test_two_versions_committed_after_the_listing_both_count(tmp_path: Path) -> None:
    url = _live(tmp_path)
    store = _CommitAfterListing(url, appends=2)
    report = reclaim(store, dry_run=True)
    assert store.committed
    assert (report.committed, report.versions_checked) == (12, 13)


def test_oldest_versions_reclaimed_one_by_one_while_read_are_passed_over(tmp_path: Path) -> None:
    """Another reclaim deletes each of the nine oldest versions just as this one reads it:
    the missing versions at the start of the listing are passed over in one round."""
    url = _live(tmp_path)

    class ReclaimedWhileRead(LocalStore):
        def read(self, key: str) -> bytes:
            if key.startswith("manifests/") and int(key[10:30]) < 9:
                super().delete(key)
            return super().read(key)

    report = reclaim(ReclaimedWhileRead(url), dry_run=True)
    assert (report.version, report.versions_checked) == (10, 2)


def _reclaim_elsewhere(url: str) -> None:
    """Another run: reclaim keeping only its newest version (which it commits, trimmed)."""
    reclaim(url, keep_versions=1)


def test_every_listed_version_reclaimed_before_it_is_read_lists_again(tmp_path: Path) -> None:
    """Another reclaim commits a trimmed version and deletes every version this run listed
    before it reads the first: this run lists again and checks the new one."""
    url = _live(tmp_path)
    record_watermark(url, "c-1", _state(url, 6))

    class ReclaimedBeforeRead(LocalStore):
        raced = False

        def read(self, key: str) -> bytes:
            if key.startswith("manifests/") and not ReclaimedBeforeRead.raced:
                ReclaimedBeforeRead.raced = True
                _reclaim_elsewhere(url)
            return super().read(key)

    report = reclaim(ReclaimedBeforeRead(url))
    assert ReclaimedBeforeRead.raced
    assert (report.version, report.start, report.versions_checked) == (11, 6, 1)


def test_versions_reclaimed_after_the_first_was_read_list_again(tmp_path: Path) -> None:
    """Another reclaim deletes the versions listed after this run has read the oldest: this
    run does not take the oldest as the newest, it lists again and builds on the new one."""
    url = _live(tmp_path)
    record_watermark(url, "c-1", _state(url, 6))

    class ReclaimedAfterFirstRead(LocalStore):
        reads = 0

        def read(self, key: str) -> bytes:
            if key.startswith("manifests/"):
                ReclaimedAfterFirstRead.reads += 1
                if ReclaimedAfterFirstRead.reads == 2:
                    _reclaim_elsewhere(url)
            return super().read(key)

    store = ReclaimedAfterFirstRead(url)
    report = reclaim(store)
    assert (report.version, report.start, report.versions_checked) == (11, 6, 1)
    assert ManifestChain(store, _descriptor(store)).versions() == [11]


def test_a_conflict_with_a_version_reclaimed_since_checks_the_chain_again(tmp_path: Path) -> None:
    """reclaim's trimmed version loses to a producer's; before it looks at the winner, another
    reclaim trims, deletes the winner and producers commit two more: this run checks the chain
    again and ends on its newest version instead of writing the deleted version's number."""
    url = _live(tmp_path)
    record_watermark(url, "c-1", _state(url, 6))

    class LosesToAReclaimedVersion(LocalStore):
        raced = False

        def create(self, key: str, data: bytes) -> bool:
            if not key.startswith("manifests/") or LosesToAReclaimedVersion.raced:
                return super().create(key, data)
            LosesToAReclaimedVersion.raced = True
            with LiveProducer(url, "p-1", batch_size=B, seq_len=T, cadence=1) as p:
                p.append(batch(1, 0))  # version 11 wins the race
            created = super().create(key, data)
            _reclaim_elsewhere(url)  # version 12, trimmed; 11 and older deleted
            with LiveProducer(url, "p-1", batch_size=B, seq_len=T, cadence=1) as p:
                p.append(batch(1, 1))  # version 13
                p.append(batch(1, 2))  # version 14
            return created

    store = LosesToAReclaimedVersion(url)
    report = reclaim(store)
    assert LosesToAReclaimedVersion.raced
    assert (report.version, report.start) == (14, 6)
    assert ManifestChain(store, _descriptor(store)).versions() == [12, 13, 14]


# -- leftovers under a crafted anchor ----------------------------------------------------------


def _crafted_anchor(
    tmp_path: Path, batches: int, craft: Callable[[list[Entry]], list[Entry]]
) -> tuple[str, list[Entry]]:
    """A live dataset of ``batches`` batches of p-0, all in the tail, whose only manifest
    version is the newest one with its tail replaced by ``craft(tail)`` (a mistaken or crafted
    version: the oldest present is the anchor, checked against nothing); and the tail that
    the producer committed."""
    url = str(tmp_path / "live")
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=100) as p:
        for i in range(batches):
            p.append(batch(0, i))
    store = LocalStore(url)
    chain = ManifestChain(store, _descriptor(store))
    latest = chain.latest()
    tail = craft(list(latest.tail))
    crafted = replace(latest, tail=tuple(tail), batches=tail[-1].end)
    for version in chain.versions()[:-1]:
        store.delete(manifest_name(version))
    store.write(manifest_name(latest.version), build_live_manifest(crafted))
    return url, list(latest.tail)


def test_a_leftover_is_judged_by_the_entry_of_its_offset_whatever_the_listing_order(
    tmp_path: Path,
) -> None:
    """The anchor lists p-0's entries out of offset order (offset 1 first): a leftover at
    offset 1 is still judged by the entry of offset 1, whose object is missing, so it is
    kept."""
    url, tail = _crafted_anchor(
        tmp_path, 2, lambda t: [replace(t[1], first=0), replace(t[0], first=1)]
    )
    store = LocalStore(url)
    leftover = batch_name("p-0", 1, "0123456789abcdef")
    store.write(leftover, store.read(tail[1].name))
    store.delete(tail[1].name)
    report = reclaim(url, dry_run=True)
    assert "which is missing" in report.kept_batches[leftover]


def test_a_leftover_at_an_offset_no_entry_holds_is_reclaimed(tmp_path: Path) -> None:
    """The anchor lists p-0's offsets 0 and 2 only: the object of offset 1 is a leftover that
    no listed entry holds, reclaimed even though the entry of offset 0 names a missing
    object."""
    url, tail = _crafted_anchor(tmp_path, 3, lambda t: [t[0], replace(t[2], first=1)])
    store = LocalStore(url)
    store.delete(tail[0].name)
    report = reclaim(url)
    assert (report.deleted["batches"], report.kept_batches) == (1, {})
    assert not store.exists(tail[1].name)


def _reclaimed_under_the_reader(url: str, times: int) -> LocalStore:
    """A directory store on which another reclaim, ``times`` times, deletes the oldest version
    this run has read together with the next one just as this run reads that next one."""

    class ReclaimedUnderTheReader(LocalStore):
        def __init__(self, root: str) -> None:
            super().__init__(root)
            self.left = times
            self.read_ok: set[str] = set()

        def read(self, key: str) -> bytes:
            if key.startswith("manifests/"):
                before = manifest_name(int(key[10:30]) - 1)
                if self.left and before in self.read_ok:
                    self.left -= 1
                    super().delete(before)
                    super().delete(key)
            data = super().read(key)
            self.read_ok.add(key)
            return data

    return ReclaimedUnderTheReader(url)


def test_a_chain_reclaimed_under_the_reader_seven_times_is_still_read(tmp_path: Path) -> None:
    """Versions disappear while read in seven listings in a row: the eighth listing reads the
    chain."""
    url = _live(tmp_path, 16)
    report = reclaim(_reclaimed_under_the_reader(url, 7), dry_run=True)
    assert (report.version, report.versions_checked) == (16, 3)


def test_a_chain_reclaimed_under_the_reader_eight_times_is_given_up(tmp_path: Path) -> None:
    """Versions disappear while read in eight listings in a row: reclaim gives up rather than
    list forever."""
    url = _live(tmp_path, 16)
    with pytest.raises(LiveError, match="manifest versions keep disappearing while listed"):
        reclaim(_reclaimed_under_the_reader(url, 8))
