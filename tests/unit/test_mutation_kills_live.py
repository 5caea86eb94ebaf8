"""Tests written to kill surviving mutants of the live-dataset modules (live_source.py,
live.py, live_manifests.py): each pins a behaviour the other tests left open."""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from zerobatch_spec import parse_header
from zerobatch_spec.live import (
    DESCRIPTOR_NAME,
    Descriptor,
    LiveManifest,
    build_descriptor,
    build_live_manifest,
    manifest_name,
    parse_descriptor,
    parse_manifest_name,
)

from tests.remote.live_worker import B, T, batch, identify
from zerobatch_core import BatchNativeLoader, Position
from zerobatch_core.live import producer as producer_module
from zerobatch_core.live import source as live_source
from zerobatch_core.live.cadence import Cadence
from zerobatch_core.live.manifests import ChainError, LiveError, LiveTimeoutError, ManifestChain
from zerobatch_core.live.producer import (
    ConditionalCreateUnsupportedError,
    LiveProducer,
    probe_conditional_create,
)
from zerobatch_core.live.retention import reclaim, record_watermark
from zerobatch_core.live.source import LiveSource
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.stores.store import LocalStore


def _produce(path: str, sizes: Sequence[int], start: int = 0, segment_size: int = 64) -> None:
    """Append objects of ``sizes`` batches (items ``start`` on of producer 0), one commit each."""
    with LiveProducer(
        path, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=segment_size
    ) as p:
        i = start
        for n in sizes:
            p.append(np.stack([batch(0, i + k) for k in range(n)]))
            i += n


class _Clock:
    """A stand-in for the ``time`` module as ``live_source`` uses it: the clock stands still
    except while the waiting reader sleeps, so every pause it takes is recorded exactly."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if len(self.sleeps) > 200:
            raise AssertionError(f"still polling after 200 pauses: {self.sleeps[-5:]}")
        self.now += seconds


# -- module constants and properties ---------------------------------------------------------
def test_the_default_timeout_is_the_documented_600_seconds(tmp_path: Path) -> None:
    """README ("Consumers"): a read past the committed end waits 600 s by default."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    with LiveSource(path) as source:
        assert source.timeout == 600.0


def test_a_live_loader_state_records_the_unending_epoch_as_2_to_the_62(tmp_path: Path) -> None:
    """A live source has ``2**62`` stored batches, and a loader state records that count
    (``num_batches``, an order key a restore must match): checkpoints saved by earlier runs
    over a live dataset keep loading only while the count stays the same."""
    path = str(tmp_path / "live")
    _produce(path, [2])
    with LiveSource(path) as source:
        assert len(source) == source.num_batches == 2**62
        loader = BatchNativeLoader(source, dtype="uint32")
        saved = dict(loader.state_dict(Position(0, 1)), num_batches=2**62)
        loader.load_state_dict(saved)
        assert identify(next(iter(loader))) == (0, 1)


def test_a_live_source_is_a_dataset(tmp_path: Path) -> None:
    """``is_dataset`` is a property that says True for a live dataset (not a single file)."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    with LiveSource(path) as source:
        assert source.is_dataset is True


def test_a_directory_without_a_descriptor_is_not_a_live_dataset(tmp_path: Path) -> None:
    """Opening a directory without ``live.json`` raises ``LiveError`` naming it, not a bare
    ``FileNotFoundError``."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LiveError, match=r"live\.json: not a live dataset"):
        LiveSource(str(empty))


# -- messages ---------------------------------------------------------------------------------
def test_a_reclaimed_batch_names_where_the_dataset_now_starts(tmp_path: Path) -> None:
    """A read below the first batch still listed raises at once, naming that first batch (not
    the end of the first object or the committed end)."""
    path = str(tmp_path / "live")
    _produce(path, [1] * 7, segment_size=2)
    with LiveSource(path) as source:
        state = BatchNativeLoader(source, dtype="uint32").state_dict(Position(0, 4))
    record_watermark(path, "c-1", state)
    start = reclaim(path).start
    assert start == 4
    with LiveSource(path, timeout=0) as source:
        assert source.start == 4 and source.committed == 7
        with pytest.raises(LiveError, match=r"global batch 3 was reclaimed") as raised:
            source.read_batch(3)
        assert "(the dataset now starts at 4)" in str(raised.value)
        assert identify(source.read_batch(4)) == (0, 4)


def test_a_timeout_names_the_committed_end_and_the_version(tmp_path: Path) -> None:
    """``LiveTimeoutError`` names the committed end (past several objects) and the version."""
    path = str(tmp_path / "live")
    _produce(path, [1, 2])
    with LiveSource(path, timeout=0) as source:
        with pytest.raises(LiveTimeoutError) as raised:
            source.read_batch(3)
        want = f"(committed: 3, manifest version {source.current.version})"
        assert want in str(raised.value)


# -- following new versions -------------------------------------------------------------------
def test_refresh_says_whether_a_new_version_was_read(tmp_path: Path) -> None:
    """``refresh`` is False when nothing new was committed, True when it read a new version."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    with LiveSource(path) as source:
        assert source.refresh() is False
        _produce(path, [2], start=1)
        assert source.refresh() is True
        assert source.committed == 3
        assert source.refresh() is False


def test_a_wait_keeps_waiting_when_new_versions_stop_short_of_the_batch(tmp_path: Path) -> None:
    """A wait for batch 5 that reads a version committing only up to 3 goes on waiting (and
    times out), rather than returning as if batch 5 were committed."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    with LiveSource(path) as source:
        _produce(path, [2], start=1)
        with pytest.raises(LiveTimeoutError, match="global batch 5 not committed"):
            source.wait_for(5, timeout=0)
        assert source.committed == 3


def test_a_timeout_of_zero_does_not_wait_even_on_a_coarse_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: a timeout of 0 does not wait. The deadline is reached when the clock shows it,
    so a clock that has not ticked since the wait began (a coarse one) still raises at once."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    clock = _Clock()
    monkeypatch.setattr(live_source, "time", clock)
    with (
        LiveSource(path) as source,
        pytest.raises(LiveTimeoutError, match="not committed after 0 s"),
    ):
        source.wait_for(1, timeout=0)
    assert clock.sleeps == []


def test_the_poll_interval_starts_at_10_ms_and_grows_by_half_up_to_half_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting polls first after 10 ms (the default ``poll``), each pause 1.5 times the one
    before, capped at 0.5 s, until the timeout."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    clock = _Clock()
    monkeypatch.setattr(live_source, "time", clock)
    with LiveSource(path) as source, pytest.raises(LiveTimeoutError):
        source.wait_for(1, timeout=3.0)
    want, pause, waited = [], 0.01, 0.0
    while waited < 3.0:
        want.append(pause)
        waited += pause
        pause = min(pause * 1.5, 0.5)
    assert clock.sleeps == pytest.approx(want)
    assert clock.sleeps[:3] == pytest.approx([0.01, 0.015, 0.0225])
    assert max(clock.sleeps) == 0.5


def test_committed_batches_from_the_first_listed_one_on_are_fetched_ahead(
    tmp_path: Path,
) -> None:
    """``ahead`` fetches the regions of committed batches in the background, the first
    listed batch included: no read of a committed batch is left to the reading thread."""
    path = str(tmp_path / "live")
    _produce(path, [1, 2])

    class Recording(LocalStore):
        def __init__(self, root: str) -> None:
            super().__init__(root)
            self.threads: list[str] = []

        def _read_ranges(self, key: str, ranges: Any, coalesce: int) -> list[bytes]:
            if key.startswith("batches/"):
                self.threads.append(threading.current_thread().name)
            return super()._read_ranges(key, ranges, coalesce)

    store = Recording(path)
    with LiveSource(store) as source:
        steps = source.ahead(iter(range(3)), lambda g: [(g, 0, B, 0, T)])
        got = [identify(source.read_region(g, 0, B, 0, T)) for g in steps]
    assert got == [(0, 0), (0, 1), (0, 2)]
    assert store.threads and all(name.startswith("zb-get") for name in store.threads)


def test_batches_reclaimed_before_a_reader_saw_them_are_refused_not_misplaced(
    tmp_path: Path,
) -> None:
    """A reader that read up to batch 3, then finds only a version starting at 7 (retention
    reclaimed 3..6 and the versions listing them meanwhile), raises ``LiveError`` for batch 3
    instead of serving batch 7 in its place."""
    path = str(tmp_path / "live")
    _produce(path, [1, 2], segment_size=2)
    with LiveSource(path, timeout=0) as source:
        assert source.committed == 3
        _produce(path, [1] * 9, start=3, segment_size=2)
        with LiveSource(path) as other:
            state = BatchNativeLoader(other, dtype="uint32").state_dict(Position(0, 8))
        record_watermark(path, "c-1", state)
        assert reclaim(path, keep_versions=1).start == 7
        with pytest.raises(LiveError, match=r"global batches 3\.\.6 were reclaimed") as raised:
            source.read_batch(3)
        assert "starts at 7" in str(raised.value)
        assert source.committed == 3


def test_a_version_whose_entry_crosses_the_known_end_is_refused(tmp_path: Path) -> None:
    """A version found after the reader's versions were all reclaimed, whose entry covers
    batches 2..3 where the versions read listed an object ending at 3, goes back on them:
    ``ChainError``, and nothing of it is served."""
    a, b = tmp_path / "a", tmp_path / "b"
    _produce(str(a), [1])
    shutil.copytree(a, b)
    _produce(str(a), [2], start=1)  # a lists [0, 1), [1, 3)
    _produce(str(b), [1, 2], start=1)  # b lists [0, 1), [1, 2), [2, 4)
    with LiveSource(str(a), timeout=0) as source:
        assert source.committed == 3
        newest = ManifestChain(open_store(str(b)), source.descriptor).latest()
        crafted = dataclasses.replace(newest, version=source.current.version + 10)
        for old in (a / "manifests").iterdir():
            old.unlink()
        for obj in (b / "batches" / "p-0").iterdir():
            if not (a / "batches" / "p-0" / obj.name).exists():
                shutil.copy(obj, a / "batches" / "p-0" / obj.name)
        open_store(str(a)).write(manifest_name(crafted.version), build_live_manifest(crafted))
        with pytest.raises(ChainError, match=r"global batches 2\.\.3 cross the end 3"):
            source.read_batch(3)
        assert source.committed == 3


# -- the manifest chain (live_manifests.py) -----------------------------------------------------
class _Counting(LocalStore):
    """A local store that counts listings and the reads of each key. ``before_list`` and
    ``on_list`` (optional) run once, at the next listing, before or after the directory is
    listed (a commit that lands between a read and a listing, or a listing and the reads
    after it); ``phantom`` keys are listed though no file holds them (versions listed, then
    reclaimed before they are read), those also in ``phantom_once`` by one listing only."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.listings = 0
        self.reads: list[str] = []
        self.on_list: Callable[[], None] | None = None
        self.before_list: Callable[[], None] | None = None
        self.phantom: list[str] = []
        self.phantom_once: list[str] = []

    def _read(self, key: str) -> bytes:
        self.reads.append(key)
        return super()._read(key)

    def _list(self, prefix: str) -> list[str]:
        self.listings += 1
        before, self.before_list = self.before_list, None
        if before is not None:
            before()
        out = super()._list(prefix) + [k for k in self.phantom if k.startswith(prefix)]
        self.phantom = [k for k in self.phantom if k not in self.phantom_once]
        hook, self.on_list = self.on_list, None
        if hook is not None:
            hook()
        return out


def _chain(path: str, store: LocalStore | None = None) -> ManifestChain:
    store = store if store is not None else LocalStore(path)
    descriptor = parse_descriptor(store.read(DESCRIPTOR_NAME))
    assert isinstance(descriptor, Descriptor)
    return ManifestChain(store, descriptor)


def _versions(path: str) -> list[int]:
    return sorted(int(p.stem) for p in (Path(path) / "manifests").iterdir())


def _drop(path: str, *versions: int) -> None:
    """Delete manifest versions by hand."""
    for v in versions:
        (Path(path) / manifest_name(v)).unlink()


def _rewrite(path: str, m: LiveManifest) -> None:
    """Write ``m`` as its version (crafted by hand)."""
    LocalStore(path).write(manifest_name(m.version), build_live_manifest(m))


@pytest.mark.parametrize(
    ("kept", "above", "below"),
    [
        ((0, 2), 2, 0),
        ((0, 1, 4), 4, 1),
        ((0, 2, 4), 2, 0),
        ((0, 1, 3, 4), 3, 1),
        ((0, 3, 4, 5), 3, 0),
        ((0, 1, 2, 4, 5, 6), 4, 2),
    ],
)
def test_a_listing_with_a_gap_is_refused_naming_the_first_gap(
    tmp_path: Path, kept: tuple[int, ...], above: int, below: int
) -> None:
    """Opening a live dataset whose manifest versions have a gap anywhere (one or several
    versions missing, at the start of the listing or later) raises ``ChainError`` naming the
    version after the first gap, the missing one and the one before it."""
    path = str(tmp_path / "live")
    _produce(path, [1] * 7)
    first = _versions(path)[0]
    _drop(path, *(v for v in _versions(path) if v - first not in kept))
    a, b = first + above, first + below
    want = f"version {a} follows a gap (version {b + 1} is missing while version {b} is present)"
    with pytest.raises(ChainError) as raised:
        _chain(path).latest()
    assert want in str(raised.value)
    assert manifest_name(a) in str(raised.value)


def test_a_segment_missing_from_the_store_raises_live_error(tmp_path: Path) -> None:
    """Reading the entries of a version whose sealed segment was deleted raises ``LiveError``
    saying the segment the manifest lists is missing (not a bare ``FileNotFoundError``)."""
    path = str(tmp_path / "live")
    _produce(path, [1] * 4, segment_size=2)
    chain = _chain(path)
    newest = chain.latest()
    assert newest.segments
    (Path(path) / newest.segments[0].name).unlink()
    with pytest.raises(LiveError, match="a segment the manifest lists is missing"):
        chain.entries(newest)


def _two_producers(path: str) -> LiveManifest:
    """p-0 commits one batch, then p-1 commits three, one version each; returns the version
    p-0's commit made."""
    _produce(path, [1])
    reader = _chain(path).latest()
    with LiveProducer(path, "p-1", batch_size=B, seq_len=T, cadence=1) as p:
        for i in range(3):
            p.append(np.stack([batch(1, i)]))
    return reader


def test_a_reader_whose_versions_were_reclaimed_accepts_one_that_kept_other_offsets(
    tmp_path: Path,
) -> None:
    """A reader at the version of p-0's commit, whose next versions (p-1's commits) were all
    reclaimed but the newest, takes that newest: p-0's offset and ``start`` unchanged there
    do not go back on what the reader had."""
    path = str(tmp_path / "live")
    prev = _two_producers(path)
    newest = _versions(path)[-1]
    _drop(path, *(v for v in _versions(path) if v != newest))
    got = _chain(path).follow(prev)
    assert [m.version for m in got] == [newest]
    assert got[0].producers["p-0"] == prev.producers["p-0"]
    assert got[0].start == prev.start == 0


def test_a_reclaimed_gap_to_a_version_holding_the_same_as_the_reader_is_accepted(
    tmp_path: Path,
) -> None:
    """The newest version found after a reader's versions were reclaimed may hold exactly
    the batches, ``start`` and producer offsets the reader had (nothing committed since):
    it is taken, not refused as going back."""
    path = str(tmp_path / "live")
    _produce(path, [1, 2])
    prev = _chain(path).latest()
    _drop(path, *_versions(path))
    _rewrite(path, dataclasses.replace(prev, version=prev.version + 5))
    got = _chain(path).follow(prev)
    assert [m.version for m in got] == [prev.version + 5]


@pytest.mark.parametrize(
    ("change", "want"),
    [
        ({"batches": 2}, "batches 2 < 3"),
        ({"start": 0, "want_start": 1}, "start 0 < 1"),
        ({"offset": 0}, "producers.p-1.offset 0 < 1"),
        ({"offset": None}, "producers.p-1.offset None < 1"),
        ({"id": "0" * 32}, f"id {'0' * 32} is not"),
        ({"id": "0" * 32, "batches": 2, "offset": 0}, f"id {'0' * 32} is not"),
        ({"batches": 2, "offset": 0}, "batches 2 < 3"),
    ],
)
def test_a_version_after_a_reclaimed_gap_that_goes_back_is_refused(
    tmp_path: Path, change: dict[str, Any], want: str
) -> None:
    """The newest version found after a reader's versions were reclaimed must not go back on
    them: fewer batches, an earlier ``start``, a smaller or missing producer offset or another
    dataset id raise ``ChainError`` naming the first such change (the id first)."""
    path = str(tmp_path / "live")
    with LiveProducer(path, "p-1", batch_size=B, seq_len=T, cadence=1, segment_size=1) as p:
        p.append(np.stack([batch(1, 0)]))
    _produce(path, [1, 1], segment_size=1)  # p-1's entry is sealed, p-0's last is the tail
    prev = _chain(path).latest()
    assert prev.batches == 3 and len(prev.tail) == 1
    if "want_start" in change:
        prev = dataclasses.replace(prev, start=change["want_start"])
    producers = dict(prev.producers)
    if "offset" in change:
        if change["offset"] is None:
            del producers["p-1"]
        else:
            producers["p-1"] = dataclasses.replace(producers["p-1"], offset=change["offset"])
    crafted = dataclasses.replace(
        prev,
        version=prev.version + 5,
        batches=change.get("batches", prev.batches),
        tail=() if "batches" in change else prev.tail,
        start=change.get("start", prev.start),
        dataset_id=change.get("id", prev.dataset_id),
        producers=producers,
    )
    _drop(path, *_versions(path))
    (Path(path) / manifest_name(crafted.version)).write_bytes(build_live_manifest(crafted))
    chain = _chain(path)
    chain.descriptor = dataclasses.replace(chain.descriptor, dataset_id=crafted.dataset_id)
    with pytest.raises(ChainError) as raised:
        chain.follow(prev)
    assert f": {want}" in str(raised.value)
    assert f"it goes back on version {prev.version}" in str(raised.value)


def test_opening_lists_once_and_reads_the_newest_version_and_its_predecessor(
    tmp_path: Path,
) -> None:
    """``latest`` costs one listing and two manifest reads (the newest and the one before it)
    plus a probe of the next version; following new versions costs one read each and no
    listing, and so does finding none while the reader's own version is present; without
    ``probe`` it lists (``reads`` counts the versions read)."""
    path = str(tmp_path / "live")
    _produce(path, [1] * 4)
    store = _Counting(path)
    chain = _chain(path, store)
    assert chain.reads == 0
    newest = chain.latest()
    n = newest.version
    assert store.listings == 1 and chain.reads == 2
    assert [k for k in store.reads if k.startswith("manifests/")] == [
        manifest_name(n),
        manifest_name(n - 1),
        manifest_name(n + 1),
    ]
    _produce(path, [1, 1], start=4)
    got = chain.follow(newest)
    assert [m.version for m in got] == [n + 1, n + 2]
    assert store.listings == 1 and chain.reads == 4
    assert chain.follow(got[-1]) == []
    assert store.listings == 1 and chain.reads == 4
    assert chain.follow(got[-1], probe=False) == []
    assert store.listings == 2 and chain.reads == 4


def test_versions_committed_between_the_listing_and_the_reads_are_followed(
    tmp_path: Path,
) -> None:
    """Versions committed after ``latest`` listed the store are read and the newest of them
    returned."""
    path = str(tmp_path / "live")
    _produce(path, [1, 1])
    store = _Counting(path)
    store.on_list = lambda: _produce(path, [1, 1, 1], start=2)
    newest = _chain(path, store).latest()
    assert newest.batches == 5 and newest.version == _versions(path)[-1]


def test_a_version_committed_between_the_probe_and_the_listing_is_followed(
    tmp_path: Path,
) -> None:
    """Versions ``v + 1``, ``v + 2`` missing when probed but listed just after (committed
    meanwhile) are read and followed, not taken for a gap in the chain."""
    path = str(tmp_path / "live")
    _produce(path, [1, 1])
    store = _Counting(path)
    chain = _chain(path, store)
    prev = chain.latest()
    store.before_list = lambda: _produce(path, [1, 1], start=2)
    got = chain.follow(prev, probe=False)
    assert [m.version for m in got] == [prev.version + 1, prev.version + 2]
    assert got[-1].batches == 4


def test_a_listed_next_version_that_cannot_be_read_yields_nothing_new(tmp_path: Path) -> None:
    """A next version listed but gone when read (reclaimed meanwhile) is not followed: the
    reader sees nothing new, after one listing."""
    path = str(tmp_path / "live")
    _produce(path, [1, 1])
    store = _Counting(path)
    chain = _chain(path, store)
    prev = chain.latest()
    store.phantom = [manifest_name(prev.version + 1)]
    assert chain.follow(prev, probe=False) == []
    assert store.listings == 2


@pytest.mark.parametrize("missing", ["newest", "predecessor"])
def test_a_version_listed_then_reclaimed_before_it_is_read_makes_opening_list_again(
    tmp_path: Path, missing: str
) -> None:
    """Opening lists again when a version it listed is gone when read (the newest, or the
    predecessor of the newest), and finds the newest then."""
    path = str(tmp_path / "live")
    _produce(path, [1, 1, 1])
    store = _Counting(path)
    n = _versions(path)[-1]
    if missing == "newest":
        store.phantom = store.phantom_once = [manifest_name(n + 1)]
    else:
        _drop(path, *(v for v in _versions(path) if v != n))
        store.phantom = store.phantom_once = [manifest_name(n - 1)]
    assert _chain(path, store).latest().version == n
    assert store.listings == 2


@pytest.mark.parametrize("missing", ["newest", "predecessor"])
def test_opening_gives_up_after_8_listings_when_listed_versions_keep_disappearing(
    tmp_path: Path, missing: str
) -> None:
    """A version that every listing shows but no read finds (the newest, or the predecessor
    of the newest) makes opening list 8 times, then raise ``LiveError``."""
    path = str(tmp_path / "live")
    _produce(path, [1, 1])
    store = _Counting(path)
    n = _versions(path)[-1]
    if missing == "newest":
        store.phantom = [manifest_name(n + 1)]
    else:
        _drop(path, *(v for v in _versions(path) if v != n))
        store.phantom = [manifest_name(n - 1)]
    with pytest.raises(LiveError, match="manifest versions keep disappearing while listed"):
        _chain(path, store).latest()
    assert store.listings == 8


def test_after_reads_the_versions_present_and_lists_across_a_gap(tmp_path: Path) -> None:
    """``after(v)`` reads ``v + 1``, ``v + 2``, ...; if ``v + 1`` is missing it lists once and
    takes the newest version and those after it (not ``list_on_gap``: nothing), and after
    the newest it finds nothing."""
    path = str(tmp_path / "live")
    _produce(path, [1] * 6)
    vs = _versions(path)
    v = vs[0]
    store = _Counting(path)
    chain = _chain(path, store)
    assert [m.version for m in chain.after(v)] == vs[1:]
    _drop(path, v + 1, v + 2)
    assert chain.after(v, list_on_gap=False) == []
    assert store.listings == 0
    assert [m.version for m in chain.after(v)] == [vs[-1]]
    assert store.listings == 1
    assert chain.after(vs[-1]) == []


def test_a_chain_keeps_the_64_segments_read_last(tmp_path: Path) -> None:
    """A chain keeps the last 64 segments it read (``SEGMENT_CACHE``), least recently used
    first out: reading one again costs no request while it is kept."""
    path = str(tmp_path / "live")
    _produce(path, [1] * 66, segment_size=1)
    store = _Counting(path)
    chain = _chain(path, store)
    refs = chain.latest().segments
    assert len(refs) == 65

    def requests(*indices: int) -> int:
        before = len(store.reads)
        for i in indices:
            assert chain.segment(refs[i]).first == refs[i].first
        return len(store.reads) - before

    assert requests(*range(64)) == 64
    assert requests(*range(64)) == 0  # all 64 kept
    assert requests(0) == 0  # 0 is now the most recently used
    assert requests(64) == 1  # reading a 65th drops the least recently used: 1
    assert requests(0, 64) == 0
    assert requests(1) == 1


@pytest.mark.parametrize("field", ["first", "num_batches", "entries"])
def test_a_segment_that_does_not_hold_what_its_reference_says_is_refused(
    tmp_path: Path, field: str
) -> None:
    """A segment whose bytes match the reference's digest but whose first batch, batches or
    entries differ from what the reference says raises ``LiveError``."""
    path = str(tmp_path / "live")
    _produce(path, [1, 2, 1, 1], segment_size=2)
    ref = _chain(path).latest().segments[0]
    assert ref.entries == 2
    wrong = dataclasses.replace(ref, **{field: getattr(ref, field) + 1})
    with pytest.raises(LiveError, match="does not hold what the manifest's reference says"):
        _chain(path).segment(wrong)
    assert _chain(path).segment(ref).first == ref.first


def _sealing(path: str) -> tuple[LiveManifest, LiveManifest]:
    """A version and the next one, which seals the first's two tail entries."""
    _produce(path, [1, 1, 1], segment_size=2)
    chain = _chain(path)
    nxt = chain.latest()
    prev = chain.read(nxt.version - 1)
    assert prev is not None and len(prev.tail) == 2 and len(nxt.segments) == 1
    return prev, nxt


def test_checking_a_version_reads_no_segment_it_seals(tmp_path: Path) -> None:
    """``check`` compares the segments a version seals with the tail before it only when the
    chain holds them already: it reads no segment."""
    path = str(tmp_path / "live")
    prev, nxt = _sealing(path)
    store = _Counting(path)
    chain = _chain(path, store)
    chain.check(prev, nxt)
    assert [k for k in store.reads if k.startswith("segments/")] == []


def test_a_held_segment_whose_digest_differs_from_a_new_reference_breaks_the_chain(
    tmp_path: Path,
) -> None:
    """A version sealing a segment the chain holds, but naming another digest for it, does
    not follow: ``ChainError`` (not a bare ``LiveError``)."""
    path = str(tmp_path / "live")
    prev, nxt = _sealing(path)
    chain = _chain(path)
    chain.segment(nxt.segments[0])
    chain.check(prev, nxt)
    ref = dataclasses.replace(nxt.segments[0], xxh3="0" * 16)
    with pytest.raises(ChainError, match=r"segments: .*xxh3"):
        chain.check(prev, dataclasses.replace(nxt, segments=(ref,)))


def test_a_held_segment_that_differs_from_the_tail_it_seals_breaks_the_chain(
    tmp_path: Path,
) -> None:
    """A version sealing a segment the chain holds, whose entries are not the tail entries
    of the version before, does not follow (``ChainError``)."""
    path = str(tmp_path / "live")
    prev, nxt = _sealing(path)
    chain = _chain(path)
    chain.segment(nxt.segments[0])
    other = dataclasses.replace(prev.tail[1], checksums=prev.tail[0].checksums)
    with pytest.raises(ChainError, match="does not hold the tail entries it seals"):
        chain.check(dataclasses.replace(prev, tail=(prev.tail[0], other)), nxt)


def test_entries_since_a_batch_skip_what_ends_at_or_before_it(tmp_path: Path) -> None:
    """``entries(m, since)`` lists the entries ending after ``since`` (all from batch 0 by
    default), and reads no segment that ends at or before it."""
    path = str(tmp_path / "live")
    _produce(path, [1, 1, 1, 1, 1], segment_size=2)
    store = _Counting(path)
    chain = _chain(path, store)
    m = chain.latest()
    assert [r.end for r in m.segments] == [2, 4] and [e.end for e in m.tail] == [5]
    assert [e.end for e in chain.entries(m)] == [1, 2, 3, 4, 5]
    store.reads.clear()
    chain = _chain(path, store)
    assert [e.end for e in chain.entries(m, 2)] == [3, 4, 5]
    assert [k for k in store.reads if k.startswith("segments/")] == [m.segments[1].name]
    assert [e.end for e in chain.entries(m, 4)] == [5]
    assert [e.end for e in chain.entries(m, 3)] == [4, 5]
    assert chain.entries(m, 5) == []


def test_a_gap_after_the_reader_while_older_versions_remain_is_refused(tmp_path: Path) -> None:
    """Newer versions after a missing ``v + 1`` while older versions are still present are a
    gap in the chain: ``ChainError`` naming the first newer version, the missing one and the
    oldest present (the reader's own version still present, at a listing, or reclaimed too).
    A poll that finds the reader's own version present lists nothing and sees nothing new."""
    path = str(tmp_path / "live")
    _produce(path, [1] * 3)
    chain = _chain(path)
    prev = chain.latest()
    first, v = _versions(path)[0], prev.version
    _produce(path, [1] * 3, start=3)
    _drop(path, v + 1)
    want = (
        f"version {v + 2} follows a gap (version {v + 1} is missing while version {first} is "
        "present)"
    )
    assert first < v - 1
    assert chain.follow(prev) == []
    with pytest.raises(ChainError) as raised:
        chain.follow(prev, probe=False)
    assert want in str(raised.value) and manifest_name(v + 2) in str(raised.value)
    _drop(path, *(x for x in _versions(path) if first < x <= v))
    with pytest.raises(ChainError) as raised:
        chain.follow(prev)
    assert want in str(raised.value)


def test_a_gap_right_after_the_oldest_version_is_refused_after_one_listing(
    tmp_path: Path,
) -> None:
    """A reader whose own version is the oldest present, with ``v + 1`` missing and newer
    versions present, is refused (``ChainError`` naming the gap) after one listing."""
    path = str(tmp_path / "live")
    _produce(path, [1] * 2)
    prev = _chain(path).latest()
    v = prev.version
    _produce(path, [1] * 3, start=2)
    _drop(path, *(x for x in _versions(path) if x < v or x == v + 1))
    store = _Counting(path)
    with pytest.raises(ChainError) as raised:
        _chain(path, store).follow(prev, probe=False)
    want = (
        f"version {v + 2} follows a gap (version {v + 1} is missing while version {v} is present)"
    )
    assert want in str(raised.value)
    assert store.listings == 1


# -- the producer (live.py) ----------------------------------------------------------------------
class _Rivalled(LocalStore):
    """A local store where another producer, ``p-1``, commits on cue: with ``rival`` set, the
    next ``races`` creates of a manifest version (every one with ``None``) are each preceded
    by one commit of ``p-1`` (a real commit of that version), so they lose their race.
    ``on_race`` (optional) runs after each such commit."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.rival: LiveProducer | None = None
        self.races: int | None = None
        self.on_race: Callable[[], None] | None = None
        self._next = 0

    def _create(self, key: str, data: bytes) -> bool:
        if self.rival is not None and key.startswith("manifests/") and self.races != 0:
            self.rival.append(batch(1, self._next))
            self._next += 1
            self.races = None if self.races is None else self.races - 1
            if self.on_race is not None:
                self.on_race()
        return super()._create(key, data)


class _Recording(Cadence):
    """A cadence that records what it observes. It asks for a commit at every append when
    ``due``, never otherwise; its pause between attempts is ``gap`` (none if not given)."""

    def __init__(self, *, due: bool = False, gap: float | None = None) -> None:
        self.always = due
        if gap is not None:
            self.gap = gap
        self.observed: list[tuple[bool, list[str]]] = []

    def due(self, pending: int, now: float) -> bool:
        return self.always

    def observe(self, window: float, conflicted: bool, writers: list[str], now: float) -> None:
        self.observed.append((conflicted, list(writers)))


def _rivalled(
    tmp_path: Path, cadence: Cadence | int, races: int | None = None
) -> tuple[LiveProducer, _Rivalled]:
    """Producer ``p-0`` of a new dataset whose next ``races`` manifest creates lose to ``p-1``."""
    path = str(tmp_path / "live")
    store = _Rivalled(path)
    producer = LiveProducer(store, "p-0", batch_size=B, seq_len=T, cadence=cadence)
    store.rival = LiveProducer(path, "p-1", cadence=1, probe=False)
    store.races = races
    return producer, store


def _read_all(path: str) -> list[tuple[int, int]]:
    with LiveSource(path) as source:
        return [identify(source.read_batch(g)) for g in range(source.committed)]


def test_a_lost_race_is_counted_and_observed_as_a_conflict(tmp_path: Path) -> None:
    """A commit whose create loses its race to another producer's version is counted as a
    conflict and observed by the cadence as conflicted, with that producer as writer; the
    retry that lands is counted as a commit and observed as not conflicted. ``windows`` holds
    each attempt's fragile window and ``manifest_seconds`` their sum."""
    cadence = _Recording()
    producer, _ = _rivalled(tmp_path, cadence, races=1)
    producer.append(batch(0, 0))
    stats = producer.stats
    assert (stats.attempts, stats.commits, stats.conflicts, stats.batches) == (0, 0, 0, 0)
    assert stats.manifest_seconds == 0.0 and stats.windows == []
    assert producer.commit() is True
    assert (stats.attempts, stats.commits, stats.conflicts, stats.batches) == (2, 1, 1, 1)
    assert cadence.observed == [(True, ["p-1"]), (False, ["p-0"])]
    assert len(stats.windows) == 2 and all(0 <= w < 10 for w in stats.windows)
    assert stats.manifest_seconds == pytest.approx(sum(stats.windows))
    assert producer.committed == 1
    assert _read_all(str(tmp_path / "live")) == [(1, 0), (0, 0)]


def test_a_commit_retries_until_300_seconds_have_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that keeps losing its race pauses ``min(0.5 s, the cadence's gap)`` between
    attempts and, by default, gives up with ``LiveError`` once the clock shows a time more
    than 300 s after it began: an attempt when the clock reads the deadline exactly is still
    made. (The first lost race here takes 299.5 s, the others none.)"""
    producer, store = _rivalled(tmp_path, _Recording(gap=0.75))
    producer.append(batch(0, 0))
    clock = _Clock()
    monkeypatch.setattr(producer_module, "time", clock)
    took = [299.5]

    def slow_race() -> None:
        clock.now += took.pop() if took else 0.0

    store.on_race = slow_race
    with pytest.raises(LiveError, match=r"could not commit in 300 s \(3 conflicts\)"):
        producer.commit()
    assert clock.now == 1300.5
    assert clock.sleeps == [0.5, 0.5]
    assert producer.pending == 1 and producer.committed == 0


def test_a_cadence_without_a_gap_retries_a_lost_race_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a fixed cadence (no gap), a commit retries a lost race without pausing."""
    producer, _ = _rivalled(tmp_path, 1, races=2)
    clock = _Clock()
    monkeypatch.setattr(producer_module, "time", clock)
    producer.append(batch(0, 0))  # the cadence's commit loses the first race
    assert producer.commit() is True  # loses the second, then lands
    assert clock.sleeps == [0.0]
    assert producer.stats.conflicts == 2


def test_without_retry_a_lost_race_leaves_the_objects_pending(tmp_path: Path) -> None:
    """``append``'s commit and ``commit(retry=False)`` make one attempt: after a lost race
    the objects stay pending (``commit`` returns False), the producer's committed offset is
    the winner's record of it, and a later attempt commits them."""
    producer, _ = _rivalled(tmp_path, _Recording(due=True), races=2)
    producer.append(batch(0, 0))
    assert (producer.pending, producer.committed, producer.stats.conflicts) == (1, 0, 1)
    assert producer.commit(retry=False) is False
    assert (producer.pending, producer.committed, producer.stats.conflicts) == (1, 0, 2)
    assert producer.commit(retry=False) is True
    assert (producer.pending, producer.committed, producer.offset) == (0, 1, 1)
    assert _read_all(str(tmp_path / "live")) == [(1, 0), (1, 1), (0, 0)]


def test_a_commit_rebases_on_the_newest_of_the_versions_committed_since_its_base(
    tmp_path: Path,
) -> None:
    """Versions that other producers committed since the producer's base are all read before
    its attempt, and it builds on the newest: no conflict, and the cadence observes every
    writer read."""
    cadence = _Recording()
    path = str(tmp_path / "live")
    producer = LiveProducer(path, "p-0", batch_size=B, seq_len=T, cadence=cadence)
    with LiveProducer(path, "p-1", cadence=1, probe=False) as other:
        other.append(batch(1, 0))
        other.append(batch(1, 1))
    producer.append(batch(0, 0))
    assert producer.commit(retry=False) is True
    assert (producer.stats.attempts, producer.stats.conflicts) == (1, 0)
    assert cadence.observed == [(False, ["p-1", "p-1", "p-0"])]
    assert producer.base.version == 3 and _versions(path)[-1] == 3


def test_a_commit_with_nothing_pending_is_true_and_writes_nothing(tmp_path: Path) -> None:
    """``commit`` with nothing appended returns True without an attempt or a new version."""
    path = str(tmp_path / "live")
    producer = LiveProducer(path, "p-0", batch_size=B, seq_len=T, cadence=100)
    assert producer.commit() is True
    assert producer.stats.attempts == 0 and _versions(path) == [0]


def test_items_a_twin_committed_are_dropped_without_a_new_version(tmp_path: Path) -> None:
    """A zombie twin's pending items that the newest version already holds (its other life
    committed them) are dropped: its commit, even without retry, is done (True) with no
    attempt and no new version."""
    path = str(tmp_path / "live")
    zombie = LiveProducer(path, "p-0", batch_size=B, seq_len=T, cadence=100)
    zombie.append(batch(0, 0))
    zombie.append(batch(0, 1))
    with LiveProducer(path, "p-0", cadence=100, probe=False) as twin:
        twin.append(batch(0, 0))
        twin.append(batch(0, 1))
    versions = _versions(path)
    assert zombie.commit(retry=False) is True
    assert (zombie.pending, zombie.committed, zombie.stats.attempts) == (0, 2, 0)
    assert _versions(path) == versions
    assert _read_all(path) == [(0, 0), (0, 1)]


def test_pending_items_that_overlap_a_committed_object_raise_live_error(tmp_path: Path) -> None:
    """A zombie whose pending object covers items ``1..2`` while its other life committed
    ``0..1`` as one object cannot commit it (an overlap): ``LiveError`` naming the store and
    the offsets, and nothing is committed."""
    path = str(tmp_path / "live")
    zombie = LiveProducer(path, "p-0", batch_size=B, seq_len=T, cadence=100)
    zombie.append(batch(0, 0))
    zombie.append(np.stack([batch(0, 1), batch(0, 2)]))
    with LiveProducer(path, "p-0", cadence=100, probe=False) as twin:
        twin.append(np.stack([batch(0, 0), batch(0, 1)]))
    versions = _versions(path)
    want = r"pending items start at 1, but its committed stream ends at 2 \(an overlap\)"
    with pytest.raises(LiveError, match=want) as raised:
        zombie.commit()
    assert str(raised.value).startswith(f"{zombie.store.url}: ")
    assert _versions(path) == versions


@pytest.mark.parametrize("ending", ["close", "exception"])
def test_a_closed_producer_refuses_appends(tmp_path: Path, ending: str) -> None:
    """After ``close``, or a ``with`` block left by an exception (its pending objects left
    uncommitted), ``append`` raises ``ValueError`` saying the producer is closed."""
    path = str(tmp_path / "live")
    producer = LiveProducer(path, "p-0", batch_size=B, seq_len=T, cadence=100)
    if ending == "close":
        producer.append(batch(0, 0))
        producer.close()
    else:
        with pytest.raises(RuntimeError), producer:
            producer.append(batch(0, 0))
            raise RuntimeError("the caller failed")
    with pytest.raises(ValueError, match="producer p-0 is closed"):
        producer.append(batch(0, 1))
    assert _read_all(path) == ([(0, 0)] if ending == "close" else [])


class _Refusing(LocalStore):
    """A store whose conditional create never creates anything."""

    def _create(self, key: str, data: bytes) -> bool:
        return False


class _Overwriting(LocalStore):
    """A store whose conditional create overwrites (a service ignoring ``If-None-Match``)."""

    def _create(self, key: str, data: bytes) -> bool:
        self._write(key, data)
        return True


class _OverwritingUnseen(LocalStore):
    """A store whose conditional create of a taken key reports failure, but overwrites."""

    def _create(self, key: str, data: bytes) -> bool:
        taken = self.exists(key)
        self._write(key, data)
        return not taken


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        (_Overwriting, "a second create of the same key succeeded"),
        (_Refusing, "a second create of the same key did not behave as one"),
        (_OverwritingUnseen, "a second create of the same key did not behave as one"),
    ],
)
def test_the_probe_says_how_a_store_failed_it(
    tmp_path: Path, kind: type[LocalStore], why: str
) -> None:
    """The probe refuses a store whose second create of a key succeeds, one whose first create
    fails and one whose failed second create still replaced the bytes, with
    ``ConditionalCreateUnsupportedError`` saying which, and leaves no probe object behind."""
    store = kind(str(tmp_path / "store"))
    with pytest.raises(ConditionalCreateUnsupportedError) as raised:
        probe_conditional_create(store)
    assert f"({why})" in str(raised.value)
    assert store.list_keys() == []


def test_an_empty_append_is_refused(tmp_path: Path) -> None:
    """``append`` of ``[0, batch_size, seq_len]`` (no batch) raises ``ValueError`` and writes
    nothing."""
    path = tmp_path / "live"
    with LiveProducer(str(path), "p-0", batch_size=B, seq_len=T, cadence=1) as producer:
        with pytest.raises(ValueError, match=r"append takes \[4, 16\] or \[n, 4, 16\]"):
            producer.append(np.zeros((0, B, T), dtype=np.uint32))
        assert producer.pending == 0 and producer.offset == 0
    assert not (path / "batches").exists() or not any((path / "batches").rglob("*"))


@pytest.mark.parametrize(
    "tokens",
    [np.zeros((B, T), dtype=np.float64), np.full((B, T), 2**32, dtype=np.int64)],
    ids=["float", "2**32"],
)
def test_tokens_that_are_not_u32_integers_are_refused(
    tmp_path: Path, tokens: npt.NDArray[Any]
) -> None:
    """Float tokens (even whole and in range) and integers above ``2**32 - 1`` are refused
    with ``ValueError``."""
    with LiveProducer(str(tmp_path / "live"), "p-0", batch_size=B, seq_len=T) as producer:
        with pytest.raises(ValueError, match="tokens must be integers in"):
            producer.append(tokens)
        assert producer.pending == 0


def test_the_largest_u32_token_is_accepted_from_a_wider_integer_type(tmp_path: Path) -> None:
    """Token ``2**32 - 1`` in an ``int64`` array is accepted and read back as that value."""
    path = str(tmp_path / "live")
    tokens = np.full((B, T), 2**32 - 1, dtype=np.int64)
    tokens[0, 0] = 0
    with LiveProducer(path, "p-0", batch_size=B, seq_len=T, cadence=1) as producer:
        producer.append(tokens)
    with LiveSource(path) as source:
        assert np.array_equal(source.read_batch(0), tokens.astype(np.uint32))


def test_a_batch_object_has_seed_0_and_batch_size_records_per_batch(tmp_path: Path) -> None:
    """SPEC.md 17.2: writers give a batch object ``seed = 0`` and ``total_records =
    num_batches * batch_size``; its manifest entry says the same."""
    path = str(tmp_path / "live")
    with LiveProducer(path, "p-0", batch_size=B, seq_len=T, seed=5, cadence=1) as producer:
        producer.append(np.stack([batch(0, 0), batch(0, 1), batch(0, 2)]))
        (entry,) = producer.base.tail
    header = parse_header(LocalStore(path).read(entry.name))
    assert (header.num_batches, header.seed, header.total_records) == (3, 0, 3 * B)
    assert (entry.num_batches, entry.seed, entry.total_records) == (3, 0, 3 * B)


def test_a_dataset_created_without_a_seed_records_seed_0(tmp_path: Path) -> None:
    """``seed`` defaults to 0 in the descriptor of a dataset a producer creates."""
    path = str(tmp_path / "live")
    with LiveProducer(path, "p-0", batch_size=B, seq_len=T) as producer:
        assert producer.descriptor.seed == 0
    found = parse_descriptor(LocalStore(path).read(DESCRIPTOR_NAME))
    assert isinstance(found, Descriptor) and found.seed == 0


@pytest.mark.parametrize(
    ("argument", "value", "rule"),
    [
        ("batch_size", 0, r"batch_size must be in \[1, 2\*\*32 - 1\], got 0"),
        ("batch_size", 2**32, r"batch_size must be in \[1, 2\*\*32 - 1\], got 4294967296"),
        ("seq_len", 0, r"seq_len must be in \[1, 2\*\*32 - 1\], got 0"),
        ("seq_len", 2**32, r"seq_len must be in \[1, 2\*\*32 - 1\], got 4294967296"),
        ("seed", -1, r"seed must be in \[0, 2\*\*64 - 1\], got -1"),
        ("seed", 2**64, r"seed must be in \[0, 2\*\*64 - 1\], got 18446744073709551616"),
        ("segment_size", 0, r"segment_size must be in \[1, 1048576\], got 0"),
        ("segment_size", 2**20 + 1, r"segment_size must be in \[1, 1048576\], got 1048577"),
    ],
)
def test_creating_a_live_dataset_refuses_arguments_outside_the_spec_ranges(
    tmp_path: Path, argument: str, value: int, rule: str
) -> None:
    """SPEC.md 17.1: ``batch_size`` and ``seq_len`` in ``1 .. 2^32 - 1``, ``seed`` in
    ``0 .. 2^64 - 1``, ``segment_size`` in ``1 .. 2^20``. A value outside is refused with
    ``ValueError`` naming the argument and its range, and nothing is written."""
    path = tmp_path / "live"
    kwargs: dict[str, Any] = {"batch_size": B, "seq_len": T, "seed": 0, "segment_size": 4}
    kwargs[argument] = value
    with pytest.raises(ValueError, match=rule):
        LiveProducer(str(path), "p-0", **kwargs)
    assert not path.exists() or not any(path.rglob("*.json"))


@pytest.mark.parametrize(
    ("batch_size", "seq_len", "seed", "segment_size"),
    [(1, 1, 0, 1), (2**32 - 1, 2**32 - 1, 2**64 - 1, 2**20)],
)
def test_creating_a_live_dataset_accepts_the_ends_of_the_spec_ranges(
    tmp_path: Path, batch_size: int, seq_len: int, seed: int, segment_size: int
) -> None:
    """SPEC.md 17.1's smallest and largest values are accepted and recorded in ``live.json``."""
    path = str(tmp_path / "live")
    with LiveProducer(
        path, "p-0", batch_size=batch_size, seq_len=seq_len, seed=seed, segment_size=segment_size
    ) as p:
        assert (p.batch_size, p.seq_len) == (batch_size, seq_len)
    found = parse_descriptor(LocalStore(path).read(DESCRIPTOR_NAME))
    assert isinstance(found, Descriptor)
    assert (found.batch_size, found.seq_len, found.seed, found.segment_size) == (
        batch_size,
        seq_len,
        seed,
        segment_size,
    )


@pytest.mark.parametrize(("batch_size", "seq_len"), [(B, None), (None, T)])
def test_creating_a_live_dataset_needs_both_batch_size_and_seq_len(
    tmp_path: Path, batch_size: int | None, seq_len: int | None
) -> None:
    """Only one of ``batch_size`` and ``seq_len`` cannot create a dataset: ``LiveError``
    asking for both, and nothing is written."""
    path = tmp_path / "live"
    with pytest.raises(LiveError, match="give batch_size and seq_len to create one"):
        LiveProducer(str(path), "p-0", batch_size=batch_size, seq_len=seq_len)
    assert not path.exists() or not any(path.rglob("*.json"))


@pytest.mark.parametrize(
    ("batch_size", "seq_len"), [(B + 1, None), (None, T + 1), (B + 1, T), (B, T + 1)]
)
def test_opening_a_live_dataset_with_another_shape_is_refused(
    tmp_path: Path, batch_size: int | None, seq_len: int | None
) -> None:
    """A ``batch_size`` or ``seq_len`` given (alone or with the other) that differs from the
    dataset's is refused with ``LiveError`` naming both shapes."""
    path = str(tmp_path / "live")
    _produce(path, [1])
    want = rf"holds \[4, 16\] batches, not \[{batch_size}, {seq_len}\]"
    with pytest.raises(LiveError, match=want):
        LiveProducer(path, "p-1", batch_size=batch_size, seq_len=seq_len)


@pytest.mark.parametrize("creator_died", [False, True])
def test_the_first_commit_is_version_1_after_version_0(tmp_path: Path, creator_died: bool) -> None:
    """The producer that creates a dataset creates version 0 (no entries); SPEC.md 17.1: one
    that finds the descriptor but no version (its creator died in between) creates version 0
    itself. Either way the first commit is version 1."""
    path = str(tmp_path / "live")
    _produce(path, [])
    assert _versions(path) == [0]
    if creator_died:
        _drop(path, 0)
    _produce(path, [2])
    assert _versions(path) == [0, 1]
    assert _read_all(path) == [(0, 0), (0, 1)]


def test_a_producer_that_loses_the_creation_race_takes_the_winners_descriptor(
    tmp_path: Path,
) -> None:
    """Two producers create a dataset at once and the other one's descriptor lands first (its
    version 0 not yet): this producer takes that descriptor, creates version 0 for it, and
    commits on it."""
    winner = Descriptor(B, T, 7, "0123456789abcdef" * 2, 3)

    class Raced(LocalStore):
        def _create(self, key: str, data: bytes) -> bool:
            if key == DESCRIPTOR_NAME:
                super()._create(key, build_descriptor(winner))
            return super()._create(key, data)

    path = str(tmp_path / "live")
    with LiveProducer(Raced(path), "p-0", batch_size=B, seq_len=T, cadence=1) as producer:
        assert producer.descriptor == winner
        producer.append(batch(0, 0))
    assert _versions(path) == [0, 1]
    assert _chain(path).latest().dataset_id == winner.dataset_id
    assert _read_all(path) == [(0, 0)]


def test_opening_after_retention_reclaimed_version_0_does_not_create_it_again(
    tmp_path: Path,
) -> None:
    """A producer opening a dataset whose old versions retention deleted (version 0 among
    them) builds on the newest version and does not create version 0 again."""
    path = str(tmp_path / "live")
    _produce(path, [1] * 4)
    reclaim(path, keep_versions=1)
    assert _versions(path) == [4]
    with LiveProducer(path, "p-1", cadence=1) as producer:
        producer.append(batch(1, 0))
    assert _versions(path) == [4, 5]
    assert _read_all(path)[-1] == (1, 0)


# -- a producer behind retention -------------------------------------------------------------------
@pytest.mark.parametrize("busy", [6, 3], ids=["next-reclaimed", "next-kept"])
def test_an_idle_producer_commits_on_the_newest_version_after_retention(
    tmp_path: Path, busy: int
) -> None:
    """A producer that sat on version 0 while another committed versions 1 to ``busy`` and
    retention kept only the newest two does not leave a version 1 beside them (its conditional
    create succeeds, the key being free; version 2 is then gone, or kept and built on another
    version 1): it deletes that version, commits ``busy + 1``, the readers see every batch,
    and retention runs again."""
    path = str(tmp_path / "live")
    idle = LiveProducer(path, "p-0", batch_size=B, seq_len=T, cadence=100)
    with LiveProducer(path, "p-1", cadence=1) as producer:
        for i in range(busy):
            producer.append(batch(1, i))
    reclaim(path, keep_versions=2)
    idle.append(batch(0, 0))
    assert idle.commit() is True
    assert (idle.base.version, idle.committed, idle.stats.conflicts) == (busy + 1, 1, 1)
    assert sorted(os.listdir(os.path.join(path, "manifests"))) == [
        manifest_name(v).split("/")[1] for v in (busy - 1, busy, busy + 1)
    ]
    assert _read_all(path)[-1] == (0, 0)
    assert reclaim(path, keep_versions=2).committed == busy + 1


class _ReclaimedBehind(_Counting):
    """A local store (counting listings) where, with ``armed``, right after the next create
    of a manifest version succeeds, ``rival`` (if any) commits once on it and the version
    before it is deleted (retention, oldest first): the version just created is then
    legitimate though its base is gone."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.armed = False
        self.rival: LiveProducer | None = None

    def _create(self, key: str, data: bytes) -> bool:
        created = super()._create(key, data)
        if created and self.armed and key.startswith("manifests/"):
            self.armed = False
            if self.rival is not None:
                self.rival.append(batch(1, 0))
            version = parse_manifest_name(key)
            assert version is not None
            self.delete(manifest_name(version - 1))
        return created


@pytest.mark.parametrize("rival", [True, False], ids=["built-on", "newest"])
def test_a_commit_whose_base_retention_deleted_afterwards_stands(
    tmp_path: Path, rival: bool
) -> None:
    """A version whose base is gone once it is created, but that is the newest or that the
    next version follows, is a commit: it is kept, counted as one, and its batches served."""
    path = str(tmp_path / "live")
    store = _ReclaimedBehind(path)
    producer = LiveProducer(store, "p-0", batch_size=B, seq_len=T, cadence=100)
    if rival:
        store.rival = LiveProducer(path, "p-1", cadence=1, probe=False)
    producer.append(batch(0, 0))
    store.armed = True
    assert producer.commit() is True
    assert (producer.base.version, producer.stats.commits, producer.stats.conflicts) == (1, 1, 0)
    versions = (1, 2) if rival else (1,)
    assert sorted(os.listdir(os.path.join(path, "manifests"))) == [
        manifest_name(v).split("/")[1] for v in versions
    ]
    assert _read_all(path) == ([(0, 0), (1, 0)] if rival else [(0, 0)])


def test_commits_on_the_newest_version_list_nothing(tmp_path: Path) -> None:
    """A producer's commits, the first (on version 0) and the later ones, cost no listing of
    the store: only a commit whose base is gone lists the versions."""
    store = _ReclaimedBehind(str(tmp_path / "live"))
    producer = LiveProducer(store, "p-0", batch_size=B, seq_len=T, cadence=1)
    opened = store.listings
    for i in range(3):
        producer.append(batch(0, i))
    assert (producer.base.version, store.listings) == (3, opened)
