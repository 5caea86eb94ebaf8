"""``produce``: producers tokenizing shares of a corpus into a live dataset (local directory).

Exactly once at the source: the documents decoded from the committed batches are the corpus,
each once per epoch, however the producers were stopped, crashed and restarted; a restart's
stream is the uninterrupted stream, batch for batch. The S3 and process forms are in
``tests/remote/test_produce_remote.py``.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import require
from tests.produce_corpus import PAD, committed_documents, decode, producer_streams, write_corpus
from tests.unit.bpe import train_bpe
from zerobatch_core import BatchNativeLoader
from zerobatch_core.delivery.provenance import trace_step
from zerobatch_core.errors import IngestError
from zerobatch_core.ingest.produce import ProduceError, ProduceProgress, produce, share_of
from zerobatch_core.live.producer import LiveProducer
from zerobatch_core.live.production import (
    PADDING,
    ProductionError,
    batches_key,
    read_batches,
    read_record,
    record_key,
)
from zerobatch_core.live.retention import reclaim, record_watermark
from zerobatch_core.live.source import LiveSource
from zerobatch_core.stores.resolve import open_store

T, B = 32, 4
ARGS: dict[str, Any] = {"seq_len": T, "batch_size": B, "pad_id": PAD, "batches_per_object": 4}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    root = tmp_path_factory.mktemp("corpus")
    texts = write_corpus(root)
    return str(root / "*.parquet"), texts


def _run_all(pattern: str, url: str, n: int, **kw: Any) -> None:
    for i in range(n):
        summary = produce(pattern, url, producer_id=f"p{i}", producers=n, index=i, **ARGS, **kw)
        assert summary.finished


def test_producers_commit_every_document_once(
    corpus: tuple[str, list[str]], tmp_path: Path
) -> None:
    pattern, texts = corpus
    url = str(tmp_path / "live")
    _run_all(pattern, url, 3, epochs=1)
    assert committed_documents(url) == collections.Counter(texts)
    shares = share_of(pattern, 3)
    assert sorted(u for s in shares for u in s) == sorted(share_of(pattern, 1)[0])


def test_each_epoch_serves_the_share_once_in_its_own_order(
    corpus: tuple[str, list[str]], tmp_path: Path
) -> None:
    pattern, texts = corpus
    url = str(tmp_path / "live")
    _run_all(pattern, url, 2, epochs=3, seed=9)
    assert committed_documents(url) == collections.Counter(texts * 3)
    docs = decode(producer_streams(url)["p0"])
    per_epoch = len(docs) // 3
    epochs = [docs[k * per_epoch : (k + 1) * per_epoch] for k in range(3)]
    assert all(sorted(e) == sorted(epochs[0]) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1  # unit orders keyed by the epoch


def _stream(url: str) -> dict[str, list[bytes]]:
    return {p: [b.tobytes() for b in s] for p, s in producer_streams(url).items()}


class CrashError(Exception):
    """Stands for a process that dies after a commit, with objects appended after it."""


def test_stopped_and_crashed_restarts_give_the_uninterrupted_stream(
    corpus: tuple[str, list[str]], tmp_path: Path
) -> None:
    pattern, texts = corpus
    reference = str(tmp_path / "reference")
    _run_all(pattern, reference, 2, epochs=2)
    url = str(tmp_path / "live")
    rng = np.random.default_rng(3)
    for i in range(2):
        runs = 0
        while True:
            runs += 1
            budget = int(rng.integers(1, 6))
            calls = []

            def stop(budget: int = budget, calls: list[int] = calls) -> bool:
                calls.append(1)
                return len(calls) >= budget

            def crash(p: ProduceProgress, budget: int = budget) -> None:
                if p.committed % 3 == budget % 3:
                    raise CrashError

            kw: dict[str, Any] = {"stop": stop} if runs % 2 else {"on_commit": crash}
            kw["cadence"] = 1  # a commit per object: where crashes land is the seed's alone
            try:
                summary = produce(
                    pattern, url, producer_id=f"p{i}", producers=2, index=i, epochs=2, **ARGS, **kw
                )
            except CrashError:
                continue
            if summary.finished:
                break
        assert runs > 3
    assert _stream(url) == _stream(reference)
    assert committed_documents(url) == collections.Counter(texts * 2)


def test_a_restart_with_another_configuration_is_refused(
    corpus: tuple[str, list[str]], tmp_path: Path
) -> None:
    pattern, _ = corpus
    url = str(tmp_path / "live")
    first = produce(pattern, url, producer_id="p", producers=2, **ARGS, stop=lambda: True)
    assert first.committed > 0
    hf = require("tokenizers")
    spec = train_bpe(hf, ["alpha beta gamma"] * 20, tmp_path / "tok.json", "<s>", vocab_size=300)
    version = LiveSource(url).current.version
    changes: list[tuple[dict[str, Any], str]] = [
        ({"tokenizer": spec}, "tokenizer='byte' \\(now 'hf:"),
        ({"seq_len": 2 * T}, "seq_len=32 \\(now 64\\)"),
        ({"producers": 3}, "producers=2 \\(now 3\\)"),
        ({"seed": 1}, "seed=0 \\(now 1\\)"),
        ({"text_field": "body"}, "no column 'body'"),
    ]
    for change, message in changes:
        kw = {**ARGS, "producers": 2, **change}
        with pytest.raises(IngestError, match=message):
            produce(pattern, url, producer_id="p", **kw)
    with pytest.raises(ProduceError, match=r"inputs: 3 files \(now 2\)"):
        produce(sorted(Path(pattern).parent.glob("*.parquet"))[:2], url, producer_id="p", **ARGS)
    assert LiveSource(url).current.version == version  # nothing committed by any of them
    again = produce(pattern, url, producer_id="p", producers=2, **ARGS, stop=lambda: True)
    assert again.resumed_at == first.committed


def test_records_name_each_rows_origin(corpus: tuple[str, list[str]], tmp_path: Path) -> None:
    pattern, texts = corpus
    url = str(tmp_path / "live")
    produce(pattern, url, producer_id="p", epochs=1, **ARGS)
    store = open_store(url)
    record = read_record(store, "p")
    assert record is not None and record.units == 3 * 5  # 100 rows per file, 23 per group
    with LiveSource(url) as source:
        for e in source.chain.entries(source.current):
            found = read_batches(store, "p", e.offset + e.num_batches, B)
            assert found is not None and found.first == e.offset
            for k, (epoch, unit, doc, token) in enumerate(found.rows.tolist()):
                row = np.array(source.read_batch(e.first + k // B))[k % B]
                if epoch == PADDING:
                    assert (row == PAD).all()
                    continue
                entry, group = record.locate(unit)
                file = int(Path(entry.path).stem.split("-")[1])
                text = texts[file::3][group * 23 + doc]
                seq = [256, *text.encode()]
                assert row[: min(T, len(seq) - token)].tolist() == seq[token : token + T]


def test_pad_mode_and_a_missing_pad_id(corpus: tuple[str, list[str]], tmp_path: Path) -> None:
    pattern, texts = corpus
    url = str(tmp_path / "pad")
    produce(pattern, url, producer_id="p", epochs=1, **{**ARGS, "mode": "pad"})
    rows = np.concatenate(producer_streams(url)["p"]).reshape(-1, T)
    real = rows[rows[:, 0] == 256]
    assert len(real) == len(texts)
    kept = {bytes(r[1:][r[1:] != PAD].astype(np.uint8)) for r in real}
    assert kept == {t.encode()[: T - 1] for t in texts}
    nopad = str(tmp_path / "nopad")
    summary = produce(pattern, nopad, producer_id="p", epochs=1, **{**ARGS, "pad_id": None})
    total = sum(len(t.encode()) + 1 for t in texts)
    assert summary.dropped_tokens == total % (B * T) > 0
    assert summary.committed == total // (B * T)
    with pytest.raises(IngestError, match="mode='pad' needs a pad_id"):
        produce(pattern, nopad, producer_id="q", **{**ARGS, "pad_id": None, "mode": "pad"})


def test_refusals(corpus: tuple[str, list[str]], tmp_path: Path) -> None:
    pattern, _ = corpus
    url = str(tmp_path / "live")
    with pytest.raises(ProduceError, match="producer 21 of 22 has no input units"):
        produce(pattern, url, producer_id="p", producers=22, index=21, **ARGS)
    with pytest.raises(IngestError, match="index"):
        produce(pattern, url, producer_id="p", producers=2, index=2, **ARGS)
    with LiveProducer(url, "hand", batch_size=B, seq_len=T) as hand:
        hand.append(np.zeros((B, T), dtype=np.uint32))
    with pytest.raises(ProduceError, match="no production record"):
        produce(pattern, url, producer_id="hand", **ARGS)


def test_a_broken_production_record_is_named(corpus: tuple[str, list[str]], tmp_path: Path) -> None:
    pattern, _ = corpus
    url = str(tmp_path / "live")
    done = produce(pattern, url, producer_id="p", **ARGS, stop=lambda: True)
    path = tmp_path / "live" / batches_key("p", done.committed)
    doc = json.loads(path.read_text())
    doc["rows"] = doc["rows"][:-1]
    path.write_text(json.dumps(doc))
    with pytest.raises(ProductionError, match=r"\.json: field 'rows' holds .* expected"):
        produce(pattern, url, producer_id="p", **ARGS)
    path.unlink()
    with pytest.raises(ProductionError, match="production record of the object ending there"):
        produce(pattern, url, producer_id="p", **ARGS)
    (tmp_path / "live" / record_key("p")).write_text('{"format": "zerobatch.produce"}')
    with pytest.raises(ProductionError, match=r"producer\.json: field 'version' is None"):
        produce(pattern, url, producer_id="p", **ARGS)


def test_trace_names_the_object_producer_offset_and_document_of_each_row(
    corpus: tuple[str, list[str]], tmp_path: Path, run: Any
) -> None:
    pattern, texts = corpus
    url = str(tmp_path / "live")
    _run_all(pattern, url, 2, epochs=1)
    with LiveSource(url) as source:
        entries = source.chain.entries(source.current)
        committed = source.committed
        for step in (0, 5, committed // 2 - 1):
            trace = trace_step(url, step, global_batch_size=2 * B, rank=1, world_size=2)
            assert [p.dataset_slot for p in trace.pieces] == [2 * step + 1]
            (piece,) = trace.pieces
            e = next(e for e in entries if e.first <= piece.dataset_slot < e.end)
            assert (piece.shard, piece.producer) == (e.name, e.producer)
            assert piece.offset == e.offset + piece.dataset_slot - e.first
            rows = np.array(source.read_batch(piece.dataset_slot))
            for o in piece.origins:
                assert o.produced is not None and o.file is not None
                if o.produced.padding:
                    assert (rows[o.row] == PAD).all()
                    continue
                file = int(Path(o.file).stem.split("-")[1])
                text = texts[file::3][o.produced.part * 23 + o.produced.document]
                seq = [256, *text.encode()][o.produced.token :]
                assert rows[o.row][: len(seq)].tolist() == seq[:T]
    done = run("trace", url, "--step", "1", "--global-batch-size", str(B))
    assert done.status == 0, done.err
    assert f"producer {entries[1].producer} offset" in done.out and "row group" in done.out
    with pytest.raises(IndexError, match=f"and {committed} are committed"):
        trace_step(url, committed, global_batch_size=B)


def test_reclaim_deletes_the_records_of_trimmed_objects_and_keeps_the_resume_cursor(
    corpus: tuple[str, list[str]], tmp_path: Path
) -> None:
    pattern, _ = corpus
    url = str(tmp_path / "live")
    LiveProducer(url, "setup", batch_size=B, seq_len=T, segment_size=2).close()  # seals early
    options = {**ARGS, "stop": lambda: False}
    produce(pattern, url, producer_id="p", producers=2, epochs=1, **options)
    with LiveSource(url) as source:
        committed = source.committed
        loader = BatchNativeLoader(source, dtype="uint32")
        record_watermark(url, "trainer", loader.state_dict((0, committed - 1)))
    store = open_store(url)
    before = set(store.list_keys("production/"))
    report = reclaim(url)
    after = set(store.list_keys("production/"))
    assert report.deleted.get("production", 0) == len(before - after) > 0
    assert record_key("p") in after and batches_key("p", committed) in after
    with LiveSource(url) as source:  # every object still listed keeps its record
        for e in source.chain.entries(source.current, source.start):
            assert batches_key("p", e.offset + e.num_batches) in after
    again = produce(pattern, url, producer_id="p", producers=2, epochs=2, **options)
    assert again.resumed_at == committed and again.finished
