"""A mixture with a component on the S3-compatible test server, beside a local file and a
local sharded dataset: SPEC.md section 21's schedule over 10,000 steps, the conformance
vector's answer for the same weights, each component's own sequence, and lazy opening."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np

from tests.helpers import records
from tests.remote.conftest import upload
from zerobatch_core import BatchNativeLoader, Mixture, MixtureLoader, write_batch_file
from zerobatch_core.datasets.build import write_sharded_dataset

ROOT = Path(__file__).resolve().parents[2]
G, T = 8, 12
VECTOR = ROOT / "conformance" / "vectors" / "mixture-order-weights-50-30-20"


def test_three_components_one_remote(tmp_path: Path, bucket: str) -> None:
    write_batch_file(tmp_path / "f.batch", records(8 * 9, T), batch_size=8, seed=1)
    write_sharded_dataset(
        tmp_path / "d", [records(8 * 11, T) + 10_000], batch_size=8, seq_len=T, shard_batches=4
    )
    write_sharded_dataset(
        tmp_path / "r", [records(8 * 13, T) + 20_000], batch_size=8, seq_len=T, shard_batches=5
    )
    url = f"s3://{bucket}/remote"
    upload(tmp_path / "r", url)
    components = [("file", tmp_path / "f.batch", 0.5), ("dataset", tmp_path / "d", 0.3)]
    mix = Mixture([*components, ("remote", url, 0.2)], global_batch_size=G)
    loader = BatchNativeLoader(mix, dtype="int64", block_size=2)
    assert isinstance(loader, MixtureLoader)
    assert set(loader.source._opened) == {0}  # the remote dataset is opened at its first use
    names = list(loader.names)
    order = [names.index(loader.component_at((0, k))) for k in range(10_000)]
    query = json.loads((VECTOR.with_suffix(".query.json")).read_text())
    answer = json.loads((VECTOR.with_suffix(".expected.json")).read_text())["expected"]["result"]
    assert query["phases"] == [{"start": 0, "weights": [500_000_000, 300_000_000, 200_000_000]}]
    assert order[: len(answer)] == [c for c, _ in answer] and len(answer) == 200
    # The positions the vector pins are each component's cursor, in global batches.
    steps_per_epoch = {"file": 9, "dataset": 11, "remote": 13}  # batches of G each
    for k in (0, 57, 199):
        name = names[answer[k][0]]
        epoch, step = divmod(answer[k][1], steps_per_epoch[name])
        assert loader.component_positions((0, k))[name] == (epoch, step * G)
    counts = [0, 0, 0]
    for t, c in enumerate(order, start=1):
        counts[c] += 1
        assert all(abs(n - Fraction(t * w, 10)) < 1 for n, w in zip(counts, (5, 3, 2), strict=True))
    served: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for k, batch in zip(range(300), loader, strict=False):
        served[names[order[k]]].append(np.array(batch))
    for name, source in (
        ("file", tmp_path / "f.batch"),
        ("dataset", tmp_path / "d"),
        ("remote", url),
    ):
        own = BatchNativeLoader(source, dtype="int64", block_size=2, global_batch_size=G)
        sequence = [np.array(b) for _ in range(40) for b in own][: len(served[name])]
        assert len(sequence) == len(served[name]) > 0
        for a, b in zip(served[name], sequence, strict=True):
            np.testing.assert_array_equal(a, b)
    loader.source.close()
