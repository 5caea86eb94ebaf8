"""Object-store reads: retry decisions by HTTP status, the range cache shared by datasets with
the same object names, and corrupted slots that raise on every read in every verify mode.

The statuses come from a real HTTP proxy in front of the moto server (``tests/s3server.py``)
that answers chosen requests with a chosen status and an S3 error body, so the object-store
client parses a real response; nothing in the client is replaced. README ("Retries"):
throttling (``SlowDown``, 429, 500, 502, 503, 504), timeouts and dropped connections are
retried; other errors (permission, a missing object, a bad request) are not, and name the
object.
"""

from __future__ import annotations

import secrets
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec import HEADER_SIZE, padded_batch_bytes

from tests.helpers import records
from tests.remote.conftest import upload
from tests.s3server import S3Proxy, S3Server, environment
from zerobatch_core import BatchNativeLoader, DatasetError
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.datasets.dataset import DatasetReader
from zerobatch_core.datasets.remote import REMOTE_VERIFY_MODES, RemoteSource
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.stores.store import RetriesExhaustedError, RetryPolicy, StoreError

B, T = 8, 16
REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
RETRIED = (429, 500, 502, 503, 504)
NOT_RETRIED = (400, 401, 403, 404, 501)


class StatusProxy(S3Proxy):
    """A counting proxy that answers the next ``times`` requests of one method (GET by
    default) to keys containing ``target`` with ``status`` and an S3 XML error body, and
    forwards everything else."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.status, self.times, self.target, self.method = 200, 0, "", "GET"
        self.hits = 0
        """Requests of the method to the target seen (answered with the status or forwarded)."""

    def inject(self, status: int, times: int, target: str, method: str = "GET") -> None:
        """Answer the next ``times`` ``method`` requests of ``target`` with ``status``."""
        with self._lock:
            self.status, self.times, self.target, self.hits = status, times, target, 0
            self.method = method

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        answer = None
        if handler.command == self.method and self.target and self.target in handler.path:
            with self._lock:
                self.hits += 1
                if self.times > 0:
                    self.times -= 1
                    answer = self.status
        if answer is None:
            super().handle(handler)
            return
        length = int(handler.headers.get("Content-Length") or 0)
        if length:
            handler.rfile.read(length)
        self._count(requests=1)
        reason = REASONS[answer]
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{reason.replace(" ", "")}'
            f"</Code><Message>{reason}</Message><RequestId>zb</RequestId></Error>"
        ).encode()
        handler.send_response(answer, reason)
        handler.send_header("Content-Type", "application/xml")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(body)


@pytest.fixture(scope="module")
def _module_proxy(s3_server: S3Server) -> Iterator[StatusProxy]:
    p = StatusProxy(s3_server.endpoint)  # one for the module: stopping one takes half a second
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def status_proxy(_module_proxy: StatusProxy) -> Iterator[StatusProxy]:
    """The status proxy, nothing injected, the S3 environment pointing at it."""
    _module_proxy.inject(200, 0, "")
    with environment(_module_proxy.endpoint):
        yield _module_proxy


def _bucket(endpoint: str) -> str:
    name = f"zb-{secrets.token_hex(6)}"
    request = urllib.request.Request(f"{endpoint}/{name}", method="PUT")
    with urllib.request.urlopen(request, timeout=30):
        pass
    return name


def _dataset(path: Path, seed: int, offset: int = 0) -> Path:
    """A dataset of 10 batches in shards of 5; ``offset`` shifts every token (other contents
    under the same object names and sizes)."""
    write_sharded_dataset(
        path, [records(80, T) + offset], batch_size=B, seq_len=T, shard_batches=5, seed=seed
    )
    return path


FAST = RetryPolicy(attempts=4, base=0.001, cap=0.005)


@pytest.mark.parametrize("status", RETRIED)
def test_throttling_and_server_errors_are_retried(status_proxy: StatusProxy, status: int) -> None:
    store = open_store(f"s3://{_bucket(status_proxy.endpoint)}/d", retry=FAST)
    store.write("obj", b"0123456789" * 10)
    status_proxy.inject(status, 2, "/d/obj")
    assert store.read("obj") == b"0123456789" * 10  # the third attempt
    assert status_proxy.hits == 3
    stats = store.stats.snapshot()
    assert stats["retries"] == 2 and stats["retry_reasons"] == {str(status): 2}
    status_proxy.inject(status, 100, "/d/obj")  # a store that keeps failing: given up, named
    with pytest.raises(RetriesExhaustedError, match=rf"after 4 attempts \({status}\)") as caught:
        store.read_ranges("obj", [(0, 5)])
    assert caught.value.filename == store.where("obj")
    assert status_proxy.hits == FAST.attempts


@pytest.mark.parametrize("status", NOT_RETRIED)
def test_other_statuses_are_not_retried_and_name_the_object(
    status_proxy: StatusProxy, status: int
) -> None:
    store = open_store(f"s3://{_bucket(status_proxy.endpoint)}/d", retry=FAST)
    store.write("obj", b"0123456789" * 10)
    reads = (
        (lambda: store.read("obj"), 1),
        (lambda: store.read_ranges("obj", [(10, 20)]), 1),
        # Two concurrent requests: the client may drop the second once the first fails.
        (lambda: store.read_ranges("obj", [(0, 5), (50, 60)]), 2),
    )
    for read, requests in reads:
        status_proxy.inject(status, 1, "/d/obj")  # one failure only: a retry would succeed
        expected = FileNotFoundError if status == 404 else StoreError
        with pytest.raises(expected) as caught:
            read()
        assert not isinstance(caught.value, RetriesExhaustedError)
        assert str(status) in str(caught.value)
        if status != 404:
            assert caught.value.filename == store.where("obj")
        assert 1 <= status_proxy.hits <= requests  # no retry (one would also succeed)
    assert store.stats.snapshot()["retries"] == 0


@pytest.mark.parametrize("status", [403, 503])
def test_writes_and_sizes_follow_the_same_decisions(status_proxy: StatusProxy, status: int) -> None:
    """PUT (writes, conditional creates) and HEAD (sizes) are retried or not by the same rule."""
    store = open_store(f"s3://{_bucket(status_proxy.endpoint)}/d", retry=FAST)
    retried = status in RETRIED
    status_proxy.inject(status, 1, "/d/obj", method="PUT")
    if retried:
        store.write("obj", b"abc")
        assert store.read("obj") == b"abc"
    else:
        with pytest.raises(StoreError, match=str(status)) as caught:
            store.write("obj", b"abc")
        assert not isinstance(caught.value, RetriesExhaustedError)
        assert not store.exists("obj")  # nothing written
    assert status_proxy.hits == (2 if retried else 1)
    status_proxy.inject(status, 1, "/d/new", method="PUT")
    if retried:
        assert store.create("new", b"xyz") is True  # the retried create is this call's own
        assert store.create("new", b"xyz") is False  # the key is taken now: not retried
    else:
        with pytest.raises(StoreError):
            store.create("new", b"xyz")
    store.write("obj", b"abc")
    status_proxy.inject(status, 1, "/d/obj", method="HEAD")
    if retried:
        assert store.size("obj") == 3
    else:
        with pytest.raises(StoreError, match="obj") as caught:
            store.size("obj")
        assert not isinstance(caught.value, RetriesExhaustedError)
    assert status_proxy.hits == (2 if retried else 1)
    assert store.stats.snapshot()["retries"] == (3 if retried else 0)


@pytest.mark.parametrize("status", [403, 503])
def test_a_remote_dataset_retries_what_it_should_and_serves_the_local_tokens(
    tmp_path: Path, status_proxy: StatusProxy, status: int
) -> None:
    local = _dataset(tmp_path / "ds", seed=3)
    url = f"s3://{_bucket(status_proxy.endpoint)}/ds"
    upload(local, url)
    with DatasetReader(local) as reader, RemoteSource(url) as source:
        source.store.retry = FAST
        assert np.array_equal(source.read_batch(5), reader.read_batch(5))  # shard 1 checked
        status_proxy.inject(status, 1, "/ds/shard-00001.batch")
        if status in RETRIED:
            assert np.array_equal(source.read_batch(7), reader.read_batch(7))
            assert source.store.stats.retries == 1
        else:
            with pytest.raises(StoreError, match=r"shard-00001\.batch") as caught:
                source.read_batch(7)
            assert not isinstance(caught.value, RetriesExhaustedError)
            assert source.store.stats.retries == 0
        assert status_proxy.hits == (2 if status in RETRIED else 1)


# -- one cache directory, several datasets with the same object names -------------------------


@pytest.fixture(scope="module")
def second_server() -> Iterator[S3Server]:
    """Another S3-compatible service: the same bucket and key names can hold other bytes."""
    server = S3Server()
    try:
        yield server
    finally:
        server.stop()


def _read_all(source: RemoteSource, rows: tuple[int, int] | None) -> list[np.ndarray]:
    r0, r1 = rows if rows is not None else (0, B)
    return [np.array(source.read_region(i, r0, r1, 0, T)) for i in range(source.num_batches)]


def _local_all(path: Path, rows: tuple[int, int] | None) -> list[np.ndarray]:
    r0, r1 = rows if rows is not None else (0, B)
    with DatasetReader(path) as reader:
        return [np.array(reader.read_batch(i)[r0:r1]) for i in range(len(reader))]


@pytest.mark.parametrize("rows", [None, (4, 8)])
@pytest.mark.parametrize("verify", ["off", "whole"])
def test_same_keys_under_other_prefixes_and_buckets_share_a_cache_and_keep_their_tokens(
    tmp_path: Path, s3_server: S3Server, rows: tuple[int, int] | None, verify: Any
) -> None:
    a, b, c = (_dataset(tmp_path / n, seed=3, offset=k * 1000) for k, n in enumerate("abc"))
    with environment(s3_server.endpoint):
        one, two = _bucket(s3_server.endpoint), _bucket(s3_server.endpoint)
        urls = {a: f"s3://{one}/x/ds", b: f"s3://{one}/y/ds", c: f"s3://{two}/x/ds"}
        for path, url in urls.items():
            upload(path, url)
        cache = str(tmp_path / "cache")
        for _ in range(2):  # the second round is served from the cache
            for path, url in urls.items():
                with RemoteSource(url, verify=verify, cache_dir=cache, cache_bytes=1 << 22) as s:
                    got = _read_all(s, rows)
                want = _local_all(path, rows)
                assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), url


@pytest.mark.parametrize("verify", ["off", "whole"])
def test_the_same_url_on_two_endpoints_through_one_cache(
    tmp_path: Path, s3_server: S3Server, second_server: S3Server, verify: Any
) -> None:
    """``s3://bucket/ds`` on two services (two endpoints: a local MinIO and AWS, two regions
    of a provider) names two datasets; one cache directory must not serve one for the other."""
    a, b = _dataset(tmp_path / "a", seed=3), _dataset(tmp_path / "b", seed=3, offset=5000)
    name = f"zb-{secrets.token_hex(6)}"
    for server, path in ((s3_server, a), (second_server, b)):
        server.create_bucket(name)
        with environment(server.endpoint):
            upload(path, f"s3://{name}/ds")
    cache = str(tmp_path / "cache")
    with environment(s3_server.endpoint):
        for _ in range(2):
            for server, path in ((s3_server, a), (second_server, b)):
                with RemoteSource(
                    f"s3://{name}/ds",
                    verify=verify,
                    cache_dir=cache,
                    cache_bytes=1 << 22,
                    store_options={"endpoint": server.endpoint},
                ) as source:
                    got = _read_all(source, (0, B // 2))
                want = _local_all(path, (0, B // 2))
                same = all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
                assert same, f"{server.endpoint}: served another endpoint's cached tokens"


def test_a_dataset_rewritten_at_the_same_url_is_not_served_from_the_old_cache(
    tmp_path: Path, bucket: str
) -> None:
    """A dataset overwritten in place (``convert --overwrite`` to the same prefix) has shards
    of the same names and sizes and other bytes; a cache kept from the old one must not serve
    them (its manifest, headers and checksums say which bytes belong to it)."""
    old, new = _dataset(tmp_path / "old", seed=3), _dataset(tmp_path / "new", seed=4, offset=7)
    url = f"s3://{bucket}/ds"
    cache = str(tmp_path / "cache")
    upload(old, url)
    with RemoteSource(url, verify="off", cache_dir=cache, cache_bytes=1 << 22) as source:
        assert all(
            np.array_equal(g, w)
            for g, w in zip(_read_all(source, (0, 4)), _local_all(old, (0, 4)), strict=True)
        )
    upload(new, url)
    for verify in ("off", "whole", "first"):
        with RemoteSource(url, verify=verify, cache_dir=cache, cache_bytes=1 << 22) as source:
            got = _read_all(source, (0, 4))
        want = _local_all(new, (0, 4))
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), verify


# -- a corrupted slot raises on every read ---------------------------------------------------


def _corrupt(url: str, slot: int, row: int) -> None:
    store = open_store(url)
    data = bytearray(store.read("shard-00000.batch"))
    data[HEADER_SIZE + slot * padded_batch_bytes(B, T) + row * T * 4 + 2] ^= 0x5A
    store.write("shard-00000.batch", bytes(data))


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("verify", [m for m in REMOTE_VERIFY_MODES if m != "off"])
def test_a_corrupted_slot_raises_on_every_read_in_every_checking_mode(
    tmp_path: Path, bucket: str, verify: Any, cached: bool
) -> None:
    local = _dataset(tmp_path / "ds", seed=3)
    url = f"s3://{bucket}/ds"
    upload(local, url)
    _corrupt(url, 3, row=1)
    options: dict[str, Any] = {"verify": verify}
    if cached:
        options.update(cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 22)
    with DatasetReader(local) as reader, RemoteSource(url, **options) as source:
        for _ in range(3):
            with pytest.raises(DatasetError, match=r"checksum_mismatch.*slot 3"):
                source.read_batch(3)  # a whole slot: checked in every mode
            if verify != "whole":  # these modes check before serving part of a slot too
                with pytest.raises(DatasetError, match="checksum_mismatch"):
                    source.read_region(3, 0, 4, 0, T)
                with pytest.raises(DatasetError, match="checksum_mismatch"):
                    source.read_region(3, 4, 8, 8, 16)
            for i in (2, 4):  # the neighbours are served exactly
                assert np.array_equal(source.read_batch(i), reader.read_batch(i))
                assert np.array_equal(source.read_region(i, 4, 8, 0, T), reader.read_batch(i)[4:])


def test_off_serves_the_stored_bytes_of_a_corrupted_slot(tmp_path: Path, bucket: str) -> None:
    local = _dataset(tmp_path / "ds", seed=3)
    url = f"s3://{bucket}/ds"
    upload(local, url)
    _corrupt(url, 3, row=1)
    with DatasetReader(local) as reader, RemoteSource(url, verify="off") as source:
        served = np.array(source.read_batch(3))
        good = reader.read_batch(3)
        assert not np.array_equal(served[1], good[1])  # unchecked: the stored bytes
        assert np.array_equal(np.delete(served, 1, 0), np.delete(good, 1, 0))


@pytest.mark.parametrize("verify", ["whole", "first", "always"])
def test_a_remote_loader_never_serves_a_corrupted_slot_on_a_later_pass(
    tmp_path: Path, bucket: str, verify: Any
) -> None:
    """Through the loader and its prefetching: the failed fetch is not kept as served, and a
    pass restarted at the failed step (or restored from a state) fails there again."""
    local = _dataset(tmp_path / "ds", seed=3)
    url = f"s3://{bucket}/ds"
    upload(local, url)
    _corrupt(url, 3, row=0)
    expected = [np.array(x) for x in BatchNativeLoader(local, shuffle=False)]
    loader = BatchNativeLoader(url, shuffle=False, verify=verify)
    state = loader.state_dict()
    for _ in range(3):
        for run in (loader, BatchNativeLoader(url, shuffle=False, verify=verify)):
            if run is not loader:
                run.load_state_dict(state)
            start = run.step
            served: list[np.ndarray] = []
            with pytest.raises(DatasetError, match="checksum_mismatch"):
                for item in run:
                    served.append(np.array(item))
            assert start + len(served) <= 3
            assert all(np.array_equal(g, w) for g, w in zip(served, expected[start:], strict=False))
            if run is not loader:
                run.source.close()
        state = loader.state_dict()
    loader.source.close()
