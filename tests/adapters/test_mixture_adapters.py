"""Every adapter serves a mixture as the core's ``MixtureLoader`` does, and says which
component each batch came from (``last_component``) without changing its items."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.adapters.contract_adapters import ADAPTERS, make
from tests.adapters.test_contract import assert_items, core, host
from tests.helpers import records, require
from zerobatch_core import BatchNativeLoader, Mixture, write_batch_file
from zerobatch_core.datasets.build import write_sharded_dataset

T, G = 16, 8


@pytest.fixture(params=list(ADAPTERS))
def name(request: pytest.FixtureRequest) -> str:
    adapter: str = request.param
    if ADAPTERS[adapter][0] != "numpy":
        require(ADAPTERS[adapter][0])
    return adapter


@pytest.fixture
def mixture(tmp_path: Path) -> Mixture:
    write_batch_file(tmp_path / "a.batch", records(8 * 5, T), batch_size=8, seed=1)
    rows = records(4 * 13, T) + 50_000
    write_sharded_dataset(tmp_path / "b", [rows], batch_size=4, seq_len=T, shard_batches=4, seed=2)
    return Mixture(
        [("a", tmp_path / "a.batch", 0.25), ("b", tmp_path / "b", 0.75)],
        schedule=[(7, {"a": 1})],
        global_batch_size=G,
        steps=12,
    )


@pytest.mark.parametrize("options", [{}, {"next_token": True, "rank": 1, "world_size": 2}])
def test_every_adapter_serves_the_mixture_and_names_each_batchs_component(
    name: str, mixture: Mixture, options: dict[str, Any]
) -> None:
    options = {"block_size": 2, **options}
    want = core(mixture, 2, **options)  # type: ignore[arg-type]
    reference = BatchNativeLoader(mixture, **options)
    names = [reference.component_at((e, k)) for e in range(2) for k in range(12)]  # type: ignore[attr-defined]
    got, seen = [], []
    with make(name, mixture, **options) as data:  # type: ignore[arg-type]
        assert len(data) == 12
        assert data.last_component is None
        for _ in range(2):
            for item in data:
                got.append(host(item))
                seen.append(data.last_component)
        assert [data.component_at(e, k) for e in range(2) for k in range(12)] == names
    assert_items(got, want)
    assert seen == names
    assert names[7:12] == ["a"] * 5  # the second phase


def test_the_core_stream_names_components_with_and_without_prefetch(mixture: Mixture) -> None:
    from zerobatch_core import BatchStream

    for prefetch in (0, 3):
        with BatchStream(mixture, prefetch=prefetch) as data:
            firsts = []
            for batch in data:
                firsts.append((data.last_component, int(np.asarray(batch)[0, 0])))
        assert [n for n, _ in firsts][7:12] == ["a"] * 5
        assert all((tok < 50_000) == (n == "a") for n, tok in firsts)
