"""Fixtures of the object-storage tests: a real S3-compatible server on loopback (moto's
standalone server, a child process) for the whole session, a fresh bucket per test, and
helpers that upload local datasets to it."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import require
from tests.s3server import S3Proxy, S3Server, environment


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    require("moto")
    require("obstore")
    server = S3Server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_server: S3Server) -> Iterator[str]:
    """A new bucket, with the S3 environment pointing at the server directly."""
    name = f"zb-{secrets.token_hex(6)}"
    s3_server.create_bucket(name)
    with environment(s3_server.endpoint):
        yield name


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[S3Proxy]:
    """A counting proxy in front of the server, the S3 environment pointing at the proxy."""
    p = S3Proxy(s3_server.endpoint)
    try:
        with environment(p.endpoint):
            yield p
    finally:
        p.stop()


def upload(local: Path, url: str) -> None:
    """Copy a file or a dataset directory to ``url`` (the manifest last, as writers do)."""
    from zerobatch_core.stores.resolve import open_store
    from zerobatch_core.stores.store import split_url

    if local.is_file():
        parent, name = split_url(url)
        open_store(parent).write(name, local.read_bytes())
        return
    store = open_store(url)
    names = sorted(os.listdir(local), key=lambda n: n == "manifest.json")
    for name in names:
        store.write(name, (local / name).read_bytes())
