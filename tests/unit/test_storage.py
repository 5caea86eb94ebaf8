"""Stores: the local store's conditional create under a race, retries and their accounting,
what counts as transient, URLs and redaction, the DAC cadence's budgets."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from tests.helpers import records
from zerobatch_core import BatchNativeLoader, write_batch_file
from zerobatch_core.live.cadence import AdaptiveCadence, FixedCadence, make_cadence
from zerobatch_core.stores.range_cache import RangeCache
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.stores.store import (
    LocalStore,
    ObjectNotFoundError,
    RetriesExhaustedError,
    RetryPolicy,
    is_url,
    redact,
    retry_reason,
    split_url,
)


def test_one_of_many_racing_creates_wins(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    wins: list[int] = []

    def race(i: int) -> None:
        if store.create("manifests/1.json", f"writer {i}".encode()):
            wins.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert store.read("manifests/1.json") == f"writer {wins[0]}".encode()
    assert store.list_keys() == ["manifests/1.json"]  # no temporary left behind


def test_transient_failures_are_retried_counted_and_bounded(tmp_path: Path) -> None:
    class Flaky(LocalStore):
        failures = 3

        def _read(self, key: str) -> bytes:
            if Flaky.failures:
                Flaky.failures -= 1
                raise OSError("503 Service Unavailable: SlowDown")
            return super()._read(key)

    store = Flaky(tmp_path, RetryPolicy(attempts=5, base=0.001))
    store.write("a", b"x")
    assert store.read("a") == b"x"
    assert store.stats.retries == 3 and store.stats.retry_reasons == {"SlowDown": 3}
    Flaky.failures = 5
    with pytest.raises(RetriesExhaustedError, match="still failing after 5 attempts"):
        store.read("a")
    with pytest.raises(FileNotFoundError):
        store.read("missing")  # not transient: no retry
    assert store.stats.retries == 3 + 4


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ConnectionResetError("reset"), "connection"),
        (OSError("Server returned non-2xx status code: 503 Service Unavailable"), "503"),
        (OSError("<Code>SlowDown</Code>"), "SlowDown"),
        (OSError("error sending request for url"), "connection"),
        (OSError("Access Denied"), None),
        (ValueError("bad header"), None),
    ],
)
def test_what_is_transient(error: Exception, reason: str | None) -> None:
    assert retry_reason(error) == reason


def test_urls() -> None:
    assert is_url("s3://b/k") and is_url("GS://b") and is_url("file:///x")
    assert not is_url("/tmp/x") and not is_url("ftp://h/x") and not is_url(3)
    assert redact("https://user:secret@host:9000/p?sig=abc") == "https://host:9000/p"
    assert split_url("s3://b/data/f.batch") == ("s3://b/data", "f.batch")
    assert split_url("s3://b") == ("s3://b", "")
    assert split_url("file:///tmp/x/f.batch") == ("/tmp/x", "f.batch")
    with pytest.raises(OSError, match="unknown URL scheme 'ftp'"):
        open_store("ftp://h/x")
    with pytest.raises(ValueError, match="leaves the store"):
        LocalStore("/tmp").path("../etc/passwd")


def test_the_adaptive_cadence_meets_its_budgets() -> None:
    cadence = AdaptiveCadence(conflict_budget=0.1, overhead_budget=0.25, jitter=0.0)
    writers = [f"p-{i}" for i in range(8)]
    cadence.observe(0.05, False, writers, 0.0)
    g, w, n = cadence.gap, cadence.window, cadence.producers
    assert n == 8
    conflict = 1 - math.exp(-(n - 1) * w / (w + g))
    assert conflict == pytest.approx(0.1)  # the binding constraint with 8 producers
    assert w / (w + g) <= 0.25 + 1e-12
    cadence.observe(0.5, False, [], 1.0)  # a slower manifest: a wider gap
    assert cadence.gap > g
    alone = AdaptiveCadence(jitter=0.0)
    alone.observe(0.04, False, ["p-0"], 0.0)
    assert alone.gap == pytest.approx(0.04 / 0.25 - 0.04)  # one producer: overhead binds
    assert FixedCadence(3).due(3, 0.0) and not FixedCadence(3).due(2, 0.0)
    with pytest.raises(ValueError, match="cadence must be"):
        make_cadence("sometimes")


def test_the_range_cache_keeps_its_limit(tmp_path: Path) -> None:
    cache = RangeCache(tmp_path, 1000)
    for i in range(10):
        cache.put("s3://b/k", (i * 300, i * 300 + 300), bytes([i]) * 300)
    assert cache.size <= 1000
    assert cache.get("s3://b/k", (2700, 3000)) == bytes([9]) * 300
    assert cache.get("s3://b/k", (0, 300)) is None  # evicted, least recently used first
    with pytest.raises(ValueError, match="cache_bytes"):
        RangeCache(tmp_path, -1)


def test_a_directory_store_rooted_at_a_file_holds_no_objects(tmp_path: Path) -> None:
    # A URL naming one file opens a store there first, to look for a live descriptor or a
    # manifest below it: a key below a file is a missing object, as on object storage.
    (tmp_path / "f.batch").write_bytes(b"x")
    store = LocalStore(tmp_path / "f.batch")
    assert not store.exists("live.json") and not store.exists("a/manifest.json")
    with pytest.raises(ObjectNotFoundError, match="no such object"):
        store.read("manifest.json")
    with pytest.raises(ObjectNotFoundError):
        store.read_ranges("manifest.json", [(0, 1)])


def test_a_file_url_of_one_file_opens_it(tmp_path: Path) -> None:
    write_batch_file(tmp_path / "f.batch", records(40, 8), 4, seed=1)
    local = [item.copy() for item in BatchNativeLoader(tmp_path / "f.batch", seed=2)]
    loader = BatchNativeLoader(f"file://{tmp_path / 'f.batch'}", seed=2)
    remote = list(loader)
    assert len(remote) == len(local) == 10
    assert all((a == b).all() for a, b in zip(remote, local, strict=True))
    loader.source.close()
