"""uint16 (dtype 1) files, datasets and live datasets read from a real S3-compatible server.

What is checked: the same values as the uint32 twin (``tests/narrow.py``) in every output
dtype; a rank of D x C fetches half the bytes of its uint32 share, counted on the server side
(the proxy) and by the client; whole-slot checksums over uint16 slots in every verification
mode; a shard of another dtype is refused; a live dataset's descriptor dtype is served; and
``inspect`` / ``validate`` name the dtype of remote and live sources.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec import HEADER_SIZE, padded_batch_bytes

from tests.helpers import records
from tests.narrow import narrow_dataset, narrow_file
from tests.remote.conftest import upload
from tests.remote.test_remote_reads import _buckets
from tests.s3server import S3Proxy
from tests.unit.conftest import Run
from zerobatch_core import BatchNativeLoader, BatchStream, DatasetError, write_batch_file
from zerobatch_core.cli import main
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.datasets.remote import RemoteSource
from zerobatch_core.live.producer import LiveProducer
from zerobatch_core.live.source import LiveSource
from zerobatch_core.stores.resolve import open_store

B, T = 8, 16
U16 = np.dtype("<u2")


@pytest.fixture
def twins(tmp_path: Path) -> tuple[Path, Path]:
    """A uint32 dataset of 25 batches of [8, 16] in 5 shards, and its uint16 twin."""
    wide = tmp_path / "ds32"
    write_sharded_dataset(wide, [records(200, T)], batch_size=B, seq_len=T, shard_batches=5, seed=3)
    return wide, narrow_dataset(wide, tmp_path / "ds16")


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    def go(*argv: object) -> Run:
        capsys.readouterr()
        status = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Run(status, captured.out, captured.err)

    return go


def _items(stream: Any) -> list[list[np.ndarray]]:
    return [[np.array(x) for x in (i if isinstance(i, tuple) else (i,))] for i in stream]


@pytest.mark.parametrize("dtype", ["native", "int32", "int64"])
def test_a_remote_uint16_dataset_serves_the_uint32_values(
    twins: tuple[Path, Path], bucket: str, dtype: str
) -> None:
    wide, narrow = twins
    url = f"s3://{bucket}/ds16"
    upload(narrow, url)
    kw: dict[str, Any] = {"dtype": dtype, "seed": 4, "next_token": True, "rank": 1, "world_size": 2}
    with BatchStream(wide, **kw) as local, BatchStream(url, **kw) as remote:
        source = remote.loader.source
        assert isinstance(source, RemoteSource)
        assert (source.dtype, source.token_dtype, source.slot_bytes) == (1, U16, 4096)
        a, b = _items(local), _items(remote)
        assert len(a) == len(b) == 25
        for x, y in zip(a, b, strict=True):
            for p, q in zip(x, y, strict=True):
                np.testing.assert_array_equal(p, q)
        assert b[0][0].dtype == (U16 if dtype == "native" else np.dtype(dtype))
    # A state of the remote copy loads into the local uint16 dataset: same manifest.
    with BatchStream(narrow, **kw) as again:
        again.load_state_dict(remote.state_dict())


@pytest.mark.parametrize(("dp", "cp"), [(2, 2), (4, 1), (1, 2)])
def test_a_rank_fetches_half_the_bytes_of_its_uint32_share(
    twins: tuple[Path, Path], proxy: S3Proxy, dp: int, cp: int
) -> None:
    (bucket,) = _buckets(proxy)
    fetched = {}
    for name, local in zip(("uint32", "uint16"), twins, strict=True):
        url = f"s3://{bucket}/{name}"
        upload(local, url)
        manifest = (local / "manifest.json").stat().st_size
        shards = len([n for n in os.listdir(local) if n.endswith(".batch")])
        size = 4 if name == "uint32" else 2
        for rank in range(dp):
            for c in range(cp):
                proxy.reset()
                with BatchStream(
                    url, dtype="int32", rank=rank, world_size=dp, context_rank=c, context_size=cp
                ) as stream:
                    tokens = sum(item.size for item in stream)
                    client = stream.loader.source.store.stats.snapshot()["bytes_read"]
                share = 25 * (B // dp) * (T // cp)
                assert tokens == share
                # The rank's tokens at the stored size, the manifest, each shard's header once.
                assert proxy.counts["get_bytes"] == share * size + manifest + shards * HEADER_SIZE
                assert client == proxy.counts["get_bytes"]
                fetched[name, rank, c] = client - manifest - shards * HEADER_SIZE
    for (name, rank, c), n in fetched.items():
        if name == "uint16":
            assert 2 * n == fetched["uint32", rank, c]


def test_verification_modes_on_a_corrupted_uint16_slot(
    twins: tuple[Path, Path], bucket: str
) -> None:
    _, narrow = twins
    url = f"s3://{bucket}/ds16"
    upload(narrow, url)
    store = open_store(url)
    data = bytearray(store.read("shard-00000.batch"))
    data[HEADER_SIZE + 3 * padded_batch_bytes(B, T, 1) + 5] ^= 0xFF  # slot 3, row 0
    store.write("shard-00000.batch", bytes(data))
    with RemoteSource(url) as source:  # "whole": a whole-slot read is checked
        with pytest.raises(DatasetError, match=r"checksum_mismatch.*slot 3"):
            source.read_batch(3)
        part = source.read_region(3, 0, 4, 0, T)  # part of a slot cannot be checked
        assert part.dtype == U16 and part.shape == (4, T)
    with RemoteSource(url, verify="first") as source:  # the first read fetches the whole slot
        with pytest.raises(DatasetError, match="checksum_mismatch"):
            source.read_region(3, 4, 8, 0, T)
        before = source.store.stats.bytes_read
        source.read_region(2, 4, 8, 0, T)
        assert source.store.stats.bytes_read - before == padded_batch_bytes(B, T, 1)
        before = source.store.stats.bytes_read
        source.read_region(2, 4, 8, 0, T)  # verified already: only the region, 2 bytes a token
        assert source.store.stats.bytes_read - before == 4 * T * 2
    with RemoteSource(url, verify="always") as source:
        with pytest.raises(DatasetError, match="checksum_mismatch"):
            source.read_region(3, 4, 5, 0, 2)
        source.read_region(4, 4, 5, 0, 2)
    with RemoteSource(url, verify="off") as source:
        assert source.read_batch(3).dtype == U16
    with RemoteSource(url) as source:
        assert any("checksum_mismatch" in f for f in source.validate(deep=True))


def test_a_remote_shard_of_another_dtype_is_refused(twins: tuple[Path, Path], bucket: str) -> None:
    wide, narrow = twins
    url = f"s3://{bucket}/ds16"
    upload(narrow, url)
    store = open_store(url)
    # The uint32 shard has the uint16 shard's size: [8, 16] fits one 4096-byte slot either way.
    store.write("shard-00002.batch", (wide / "shard-00002.batch").read_bytes())
    with RemoteSource(url) as source:
        source.read_batch(0)
        with pytest.raises(DatasetError) as raised:
            source.read_batch(10)
        failures = source.validate()
    assert raised.value.code.value == "shard_header_mismatch"
    assert "header dtype 0 (uint32); the manifest says 1 (uint16)" in str(raised.value)
    assert len(failures) == 1 and "shard-00002.batch" in failures[0]


def test_a_remote_uint16_file(tmp_path: Path, bucket: str, run: Callable[..., Run]) -> None:
    wide, narrow = tmp_path / "w.batch", tmp_path / "n.batch"
    write_batch_file(wide, records(90, T), B, seed=9)
    narrow_file(wide, narrow)
    url = f"s3://{bucket}/files/n.batch"
    upload(narrow, url)
    with RemoteSource(url) as source:
        assert source.header is not None and source.header.dtype == 1
        assert source.token_dtype == U16
        for i in range(source.num_batches):
            np.testing.assert_array_equal(source.read_batch(i), BatchNativeLoader(wide).item(i))
        kw: dict[str, Any] = {"dtype": "int64", "context_rank": 1, "context_size": 2}
        a = list(BatchNativeLoader(source, **kw))
    b = list(BatchNativeLoader(wide, **kw))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)) and len(a) == 11
    r = run("inspect", url)
    assert r.status == 0 and re.search(r"^dtype\s+1 \(uint16\)$", r.out, flags=re.M), r.out
    info = json.loads(run("inspect", url, "--json").out)
    assert (info["dtype"], info["dtype_name"], info["padded_batch_bytes"]) == (1, "uint16", 4096)
    r = run("validate", url)
    assert r.status == 0 and f"[{B}, {T}] uint16 (checked:" in r.out, r.out


def test_a_live_uint16_dataset(tmp_path: Path, bucket: str, run: Callable[..., Run]) -> None:
    url = f"s3://{bucket}/live"
    rows = np.arange(5 * B * T).reshape(5, B, T) * 997 % 65_536  # ids up to 65,535
    with LiveProducer(url, "p-0", batch_size=B, seq_len=T, cadence=2, dtype="uint16") as p:
        for batch in rows:
            p.append(batch)
    with LiveSource(url) as source:
        assert (source.dtype, source.token_dtype, source.committed) == (1, U16, 5)
        assert source.descriptor.dtype == 1
        for kw in ({"dtype": "native"}, {"dtype": "int32", "rank": 1, "world_size": 2}):
            loader = BatchNativeLoader(source, **kw)  # type: ignore[arg-type]
            it = iter(loader)
            got = [next(it) for _ in range(5)]
            half = slice(B // 2, B) if "rank" in kw else slice(0, B)
            for g, want in zip(got, rows, strict=True):
                assert g.dtype == (U16 if kw["dtype"] == "native" else np.int32)
                np.testing.assert_array_equal(g, want[half])
            del it
        assert not source.validate(deep=True)
    info = json.loads(run("inspect", url, "--json").out)
    assert (info["kind"], info["dtype"], info["dtype_name"]) == ("live", 1, "uint16")
    r = run("inspect", url)
    assert re.search(r"^dtype\s+1 \(uint16\)$", r.out, flags=re.M), r.out
