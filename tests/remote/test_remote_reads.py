"""Files and datasets read from a real S3-compatible server on loopback (``tests/s3server.py``).

What is checked: the same batches in the same order as from disk for every adapter; the bytes
a rank fetches at D x C are exactly its share (counted by the proxy, on the server side, and by
the client); retries under injected 503 SlowDown and dropped connections serve every batch
exactly once; what each verification mode checks; the local cache; ``file://`` URLs and a
caller's fsspec filesystem; loader states that move between a local copy and the remote one.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import records, require
from tests.remote.conftest import upload
from tests.s3server import S3Proxy, S3Server, environment
from zerobatch_core import BatchNativeLoader, BatchStream, DatasetError, write_batch_file
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.datasets.remote import RemoteSource
from zerobatch_core.delivery.sources import open_reader
from zerobatch_core.stores.resolve import open_store
from zerobatch_core.stores.store import LocalStore

B, T = 8, 16


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    write_sharded_dataset(out, [records(200, T)], batch_size=B, seq_len=T, shard_batches=5, seed=3)
    return out


def _host(x: Any) -> Any:
    to_numpy = getattr(x, "numpy", None)
    return np.array(to_numpy() if to_numpy is not None else np.asarray(x))


def _items(stream: Any) -> list[Any]:
    return [
        tuple(_host(x) for x in item) if isinstance(item, tuple) else _host(item) for item in stream
    ]


def _same(a: list[Any], b: list[Any]) -> bool:
    def flat(x: Any) -> list[Any]:
        return list(x) if isinstance(x, tuple) else [x]

    return len(a) == len(b) and all(
        all(np.array_equal(p, q) for p, q in zip(flat(x), flat(y), strict=True))
        for x, y in zip(a, b, strict=True)
    )


def _adapter(name: str, source: Any, **kw: Any) -> Any:
    if name == "numpy":
        return BatchStream(source, **kw)
    if name == "torch":
        require("torch")
        from zerobatch_adapters.torch import TorchBatchDataset

        return TorchBatchDataset(source, **kw)
    if name == "torch-loader":
        require("torch")
        from zerobatch_adapters.torch import TorchBatchLoader

        return TorchBatchLoader(source, device="cpu", **kw)
    if name == "jax":
        require("jax")
        import jax
        from zerobatch_adapters.jax import JaxBatchIterator, default_sharding

        rows = B // kw.get("world_size", 1)
        devices = jax.devices()
        sharding = default_sharding(devices[: math.gcd(len(devices), rows)])
        return JaxBatchIterator(source, sharding=sharding, **kw)
    require("tensorflow")
    from zerobatch_adapters.tensorflow import TFBatchDataset

    return TFBatchDataset(source, **kw)


@pytest.mark.parametrize("adapter", ["numpy", "torch", "torch-loader", "jax", "tensorflow"])
def test_every_adapter_serves_the_local_batches_in_the_local_order(
    adapter: str, dataset: Path, bucket: str
) -> None:
    url = f"s3://{bucket}/ds"
    upload(dataset, url)
    kw: dict[str, Any] = {"dtype": "int32", "rank": 1, "world_size": 2, "seed": 5}
    with _adapter(adapter, dataset, **kw) as local, _adapter(adapter, url, **kw) as remote:
        assert isinstance(remote.loader.source, RemoteSource)
        for _ in range(2):  # two epochs: the second is in another order, the same on both
            assert _same(_items(local), _items(remote))
        state = remote.state_dict()
    # A state saved on the remote copy loads into the local one: same manifest, same identity.
    with _adapter("numpy", dataset, **kw) as again:
        again.load_state_dict(state)
        assert again.position == (2, 0)


def test_next_token_int64_and_a_remote_single_file(tmp_path: Path, bucket: str) -> None:
    path = tmp_path / "f.batch"
    write_batch_file(path, records(90, T), B, seed=9)
    url = f"s3://{bucket}/files/f.batch"
    upload(path, url)
    kw: dict[str, Any] = {"dtype": "int64", "next_token": True, "block_size": 3}
    with BatchStream(path, **kw) as local, BatchStream(url, **kw) as remote:
        assert remote.loader.source.header == local.loader.source.header
        assert _same(_items(local), _items(remote))
        assert remote.state_dict()["source"] == local.state_dict()["source"]


@pytest.mark.parametrize(("dp", "cp"), [(2, 2), (4, 1), (1, 2)])
def test_a_rank_fetches_exactly_its_share(dataset: Path, proxy: S3Proxy, dp: int, cp: int) -> None:
    url = f"s3://{next(iter(_buckets(proxy)))}/ds"
    upload(dataset, url)
    manifest = (dataset / "manifest.json").stat().st_size
    shards = len([n for n in os.listdir(dataset) if n.endswith(".batch")])
    for rank in range(dp):
        for c in range(cp):
            proxy.reset()
            with BatchStream(
                url, dtype="uint32", rank=rank, world_size=dp, context_rank=c, context_size=cp
            ) as stream:
                served = sum(item.nbytes for item in stream)
                source = stream.loader.source
                client = source.store.stats.snapshot()["bytes_read"]
            share = 25 * (B // dp) * (T // cp) * 4
            assert served == share
            # Server side: the rank's share, plus the manifest and each shard's header once.
            assert proxy.counts["get_bytes"] == share + manifest + shards * 4096
            assert client == proxy.counts["get_bytes"]


def _buckets(proxy: S3Proxy) -> list[str]:
    """A fresh bucket behind the proxy (created through the proxy, like any client would)."""
    import secrets
    import urllib.request

    name = f"zb-{secrets.token_hex(6)}"
    request = urllib.request.Request(f"{proxy.endpoint}/{name}", method="PUT")
    with urllib.request.urlopen(request, timeout=30):
        pass
    return [name]


def test_throttling_and_dropped_connections_are_retried_and_every_batch_served_once(
    dataset: Path, s3_server: S3Server
) -> None:
    faulty = S3Proxy(s3_server.endpoint, slowdown=0.15, drop=0.05, cut=0.05, seed=7)
    try:
        with environment(faulty.endpoint):
            (bucket,) = _buckets(faulty)
            url = f"s3://{bucket}/ds"
            upload(dataset, url)
            with BatchStream(dataset, dtype="uint32", seed=1) as local:
                expected = _items(local)
            with BatchStream(url, dtype="uint32", seed=1) as remote:
                served = _items(remote)
                stats = remote.loader.source.store.stats.snapshot()
    finally:
        faulty.stop()
    assert _same(expected, served)  # each batch once, in order, none missing
    faults = faulty.counts["slowdowns"] + faulty.counts["drops"] + faulty.counts["cuts"]
    assert faults > 0
    assert 0 < stats["retries"] <= faults
    assert set(stats["retry_reasons"]) <= {"SlowDown", "503", "connection", "timeout"}


def test_verification_modes_on_a_corrupted_slot(dataset: Path, bucket: str) -> None:
    url = f"s3://{bucket}/ds"
    upload(dataset, url)
    store = open_store(url)
    data = bytearray(store.read("shard-00000.batch"))
    data[4096 + 3 * 4096 + 5] ^= 0xFF  # slot 3, inside rank 0's rows
    store.write("shard-00000.batch", bytes(data))
    with RemoteSource(url) as source:  # "whole": a whole-slot read is checked
        assert source.verify == "whole"
        with pytest.raises(DatasetError, match=r"checksum_mismatch.*slot 3"):
            source.read_batch(3)
        source.read_region(3, 0, 4, 0, T)  # part of a slot cannot be checked: served as is
    with RemoteSource(url, verify="first") as source:  # the first read fetches the whole slot
        with pytest.raises(DatasetError, match="checksum_mismatch"):
            source.read_region(3, 4, 8, 0, T)
        assert source.read_region(2, 4, 8, 0, T).shape == (4, T)
        before = source.store.stats.bytes_read
        source.read_region(2, 4, 8, 0, T)  # verified already: only the region now
        assert source.store.stats.bytes_read - before == 4 * T * 4
    with RemoteSource(url, verify="off") as source:
        source.read_batch(3)


def test_a_shard_that_does_not_match_the_manifest_is_never_served(
    dataset: Path, bucket: str
) -> None:
    url = f"s3://{bucket}/ds"
    upload(dataset, url)
    open_store(url).delete("shard-00001.batch")
    with RemoteSource(url) as source:
        assert source.read_batch(0).shape == (B, T)
        with pytest.raises(DatasetError, match="shard_missing"):
            source.read_batch(5)


def test_the_cache_serves_a_second_pass_without_requests(
    dataset: Path, bucket: str, tmp_path: Path
) -> None:
    url = f"s3://{bucket}/ds"
    upload(dataset, url)
    cache = tmp_path / "cache"
    with RemoteSource(url, cache_dir=str(cache), cache_bytes=1 << 20) as source:
        first = [source.read_region(i, 0, 4, 0, T).copy() for i in range(25)]
        requests = source.store.stats.requests
        again = [source.read_region(i, 0, 4, 0, T).copy() for i in range(25)]
        assert source.store.stats.requests == requests
        assert source.cache is not None and source.cache.hits == 25
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    with RemoteSource(url, cache_dir=str(cache), cache_bytes=3000) as small:
        for i in range(25):
            small.read_region(i, 0, 4, 0, T)
        assert small.cache is not None
    assert sum(f.stat().st_size for f in cache.iterdir()) <= 3000


def test_file_urls_paths_and_a_callers_fsspec_filesystem(dataset: Path) -> None:
    fsspec = require("fsspec")
    with BatchStream(dataset, dtype="uint32") as local:
        expected = _items(local)
    for source in (
        f"file://{dataset}",
        LocalStore(dataset),
        open_store((fsspec.filesystem("file"), str(dataset))),
        (fsspec.filesystem("file"), str(dataset)),
    ):
        reader = open_reader(source)
        assert isinstance(reader, RemoteSource)
        with BatchStream(reader, dtype="uint32") as remote:
            assert _same(expected, _items(remote))
        reader.close()


def test_bad_urls_say_what_is_wrong(bucket: str) -> None:
    with pytest.raises(OSError, match="unknown URL scheme 'ftp'"):
        open_reader("ftp://host/x")  # not a URL ZeroBatch opens: read as a path, named
    with pytest.raises(FileNotFoundError):
        BatchNativeLoader(f"s3://{bucket}/missing.batch")
    with pytest.raises(ValueError, match="verify must be one of"):
        RemoteSource(f"s3://{bucket}/x", verify="sometimes")  # type: ignore[arg-type]


def test_the_command_line_inspects_and_validates_urls(
    dataset: Path, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from zerobatch_core.cli import main

    url = f"s3://{bucket}/ds"
    upload(dataset, url)
    assert main(["inspect", url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["kind"], info["num_batches"], info["shards"]) == ("dataset", 25, 5)
    assert main(["validate", "--deep", url]) == 0
    assert capsys.readouterr().out.startswith(f"OK {url}: dataset of 25 batches")
    store = open_store(url)
    data = bytearray(store.read("shard-00002.batch"))
    data[4096 + 7] ^= 1
    store.write("shard-00002.batch", bytes(data))
    assert main(["validate", url]) == 0  # sizes and headers only
    capsys.readouterr()
    assert main(["validate", "--deep", "--json", url]) == 1
    report = json.loads(capsys.readouterr().out)
    assert len(report["failures"]) == 1 and "checksum_mismatch" in report["failures"][0]
    assert main(["inspect", f"{url}/shard-00000.batch"]) == 0
    assert "kind                file" in capsys.readouterr().out
