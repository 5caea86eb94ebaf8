"""Manifest version 2: the shard index (``zerobatch_spec.index``) and datasets that use it.

Unit: the index round-trips any shard list (property-based); its top and pages refuse what
SPEC.md section 23 refuses. End to end on local directories: a version 2 dataset serves exactly
what its version 1 twin serves, in every order and slicing; opening reads the index's top and
nothing else; a checked read reads the checksums of its shard only; a broken page, a missing
index and a checksum range that disagrees are errors naming the field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from zerobatch_spec.dataset import (
    SHARD_NAME_FORMAT,
    DatasetCode,
    DatasetViolation,
    Shard,
    parse_manifest,
)
from zerobatch_spec.index import (
    HEAD_SIZE,
    INDEX_NAME,
    RECORD_SIZE,
    IndexTop,
    build_index,
    iter_shards,
    parse_top,
    runs_of,
)
from zerobatch_spec.layout import expected_file_size

from tests.helpers import records
from zerobatch_core import BatchNativeLoader, DatasetError, DatasetReader, create_dataset
from zerobatch_core.datasets.build import write_sharded_dataset
from zerobatch_core.datasets.validation import validate_dataset

B, T = 2, 8


def _shards(counts: list[int], generated: bool, known: bool) -> list[Shard]:
    out = []
    for i, n in enumerate(counts):
        name = SHARD_NAME_FORMAT.format(i) if generated else f"part_{i}-x.batch"
        records_ = (i * 100, i * 100 + n * B + 1) if known else None
        size = expected_file_size(B, T, n, 0)
        out.append(Shard(name, n, i * 7, n * B + 1, size, f"{i:016x}", records_))
    return out


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 5), min_size=0, max_size=150),
    generated=st.booleans(),
    known=st.booleans(),
    page=st.integers(1, 70),
)
def test_the_index_round_trips_any_shard_list(
    counts: list[int], generated: bool, known: bool, page: int
) -> None:
    shards = _shards(counts, generated, known)
    sums = np.arange(sum(counts), dtype="<u8").tobytes()
    data = build_index(shards, sums, batch_size=B, seq_len=T, dtype=0, seed=9, page_records=page)
    top = parse_top(data, len(data))
    assert isinstance(top, IndexTop)
    assert top.shard_count == len(shards) and top.num_batches == sum(counts)
    assert top.runs.shape[0] == len(runs_of(counts))
    assert top.shard_batches().tolist() == counts
    assert top.generated_names == (generated or not shards)
    got = list(iter_shards(top, data))
    assert [g.shard for g in got] == shards
    first = 0
    for g, n in zip(got, counts, strict=True):
        assert g.first_slot == first
        assert (
            g.checksums_xxh3
            == f"{xxhash.xxh3_64_intdigest(sums[first * 8 : (first + n) * 8]):016x}"
        )
        first += n


def test_every_byte_of_the_top_is_covered() -> None:
    shards = _shards([3, 3, 1], True, True)
    data = build_index(shards, bytes(7 * 8), batch_size=B, seq_len=T, dtype=0, seed=1)
    top = parse_top(data, len(data))
    assert isinstance(top, IndexTop)
    for at in range(top.top_bytes):
        broken = bytearray(data)
        broken[at] ^= 0x01
        found = parse_top(bytes(broken), len(broken))
        assert isinstance(found, DatasetViolation), at
        assert found.code is DatasetCode.INDEX_MISMATCH
    assert isinstance(parse_top(data[: HEAD_SIZE - 1], len(data)), DatasetViolation)
    assert isinstance(parse_top(data, len(data) + 1), DatasetViolation)  # pages end early


def test_a_page_byte_is_caught_by_its_digest() -> None:
    shards = _shards([1] * 70, True, True)
    data = build_index(shards, bytes(70 * 8), batch_size=B, seq_len=T, dtype=0, seed=1)
    top = parse_top(data, len(data))
    assert isinstance(top, IndexTop)
    broken = bytearray(data)
    broken[top.top_bytes + RECORD_SIZE * 64 + 3] ^= 0x10  # the second page
    found = list(iter_shards(top, bytes(broken)))
    assert len(found) == 65 and isinstance(found[-1], DatasetViolation)
    assert found[-1].where == "index.pages[1]"


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("twins")
    rows = [records(2 * 150 + 1, T)]  # 150 slots in shards of 4 (the last of 2), 1 dropped
    kw = dict(batch_size=B, seq_len=T, shard_batches=4, seed=3)
    write_sharded_dataset(root / "v1", rows, **kw)  # type: ignore[arg-type]
    write_sharded_dataset(root / "v2", rows, manifest_version=2, **kw)  # type: ignore[arg-type]
    return root / "v1", root / "v2"


def test_the_writer_writes_a_small_manifest_and_an_index(twins: tuple[Path, Path]) -> None:
    v1, v2 = twins
    manifest = json.loads((v2 / "manifest.json").read_text())
    assert manifest["version"] == 2 and "shards" not in manifest
    assert manifest["index"]["name"] == INDEX_NAME
    assert manifest["shard_count"] == 38 and manifest["num_batches"] == 150
    assert (v2 / "manifest.json").stat().st_size < 400
    for name in os.listdir(v1):
        if name != "manifest.json":
            assert (v1 / name).read_bytes() == (v2 / name).read_bytes(), name
    parsed = parse_manifest((v2 / "manifest.json").read_bytes())
    assert not isinstance(parsed, DatasetViolation) and parsed.index is not None
    assert parsed.index.size == (v2 / INDEX_NAME).stat().st_size


@pytest.mark.parametrize(
    "options",
    [
        dict(block_size=3, seed=1),
        dict(block_size=100, seed=2, dtype="int64", next_token=True),
        dict(shuffle=False),
        dict(
            block_size=2, rank=1, world_size=2, context_rank=1, context_size=2, global_batch_size=4
        ),
        dict(block_size=5, global_batch_size=1),
    ],
)
def test_same_batches_as_version_1(twins: tuple[Path, Path], options: dict[str, object]) -> None:
    served = []
    for path in twins:
        loader = BatchNativeLoader(path, **options)  # type: ignore[arg-type]
        got = []
        for e in range(2):
            loader.set_epoch(e)
            got.extend(
                np.array(x).tolist()
                if not isinstance(x, tuple)
                else [np.array(y).tolist() for y in x]
                for x in loader
            )
        served.append((got, loader.state_dict()))
    assert served[0][0] == served[1][0]
    assert len(served[0][0]) > 0


def test_opening_reads_the_top_and_pages_only_as_shards_are_used(twins: tuple[Path, Path]) -> None:
    _, v2 = twins
    with DatasetReader(v2, verify="first") as reader:
        table = reader.table
        assert table.pages_read == 0 and len(reader.shards) == 38  # type: ignore[attr-defined]
        reader.read_batch(149)  # the last shard: the last page
        assert table.pages_read == 0  # a small index came whole with its top
        assert reader._range_checksums.keys() == {37}
        assert reader._checksums is None  # the whole checksums file was never read
        assert [reader.shards[i].name for i in (0, 37)] == [
            "shard-00000.batch",
            "shard-00037.batch",
        ]


def test_large_index_reads_pages_on_demand(tmp_path: Path) -> None:
    shards = 3000
    path = tmp_path / "big"
    write_sharded_dataset(
        path, [records(shards, T)], batch_size=1, seq_len=T, shard_batches=1, manifest_version=2
    )
    with DatasetReader(path, verify="first") as reader:
        table = reader.table
        assert len(reader) == shards
        reader.read_batch(2999)
        reader.read_batch(0)
        reader.read_batch(1)
        assert table.pages_read == 1  # the first page came with the top, the last did not
        assert len(reader._range_checksums) == 3


def test_broken_index_checksum_range_and_missing_index_are_named(
    twins: tuple[Path, Path], tmp_path: Path
) -> None:
    _, v2 = twins
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in os.listdir(v2):
        (copy / name).write_bytes((v2 / name).read_bytes())
    sums = bytearray((copy / "checksums.xxh3").read_bytes())
    sums[8 * 149] ^= 1  # the last slot's checksum: its shard's range no longer matches
    (copy / "checksums.xxh3").write_bytes(bytes(sums))
    with DatasetReader(copy, verify="first") as reader:
        reader.read_batch(0)  # another shard's range is intact
        with pytest.raises(DatasetError, match=r"checksums_mismatch: checksums\.xxh3: .*shard 37"):
            reader.read_batch(149)
    report = validate_dataset(copy)
    assert [f.code for f in report.failures] == ["checksums_mismatch"]  # the file's digest
    (copy / INDEX_NAME).unlink()
    with pytest.raises(DatasetError, match="index_missing"):
        DatasetReader(copy)
    assert validate_dataset(copy).failures[0].code == "index_missing"


def test_create_dataset_with_names_in_pages(tmp_path: Path) -> None:
    from zerobatch_core import write_batch_file

    d = tmp_path / "files"
    d.mkdir()
    for i, name in enumerate(["b.batch", "a-1.batch", "c_2.batch"]):
        write_batch_file(d / name, records(6 + i * 2, T) + i, batch_size=B, seq_len=T, seed=i)
    v1 = create_dataset(d, ["b.batch", "a-1.batch", "c_2.batch"])
    old = [np.array(b).tolist() for b in BatchNativeLoader(d, block_size=2)]
    v2 = create_dataset(
        d, ["b.batch", "a-1.batch", "c_2.batch"], overwrite=True, manifest_version=2
    )
    assert v2.version == 2 and [s.name for s in v2.shards] == [s.name for s in v1.shards]
    with DatasetReader(d) as reader:
        assert [s.name for s in reader.shards] == ["b.batch", "a-1.batch", "c_2.batch"]
        assert all(s.records is None for s in reader.shards)
    assert [np.array(b).tolist() for b in BatchNativeLoader(d, block_size=2)] == old
    assert validate_dataset(d, deep=True).valid
    back = create_dataset(d, overwrite=True)  # back to version 1: the index is dropped
    assert back.version == 1 and not (d / INDEX_NAME).exists()


@pytest.mark.parametrize("new_version", [1, 2])
def test_replacing_a_version_2_dataset_drops_the_shards_its_index_lists(
    tmp_path: Path, new_version: int
) -> None:
    from zerobatch_core import write_batch_file

    d = tmp_path / "ds"
    d.mkdir()
    for name in ["x.batch", "y.batch"]:
        write_batch_file(d / name, records(8, T), batch_size=B, seq_len=T)
    (d / "notes.txt").write_text("the user's")
    create_dataset(d, ["x.batch", "y.batch"], manifest_version=2)
    write_sharded_dataset(
        d,
        [records(20, T)],
        batch_size=B,
        seq_len=T,
        shard_batches=3,
        overwrite=True,
        manifest_version=new_version,
    )
    names = sorted(os.listdir(d))
    assert "x.batch" not in names and "y.batch" not in names  # the old dataset's shards
    assert "notes.txt" in names  # not the dataset's: kept
    assert (INDEX_NAME in names) == (new_version == 2)
    assert validate_dataset(d, deep=True).valid
