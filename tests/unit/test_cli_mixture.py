"""``zerobatch inspect``, ``validate`` and ``trace`` of a mixture file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import records
from tests.unit.conftest import Run
from zerobatch_core import BatchNativeLoader, trace_step, write_batch_file
from zerobatch_core.datasets.build import write_sharded_dataset


@pytest.fixture
def blend(tmp_path: Path) -> Path:
    write_batch_file(tmp_path / "a.batch", records(8 * 10, 16), batch_size=8, seed=1)
    rows = records(8 * 23, 16) + 100_000
    write_sharded_dataset(tmp_path / "b", [rows], batch_size=8, seq_len=16, shard_batches=5)
    doc = {
        "format": "zerobatch.mixture",
        "version": 1,
        "components": [
            {"name": "a", "source": "a.batch", "weight": 0.7},
            {"name": "b", "source": "b", "weight": 0.3},
        ],
        "schedule": [{"start": 100, "weights": {"b": 1}}],
    }
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(doc))
    return path


def test_inspect_prints_the_blend_and_each_components_shape(
    run: Callable[..., Run], blend: Path
) -> None:
    r = run("inspect", blend, "--json")
    assert r.status == 0
    info = json.loads(r.out)
    assert [c["name"] for c in info["components"]] == ["a", "b"]
    assert [c["steps_per_epoch"] for c in info["components"]] == [10, 23]
    assert info["phases"][1] == {"start": 100, "weights": {"a": "0", "b": "1"}}
    text = run("inspect", blend).out
    assert "from step 100: a 0, b 1" in text and "a 0.7, b 0.3" in text


def test_validate_checks_every_component_and_their_fit(
    run: Callable[..., Run], blend: Path, tmp_path: Path
) -> None:
    r = run("validate", "--deep", blend)
    assert r.status == 0 and r.out.strip().endswith("mixture of 2 components")
    shard = sorted((tmp_path / "b").glob("*.batch"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # a byte of a slot's padding or tokens
    shard.write_bytes(bytes(data))
    r = run("validate", "--deep", "--json", blend)
    report = json.loads(r.out)
    assert r.status == 1 and not report["valid"]
    assert [c["valid"] for c in report["components"]] == [True, False]
    other = tmp_path / "c.batch"
    write_batch_file(other, records(8 * 3, 9), batch_size=8)
    doc = json.loads(blend.read_text())
    doc["components"][1] = {"name": "c", "source": "c.batch", "weight": 1}
    doc["schedule"] = []
    blend.write_text(json.dumps(doc))
    r = run("validate", blend)
    assert r.status == 1 and "has seq_len 9" in r.out
    blend.write_text('{"format": "zerobatch.mixture", "version": 1, "components": []}')
    r = run("inspect", blend)
    assert r.status == 1 and "components must be a non-empty list" in r.err


def test_trace_names_the_component_then_its_own_step(run: Callable[..., Run], blend: Path) -> None:
    loader = BatchNativeLoader(blend, rank=1, world_size=4)
    for step, batch in zip(range(12), loader, strict=False):
        trace = trace_step(blend, step, rank=1, world_size=4)
        assert trace.component is not None
        assert trace.component.name == loader.component_at((0, step))  # type: ignore[attr-defined]
        inputs = [o.record for p in trace.pieces for o in p.origins]
        base = 0 if trace.component.name == "a" else 100_000
        np.testing.assert_array_equal(np.asarray(batch)[:, 0], np.array(inputs) * 16 + base)
    r = run("trace", blend, "--step", "101", "--json")
    assert r.status == 0
    out = json.loads(r.out)
    assert out["mixture"]["component"] == "b" and out["mixture"]["global_step"] == 101


def test_a_json_file_that_is_not_a_mixture_is_named(
    run: Callable[..., Run], tmp_path: Path
) -> None:
    path = tmp_path / "other.json"
    path.write_text('{"a": 1}')
    r = run("inspect", path)
    assert r.status == 1 and "format must be 'zerobatch.mixture'" in r.err
