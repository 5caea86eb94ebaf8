"""``produce`` from token files: nanoGPT shards (contiguous and BOS-aligned) and ``.npy``
arrays, cut into records as ``convert`` cuts them and shared in units of records."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.produce_corpus import PAD, producer_streams
from tests.unit.test_ingest_nanogpt import write_shard
from zerobatch_core.delivery.provenance import trace_step
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest.nanogpt import BinShard
from zerobatch_core.ingest.produce import produce

T, B = 8, 3
BOS = 7


def _rows(url: str) -> list[bytes]:
    return [
        row.astype(np.uint32).tobytes()  # the dataset's dtype (uint16 here) read as uint32
        for stream in producer_streams(url).values()
        for batch in stream
        for row in batch
        if not (row == PAD).all()
    ]


def _records(paths: list[Path], **cut: Any) -> list[bytes]:
    out = []
    for p in paths:
        for block in BinShard(p).iter_blocks(T, **cut):
            out += [row.tobytes() for row in block]
    return out


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for k in range(3):
        tokens = rng.integers(0, 1000, size=int(rng.integers(200, 400)))
        tokens[rng.random(tokens.size) < 0.05] = BOS
        paths.append(write_shard(tmp_path / f"s{k}.bin", tokens))
    return paths


@pytest.mark.parametrize("cut", [{}, {"align": "bos", "bos_token": BOS}])
def test_shards_are_committed_record_for_record_and_resume_exactly(
    shards: list[Path], tmp_path: Path, cut: dict[str, Any]
) -> None:
    pattern = str(tmp_path / "s*.bin")
    options: dict[str, Any] = {
        "seq_len": T,
        "batch_size": B,
        "pad_id": PAD,
        "epochs": 2,
        "unit_records": 5,
        "batches_per_object": 3,
        "producers": 2,
        **cut,
    }
    reference, resumed = str(tmp_path / "reference"), str(tmp_path / "resumed")
    for i in range(2):
        produce(pattern, reference, producer_id=f"p{i}", index=i, **options)
        budget = 0
        while True:
            budget += 1
            calls = [0]

            def stop(calls: list[int] = calls, budget: int = budget) -> bool:
                calls[0] += 1
                return calls[0] >= budget

            if produce(
                pattern, resumed, producer_id=f"p{i}", index=i, stop=stop, **options
            ).finished:
                break
    want = collections.Counter(_records(shards, **cut) * 2)
    assert collections.Counter(_rows(reference)) == want
    assert _rows(resumed) == _rows(reference)
    trace = trace_step(resumed, 4, global_batch_size=B)
    tokens = {str(p): np.fromfile(p, dtype=np.uint16, offset=1024) for p in shards}
    starts = {str(p): BinShard(p).record_starts(T, **cut) for p in shards}
    for piece in trace.pieces:
        with_rows = producer_streams(resumed)[piece.producer]  # type: ignore[index]
        batch = with_rows[piece.offset]  # type: ignore[index]
        for o in piece.origins:
            assert o.produced is not None and o.file is not None
            if o.produced.padding:
                continue
            record = o.produced.record
            assert record is not None
            start = int(starts[o.file][record])
            assert batch[o.row].tolist() == tokens[o.file][start : start + T].tolist()


def test_npy_arrays_and_refusals(tmp_path: Path) -> None:
    flat = np.arange(500, dtype=np.int64) % 997
    np.save(tmp_path / "a.npy", flat)
    np.save(tmp_path / "b.npy", np.arange(160, dtype=np.uint32).reshape(20, T))
    url = str(tmp_path / "live")
    done = produce(
        [tmp_path / "a.npy", tmp_path / "b.npy"], url, producer_id="p", seq_len=T, batch_size=B,
        epochs=1, unit_records=4,
    )  # fmt: skip
    records = [flat[i * T : (i + 1) * T].tobytes() for i in range(500 // T)]
    records = [np.frombuffer(r, dtype=np.int64).astype(np.uint32).tobytes() for r in records]
    records += [np.arange(160, dtype=np.uint32).reshape(20, T)[i].tobytes() for i in range(20)]
    assert done.committed == len(records) // B and done.dropped_tokens == len(records) % B * T
    assert collections.Counter(_rows(url)) <= collections.Counter(records)
    with pytest.raises(IngestError, match="hold tokens already"):
        produce(tmp_path / "a.npy", url, producer_id="q", seq_len=T, batch_size=B,
                tokenizer="tiktoken:gpt2")  # fmt: skip
    with pytest.raises(IngestError, match="applies to text"):
        produce(tmp_path / "a.npy", url, producer_id="q", seq_len=T, batch_size=B, mode="pad")
    with pytest.raises(IngestError, match="apply to token files"):
        produce(tmp_path / "a.npy", url, producer_id="q", seq_len=T, batch_size=B, kind="text",
                unit_records=3)  # fmt: skip
