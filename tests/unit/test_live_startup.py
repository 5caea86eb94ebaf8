"""A live consumer's startup does not grow with the committed length, and an idle poll does
not grow with the versions kept: sealed segments are read when their batches are needed, and
the versions are listed only rarely while a read waits."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import xxhash
from zerobatch_spec.live import (
    Segment,
    SegmentRef,
    build_live_manifest,
    build_segment,
    manifest_name,
    segment_name,
)

from tests.remote.live_worker import B, T, batch, identify
from zerobatch_core import BatchNativeLoader, Position
from zerobatch_core.live import source as live_source
from zerobatch_core.live.manifests import ChainError, LiveError, LiveTimeoutError
from zerobatch_core.live.producer import LiveProducer
from zerobatch_core.live.source import LiveSource
from zerobatch_core.stores.store import LocalStore

SEGMENT = 4
"""Entries per sealed segment in these datasets (one batch per entry)."""


class _Logged(LocalStore):
    """A local store that logs every request as ``(operation, key)``."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.log: list[tuple[str, str]] = []

    def _read(self, key: str) -> bytes:
        self.log.append(("read", key))
        return super()._read(key)

    def _read_ranges(
        self, key: str, ranges: Sequence[tuple[int, int]], coalesce: int = 0
    ) -> list[bytes]:
        self.log.append(("ranges", key))
        return super()._read_ranges(key, ranges, coalesce)

    def _size(self, key: str) -> int:
        self.log.append(("size", key))
        return super()._size(key)

    def _list(self, prefix: str) -> list[str]:
        self.log.append(("list", prefix))
        return super()._list(prefix)

    def under(self, prefix: str) -> list[str]:
        return [k for _, k in self.log if k.startswith(prefix)]

    def listings(self) -> int:
        return sum(op == "list" for op, _ in self.log)


def _produce(path: str, count: int, start: int = 0, per_commit: int = 8) -> None:
    """Items ``start .. start + count - 1`` of producer 0, one batch per object, a commit
    every ``per_commit`` objects, segments of ``SEGMENT`` entries."""
    with LiveProducer(
        path, "p-0", batch_size=B, seq_len=T, cadence=per_commit, segment_size=SEGMENT
    ) as p:
        for i in range(start, start + count):
            p.append(batch(0, i))


def _dataset(tmp_path: Path, segments: int) -> str:
    path = str(tmp_path / f"live-{segments}")
    _produce(path, segments * SEGMENT + 2)
    return path


def _first_batch(path: str) -> tuple[_Logged, LiveSource]:
    store = _Logged(path)
    source = LiveSource(store, timeout=0)
    assert identify(source.read_batch(source.start)) == (0, source.start)
    return store, source


def test_a_fresh_consumers_first_batch_costs_the_same_at_every_length(tmp_path: Path) -> None:
    """With 1x, 4x and 16x as many sealed segments, a fresh consumer makes the same requests
    before its first batch (the descriptor, a listing, the newest version and its
    predecessor, a probe of the next, then the first segment and the first object), and
    reads one segment of the whole dataset: the one holding its batch. The bytes it reads
    differ only by the two manifest versions, whose segment references grow."""
    costs = []
    for segments in (2, 8, 32):
        store, source = _first_batch(_dataset(tmp_path, segments))
        with source:
            refs = source.current.segments
            assert len(refs) == segments
            assert store.under("segments/") == [refs[0].name]
            manifests = store.under("manifests/")
            newest = source.current.version
            assert manifests[-3:] == [manifest_name(v) for v in (newest, newest - 1, newest + 1)]
            others = sum(
                len((Path(store.url) / k).read_bytes())
                for op, k in store.log
                if op == "read" and not k.startswith("manifests/")
            )
            costs.append((store.stats.requests, len(store.log), others))
    assert costs[0] == costs[1] == costs[2]


def test_a_consumer_resumed_deep_into_the_dataset_reads_the_segment_it_needs(
    tmp_path: Path,
) -> None:
    """A loader restored at a step deep in the dataset reads the segment holding that step's
    batch (and the following ones it reads), none before it."""
    path = _dataset(tmp_path, 16)
    with LiveSource(path) as source:
        state = BatchNativeLoader(source, dtype="uint32").state_dict(Position(0, 41))
    store = _Logged(path)
    with LiveSource(store, prefetch_bytes=0) as source:
        loader = BatchNativeLoader(source, dtype="uint32")
        loader.load_state_dict(state)
        items = iter(loader)
        assert [identify(next(items)) for _ in range(3)] == [(0, 41), (0, 42), (0, 43)]
        read = store.under("segments/")
        assert read[0] == f"segments/{40:020d}.json"  # batches 40..43
        assert all(int(k.split("/")[1].split(".")[0]) >= 40 for k in read)


def test_every_batch_is_served_with_few_segments_kept_across_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one segment's entries kept at a time, reads from several threads across every
    segment, forwards and back, serve every batch's own tokens; a segment dropped and read
    again costs a segment read, never a second check of an object's header."""
    monkeypatch.setattr(live_source, "SPANS_KEPT", 1)
    path = _dataset(tmp_path, 8)
    store = _Logged(path)
    with LiveSource(store) as source:
        n = source.committed
        order = list(range(n)) + list(range(n - 1, -1, -1))
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda g: identify(source.read_batch(g)), order))
        assert got == [(0, g) for g in order]
        held = [s for s in source._index[1] if s.ref is not None and s.held is not None]
        assert len(held) <= 1
        heads = [k for op, k in store.log if op == "size" and k.startswith("batches/")]
        assert len(heads) == len(set(heads)) == n


def test_a_damaged_segment_is_refused_when_its_batches_are_needed(tmp_path: Path) -> None:
    """A segment whose bytes do not match its reference does not stop a consumer from
    opening or from serving the other segments' batches; a read of one of its batches
    raises ``LiveError`` naming it (never serves from it)."""
    path = _dataset(tmp_path, 4)
    with LiveSource(path, timeout=0) as source:
        ref = source.current.segments[2]
        damaged = Path(path) / ref.name
        damaged.write_bytes(damaged.read_bytes().replace(b'"first"', b'"first" '))
        assert identify(source.read_batch(0)) == (0, 0)
        assert identify(source.read_batch(ref.end)) == (0, ref.end)
        with pytest.raises(LiveError, match=f"{ref.name}: xxh3"):
            source.read_batch(ref.first)
        with pytest.raises(LiveError, match=f"{ref.name}: xxh3"):
            source.slot_checksum(ref.end - 1)


def test_a_following_consumer_keeps_a_bounded_window_of_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tail entries a consumer followed become spans of the segments that seal them; only
    ``SPANS_KEPT`` of those keep their entries, and a batch whose entries were dropped is
    served again from its segment."""
    monkeypatch.setattr(live_source, "SPANS_KEPT", 2)
    path = str(tmp_path / "live")
    _produce(path, 3)
    with LiveSource(path, timeout=5) as source:
        for g in range(40):
            if g >= source.committed:
                _produce(path, 8, start=source.committed)
            assert identify(source.read_batch(g)) == (0, g)
        spans = source._index[1]
        sealed = [s for s in spans if s.ref is not None]
        assert len(sealed) >= 8
        assert sum(s.held is not None for s in sealed) <= 2
        assert [s.first for s in spans] == sorted({s.first for s in spans})
        assert identify(source.read_batch(1)) == (0, 1)


def test_a_segment_read_again_must_hold_the_tail_entries_it_sealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tail entries a consumer served, then sealed by a version whose segment holds other
    entries (a digest that matches its reference, another checksum inside), are dropped as
    that segment's span; reading their batches again reads the segment and refuses it
    (``ChainError``), rather than serving what another version listed for them."""
    monkeypatch.setattr(live_source, "SPANS_KEPT", 0)
    path = str(tmp_path / "live")
    _produce(path, 3)
    with LiveSource(path, timeout=0) as source:
        prev = source.current
        assert not prev.segments and len(prev.tail) == 3
        assert [identify(source.read_batch(g)) for g in range(3)] == [(0, 0), (0, 1), (0, 2)]
        first = prev.tail[0]
        changed = dataclasses.replace(first, checksums=("0" * 16, *first.checksums[1:]))
        data = build_segment(Segment(prev.dataset_id, 0, (changed, prev.tail[1])))
        ref = SegmentRef(
            segment_name(0), 0, prev.tail[1].end, 2, f"{xxhash.xxh3_64_intdigest(data):016x}"
        )
        (Path(path) / "segments").mkdir(exist_ok=True)
        (Path(path) / ref.name).write_bytes(data)
        nxt = dataclasses.replace(
            prev, version=prev.version + 1, segments=(ref,), tail=prev.tail[2:]
        )
        (Path(path) / manifest_name(nxt.version)).write_bytes(build_live_manifest(nxt))
        assert source.refresh() is True and source.committed == 3
        assert source._index[1][0].held is None  # dropped at once (SPANS_KEPT is 0)
        with pytest.raises(ChainError, match="does not hold the tail entries it seals"):
            source.read_batch(1)
        assert identify(source.read_batch(2)) == (0, 2)


def test_pickling_and_validation_still_cover_every_batch(tmp_path: Path) -> None:
    """A pickled source reopens at the same committed end, and ``validate`` reads every
    segment and checks every object (a deep check every slot)."""
    path = _dataset(tmp_path, 4)
    with LiveSource(path) as source:
        again = pickle.loads(pickle.dumps(source))
        with again:
            assert again.committed == source.committed
            assert identify(again.read_batch(9)) == (0, 9)
        assert source.validate(deep=True) == []
        (Path(path) / source.current.segments[1].name).unlink()
    with LiveSource(path) as source:
        failures = source.validate()
        assert len(failures) == 1 and "a segment the manifest lists is missing" in failures[0]


@pytest.mark.parametrize("versions", [3, 60])
def test_an_idle_poll_costs_two_requests_and_no_listing(tmp_path: Path, versions: int) -> None:
    """Finding nothing new costs the read of the next version and a check that the source's
    own version is still there, whether 3 or 60 versions exist: no listing."""
    path = str(tmp_path / "live")
    _produce(path, versions, per_commit=1)
    store = _Logged(path)
    with LiveSource(store) as source:
        assert source.current.version == versions
        store.log.clear()
        before = store.stats.requests
        for _ in range(5):
            assert source.refresh() is False
        assert len(store.log) == 10 and store.stats.requests - before == 5  # 5 not found
        assert store.listings() == 0
        assert store.log[:2] == [
            ("read", manifest_name(versions + 1)),
            ("size", manifest_name(versions)),
        ]


class _Clock:
    """A stand-in for ``time`` in ``live_source``: time moves only while the reader sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_waiting_read_lists_the_versions_rarely_and_before_it_gives_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that waits 100 s for a batch polls hundreds of times but lists the versions
    only at 1, 3, 7, 15, 31 and 63 s after opening and once more at the timeout."""
    clock = _Clock()
    monkeypatch.setattr(live_source, "time", clock)
    path = str(tmp_path / "live")
    _produce(path, 2)
    store = _Logged(path)
    with LiveSource(store, timeout=100) as source:
        store.log.clear()
        with pytest.raises(LiveTimeoutError):
            source.read_batch(2)
        polls = sum(op == "read" and k.startswith("manifests/") for op, k in store.log)
        assert polls > 150
        assert store.listings() == 7


def test_a_version_past_a_gap_is_refused_at_the_first_listing_of_a_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version numbered far past the newest while the source's own version is present is
    never served from: polls do not see it, and the first listing (``LIST_FIRST`` seconds
    after opening) raises ``ChainError`` naming it, long before the timeout."""
    clock = _Clock()
    monkeypatch.setattr(live_source, "time", clock)
    path = str(tmp_path / "live")
    _produce(path, 2)
    with LiveSource(path, timeout=100) as source:
        far = source.current.version + 1000
        crafted = build_live_manifest(dataclasses.replace(source.current, version=far))
        (Path(path) / manifest_name(far)).write_bytes(crafted)
        assert source.refresh() is False
        opened = clock.now
        with pytest.raises(ChainError, match=manifest_name(far)):
            source.read_batch(2)
        assert clock.now - opened <= live_source.LIST_FIRST + 1
        assert source.committed == 2 and identify(source.read_batch(1)) == (0, 1)
