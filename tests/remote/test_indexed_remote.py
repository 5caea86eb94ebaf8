"""Version 2 (indexed) datasets read from a real S3-compatible server, requests counted by the
proxy in front of it: a rank's startup costs a few requests and a few kilobytes whatever the
shard count, a rank fetches index pages and checksum ranges only for the shards it reads, and
every rank serves what a version 1 copy of the same dataset serves."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from zerobatch_spec.index import INDEX_NAME

from tests.helpers import records
from tests.remote.conftest import upload
from tests.s3server import S3Proxy
from zerobatch_core import BatchNativeLoader, DatasetError
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.datasets.remote import RemoteSource
from zerobatch_core.datasets.shard_table import TOP_READ
from zerobatch_core.stores.resolve import open_store

B, T = 4, 8
SHARDS = 200


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same 200 one-slot shards as a version 1 and a version 2 dataset."""
    root = tmp_path_factory.mktemp("indexed")
    rows = [records(SHARDS * B, T)]
    kw = dict(batch_size=B, seq_len=T, shard_batches=1, seed=11)
    write_sharded_dataset(root / "v1", rows, **kw)  # type: ignore[arg-type]
    write_sharded_dataset(root / "v2", rows, manifest_version=2, **kw)  # type: ignore[arg-type]
    return root / "v1", root / "v2"


def _by_object(proxy: S3Proxy, bucket: str) -> dict[str, tuple[int, int]]:
    """Requests and response bytes per object name since the last reset."""
    out: dict[str, tuple[int, int]] = {}
    for _, path, size in proxy.log:
        name = path.removeprefix(f"/{bucket}/").split("/")[-1]
        n, b = out.get(name, (0, 0))
        out[name] = (n + 1, b + size)
    return out


def _uploaded(twins: tuple[Path, Path], bucket: str) -> tuple[str, str]:
    urls = (f"s3://{bucket}/v1", f"s3://{bucket}/v2")
    for local, url in zip(twins, urls, strict=True):
        upload(local, url)
    return urls


def test_startup_is_a_few_requests_whatever_the_shard_count(
    twins: tuple[Path, Path], bucket: str, proxy: S3Proxy
) -> None:
    v1, v2 = _uploaded(twins, bucket)
    costs = {}
    for url in (v1, v2):
        proxy.reset()
        # Nothing fetched ahead beyond the next step: what the first batch itself costs.
        with RemoteSource(url, prefetch_bytes=0) as source:
            loader = BatchNativeLoader(source, dtype="int32", block_size=4, seed=1)
            first = next(iter(loader))
            assert first.shape == (B, T)
            costs[url] = (
                proxy.counts["requests"],
                proxy.counts["get_bytes"],
                _by_object(proxy, bucket),
            )
    requests, nbytes, objects = costs[v2]
    # The manifest (its existence, then its bytes), the index's top, and for each of the
    # first steps (the one served, the one fetched ahead) its shard's page of the index, its
    # checksums range and its slot.
    assert requests <= 2 + 1 + 3 * 2, objects
    assert nbytes < 96 << 10, objects  # the index's first 64 KiB (here all of it), a slot
    assert objects["manifest.json"][1] < 1024
    assert objects[INDEX_NAME][0] == 1  # its pages came with the top
    checks = objects["checksums.xxh3"]
    assert 1 <= checks[0] <= 2 and checks[1] == 8 * checks[0]  # one slot's range per shard
    assert objects[INDEX_NAME][1] <= TOP_READ  # at most one read's worth, however many shards
    # Version 1 reads the whole manifest and the whole checksums file: both grow per shard.
    old = costs[v1][2]
    assert old["manifest.json"][1] > 100 * SHARDS
    assert old["checksums.xxh3"][1] == SHARDS * 8


def test_a_rank_of_4x2_fetches_what_it_reads(
    twins: tuple[Path, Path], bucket: str, proxy: S3Proxy
) -> None:
    v1, v2 = _uploaded(twins, bucket)
    steps = 40
    served: dict[str, list[np.ndarray]] = {}
    for url in (v1, v2):
        proxy.reset()
        source = RemoteSource(url, verify="first", prefetch_bytes=0)
        loader = BatchNativeLoader(
            source,
            dtype="int32",
            block_size=3,
            seed=5,
            rank=1,
            world_size=4,
            context_rank=1,
            context_size=2,
            global_batch_size=4 * B,
        )
        items = []
        for item in loader:
            items.append(np.array(item))
            if len(items) == steps:
                break
        served[url] = items
        if url == v2:
            objects = _by_object(proxy, bucket)
            shards_read = len({n for n in source._indexed})
            assert 0 < shards_read <= steps * 4
            # checksums: exactly the ranges of the shards read (one slot each here)
            assert objects["checksums.xxh3"] == (shards_read, shards_read * 8)
            pages = -(-SHARDS // 64)
            assert objects[INDEX_NAME][0] <= 1 + pages
        source.close()
    assert [a.tolist() for a in served[v1]] == [b.tolist() for b in served[v2]]


def test_every_rank_serves_what_version_1_serves(twins: tuple[Path, Path], bucket: str) -> None:
    v1, v2 = _uploaded(twins, bucket)
    for verify in ("whole", "off", "always"):
        got = {}
        for url in (v1, v2):
            with RemoteSource(url, verify=verify) as source:  # type: ignore[arg-type]
                loader = BatchNativeLoader(source, dtype="int64", block_size=7, seed=2)
                got[url] = [np.array(b) for b in loader][:60]
        assert [a.tolist() for a in got[v1]] == [b.tolist() for b in got[v2]]


def test_a_broken_page_or_a_missing_index_is_named(twins: tuple[Path, Path], bucket: str) -> None:
    _, v2 = _uploaded(twins, bucket)
    store = open_store(v2)
    index = bytearray(store.read(INDEX_NAME))
    index[-3] ^= 0xFF  # a byte of the last page's records
    store.write(INDEX_NAME, bytes(index))
    with RemoteSource(v2, verify="off") as source:  # the top is intact: opening works
        last = (SHARDS - 1) // 64
        with pytest.raises(DatasetError, match=rf"index_mismatch: index\.pages\[{last}\]"):
            source.read_batch(SHARDS - 1)
        assert source.read_batch(0).shape == (B, T)  # other pages still serve
    store.delete(INDEX_NAME)
    with pytest.raises(DatasetError, match="index_missing"):
        RemoteSource(v2)


def test_inspect_and_validate_read_the_index(
    twins: tuple[Path, Path], bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from zerobatch_core.cli import main

    _, v2 = _uploaded(twins, bucket)
    assert main(["inspect", v2, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["manifest_version"] == 2 and info["shards"] == SHARDS
    assert main(["validate", v2, "--deep"]) == 0
    assert "OK" in capsys.readouterr().out


def test_shards_spread_over_prefixes_divide_the_requests(
    twins: tuple[Path, Path], tmp_path: Path, bucket: str, proxy: S3Proxy
) -> None:
    """Written with ``prefixes=8``, the shards' GETs divide evenly among 8 key prefixes, and
    a rank serves what the dataset without prefixes serves."""
    spread = tmp_path / "spread"
    kw = dict(batch_size=B, seq_len=T, shard_batches=1, seed=11, manifest_version=2)
    write_sharded_dataset(spread, [records(SHARDS * B, T)], prefixes=8, **kw)  # type: ignore[arg-type]
    _, v2 = _uploaded(twins, bucket)
    url = f"s3://{bucket}/spread"
    upload(spread, url)
    served = {}
    for where in (v2, url):
        proxy.reset()
        with RemoteSource(where, verify="off", prefetch_bytes=0) as source:
            loader = BatchNativeLoader(source, dtype="int32", block_size=1, seed=3)
            served[where] = [np.array(b).tolist() for b in loader][:SHARDS]
        shard_gets = Counter(
            path.removeprefix(f"/{bucket}/").split("/")[-1].split("shard-")[0]
            for _, path, _ in proxy.log
            if path.endswith(".batch")
        )
        if where == url:
            assert set(shard_gets) == {f"{p}-" for p in range(8)}
            assert max(shard_gets.values()) - min(shard_gets.values()) <= 1
        else:
            assert set(shard_gets) == {""}
    assert served[v2] == served[url]
