"""Shard names spread over key prefixes (``SPEC.md`` 23.1, ``prefixes``).

Unit and property-based: ``shard_file_name`` gives distinct names under the name rule, each
behind the prefix of its number modulo ``P``, and the index's generated names follow it.
End to end on local directories: a dataset written with prefixes serves exactly what the same
records written without them serve, validates, replaces and is replaced whole; writers refuse
prefixes where the manifest cannot record them; ``zerobatch plan`` reports the spread.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zerobatch_spec.dataset import (
    MAX_PREFIXES,
    SHARD_NAME_FORMAT,
    Manifest,
    is_shard_name,
    key_prefix,
    parse_manifest,
    shard_file_name,
)
from zerobatch_spec.index import HEAD, INDEX_NAME, IndexTop, iter_shards, parse_top

from tests.helpers import records
from zerobatch_core import BatchNativeLoader, DatasetReader, WriteError
from zerobatch_core.cli.main import main
from zerobatch_core.datasets.build import SHARD_NAME, shard_file_names, write_sharded_dataset
from zerobatch_core.datasets.validation import validate_dataset
from zerobatch_core.delivery.planning import plan

B, T = 2, 8


@settings(max_examples=200, deadline=None)
@given(shard=st.integers(0, 10**7), prefixes=st.integers(1, MAX_PREFIXES))
def test_a_prefixed_name_is_a_shard_name_behind_its_prefix(shard: int, prefixes: int) -> None:
    name = shard_file_name(shard, prefixes)
    assert is_shard_name(name) and SHARD_NAME.match(name)
    assert name.endswith(SHARD_NAME_FORMAT.format(shard))
    prefix = key_prefix(name, prefixes)
    if prefixes == 1:
        assert name == SHARD_NAME_FORMAT.format(shard) and prefix == ""
    else:
        digits = len(format(prefixes - 1, "x"))
        assert prefix == format(shard % prefixes, f"0{digits}x") + "-"
        assert int(prefix[:-1], 16) == shard % prefixes
        assert name == prefix + SHARD_NAME_FORMAT.format(shard)


@settings(max_examples=30, deadline=None)
@given(prefixes=st.integers(2, 300), count=st.integers(1, 700))
def test_names_are_distinct_and_spread_evenly(prefixes: int, count: int) -> None:
    names = [shard_file_name(i, prefixes) for i in range(count)]
    assert len(set(names)) == count
    per = Counter(key_prefix(n, prefixes) for n in names)
    assert len(per) == min(prefixes, count)
    assert max(per.values()) - min(per.values()) <= 1


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same records as a version 2 dataset without prefixes and with 16."""
    root = tmp_path_factory.mktemp("prefixes")
    rows = [records(70 * B, T)]
    kw = dict(batch_size=B, seq_len=T, shard_batches=1, seed=3, manifest_version=2)
    write_sharded_dataset(root / "plain", rows, **kw)  # type: ignore[arg-type]
    write_sharded_dataset(root / "spread", rows, prefixes=16, **kw)  # type: ignore[arg-type]
    return root / "plain", root / "spread"


def test_the_manifest_and_the_index_record_the_prefixes(twins: tuple[Path, Path]) -> None:
    _, spread = twins
    doc = json.loads((spread / "manifest.json").read_text())
    assert doc["prefixes"] == 16
    assert list(doc)[-2:] == ["prefixes", "sources"]  # canonical order: after num_batches
    parsed = parse_manifest((spread / "manifest.json").read_bytes())
    assert isinstance(parsed, Manifest) and parsed.prefixes == 16
    data = (spread / INDEX_NAME).read_bytes()
    assert HEAD.unpack_from(data)[12] == 16
    top = parse_top(data, len(data))
    assert isinstance(top, IndexTop) and top.generated_names and top.prefixes == 16
    names = [e.shard.name for e in iter_shards(top, data)]  # type: ignore[union-attr]
    assert names == [shard_file_name(i, 16) for i in range(70)]
    on_disk = sorted(n for n in os.listdir(spread) if n.endswith(".batch"))
    assert on_disk == sorted(names)
    assert Counter(key_prefix(n, 16) for n in on_disk) == Counter(
        {f"{p:x}-": (70 - p + 15) // 16 for p in range(16)}
    )


def test_a_dataset_without_prefixes_keeps_its_bytes(twins: tuple[Path, Path]) -> None:
    plain, _ = twins
    assert "prefixes" not in json.loads((plain / "manifest.json").read_text())
    assert HEAD.unpack_from((plain / INDEX_NAME).read_bytes())[12] == 0


def test_prefixes_change_names_only(twins: tuple[Path, Path]) -> None:
    plain, spread = twins
    for i in range(70):
        one = (plain / SHARD_NAME_FORMAT.format(i)).read_bytes()
        assert one == (spread / shard_file_name(i, 16)).read_bytes()
    assert (plain / "checksums.xxh3").read_bytes() == (spread / "checksums.xxh3").read_bytes()
    served = []
    for path in twins:
        with DatasetReader(path) as reader:
            loader = BatchNativeLoader(
                reader,
                dtype="int64",
                block_size=3,
                seed=4,
                rank=1,
                world_size=2,
                global_batch_size=2 * B,
            )
            served.append([np.array(x).tolist() for x in loader])
    assert served[0] == served[1] and len(served[0]) == 35
    report = validate_dataset(spread, deep=True)
    assert report.valid, report.failures


def test_writers_refuse_prefixes_the_manifest_cannot_record(tmp_path: Path) -> None:
    rows = [records(4 * B, T)]
    kw = dict(batch_size=B, seq_len=T, shard_batches=1)
    with pytest.raises(WriteError, match="manifest_version=2"):
        write_sharded_dataset(tmp_path / "v1", rows, prefixes=4, **kw)  # type: ignore[arg-type]
    for bad in (0, MAX_PREFIXES + 1, True, 4.0):
        with pytest.raises(WriteError, match="prefixes"):
            write_sharded_dataset(
                tmp_path / "bad",
                rows,
                prefixes=bad,
                manifest_version=2,
                **kw,  # type: ignore[arg-type]
            )
    assert not (tmp_path / "v1").exists() or not os.listdir(tmp_path / "v1")
    assert not (tmp_path / "bad").exists() or not os.listdir(tmp_path / "bad")


def test_replacing_drops_the_old_prefixed_shards(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    kw = dict(batch_size=B, seq_len=T, shard_batches=1, manifest_version=2)
    write_sharded_dataset(out, [records(20 * B, T)], prefixes=8, **kw)  # type: ignore[arg-type]
    (out / "notes.txt").write_text("mine")
    write_sharded_dataset(out, [records(5 * B, T)], overwrite=True, **kw)  # type: ignore[arg-type]
    assert sorted(n for n in os.listdir(out) if n.endswith(".batch")) == [
        SHARD_NAME_FORMAT.format(i) for i in range(5)
    ]
    assert (out / "notes.txt").read_text() == "mine"
    write_sharded_dataset(out, [records(9 * B, T)], prefixes=4, overwrite=True, **kw)  # type: ignore[arg-type]
    assert shard_file_names(str(out)) == sorted(shard_file_name(i, 4) for i in range(9))
    assert validate_dataset(out, deep=True).valid


def test_the_command_line_writes_and_refuses_prefixes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "t.npy"
    np.save(src, records(12 * B, T))
    common = ["convert", str(src), "--seq-len", str(T), "--batch-size", str(B)]
    out = tmp_path / "ds"
    code = main([*common, str(out), "--shard-size", "2", "--shard-prefixes", "4"])
    assert code == 2 and "--manifest-version 2" in capsys.readouterr().err
    assert not out.exists()
    code = main(
        [
            *common,
            str(out),
            "--shard-size",
            "1",
            "--shard-prefixes",
            "4",
            "--manifest-version",
            "2",
            "--quiet",
        ]
    )
    assert code == 0
    assert json.loads((out / "manifest.json").read_text())["prefixes"] == 4
    assert shard_file_names(str(out)) == sorted(shard_file_name(i, 4) for i in range(12))
    assert main(["inspect", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prefixes"] == 4


def test_plan_reports_the_spread(twins: tuple[Path, Path]) -> None:
    plain, spread = twins
    flat = plan(str(plain), ranks=8, step_seconds=0.5, global_batch_size=8 * B)
    wide = plan(str(spread), ranks=8, step_seconds=0.5, global_batch_size=8 * B)
    assert flat.prefixes == (str(plain) + "/",)
    assert wide.prefixes == tuple(f"{spread}/{p:x}-" for p in range(16))
    assert flat.busiest_share == 1.0
    assert wide.busiest_share == pytest.approx(5 / 70)  # prefixes 0-5 hold 5 shards, the rest 4
    assert flat.prefix_rate == pytest.approx(flat.job_rate)
    shards = wide.steady.requests["shards"] / wide.steps
    other = wide.step_requests - shards
    assert wide.prefix_rate == pytest.approx(8 * (shards * 5 / 70 + other) / 0.5)
    # Unchecked reads are all shard reads, divided among the prefixes; checked reads add one
    # range of checksums.xxh3 (at the root) per shard entered.
    unchecked = plan(str(spread), ranks=8, step_seconds=0.5, global_batch_size=8 * B, verify="off")
    assert unchecked.prefix_rate < unchecked.job_rate / 8
    doc = wide.as_dict()["job"]
    assert doc["key_prefixes"] == list(wide.prefixes)
    assert doc["requests_per_second_busiest_prefix"] == pytest.approx(wide.prefix_rate)


def test_the_rate_warning_points_to_prefixes_that_lift_it(twins: tuple[Path, Path]) -> None:
    from zerobatch_core.delivery.planning import _warnings

    texts = []
    for path in twins:
        found = plan(str(path), ranks=8, global_batch_size=8 * B, verify="off")
        busy = replace(found, url="s3://bucket/train", ranks=2048, step_seconds=0.2)
        assert busy.job_rate > 5500
        texts.append(" ".join(_warnings(busy)))
    flat, spread = texts
    assert "on one key prefix crosses" in flat and "--shard-prefixes, now 1" in flat
    assert "on one key prefix crosses" not in spread  # 16 prefixes: each under the limit
