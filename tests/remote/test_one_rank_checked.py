"""A single remote rank whose steps are smaller than a slot: every slot it serves is checked.

With one rank, no context parallelism and ``global_batch_size`` below the stored batch size,
the rank reads every row of each slot over consecutive steps. Under the default ``verify``
(``"whole"``) the README promises that one rank's reads are checked: the slot is fetched
whole once, checked against ``checksums.xxh3``, and its rows served from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from zerobatch_spec import padded_batch_bytes

from tests.helpers import records
from tests.remote.conftest import upload
from zerobatch_core import BatchNativeLoader, DatasetError
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.stores.resolve import open_store

B, T = 8, 16
SLOT = padded_batch_bytes(B, T)  # a slot's bytes, padding included


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    write_sharded_dataset(out, [records(80, T)], batch_size=B, seq_len=T, shard_batches=5, seed=3)
    return out


def _arrays(item: Any) -> tuple[np.ndarray, ...]:
    return tuple(np.array(x) for x in item) if isinstance(item, tuple) else (np.array(item),)


def _corrupt(url: str, slot: int, row: int) -> None:
    store = open_store(url)
    data = bytearray(store.read("shard-00000.batch"))
    data[4096 + slot * SLOT + row * T * 4 + 5] ^= 0xFF
    store.write("shard-00000.batch", bytes(data))


@pytest.mark.parametrize("row", [1, 6])  # in the slot's first step, or in its second
def test_one_rank_with_steps_smaller_than_a_slot_never_serves_a_corrupted_slot(
    dataset: Path, bucket: str, row: int
) -> None:
    url = f"s3://{bucket}/ds"
    upload(dataset, url)
    _corrupt(url, 3, row)
    loader = BatchNativeLoader(url, global_batch_size=B // 2, shuffle=False)
    assert loader.source.verify == "whole"
    served = []
    with pytest.raises(DatasetError, match=r"checksum_mismatch.*slot 3"):
        for item in loader:
            served.append(np.array(item))
    assert len(served) == 6  # slots 0 to 2, two steps each; nothing of slot 3
    local = BatchNativeLoader(dataset, global_batch_size=B // 2, shuffle=False)
    expected = [np.array(item) for _, item in zip(range(6), local, strict=False)]
    assert all(np.array_equal(a, b) for a, b in zip(served, expected, strict=True))
    for _ in range(2):  # every later read of the slot raises again
        with pytest.raises(DatasetError, match="checksum_mismatch"):
            loader.source.read_region(3, 0, B // 2, 0, T)
    loader.source.close()
    local.source.close()


def test_one_rank_fetches_each_slot_once_and_serves_the_local_tokens(
    dataset: Path, bucket: str
) -> None:
    url = f"s3://{bucket}/ds"
    upload(dataset, url)
    for seed, gbs in ((1, 2), (2, 4)):
        remote = BatchNativeLoader(url, global_batch_size=gbs, seed=seed, block_size=3)
        local = BatchNativeLoader(dataset, global_batch_size=gbs, seed=seed, block_size=3)
        got = [np.array(item) for item in remote]
        want = [np.array(item) for item in local]
        assert len(got) == len(want) == 10 * B // gbs
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        stats = remote.source.store.stats.snapshot()
        manifest = (dataset / "manifest.json").stat().st_size
        checksums = (dataset / "checksums.xxh3").stat().st_size
        # Each slot fetched once, whole, plus the manifest, the checksums and two headers.
        assert stats["bytes_read"] == 10 * SLOT + manifest + checksums + 2 * 4096
        remote.source.close()
        local.source.close()


def test_ranks_that_share_slots_still_fetch_only_their_rows(dataset: Path, bucket: str) -> None:
    url = f"s3://{bucket}/ds"
    upload(dataset, url)
    _corrupt(url, 3, 6)
    loader = BatchNativeLoader(url, rank=0, world_size=2, shuffle=False)
    items = list(loader)  # rank 0 reads rows 0..3 only: the damage is in the other rank's rows
    assert len(items) == 10
    stats = loader.source.store.stats.snapshot()
    manifest = (dataset / "manifest.json").stat().st_size
    assert stats["bytes_read"] == 10 * (B // 2) * T * 4 + manifest + 2 * 4096
    loader.source.close()


@pytest.mark.parametrize(("dp", "cp", "gbs"), [(2, 1, B), (1, 2, B // 2), (2, 2, 2 * B)])
def test_every_rank_serves_the_local_loaders_tokens(
    dataset: Path, bucket: str, dp: int, cp: int, gbs: int
) -> None:
    url = f"s3://{bucket}/ds"
    upload(dataset, url)
    for rank in range(dp):
        for c in range(cp):
            kw = dict(
                rank=rank, world_size=dp, context_rank=c, context_size=cp, global_batch_size=gbs
            )
            pairs = cp == 1  # next-token pairs have width T - 1, which cp = 2 cannot split
            remote = BatchNativeLoader(url, seed=9, block_size=2, next_token=pairs, **kw)
            local = BatchNativeLoader(dataset, seed=9, block_size=2, next_token=pairs, **kw)
            for _ in range(2):  # two epochs
                got = [_arrays(item) for item in remote]
                want = [_arrays(item) for item in local]
                assert len(got) == len(want) == 10 * B // gbs
                assert all(
                    np.array_equal(a, b)
                    for g, w in zip(got, want, strict=True)
                    for a, b in zip(g, w, strict=True)
                )
            remote.source.close()
            local.source.close()
