"""Tests written to kill surviving mutants of the object-store modules (object_stores.py,
remote.py), against the real S3-compatible server the remote tests start: each pins a
behaviour the other tests left open."""

from __future__ import annotations

import errno
import secrets
import sys
import threading
import time
import urllib.parse
from collections.abc import Generator, Iterator, Sequence
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from zerobatch_spec import HEADER_SIZE, padded_batch_bytes

from tests.helpers import records, require
from tests.remote.conftest import upload
from tests.s3server import S3Proxy, S3Server, environment
from zerobatch_core import (
    BatchFileReader,
    BatchNativeLoader,
    DatasetError,
    DatasetReader,
    write_batch_file,
)
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.datasets.remote import (
    FIRST_AHEAD,
    MAX_AHEAD,
    REMOTE_VERIFY_MODES,
    RemoteSource,
)
from zerobatch_core.errors import FormatError, MissingDependencyError
from zerobatch_core.stores.object_stores import FsspecStore, ObstoreStore
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.stores.store import LocalStore, StoreError

# -- listings past keys the client cannot hold -----------------------------------------------


def _obstore(url: str) -> ObstoreStore:
    store = open_store(url)
    assert isinstance(store, ObstoreStore)
    return store


def _put_raw(s3_server: S3Server, bucket: str, keys: list[str]) -> None:
    """Objects under names no ZeroBatch writer makes (``.``, ``..`` or empty segments), put
    with another S3 client, as a person or a tool could."""
    boto3 = require("boto3")
    client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=b"odd")


class ListingProxy(S3Proxy):
    """A proxy that answers listings the way other S3-compatible servers do: ``page`` keys a
    page (``max-keys``) instead of 1000, and, if ``ignore_start_after``, from the first key
    whatever ``start-after`` says."""

    def __init__(
        self, upstream: str, *, page: int | None = None, ignore_start_after: bool = False
    ) -> None:
        super().__init__(upstream)
        self.page, self.ignore_start_after = page, ignore_start_after

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        split = urllib.parse.urlsplit(handler.path)
        query = urllib.parse.parse_qsl(split.query, keep_blank_values=True)
        if handler.command == "GET" and ("list-type", "2") in query:
            if self.ignore_start_after:
                query = [(k, v) for k, v in query if k != "start-after"]
            if self.page is not None:
                query.append(("max-keys", str(self.page)))
            handler.path = urllib.parse.urlunsplit(
                split._replace(query=urllib.parse.urlencode(query))
            )
        super().handle(handler)


@pytest.fixture
def listing_proxy(s3_server: S3Server, request: pytest.FixtureRequest) -> Iterator[ListingProxy]:
    """A ``ListingProxy`` (keyword arguments from ``request.param``), the S3 environment
    pointing at it."""
    p = ListingProxy(s3_server.endpoint, **getattr(request, "param", {}))
    try:
        with environment(p.endpoint):
            yield p
    finally:
        p.stop()


ODD = ["d/./f", "d//e", "d/b/../x", "d/b/../z"]
GOOD = ["d/b/y", "d/c", "d/g"]


@pytest.mark.parametrize("root", ["d", ""])
def test_a_listing_steps_past_keys_with_dot_or_empty_segments_and_names_them(
    s3_server: S3Server, bucket: str, root: str
) -> None:
    """A listing steps past each key with a ``.``, ``..`` or empty segment, and past every key
    that shares that segment, and goes on with the keys after them; ``unlisted`` names the
    first key of each bad segment (relative to the store's root), at the root of a bucket or
    below a prefix. (The good keys here all sort after the bad ones: a good key that shares
    a failing listing page with a bad one and sorts before it is lost with it.)"""
    _put_raw(s3_server, bucket, ODD + GOOD)
    store = _obstore(f"s3://{bucket}/{root}")
    strip = len(root) + 1 if root else 0  # keys are relative to the store's root
    assert store.list_keys() == [k[strip:] for k in GOOD]
    assert store.unlisted == {k[strip:] for k in ("d/./f", "d//e", "d/b/../x")}
    assert store.list_keys("d/b/"[strip:]) == ["d/b/y"[strip:]]


def test_a_listing_fails_on_a_bad_last_segment_and_says_which_key(
    s3_server: S3Server, bucket: str
) -> None:
    """A ``..`` that ends a key shares its segment with no other key: there is nothing to
    step past, so the listing fails naming the key."""
    _put_raw(s3_server, bucket, ["d/c/..", "d/g"])
    store = open_store(f"s3://{bucket}/d")
    with pytest.raises(StoreError, match=r'list failed: .*Path "d/c/\.\."'):
        store.list_keys()
    assert store.list_keys("g/") == []  # a prefix that leaves the bad key out lists fine


def test_a_listing_below_a_prefix_does_not_meet_bad_keys_outside_it(
    s3_server: S3Server, bucket: str
) -> None:
    _put_raw(s3_server, bucket, ["d/c/1", "d/c/2", "d/z/.."])
    store = _obstore(f"s3://{bucket}/d")
    assert store.list_keys("c/") == ["c/1", "c/2"]
    assert store.unlisted == set()


@pytest.mark.parametrize("listing_proxy", [{"page": 1}], indirect=True)
def test_keys_of_the_pages_before_a_bad_key_are_all_listed(
    s3_server: S3Server, listing_proxy: ListingProxy
) -> None:
    """With pages smaller than the listing (one key a page here), a page that fails loses
    none of the keys the pages before it listed."""
    name = f"zb-{secrets.token_hex(6)}"
    s3_server.create_bucket(name)
    good = [f"d/g{i}" for i in range(5)]
    _put_raw(s3_server, name, [*good, "d/k/../x", "d/m"])
    store = _obstore(f"s3://{name}/d")
    assert store.list_keys() == [k[2:] for k in (*good, "d/m")]
    assert store.unlisted == {"k/../x"}
    assert listing_proxy.counts["gets"] >= 7  # one key a page: the proxy shaped the listing


@pytest.mark.parametrize("listing_proxy", [{"ignore_start_after": True}], indirect=True)
def test_a_server_that_ignores_start_after_makes_the_listing_fail_not_loop(
    s3_server: S3Server, listing_proxy: ListingProxy
) -> None:
    """Listed again from past a bad key, such a server answers the same key again: the
    listing fails instead of asking forever."""
    name = f"zb-{secrets.token_hex(6)}"
    s3_server.create_bucket(name)
    _put_raw(s3_server, name, ["d/./f", "d/g"])
    store = open_store(f"s3://{name}/d")
    with pytest.raises(StoreError, match=r'list failed: .*Path "d/\./f"'):
        store.list_keys()
    assert listing_proxy.counts["gets"] == 2


# -- opening an object store ------------------------------------------------------------------


def test_a_missing_obstore_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "obstore", None)  # what Python does when it is absent
    with pytest.raises(MissingDependencyError, match=r"zerobatch\[remote\]") as caught:
        open_store("s3://bucket/ds")
    assert caught.value.extra == "remote"


def test_an_unknown_option_fails_with_the_clients_first_line(bucket: str) -> None:
    with pytest.raises(StoreError) as caught:
        open_store(f"s3://{bucket}/d", options={"not_an_option": "1"})
    assert caught.value.errno == errno.EINVAL
    assert caught.value.strerror == (
        "cannot open the store: Configuration key: 'not_an_option' is not valid for store 'S3'."
    )
    assert caught.value.filename == f"s3://{bucket}/d"


@pytest.mark.parametrize("given", ["environment", "options"])
def test_an_http_endpoint_is_allowed_without_tls(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    """README: a local S3-compatible server at an ``http://`` endpoint works as it is, from
    ``AWS_ENDPOINT_URL`` or from the store options, without ``AWS_ALLOW_HTTP``."""
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    options = None
    if given == "options":
        monkeypatch.delenv("AWS_ENDPOINT_URL")
        options = {"endpoint": s3_server.endpoint}
    store = open_store(f"s3://{bucket}/d", options=options)
    store.write("obj", b"payload")
    assert store.read("obj") == b"payload"


# -- ObstoreStore reads and conditional creates ---------------------------------------------


def test_obstore_range_reads_and_heads_serve_the_requested_bytes(bucket: str) -> None:
    store = _obstore(f"s3://{bucket}/d")
    data = bytes(range(100))
    store.write("obj", data)
    assert store.read_ranges("obj", [(10, 20)]) == [data[10:20]]
    assert store.read_ranges("obj", [(0, 5), (50, 60), (90, 100)]) == [
        data[0:5],
        data[50:60],
        data[90:100],
    ]
    assert store.read_head("obj", 8) == (data[:8], 100)
    assert store.read_head("obj", 500) == (data, 100)  # a short object: all of it


def test_obstore_create_takes_a_free_key_once(bucket: str) -> None:
    """``create`` is ``If-None-Match: *``: the first call takes the key, the second finds it
    taken and leaves the first bytes in place."""
    store = _obstore(f"s3://{bucket}/d")
    assert store.create("m/1.json", b"first") is True
    assert store.create("m/1.json", b"second") is False
    assert store.read("m/1.json") == b"first"


# -- FsspecStore over fsspec's own filesystems --------------------------------------------


def _memory_root() -> str:
    return f"/zb-{secrets.token_hex(6)}/ds"


def test_an_fsspec_store_is_named_by_the_filesystems_protocol(tmp_path: Path) -> None:
    fsspec = require("fsspec")
    root = _memory_root()
    assert FsspecStore(fsspec.filesystem("memory"), root + "/").url == f"memory:/{root}"
    local = FsspecStore(fsspec.filesystem("file"), str(tmp_path))  # protocol ("file", "local")
    assert local.url == f"file:/{tmp_path}"
    assert local.where("a/b") == f"file:/{tmp_path}/a/b"


def test_fsspec_range_reads_serve_each_range_and_a_missing_object_is_not_found() -> None:
    fsspec = require("fsspec")
    store = FsspecStore(fsspec.filesystem("memory"), _memory_root())
    store.write("obj", b"0123456789")
    assert store.read_ranges("obj", [(0, 3), (5, 9)]) == [b"012", b"5678"]
    assert store.read("obj") == b"0123456789"
    with pytest.raises(FileNotFoundError):
        store.read_ranges("missing", [(0, 3), (5, 9)])


@pytest.mark.parametrize("op", ["write", "create"])
def test_fsspec_writes_make_the_parent_directories_on_a_local_filesystem(
    tmp_path: Path, op: str
) -> None:
    fsspec = require("fsspec")
    store = FsspecStore(fsspec.filesystem("file"), str(tmp_path / "root"))
    if op == "write":
        store.write("x/y/z.bin", b"data")
    else:
        assert store.create("x/y/z.bin", b"data") is True
    assert (tmp_path / "root" / "x" / "y" / "z.bin").read_bytes() == b"data"
    store.write("x/y/w.bin", b"more")  # into a directory that exists now
    assert (tmp_path / "root" / "x" / "y" / "w.bin").read_bytes() == b"more"


def test_fsspec_create_takes_a_free_key_once() -> None:
    fsspec = require("fsspec")
    store = FsspecStore(fsspec.filesystem("memory"), _memory_root())
    assert store.create("m/1.json", b"first") is True
    assert store.create("m/1.json", b"second") is False
    assert store.read("m/1.json") == b"first"


class TakenKeyError(Exception):
    """How a cloud filesystem's client reports a conditional create of a taken key."""


def _blob_filesystem(message: str) -> Any:
    """A memory filesystem whose conditional create of a taken key fails as a cloud
    filesystem's does: its client's own exception, carrying the service's words."""
    require("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem  # type: ignore[import-untyped]

    class BlobMemoryFileSystem(MemoryFileSystem):  # type: ignore[misc]
        def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kw: Any) -> Any:
            if mode == "create" and self.exists(path):
                raise TakenKeyError(message)
            return super().pipe_file(path, value, **kw)

    return BlobMemoryFileSystem()


@pytest.mark.parametrize(
    "message",
    [
        "An error occurred (PreconditionFailed) when calling the PutObject operation: At least "
        "one of the pre-conditions you specified did not hold",  # S3
        "At least one of the pre-conditions you specified did not hold., 412",  # GCS
        "The specified blob already exists.\nErrorCode:BlobAlreadyExists",  # Azure
    ],
)
def test_fsspec_create_reads_a_cloud_clients_taken_key_as_taken(message: str) -> None:
    store = FsspecStore(_blob_filesystem(message), _memory_root())
    assert store.create("live.json", b"first") is True
    assert store.create("live.json", b"second") is False
    assert store.read("live.json") == b"first"


def test_fsspec_create_raises_a_clients_other_errors() -> None:
    store = FsspecStore(_blob_filesystem("AuthorizationFailure"), _memory_root())
    store.create("live.json", b"first")
    with pytest.raises(StoreError, match="AuthorizationFailure"):
        store.create("live.json", b"second")


def test_fsspec_listing_filters_by_prefix_below_the_root() -> None:
    fsspec = require("fsspec")
    root = _memory_root()
    fs = fsspec.filesystem("memory")
    store = FsspecStore(fs, root)
    for key in ("a/1", "a/2", "b/1"):
        store.write(key, b"x")
    fs.pipe_file(root + "-sibling/a/9", b"x")  # beside the root, not below it
    assert store.list_keys() == ["a/1", "a/2", "b/1"]
    assert store.list_keys("a/") == ["a/1", "a/2"]
    assert FsspecStore(fs, root + "/nothing-here").list_keys() == []


def test_fsspec_listing_of_a_root_its_filesystem_says_is_missing_is_empty() -> None:
    """Some filesystems' ``find`` raises ``FileNotFoundError`` for a root that does not exist
    (s3fs for a missing bucket) where fsspec's own return nothing: both list no keys."""
    require("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    class BucketMemoryFileSystem(MemoryFileSystem):  # type: ignore[misc]
        def find(self, path: str, *args: Any, **kw: Any) -> Any:
            if not self.exists(path):
                raise FileNotFoundError(path)
            return super().find(path, *args, **kw)

    fs = BucketMemoryFileSystem()
    root = _memory_root()
    assert FsspecStore(fs, root).list_keys() == []
    FsspecStore(fs, root).write("a", b"x")
    assert FsspecStore(fs, root).list_keys() == ["a"]


# -- ranged reads: exactly the ranges asked for ------------------------------------------------


def test_ranges_a_byte_apart_are_fetched_apart_unless_coalescing_is_asked_for(
    s3_server: S3Server, proxy: S3Proxy
) -> None:
    """``read_ranges`` without ``coalesce`` fetches exactly the ranges: two ranges one byte
    apart are two requests, and the byte between them is not fetched; ``coalesce=1`` makes
    them one request."""
    name = f"zb-{secrets.token_hex(6)}"
    s3_server.create_bucket(name)
    store = open_store(f"s3://{name}/d")
    store.write("k", bytes(range(16)))
    proxy.reset()
    assert store.read_ranges("k", [(0, 4), (5, 8)]) == [bytes(range(4)), bytes(range(5, 8))]
    assert (proxy.counts["gets"], proxy.counts["get_bytes"]) == (2, 7)
    proxy.reset()
    assert store.read_ranges("k", [(0, 4), (5, 8)], coalesce=1) == [
        bytes(range(4)),
        bytes(range(5, 8)),
    ]
    assert (proxy.counts["gets"], proxy.counts["get_bytes"]) == (1, 8)


# -- RemoteSource (remote.py): what a remote source serves, against the local loader's tokens --

RB, RT = 8, 16
"""Records per stored batch and tokens per record of the remote-source datasets below."""
RSLOT = padded_batch_bytes(RB, RT)


def _remote_dataset(tmp_path: Path) -> Path:
    """A dataset of 10 stored batches in two shards of 5 (every row unique)."""
    out = tmp_path / "ds"
    write_sharded_dataset(
        out, [records(10 * RB, RT)], batch_size=RB, seq_len=RT, shard_batches=5, seed=3
    )
    return out


@pytest.fixture
def remote_ds(tmp_path: Path, bucket: str) -> tuple[Path, str]:
    """A local dataset and its copy in the bucket."""
    local = _remote_dataset(tmp_path)
    url = f"s3://{bucket}/ds"
    upload(local, url)
    return local, url


def _served(loader: BatchNativeLoader, steps: int) -> list[np.ndarray]:
    """``steps`` items from the loader, across epoch ends, as host copies."""
    out: list[np.ndarray] = []
    while len(out) < steps:
        for item in loader:
            out.append(np.array(item))
            if len(out) == steps:
                break
    return out


def _corrupt_slot(url: str, slot: int, row: int) -> bytes:
    """Flip a byte in row ``row`` of dataset slot ``slot`` (shards of 5 slots); the shard's
    bytes before the change are returned, to repair it."""
    store = open_store(url)
    name = f"shard-{slot // 5:05d}.batch"
    good = store.read(name)
    data = bytearray(good)
    data[HEADER_SIZE + slot % 5 * RSLOT + row * RT * 4 + 3] ^= 0xFF
    store.write(name, bytes(data))
    return good


@pytest.mark.parametrize("verify", REMOTE_VERIFY_MODES)
@pytest.mark.parametrize(
    ("dp", "cp", "gbs", "ranks"),
    [(1, 1, RB, [(0, 0)]), (1, 1, RB // 2, [(0, 0)]), (2, 2, RB, [(0, 1), (1, 0)])],
)
def test_every_verify_mode_serves_the_local_tokens_over_two_epochs(
    remote_ds: tuple[Path, str], verify: Any, dp: int, cp: int, gbs: int, ranks: list[Any]
) -> None:
    """Ranks, in every verification mode, serve the local loader's tokens for two epochs and
    a step: whole slots, rows of one slot over consecutive steps, and rows and chunks shared
    by ``D x C`` ranks."""
    local, url = remote_ds
    for rank, c in ranks:
        kw: dict[str, Any] = {
            "rank": rank,
            "world_size": dp,
            "context_rank": c,
            "context_size": cp,
            "global_batch_size": gbs,
            "seed": 5,
            "block_size": 2,
        }
        n = len(BatchNativeLoader(local, **kw))
        expected = _served(BatchNativeLoader(local, **kw), 2 * n + 1)
        remote = BatchNativeLoader(url, verify=verify, **kw)
        got = _served(remote, 2 * n + 1)
        assert len(got) == len(expected)
        assert all(np.array_equal(g, w) for g, w in zip(got, expected, strict=True))
        remote.source.close()


@pytest.mark.parametrize("verify", REMOTE_VERIFY_MODES)
def test_a_remote_file_read_in_steps_smaller_than_a_batch_serves_the_local_tokens(
    tmp_path: Path, bucket: str, verify: Any
) -> None:
    """A single file carries no checksums: one rank reading each stored batch over two steps
    is served the rows as ranges, in every mode, the local loader's tokens."""
    path = tmp_path / "f.batch"
    write_batch_file(path, records(6 * RB, RT), RB, seed=4)
    url = f"s3://{bucket}/files/f.batch"
    upload(path, url)
    kw: dict[str, Any] = {"global_batch_size": RB // 2, "block_size": 2}
    n = len(BatchNativeLoader(path, **kw))
    expected = _served(BatchNativeLoader(path, **kw), n + 2)
    remote = BatchNativeLoader(url, verify=verify, **kw)
    got = _served(remote, n + 2)
    assert isinstance(remote.source, RemoteSource) and remote.source.whole_rows
    assert all(np.array_equal(g, w) for g, w in zip(got, expected, strict=True))
    remote.source.close()


def test_a_remote_file_reads_its_header_once(tmp_path: Path, bucket: str) -> None:
    """A single file's header is read and checked when it is opened; reading its batches
    then fetches only their bytes (one request a batch)."""
    path = tmp_path / "f.batch"
    write_batch_file(path, records(3 * RB, RT), RB, seed=4)
    url = f"s3://{bucket}/files/f.batch"
    upload(path, url)
    with RemoteSource(url) as source:
        before = source.store.stats.requests
        for i in range(3):
            source.read_batch(i)
        assert source.store.stats.requests - before == 3


def test_a_slot_that_failed_its_check_is_fetched_again_at_every_read(
    remote_ds: tuple[Path, str],
) -> None:
    """One rank reading rows of a slot under ``whole``: a corrupted slot raises at every read
    (each read fetches it again, nothing failed is kept), and once the object is repaired the
    next read serves the stored tokens."""
    local, url = remote_ds
    good = _corrupt_slot(url, 2, row=1)
    with RemoteSource(url) as source, DatasetReader(local) as reader:
        source.whole_rows = True
        for _ in range(3):
            before = source.store.stats.requests
            with pytest.raises(DatasetError, match=r"checksum_mismatch.*slot 2"):
                source.read_region(2, 0, RB // 2, 0, RT)
            assert source.store.stats.requests > before  # fetched again, not a kept failure
        open_store(url).write("shard-00000.batch", good)
        assert np.array_equal(source.read_region(2, RB // 2, RB, 0, RT), reader.read_batch(2)[4:])


@pytest.mark.parametrize(("prefetch", "kept"), [(-5, 2), (0, 2), (RSLOT, 3), (2 * RSLOT, 4)])
def test_slots_read_row_by_row_are_kept_up_to_the_prefetch_window(
    remote_ds: tuple[Path, str], prefetch: int, kept: int
) -> None:
    """Under ``whole`` with ``whole_rows``, a slot fetched whole serves its other rows without
    a request while it is among the ``2 + prefetch_bytes // slot`` slots read last; one read
    before those is fetched again. The rows served are the stored ones either way."""
    local, url = remote_ds
    with RemoteSource(url, prefetch_bytes=prefetch) as source, DatasetReader(local) as reader:
        source.whole_rows = True

        def rows(index: int, r0: int) -> int:
            before = source.store.stats.requests
            got = source.read_region(index, r0, r0 + 2, 0, RT)
            assert np.array_equal(got, reader.read_batch(index)[r0 : r0 + 2])
            return source.store.stats.requests - before

        for i in range(kept):
            rows(i, 0)  # slot i fetched whole and kept (slot 0 also gets the shard's header)
        assert rows(0, 2) == 0  # slot 0 used last now: slot 1 is the oldest
        assert rows(kept, 0) == 1  # one more: slot 1 goes
        assert rows(0, 4) == 0
        assert [rows(i, 6) for i in range(2, kept)] == [0] * (kept - 2)
        assert rows(1, 6) == 1  # fetched again


def test_bytes_read_counts_the_tokens_served(remote_ds: tuple[Path, str]) -> None:
    _, url = remote_ds
    with RemoteSource(url) as source:
        assert source.bytes_read == 0
        source.read_batch(1)
        source.read_region(2, 1, 3, 4, 12)
        assert source.bytes_read == (RB * RT + 2 * 8) * 4


EDGE_REGIONS = [
    (0, 0, 0, 0),
    (RB, RB, RT, RT),
    (3, 4, 0, RT),
    (0, RB, 5, 6),
    (RB - 1, RB, RT - 1, RT),
    (2, 6, 4, 12),
    (0, 4, 0, RT),
    (0, RB, 0, RT),
    (1, 3, 1, RT),
    (1, 3, 0, RT - 1),
]
"""Rows ``r0..r1``, columns ``lo..hi``: none, one, part or all of a slot's rows and columns."""


@pytest.mark.parametrize("whole_rows", [False, True])
@pytest.mark.parametrize("verify", REMOTE_VERIFY_MODES)
def test_regions_of_a_slot_serve_the_local_tokens(
    remote_ds: tuple[Path, str], verify: Any, whole_rows: bool
) -> None:
    """Any region of a slot, from none of its rows to all of it, reaching its last row or
    column or not, is the local slot's region, shaped ``(r1 - r0, hi - lo)``: in every
    verification mode, and whether or not the source reads whole rows of each slot."""
    local, url = remote_ds
    with RemoteSource(url, verify=verify) as source, DatasetReader(local) as reader:
        source.whole_rows = whole_rows
        for r0, r1, lo, hi in EDGE_REGIONS:
            got = source.read_region(7, r0, r1, lo, hi)
            assert got.shape == (r1 - r0, hi - lo)
            assert np.array_equal(got, reader.read_batch(7)[r0:r1, lo:hi]), (r0, r1, lo, hi)


@pytest.mark.parametrize(
    "region",
    [
        (-1, 2, 0, RT),
        (0, RB + 1, 0, RT),
        (3, 2, 0, RT),
        (0, 2, -1, RT),
        (0, 2, 0, RT + 1),
        (0, 2, 5, 4),
    ],
)
def test_a_region_outside_a_slot_is_refused(
    remote_ds: tuple[Path, str], region: tuple[int, int, int, int]
) -> None:
    _, url = remote_ds
    with RemoteSource(url) as source, pytest.raises(IndexError, match="region rows"):
        source.read_region(1, *region)


@pytest.mark.parametrize("index", [-1, 10, 11])
def test_a_slot_past_the_dataset_is_out_of_range(remote_ds: tuple[Path, str], index: int) -> None:
    _, url = remote_ds
    with RemoteSource(url) as source, pytest.raises(IndexError, match="out of range for 10"):
        source.read_batch(index)


def test_a_closed_source_refuses_reads(remote_ds: tuple[Path, str]) -> None:
    _, url = remote_ds
    source = RemoteSource(url)
    states = [source.closed]
    source.read_batch(0)
    source.close()
    states.append(source.closed)
    source.close()  # a second close does nothing
    states.append(source.closed)
    assert states == [False, True, True]
    with pytest.raises(ValueError, match="reader is closed"):
        source.read_batch(0)


@pytest.mark.parametrize("value", [True, "64", 1.5])
def test_prefetch_bytes_must_be_an_integer(remote_ds: tuple[Path, str], value: Any) -> None:
    _, url = remote_ds
    with pytest.raises(ValueError, match="prefetch_bytes must be an integer"):
        RemoteSource(url, prefetch_bytes=value)


def test_deep_validation_reports_every_corrupted_slot_and_a_tampered_checksums_file(
    remote_ds: tuple[Path, str],
) -> None:
    """``validate(deep=True)`` reports the first and the last slot of each shard, in every
    shard; a ``checksums.xxh3`` of the right length whose digest is not the manifest's
    fails as ``checksums_mismatch``, before any slot is served."""
    _, url = remote_ds
    for slot, row in ((0, 0), (4, 7), (9, 3)):
        _corrupt_slot(url, slot, row)
    with RemoteSource(url) as source:
        assert source.validate() == []
        failures = source.validate(deep=True)
        assert len(failures) == 3
        for failure, slot in zip(failures, (0, 4, 9), strict=True):
            assert f"dataset slot {slot})" in failure
    store = open_store(url)
    sums = bytearray(store.read("checksums.xxh3"))
    sums[8 * 6] ^= 0x01  # slot 6's checksum, the length unchanged
    store.write("checksums.xxh3", bytes(sums))
    with RemoteSource(url) as source, pytest.raises(DatasetError, match="checksums_mismatch"):
        source.read_batch(7)


# -- RemoteSource.ahead: how far ahead the coming steps are fetched, and on which threads -----


class ThreadRecordingStore(LocalStore):
    """A local directory as a store that records, for every ranged read, the thread that made
    it and the ranges."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[tuple[str, tuple[tuple[int, int], ...]]] = []
        self._reads_lock = threading.Lock()

    def _read_ranges(
        self, key: str, ranges: Sequence[tuple[int, int]], coalesce: int
    ) -> list[bytes]:
        with self._reads_lock:
            self.reads.append((threading.current_thread().name, tuple(ranges)))
        return super()._read_ranges(key, ranges, coalesce)


def _pulled_at_yields(source: RemoteSource, steps: list[list[Any]], yields: int) -> list[int]:
    """How many steps ``ahead`` has taken from the caller's iterator when it yields each of
    its first ``yields`` steps."""
    pulled: list[int] = []

    def gen() -> Iterator[int]:
        for i in range(len(steps)):
            pulled.append(i)
            yield i

    it = cast(Generator[int, None, None], source.ahead(gen(), lambda i: steps[i]))
    counts = []
    for want in range(yields):
        assert next(it) == want
        counts.append(len(pulled))
    it.close()
    return counts


STEP = (0, 3, 7, 2, 12)
"""A step's one region: rows 3..7, columns 2..12 of slot 0 (every bound a different number)."""
STEP_BYTES = 4 * 10 * 4


@pytest.mark.parametrize(
    ("prefetch", "pulled"),
    [
        (0, [1, 2, 3]),
        (STEP_BYTES - 1, [1, 2, 3]),
        (STEP_BYTES, [2, 3, 4]),
        (2 * STEP_BYTES, [3, 4, 5]),
        (10**9, [3, 6, 11]),  # 2 steps ahead of the first served, then 4, then 8
    ],
)
def test_ahead_plans_steps_up_to_prefetch_bytes_of_their_regions(
    tmp_path: Path, prefetch: int, pulled: list[int]
) -> None:
    """``ahead`` takes steps from the caller (and fetches their regions) until the tokens of
    the steps not yet served are more than ``prefetch_bytes``, then serves the first, and so
    on: with ``prefetch_bytes`` of two steps' tokens, step ``k`` is served once step ``k + 2``
    is planned."""
    local = _remote_dataset(tmp_path)
    with RemoteSource((LocalStore(local), ""), prefetch_bytes=prefetch) as source:
        assert _pulled_at_yields(source, [[STEP]] * 12, 3) == pulled


def test_ahead_plans_at_most_max_ahead_steps_however_small(tmp_path: Path) -> None:
    """A pass starts ``FIRST_AHEAD`` steps ahead and doubles with every step served, up to
    ``MAX_AHEAD`` steps however small they are."""
    local = _remote_dataset(tmp_path)
    with RemoteSource((LocalStore(local), ""), prefetch_bytes=10**12) as source:
        steps: list[list[Any]] = [[(0, 1, 1, 0, RT)] for _ in range(3 * MAX_AHEAD)]
        counts = _pulled_at_yields(source, steps, 14)
    ahead = [pulled - served for served, pulled in enumerate(counts, start=1)]
    assert ahead[0] == FIRST_AHEAD
    assert ahead == sorted(ahead) and max(ahead) == MAX_AHEAD


def test_ahead_fetches_the_coming_steps_on_the_pool_and_serves_the_local_tokens(
    tmp_path: Path,
) -> None:
    """Regions announced through ``ahead`` are fetched by the source's threads, not by the
    caller; each step's read is then served from that fetch."""
    local = _remote_dataset(tmp_path)
    store = ThreadRecordingStore(local)
    regions = [[(i, 0, RB // 2, 0, RT), (i, RB // 2, RB, 4, 12)] for i in range(10)]
    with RemoteSource((store, ""), verify="off") as source, DatasetReader(local) as reader:
        for i in source.ahead(iter(range(10)), lambda i: regions[i]):
            for region in regions[i]:
                _, r0, r1, lo, hi = region
                got = source.read_region(*region)
                assert np.array_equal(got, reader.read_batch(i)[r0:r1, lo:hi])
    slot_reads = [name for name, ranges in store.reads if ranges[0][0] >= HEADER_SIZE]
    assert slot_reads and all(name.startswith("zb-get") for name in slot_reads)


def test_a_pass_that_ends_early_drops_the_regions_it_asked_for(tmp_path: Path) -> None:
    """Regions fetched ahead for steps a pass never reached are not served later from that
    pass's fetches: a later read of one fetches it again, from the caller."""
    local = _remote_dataset(tmp_path)
    store = ThreadRecordingStore(local)
    regions = [[(i, 0, RB, 0, RT)] for i in range(10)]
    with RemoteSource((store, ""), prefetch_bytes=10**9, verify="off") as source:
        it = cast(Generator[int, None, None], source.ahead(iter(range(10)), lambda i: regions[i]))
        assert next(it) == 0
        it.close()
        source.read_region(*regions[5][0])
    caller = threading.current_thread().name
    assert any(name == caller for name, ranges in store.reads if ranges[0][0] >= HEADER_SIZE)


class ConcurrencyStore(LocalStore):
    """A local directory as a store whose ranged reads, once ``armed``, hold on until
    ``expected`` reads have started (or ``patience`` seconds pass), then a little more for one
    more than that to be in flight, and record how many were in flight at most."""

    def __init__(self, root: Path, expected: int, patience: float = 2.0) -> None:
        super().__init__(root)
        self.expected, self.patience = expected, patience
        self.armed = False
        self.started = self.active = self.most = 0
        self._cond = threading.Condition()

    def _read_ranges(
        self, key: str, ranges: Sequence[tuple[int, int]], coalesce: int
    ) -> list[bytes]:
        if not self.armed:
            return super()._read_ranges(key, ranges, coalesce)
        with self._cond:
            self.started += 1
            self.active += 1
            self.most = max(self.most, self.active)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self.started >= self.expected, timeout=self.patience)
            self._cond.wait_for(lambda: self.active > self.expected, timeout=0.1)
            self.active -= 1
        return super()._read_ranges(key, ranges, coalesce)


@pytest.mark.parametrize(("threads", "most"), [(None, 16), (0, 1), (3, 3)])
def test_the_coming_steps_are_fetched_with_the_documented_concurrency(
    tmp_path: Path, threads: int | None, most: int
) -> None:
    """README: the coming steps are fetched on a thread pool of 16 concurrent fetches by
    default; ``threads`` sets another number (at least one)."""
    local = _remote_dataset(tmp_path)
    store = ConcurrencyStore(local, expected=most)
    kw: dict[str, Any] = {} if threads is None else {"threads": threads}
    with RemoteSource((store, ""), verify="off", prefetch_bytes=10**9, **kw) as source:
        source.read_region(0, 0, 1, 0, 1)  # the shard checked before the reads that wait
        store.armed = True
        # Enough steps for the depth ahead (2 at first, doubled per step served) to pass it.
        n = 8 * most + 1
        steps = [[(i % 5, (i // 5) % RB, (i // 5) % RB + 1, 0, RT)] for i in range(n)]
        for i in source.ahead(iter(range(n)), lambda i: steps[i]):
            source.read_region(*steps[i][0])
    assert store.most == most


def test_the_default_prefetch_window_is_the_documented_64_mib(remote_ds: tuple[Path, str]) -> None:
    """README: the coming steps are fetched up to ``prefetch_bytes`` ahead, 64 MiB by default."""
    _, url = remote_ds
    with RemoteSource(url) as source:
        assert source.prefetch_bytes == 64 << 20


def test_a_shard_replaced_by_one_of_the_same_shape_is_never_served(
    tmp_path: Path, remote_ds: tuple[Path, str]
) -> None:
    """A shard whose header has the manifest's shape but not its seed, record count or digest
    (another dataset's shard put in its place) fails as ``shard_header_mismatch`` at its
    first use and in ``validate``; the other shard is served."""
    local, url = remote_ds
    other = tmp_path / "other"
    write_sharded_dataset(
        other, [records(10 * RB, RT) + 7], batch_size=RB, seq_len=RT, shard_batches=5, seed=4
    )
    open_store(url).write("shard-00001.batch", (other / "shard-00001.batch").read_bytes())
    with RemoteSource(url) as source, DatasetReader(local) as reader:
        assert np.array_equal(source.read_batch(4), reader.read_batch(4))
        with pytest.raises(DatasetError, match="shard_header_mismatch"):
            source.read_region(5, 0, 2, 0, RT)
        failures = source.validate()
        assert len(failures) == 1 and "shard-00001.batch" in failures[0]


def test_a_remote_source_names_its_kind_and_identity(
    tmp_path: Path, remote_ds: tuple[Path, str], bucket: str
) -> None:
    """A dataset's identity is its manifest's, as the local reader gives it; a single file's
    is the local file's fingerprint (the same file read locally or remotely is one source)."""
    local, url = remote_ds
    path = tmp_path / "f.batch"
    write_batch_file(path, records(2 * RB, RT), RB, seed=4)
    upload(path, f"s3://{bucket}/files/f.batch")
    with RemoteSource(url) as source, DatasetReader(local) as reader:
        assert source.is_dataset and "dataset" in repr(source)
        assert source.identity() == reader.identity()
    with RemoteSource(f"s3://{bucket}/files/f.batch") as single:
        assert not single.is_dataset and ", file," in repr(single)
        with BatchFileReader(path) as local_file:
            assert single.identity() == local_file.identity()
        assert set(single.identity()) == {"file"}


@pytest.mark.parametrize(("served", "later"), [(11, 600), (12, 1000)])
def test_a_pass_that_ends_early_drops_thousands_of_planned_regions(
    tmp_path: Path, served: int, later: int
) -> None:
    """With ``MAX_AHEAD`` steps of four regions each (4096 regions) planned ahead (the depth
    reaches it after ten steps served), a pass that ends then drops the regions it planned for
    the steps it did not serve (at least the last ``2 * MAX_AHEAD``): a region of such a step
    read afterwards is fetched again, by the caller."""
    local = _remote_dataset(tmp_path)
    store = ThreadRecordingStore(local)
    empty = [  # regions of no rows: planned and fetched without a store request
        (i, r, r, lo, hi) for i in range(10) for r in range(RB + 1) for lo, hi in ((0, 1), (1, 2))
    ]
    steps = [
        [*(empty[(3 * k + j) % len(empty)] for j in range(3)), (k % 10, 2, 3, k % 7, k % 7 + 1)]
        for k in range(MAX_AHEAD + 40)
    ]
    wanted = steps[later][-1] = (3, 1, 5, 0, RT)
    with RemoteSource((store, ""), prefetch_bytes=10**9, verify="off") as source:
        assert _pulled_at_yields(source, steps, served)[-1] == served + MAX_AHEAD
        source.read_region(*wanted)
    start = HEADER_SIZE + 3 * RSLOT
    rows = ((start + RT * 4, start + 5 * RT * 4),)
    assert (threading.current_thread().name, rows) in store.reads


@pytest.mark.parametrize("missing", [10, 11])
def test_a_region_of_a_slot_the_source_lacks_holds_back_the_regions_after_it(
    tmp_path: Path, missing: int
) -> None:
    """Regions are fetched ahead in order, each once its slot can be fetched: behind a region
    of a slot past the source's end (a live dataset's batch not committed yet), the regions
    of the next steps wait, and a read of one is fetched by the caller."""
    local = _remote_dataset(tmp_path)
    store = ThreadRecordingStore(local)
    wanted = (2, 0, 1, 0, 4)  # every bound below the number of slots
    steps = [[(missing, 0, 1, 2, 5)], [wanted], [(3, 0, 1, 0, RT)]]
    with RemoteSource((store, ""), prefetch_bytes=10**9, verify="off") as source:
        source.read_region(0, 0, 1, 0, 1)  # the shard checked first
        served = []
        for i in source.ahead(iter(range(3)), lambda i: steps[i]):
            served.append(i)
            if i == 1:
                source.read_region(*wanted)
        assert served == [0, 1, 2]
    start = HEADER_SIZE + 2 * RSLOT
    assert store.reads[-1] == (threading.current_thread().name, ((start, start + 4 * 4),))


def test_validate_reports_every_bad_shard_and_raises_none(remote_ds: tuple[Path, str]) -> None:
    """A shard whose header is not an LLMBATCH header (``FormatError``) and a shard that is
    too short (``shard_size_mismatch``): ``validate`` reports both, each once, raising
    neither; reading them raises."""
    _, url = remote_ds
    store = open_store(url)
    first = bytearray(store.read("shard-00000.batch"))
    first[:8] = b"NOTBATCH"
    store.write("shard-00000.batch", bytes(first))
    second = store.read("shard-00001.batch")
    store.write("shard-00001.batch", second[:-RSLOT])
    with RemoteSource(url) as source:
        failures = source.validate()
        assert len(failures) == 2
        assert "shard-00000.batch" in failures[0]
        assert "shard-00001.batch" in failures[1] and "shard_size_mismatch" in failures[1]
        with pytest.raises(DatasetError, match="shard_size_mismatch"):
            source.read_batch(6)
        with pytest.raises(FormatError):
            source.read_batch(1)


def test_a_store_and_key_source_is_named_by_the_objects_location(
    tmp_path: Path, bucket: str
) -> None:
    """``(store, key)``: a file is named by its key's location in messages, a dataset (key
    ``""``) by the store's URL."""
    path = tmp_path / "f.batch"
    write_batch_file(path, records(2 * RB, RT), RB, seed=4)
    store = open_store(f"s3://{bucket}/files")
    store.write("f.batch", path.read_bytes())
    with RemoteSource((store, "f.batch")) as source:
        assert source.path == store.where("f.batch") == f"s3://{bucket}/files/f.batch"
        with pytest.raises(IndexError, match=f"^s3://{bucket}/files/f.batch: slot 2 "):
            source.read_batch(2)
    local = _remote_dataset(tmp_path)
    dataset_store = LocalStore(local)
    with RemoteSource((dataset_store, "")) as source:
        assert source.path == dataset_store.url


def test_a_cache_directory_without_cache_bytes_keeps_nothing(
    remote_ds: tuple[Path, str], tmp_path: Path
) -> None:
    _, url = remote_ds
    with RemoteSource(url, cache_dir=str(tmp_path / "cache")) as source:
        source.read_batch(1)
        before = source.store.stats.requests
        source.read_batch(1)
        assert source.store.stats.requests == before + 1
        assert source.cache is not None and source.cache.hits == 0


def test_a_negative_coalesce_fetches_exact_ranges(remote_ds: tuple[Path, str]) -> None:
    """``coalesce`` below zero is zero: each row of a chunk is its own range, served exactly."""
    local, url = remote_ds
    with RemoteSource(url, coalesce=-5) as source, DatasetReader(local) as reader:
        assert np.array_equal(source.read_region(4, 0, 4, 2, 6), reader.read_batch(4)[:4, 2:6])


class HeldStore(LocalStore):
    """A local directory as a store whose ranged reads, once ``armed``, wait for ``release``
    (at most ``hold`` seconds)."""

    def __init__(self, root: Path, hold: float) -> None:
        super().__init__(root)
        self.armed, self.hold = False, hold
        self.release = threading.Event()
        self.started = threading.Event()

    def _read_ranges(
        self, key: str, ranges: Sequence[tuple[int, int]], coalesce: int
    ) -> list[bytes]:
        if self.armed:
            self.started.set()
            self.release.wait(self.hold)
        return super()._read_ranges(key, ranges, coalesce)


def test_close_does_not_wait_for_a_fetch_in_flight(tmp_path: Path) -> None:
    """``close`` stops the fetches ahead and returns at once, even while one of them waits on
    the store."""
    local = _remote_dataset(tmp_path)
    store = HeldStore(local, hold=3.0)
    source = RemoteSource((store, ""), threads=1, prefetch_bytes=10**9, verify="off")
    source.read_region(0, 0, 1, 0, 1)  # the shard checked first
    store.armed = True
    steps = [[(i, 0, 1, 0, RT)] for i in range(3)]
    it = cast(Generator[int, None, None], source.ahead(iter(range(3)), lambda i: steps[i]))
    assert next(it) == 0
    assert store.started.wait(2.0)  # the first fetch is held by the store
    began = time.monotonic()
    source.close()
    elapsed = time.monotonic() - began
    store.release.set()
    it.close()
    assert source.closed and elapsed < 1.0
