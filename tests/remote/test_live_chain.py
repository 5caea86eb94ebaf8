"""Producers and consumers of a live dataset follow only a verified chain of versions.

One crafted or mistaken manifest version (``SPEC.md`` section 18.4) must never be served from
or committed on: a version ``v + 1`` with huge ``start``, ``batches`` and producer offsets and
no entries, or a version numbered ``10**12``. Each test runs on a local directory and on the
S3-compatible test server. A consumer or producer meeting such a version raises ``ChainError``
at once (never after waiting out its timeout); a producer keeps its pending objects and its
offset; a consumer keeps serving the batches of the versions it already accepted.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec.live import (
    BATCHES_PREFIX,
    MANIFESTS_PREFIX,
    LiveManifest,
    Producer,
    build_live_manifest,
    manifest_name,
    parse_manifest_name,
)

from tests.remote.live_worker import B, T, batch, identify
from zerobatch_core.live.manifests import ChainError
from zerobatch_core.live.producer import LiveProducer
from zerobatch_core.live.retention import reclaim
from zerobatch_core.live.source import LiveSource
from zerobatch_core.stores.resolve import open_store

HUGE = 2**60
"""The crafted version's ``start``, ``batches`` and producer offsets."""
FAR = 10**12
"""The crafted far-numbered version."""
PROMPT = 5.0
"""Seconds within which a broken chain must be reported (the timeouts are far longer)."""


@pytest.fixture(params=["local", "s3"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A live dataset's location: a local directory, or a prefix of a fresh S3 bucket."""
    if request.param == "local":
        return str(tmp_path / "live")
    bucket = request.getfixturevalue("bucket")
    return f"s3://{bucket}/live"


def _produce(url: str, producer: str, count: int, first: int = 0) -> None:
    """Commit batches ``first .. count - 1`` of ``producer`` (creating the dataset)."""
    with LiveProducer(url, producer, batch_size=B, seq_len=T, cadence=2, segment_size=3) as p:
        for i in range(first, count):
            p.append(batch(0 if producer == "p-0" else 1, i))


def _latest(url: str) -> LiveManifest:
    with LiveSource(url) as source:
        return source.current


def _craft(url: str, version: int, *, keep_entries: bool = False) -> LiveManifest:
    """Create a valid-looking version ``version`` far ahead of the real ones (what a bad
    producer credential or a buggy producer could write): huge producer offsets and, unless
    ``keep_entries``, huge ``start`` and ``batches`` and no entries."""
    real = _latest(url)
    crafted = replace(
        real,
        version=version,
        producers={pid: Producer(HUGE, s.commits + 1) for pid, s in real.producers.items()},
        writer="p-0",
        nonce="0" * 16,
    )
    if not keep_entries:
        crafted = replace(crafted, batches=HUGE, start=HUGE, segments=(), tail=())
    assert open_store(url).create(manifest_name(version), build_live_manifest(crafted))
    return crafted


@pytest.mark.parametrize("version", ["next", "far"])
def test_a_consumer_opening_on_a_crafted_version_raises_at_once(url: str, version: str) -> None:
    _produce(url, "p-0", 5)
    real = _latest(url)
    crafted = _craft(url, real.version + 1 if version == "next" else FAR)
    started = time.monotonic()
    with pytest.raises(ChainError, match="live_not_successor") as e:
        LiveSource(url, timeout=60)
    assert time.monotonic() - started < PROMPT
    assert manifest_name(crafted.version) in str(e.value)


@pytest.mark.parametrize("version", ["next", "far"])
def test_a_consumer_keeps_what_it_verified_and_raises_when_it_needs_more(
    url: str, version: str
) -> None:
    _produce(url, "p-0", 5)
    source = LiveSource(url, timeout=60)
    try:
        assert source.committed == 5
        real = source.current
        _craft(url, real.version + 1 if version == "next" else FAR)
        # Batches of versions accepted before the crafted one are still served, unchanged.
        assert [identify(source.read_batch(g)) for g in range(5)] == [(0, i) for i in range(5)]
        started = time.monotonic()
        with pytest.raises(ChainError, match="live_not_successor"):
            source.read_batch(5)  # would need the crafted version
        assert time.monotonic() - started < PROMPT
        assert source.current.version == real.version and source.committed == 5
        assert identify(source.read_batch(4)) == (0, 4)
    finally:
        source.close()


@pytest.mark.parametrize(
    ("keep_entries", "rule"), [(False, r"tail\[0\]"), (True, r"producers\.p-0\.offset")]
)
def test_a_producer_refuses_to_commit_on_a_crafted_successor(
    url: str, keep_entries: bool, rule: str
) -> None:
    _produce(url, "p-0", 4)
    p = LiveProducer(url, "p-0", cadence=100)
    try:
        assert p.offset == p.committed == 4
        p.append(batch(0, 4))
        p.append(batch(0, 5))
        store = open_store(url)
        pending = {k for k in store.list_keys(BATCHES_PREFIX)} - set(_names(url))
        assert len(pending) == 2
        crafted = _craft(url, p.base.version + 1, keep_entries=keep_entries)
        started = time.monotonic()
        with pytest.raises(ChainError, match=rule) as e:
            p.commit(timeout=60)
        assert time.monotonic() - started < PROMPT
        assert manifest_name(crafted.version) in str(e.value)
        # Nothing dropped as "already committed", nothing committed on the crafted version.
        assert p.pending == 2 and p.offset == 6 and p.committed == 4
        assert p.base.version == crafted.version - 1
        assert pending <= set(store.list_keys(BATCHES_PREFIX))
        assert _versions(url)[-1] == crafted.version
        assert store.read(manifest_name(crafted.version)) == build_live_manifest(crafted)
    finally:
        p.store.close()


@pytest.mark.parametrize("version", ["next", "far"])
def test_a_producer_opening_on_a_crafted_version_refuses(url: str, version: str) -> None:
    _produce(url, "p-0", 3)
    real = _latest(url)
    crafted = _craft(url, real.version + 1 if version == "next" else FAR)
    started = time.monotonic()
    with pytest.raises(ChainError, match=manifest_name(crafted.version)):
        LiveProducer(url, "p-0", batch_size=B, seq_len=T)
    assert time.monotonic() - started < PROMPT
    assert _versions(url)[-1] == crafted.version  # nothing committed on it


def test_an_open_producer_commits_past_a_far_numbered_version_without_using_it(
    url: str,
) -> None:
    _produce(url, "p-0", 3)
    p = LiveProducer(url, "p-0", cadence=100)
    try:
        before = p.base
        _craft(url, FAR)
        p.append(batch(0, 3))
        assert p.commit(timeout=60)
        # It built on the verified base, not on the crafted version.
        assert p.base.version == before.version + 1
        assert p.base.producers["p-0"].offset == 4 and p.base.batches == before.batches + 1
    finally:
        p.close()
    with pytest.raises(ChainError, match=manifest_name(FAR)):
        LiveSource(url)


def test_a_consumer_follows_versions_retention_deleted_while_it_waited(url: str) -> None:
    _produce(url, "p-0", 3)
    source = LiveSource(url, timeout=60)
    try:
        assert source.committed == 3
        _produce(url, "p-0", 9, first=3)
        report = reclaim(url, keep_versions=1)
        assert report.deleted.get("manifests", 0) > 1  # the versions after the source's went
        assert [identify(source.read_batch(g)) for g in range(9)] == [(0, i) for i in range(9)]
    finally:
        source.close()


def test_a_gap_in_the_middle_of_the_versions_breaks_the_chain(tmp_path: Path) -> None:
    url = str(tmp_path / "live")
    _produce(url, "p-0", 6)
    store = open_store(url)
    top = _latest_version(url)
    store.delete(manifest_name(top - 1))  # not the oldest: retention never makes this gap
    with pytest.raises(ChainError, match=f"version {top - 1} is missing"):
        LiveSource(url)
    with pytest.raises(ChainError, match=f"version {top - 1} is missing"):
        LiveProducer(url, "p-1")


def _names(url: str) -> list[str]:
    """The batch objects the newest version lists."""
    source = LiveSource(url)
    try:
        return [e.name for e in source.chain.entries(source.current)]
    finally:
        source.close()


def _latest_version(url: str) -> int:
    return _latest(url).version


def _versions(url: str) -> list[int]:
    """The manifest versions present (a listing, nothing checked)."""
    keys = open_store(url).list_keys(MANIFESTS_PREFIX)
    return sorted(v for v in map(parse_manifest_name, keys) if v is not None)


def test_batches_served_are_the_producers(url: str) -> None:
    """The chain checks accept every version honest producers write, interleaved."""
    with (
        LiveProducer(url, "p-0", batch_size=B, seq_len=T, cadence=1, segment_size=2) as a,
        LiveProducer(url, "p-1", cadence=1, segment_size=2) as b,
    ):
        for i in range(6):
            a.append(batch(0, i))
            b.append(batch(1, i))
    with LiveSource(url) as source:
        got = [identify(source.read_batch(g)) for g in range(source.committed)]
    assert sorted(got) == [(p, i) for p in range(2) for i in range(6)]
    assert np.array_equal(np.array([i for p, i in got if p == 1]), np.arange(6))


def test_after_reclaimed_versions_a_newest_that_goes_back_is_refused(tmp_path: Path) -> None:
    """Every version up to the consumer's next one gone (as retention does) and a lone newest
    that lists fewer batches than the consumer accepted: taken as a first look would, but
    refused for going back on what the consumer already serves."""
    url = str(tmp_path / "live")
    _produce(url, "p-0", 4)
    source = LiveSource(url, timeout=60)
    try:
        accepted = source.current
        assert accepted.batches == 4
        store = open_store(url)
        for v in _versions(url):
            store.delete(manifest_name(v))
        back = replace(accepted, version=accepted.version + 5, batches=2, tail=accepted.tail[:0])
        back = replace(back, start=2, segments=(), producers={"p-0": Producer(2, 1)})
        assert store.create(manifest_name(back.version), build_live_manifest(back))
        started = time.monotonic()
        with pytest.raises(ChainError, match="batches 2 < 4"):
            source.read_batch(4)
        assert time.monotonic() - started < PROMPT
        assert source.committed == 4
    finally:
        source.close()
