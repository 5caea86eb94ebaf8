"""``zerobatch convert`` from the corpora other systems write: Megatron indexed datasets,
Hugging Face datasets, MosaicML MDS and Atlas, each corpus written by the real library where
it installs here (a writer following the format's description otherwise).

For each format: the dataset's input records, put back in input order from the shards'
permutations, are exactly a plain cut of the source's tokens (contiguous, and one record per
document start); the manifest names each input file with its record range; ``trace`` names the
file and the record of a row; the CLI detects the format from the path; ``--workers 1`` and
``--workers 4`` write the same bytes.
"""

from __future__ import annotations

import filecmp
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from zerobatch_spec import record_source

from tests.helpers import require
from zerobatch_core import convert
from zerobatch_core.datasets.dataset import DatasetReader
from zerobatch_core.delivery.provenance import trace_step

T, B = 8, 2
Docs = list[list[int]]
Corpus = tuple[list[str], list[tuple[str, Docs]]]
"""What ``convert`` is given, and each input file (as the manifest names it) with its
documents, in reading order."""


def _documents(seed: int, n: int, high: int) -> Docs:
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, high, size=int(rng.integers(0, 30))).tolist() for _ in range(n)]
    docs[3] = []  # an empty document
    return docs


def megatron_corpus(root: Path) -> Corpus:
    require("torch")
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    files = []
    for k, dtype in enumerate((np.uint16, np.int32)):
        docs = _documents(k, 40, 60_000)
        prefix = root / f"corpus-{k}"
        builder = indexed.IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
        for doc in docs:
            builder.add_document(doc, [len(doc)])
        builder.finalize(f"{prefix}.idx")
        files.append((str(prefix) + ".bin", docs))
    return [str(root / "corpus-0"), str(root / "corpus-1")], files


def hf_corpus(root: Path) -> Corpus:
    datasets = pytest.importorskip("datasets")
    pa = require("pyarrow")
    docs = _documents(7, 60, 50_000)
    table = datasets.Dataset.from_dict({"text": [str(len(d)) for d in docs], "input_ids": docs})
    table.save_to_disk(str(root / "hf"), num_shards=3)
    state = json.loads((root / "hf" / "state.json").read_text())
    files = []
    for item in state["_data_files"]:
        path = root / "hf" / item["filename"]
        with pa.OSFile(str(path)) as f:
            column = pa.ipc.open_stream(f).read_all().column("input_ids")
        files.append((str(path), column.to_pylist()))
    assert [d for _, part in files for d in part] == docs
    return [str(root / "hf")], files


def mds_corpus(root: Path) -> Corpus:
    require("zstandard")
    from tests.mds_writer import write_mds

    docs = [d or [5] for d in _documents(11, 60, 2**31)]  # Streaming encodes no empty array
    samples = [{"id": str(i), "input_ids": np.array(d, dtype=np.int32)} for i, d in enumerate(docs)]
    index = write_mds(
        root / "mds",
        {"id": "str", "input_ids": "ndarray:int32"},
        samples,
        compression="zstd:3",
        size_limit=1 << 10,
    )
    files, first = [], 0
    for shard in index["shards"]:
        n = shard["samples"]
        files.append((str(root / "mds" / shard["zip_data"]["basename"]), docs[first : first + n]))
        first += n
    assert len(files) > 1
    return [str(root / "mds")], files


def atlas_corpus(root: Path) -> Corpus:
    require("zstandard")
    from tests.atlas_writer import write_dataset

    docs = _documents(13, 90, 100_000)
    parts = [docs[:40], docs[40:]]
    examples = [  # lists of ints in one shard, NumPy arrays in the other
        list(parts[0]),
        [np.array(d, dtype=np.uint32) for d in parts[1]],
    ]
    folders = write_dataset(str(root / "atlas"), examples, block_size=7, strategy=1)
    return [str(root / "atlas")], list(zip(folders, parts, strict=True))


CORPORA: dict[str, Callable[[Path], Corpus]] = {
    "atlas": atlas_corpus,
    "megatron": megatron_corpus,
    "hf": hf_corpus,
    "mds": mds_corpus,
}


def expected_records(docs: Docs, layout: str) -> list[list[int]]:
    """A plain cut of one file's documents (``token_files`` module docstring)."""
    tokens = [t for d in docs for t in d]
    if layout == "contiguous":
        return [tokens[i : i + T] for i in range(0, len(tokens) // T * T, T)]
    starts, pos = [], 0
    for d in docs:
        starts.append(pos)
        pos += len(d)
    out, at = [], 0
    for s in sorted(set(starts)):
        if s < at or s >= len(tokens):
            continue
        if s + T > len(tokens):
            break
        out.append(tokens[s : s + T])
        at = s + T
    return out


def input_records(path: Path) -> dict[int, list[int]]:
    """A dataset's rows by input record (undoing each shard's record permutation)."""
    with DatasetReader(str(path)) as reader:
        out: dict[int, list[int]] = {}
        for shard_index, shard in enumerate(reader.manifest.shards):
            assert shard.records is not None
            for p, row in enumerate(_shard_rows(reader, shard_index).tolist()):
                out[shard.records[0] + record_source(p, shard.total_records, shard.seed)] = row
        return out


def _shard_rows(reader: DatasetReader, shard_index: int) -> npt.NDArray[np.uint32]:
    first = sum(s.num_batches for s in reader.manifest.shards[:shard_index])
    shard = reader.manifest.shards[shard_index]
    rows = [np.asarray(reader.read_batch(first + s)) for s in range(shard.num_batches)]
    return np.concatenate(rows).reshape(-1, T) if rows else np.empty((0, T), np.uint32)


@pytest.fixture(params=sorted(CORPORA))
def corpus(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Corpus]:
    root = tmp_path / "corpus"
    root.mkdir()
    return request.param, CORPORA[request.param](root)


@pytest.mark.parametrize("layout", ["contiguous", "documents"])
def test_records_are_the_sources_tokens_and_the_manifest_names_their_files(
    corpus: tuple[str, Corpus], tmp_path: Path, layout: str
) -> None:
    kind, (inputs, files) = corpus
    out = tmp_path / "data"
    summary = convert(
        inputs, str(out), seq_len=T, batch_size=B, seed=3, shard_batches=4,
        align="documents" if layout == "documents" else "contiguous",
    )  # fmt: skip
    assert summary.kind == kind
    want = [r for _, docs in files for r in expected_records(docs, layout)]
    kept = len(want) // B * B
    got = input_records(out)
    assert len(got) == kept == summary.records
    assert all(got[i] == want[i] for i in got)
    manifest = json.loads((out / "manifest.json").read_text())
    first = 0
    for source, (path, docs) in zip(manifest["sources"], files, strict=True):
        n = len(expected_records(docs, layout))
        assert source["path"] == str(Path(path).absolute())
        assert source["records"] == [first, first + n]
        first += n
    for step in (0, kept // B - 1):
        trace = trace_step(str(out), step, shuffle=False)
        for piece in trace.pieces:
            rows = _shard_rows(DatasetReader(str(out)), piece.shard_index)
            for o in piece.origins:
                path = next(p for p, _ in files if str(Path(p).absolute()) == o.file)
                docs = dict(files)[path]
                assert o.file_record is not None
                expected = expected_records(docs, layout)[o.file_record]
                assert rows[piece.slot * B + o.row].tolist() == expected


def test_the_cli_detects_the_format_and_workers_change_nothing(
    corpus: tuple[str, Corpus], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerobatch_core.cli import main

    kind, (inputs, _) = corpus
    outs = []
    for workers in (1, 4):
        out = tmp_path / f"w{workers}.batch"
        args = [*inputs, str(out), "--seq-len", str(T), "--batch-size", str(B)]
        assert main(["convert", *args, "--workers", str(workers), "--json"]) == 0
        summary: dict[str, Any] = json.loads(capsys.readouterr().out)
        assert summary["kind"] == kind
        outs.append(out)
    assert filecmp.cmp(outs[0], outs[1], shallow=False)
