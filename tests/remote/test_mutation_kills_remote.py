"""Tests written to kill surviving mutants of the object-store modules (object_stores.py,
remote.py), against the real S3-compatible server the remote tests start: each pins a
behaviour the other tests left open."""

from __future__ import annotations

import errno
import secrets
import sys
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import require
from tests.s3server import S3Proxy, S3Server, environment
from zerobatch_core.errors import MissingDependencyError
from zerobatch_core.object_stores import FsspecStore, ObstoreStore
from zerobatch_core.storage import StoreError, open_store

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
