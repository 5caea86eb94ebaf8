"""4,096 ranks x 100,000 shards, simulated: every rank's loader opens a version 2 dataset of
100,000 shards (10^8 slots) in a model store that counts requests and moves no data
(``delivery.planning.ModelStore``), and what each rank fetches before its first batch and per
step stays within the targets of ``SPEC.md`` section 23's design: a few requests and under
1 MB of metadata before the first batch, whatever the shard count; in steady state the rank's
own slot reads plus a vanishing share of index reads; checksum bytes only for the shards it
reads. A version 1 rank of the same dataset is shown reading the whole manifest for contrast.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from zerobatch_spec import Header, build_header, expected_file_size
from zerobatch_spec.dataset import (
    SHARD_NAME_FORMAT,
    IndexRef,
    Manifest,
    Shard,
    header_xxh3,
    shard_seed,
)

from zerobatch_core.delivery.planning import ModelStore, simulate_rank

SHARDS = 100_000
SLOTS = 1024  # per shard: 10^8 slots in all (a multiple of the block size)
B, T = 8, 1024
D, C = 2048, 2  # 4,096 ranks
GLOBAL = D * B  # a step: one stored batch's rows for each data-parallel rank
ROWS = GLOBAL // D  # rows of a rank; under context parallelism one request each
MIB = 1 << 20


@pytest.fixture(scope="module")
def entries() -> list[Shard]:
    out = []
    for i in range(SHARDS):
        seed = shard_seed(0, i)
        header = build_header(Header(B, T, SLOTS, seed, SLOTS * B))
        size = expected_file_size(B, T, SLOTS)
        records = (i * SLOTS * B, (i + 1) * SLOTS * B)
        out.append(
            Shard(
                SHARD_NAME_FORMAT.format(i),
                SLOTS,
                seed,
                SLOTS * B,
                size,
                header_xxh3(header),
                records,
            )
        )
    return out


@pytest.fixture(scope="module")
def model(entries: list[Shard]) -> ModelStore:
    manifest = Manifest(
        B,
        T,
        0,
        (),
        "0" * 16,
        (),
        {},
        0,
        2,
        IndexRef("shards.zbi", 0, "0" * 16),
        SHARDS,
        SHARDS * SLOTS,
    )
    return ModelStore("s3://bucket/train", manifest, entries)


def _metadata(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k != "shards")


def test_every_one_of_4096_ranks_starts_with_a_few_requests(model: ModelStore) -> None:
    worst_requests = worst_bytes = 0
    for r in range(D * C):
        rank, context_rank = divmod(r, C)
        found = simulate_rank(
            model,
            rank=rank,
            world_size=D,
            context_rank=context_rank,
            context_size=C,
            steps=0,
            global_batch_size=GLOBAL,
        )
        start = found.startup
        worst_requests = max(worst_requests, _metadata(start.requests))
        worst_bytes = max(worst_bytes, _metadata(start.bytes))
        assert start.requests["shards"] <= ROWS, (r, dict(start.requests))
    # is it a dataset (1), the manifest (1), the index's top (1), its first shard's page (1)
    assert worst_requests <= 4
    assert worst_bytes < MIB


@pytest.mark.parametrize("verify", ["whole", "first"])
@pytest.mark.parametrize(("rank", "context_rank"), [(0, 0), (D // 2, 1), (D - 1, 1)])
def test_steady_state_requests_are_the_ranks_own_reads(
    model: ModelStore, rank: int, context_rank: int, verify: str
) -> None:
    steps = 512
    found = simulate_rank(
        model,
        rank=rank,
        world_size=D,
        context_rank=context_rank,
        context_size=C,
        steps=steps,
        global_batch_size=GLOBAL,
        verify=verify,
    )
    assert found.steps == steps
    steady = found.steady
    # A step of 2,048 stored batches spans 8 blocks, so every step of a rank enters a new
    # shard: its page comes with a window of pages (about a dozen hold the whole index), and
    # under "first" its checksum range is read, and only its own.
    assert steady.requests["index"] <= 12  # 64 KiB .. 1 MiB windows: the 7.2 MB index once
    shards_read = len(steady.keys)
    if verify == "whole":  # partial slots: not checkable, nothing fetched to check them
        assert steady.requests["shards"] == steps * ROWS
        assert steady.requests["checksums"] == 0
    else:  # the first read of a slot fetches it whole, checked against its shard's range
        assert steady.requests["shards"] == steps
        assert steady.requests["checksums"] <= shards_read
        assert steady.bytes["checksums"] == steady.requests["checksums"] * SLOTS * 8


def test_a_version_1_rank_reads_the_whole_manifest(model: ModelStore, entries: list[Shard]) -> None:
    manifest = Manifest(B, T, 0, tuple(entries), "0" * 16, (), {}, 0)
    v1 = ModelStore("s3://bucket/train", replace(manifest), entries)
    found = simulate_rank(
        v1, rank=0, world_size=D, context_rank=0, context_size=C, steps=0, global_batch_size=GLOBAL
    )
    assert found.startup.bytes["manifest"] > 16 * MIB  # ~166 bytes a shard, every rank
