"""Live consumers: segment references that disagree with their segments, and a consumer at the
committed end.

SPEC.md section 18.2: a segment object MUST match its reference's digest, ``first``, end and
entry count, and a reader MUST NOT serve a global batch that no version it read lists. A
version whose reference disagrees with its segment (a producer bug, a store that rewrote the
object, a crafted version) is refused with ``LiveError`` naming the segment, by a consumer that
opens on it and by one that follows it from an earlier version, and no batch is served from
it; a segment rewritten under a valid version is refused when its batches are read. README
("Consumers"): a read past the committed end waits for new versions up to ``timeout``
seconds, then raises ``LiveTimeoutError``; a timeout of 0 does not wait.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from zerobatch_spec.live import (
    Entry,
    LiveManifest,
    Segment,
    SegmentRef,
    build_live_manifest,
    build_segment,
    manifest_name,
    parse_segment,
)

from tests.remote.live_worker import B, T, batch, identify
from zerobatch_core import BatchNativeLoader, DatasetError
from zerobatch_core.live.manifests import LiveError, LiveTimeoutError, ManifestChain
from zerobatch_core.live.producer import LiveProducer
from zerobatch_core.live.source import LiveSource
from zerobatch_core.stores.resolve import open_store


def _produce(path: str, sizes: list[int], start: int = 0) -> None:
    """Append objects of ``sizes`` batches (items ``start`` on of producer 0), one commit each:
    with ``segment_size=2`` full runs of two entries are sealed into segments."""
    with LiveProducer(path, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=2) as p:
        i = start
        for n in sizes:
            p.append(np.stack([batch(0, i + k) for k in range(n)]))
            i += n


def _digest(data: bytes) -> str:
    return f"{xxhash.xxh3_64_intdigest(data):016x}"


def _next_version(
    path: str, latest: LiveManifest, change: Callable[[LiveManifest], LiveManifest]
) -> LiveManifest:
    """Create the version after ``latest`` (the newest), ``change(latest)`` applied, as a buggy
    or hostile writer would, with a plain write."""
    crafted = dataclasses.replace(change(latest), version=latest.version + 1, nonce="ab" * 8)
    open_store(path).write(manifest_name(crafted.version), build_live_manifest(crafted))
    return crafted


def _segment(path: str, name: str) -> Segment:
    store = open_store(path)
    found = parse_segment(store.read(name), LiveSource(path).descriptor)
    assert isinstance(found, Segment)
    return found


def _write_segment(path: str, name: str, segment: Segment) -> str:
    """Overwrite segment object ``name``; the digest of the bytes written."""
    data = build_segment(segment)
    open_store(path).write(name, data)
    return _digest(data)


def _shorter(e: Entry) -> Entry:
    """``e`` as a valid entry of one batch fewer (same object name, producer and offset)."""
    n = e.num_batches - 1
    return dataclasses.replace(
        e, num_batches=n, total_records=n * B, size=4096 * (1 + n), checksums=e.checksums[:n]
    )


def _refuses(path: str, ref_name: str, early: LiveSource, why: str) -> None:
    """A fresh consumer refuses to open (``LiveError`` naming the segment and ``why``); one
    opened earlier serves what it read before and nothing the bad version lists, every try."""
    with pytest.raises(LiveError, match=f"{ref_name}.*{why}"):
        LiveSource(path)
    early.timeout = 0.5
    before = early.committed
    for g in range(before):
        assert identify(early.read_batch(g)) == (0, g)
    for _ in range(3):
        with pytest.raises(LiveError, match=f"{ref_name}.*{why}") as caught:
            early.read_batch(early.committed)
        assert not isinstance(caught.value, LiveTimeoutError)
    assert early.committed == before  # nothing of the bad version was taken in
    early.close()


def _refuses_when_read(path: str, ref: SegmentRef, early: LiveSource, why: str) -> None:
    """A consumer reads a sealed segment the first time it needs one of its batches, and
    checks it then: a fresh consumer and one opened earlier serve the batches before it, and
    raise ``LiveError`` naming the segment and ``why`` (never a timeout) for each of its
    batches, every try."""
    for source in (LiveSource(path), early):
        source.timeout = 0.5
        for g in range(ref.first):
            assert identify(source.read_batch(g)) == (0, g)
        for _ in range(2):
            for g in range(ref.first, ref.end):
                with pytest.raises(LiveError, match=f"{ref.name}.*{why}") as caught:
                    source.read_batch(g)
                assert not isinstance(caught.value, LiveTimeoutError)
        source.close()


# Sizes 1, 1 then 2, 1, 1, 1: the first segment (batches 0-1) is sealed while the early consumer
# is open at committed = 2; the bad one is the second (batches 2-4: entries of 2 and 1 batches).
FIRST, SECOND = [1, 1], [2, 1, 1, 1]


@pytest.fixture
def live(tmp_path: Path) -> tuple[str, LiveSource]:
    path = str(tmp_path / "live")
    _produce(path, FIRST)
    early = LiveSource(path)
    assert early.committed == 2
    _produce(path, SECOND, start=2)
    latest = LiveSource(path).current
    assert [(r.first, r.num_batches, r.entries) for r in latest.segments[:2]] == [
        (0, 2, 2),
        (2, 3, 2),
    ]
    return path, early


def test_a_segment_whose_bytes_do_not_match_the_reference_digest(
    live: tuple[str, LiveSource],
) -> None:
    path, early = live
    latest = LiveSource(path).current
    ref = latest.segments[1]
    segment = _segment(path, ref.name)
    data = json.loads(build_segment(segment))
    data["note"] = "rewritten"  # still a valid segment of the same entries: other bytes
    open_store(path).write(ref.name, json.dumps(data).encode())
    _refuses_when_read(path, ref, early, "xxh3")


@pytest.mark.parametrize("field", ["first", "end", "entries"])
def test_a_reference_that_disagrees_with_its_segment(
    live: tuple[str, LiveSource], field: str
) -> None:
    """The segment object is valid and its digest is the reference's: only ``first``, its end
    or its entry count disagree with the reference."""
    path, early = live
    latest = LiveSource(path).current
    ref = latest.segments[1]
    segment = _segment(path, ref.name)
    new_ref = ref
    if field == "first":  # the same entries, one batch later
        moved = tuple(dataclasses.replace(e, first=e.first + 1) for e in segment.entries)
        digest = _write_segment(path, ref.name, Segment(segment.dataset_id, ref.first + 1, moved))
        new_ref = dataclasses.replace(ref, xxh3=digest)
    elif field == "end":  # two entries as the reference says, one batch fewer
        head, last = segment.entries[0], segment.entries[-1]
        assert head.num_batches == 2
        shorter = (_shorter(head), dataclasses.replace(last, first=last.first - 1))
        digest = _write_segment(path, ref.name, Segment(segment.dataset_id, ref.first, shorter))
        new_ref = dataclasses.replace(ref, xxh3=digest)
    else:  # the reference counts one entry more than the segment holds
        new_ref = dataclasses.replace(ref, entries=ref.entries + 1)

    def change(m: LiveManifest) -> LiveManifest:
        segments = list(m.segments)
        segments[1] = new_ref
        return dataclasses.replace(m, segments=tuple(segments))

    _next_version(path, latest, change)
    # A changed reference to a segment the previous version kept breaks the chain (18.4).
    _refuses(path, ref.name, early, "(does not hold what the manifest|segments it does not trim)")


def test_the_chain_checks_a_cached_segment_against_each_reference(tmp_path: Path) -> None:
    """A segment read once is kept in memory; a later reference to the same name that says
    other things (count, digest) is still checked against it."""
    path = str(tmp_path / "live")
    _produce(path, [1, 1, 1])
    source = LiveSource(path)
    chain = ManifestChain(open_store(path), source.descriptor)
    ref = source.current.segments[0]
    assert [e.first for e in chain.segment(ref).entries] == [0, 1]
    for bad in (
        dataclasses.replace(ref, entries=ref.entries + 1),
        dataclasses.replace(ref, xxh3="0" * 16 if ref.xxh3 != "0" * 16 else "1" * 16),
    ):
        with pytest.raises(LiveError, match=ref.name):
            chain.segment(bad)
    source.close()


# -- a consumer at the committed end ---------------------------------------------------------


def test_a_consumer_at_the_committed_end_with_timeout_zero_ends_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "live")
    _produce(path, [1, 2, 1])  # producers all closed: four global batches, nothing pending
    source = LiveSource(path, timeout=0)
    assert source.committed == 4
    assert identify(source.read_batch(3)) == (0, 3)  # committed: served without waiting
    t0 = time.monotonic()
    with pytest.raises(LiveTimeoutError, match="global batch 4 not committed after 0 s"):
        source.read_batch(4)
    assert time.monotonic() - t0 < 1.0
    loader = BatchNativeLoader(source, rank=1, world_size=2)
    served: list[np.ndarray] = []
    t0 = time.monotonic()
    with pytest.raises(LiveTimeoutError):
        for item in loader:
            served.append(np.array(item))
    assert time.monotonic() - t0 < 2.0
    assert [identify(np.concatenate([x, x])) for x in served] == [(0, i) for i in range(4)]
    state = loader.state_dict()  # at the committed end: a restore ends at once too
    again = BatchNativeLoader(LiveSource(path, timeout=0), rank=1, world_size=2)
    again.load_state_dict(state)
    t0 = time.monotonic()
    with pytest.raises(LiveTimeoutError):
        next(iter(again))
    assert time.monotonic() - t0 < 1.0
    source.close()


def test_a_consumer_at_the_end_waits_its_timeout_then_serves_what_comes(tmp_path: Path) -> None:
    path = str(tmp_path / "live")
    _produce(path, [1, 1])
    source = LiveSource(path, timeout=0.3, poll=0.01)
    t0 = time.monotonic()
    with pytest.raises(LiveTimeoutError, match=r"global batch 2 not committed after 0.3 s"):
        source.read_batch(2)
    waited = time.monotonic() - t0
    assert 0.3 <= waited < 2.0  # it waited its timeout, not for ever
    _produce(path, [1], start=2)  # a producer comes back: the next read serves it
    assert identify(source.read_batch(2)) == (0, 2)
    with pytest.raises(LiveTimeoutError):
        source.wait_for(3, timeout=0)
    source.close()


# -- a corrupted batch object ----------------------------------------------------------------


@pytest.mark.parametrize("verify", ["whole", "first", "always"])
def test_a_corrupted_live_batch_raises_on_every_read(tmp_path: Path, verify: Any) -> None:
    """A batch object whose bytes no longer match its entry's checksums (header intact, so
    rules 7-10 pass) raises ``DatasetError`` at every read that checks it, in every mode."""
    path = str(tmp_path / "live")
    _produce(path, [1, 2, 1])
    source = LiveSource(path, verify=verify, timeout=0)
    (entry,) = [e for e in source.chain.entries(source.current) if e.first == 1]
    store = open_store(path)
    data = bytearray(store.read(entry.name))
    data[4096 + 4096 + 3 * T * 4 + 1] ^= 0x10  # global batch 2 (the entry's slot 1), row 3
    store.write(entry.name, bytes(data))
    for _ in range(3):
        with pytest.raises(DatasetError, match=r"checksum_mismatch.*slot 1"):
            source.read_batch(2)
        if verify != "whole":  # these modes fetch and check the whole slot for a part of it
            with pytest.raises(DatasetError, match="checksum_mismatch"):
                source.read_region(2, 0, B // 2, 0, T)
        for g in (1, 3):  # its neighbours (one of them in the same object) are served
            assert identify(source.read_batch(g)) == (0, g)
    source.close()
    loader = BatchNativeLoader(LiveSource(path, verify=verify, timeout=0))
    for _ in range(3):  # every pass stops at global batch 2, having served 0 and 1 only
        served: list[tuple[int, int]] = []
        with pytest.raises(DatasetError, match="checksum_mismatch"):
            for item in loader:
                served.append(identify(np.array(item)))
        assert served == [(0, g) for g in range(loader.step - len(served), loader.step)]
        assert loader.step <= 2
