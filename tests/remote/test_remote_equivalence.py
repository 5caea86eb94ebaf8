"""Remote ranks serve exactly the local loader's tokens.

A ``D x C`` rank of a dataset in S3 (the moto server of ``conftest.py``) fetches only its rows
and token chunks as byte ranges, prefetched on a thread pool; the local loader slices a mapped
shard. Both must serve the same tokens at every step, for every rank, zig-zag or not, across
an epoch boundary (the second epoch is another shuffled order), from a state saved on either
side, and with a global batch size other than the stored one. Counting requests or bytes
cannot tell a rank that fetched the right amount of the wrong bytes: these tests compare the
tokens themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import records
from tests.remote.conftest import upload
from zerobatch_core import BatchNativeLoader
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.datasets.remote import RemoteSource

B, T = 8, 16
STEPS = 12
"""Stored batches of the dataset: one epoch is 12 steps at the stored batch size."""


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    # Shards of 5, 5 and 2 batches: the dataset order's blocks cross shard ends.
    write_sharded_dataset(
        out, [records(STEPS * B, T)], batch_size=B, seq_len=T, shard_batches=5, seed=3
    )
    return out


@pytest.fixture
def url(dataset: Path, bucket: str) -> str:
    target = f"s3://{bucket}/ds"
    upload(dataset, target)
    return target


def _run(loader: BatchNativeLoader, steps: int) -> list[Any]:
    """``steps`` items from the loader's cursor on, across epoch ends, as host copies."""
    out: list[Any] = []
    while len(out) < steps:
        for item in loader:
            out.append(
                tuple(np.array(x) for x in item) if isinstance(item, tuple) else np.array(item)
            )
            if len(out) == steps:
                break
    return out


def _equal(a: list[Any], b: list[Any]) -> bool:
    def parts(x: Any) -> tuple[Any, ...]:
        return x if isinstance(x, tuple) else (x,)

    return len(a) == len(b) and all(
        len(parts(x)) == len(parts(y))
        and all(
            p.dtype == q.dtype and np.array_equal(p, q)
            for p, q in zip(parts(x), parts(y), strict=True)
        )
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize(
    ("dp", "cp", "zigzag"),
    [(2, 2, False), (2, 2, True), (4, 1, False), (1, 2, False), (1, 2, True)],
)
def test_every_rank_serves_the_local_tokens_across_an_epoch_boundary(
    dataset: Path, url: str, dp: int, cp: int, zigzag: bool
) -> None:
    served_rows: list[list[np.ndarray]] = []
    for rank in range(dp):
        for c in range(cp):
            kw: dict[str, Any] = {
                "rank": rank,
                "world_size": dp,
                "context_rank": c,
                "context_size": cp,
                "zigzag": zigzag,
                "seed": 9,
                "block_size": 2,
            }
            local = BatchNativeLoader(dataset, **kw)
            remote = BatchNativeLoader(url, **kw)
            assert isinstance(remote.source, RemoteSource)
            expected = _run(local, 2 * STEPS + 3)  # two epochs and three steps of the third
            got = _run(remote, 2 * STEPS + 3)
            assert _equal(expected, got), (rank, c)
            assert remote.position == local.position
            served_rows.append(got)
            remote.source.close()
    # The ranks together hold each step's global batch once: every token of the epoch.
    for step in range(STEPS):
        tokens = np.concatenate([r[step].reshape(-1) for r in served_rows])
        assert tokens.size == B * T and np.unique(tokens).size == B * T


@pytest.mark.parametrize(("dp", "cp"), [(2, 2), (1, 2)])
def test_next_token_int64_ranks_resume_across_copies(
    tmp_path: Path, bucket: str, dp: int, cp: int
) -> None:
    """A state saved mid-epoch on the local copy resumes on the remote one, into the next
    epoch, with int64 ``(inputs, labels)`` pairs (the conversion thread's chunked path)."""
    dataset = tmp_path / "pairs"  # 17 tokens: 16-token pairs split into C chunks
    write_sharded_dataset(
        dataset, [records(STEPS * B, T + 1)], batch_size=B, seq_len=T + 1, shard_batches=5
    )
    url = f"s3://{bucket}/pairs"
    upload(dataset, url)
    for rank in range(dp):
        for c in range(cp):
            kw: dict[str, Any] = {
                "rank": rank,
                "world_size": dp,
                "context_rank": c,
                "context_size": cp,
                "next_token": True,
                "dtype": "int64",
                "seed": 4,
            }
            local = BatchNativeLoader(dataset, **kw)
            _run(local, STEPS - 4)
            state = local.state_dict()
            expected = _run(local, 8)  # the last four of epoch 0, the first four of epoch 1
            remote = BatchNativeLoader(url, **kw)
            remote.load_state_dict(state)
            got = _run(remote, 8)
            assert _equal(expected, got), (rank, c)
            assert remote.state_dict() == local.state_dict()
            remote.source.close()


@pytest.mark.parametrize(("dp", "global_batch"), [(2, 2 * B), (2, B // 2), (1, B // 2)])
def test_a_global_batch_other_than_the_stored_one_serves_the_local_tokens(
    dataset: Path, url: str, dp: int, global_batch: int
) -> None:
    """Steps that span several stored batches or a part of one (regions of several slots or
    rows of one) are the local loader's, rank by rank, over more than one epoch, with skipped
    steps in both."""
    for rank in range(dp):
        kw: dict[str, Any] = {
            "rank": rank,
            "world_size": dp,
            "global_batch_size": global_batch,
            "seed": 2,
        }
        n = len(BatchNativeLoader(dataset, **kw))
        kw["skip_steps"] = [(1, 2), (n + 1, n + 3)]  # in epoch 0 and in epoch 1
        local = BatchNativeLoader(dataset, **kw)
        remote = BatchNativeLoader(url, **kw)
        assert _equal(_run(local, n + 3), _run(remote, n + 3)), rank
        remote.source.close()


@pytest.mark.parametrize("coalesce", [0, 100, 1 << 20])
def test_coalesced_and_cached_ranges_serve_the_local_tokens(
    dataset: Path, url: str, tmp_path: Path, coalesce: int
) -> None:
    """Ranges merged across their gaps (``coalesce``) and served again from the range cache
    are cut back into exactly the rank's rows and chunks."""
    cache = str(tmp_path / "cache")
    for rank, c in ((1, 0), (0, 1)):
        kw: dict[str, Any] = {
            "rank": rank,
            "world_size": 2,
            "context_rank": c,
            "context_size": 2,
            "zigzag": True,
            "seed": 6,
        }
        expected = _run(BatchNativeLoader(dataset, **kw), STEPS + 2)
        for _ in range(2):  # the second pass is served from the cache
            source = RemoteSource(url, coalesce=coalesce, cache_dir=cache, cache_bytes=1 << 24)
            got = _run(BatchNativeLoader(source, **kw), STEPS + 2)
            assert _equal(expected, got), (rank, c, coalesce)
            source.close()
        assert source.cache is not None and source.cache.hits > 0


@pytest.mark.parametrize("verify", ["first", "always", "off"])
def test_ranks_that_fetch_whole_slots_to_check_them_serve_the_local_tokens(
    dataset: Path, url: str, verify: Any
) -> None:
    """``first`` and ``always`` fetch the whole slot and cut the rank's rows and chunks out of
    it (``off`` fetches only the ranges): the tokens are the local loader's either way."""
    for rank, c in ((0, 0), (1, 1)):
        kw: dict[str, Any] = {
            "rank": rank,
            "world_size": 2,
            "context_rank": c,
            "context_size": 2,
            "zigzag": True,
            "seed": 1,
        }
        expected = _run(BatchNativeLoader(dataset, **kw), STEPS + 2)
        remote = BatchNativeLoader(url, verify=verify, **kw)
        assert _equal(expected, _run(remote, STEPS + 2)), (rank, c, verify)
        remote.source.close()
