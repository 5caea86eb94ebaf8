"""``convert(..., shard_batches=N)``: a dataset directory whose manifest names each input file's
records, for every source kind, and the output checks of a directory.

Each test maps every stored row back to its input record (through the file writer's record
permutation of its shard and the shard's record range) and checks it against the record cut
from the input file named by the manifest's sources, independently of the converter.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from zerobatch_spec import record_source
from zerobatch_spec.dataset import MANIFEST_NAME

from zerobatch_core import BatchFileReader, DatasetReader, convert, validate_dataset
from zerobatch_core.errors import IngestError, WriteError
from zerobatch_core.ingest.nanogpt import BinShard

Rows = dict[int, npt.NDArray[np.uint32]]


def write_bin(path: Path, tokens: npt.NDArray[np.integer]) -> Path:
    """A legacy nanoGPT shard: int32[256] header (magic, version, num_tokens), uint16 tokens."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = 20240520, 1, len(tokens)
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype=np.uint16).tobytes())
    return path


def dataset_rows(path: Path) -> Rows:
    """Every stored row of a dataset, by its index among the conversion's input records."""
    out: Rows = {}
    with DatasetReader(path) as ds:
        for i, shard in enumerate(ds.shards):
            assert shard.records is not None
            reader, b = ds.shard(i), ds.batch_size
            for p in range(shard.num_batches * b):
                n = record_source(p, shard.total_records, shard.seed)
                out[shard.records[0] + n] = np.array(reader.read_batch(p // b)[p % b])
    return out


def file_rows(path: Path) -> Rows:
    """Every stored row of a single file, by its input record."""
    with BatchFileReader(path) as f:
        h, b = f.header, f.batch_size
        return {
            record_source(p, h.total_records, h.seed): np.array(f.read_batch(p // b)[p % b])
            for p in range(h.num_batches * b)
        }


def sources(path: Path) -> list[tuple[str, tuple[int, int]]]:
    with DatasetReader(path) as ds:
        return [(s.path, s.records) for s in ds.manifest.sources]


def same_records(a: Rows, b: Rows) -> None:
    shared = a.keys() & b.keys()
    assert shared and all(np.array_equal(a[k], b[k]) for k in shared)


def test_nanogpt_sources_are_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    sizes, t = (1003, 5, 0, 2467, 333), 10  # a shard too short for a record, an empty one
    bins = [
        write_bin(tmp_path / f"s{i}.bin", rng.integers(0, 65535, n)) for i, n in enumerate(sizes)
    ]
    out = tmp_path / "ds"
    summary = convert([str(p) for p in bins], str(out), seq_len=t, batch_size=4, shard_batches=7)
    counts = [n // t for n in sizes]
    ends = np.cumsum([0, *counts]).tolist()
    assert sources(out) == [
        (str(p.resolve()), (a, z)) for p, a, z in zip(bins, ends, ends[1:], strict=False)
    ]
    rows = dataset_rows(out)
    assert len(rows) == summary.records == sum(counts) // 4 * 4
    assert summary.shards == len(DatasetReader(out).shards) == -(-sum(counts) // 28)
    for record, row in rows.items():
        i = int(np.searchsorted(ends, record, side="right")) - 1
        k = record - ends[i]
        np.testing.assert_array_equal(row, BinShard(bins[i]).read_tokens(k * t, (k + 1) * t))
    assert validate_dataset(out, deep=True).valid
    single = tmp_path / "one.batch"
    convert([str(p) for p in bins], str(single), seq_len=t, batch_size=4)
    same_records(rows, file_rows(single))


def test_nanogpt_bos_aligned_sources(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    bins = []
    for i, n in enumerate((800, 1500)):
        tokens = rng.integers(1, 500, n)
        tokens[rng.choice(n, n // 20, replace=False)] = 0  # BOS tokens
        bins.append(write_bin(tmp_path / f"b{i}.bin", tokens))
    out = tmp_path / "ds"
    options: dict[str, Any] = {"seq_len": 16, "batch_size": 2, "align": "bos", "bos_token": 0}
    convert([str(p) for p in bins], str(out), shard_batches=3, **options)
    starts = [BinShard(p).record_starts(16, "bos", 0) for p in bins]
    ends = np.cumsum([0, *(s.size for s in starts)]).tolist()
    assert [r for _, r in sources(out)] == list(itertools.pairwise(ends))
    for record, row in dataset_rows(out).items():
        i = int(np.searchsorted(ends, record, side="right")) - 1
        start = int(starts[i][record - ends[i]])
        np.testing.assert_array_equal(row, BinShard(bins[i]).read_tokens(start, start + 16))


def test_npy_sources_two_dimensional_and_flat(tmp_path: Path) -> None:
    a = np.arange(7 * 6, dtype=np.int64).reshape(7, 6)
    flat = np.arange(1000, 1000 + 6 * 9 + 4, dtype=np.uint16)  # 9 records, 4 tokens dropped
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "flat.npy", flat)
    out = tmp_path / "ds"
    convert([str(tmp_path / "a.npy"), str(tmp_path / "flat.npy")], str(out), seq_len=6,
            batch_size=2, shard_batches=2)  # fmt: skip
    assert [r for _, r in sources(out)] == [(0, 7), (7, 16)]
    whole = np.concatenate([a, flat[:54].reshape(9, 6)])
    for record, row in dataset_rows(out).items():
        np.testing.assert_array_equal(row, whole[record])


def packed_stream(docs: list[bytes]) -> npt.NDArray[np.uint32]:
    """The byte tokenizer's packed stream: BOS (256) then the document's bytes, for each."""
    parts = [np.concatenate([[256], np.frombuffer(d, dtype=np.uint8)]) for d in docs]
    return np.concatenate(parts).astype(np.uint32)


def test_text_pack_mode_gives_a_record_to_its_first_tokens_file(tmp_path: Path) -> None:
    texts = ["alpha " * 30, "", "hi", "beta gamma " * 40, "z"]  # empty, tiny, large, tiny
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"t{i}.txt")
        paths[-1].write_text(text)
    t = 16
    out = tmp_path / "ds"
    convert([str(p) for p in paths], str(out), seq_len=t, batch_size=2, shard_batches=2)
    docs = [x.encode() for x in texts]
    stream = packed_stream(docs)
    records = len(stream) // t
    starts = np.cumsum([0, *(1 + len(d) for d in docs)])  # each file's first stream token
    owner = np.searchsorted(starts, np.arange(records) * t, side="right") - 1
    want = [(int(np.sum(owner < i)), int(np.sum(owner <= i))) for i in range(len(texts))]
    assert [r for _, r in sources(out)] == want
    assert want[1][0] == want[1][1] and want[2][0] == want[2][1]  # no record starts in them
    rows = dataset_rows(out)
    for record, row in rows.items():
        np.testing.assert_array_equal(row, stream[record * t : (record + 1) * t])
    single = tmp_path / "one.batch"
    convert([str(p) for p in paths], str(single), seq_len=t, batch_size=2)
    same_records(rows, file_rows(single))  # the same records as the single-file path


def test_text_pad_mode_and_workers_give_the_same_manifest(tmp_path: Path) -> None:
    lines = [["one", "", "two two"], [], ["three " * 9, "four"], ["", ""], ["five"]]
    paths = []
    for i, group in enumerate(lines):
        paths.append(tmp_path / f"l{i}.txt")
        paths[-1].write_text("\n".join(group))
    options: dict[str, Any] = {
        "seq_len": 8,
        "batch_size": 2,
        "mode": "pad",
        "pad_id": 0,
        "per_line": True,
    }
    manifests = []
    for workers in (1, 2):
        out = tmp_path / f"ds{workers}"
        convert([str(p) for p in paths], str(out), shard_batches=1, workers=workers, **options)
        manifests.append((out / MANIFEST_NAME).read_text())
    per_file = [sum(1 for line in group if line) for group in lines]  # one record per document
    ends = np.cumsum([0, *per_file]).tolist()
    assert [r for _, r in sources(tmp_path / "ds1")] == list(itertools.pairwise(ends))
    assert manifests[0] == manifests[1]


def test_directory_outputs_are_checked_first(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(80, dtype=np.uint32).reshape(20, 4))
    src = [str(tmp_path / "a.npy")]
    out = tmp_path / "ds"
    kw: dict[str, Any] = {"seq_len": 4, "batch_size": 2, "shard_batches": 3}
    convert(src, str(out), **kw)
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".batch") == [
        f"shard-0000{i}.batch" for i in range(4)
    ]
    with pytest.raises(WriteError, match=r"already a dataset.*overwrite=True"):
        convert(src, str(out), **kw)
    convert(src, str(out), overwrite=True, **{**kw, "shard_batches": 10})
    assert sorted(p.name for p in out.iterdir()) == [
        "checksums.xxh3",
        "manifest.json",
        "shard-00000.batch",
    ]  # the earlier dataset's other shards are gone
    assert validate_dataset(out, deep=True).valid
    (out / MANIFEST_NAME).unlink()
    with pytest.raises(WriteError, match=r"shard files .* no manifest\.json"):
        convert(src, str(out), **kw)
    with pytest.raises(WriteError, match="not a directory"):
        convert(src, str(tmp_path / "a.npy"), **kw)
    doc = out / MANIFEST_NAME
    doc.write_text('{"text": "a document named like the manifest"}')
    for overwrite in (False, True):
        with pytest.raises(WriteError, match="input file would be replaced"):
            convert([str(doc)], str(out), kind="text", overwrite=overwrite, **kw)
    assert doc.read_text().startswith('{"text"')


def test_nothing_is_left_when_a_conversion_fails(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(80, dtype=np.int64).reshape(20, 4))
    np.save(tmp_path / "b.npy", np.full((20, 4), -1, dtype=np.int64))  # outside uint32
    out = tmp_path / "ds"
    with pytest.raises(IngestError, match=r"b\.npy"):
        convert([str(tmp_path / "a.npy"), str(tmp_path / "b.npy")], str(out), seq_len=4,
                batch_size=2, shard_batches=2)  # fmt: skip
    assert list(out.iterdir()) == []  # the shards of a.npy's records were removed
    with pytest.raises(WriteError, match="0 batches"):
        convert([str(tmp_path / "a.npy")], str(out), seq_len=4, batch_size=64, shard_batches=1)
    assert list(out.iterdir()) == []
    summary = convert(
        [str(tmp_path / "a.npy")],
        str(out),
        seq_len=4,
        batch_size=64,
        shard_batches=1,
        allow_empty=True,
    )
    assert (summary.batches, summary.shards, summary.dropped_records) == (0, 1, 20)
    assert json.loads(json.dumps(summary.as_dict()))["shards"] == 1
