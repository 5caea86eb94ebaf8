"""``zerobatch plan`` and its model of a dataset (``delivery.planning``).

The model must be the dataset as far as the loader can tell (every header, checksum, index
page and manifest it reads checks out, in every verification mode), and a plan must count
exactly the requests the loader makes against the real dataset.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import records
from tests.unit.conftest import Run
from zerobatch_core import BatchNativeLoader
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.datasets.remote import RemoteSource
from zerobatch_core.delivery.planning import (
    ModelStore,
    plan,
    read_dataset_metadata,
    simulate_rank,
)

B, T = 4, 8


@pytest.fixture(scope="module", params=[1, 2], ids=["v1", "v2"])
def dataset(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / f"v{request.param}"
    write_sharded_dataset(
        path,
        [records(300 * B + 3, T)],
        batch_size=B,
        seq_len=T,
        shard_batches=7,
        seed=4,
        manifest_version=request.param,
    )
    return path


@pytest.mark.parametrize("verify", ["off", "whole", "first", "always"])
def test_the_model_passes_every_check_the_loader_makes(dataset: Path, verify: str) -> None:
    manifest, shards, _ = read_dataset_metadata(str(dataset))
    store = ModelStore(str(dataset), manifest, shards)
    with RemoteSource((store, ""), verify=verify) as source:  # type: ignore[arg-type]
        loader = BatchNativeLoader(source, block_size=5, dtype="native")
        assert sum(1 for _ in loader) == 300


@pytest.mark.parametrize(
    ("ranks", "context", "gbs", "verify"),
    [(1, 1, None, None), (2, 2, 2 * B, "first"), (4, 1, 8 * B, "whole"), (1, 1, 2, "always")],
)
def test_a_plan_counts_the_requests_of_the_real_dataset(
    dataset: Path, ranks: int, context: int, gbs: int | None, verify: str | None
) -> None:
    manifest, shards, _ = read_dataset_metadata(str(dataset))
    model = ModelStore(str(dataset), manifest, shards)
    rank, context_rank = ranks - 1, context - 1
    counted = simulate_rank(
        model,
        rank=rank,
        world_size=ranks,
        context_rank=context_rank,
        context_size=context,
        steps=20,
        global_batch_size=gbs,
        verify=verify,
        block_size=6,
    )
    # The same rank over the real files, counted by the store itself.
    source = RemoteSource(str(dataset), verify=verify, prefetch_bytes=0)  # type: ignore[arg-type]
    try:
        opened = source.store.stats.snapshot()["requests"]
        loader = BatchNativeLoader(
            source,
            block_size=6,
            dtype="native",
            rank=rank,
            world_size=ranks,
            context_rank=context_rank,
            context_size=context,
            global_batch_size=gbs,
        )
        items = iter(loader)
        next(items)
        startup = source.store.stats.snapshot()["requests"]
        for _ in range(20):
            next(items)
        steady = source.store.stats.snapshot()["requests"] - startup
    finally:
        source.close()
    assert counted.steps == 20
    # a dataset? (one request), then its manifest, and a version 2 dataset's index top
    assert opened == 2 + (dataset.name == "v2")
    assert counted.startup.total_requests == startup
    assert counted.steady.total_requests == steady


def test_plan_scales_one_rank_to_the_job(dataset: Path) -> None:
    found = plan(str(dataset), ranks=8, context=2, step_seconds=0.5, global_batch_size=8 * B)
    info = found.as_dict()
    assert info["ranks"] == 8 and info["context"] == 2 and found.job_ranks == 16
    per_step = info["per_rank"]["per_step"]["requests"]
    assert info["job"]["requests_per_second"] == pytest.approx(16 * per_step / 0.5)
    assert info["job"]["key_prefixes"] == [str(dataset).rstrip("/") + "/"]
    assert info["manifest_version"] == int(dataset.name[1])
    assert found.warnings == ()  # a local directory: no store limits apply


def test_warnings_name_the_store_limit(dataset: Path) -> None:
    found = plan(str(dataset), ranks=2)
    from zerobatch_core.delivery.planning import _warnings

    busy = replace(found, url="s3://bucket/train", ranks=4096, context=2, step_seconds=0.1)
    text = " ".join(_warnings(busy))
    assert "5,500 GET/s per key prefix (Amazon S3)" in text
    assert "before their first batches" in text


def test_the_command(dataset: Path, run: Run) -> None:
    result = run("plan", dataset, "--ranks", "4", "--context", "2", "--global-batch-size", 16)
    assert result.status == 0, result.err
    assert "per rank, before its first batch:" in result.out
    assert "key prefixes: 1" in result.out
    as_json = run("plan", dataset, "--ranks", "2", "--json")
    assert json.loads(as_json.out)["per_rank"]["startup"]["requests"] >= 3
    bad = run("plan", dataset, "--ranks", "3", "--global-batch-size", "8")
    assert bad.status == 2 and "--global-batch-size 8 is not a multiple of --ranks 3" in bad.err
    with pytest.raises(SystemExit) as exited:  # argparse: a required flag is missing
        run("plan", dataset)
    assert exited.value.code == 2
